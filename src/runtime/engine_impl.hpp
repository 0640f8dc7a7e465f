// The Engine's state and the steps it is built from (include/deepfuse/engine.hpp is the contract).
//
// Which sequences run in a step, and how many prompt tokens each gets, is the step scheduler's
// (src/batching, the same one the CPU backend runs): it owns the sequences, their KV pages and
// their rows (block-table row i is decode-batch entry i). This file's steps execute its plans:
// uploads, prefill chunks, decode steps through the lanes and graphs, and the read-backs whose
// tokens they report to it. Decode steps run one ahead of the host (step.cpp), so a sequence may
// have samples in flight, which the scheduler counts.
//
// Host/device traffic: every per-step input goes through pinned buffers, each rewritten only
// once the copy or step that last read it has run (after the step's one stream synchronisation,
// or after waiting on the event recorded behind that copy or step).
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "batching/kv_block_pool.hpp"
#include "batching/step_scheduler.hpp"
#include "deepfuse/engine.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/cublaslt_gemm.hpp"
#include "runtime/forward.hpp"
#include "runtime/gpu_weights.hpp"
#include "runtime/graph_cache.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/pinned_buffer.hpp"
#include "runtime/rank_link.hpp"
#include "runtime/speculation.hpp"
#include "scheduler/tuning_cache.hpp"
#include "scheduler/variants.hpp"

namespace deepfuse {

namespace runtime {

// Rows of the activation buffers: the largest pass, a prefill chunk, a decode step, a mixed
// step (a prefill chunk's tokens with every decode row) or a speculative verify step (every row
// with max_draft drafts).
inline int max_pass_tokens(const EngineOptions& o) {
  const int verify = o.speculative == SpeculativeChoice::off ? 0 : o.max_batch * (1 + o.max_draft);
  return std::max(o.mixed_steps ? o.prefill_chunk + o.max_batch : std::max(o.prefill_chunk, o.max_batch), verify);
}

// How a sequence samples (SequenceRequest); the scheduler holds the rest of it.
struct SequenceSettings {
  SamplingParams sampling;
  kernels::PenaltySlot penalties;  // presence / frequency
  int top_logprobs = -1;           // -1: no logprobs reported
  std::shared_ptr<TokenConstraint> constraint;  // structured output (SequenceRequest); null: free
  bool speculative = true;         // may be drafted (SequenceRequest::speculative)

  // A step feeding the sequence verifies no drafts, any row's: penalties, logprobs and grammars
  // stay exact only in plain steps (speculative_step.cpp).
  bool blocks_drafts() const { return kernels::penalized(penalties) || top_logprobs >= 0 || constraint; }
};

// A row whose next sample a grammar constrains: its mask is filled from `constraint` before the
// step's sampler. `key`: its sequence's.
struct ConstrainedRow {
  int row = 0;
  SequenceId key = 0;
  TokenConstraint* constraint = nullptr;
};

// What a launched step's sampler applies, from the settings of the rows it samples.
struct StepSampling {
  SamplerExtras extras;
  std::vector<int> logprob_rows;            // rows whose logits go to the lane's logits behind the step
  std::vector<ConstrainedRow> constrained;  // with extras.token_masks
};

// A step with token masks is launched without its sampler (SamplerExtras): what the sampler
// needs once the step before has been read back and the grammars know its tokens.
struct PendingSampler {
  int batch = 0;  // the bucket's entries
  ForwardPass::Source source = ForwardPass::Source::decode_step;
  StepSampling sampling;
};

// One decode step's host side: its inputs, the ids it samples, and which sequence each row fed.
// Two lanes alternate, so one step can be read back while the next is in flight. The step's
// sampler writes the ids into the lane's mapped pinned memory itself (no copy after the graph;
// docs/runtime.md, "The step's ends: copies, lm_head, sampler"), so each lane has its own graphs.
struct StepLane {
  PinnedBuffer inputs;           // int32 [3, max_batch]: ids | positions | seq_lens, uploaded
  PinnedBuffer sampled;          // int32 [max_batch]: the ids the step sampled (mapped)
  CopyEvent step_done;           // recorded after the lane's last upload and step
  std::vector<SequenceId> rows;  // the sequence each row fed when launched; 0 where none
  std::unique_ptr<DecodeGraphCache> graphs;
  bool verify = false;           // a speculative verify step: its tokens are in Speculation::results
  // fp32 [max_batch, vocab]: the (penalized) logits of rows whose sequences report logprobs,
  // copied behind the step; allocated when a sequence first asks.
  PinnedBuffer logits;
  // uint32 [max_batch, token_bitmask_words(vocab)]: the masks the step's sampler applied (uploaded
  // before it), kept for the logprobs read back with it; allocated when a constrained row first runs.
  PinnedBuffer masks;
  // Set while the step's forward pass is launched and its sampler is not (token masks); step_done
  // is recorded only behind the sampler.
  std::optional<PendingSampler> pending;
};

// Owns the engine's stream; waits for it before destroying it.
class StreamOwner {
 public:
  StreamOwner() = default;
  ~StreamOwner();
  StreamOwner(const StreamOwner&) = delete;
  StreamOwner& operator=(const StreamOwner&) = delete;
  void create();
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

}  // namespace runtime

struct Engine::Impl {
  Impl(ModelConfig model_config, const EngineOptions& engine_options);
  ~Impl();

  // Everything after the weights: workspaces, decode plans, KV cache (sized from what is left), graphs.
  // In two halves for tensor parallel ranks, which all take the smallest page count any affords.
  void finish_setup() {
    prepare_setup();
    complete_setup(affordable_kv_pages());
  }
  void prepare_setup();         // decode attention plans, step buffers, pinned lanes
  void prepare_speculation();   // EngineOptions::speculative: the verify steps' buffers and plans
  int affordable_kv_pages();    // KV pages the memory left holds (at most max_batch x max_context)
  void complete_setup(int kv_pages);  // the KV cache, the forward pass, GEMM tuning
  // Tensor parallel: µs per all-reduce of `tokens` rows under `choice`, `calls` of them captured
  // in a graph and replayed `replays` times (median). Every rank must call it together.
  double time_all_reduce(int tokens, AllReduceChoice choice, int calls, int replays);

  int max_tokens() const { return runtime::max_pass_tokens(options); }
  // The decode plan: the GPU class's built-in, or the tuning cache's entry, then the overrides
  // (scheduler/); then fit_plan_to_memory. `all_layouts`: the tuner's engine, whose weights hold
  // every layout some candidate needs.
  void make_plan(bool all_layouts = false);
  // The model facts the plan's choices depend on, the blocks' weight format included.
  scheduler::PlanShape plan_shape() const;
  scheduler::TuningKey tuning_key() const;
  runtime::KvGeometry kv_geometry() const {
    return {config.num_hidden_layers, config.num_key_value_heads, config.head_dim};
  }
  // Where the plan runs both MLP variants: drops the unfused copy (its buckets run the fused MLP,
  // as plan.source then says) unless the weights with it still leave room for max_batch x
  // max_context of KV cache (or EngineOptions::keep_mlp_copy and the weights fit).
  void fit_plan_to_memory();
  // The decode attention plans of bucket `index` from its plan's attention choice.
  void plan_attention(int index);
  // The decode attention plan of `batch` sequences under `choice` (0 / automatic: the planner's).
  kernels::DecodeAttentionPlan decode_attention_plan(int batch, const AttentionChoice& choice) const;
  cudaStream_t stream() const { return stream_owner.get(); }
  void activate_device() const;

  // ---- requests
  void validate_request(const SequenceRequest& request) const;
  void validate_ids(std::span<const int32_t> ids, const std::string& what) const;

  // ---- steps (step.cpp)
  // The scheduler's prefill phase: admissions and prompt chunks, then their first tokens read back.
  void prefill_step(std::vector<StepToken>& out);
  // Launches steps ahead as overlap_steps asks, then reads back the oldest one in flight (a step
  // with token masks gets its sampler once the step before it is read back).
  void decode_running(std::vector<StepToken>& out);
  // The scheduler's decode phase (which may preempt the youngest), launched; nothing when it is empty.
  void launch_decode();
  // Between taking its tokens to the grammars and reporting them (which may move rows on the
  // stream), launches the sampler of the step after it when that one waits for its masks.
  void read_back_oldest(std::vector<StepToken>& out);
  // The sequence's grammar, if any, takes `id` (on the rank that samples), before its report.
  void advance_grammar(const batching::Sequence& sequence, int32_t id);
  // The pending sampler of `lane`: its constrained rows' masks (the rows of sequences in
  // `ending`, whose last token ends them, stay all ones), then the sampler and the logprob copies.
  void launch_sampler(runtime::StepLane& lane, std::span<const SequenceId> ending);
  // Hands the sequence's sampled `id` to the scheduler and reports it (logprobs from row
  // `logits_row` of `logits`; of the masked logits when it is constrained, `masks` row
  // `logits_row`, as the CPU backend reports them). Its grammar has taken `id` already.
  void report(batching::Sequence& sequence, int32_t id, const runtime::PinnedBuffer& logits,
              const runtime::PinnedBuffer& masks, int logits_row, std::vector<StepToken>& out);
  // With no sequence running: waits for the steps in flight and drops them (their sequences are gone).
  void forget_launched_steps();
  // Runs `ids` through the sequence on block-table row `row` from position `start`, in chunks of
  // at most prefill_chunk tokens; after each chunk, after_chunk(first_position, tokens) may use
  // the chunk's final hidden states (residual rows 0..tokens-1).
  void prefill(int row, std::span<const int32_t> ids, int start, const std::function<void(int, int)>& after_chunk);
  // A decode step's input for a row: false where the row sits out, else the id it feeds and its position.
  using DecodeInput = std::function<bool(int row, int32_t& id, int& position)>;
  // Decode inputs for rows 0..max_batch-1 (-1 / -1 / 0 where `input` returns false) through
  // `lane` to the device, then the step (step.cpp).
  // `sampling`: what the sampler applies (the step's graph variant), the constrained rows' masks,
  // and the rows whose logits go to lane.logits behind the step. With token masks the step is
  // launched without its sampler (lane.pending; launch_sampler).
  void run_decode_step(runtime::StepLane& lane, int sequences, const DecodeInput& input,
                       const runtime::StepSampling& sampling = {});
  // The same, with the prompt chunks of a mixed plan in the pass (ForwardPass::mixed_step), eager.
  void run_mixed_step(runtime::StepLane& lane, int sequences, const DecodeInput& input,
                      std::span<const batching::PrefillChunk> chunks, const runtime::StepSampling& sampling);
  // On the rank that samples: rows [first_row, first_row + rows) of `host` all ones but the
  // constrained rows', which their grammars fill, then to StepBuffers::token_masks (stream
  // ordered behind the steps in flight). `host` is rewritten only once its last copy has run
  // (a lane after its step_done, prefill_masks after prefill_step's synchronisation).
  void upload_token_masks(runtime::PinnedBuffer& host, int first_row, int rows,
                          std::span<const runtime::ConstrainedRow> constrained);
  // run_decode_step's upload (after the lane's last step has run); returns the longest length.
  int upload_decode_inputs(runtime::StepLane& lane, int sequences, const DecodeInput& input);
  // Bucket `bucket_index`'s decode attention plan for a step whose longest sequence has `longest`
  // keys: its short-context plan (short_context set) where that serves it.
  const kernels::DecodeAttentionPlan& attention_plan(int bucket_index, int longest, bool& short_context) const;
  // Logits rows to lane.logits behind the step.
  void copy_logprob_rows(runtime::StepLane& lane, std::span<const int> rows);
  // An admitted sequence's row: its pages, and its sampling slot (its counts and draws resume
  // from the tokens it generated before a preemption).
  void admit_row(const batching::Sequence& sequence);
  // The row's sampling and penalty slots; with penalties, its counts start from `counted` (the
  // tokens it generated before: SequenceRequest::prior_generated), and so do its draws.
  void upload_slot(int row, const SamplingParams& sampling, const kernels::PenaltySlot& penalties = {},
                   std::span<const int32_t> counted = {});
  // `buffer` (a lane's logits or prefill_logits), allocated as fp32 [max_batch, vocab] on first use.
  runtime::PinnedBuffer& logits_host(runtime::PinnedBuffer& buffer);
  // With top_logprobs >= 0 (on the rank that samples), `token`'s from `logits` row `row`.
  // `mask`: the row's token bitmask when it was constrained (left-out ids at -inf first), else null.
  void attach_logprobs(StepToken& token, int top_logprobs, const runtime::PinnedBuffer& logits, int row,
                       const uint32_t* mask) const;
  // Whether this rank holds whole logits rows (tensor parallel: rank 0, which samples).
  bool samples_here() const { return link.shard.rank == 0; }
  // The lane whose graphs hold bucket `index` (stats and benchmark replays), or null: none yet.
  const runtime::StepLane* lane_with_graph(int bucket_index) const;
  // The scheduler moved the sequence on the last row `from` into the hole at `to`: its block-table
  // row, sampling and penalty slots, counts and next id on the device follow.
  void move_row(int from, int to);

  // ---- speculative decoding (speculative_step.cpp)
  // Drafts for the decode rows of `plan` (drafts[row]; every row empty where the step verifies
  // none: a step launched ahead, or one feeding a token in flight or a sequence that blocks
  // drafts); false when no row feeds any.
  bool draft_rows(batching::StepPlan& plan, std::vector<std::vector<int32_t>>& drafts);
  // Whether the step after the last one launched may be launched before that one is read back:
  // always without speculation; with it, not behind a verify step (what it emits is known only
  // at its read-back) nor when the step might verify drafts (next_step_may_draft).
  bool may_launch_ahead();
  // Whether some running sequence may be drafted at the step after the one in flight, and none
  // blocks drafts (speculative::next_step_may_draft over the sequences' drafters).
  bool next_step_may_draft();
  // The verify step of the rows `fed` (by row; null where a row sits out) and their drafts, eager.
  void run_verify_step(runtime::StepLane& lane, int sequences, std::span<const batching::DecodeRow* const> fed,
                       std::vector<std::vector<int32_t>>& drafts);
  // The ops of a verify step of `entries` tokens: the smallest bucket's that holds them; beyond the
  // largest, its ops where each kernel takes that many tokens (their weight layouts are held); else
  // none (the prefill pass's cuBLASLt projections and MLP).
  std::optional<BucketPlan> verify_ops(int entries) const;
  // Rolls each verified sequence's rejected drafts back, then reports its emitted tokens in order.
  void read_back_verify(runtime::StepLane& lane, std::vector<StepToken>& out);
  // The rows' sampling slots, their draw index set to what each sequence has generated + emitted[i]
  // (a verify step drew on its own slots).
  void advance_draws(std::span<const std::pair<int, int>> rows_and_emitted);

  // ---- scoring (score.cpp)
  std::vector<std::vector<float>> score_batch(const std::vector<std::vector<int32_t>>& sequences,
                                              const std::vector<int>& prefill_tokens);
  // Final norm + lm_head of residual rows 0..tokens-1, fp32 logits to `out` (tokens x vocab;
  // null: computed, not copied: a tensor-parallel rank other than 0).
  void logits_of_chunk(int tokens, float* out);

  ModelConfig config;
  EngineOptions options;  // max_context resolved
  DecodePlan plan;
  std::string plan_notice;  // why a tuning cache was ignored, or empty
  runtime::WeightLayouts layouts;  // what the weights hold: make_plan decides
  scheduler::GpuInfo gpu;  // options.device's, read once at construction
  runtime::RankLink link;  // tensor parallel: this rank's slice and links (one GPU: shard.ranks 1)
  size_t attention_workspace_floor = 0;  // the tuner's engine: room for its attention candidates
  runtime::StreamOwner stream_owner;  // declared first: destroyed last, after everything using it

  std::unique_ptr<runtime::GpuWeights> weights;
  std::unique_ptr<kernels::CublasLtGemm> gemm;
  std::vector<GemmTuning> gemm_tunings;  // EngineOptions::tune_gemms
  std::vector<kernels::DecodeAttentionPlan> decode_plans;  // one per bucket
  // Per bucket, for steps whose sequences are all short: splits merged in clusters (graph plan 1).
  std::vector<std::optional<kernels::DecodeAttentionPlan>> short_context_plans;
  std::unique_ptr<runtime::StepBuffers> buffers;
  DeviceBuffer partials;  // tensor parallel without peer access: link.partial's two buffers
  std::unique_ptr<runtime::KvCache> kv;
  std::unique_ptr<batching::KvBlockPool> pool;        // the KV pages and the prefix cache
  std::unique_ptr<batching::StepScheduler> step_scheduler;  // decides every step; owns the sequences
  std::unique_ptr<runtime::ForwardPass> forward;

  std::array<runtime::StepLane, 2> lanes;
  int next_lane = 0;
  std::deque<int> launched;              // lanes of the decode steps in flight, oldest first
  runtime::PinnedBuffer prefill_sampled; // int32 [max_batch]: first tokens of prefilled sequences
  runtime::PinnedBuffer prefill_logits;  // fp32 [max_batch, vocab]: their logits, for logprobs (on first use)
  runtime::PinnedBuffer prefill_masks;   // uint32 [max_batch, words]: constrained ones' masks (on first use)
  runtime::PinnedBuffer prefill_host;  // int32 [3, max_tokens]: ids | positions | rows
  runtime::CopyEvent prefill_host_read;
  runtime::PinnedBuffer slot_host;     // kernels::SamplingSlot [max_batch]
  runtime::PinnedBuffer penalty_host;  // kernels::PenaltySlot [max_batch]
  runtime::PinnedBuffer counts_host;   // int32 [vocab]: a resumed sequence's first counts (on first use)
  runtime::CopyEvent slot_host_read;   // after the last upload from any of the three

  std::unique_ptr<runtime::Speculation> speculation;  // EngineOptions::speculative on (null: off)
  std::unordered_map<SequenceId, runtime::SequenceSettings> settings;  // of every sequence the scheduler holds
  SequenceId next_id = 1;
};

}  // namespace deepfuse
