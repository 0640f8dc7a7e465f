// The engine's step: execute the step scheduler's prefill phase, then its decode phase.
//
// The scheduler (src/batching, batching::StepScheduler) decides which sequences run and how many
// prompt tokens each gets; this file runs exactly that and reports each sampled token back to it.
//
// Decode steps run one ahead of the host (EngineOptions::overlap_steps): each step() launches the
// next decode step before it reads back the tokens of the one launched before, so the GPU never
// waits for the host between steps. A step needs no token from the host to run: the sampler
// writes each row's id where the next step's embedding reads it (StepBuffers::decode_ids), and
// the scheduler counts the samples in flight when it plans positions. What the host learns only
// when it reads a step back (a stop token) costs one step of wasted work for that sequence, never
// a wrong token: the step launched after it is read back with the sequence gone, and its token is
// dropped. With speculative decoding, a step that may verify drafts waits for the read-back
// instead (drafts follow a token the host knows; Engine::Impl::may_launch_ahead).
//
// The sampler writes each step's ids straight into its lane's mapped pinned memory (StepLane):
// no copy after the graph delays the next step's upload and launch.
//
// Mixed steps (EngineOptions::mixed_steps): there is no prefill phase. Each launch plans both
// phases at once, and a plan with prompt chunks runs as one eager pass of the chunks' tokens and
// the decode rows (ForwardPass::mixed_step), launched ahead and read back like a decode step: a
// chunk that ends its prompt samples its first token into its row, where the next step reads it,
// and the host learns it when it reads that step back.
#include <algorithm>
#include <limits>
#include <string>
#include <utility>

#include "deepfuse/error.hpp"
#include "runtime/engine_impl.hpp"
#include "runtime/rank_group.hpp"

namespace deepfuse {

using runtime::StepLane;

namespace {

// run_decode_step's input: the row's id is already in decode_ids on the device.
constexpr int32_t kIdOnDevice = -2;

// A bucket's decode graphs (DecodeGraphCache's plans): attention under the bucket's plan or the
// short-context one, each without or with the penalty kernel (only steps feeding a penalized row
// launch it) and without or with token masks (only steps sampling a constrained row read them).
int graph_variant(bool short_context, runtime::SamplerExtras extras) {
  return (short_context ? 1 : 0) + (extras.penalties ? 2 : 0) + (extras.token_masks ? 4 : 0);
}

}  // namespace

std::vector<StepToken> Engine::step() {
  // Tensor parallel: every rank runs the same step; rank 0's report stands for all (the ids are
  // the ones it sampled and broadcast).
  std::vector<std::vector<StepToken>> out(ranks_->size());
  ranks_->run([&](Impl& s) {
    s.activate_device();
    std::vector<StepToken>& mine = out[s.link.shard.rank];
    if (!s.options.mixed_steps) s.prefill_step(mine);  // mixed: the launches below carry the prompts
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

void Engine::Impl::attach_logprobs(StepToken& token, int top_logprobs, const runtime::PinnedBuffer& logits,
                                   int row, const uint32_t* mask) const {
  if (top_logprobs < 0 || !samples_here()) return;
  const size_t vocab = config.vocab_size;
  std::span<const float> row_logits(logits.as<float>() + row * vocab, vocab);
  std::vector<float> masked;  // the sampler read left-out ids as -inf (reference::apply_token_bitmask)
  if (mask) {
    masked.assign(row_logits.begin(), row_logits.end());
    for (size_t id = 0; id < vocab; ++id)
      if (!token_allowed(mask, static_cast<int>(id))) masked[id] = -std::numeric_limits<float>::infinity();
    row_logits = masked;
  }
  TokenLogprobs logprobs = token_logprobs(row_logits, token.id, top_logprobs);
  token.logprob = logprobs.logprob;
  token.top_logprobs = std::move(logprobs.top);
}

void Engine::Impl::report(batching::Sequence& sequence, int32_t id, const runtime::PinnedBuffer& logits,
                          const runtime::PinnedBuffer& masks, int logits_row, std::vector<StepToken>& out) {
  const SequenceId key = static_cast<SequenceId>(sequence.key);
  const runtime::SequenceSettings& set = settings.at(key);
  const int top_logprobs = set.top_logprobs;
  const uint32_t* mask = set.constraint && samples_here() ? masks.as<uint32_t>() + static_cast<size_t>(logits_row) *
                                                                                      token_bitmask_words(config.vocab_size)
                                                         : nullptr;
  // The suffix drafter's cache takes a finished sequence's tokens: kept while this token may end it.
  std::vector<int32_t> ending;
  int first_generated = 0;
  if (speculation && speculation->keeps_outputs() && step_scheduler->finish_on(sequence, id) != FinishReason::none) {
    ending = sequence.tokens;
    ending.push_back(id);
    first_generated = sequence.first_generated;
  }
  const batching::Report report = step_scheduler->report(sequence, id);  // may end it: `sequence` is gone then
  out.push_back({key, id, report.finish, report.cached_tokens});
  attach_logprobs(out.back(), top_logprobs, logits, logits_row, mask);
  if (report.finish == FinishReason::none) return;
  settings.erase(key);  // `set` with it
  if (!speculation) return;
  const size_t prompt_tokens = std::min<size_t>(first_generated, ending.size());
  speculation->finished(key, std::span(ending).first(prompt_tokens), std::span(ending).subspan(prompt_tokens));
}

const StepLane* Engine::Impl::lane_with_graph(int bucket_index) const {
  for (const StepLane& lane : lanes)
    if (lane.graphs->captured(bucket_index)) return &lane;
  return nullptr;
}

// Stream-ordered behind any step in flight, which still sees the old rows (its tokens are matched
// to sequences by key when read back).
void Engine::Impl::move_row(int from, int to) {
  kv->move_row(from, to);
  DF_CHECK_CUDA(cudaMemcpyAsync(buffers->slots() + to, buffers->slots() + from, sizeof(kernels::SamplingSlot),
                                cudaMemcpyDeviceToDevice, stream()));
  DF_CHECK_CUDA(cudaMemcpyAsync(buffers->penalties() + to, buffers->penalties() + from, sizeof(kernels::PenaltySlot),
                                cudaMemcpyDeviceToDevice, stream()));
  const SequenceId moved = static_cast<SequenceId>(step_scheduler->at_row(to).key);
  if (kernels::penalized(settings.at(moved).penalties) && !buffers->penalty_counts.empty())
    DF_CHECK_CUDA(cudaMemcpyAsync(buffers->counts_row(to), buffers->counts_row(from),
                                  static_cast<size_t>(config.vocab_size) * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                                  stream()));
  DF_CHECK_CUDA(cudaMemcpyAsync(buffers->decode_ids() + to, buffers->decode_ids() + from, sizeof(int32_t),
                                cudaMemcpyDeviceToDevice, stream()));
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

void Engine::Impl::admit_row(const batching::Sequence& sequence) {
  const runtime::SequenceSettings& set = settings.at(static_cast<SequenceId>(sequence.key));
  kv->set_row(sequence.row, sequence.pages);  // its whole prompt's pages, adopted ones first
  const std::span<const int32_t> generated(sequence.tokens.begin() + sequence.first_generated, sequence.tokens.end());
  upload_slot(sequence.row, set.sampling, set.penalties, generated);
}

// Runs the scheduler's prefill phase: an admitted sequence's row is set up, then each chunk
// runs, and a chunk that ends a prompt samples its first token into the row's decode slot. One
// download reads those tokens back.
void Engine::Impl::prefill_step(std::vector<StepToken>& out) {
  const batching::StepPlan plan = step_scheduler->schedule(batching::Phase::prefill);
  if (plan.prefill.empty()) return;
  const size_t vocab = config.vocab_size;
  std::vector<std::pair<batching::Sequence*, int>> sampled;  // and its row
  for (const batching::PrefillChunk& chunk : plan.prefill) {
    batching::Sequence& sequence = *chunk.sequence;
    const int row = sequence.row;
    const runtime::SequenceSettings& set = settings.at(static_cast<SequenceId>(sequence.key));
    if (chunk.admits) admit_row(sequence);
    const int end = chunk.first + chunk.count;
    prefill(row, std::span(sequence.tokens).subspan(chunk.first, chunk.count), chunk.first, [&](int first, int tokens) {
      if (!chunk.samples || first + tokens < end) return;
      forward->final_norm(tokens - 1, 1, stream());
      forward->lm_head(0, 1, stream());
      const runtime::SamplerExtras extras{kernels::penalized(set.penalties), set.constraint != nullptr};
      if (set.constraint) {
        const runtime::ConstrainedRow constrained{row, static_cast<SequenceId>(sequence.key), set.constraint.get()};
        upload_token_masks(prefill_masks, row, 1, std::span(&constrained, 1));
      }
      forward->sample(row, 1, stream(), nullptr, extras, runtime::ForwardPass::Source::prompt);
      if (set.top_logprobs >= 0 && samples_here())  // the logits it was sampled from, penalized
        DF_CHECK_CUDA(cudaMemcpyAsync(logits_host(prefill_logits).as<float>() + row * vocab, buffers->logits.data(),
                                      vocab * sizeof(float), cudaMemcpyDeviceToHost, stream()));
    });
    if (chunk.samples) sampled.emplace_back(&sequence, row);
  }
  step_scheduler->complete(plan);  // full prompt blocks, for later prompts to share
  if (sampled.empty()) return;
  // Its own buffer: a decode step in flight downloads into its lane's.
  DF_CHECK_CUDA(cudaMemcpyAsync(prefill_sampled.data(), buffers->decode_ids(),
                                step_scheduler->running() * sizeof(int32_t), cudaMemcpyDeviceToHost, stream()));
  DF_CHECK_CUDA(cudaStreamSynchronize(stream()));
  // Rows as they were at the download: a report that ends a sequence moves another's row.
  for (auto [sequence, row] : sampled) {
    advance_grammar(*sequence, prefill_sampled.as<int32_t>()[row]);
    report(*sequence, prefill_sampled.as<int32_t>()[row], prefill_logits, prefill_masks, row, out);
  }
}

// Uploads rows 0..max_batch-1 of the step's inputs (ids -1, positions -1, lengths 0 where `input`
// says the row sits out; ids equal to kIdOnDevice stay as the device holds them), then the step,
// whose sampler leaves the ids in lane.sampled.
void Engine::Impl::run_decode_step(StepLane& lane, int sequences, const DecodeInput& input,
                                   const runtime::StepSampling& sampling) {
  const int bucket_index = lane.graphs->bucket_index(sequences);
  const int longest = upload_decode_inputs(lane, sequences, input);
  bool short_context = false;
  const kernels::DecodeAttentionPlan& plan = attention_plan(bucket_index, longest, short_context);
  int32_t* host_sampled = lane.sampled.device_as<int32_t>();
  const runtime::SamplerExtras extras = sampling.extras;
  lane.graphs->run(bucket_index, graph_variant(short_context, extras), stream(), [&](cudaStream_t s) {
    forward->decode_step(this->plan.buckets[bucket_index], plan, host_sampled, extras, s);
  });
  if (extras.token_masks) {  // its sampler waits for the masks (launch_sampler)
    lane.pending = runtime::PendingSampler{plan.batch, runtime::ForwardPass::Source::decode_step, sampling};
    return;
  }
  copy_logprob_rows(lane, sampling.logprob_rows);
  lane.step_done.record(stream());
}

// The chunks' tokens go up behind the entries' positions and rows; the entries' ids are copied
// on the device, where samples in flight are.
void Engine::Impl::run_mixed_step(StepLane& lane, int sequences, const DecodeInput& input,
                                  std::span<const batching::PrefillChunk> chunks, const runtime::StepSampling& sampling) {
  const int longest = upload_decode_inputs(lane, sequences, input);
  bool short_context = false;
  const kernels::DecodeAttentionPlan& plan = attention_plan(lane.graphs->bucket_index(sequences), longest, short_context);
  const int batch = plan.batch;
  const size_t stride = max_tokens();
  prefill_host_read.wait();  // the last pass's inputs have been copied out
  int32_t* host = prefill_host.as<int32_t>();
  int32_t* draws = host + 3 * stride;  // StepBuffers::step_draws
  std::fill_n(draws, batch, -1);
  std::vector<runtime::StepChunk> passes;
  int offset = 0;
  for (const batching::PrefillChunk& chunk : chunks) {
    const batching::Sequence& sequence = *chunk.sequence;
    for (int t = 0; t < chunk.count; ++t) {
      host[offset + t] = sequence.tokens[chunk.first + t];
      host[stride + offset + t] = chunk.first + t;
      host[2 * stride + offset + t] = sequence.row;
    }
    passes.push_back({sequence.row, chunk.first, chunk.count, offset, chunk.samples});
    if (chunk.samples) draws[sequence.row] = 0;
    offset += chunk.count;
  }
  const int32_t* positions = lane.inputs.as<int32_t>() + options.max_batch;  // as upload_decode_inputs left them
  bool decode = false;
  for (int row = 0; row < batch; ++row) {
    host[stride + offset + row] = positions[row];
    host[2 * stride + offset + row] = row;
    if (positions[row] < 0) continue;
    draws[row] = 0;
    decode = true;
  }
  DF_CHECK_CUDA(cudaMemcpyAsync(buffers->prefill_inputs.data(), host, prefill_host.bytes(), cudaMemcpyHostToDevice,
                                stream()));
  prefill_host_read.record(stream());
  DF_CHECK_CUDA(cudaMemcpyAsync(buffers->prefill_ids() + offset, buffers->decode_ids(), batch * sizeof(int32_t),
                                cudaMemcpyDeviceToDevice, stream()));
  forward->mixed_step(plan, decode, passes, lane.sampled.device_as<int32_t>(), sampling.extras, stream());
  if (sampling.extras.token_masks) {  // its sampler waits for the masks (launch_sampler)
    lane.pending = runtime::PendingSampler{batch, runtime::ForwardPass::Source::mixed_step, sampling};
    return;
  }
  copy_logprob_rows(lane, sampling.logprob_rows);
  lane.step_done.record(stream());
}

const kernels::DecodeAttentionPlan& Engine::Impl::attention_plan(int bucket_index, int longest,
                                                                 bool& short_context) const {
  // Short sequences: the bucket's short-context plan (splits merged in clusters), in a graph of its own.
  const std::optional<kernels::DecodeAttentionPlan>& short_plan = short_context_plans[bucket_index];
  short_context = short_plan && longest <= short_plan->max_context;
  return short_context ? *short_plan : decode_plans[bucket_index];
}

// Stream order: the copies read this step's logits before the next step's lm_head rewrites them.
void Engine::Impl::copy_logprob_rows(StepLane& lane, std::span<const int> rows) {
  const size_t vocab = config.vocab_size;
  for (const int row : rows)
    DF_CHECK_CUDA(cudaMemcpyAsync(logits_host(lane.logits).as<float>() + row * vocab,
                                  buffers->logits.as<float>() + row * vocab, vocab * sizeof(float),
                                  cudaMemcpyDeviceToHost, stream()));
}

int Engine::Impl::upload_decode_inputs(StepLane& lane, int sequences, const DecodeInput& input) {
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
  return longest;
}

// Launches a decode step for the rows the scheduler's decode phase feeds (the others sit it out
// as padded rows), or with mixed steps a plan of both phases (as a mixed step when it has prompt
// chunks); nothing when the plan is empty.
void Engine::Impl::launch_decode() {
  batching::StepPlan plan =  // may preempt: rows move
      step_scheduler->schedule(options.mixed_steps ? batching::Phase::both : batching::Phase::decode);
  if (plan.empty()) return;
  std::vector<std::vector<int32_t>> drafts;  // speculative: per row, fed after its token
  const bool verify = draft_rows(plan, drafts);  // before the rows' pages go up: drafts take pages
  const int sequences = step_scheduler->running();
  std::vector<const batching::DecodeRow*> fed(sequences, nullptr);
  runtime::StepSampling sampling;
  auto samples = [&](const batching::Sequence& sequence) {
    const runtime::SequenceSettings& set = settings.at(static_cast<SequenceId>(sequence.key));
    sampling.extras.penalties |= kernels::penalized(set.penalties);
    if (set.top_logprobs >= 0 && samples_here()) sampling.logprob_rows.push_back(sequence.row);
    if (!set.constraint) return;
    sampling.extras.token_masks = true;
    sampling.constrained.push_back({sequence.row, static_cast<SequenceId>(sequence.key), set.constraint.get()});
  };
  for (const batching::PrefillChunk& chunk : plan.prefill) {  // a mixed plan's
    if (chunk.admits) admit_row(*chunk.sequence);
    if (chunk.samples) samples(*chunk.sequence);
  }
  for (const batching::DecodeRow& decode : plan.decode) {
    fed[decode.sequence->row] = &decode;
    kv->grow_row(decode.sequence->row, decode.sequence->pages);  // a page for the new position, every 16 steps
    samples(*decode.sequence);
  }
  const int lane_index = next_lane;
  next_lane = (next_lane + 1) % static_cast<int>(lanes.size());
  StepLane& lane = lanes[lane_index];
  const DecodeInput input = [&](int row, int32_t& id, int& position) {
    const batching::DecodeRow* decode = fed[row];
    if (!decode) return false;
    // A sample in flight is in the row's decode id (the scheduler feeds it only while the row
    // keeps it); any other token the host has read back.
    id = decode->feeds_sample_in_flight() ? kIdOnDevice : decode->sequence->tokens[decode->position];
    position = decode->position;
    return true;
  };
  lane.verify = false;
  if (plan.mixed)
    run_mixed_step(lane, sequences, input, plan.prefill, sampling);
  else if (verify)
    run_verify_step(lane, sequences, fed, drafts);
  else
    run_decode_step(lane, sequences, input, sampling);
  lane.rows.assign(sequences, 0);
  for (const batching::PrefillChunk& chunk : plan.prefill)
    if (chunk.samples) lane.rows[chunk.sequence->row] = static_cast<SequenceId>(chunk.sequence->key);
  for (const batching::DecodeRow& decode : plan.decode)
    lane.rows[decode.sequence->row] = static_cast<SequenceId>(decode.sequence->key);
  step_scheduler->complete(plan);
  if (speculation && !launched.empty()) ++speculation->counts.launched_ahead_steps;
  launched.push_back(lane_index);
}

// Waits for the oldest step in flight and reports its tokens, in row order; tokens of sequences
// removed since it was launched are dropped. The step after it, when launched without its sampler
// (token masks), gets the sampler between the grammars taking these tokens and the reports: a
// report that ends a sequence moves rows on the device, which that sampler must not see.
void Engine::Impl::read_back_oldest(std::vector<StepToken>& out) {
  StepLane& lane = lanes[launched.front()];
  DF_CHECK(!lane.pending, "internal: a step read back before its sampler was launched");
  launched.pop_front();
  lane.step_done.wait();
  if (lane.verify) {  // no constrained row: draft_rows leaves them to plain steps
    read_back_verify(lane, out);
    return;
  }
  const int32_t* ids = lane.sampled.as<int32_t>();
  std::vector<std::pair<batching::Sequence*, int>> fed;  // and its row; a Sequence stays put when rows move
  for (int fed_row = 0; fed_row < static_cast<int>(lane.rows.size()); ++fed_row) {
    if (lane.rows[fed_row] == 0) continue;
    batching::Sequence* sequence =
        step_scheduler->find_running(static_cast<batching::SequenceKey>(lane.rows[fed_row]), fed_row);
    if (!sequence) continue;
    advance_grammar(*sequence, ids[fed_row]);
    fed.emplace_back(sequence, fed_row);
  }
  if (!launched.empty() && lanes[launched.front()].pending) {
    std::vector<SequenceId> ending;
    for (auto [sequence, row] : fed)
      if (step_scheduler->finish_on(*sequence, ids[row]) != FinishReason::none)
        ending.push_back(static_cast<SequenceId>(sequence->key));
    launch_sampler(lanes[launched.front()], ending);
  }
  for (auto [sequence, row] : fed) report(*sequence, ids[row], lane.logits, lane.masks, row, out);
}

void Engine::Impl::advance_grammar(const batching::Sequence& sequence, int32_t id) {
  const runtime::SequenceSettings& set = settings.at(static_cast<SequenceId>(sequence.key));
  if (set.constraint && samples_here()) set.constraint->accept(id);  // the id its mask allowed: throws otherwise
}

void Engine::Impl::launch_sampler(StepLane& lane, std::span<const SequenceId> ending) {
  const runtime::PendingSampler& pending = *lane.pending;
  std::vector<runtime::ConstrainedRow> rows;  // a sequence that has just ended has no next mask
  for (const runtime::ConstrainedRow& c : pending.sampling.constrained)
    if (std::find(ending.begin(), ending.end(), c.key) == ending.end()) rows.push_back(c);
  upload_token_masks(lane.masks, 0, pending.batch, rows);
  forward->sample(0, pending.batch, stream(), lane.sampled.device_as<int32_t>(), pending.sampling.extras,
                  pending.source);
  copy_logprob_rows(lane, pending.sampling.logprob_rows);
  lane.step_done.record(stream());
  lane.pending.reset();
}

void Engine::Impl::decode_running(std::vector<StepToken>& out) {
  // A step in flight that feeds none of the running sequences (all finished or were removed
  // since) would report nothing: wait for it and drop it, so this call launches its own.
  auto feeds_someone = [&](const StepLane& lane) {
    for (int row = 0; row < static_cast<int>(lane.rows.size()); ++row)
      if (lane.rows[row] != 0 && step_scheduler->find_running(static_cast<batching::SequenceKey>(lane.rows[row]), row))
        return true;
    return false;
  };
  // Between calls every step in flight has its sampler (a step with token masks gets it once the
  // one before is read back; docs/runtime.md, "Constrained rows").
  while (!launched.empty() && !feeds_someone(lanes[launched.front()])) read_back_oldest(out);
  if (launched.empty()) {  // nothing ahead: this call's own step, whose masks need no token in flight
    launch_decode();
    if (!launched.empty() && lanes[launched.front()].pending) launch_sampler(lanes[launched.front()], {});
  }
  // And the next, before reading this one back, unless it may verify drafts: a row drafts only
  // from a token the host has read back.
  if (options.overlap_steps && may_launch_ahead()) launch_decode();
  if (!launched.empty()) read_back_oldest(out);
}

void Engine::Impl::upload_token_masks(runtime::PinnedBuffer& host, int first_row, int rows,
                                      std::span<const runtime::ConstrainedRow> constrained) {
  if (!samples_here()) return;  // the other ranks' samplers do not run
  const size_t words = token_bitmask_words(config.vocab_size);
  if (host.bytes() == 0) host = runtime::PinnedBuffer(static_cast<size_t>(options.max_batch) * words * sizeof(uint32_t));
  uint32_t* masks = host.as<uint32_t>();
  std::fill_n(masks + first_row * words, rows * words, ~0u);  // the free rows and padded entries
  for (const runtime::ConstrainedRow& c : constrained) c.constraint->fill_next_mask({masks + c.row * words, words});
  DF_CHECK_CUDA(cudaMemcpyAsync(buffers->mask_row(first_row), masks + first_row * words,
                                rows * words * sizeof(uint32_t), cudaMemcpyHostToDevice, stream()));
}

void Engine::Impl::forget_launched_steps() {
  DF_CHECK(step_scheduler->running() == 0, "internal: steps in flight are dropped only with no sequence running");
  DF_CHECK_CUDA(cudaStreamSynchronize(stream()));
  launched.clear();
}

}  // namespace deepfuse
