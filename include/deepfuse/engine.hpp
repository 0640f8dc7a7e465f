// The CUDA engine: a Llama / Qwen2 / Mistral decoder on one GPU, every step built from the fused
// kernels in src/kernels, a paged KV cache, and the decode step replayed as a CUDA graph per batch
// bucket. The runtime layer (src/runtime) implements it; the CLI, the benchmarks and the server
// (src/server, `deepfuse serve`) drive it.
//
// Life of a sequence: add_sequence() checks and queues the prompt (nothing runs yet); step()
// prefills what the step scheduler admits (chunked) and then runs one decode step for all running
// ones, returning the token each produced. A sequence finishes on a stop id, at its
// max_new_tokens, or at the model's context length. When the KV cache has no page left for a
// step, the youngest running sequence is preempted: it gives its pages back and waits in the
// queue, then recomputes what it had (prompt and tokens generated) and carries on; its tokens
// are the same as if it had run through. Sequences may be added between steps.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deepfuse/decode_plan.hpp"
#include "deepfuse/finish_reason.hpp"
#include "deepfuse/gemm_tuning.hpp"
#include "deepfuse/logprobs.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/sampling_params.hpp"
#include "deepfuse/scheduling_stats.hpp"
#include "deepfuse/token_constraint.hpp"
#include "deepfuse/speculative.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse {

namespace runtime {
class EngineBench;
class EngineTuning;
class RankGroup;
}

struct EngineOptions {
  int max_batch = 8;              // largest decode batch; graphs are captured for buckets 1,2,4,..,max_batch
  int max_context = 0;            // tokens per sequence; 0: the model's max_position_embeddings
  size_t kv_cache_bytes = 0;      // 0: kv_memory_fraction of the GPU memory left after the weights
  double kv_memory_fraction = 0.90;
  bool cuda_graphs = true;        // false: eager launches (debugging); results are identical
  int prefill_chunk = 1024;       // prompt tokens per prefill pass
  // The decode plan (deepfuse/decode_plan.hpp): which variant each op runs per batch bucket. The
  // GPU class's built-in plan, replaced by the entry `deepfuse tune` saved in `tuning_cache` for
  // this GPU, model and buckets (empty path: none), then `plan_overrides` (applied in order; an
  // override the model or GPU cannot run is an error). Engine::plan() shows the result.
  std::filesystem::path tuning_cache;
  std::vector<PlanOverride> plan_overrides;
  // Prompt tokens prefilled per step() at most, over all sequences (0: every admitted prompt is
  // prefilled whole in the step that admits it). A prompt longer than what is left is continued in
  // the next steps while the running sequences keep decoding, so a long prompt never stalls them
  // for its whole prefill (the server's chunked prefill; the step scheduler, src/batching).
  int prefill_tokens_per_step = 0;
  // Share the KV pages of full 16-token prompt blocks across sequences: a prompt that starts with
  // blocks an earlier prompt computed takes their pages (reference counted; unreferenced ones stay
  // cached until a fresh page is needed, least recently used first) and prefills only the rest.
  bool prefix_caching = false;
  // Mixed steps: a step's prompt chunks and the running sequences' decode rows go through one
  // forward pass (the chunks' tokens and one token per decoding sequence in the same cuBLASLt
  // GEMMs, prefill attention for the chunks, decode attention for the rows), launched eagerly and
  // ahead of the host like a decode step, instead of a prefill pass the decode rows sit out. One
  // pass holds at most prefill_chunk prompt tokens, so no step prefills more. Steps of decode rows
  // only stay CUDA graphs. A prompt's first token comes back with its step, as decode tokens do
  // (docs/runtime.md, "Mixed steps").
  bool mixed_steps = false;
  // Decode steps run one ahead of the host: step() launches the next decode step before it reads
  // back this one's tokens, so the GPU does not wait for the host between steps (docs/runtime.md,
  // "Steps launched ahead").
  // A sequence that stops on a stop id has one step computed for nothing. false: one step per
  // step(), nothing in flight when it returns.
  bool overlap_steps = true;
  // At construction, time cuBLASLt's suggested algorithms for each GEMM the decode steps run
  // through it (the lm_head at every batch; QKV, o_proj and the unfused MLP where the fused
  // kernels do not serve the batch) and keep the fastest, instead of its heuristic's first choice
  // (Engine::gemm_tunings() lists what was found). Costs ~0.1-1 s at construction. The choice can
  // differ between processes when two algorithms time within noise, and with it the last bits of
  // the logits; false keeps cuBLASLt's deterministic first choice.
  bool tune_gemms = false;
  // Benchmarks: keep the unfused MLP's second weight copy whenever the plan runs both MLP variants
  // and the weights fit, even where it leaves less than max_batch x max_context of KV cache
  // (which the engine otherwise keeps first, dropping the copy: Engine::plan() then says so).
  bool keep_mlp_copy = false;
  int device = 0;
  // Tensor parallelism: the model split over this many GPUs (device .. device + N - 1), one host
  // thread each in this process, two all-reduces per block (docs/dist.md). Stats and the plan are
  // rank 0's (per GPU).
  int tensor_parallel = 1;
  // Linear weights made in another format at load (--quantize fp8: per-channel FP8 e4m3, the
  // lm_head kept bf16 unless quantize_lm_head), checkpoints and random weights alike (random
  // weights are drawn in bf16 and then quantized, so bf16 and FP8 engines of one seed hold the
  // same model up to FP8 rounding). An FP8 checkpoint loads in its own format without it.
  WeightLoadOptions weights;
  // Speculative decoding without a draft model (issue 54; deepfuse/speculative.hpp,
  // docs/runtime.md): a decode row whose sequence's drafter proposes tokens feeds them after its
  // token, and the step verifies them on the GPU, emitting 1 to max_draft + 1 tokens. Output is
  // unchanged (greedy token for token; sampled, the same distribution). A step that may verify
  // drafts waits for the step before to be read back (drafts follow a token the host knows, and a
  // verify's next input is known only once it is read back); steps that cannot (every drafter
  // sitting out or without a possible match) are launched ahead as overlap_steps says. A step
  // that feeds a sequence with penalties or logprobs, or prompt chunks (mixed), verifies no
  // drafts. One GPU only.
  SpeculativeChoice speculative = SpeculativeChoice::off;
  int max_draft = 8;  // drafts per sequence per step at most (1 .. 15)
};

// Called while weights load: bytes done, bytes total.
using LoadProgress = std::function<void(size_t done, size_t total)>;


struct SequenceRequest {
  std::vector<int32_t> prompt;           // at least one id
  SamplingParams sampling;    // repetition_penalty must be 1 on this backend
  int max_new_tokens = 16;
  std::vector<int32_t> stop_ids;         // generation ends after producing one of these
  // OpenAI's penalties over the tokens the sequence generates (never its prompt), applied on the
  // GPU before sampling: logit -= presence + frequency * count for each id generated count > 0
  // times (reference::apply_presence_frequency_penalties). Finite; 0 and 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // -1: no logprobs. Otherwise each StepToken carries the token's logprob and this many
  // alternatives (deepfuse/logprobs.hpp: of the penalized logits, before temperature and the
  // other filters). Costs a copy of the row's logits to the host and a pass over them per token.
  int top_logprobs = -1;
  // A sequence resumed by its caller (prompt + the tokens an earlier run generated): the last
  // `prior_generated` ids of `prompt` are tokens it generated before. They count for the
  // penalties, and its first sampling draw is draw prior_generated (reference::sample's step), not
  // 0. (A sequence the engine preempts resumes so by itself.)
  int prior_generated = 0;
  // Structured output: the grammar the sequence's tokens must follow (its own matcher; null:
  // free). The engine asks it for the allowed ids before each token it samples (the mask goes to
  // the GPU sampler) and tells it each token it reports, on the thread that calls step(). A
  // resumed sequence's constraint must already have accepted its prior_generated tokens. A step
  // that samples a constrained row is launched ahead without its sampler, which follows once the
  // step before is read back and the masks are filled (docs/runtime.md, "Constrained rows").
  std::shared_ptr<TokenConstraint> constraint;
  // false: never drafted, whatever EngineOptions::speculative says (a per-request opt-out).
  bool speculative = true;
};

using SequenceId = int64_t;

// What one step produced for one sequence.
struct StepToken {
  SequenceId sequence = 0;
  int32_t id = 0;                        // the sampled token
  FinishReason finish = FinishReason::none;  // none: the sequence keeps running
  int cached_tokens = -1;                // with a sequence's first token: prompt tokens whose KV pages came
                                         // from the prefix cache (EngineOptions::prefix_caching); else -1
  // When the request asked (top_logprobs >= 0) and id >= 0: the token's logprob and the most
  // likely alternatives, most likely first.
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs{};
};

// Memory and launch accounting for benchmarks and `inspect`.
struct EngineStats {
  size_t weight_bytes = 0;               // bytes a decode step reads from weights
  size_t gpu_weight_bytes = 0;           // bytes the weights hold on the device, every layout the plan needs
  size_t kv_cache_bytes = 0;             // pool size
  int kv_pages_total = 0;
  int kv_pages_free = 0;                 // free, or kept by the prefix cache and evictable
  int kv_pages_cached = 0;               // of those, the prefix cache's
  size_t gpu_memory_used = 0;            // by this process, from cudaMemGetInfo
  int launches_per_decode_step = 0;      // launches the step's op list makes (a cuBLASLt GEMM counts one;
                                         // a step feeding a penalized row adds the penalty kernel)
  int launches_per_layer = 0;
  int kernels_per_decode_step = 0;       // kernel nodes in the bucket's captured graph, counted from
                                         // the graph (0 before the bucket's first step, or without graphs)
};

// The decode plan an engine with these options would run for `config` on options.device, and the
// bytes its weights would hold there, without loading any weight (`deepfuse inspect --plan`).
struct PlanPreview {
  DecodePlan plan;
  std::string notice;           // Engine::plan_notice()
  size_t gpu_weight_bytes = 0;  // EngineStats::gpu_weight_bytes
};
PlanPreview preview_plan(const ModelConfig& config, const EngineOptions& options);

class Engine {
 public:
  // Loads a Hugging Face checkpoint directory (config.json + safetensors) straight into the
  // kernels' packed GPU layouts. Throws deepfuse::Error naming the file or tensor on bad input.
  static Engine from_checkpoint(const std::filesystem::path& model_dir, const EngineOptions& options,
                                const LoadProgress& progress = {});
  // Real-shaped model with seeded random weights made on the GPU, no files (benchmarks).
  static Engine with_random_weights(const ModelConfig& config, const EngineOptions& options, uint64_t seed);

  ~Engine();
  Engine(Engine&&) noexcept;
  Engine& operator=(Engine&&) noexcept;

  const ModelConfig& config() const;
  const EngineOptions& options() const;
  // Launch counts are those of the graph bucket serving `decode_batch` sequences (0: the largest).
  EngineStats stats(int decode_batch = 0) const;
  // The decode plan in use, and its source; plan_notice(): empty, or one line on why a tuning
  // cache was ignored.
  const DecodePlan& plan() const;
  const std::string& plan_notice() const;
  // The GEMMs timed at construction (EngineOptions::tune_gemms), in the order they were timed.
  const std::vector<GemmTuning>& gemm_tunings() const;

  // Validates (ids in range, prompt + max_new_tokens within max_context, enough KV pages for
  // the prompt in an empty cache) and queues. Throws deepfuse::Error with a one-line reason.
  SequenceId add_sequence(const SequenceRequest& request);
  // Blocks until every decode step launched ahead has run (their tokens still come from the
  // next step() calls): benchmarks that time from an idle GPU.
  void wait_for_launched_steps();
  // Drops a sequence (finished or not) and frees its pages.
  void remove_sequence(SequenceId sequence);
  // Sequences added and not yet finished, queued ones included: step() while this is > 0.
  int running_sequences() const;
  SchedulingStats scheduling_stats() const;
  // Speculative decoding since construction: draft tokens verified, and of those accepted; and
  // decode steps launched ahead (while the step before was in flight), which steps that may
  // verify drafts never are.
  struct SpeculativeCounts {
    uint64_t draft_tokens = 0;
    uint64_t accepted_draft_tokens = 0;
    uint64_t launched_ahead_steps = 0;
  };
  SpeculativeCounts speculative_counts() const;

  // Prefills what the scheduler admits or continues, then one decode step for every running
  // sequence. Finished sequences are reported once and then removed automatically. A sequence
  // prefilled in this step reports its first token (sampled from the prefill) and, unless that
  // finished it, its second from the decode step, in this call, or in the next one when the step
  // read back now was launched ahead before it joined (overlap_steps). With mixed_steps the
  // prompt chunks ride in the launched steps instead, and a sequence's first token comes with the
  // read-back of the step that ended its prompt (with overlap_steps, in the next call). At most
  // max_batch sequences run; the rest wait in the queue (first in, first out). With
  // EngineOptions::speculative a verify step reports a sequence's accepted drafts and one more
  // token, several StepTokens of one sequence in order.
  std::vector<StepToken> step();

  // Teacher forcing, for tests and `score`: runs `ids` through a fresh sequence (prefill of
  // ids[0..prefill_tokens), then one decode step per remaining id) and returns fp32 logits
  // [ids.size(), vocab] for every position. prefill_tokens = ids.size(): prefill only.
  // Needs an engine with no running sequences (queued ones may wait).
  std::vector<float> score(std::span<const int32_t> ids, int prefill_tokens);

  // Teacher-forced decode for several sequences at once (tests of ragged batches): each entry of
  // `sequences` is prefilled with its first prefill_tokens[i] ids, then all are decoded together,
  // one step per remaining id (sequences that ran out of ids sit out); logits per sequence, per
  // position, as score() returns them.
  std::vector<std::vector<float>> score_batch(const std::vector<std::vector<int32_t>>& sequences,
                                              const std::vector<int>& prefill_tokens);

 private:
  friend class runtime::EngineBench;  // benchmark-only entry points (src/runtime/engine_bench.hpp)
  friend class runtime::EngineTuning;  // the profiler's entry points (src/runtime/engine_tuning.hpp)
  friend PlanPreview preview_plan(const ModelConfig& config, const EngineOptions& options);
  friend class runtime::RankGroup;
  struct Impl;
  explicit Engine(std::unique_ptr<runtime::RankGroup> ranks);
  std::unique_ptr<runtime::RankGroup> ranks_;  // one Impl per GPU (rank 0 leads)
};

// The presets --random-weights --arch accepts: llama3-8b, llama3.2-1b, qwen2.5-7b, mistral-7b,
// llama3-70b (full size; more weights than one GPU holds is reported as an error by the engine).
std::vector<std::string> random_arch_names();
ModelConfig random_arch_config(const std::string& name);

}  // namespace deepfuse
