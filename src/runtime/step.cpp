// The engine's step: prefill what is queued, then decode every running sequence.
//
// Decode steps run one ahead of the host (EngineOptions::overlap_steps): each step() launches the
// next decode step before it reads back the tokens of the one launched before, so the GPU never
// waits for the host between steps. A step needs no token from the host to run: the sampler
// writes each row's id where the next step's embedding reads it (StepBuffers::decode_ids), and
// positions follow from what is in flight. What the host learns only when it reads a step back
// (a stop token) costs one step of wasted work for that sequence, never a wrong token: the step
// launched after it is read back with the sequence gone, and its token is dropped.
//
// The sampler writes each step's ids straight into its lane's mapped pinned memory (StepLane):
// no copy after the graph delays the next step's upload and launch.
#include <algorithm>
#include <climits>
#include <string>
#include <unordered_map>

#include "deepfuse/error.hpp"
#include "runtime/engine_impl.hpp"
#include "runtime/rank_group.hpp"

namespace deepfuse {

using runtime::KvPageTable;
using runtime::Sequence;
using runtime::StepLane;

namespace {

// run_decode_step's input: the row's id is already in decode_ids on the device.
constexpr int32_t kIdOnDevice = -2;

// A bucket's decode graphs (DecodeGraphCache's plans): attention under the bucket's plan or the
// short-context one, each without or with the penalty kernel (only steps feeding a penalized row
// launch it).
int graph_variant(bool short_context, bool penalties) { return (short_context ? 1 : 0) + (penalties ? 2 : 0); }

// Whether the sequence has finished by length (its token budget or the context) once the steps
// in flight for it are read back: launching another step for it would be wasted.
bool finishes_by_length(const Sequence& s, int max_context) {
  const int generated = s.generated + s.in_flight, context = s.context + s.in_flight;
  return generated >= s.max_new_tokens || context + 1 >= max_context;
}

// Whether the next decode step would feed the sequence, pages permitting: its prompt is prefilled,
// it has not finished by length, and it is not giving its pages back (a preempted sequence waits
// for its step in flight, then preempt_youngest ends it).
bool wants_decode_step(const Sequence& s, int max_context) {
  return s.prefilled >= static_cast<int>(s.prompt.size()) && !finishes_by_length(s, max_context) && !s.preempting;
}

}  // namespace

std::vector<StepToken> Engine::step() {
  // Tensor parallel: every rank runs the same step; rank 0's report stands for all (the ids are
  // the ones it sampled and broadcast).
  std::vector<std::vector<StepToken>> out(ranks_->size());
  ranks_->run([&](Impl& s) {
    s.activate_device();
    std::vector<StepToken>& mine = out[s.link.shard.rank];
    s.prefill_queued(mine);
    s.decode_running(mine);
  });
  for (size_t r = 1; r < out.size(); ++r)
    DF_CHECK(out[r].size() == out[0].size(), "internal: tensor parallel rank " + std::to_string(r) +
                                                 " reported a different step from rank 0's");
  return std::move(out[0]);
}

void Engine::wait_for_launched_steps() {
  ranks_->run([&](Impl& s) {
    s.activate_device();
    DF_CHECK_CUDA(cudaStreamSynchronize(s.stream()));
  });
}

void Engine::Impl::upload_slot(int row, const SamplingParams& sampling, const kernels::PenaltySlot& penalties,
                               std::span<const int32_t> counted) {
  slot_host_read.wait();  // the host buffers may still be the source of an earlier upload
  kernels::SamplingSlot& slot = slot_host.as<kernels::SamplingSlot>()[row];
  slot = kernels::sampling_slot(sampling);
  slot.step = counted.size();  // draws count tokens generated so far, as reference::sample's step does
  DF_CHECK_CUDA(cudaMemcpyAsync(buffers->slots() + row, &slot, sizeof slot, cudaMemcpyHostToDevice, stream()));
  kernels::PenaltySlot& penalty = penalty_host.as<kernels::PenaltySlot>()[row];
  penalty = penalties;
  DF_CHECK_CUDA(
      cudaMemcpyAsync(buffers->penalties() + row, &penalty, sizeof penalty, cudaMemcpyHostToDevice, stream()));
  // A row's counts are kept only while a penalized sequence holds it: start them here.
  if (kernels::penalized(penalties) && !buffers->penalty_counts.empty()) {
    const size_t bytes = static_cast<size_t>(config.vocab_size) * sizeof(int32_t);
    if (counted.empty()) {
      DF_CHECK_CUDA(cudaMemsetAsync(buffers->counts_row(row), 0, bytes, stream()));
    } else {
      if (counts_host.bytes() == 0) counts_host = runtime::PinnedBuffer(bytes);
      int32_t* counts = counts_host.as<int32_t>();
      std::fill_n(counts, config.vocab_size, 0);
      for (const int32_t id : counted) ++counts[id];
      DF_CHECK_CUDA(cudaMemcpyAsync(buffers->counts_row(row), counts, bytes, cudaMemcpyHostToDevice, stream()));
    }
  }
  slot_host_read.record(stream());
}

runtime::PinnedBuffer& Engine::Impl::logits_host(runtime::PinnedBuffer& buffer) {
  if (buffer.bytes() == 0)
    buffer = runtime::PinnedBuffer(static_cast<size_t>(options.max_batch) * config.vocab_size * sizeof(float));
  return buffer;
}

void Engine::Impl::attach_logprobs(StepToken& token, const Sequence& sequence, const runtime::PinnedBuffer& logits,
                                   int row) const {
  if (sequence.top_logprobs < 0 || !samples_here()) return;
  const size_t vocab = config.vocab_size;
  TokenLogprobs logprobs =
      token_logprobs({logits.as<float>() + row * vocab, vocab}, token.id, sequence.top_logprobs);
  token.logprob = logprobs.logprob;
  token.top_logprobs = std::move(logprobs.top);
}

const StepLane* Engine::Impl::lane_with_graph(int bucket_index) const {
  for (const StepLane& lane : lanes)
    if (lane.graphs->captured(bucket_index)) return &lane;
  return nullptr;
}

// The last row moves into the hole, with its sampling and penalty slots, its token counts and its
// next id on the device. The copies are stream-ordered behind any step in flight, which still
// sees the old rows (its tokens are matched to sequences by id when read back).
void Engine::Impl::remove_running(int row) {
  const int moved_from = kv->remove_row(row);
  if (moved_from >= 0) {
    running[row] = std::move(running[moved_from]);
    DF_CHECK_CUDA(cudaMemcpyAsync(buffers->slots() + row, buffers->slots() + moved_from,
                                  sizeof(kernels::SamplingSlot), cudaMemcpyDeviceToDevice, stream()));
    DF_CHECK_CUDA(cudaMemcpyAsync(buffers->penalties() + row, buffers->penalties() + moved_from,
                                  sizeof(kernels::PenaltySlot), cudaMemcpyDeviceToDevice, stream()));
    if (kernels::penalized(running[row].penalties) && !buffers->penalty_counts.empty())
      DF_CHECK_CUDA(cudaMemcpyAsync(buffers->counts_row(row), buffers->counts_row(moved_from),
                                    static_cast<size_t>(config.vocab_size) * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                    stream()));
    DF_CHECK_CUDA(cudaMemcpyAsync(buffers->decode_ids() + row, buffers->decode_ids() + moved_from, sizeof(int32_t),
                                  cudaMemcpyDeviceToDevice, stream()));
  }
  running.pop_back();
}

void Engine::Impl::remove_finished(std::vector<int> rows) {
  // Highest rows first: a removal moves the last row, which is then already handled.
  std::sort(rows.rbegin(), rows.rend());
  for (int row : rows) {
    // Prefix caching: the full blocks of prompt + generated tokens stay cached, so the next turn
    // of a chat or agent loop (which resends this whole text) prefills only what is new.
    const Sequence& sequence = running[row];
    if (options.prefix_caching && !sequence.generated_ids.empty()) {
      std::vector<int32_t> text = sequence.prompt;
      text.insert(text.end(), sequence.generated_ids.begin(), sequence.generated_ids.end());
      kv->register_prompt_blocks(row, text, sequence.context);
    }
    remove_running(row);
  }
}

FinishReason Engine::Impl::finish_reason(const Sequence& sequence) const {
  if (std::find(sequence.stop_ids.begin(), sequence.stop_ids.end(), sequence.next_token) != sequence.stop_ids.end())
    return FinishReason::stop_token;
  if (sequence.generated >= sequence.max_new_tokens) return FinishReason::max_tokens;
  // Feeding next_token would make the sequence longer than max_context.
  if (sequence.context + 1 >= options.max_context) return FinishReason::context_length;
  return FinishReason::none;
}

void Engine::Impl::prefill(int row, std::span<const int32_t> ids, int start,
                           const std::function<void(int, int)>& after_chunk) {
  const int total = static_cast<int>(ids.size());
  const size_t stride = max_tokens();
  for (int done = 0; done < total; done += options.prefill_chunk) {
    const int tokens = std::min(options.prefill_chunk, total - done);
    prefill_host_read.wait();  // the previous chunk's inputs have been copied out
    int32_t* host = prefill_host.as<int32_t>();
    for (int t = 0; t < tokens; ++t) {
      host[t] = ids[done + t];
      host[stride + t] = start + done + t;
      host[2 * stride + t] = row;
    }
    DF_CHECK_CUDA(cudaMemcpyAsync(buffers->prefill_inputs.data(), host, prefill_host.bytes(), cudaMemcpyHostToDevice,
                                  stream()));
    prefill_host_read.record(stream());
    forward->prefill_chunk(row, start + done, tokens, stream());
    if (after_chunk) after_chunk(start + done, tokens);
  }
}

// Admits queued sequences while decode rows and pages for their prompts are free (FIFO: the
// first that does not fit waits, and so do those behind it), prefills each, and samples its first
// token from the last prompt position into its decode slot. One download reports them all.
// Under a prefill budget (EngineOptions::prefill_tokens_per_step) a prompt may take several steps:
// sequences still prefilling continue first (oldest first), then new ones are admitted while
// budget is left; a prefilling sequence holds its row and its prompt's pages and sits out decode.
void Engine::Impl::prefill_queued(std::vector<StepToken>& out) {
  int budget = options.prefill_tokens_per_step > 0 ? options.prefill_tokens_per_step : INT_MAX;
  const size_t vocab = config.vocab_size;
  std::vector<int> fresh_rows;
  // Runs up to `budget` more prompt tokens of the sequence on `row`; the last one samples its first token.
  auto prefill_some = [&](int row) {
    Sequence& sequence = running[row];
    const int prompt = static_cast<int>(sequence.prompt.size());
    const int tokens = std::min(prompt - sequence.prefilled, budget);
    const int start = sequence.prefilled;
    prefill(row, std::span(sequence.prompt).subspan(start, tokens), start, [&](int first, int chunk) {
      if (first + chunk < prompt) return;
      forward->final_norm(chunk - 1, 1, stream());
      forward->lm_head(0, 1, stream());
      forward->sample(row, 1, stream(), nullptr, kernels::penalized(sequence.penalties),
                      runtime::ForwardPass::Source::prompt);
      if (sequence.top_logprobs >= 0 && samples_here())  // the logits it was sampled from, penalized
        DF_CHECK_CUDA(cudaMemcpyAsync(logits_host(prefill_logits).as<float>() + row * vocab, buffers->logits.data(),
                                      vocab * sizeof(float), cudaMemcpyDeviceToHost, stream()));
    });
    sequence.prefilled += tokens;
    budget -= tokens;
    kv->register_prompt_blocks(row, sequence.prompt, sequence.prefilled);  // for later prompts to share
    if (sequence.prefilled == prompt) fresh_rows.push_back(row);
  };
  std::vector<int> continuing;
  for (int row = 0; row < static_cast<int>(running.size()); ++row)
    if (running[row].prefilled < static_cast<int>(running[row].prompt.size())) continuing.push_back(row);
  std::sort(continuing.begin(), continuing.end(), [&](int a, int b) { return running[a].id < running[b].id; });
  for (const int row : continuing)
    if (budget > 0) prefill_some(row);
  while (!queued.empty() && static_cast<int>(running.size()) < options.max_batch && budget > 0) {
    const int prompt = static_cast<int>(queued.front().prompt.size());
    if (KvPageTable::pages_for(prompt) > kv->table().free_pages()) {
      DF_CHECK(!running.empty(), "internal: an idle KV cache cannot hold a validated prompt");
      break;
    }
    const int row = kv->add_row();
    Sequence& admitted = running.emplace_back(std::move(queued.front()));
    queued.pop_front();
    // The longest cached run of full blocks, never the whole prompt: its last position must run to
    // give the first token. Then pages for the rest.
    admitted.cached = kv->adopt_prefix(row, admitted.prompt, (prompt - 1) / kernels::kKvPageSize);
    admitted.prefilled = admitted.cached;
    if (!kv->reserve(row, prompt)) {  // cached pages counted as free were the adopted ones: wait
      queued.push_front(std::move(running.back()));
      queued.front().cached = queued.front().prefilled = 0;
      running.pop_back();
      kv->remove_row(row);
      DF_CHECK(!running.empty(), "internal: an idle KV cache cannot hold a validated prompt");
      break;
    }
    const std::span<const int32_t> prior(admitted.prompt.end() - admitted.prior_generated, admitted.prompt.end());
    upload_slot(row, admitted.sampling, admitted.penalties, prior);
    prefill_some(row);
  }
  if (fresh_rows.empty()) return;
  // Its own buffer: a decode step in flight downloads into its lane's.
  DF_CHECK_CUDA(cudaMemcpyAsync(prefill_sampled.data(), buffers->decode_ids(), running.size() * sizeof(int32_t),
                                cudaMemcpyDeviceToHost, stream()));
  DF_CHECK_CUDA(cudaStreamSynchronize(stream()));
  std::vector<int> finished;
  for (int row : fresh_rows) {
    Sequence& sequence = running[row];
    sequence.context = static_cast<int>(sequence.prompt.size());
    sequence.generated = 1;
    sequence.next_token = prefill_sampled.as<int32_t>()[row];
    if (options.prefix_caching) sequence.generated_ids.push_back(sequence.next_token);
    sequence.id_on_device = true;  // the sampler wrote it into the row's decode id
    const FinishReason reason = finish_reason(sequence);
    out.push_back({sequence.id, sequence.next_token, reason, sequence.cached});
    attach_logprobs(out.back(), sequence, prefill_logits, row);
    if (reason != FinishReason::none) finished.push_back(row);
  }
  remove_finished(std::move(finished));
}

// Uploads rows 0..max_batch-1 of the step's inputs (ids -1, positions -1, lengths 0 where `input`
// says the row sits out; ids equal to kIdOnDevice stay as the device holds them), then the step,
// whose sampler leaves the ids in lane.sampled.
void Engine::Impl::run_decode_step(StepLane& lane, int sequences,
                                   const std::function<bool(int row, int32_t& id, int& position)>& input,
                                   bool penalties, std::span<const int> logprob_rows) {
  const int bucket_index = lane.graphs->bucket_index(sequences);
  const int max_batch = options.max_batch;
  lane.step_done.wait();  // the lane's last upload and step have run
  int32_t* ids = lane.inputs.as<int32_t>();
  int32_t* positions = ids + max_batch;
  int32_t* seq_lens = ids + 2 * max_batch;
  int longest = 0;
  for (int row = 0; row < max_batch; ++row) {
    int32_t id = -1;
    int position = -1;
    const bool active = row < sequences && input(row, id, position);
    ids[row] = active ? id : -1;
    positions[row] = active ? position : -1;
    seq_lens[row] = active ? position + 1 : 0;
    longest = std::max(longest, seq_lens[row]);
  }
  // Runs of ids the host knows go up; the run that reaches the last row goes with the positions
  // and lengths after it, so the common case (every running id already on the device, padded
  // rows after them) is one copy.
  int32_t* device_ids = buffers->decode_ids();
  auto upload = [&](int first, int count) {
    DF_CHECK_CUDA(cudaMemcpyAsync(device_ids + first, ids + first, count * sizeof(int32_t), cudaMemcpyHostToDevice,
                                  stream()));
  };
  int tail = max_batch;
  while (tail > 0 && ids[tail - 1] != kIdOnDevice) --tail;
  for (int row = 0; row < tail;) {
    if (ids[row] == kIdOnDevice) {
      ++row;
      continue;
    }
    const int first = row;
    while (ids[row] != kIdOnDevice) ++row;  // ends before tail: ids[tail - 1] is on the device
    upload(first, row - first);
  }
  upload(tail, 3 * max_batch - tail);
  // Short sequences: the bucket's short-context plan (splits merged in clusters), in a graph of its own.
  const std::optional<kernels::DecodeAttentionPlan>& short_plan = short_context_plans[bucket_index];
  const bool short_context = short_plan && longest <= short_plan->max_context;
  const kernels::DecodeAttentionPlan& plan = short_context ? *short_plan : decode_plans[bucket_index];
  int32_t* host_sampled = lane.sampled.device_as<int32_t>();
  lane.graphs->run(bucket_index, graph_variant(short_context, penalties), stream(), [&](cudaStream_t s) {
    forward->decode_step(this->plan.buckets[bucket_index], plan, host_sampled, penalties, s);
  });
  // Stream order: the copies read this step's logits before the next step's lm_head rewrites them.
  const size_t vocab = config.vocab_size;
  for (const int row : logprob_rows)
    DF_CHECK_CUDA(cudaMemcpyAsync(logits_host(lane.logits).as<float>() + row * vocab,
                                  buffers->logits.as<float>() + row * vocab, vocab * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream()));
  lane.step_done.record(stream());
}

void Engine::Impl::preempt_youngest(std::vector<StepToken>& out) {
  // Those chosen earlier whose steps have all been read back end now (highest row first: a
  // removal moves the last row, already handled).
  for (int row = static_cast<int>(running.size()) - 1; row >= 0; --row)
    if (running[row].preempting && running[row].in_flight == 0) {
      out.push_back({running[row].id, -1, FinishReason::kv_cache_full});
      remove_running(row);
    }
  for (;;) {
    int needed = 0, youngest = -1;
    bool pending = false;  // a victim's step is still in flight: its pages come back next step
    for (int row = 0; row < static_cast<int>(running.size()); ++row) {
      const Sequence& s = running[row];
      pending |= s.preempting;
      if (!wants_decode_step(s, options.max_context)) continue;
      needed += std::max(KvPageTable::pages_for(s.context + s.in_flight + 1) - kv->table().pages_in_row(row), 0);
      if (youngest < 0 || s.id > running[youngest].id) youngest = row;
    }
    if (youngest < 0 || pending || needed <= kv->table().free_pages()) return;
    Sequence& victim = running[youngest];
    victim.preempting = true;
    if (victim.in_flight > 0) return;  // sits steps out until its step is read back
    out.push_back({victim.id, -1, FinishReason::kv_cache_full});
    remove_running(youngest);
  }
}

// Launches a decode step for every running sequence that can take one more token (the others sit
// it out as padded rows); nothing when none can.
void Engine::Impl::launch_decode(std::vector<StepToken>& out) {
  preempt_youngest(out);
  // Room for the step's token, highest row first (a removal moves the last row, already
  // handled). A sequence with nothing in flight that finds no free page ends here, and its pages
  // go back at once, so the rows below may still grow; one with a step in flight sits this step
  // out and asks again once that step is read back.
  std::vector<char> feeds(running.size(), 0);
  for (int row = static_cast<int>(running.size()) - 1; row >= 0; --row) {
    const Sequence& sequence = running[row];
    if (!wants_decode_step(sequence, options.max_context)) continue;
    if (kv->reserve(row, sequence.context + sequence.in_flight + 1)) {
      feeds[row] = 1;
      continue;
    }
    // Short of a page: a younger sequence is being preempted (or the pages of one whose step is
    // in flight come back soon), so wait; only the youngest ends itself.
    const bool younger = std::any_of(running.begin(), running.end(),
                                     [&](const Sequence& s) { return s.id > sequence.id && s.preempting; });
    if (sequence.in_flight > 0 || younger) continue;
    out.push_back({sequence.id, -1, FinishReason::kv_cache_full});
    feeds[row] = feeds.back();  // the last row's decision moves with it
    feeds.pop_back();
    remove_running(row);
  }
  if (std::find(feeds.begin(), feeds.end(), 1) == feeds.end()) return;

  const int sequences = static_cast<int>(running.size());
  bool penalties = false;
  std::vector<int> logprob_rows;
  for (int row = 0; row < sequences; ++row) {
    if (!feeds[row]) continue;
    penalties |= kernels::penalized(running[row].penalties);
    if (running[row].top_logprobs >= 0 && samples_here()) logprob_rows.push_back(row);
  }
  const int lane_index = next_lane;
  next_lane = (next_lane + 1) % static_cast<int>(lanes.size());
  StepLane& lane = lanes[lane_index];
  run_decode_step(lane, sequences, [&](int row, int32_t& id, int& position) {
    if (!feeds[row]) return false;
    const Sequence& sequence = running[row];
    // A device id goes stale only when the row sat out a step, and then nothing is in flight.
    DF_CHECK(sequence.id_on_device || sequence.in_flight == 0, "internal: a decode row lost its next id");
    id = sequence.id_on_device ? kIdOnDevice : sequence.next_token;
    position = sequence.context + sequence.in_flight;
    return true;
  }, penalties, logprob_rows);
  lane.rows.assign(sequences, 0);
  for (int row = 0; row < sequences; ++row) {
    Sequence& sequence = running[row];
    if (feeds[row]) {
      lane.rows[row] = sequence.id;
      sequence.in_flight += 1;
    }
    sequence.id_on_device = feeds[row] != 0;  // a row that sat out was sampled from padding
  }
  launched.push_back(lane_index);
}

// Waits for the oldest step in flight and reports its tokens, in row order; tokens of sequences
// removed since it was launched are dropped.
void Engine::Impl::read_back_oldest(std::vector<StepToken>& out) {
  StepLane& lane = lanes[launched.front()];
  launched.pop_front();
  lane.step_done.wait();
  std::unordered_map<SequenceId, int> row_of;
  for (int row = 0; row < static_cast<int>(running.size()); ++row) row_of[running[row].id] = row;
  std::vector<int> finished;
  for (int fed_row = 0; fed_row < static_cast<int>(lane.rows.size()); ++fed_row) {
    const auto it = row_of.find(lane.rows[fed_row]);
    if (lane.rows[fed_row] == 0 || it == row_of.end()) continue;
    Sequence& sequence = running[it->second];
    sequence.in_flight -= 1;
    sequence.context += 1;
    sequence.generated += 1;
    sequence.next_token = lane.sampled.as<int32_t>()[fed_row];
    if (options.prefix_caching) sequence.generated_ids.push_back(sequence.next_token);
    const FinishReason reason = finish_reason(sequence);
    out.push_back({sequence.id, sequence.next_token, reason});
    attach_logprobs(out.back(), sequence, lane.logits, fed_row);
    if (reason != FinishReason::none) finished.push_back(it->second);
  }
  remove_finished(std::move(finished));
}

void Engine::Impl::decode_running(std::vector<StepToken>& out) {
  // A step in flight that feeds none of the running sequences (all finished or were removed
  // since) would report nothing: wait for it and drop it, so this call launches its own.
  auto feeds_someone = [&](const StepLane& lane) {
    return std::any_of(running.begin(), running.end(), [&](const Sequence& sequence) {
      return std::find(lane.rows.begin(), lane.rows.end(), sequence.id) != lane.rows.end();
    });
  };
  while (!launched.empty() && !feeds_someone(lanes[launched.front()])) read_back_oldest(out);
  if (launched.empty()) launch_decode(out);        // nothing ahead: this call's own step
  if (options.overlap_steps) launch_decode(out);   // and the next, before reading this one back
  if (!launched.empty()) read_back_oldest(out);
}

void Engine::Impl::forget_launched_steps() {
  DF_CHECK(running.empty(), "internal: steps in flight are dropped only with no sequence running");
  DF_CHECK_CUDA(cudaStreamSynchronize(stream()));
  launched.clear();
}

}  // namespace deepfuse
