// The ops of one forward pass, in launch order. Three passes share one per-layer op list:
//   decode step   one token for each of `batch` sequences (a batch bucket; padded entries have
//                 id -1, position -1, length 0), paged split-KV decode attention, then final norm,
//                 lm_head to fp32 logits and GPU sampling straight into the ids buffer;
//   prefill chunk `tokens` consecutive prompt tokens of one sequence, causal prefill attention;
//                 the caller then asks for logits of the rows it needs (the last one to sample the
//                 first token, or all of them for score());
//   mixed step    prompt chunks of several sequences and a decode step's entries after them in the
//                 same GEMMs, prefill attention per chunk and decode attention for the entries, then
//                 sampled as a decode step (forward_mixed.cpp).
// Per layer (residual stream bf16 [tokens, H], updated in place):
//   1 rms_norm(residual; input_norm)                   -> normed
//   2 GEMM normed · Wqkv^T                             -> qkv [tokens, q | k | v]
//   3 rope_kv_append (qkv bias, RoPE, K/V into pages)  -> q_rot, KV cache
//   4 decode or prefill attention                      -> attention_out
//   5 GEMM attention_out · Wo^T + o_bias + residual    -> residual (bias in cuBLASLt's epilogue)
//   6 rms_norm(residual; post_attention_norm)          -> MLP input
//   7 SwiGLU MLP + residual                            -> residual
// The decode plan (deepfuse/decode_plan.hpp) picks, per batch bucket, whether 1-3 run as one
// fused kernel (deepfuse/kernels/qkv_rope_fused.hpp), 6-7 as the fused MLP (the norm folded in),
// and 5 as one cluster GEMV launch (deepfuse/kernels/gemv_residual.hpp): four launches per layer
// with single-launch attention. Otherwise o_proj is cuBLASLt, which at small batch adds a
// split-K reduction kernel. Norms 1 and 6 are folded into the row-major weights after them
// (GpuWeights, folded_norm.hpp): 1/rms is applied by rope_kv_append and by the unfused MLP's
// silu_and_mul, so neither is a launch. Prefill chunks run cuBLASLt's projections and the plan's
// prefill MLP.
// Nothing here allocates or synchronises: a decode step is captured into a CUDA graph as is.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>
#include <vector>

#include "deepfuse/decode_plan.hpp"
#include "deepfuse/gemm_tuning.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/token_bitmask.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/cublaslt_gemm.hpp"
#include "deepfuse/kernels/sampling.hpp"
#include "deepfuse/kernels/token_penalties.hpp"
#include "runtime/fp8_projection.hpp"
#include "runtime/gpu_weights.hpp"
#include "runtime/kv_cache.hpp"
#include "runtime/rank_link.hpp"

namespace deepfuse::runtime {

// Every device buffer a pass reads or writes, allocated once at engine start, so a captured
// decode step replays against the same addresses with new contents.
struct StepBuffers {
  // `shard`: a tensor-parallel rank's, whose lm_head yields its vocabulary slice, gathered from
  // every rank into `logits` (one GPU: the default, logits straight from lm_head).
  StepBuffers(const ModelConfig& config, int max_tokens, int max_batch, int logits_rows,
              size_t attention_workspace_bytes, cudaStream_t stream, const dist::RankShard& shard = {},
              WeightFormat linear_format = WeightFormat::bf16);

  int max_tokens;   // rows of the activation buffers: max(prefill_chunk, max_batch)
  int max_batch;    // decode entries (= block-table rows)
  int logits_rows;  // rows of fp32 logits one lm_head call may produce
  int vocab;

  DeviceBuffer residual, normed;  // bf16 [max_tokens, H]
  DeviceBuffer qkv;               // bf16 [max_tokens, q_size + 2 kv_size]
  DeviceBuffer q_rot;             // bf16 [max_tokens, q_size]
  DeviceBuffer attention_out;     // bf16 [max_tokens, q_size]
  DeviceBuffer logits;            // fp32 [logits_rows, vocab]
  // FP8 weights (linear_format): the attention projection a GEMM reads (qkv or
  // o_proj), widened to bf16 first (kernels/dequantize.hpp); empty for bf16 weights.
  DeviceBuffer widened;
  // fp8_e4m3 weights: the attention projections' inputs quantized per token for FP8 GEMMs
  // (GemmChoice::fp8), up to [max_tokens, max(H, q_size)]; else empty.
  E4m3Activations e4m3;
  DeviceBuffer logits_slice;      // tensor parallel: fp32 [logits_rows, vocab_rows], this rank's lm_head
  DeviceBuffer logits_gathered;   // tensor parallel: fp32 [ranks, logits_rows, vocab_rows], every rank's
  DeviceBuffer decode_inputs;     // int32 [3, max_batch]: ids | positions | seq_lens (upload_decode_inputs order)
  DeviceBuffer decode_rows;       // int32 [max_batch] = 0, 1, ...: decode entry i is block-table row i
  // int32 [3, max_tokens]: ids | positions | block-table rows, then int32 [max_batch]: a mixed
  // step's draws (step_draws)
  DeviceBuffer prefill_inputs;
  DeviceBuffer sampling_slots;    // kernels::SamplingSlot [max_batch], entry i belongs to row i
  DeviceBuffer penalty_slots;     // kernels::PenaltySlot [max_batch], entry i belongs to row i
  // int32 [max_batch, vocab]: how often row i's sequence generated each id, kept only for rows
  // with penalties. On the rank that samples (rank 0 under tensor parallelism); elsewhere empty.
  DeviceBuffer penalty_counts;
  // uint32 [max_batch, token_bitmask_words(vocab)]: row i's allowed ids (deepfuse/token_bitmask.hpp)
  // for a step whose sampler applies masks (some row constrained; the others' rows all ones),
  // uploaded before it. On the rank that samples; elsewhere empty.
  DeviceBuffer token_masks;
  DeviceBuffer sampling_workspace;
  DeviceBuffer attention_workspace;  // decode attention partials, zeroed once

  int32_t* decode_ids() const { return decode_inputs.as<int32_t>(); }
  int32_t* decode_positions() const { return decode_inputs.as<int32_t>() + max_batch; }
  int32_t* decode_seq_lens() const { return decode_inputs.as<int32_t>() + 2 * max_batch; }
  int32_t* prefill_ids() const { return prefill_inputs.as<int32_t>(); }
  int32_t* prefill_positions() const { return prefill_inputs.as<int32_t>() + max_tokens; }
  int32_t* prefill_rows() const { return prefill_inputs.as<int32_t>() + 2 * max_tokens; }
  // A mixed step's sampler advances the draw index of rows >= 0 here: the rows it feeds and
  // those its prompt chunks sample into (fed nothing: decode_ids holds -1 there, which the
  // penalties count as no token).
  int32_t* step_draws() const { return prefill_inputs.as<int32_t>() + 3 * max_tokens; }
  kernels::SamplingSlot* slots() const { return sampling_slots.as<kernels::SamplingSlot>(); }
  kernels::PenaltySlot* penalties() const { return penalty_slots.as<kernels::PenaltySlot>(); }
  int32_t* counts_row(int row) const { return penalty_counts.as<int32_t>() + static_cast<size_t>(row) * vocab; }
  uint32_t* mask_row(int row) const {
    return token_masks.as<uint32_t>() + static_cast<size_t>(row) * token_bitmask_words(vocab);
  }
};

// What a step's sampler applies besides its rows' sampling slots: presence/frequency penalties
// (some row has them) and token bitmasks (some row is constrained: StepBuffers::token_masks).
// Each combination is its own graph variant, so a step without them never launches their work.
// A decode or mixed step with token masks ends at its logits, without the sampler: a constrained
// row's mask needs the token of the step before, which the host reads back while this step's
// forward pass runs, and the caller then launches sample() itself.
struct SamplerExtras {
  bool penalties = false;
  bool token_masks = false;
};

// A prompt chunk inside a mixed step: `tokens` prompt tokens of the sequence on block-table row
// `row`, from position `start`, at token `offset` of the step's inputs. `samples`: its last
// token's logits give the sequence's next token, sampled into decode entry `row`.
struct StepChunk {
  int row = 0;
  int start = 0;
  int tokens = 0;
  int offset = 0;
  bool samples = false;
};

// A speculative verify step (forward_verify.cpp): `sequences` (a batch bucket; block-table rows
// 0..sequences-1) of `rows` entries each, entry s * rows + j feeding sequence s's token (j = 0) or
// its draft j at its position + j (padded entries: id -1, position -1, length 0). Device arrays of
// sequences * rows entries unless said otherwise.
struct VerifyPass {
  int sequences = 0;
  int rows = 0;                          // 1 + the most drafts a sequence feeds, <= kSpeculativeMaxRows
  const int32_t* ids = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* seq_lens = nullptr;     // position + 1: the causal mask among a sequence's entries
  const int32_t* block_rows = nullptr;   // the entry's sequence's block-table row
  kernels::SamplingSlot* slots = nullptr;  // entry (s, j): s's sampling with draw index generated + j
  int32_t* chosen = nullptr;             // the token each entry samples
  const int32_t* drafts = nullptr;       // [sequences, rows - 1]
  const int32_t* draft_counts = nullptr; // [sequences]
  int32_t* emitted = nullptr;            // [sequences, rows]: speculative_accept's (mapped host memory)
  int32_t* emitted_counts = nullptr;     // [sequences]
  void* sampling_workspace = nullptr;    // kernels::sampling_workspace_bytes(sequences * rows, vocab)
  void* attention_workspace = nullptr;   // the attention plan's, zeroed once
};

class ForwardPass {
 public:
  // `plan` (the engine's, outliving this) says which variant each op runs, per decode bucket and
  // for prefill chunks; the weights hold the layouts it names.
  // `link`: a tensor-parallel rank's (null: one GPU), outliving this. `config` is the rank's model.
  ForwardPass(const ModelConfig& config, const GpuWeights& weights, const KvCache& kv, const StepBuffers& buffers,
              kernels::CublasLtGemm& gemm, const DecodePlan& plan, const RankLink* link = nullptr);

  // A decode step for plan.batch entries read from buffers.decode_inputs; ends with their
  // logits in rows 0..batch-1 and the sampled ids in decode_ids and in `host_sampled` (the
  // device's view of mapped pinned host memory, [batch]); sampling slots advanced.
  // The ops run the variants `bucket` names (the step's bucket of the plan). `extras.penalties`:
  // some entry has presence/frequency penalties, applied to the logits (in place) before
  // sampling, each entry's fed id counted first; `extras.token_masks`: the step stops at the
  // logits (SamplerExtras), for sample(0, batch, stream, host_sampled, extras, Source::decode_step).
  void decode_step(const BucketPlan& bucket, const kernels::DecodeAttentionPlan& plan, int32_t* host_sampled,
                   SamplerExtras extras, cudaStream_t stream);

  // A verify step (VerifyPass), eager: every entry through the layers (the ops of `bucket`, a plan
  // bucket of at least sequences x rows tokens, or null: the prefill choices), decode attention
  // under `plan` (batch sequences x rows) reading each entry's block-table row, lm_head and the
  // sampler over every entry, then speculative_accept into pass.emitted. Penalties, logprobs and
  // bitmasks are not applied: the engine verifies no sequence that has them.
  void verify_step(const VerifyPass& pass, const kernels::DecodeAttentionPlan& plan, const BucketPlan* bucket,
                   cudaStream_t stream);

  // Tokens [start, start + tokens) of the sequence on block-table row `row`, inputs in
  // buffers.prefill_inputs: their keys and values go to the cache, their final hidden states
  // stay in residual rows 0..tokens-1.
  void prefill_chunk(int row, int start, int tokens, cudaStream_t stream);

  // A mixed step, eager: the chunks' tokens (offsets 0, 1st chunk's tokens, ...) then plan.batch
  // decode entries, inputs in buffers.prefill_inputs (ids | positions | block-table rows: the
  // entries' are rows 0..batch-1) and their lengths in decode_seq_lens. Every token goes through
  // cuBLASLt's projections and the prefill MLP, each chunk through prefill attention and the
  // entries through decode attention (`decode` false: no entry is fed, none runs). Then rows
  // 0..batch-1 are sampled as decode_step samples them (with token masks: left to the caller, as
  // Source::mixed_step), a sampling chunk's last token standing in its row; step_draws says which
  // rows draw, penalties count decode_ids.
  void mixed_step(const kernels::DecodeAttentionPlan& plan, bool decode, std::span<const StepChunk> chunks,
                  int32_t* host_sampled, SamplerExtras extras, cudaStream_t stream);

  // Final RMSNorm of residual rows [first_row, first_row + rows) -> normed rows 0..rows-1.
  void final_norm(int first_row, int rows, cudaStream_t stream);
  // lm_head of normed rows [first_row, first_row + rows) -> fp32 logits rows 0..rows-1 (tensor
  // parallel: each rank's vocabulary slice, gathered; the whole rows on rank 0 only).
  void lm_head(int first_row, int rows, cudaStream_t stream);
  // What sample() samples: a prompt's first token, or a decode step, whose entries were fed
  // decode_ids (the tokens they generated last; -1 where an entry sat the step out). A decode
  // step's penalties first count the fed ids, and an entry that sat out keeps its draw index. A
  // mixed step's penalties count the fed ids too, and its entries draw as step_draws says.
  enum class Source { prompt, decode_step, mixed_step };
  // Samples logits rows 0..batch-1 with the slots of entries first_entry.. and writes the ids
  // into decode_ids[first_entry..] (and into host_ids[0..batch-1] when given: mapped pinned memory),
  // after the presence/frequency penalties of the entries' PenaltySlots when extras.penalties,
  // and leaving out the ids their token_masks rows clear when extras.token_masks.
  // Tensor parallel: rank 0 penalizes, samples and broadcasts the ids, so every rank feeds the
  // same tokens.
  void sample(int first_entry, int batch, cudaStream_t stream, int32_t* host_ids, SamplerExtras extras, Source source);

  // Times cuBLASLt's candidate algorithms for every GEMM the decode steps of these batch buckets
  // run through cuBLASLt (per bucket: lm_head, and where the fused kernels do not serve it the
  // QKV projection, o_proj and the unfused MLP) and keeps the fastest. Scribbles on the step's
  // buffers: only while no sequence runs (engine setup). Synchronises the stream.
  std::vector<GemmTuning> tune_decode_gemms(cudaStream_t stream);

  // Tensor parallel: the all-reduce that sums every rank's partial[slot] (link) of `tokens` rows
  // into the residual stream; a one-shot `choice` falls back to NCCL beyond the peer buffers.
  void all_reduce(int slot, int tokens, AllReduceChoice choice, cudaStream_t stream);

  // Tensor parallel: one eager call of each collective the steps run, at the smallest and largest
  // size, so NCCL connects its peers before any is captured into a graph (it cannot while a
  // stream captures). Every rank must call it together; scribbles on the step's buffers.
  void connect_collectives(cudaStream_t stream);

  // Kernel launches (cuBLASLt GEMMs count one each) of one layer and of a whole decode step;
  // decode_batch 0 means a prefill chunk.
  int launches_per_layer(int attention_launches, const BucketPlan& bucket) const;
  int launches_per_decode_step(const BucketPlan& bucket, const kernels::DecodeAttentionPlan& plan) const;

 private:
  // Zeroes the merge counters `plan` reads in the shared attention workspace, once per step: a
  // step of another bucket's plan may have left its partials there (decode_attention.hpp).
  void clear_attention_counters(const kernels::DecodeAttentionPlan& plan, cudaStream_t stream);
  // The variants one pass runs.
  struct Choices {
    MlpChoice mlp;
    FrontChoice front;
    OProjChoice o_proj;
    GemmChoice gemm;
    AllReduceChoice all_reduce = AllReduceChoice::nccl;
  };
  static Choices choices_of(const BucketPlan& bucket) {
    return {bucket.mlp, bucket.front, bucket.o_proj, bucket.gemm, bucket.all_reduce};
  }
  // Prefill chunks and mixed steps: hundreds of tokens, cuBLASLt's projections and the plan's prefill MLP.
  Choices prefill_choices() const {
    return {plan_.prefill_mlp, FrontChoice::unfused, OProjChoice::cublaslt, plan_.prefill_gemm, AllReduceChoice::nccl};
  }
  // A pass's choices and its attention: decode attention for the entries from token
  // decode_offset on (decode_plan set), prefill attention for each chunk.
  struct Attention {
    Choices choices;
    const kernels::DecodeAttentionPlan* decode_plan = nullptr;
    int decode_offset = 0;
    std::span<const StepChunk> chunks;
    // Decode attention's lengths, block-table rows and workspace (null: a decode step's
    // decode_seq_lens, entry i on row i, the step buffers' workspace); a verify step's own.
    const int32_t* seq_lens = nullptr;
    const int32_t* sequences = nullptr;
    void* workspace = nullptr;
    // Keys per query this pass's QKV kernel appends (DecodeAttentionParams::appended_keys): a
    // verify step's rows, else 1.
    int appended_keys = 1;
  };
  void embed(const int32_t* ids, int tokens, cudaStream_t stream);
  // One transformer block. pending: the previous block's MLP sum not yet in the residual stream
  // (null: none); returns this block's, or null when its MLP wrote the stream itself.
  float* layer(int index, int tokens, const int32_t* positions, const int32_t* rows, const Attention& attention,
               float* pending, cudaStream_t stream);
  void fused_qkv(const GpuLayerWeights& w, int tokens, const int32_t* positions, const int32_t* rows,
                 const kernels::PagedKv& kv, const float* pending, cudaStream_t stream);
  void unfused_qkv(const GpuLayerWeights& w, int tokens, const int32_t* positions, const int32_t* rows,
                   const kernels::PagedKv& kv, GemmChoice gemm, cudaStream_t stream);
  // gemv: the cluster GEMV, which adds and clears `pending`; else cuBLASLt (its GEMM per `gemm`).
  void output_projection(const GpuLayerWeights& w, int tokens, bool gemv, GemmChoice gemm, float* pending,
                         cudaStream_t stream);
  // y = x·w^T (+ bias) (+ addend) for an attention projection in cuBLASLt: bf16 (FP8 weights
  // widened first), or on FP8 tensor cores with x quantized per token (GemmChoice::fp8).
  void project(const __nv_bfloat16* x, const LinearWeight& weight, const __nv_bfloat16* bias,
               const __nv_bfloat16* addend, __nv_bfloat16* y, int tokens, GemmChoice gemm, const char* who,
               cudaStream_t stream);
  // Tensor parallel: which sums over the ranks the MLP does itself (the value: how many): its output
  // in its finish (epilogue), its input too at its start (in_mlp), or none. Only the fused MLP, with
  // peer buffers that hold a message of `tokens` rows (sums_in_mlp).
  enum class MlpSums { none = 0, output = 1, input_and_output = 2 };
  MlpSums mlp_sums_over_ranks(MlpChoice mlp, AllReduceChoice all_reduce, int tokens) const;
  kernels::LineExchange line_exchange(int slot, int tokens) const;
  void attend(const kernels::PagedKv& kv, int tokens, const Attention& attention, cudaStream_t stream);
  const __nv_bfloat16* gemm_weights(const LinearWeight& weight, const char* who, cudaStream_t stream);
  void rms_norm(const __nv_bfloat16* weight, int first_row, int rows, cudaStream_t stream);
  void sample_here(int first_entry, int batch, cudaStream_t stream, int32_t* host_ids, SamplerExtras extras,
                   Source source);
  // Tensor parallel: whether this rank samples and adds the residual.
  bool split() const { return link_ != nullptr; }
  bool rank_zero() const { return !link_ || link_->shard.rank == 0; }
  int lm_head_rows() const { return split() ? link_->shard.vocab_rows : config_.vocab_size; }
  LinearWeight lm_head_weight() const { return weights_.lm_head(lm_head_rows(), config_.hidden_size); }

  const ModelConfig& config_;
  const GpuWeights& weights_;
  const KvCache& kv_;
  const StepBuffers& buffers_;
  kernels::CublasLtGemm& gemm_;
  const DecodePlan& plan_;
  const RankLink* link_;
  float attention_scale_;
};

}  // namespace deepfuse::runtime
