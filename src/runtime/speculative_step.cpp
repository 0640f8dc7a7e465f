// The engine's speculative decoding (EngineOptions::speculative; docs/runtime.md, "Speculative
// decoding"): which decode rows feed drafts, the verify step's upload and launch, and its
// read-back, which rolls rejected drafts back before it reports the tokens.
//
// A step verifies drafts only when the host knows every fed row's token (nothing in flight: it
// was not launched ahead) and no fed sequence has presence/frequency penalties, logprobs or a
// grammar (structured output), nor the step prompt chunks (a mixed step): those run as plain
// steps. So such a request is never drafted and its tokens are exactly a plain step's; the
// verify pass needs no penalties, masks or logits copies. A step that may verify drafts waits for
// the read-back of the step before; one that cannot (every running sequence's drafter sitting out
// or without a possible match, or a sequence blocking drafts) is launched ahead as without
// speculation (may_launch_ahead). Rejected drafts' KV entries need no device work: the scheduler
// un-computes their positions and keeps their pages (reject_drafts), and the next step's lengths,
// uploaded from the host, end before them; their entries are overwritten when those positions
// are fed again.
#include <algorithm>
#include <optional>
#include <string>
#include <utility>

#include "deepfuse/error.hpp"
#include "runtime/engine_impl.hpp"
#include "speculative/launch_ahead.hpp"

namespace deepfuse {

using runtime::StepLane;

bool Engine::Impl::draft_rows(batching::StepPlan& plan, std::vector<std::vector<int32_t>>& drafts) {
  if (!speculation || !launched.empty() || plan.mixed || plan.decode.empty()) return false;
  for (const batching::DecodeRow& row : plan.decode)
    if (row.feeds_sample_in_flight() || settings.at(static_cast<SequenceId>(row.sequence->key)).blocks_drafts())
      return false;
  drafts.assign(step_scheduler->running(), {});
  bool any = false;
  for (batching::DecodeRow& row : plan.decode) {
    const SequenceId key = static_cast<SequenceId>(row.sequence->key);
    if (!settings.at(key).speculative) continue;
    std::vector<int32_t> proposed = speculation->propose(key, row.sequence->tokens, speculation->max_rows() - 1);
    for (const int32_t id : proposed)
      DF_CHECK(id >= 0 && id < config.vocab_size, "internal: a draft outside the vocabulary");
    if (proposed.empty()) continue;
    proposed.resize(step_scheduler->add_drafts(row, static_cast<int>(proposed.size())));  // free pages only
    any |= !proposed.empty();
    drafts[row.sequence->row] = std::move(proposed);
  }
  return any;
}

bool Engine::Impl::may_launch_ahead() {
  if (!speculation) return true;
  if (!launched.empty() && lanes[launched.back()].verify) return false;
  return !next_step_may_draft();
}

bool Engine::Impl::next_step_may_draft() {
  using speculative::NextStepDrafts;
  std::vector<NextStepDrafts> sequences;
  for (int row = 0; row < step_scheduler->running(); ++row) {
    const batching::Sequence& sequence = step_scheduler->at_row(row);
    const SequenceId key = static_cast<SequenceId>(sequence.key);
    const runtime::SequenceSettings& set = settings.at(key);
    if (set.blocks_drafts())
      sequences.push_back(NextStepDrafts::blocks);
    else if (!set.speculative || sequence.prefilling())
      sequences.push_back(NextStepDrafts::none);
    else  // every drafter asked: each that says yes makes the wait its own (SequenceDrafter)
      sequences.push_back(speculation->may_propose_after_next(key, sequence.tokens) ? NextStepDrafts::possible
                                                                                   : NextStepDrafts::none);
  }
  return speculative::next_step_may_draft(sequences);
}

void Engine::Impl::run_verify_step(StepLane& lane, int sequences, std::span<const batching::DecodeRow* const> fed,
                                   std::vector<std::vector<int32_t>>& drafts) {
  runtime::Speculation& spec = *speculation;
  const int bucket_index = lane.graphs->bucket_index(sequences);
  size_t most = 0;
  for (const std::vector<int32_t>& d : drafts) most = std::max(most, d.size());
  const runtime::VerifyLayout layout{plan.buckets[bucket_index].batch, 1 + static_cast<int>(most)};
  const int rows = layout.rows;
  spec.uploaded.wait();  // the staging buffers' last upload has run
  int32_t* host = spec.host_inputs.as<int32_t>();
  auto* slots = spec.host_slots.as<kernels::SamplingSlot>();
  for (int s = 0; s < layout.sequences; ++s) {
    const batching::DecodeRow* row = s < sequences ? fed[s] : nullptr;
    const std::vector<int32_t> none;
    const std::vector<int32_t>& mine = row ? drafts[s] : none;
    const int count = static_cast<int>(mine.size());
    host[layout.draft_counts() + s] = count;
    for (int j = 0; j + 1 < rows; ++j) host[layout.drafts() + s * (rows - 1) + j] = j < count ? mine[j] : -1;
    kernels::SamplingSlot slot;  // padded entries: greedy
    if (row) {
      slot = kernels::sampling_slot(settings.at(static_cast<SequenceId>(row->sequence->key)).sampling);
      slot.step = row->sequence->generated();  // entry j draws as the plain step j steps on would
    }
    for (int j = 0; j < rows; ++j) {
      const int e = s * rows + j;
      const bool active = row && j <= count;
      host[layout.ids() + e] = !active ? -1 : j == 0 ? row->sequence->tokens[row->position] : mine[j - 1];
      host[layout.positions() + e] = active ? row->position + j : -1;
      host[layout.seq_lens() + e] = active ? row->position + j + 1 : 0;
      host[layout.block_rows() + e] = s;
      slots[e] = slot;
      slots[e].step = slot.step + j;
    }
  }
  int32_t* device = spec.inputs.as<int32_t>();
  DF_CHECK_CUDA(cudaMemcpyAsync(device, host, layout.input_count() * sizeof(int32_t), cudaMemcpyHostToDevice, stream()));
  DF_CHECK_CUDA(cudaMemcpyAsync(spec.slots.data(), slots, layout.entries() * sizeof(kernels::SamplingSlot),
                                cudaMemcpyHostToDevice, stream()));
  spec.uploaded.record(stream());

  runtime::VerifyPass pass;
  pass.sequences = layout.sequences;
  pass.rows = rows;
  pass.ids = device + layout.ids();
  pass.positions = device + layout.positions();
  pass.seq_lens = device + layout.seq_lens();
  pass.block_rows = device + layout.block_rows();
  pass.slots = spec.slots.as<kernels::SamplingSlot>();
  pass.chosen = spec.chosen.as<int32_t>();
  pass.drafts = device + layout.drafts();
  pass.draft_counts = device + layout.draft_counts();
  pass.emitted = spec.results.device_as<int32_t>();
  pass.emitted_counts = pass.emitted + layout.emitted_counts();
  pass.sampling_workspace = spec.sampling_workspace.data();
  const runtime::Speculation::VerifyAttention attention = spec.attention(layout.entries());
  pass.attention_workspace = attention.workspace;
  const std::optional<BucketPlan> ops = verify_ops(layout.entries());
  spec.graphs.run(bucket_index, rows - 1, stream(), [&](cudaStream_t s) {
    forward->verify_step(pass, attention.plan, ops ? &*ops : nullptr, s);
  });
  spec.layout = layout;
  for (int s = 0; s < layout.sequences && s < static_cast<int>(drafts.size()); ++s) spec.drafts[s] = std::move(drafts[s]);
  lane.verify = true;
  lane.step_done.record(stream());
}

std::optional<BucketPlan> Engine::Impl::verify_ops(int entries) const {
  const BucketPlan* smallest = nullptr;
  for (const BucketPlan& bucket : plan.buckets)
    if (bucket.batch >= entries && (!smallest || bucket.batch < smallest->batch)) smallest = &bucket;
  if (smallest) return *smallest;
  BucketPlan largest = *std::max_element(plan.buckets.begin(), plan.buckets.end(),
                                         [](const BucketPlan& a, const BucketPlan& b) { return a.batch < b.batch; });
  const scheduler::PlanShape shape = plan_shape();
  if (!scheduler::why_unsupported(largest.mlp, shape, entries, gpu).empty() ||
      !scheduler::why_unsupported(largest.front, shape, entries, gpu).empty() ||
      !scheduler::why_unsupported(largest.o_proj, largest.front, shape, entries, gpu).empty())
    return std::nullopt;
  largest.batch = entries;
  return largest;
}

void Engine::Impl::advance_draws(std::span<const std::pair<int, int>> rows_and_emitted) {
  if (rows_and_emitted.empty()) return;
  slot_host_read.wait();  // the host slots may still be the source of an earlier upload
  auto* slots = slot_host.as<kernels::SamplingSlot>();
  for (const auto& [row, emitted] : rows_and_emitted) {
    const batching::Sequence& sequence = step_scheduler->at_row(row);
    slots[row] = kernels::sampling_slot(settings.at(static_cast<SequenceId>(sequence.key)).sampling);
    slots[row].step = sequence.generated() + emitted;
    DF_CHECK_CUDA(cudaMemcpyAsync(buffers->slots() + row, slots + row, sizeof(kernels::SamplingSlot),
                                  cudaMemcpyHostToDevice, stream()));
  }
  slot_host_read.record(stream());
}

void Engine::Impl::read_back_verify(StepLane& lane, std::vector<StepToken>& out) {
  runtime::Speculation& spec = *speculation;
  const runtime::VerifyLayout layout = spec.layout;
  const int32_t* emitted = spec.results.as<int32_t>();
  const int32_t* counts = emitted + layout.emitted_counts();
  // First every sequence's rejected drafts (no report may run before them, and the rows are still
  // those of the launch), then the tokens, row by row.
  std::vector<std::pair<int, int>> advanced;
  for (int row = 0; row < static_cast<int>(lane.rows.size()); ++row) {
    if (lane.rows[row] == 0) continue;
    batching::Sequence* sequence = step_scheduler->find_running(static_cast<batching::SequenceKey>(lane.rows[row]), row);
    DF_CHECK(sequence && sequence->row == row, "internal: a verified sequence left its row before its read-back");
    const int drafted = static_cast<int>(spec.drafts[row].size());
    const int count = counts[row];
    DF_CHECK(count >= 1 && count <= drafted + 1, "internal: a verify step emitted " + std::to_string(count) +
                                                     " tokens for " + std::to_string(drafted) + " drafts");
    if (drafted > 0) {
      step_scheduler->reject_drafts(*sequence, drafted - (count - 1));
      spec.record(lane.rows[row], drafted, count - 1);
    }
    advanced.emplace_back(row, count);
  }
  advance_draws(advanced);
  for (const auto& [row, count] : advanced) {
    const SequenceId key = lane.rows[row];
    for (int c = 0; c < count; ++c) {
      batching::Sequence* sequence = step_scheduler->find_running(static_cast<batching::SequenceKey>(key), row);
      if (!sequence) break;  // ended by an earlier token of this step
      advance_grammar(*sequence, emitted[row * layout.rows + c]);  // none here (draft_rows): kept for the rule
      report(*sequence, emitted[row * layout.rows + c], lane.logits, lane.masks, row, out);
    }
    spec.drafts[row].clear();
  }
}

}  // namespace deepfuse
