#include "runtime/forward.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/prefill_attention.hpp"
#include "deepfuse/kernels/dequantize.hpp"
#include "deepfuse/kernels/embedding.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/rms_norm.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "deepfuse/kernels/rope_kv_append.hpp"
#include "deepfuse/kernels/one_shot_all_reduce.hpp"
#include "dist/nccl_group.hpp"

namespace deepfuse::runtime {

namespace {

size_t bf16_bytes(size_t elements) { return elements * sizeof(__nv_bfloat16); }

// Launchers may legitimately need no workspace; a small allocation keeps the pointer non-null.
constexpr size_t kMinWorkspaceBytes = 256;

}  // namespace

StepBuffers::StepBuffers(const ModelConfig& c, int max_tokens_in, int max_batch_in, int logits_rows_in,
                         size_t attention_workspace_bytes, cudaStream_t stream, const dist::RankShard& shard,
                         WeightFormat linear_format)
    : max_tokens(max_tokens_in),
      max_batch(max_batch_in),
      logits_rows(logits_rows_in),
      vocab(c.vocab_size),
      residual(bf16_bytes(static_cast<size_t>(max_tokens) * c.hidden_size)),
      normed(bf16_bytes(static_cast<size_t>(max_tokens) * c.hidden_size)),
      qkv(bf16_bytes(static_cast<size_t>(max_tokens) * (c.q_size() + 2 * c.kv_size()))),
      q_rot(bf16_bytes(static_cast<size_t>(max_tokens) * c.q_size())),
      attention_out(bf16_bytes(static_cast<size_t>(max_tokens) * c.q_size())),
      logits(static_cast<size_t>(logits_rows) * c.vocab_size * sizeof(float)),
      // qkv's [q_size + 2 kv_size, H] holds o_proj's [H, q_size] too
      widened(linear_format == WeightFormat::bf16
                  ? 0
                  : bf16_bytes(static_cast<size_t>(c.hidden_size) * (c.q_size() + 2 * c.kv_size()))),
      e4m3(linear_format == WeightFormat::fp8_e4m3
               ? E4m3Activations(static_cast<size_t>(max_tokens), static_cast<size_t>(std::max(c.hidden_size, c.q_size())))
               : E4m3Activations()),
      logits_slice(shard.split() ? static_cast<size_t>(logits_rows) * shard.vocab_rows * sizeof(float) : 0),
      logits_gathered(shard.split() ? logits_slice.bytes() * shard.ranks : 0),
      decode_inputs(3 * static_cast<size_t>(max_batch) * sizeof(int32_t)),
      decode_rows(static_cast<size_t>(max_batch) * sizeof(int32_t)),
      prefill_inputs((3 * static_cast<size_t>(max_tokens) + max_batch) * sizeof(int32_t)),
      sampling_slots(static_cast<size_t>(max_batch) * sizeof(kernels::SamplingSlot)),
      penalty_slots(static_cast<size_t>(max_batch) * sizeof(kernels::PenaltySlot)),
      penalty_counts(shard.rank == 0 ? static_cast<size_t>(max_batch) * c.vocab_size * sizeof(int32_t) : 0),
      token_masks(shard.rank == 0 ? static_cast<size_t>(max_batch) * token_bitmask_words(c.vocab_size) * sizeof(uint32_t)
                                  : 0),
      sampling_workspace(std::max({kernels::sampling_workspace_bytes(max_batch, c.vocab_size),
                                   kernels::sampling_workspace_bytes(1, c.vocab_size), kMinWorkspaceBytes})),
      attention_workspace(std::max(attention_workspace_bytes, kMinWorkspaceBytes)) {
  attention_workspace.zero(stream);  // the decode attention kernel expects zero counters on first use
  sampling_slots.zero(stream);       // all-zero slots: greedy, valid for padded entries
  penalty_slots.zero(stream);        // and no penalties
  decode_inputs.zero(stream);
  std::vector<int32_t> rows(max_batch);
  std::iota(rows.begin(), rows.end(), 0);
  decode_rows.upload(rows.data(), rows.size() * sizeof(int32_t));
}

ForwardPass::ForwardPass(const ModelConfig& config, const GpuWeights& weights, const KvCache& kv,
                         const StepBuffers& buffers, kernels::CublasLtGemm& gemm, const DecodePlan& plan,
                         const RankLink* link)
    : config_(config),
      weights_(weights),
      kv_(kv),
      buffers_(buffers),
      gemm_(gemm),
      plan_(plan),
      link_(link && link->shard.split() ? link : nullptr),
      attention_scale_(1.0f / std::sqrt(static_cast<float>(config.head_dim))) {}

void ForwardPass::embed(const int32_t* ids, int tokens, cudaStream_t stream) {
  kernels::EmbeddingParams p;
  p.table = weights_.embedding();
  p.ids = ids;
  p.out = buffers_.residual.as<__nv_bfloat16>();
  p.vocab = config_.vocab_size;
  p.hidden = config_.hidden_size;
  p.tokens = tokens;
  DF_CHECK_CUDA(kernels::launch_embedding(p, stream));
}

void ForwardPass::rms_norm(const __nv_bfloat16* weight, int first_row, int rows, cudaStream_t stream) {
  kernels::RmsNormParams p;
  p.residual = buffers_.residual.as<__nv_bfloat16>() + static_cast<size_t>(first_row) * config_.hidden_size;
  p.weight = weight;
  p.out = buffers_.normed.as<__nv_bfloat16>();
  p.rows = rows;
  p.hidden = config_.hidden_size;
  p.eps = static_cast<float>(config_.rms_norm_eps);
  DF_CHECK_CUDA(kernels::launch_rms_norm(p, stream));
}

float* ForwardPass::layer(int index, int tokens, const int32_t* positions, const int32_t* rows,
                          const Attention& attention, float* pending, cudaStream_t stream) {
  const GpuLayerWeights& w = weights_.layers[index];
  const Choices& c = attention.choices;
  // The MLP sum may skip the residual stream only when the two kernels that read the stream
  // before the next MLP can take it: the fused QKV (x + sum) and the o_proj GEMV (residual + sum,
  // which also clears it); the last block's MLP feeds the final norm and writes the stream itself.
  // It defers whenever they can: faster at every such batch (docs/kernels/swiglu_fused.md, "The
  // sum left for the next block at batch 1"). Only the fused MLP can leave its sum.
  const bool reads_pending = c.o_proj == OProjChoice::gemv;
  // Tensor parallel: every sum goes through the all-reduce, never left pending.
  const bool defers_sum =
      !split() && reads_pending && c.mlp == MlpChoice::fused && index + 1 < config_.num_hidden_layers;
  DF_CHECK(!pending || reads_pending, "a deferred MLP sum reached a block that cannot add it");
  auto* residual = buffers_.residual.as<__nv_bfloat16>();
  const kernels::PagedKv kv = kv_.layer(index);

  // 1-4. input RMSNorm, QKV (+bias), RoPE and the KV append; then attention.
  if (c.front == FrontChoice::fused)
    fused_qkv(w, tokens, positions, rows, kv, pending, stream);
  else
    unfused_qkv(w, tokens, positions, rows, kv, c.gemm, stream);
  attend(kv, tokens, attention, stream);
  // 5. output projection, added into the residual stream in place (tensor parallel: each rank's
  // partial sum, rank 0's with the residual, summed over the ranks into the stream).
  output_projection(w, tokens, c.o_proj == OProjChoice::gemv, c.gemm, pending, stream);
  const MlpSums mlp_sums = mlp_sums_over_ranks(c.mlp, c.all_reduce, tokens);
  if (split() && mlp_sums != MlpSums::input_and_output) all_reduce(0, tokens, c.all_reduce, stream);
  // 6-7. post-attention RMSNorm and the SwiGLU MLP, added into the residual stream in place (both
  // variants fold the norm in), or left for the next block's kernels; tensor parallel, summed over
  // the ranks by the fused MLP's finishing blocks (and its input by its first) or an all-reduce
  // after it.
  MlpLayer& mlp = w.mlp(c.mlp);
  if (defers_sum) return mlp.run_deferred(residual, tokens, stream);
  if (split()) {
    const __nv_bfloat16* addend = rank_zero() ? residual : nullptr;
    if (mlp_sums == MlpSums::input_and_output) {
      mlp.run_summed_exchanged(link_->partial[0], line_exchange(0, tokens), residual, addend, residual, tokens,
                               line_exchange(1, tokens), stream);
      return nullptr;
    }
    if (mlp_sums == MlpSums::output) {
      mlp.run_exchanged(residual, addend, residual, tokens, line_exchange(1, tokens), stream);
      return nullptr;
    }
    mlp.run(residual, addend, link_->partial[1], tokens, stream, choice_row(c.gemm).mlp_gemms);
    all_reduce(1, tokens, c.all_reduce, stream);
    return nullptr;
  }
  mlp.run(residual, residual, residual, tokens, stream, choice_row(c.gemm).mlp_gemms);
  return nullptr;
}

// The decode step's front half in one launch: input RMSNorm, QKV (+bias), RoPE and the KV append,
// reading the residual stream plus the previous block's pending MLP sum when there is one.
void ForwardPass::fused_qkv(const GpuLayerWeights& w, int tokens, const int32_t* positions, const int32_t* rows,
                            const kernels::PagedKv& kv, const float* pending, cudaStream_t stream) {
  kernels::QkvRopeFusedParams p;
  p.x = buffers_.residual.as<__nv_bfloat16>();
  p.norm_weight = w.vector(TensorGroup::input_norm);
  p.norm_eps = static_cast<float>(config_.rms_norm_eps);
  const LinearWeight qkv = w.linear(TensorGroup::qkv, WeightLayout::fragments, config_);
  p.weights = qkv.tiles("the fused QKV front");
  p.format = qkv.format;
  p.scales = qkv.scales;
  p.bias = w.vector(TensorGroup::qkv_bias);
  p.inv_freq = weights_.rope_inv_freq.as<float>();
  p.positions = positions;
  p.sequences = rows;
  p.q_out = buffers_.q_rot.as<__nv_bfloat16>();
  p.kv = kv;
  p.tokens = tokens;
  p.hidden = config_.hidden_size;
  p.q_heads = config_.num_attention_heads;
  p.pending = pending;
  DF_CHECK_CUDA(kernels::launch_qkv_rope_fused(p, stream));
}

// o_proj (+ Llama's o_proj bias) added into the residual stream in place: the cluster GEMV in
// small decode steps (one launch, which also adds and clears a pending MLP sum; cuBLASLt's small-M
// choice is a split-K GEMM plus a reduction kernel), cuBLASLt otherwise.
void ForwardPass::output_projection(const GpuLayerWeights& w, int tokens, bool gemv, GemmChoice gemm, float* pending,
                                    cudaStream_t stream) {
  auto* residual = buffers_.residual.as<__nv_bfloat16>();
  const auto* attention_out = buffers_.attention_out.as<__nv_bfloat16>();
  // Tensor parallel: rank 0's partial carries the residual and the bias, the others' only their
  // heads' share, so the all-reduce's sum is the one-GPU result.
  const auto* o_bias = rank_zero() ? w.vector(TensorGroup::o_bias) : nullptr;
  const __nv_bfloat16* addend = rank_zero() ? residual : nullptr;
  __nv_bfloat16* y = split() ? link_->partial[0] : residual;
  const int hidden = config_.hidden_size, q_size = config_.q_size();
  if (!gemv) {
    project(attention_out, w.linear(TensorGroup::o_proj, WeightLayout::row_major, config_), o_bias, addend, y, tokens,
            gemm, "the o_proj GEMM", stream);
    return;
  }
  kernels::GemvResidualParams p;
  p.x = attention_out;
  const LinearWeight o_proj = w.linear(TensorGroup::o_proj, WeightLayout::fragments, config_);
  p.weights = o_proj.tiles("the o_proj GEMV");
  p.format = o_proj.format;
  p.scales = o_proj.scales;
  p.bias = o_bias;
  p.residual = addend;
  p.y = y;
  p.tokens = tokens;
  p.rows = hidden;
  p.inner = q_size;
  p.pending = pending;  // added to the residual, then zero for that MLP's next call
  DF_CHECK_CUDA(kernels::launch_gemv_residual(p, stream));
}

ForwardPass::MlpSums ForwardPass::mlp_sums_over_ranks(MlpChoice mlp, AllReduceChoice all_reduce, int tokens) const {
  const bool exchanges = split() && link_->one_shot &&
                         static_cast<size_t>(tokens) * config_.hidden_size <= link_->one_shot->exchange_elements();
  return exchanges ? static_cast<MlpSums>(sums_in_mlp(mlp, all_reduce)) : MlpSums::none;
}

kernels::LineExchange ForwardPass::line_exchange(int slot, int tokens) const {
  return link_->one_shot->line_exchange(link_->shard.rank, slot, static_cast<size_t>(tokens) * config_.hidden_size);
}

void ForwardPass::all_reduce(int slot, int tokens, AllReduceChoice choice, cudaStream_t stream) {
  const size_t elements = static_cast<size_t>(tokens) * config_.hidden_size;
  auto* residual = buffers_.residual.as<__nv_bfloat16>();
  // The choice's one-shot protocol (epilogue and in_mlp: of the sums the fused MLP does not do).
  const std::optional<kernels::OneShotProtocol> protocol = choice_row(choice).protocol;
  if (protocol && link_->one_shot && elements <= link_->one_shot->exchange_elements()) {
    kernels::OneShotAllReduceParams p = link_->one_shot->params(link_->shard.rank, slot, elements, residual);
    p.protocol = *protocol;
    DF_CHECK_CUDA(kernels::launch_one_shot_all_reduce(p, stream));
    return;
  }
  dist::all_reduce_sum(link_->comm, link_->partial[slot], residual, elements, stream);
}

void ForwardPass::connect_collectives(cudaStream_t stream) {
  if (!split()) return;
  for (int tokens : {1, buffers_.max_tokens}) all_reduce(0, tokens, AllReduceChoice::nccl, stream);
  for (int rows : {1, buffers_.logits_rows})
    dist::all_gather(link_->comm, buffers_.logits_slice.as<float>(), buffers_.logits_gathered.as<float>(),
                     static_cast<size_t>(rows) * link_->shard.vocab_rows, stream);
  dist::broadcast(link_->comm, buffers_.decode_ids(), buffers_.decode_ids(), 1, 0, stream);
  DF_CHECK_CUDA(cudaStreamSynchronize(stream));
}

void ForwardPass::unfused_qkv(const GpuLayerWeights& w, int tokens, const int32_t* positions, const int32_t* rows,
                              const kernels::PagedKv& kv, GemmChoice gemm, cudaStream_t stream) {
  const int hidden = config_.hidden_size;
  const auto* residual = buffers_.residual.as<__nv_bfloat16>();
  // 1-2. merged QKV projection of the raw residual stream: the input RMSNorm's weight is folded
  // into qkv's columns (GpuWeights), and rope_kv_append applies its 1/rms. FP8 weights fold no
  // norm: the rows are normalised first, and the GEMM reads the widened weights (or, with
  // GemmChoice::fp8, the normalised rows quantized per token on FP8 tensor cores).
  const LinearWeight qkv = w.linear(TensorGroup::qkv, WeightLayout::row_major, config_);
  const bool folded = format_info(qkv.format).folds_norm;
  if (!folded) rms_norm(w.vector(TensorGroup::input_norm), 0, tokens, stream);
  project(folded ? residual : buffers_.normed.as<__nv_bfloat16>(), qkv, nullptr, nullptr, buffers_.qkv.as<__nv_bfloat16>(),
          tokens, gemm, "the QKV GEMM", stream);

  // 3. 1/rms (folded norms), bias, RoPE, and the keys and values appended to the cache
  kernels::RopeKvAppendParams rope;
  if (folded) rope.input_norm = {residual, hidden, static_cast<float>(config_.rms_norm_eps)};
  rope.qkv = buffers_.qkv.as<__nv_bfloat16>();
  rope.qkv_bias = w.vector(TensorGroup::qkv_bias);
  rope.inv_freq = weights_.rope_inv_freq.as<float>();
  rope.positions = positions;
  rope.sequences = rows;
  rope.q_out = buffers_.q_rot.as<__nv_bfloat16>();
  rope.kv = kv;
  rope.tokens = tokens;
  rope.q_heads = config_.num_attention_heads;
  DF_CHECK_CUDA(kernels::launch_rope_kv_append(rope, stream));
}

void ForwardPass::project(const __nv_bfloat16* x, const LinearWeight& weight, const __nv_bfloat16* bias,
                          const __nv_bfloat16* addend, __nv_bfloat16* y, int tokens, GemmChoice gemm, const char* who,
                          cudaStream_t stream) {
  if (gemm == GemmChoice::bf16 || weight.format == WeightFormat::bf16) {
    gemm_.run_with_bias(x, gemm_weights(weight, who, stream), bias, addend, y, tokens, weight.rows, weight.columns,
                        stream);
    return;
  }
  buffers_.e4m3.project(gemm_, x, weight, bias, addend, y, tokens, who, stream);
}

// A GEMM's weights: bf16 as stored, or FP8 widened into the step's buffer first (one projection at
// a time: stream order keeps the next widening after this GEMM).
const __nv_bfloat16* ForwardPass::gemm_weights(const LinearWeight& weight, const char* who, cudaStream_t stream) {
  if (weight.format == WeightFormat::bf16) return weight.bf16(who);
  DF_CHECK(buffers_.widened.bytes() >= static_cast<size_t>(weight.rows) * weight.columns * sizeof(__nv_bfloat16),
           std::string(who) + ": no widening buffer for " + weight_format_name(weight.format) + " weights");
  auto* widened = buffers_.widened.as<__nv_bfloat16>();
  DF_CHECK_CUDA(kernels::launch_dequantize_to_bf16(weight, widened, stream));
  return widened;
}

void ForwardPass::attend(const kernels::PagedKv& kv, int tokens, const Attention& attention, cudaStream_t stream) {
  // 4. attention over the paged cache: rows [offset, ...) of q_rot and attention_out
  const size_t q_size = config_.q_size();
  auto* q = buffers_.q_rot.as<__nv_bfloat16>();
  auto* attention_out = buffers_.attention_out.as<__nv_bfloat16>();
  if (attention.decode_plan) {
    kernels::DecodeAttentionParams p;
    p.q = q + attention.decode_offset * q_size;
    p.out = attention_out + attention.decode_offset * q_size;
    p.kv = kv;
    p.seq_lens = attention.seq_lens ? attention.seq_lens : buffers_.decode_seq_lens();
    p.sequences = attention.sequences;
    p.appended_keys = attention.appended_keys;
    p.workspace = attention.workspace ? attention.workspace : buffers_.attention_workspace.data();
    p.scale = attention_scale_;
    p.sliding_window = config_.sliding_window;
    DF_CHECK_CUDA(kernels::launch_decode_attention(*attention.decode_plan, p, stream));
  }
  for (const StepChunk& chunk : attention.chunks) {
    DF_CHECK(chunk.offset + chunk.tokens <= tokens, "internal: a prompt chunk beyond its pass's tokens");
    kernels::PrefillAttentionParams p;
    p.q = q + chunk.offset * q_size;
    p.out = attention_out + chunk.offset * q_size;
    p.kv = kv;
    p.sequence = chunk.row;
    p.q_start = chunk.start;
    p.q_len = chunk.tokens;
    p.q_heads = config_.num_attention_heads;
    p.scale = attention_scale_;
    p.sliding_window = config_.sliding_window;
    DF_CHECK_CUDA(kernels::launch_prefill_attention(p, stream));
  }
}

void ForwardPass::decode_step(const BucketPlan& bucket, const kernels::DecodeAttentionPlan& plan,
                              int32_t* host_sampled, SamplerExtras extras, cudaStream_t stream) {
  const int batch = plan.batch;
  DF_CHECK(batch >= 1 && batch <= buffers_.max_batch && batch <= buffers_.logits_rows,
           "decode step batch " + std::to_string(batch) + " outside 1.." + std::to_string(buffers_.max_batch));
  DF_CHECK(host_sampled, "a decode step needs a host buffer for its sampled ids");
  embed(buffers_.decode_ids(), batch, stream);
  DF_CHECK(batch <= bucket.batch, "decode step batch " + std::to_string(batch) + " exceeds its bucket's " +
                                      std::to_string(bucket.batch));
  clear_attention_counters(plan, stream);
  const Attention attention{choices_of(bucket), &plan, 0, {}};
  float* pending = nullptr;
  for (int l = 0; l < config_.num_hidden_layers; ++l)
    pending = layer(l, batch, buffers_.decode_positions(), buffers_.decode_rows.as<int32_t>(), attention, pending, stream);
  DF_CHECK(!pending, "the last block's MLP sum must reach the residual stream");
  final_norm(0, batch, stream);
  lm_head(0, batch, stream);
  if (!extras.token_masks) sample(0, batch, stream, host_sampled, extras, Source::decode_step);  // else the caller's
}

void ForwardPass::clear_attention_counters(const kernels::DecodeAttentionPlan& plan, cudaStream_t stream) {
  if (const size_t bytes = kernels::decode_attention_counter_bytes(plan))
    DF_CHECK_CUDA(cudaMemsetAsync(buffers_.attention_workspace.data(), 0, bytes, stream));
}

void ForwardPass::prefill_chunk(int row, int start, int tokens, cudaStream_t stream) {
  DF_CHECK(tokens >= 1 && tokens <= buffers_.max_tokens,
           "prefill chunk of " + std::to_string(tokens) + " tokens outside 1.." + std::to_string(buffers_.max_tokens));
  embed(buffers_.prefill_ids(), tokens, stream);
  const StepChunk chunk{row, start, tokens, 0, false};
  const Attention attention{prefill_choices(), nullptr, 0, std::span(&chunk, 1)};
  for (int l = 0; l < config_.num_hidden_layers; ++l)
    layer(l, tokens, buffers_.prefill_positions(), buffers_.prefill_rows(), attention, nullptr, stream);
}

void ForwardPass::final_norm(int first_row, int rows, cudaStream_t stream) {
  rms_norm(weights_.vector(TensorGroup::final_norm), first_row, rows, stream);
}

void ForwardPass::lm_head(int first_row, int rows, cudaStream_t stream) {
  DF_CHECK(rows >= 1 && rows <= buffers_.logits_rows,
           "lm_head of " + std::to_string(rows) + " rows outside 1.." + std::to_string(buffers_.logits_rows));
  const auto* normed = buffers_.normed.as<__nv_bfloat16>() + static_cast<size_t>(first_row) * config_.hidden_size;
  if (!split()) {
    gemm_.run_fp32_out(normed, lm_head_weight().bf16("the lm_head GEMM"), buffers_.logits.as<float>(), rows,
                       config_.vocab_size, config_.hidden_size, stream);
    return;
  }
  // Each rank's vocabulary slice, gathered rank after rank ([ranks][rows][slice]); rank 0 then
  // lays the slices side by side into whole rows for the sampler and score().
  const dist::RankShard& shard = link_->shard;
  const size_t slice = shard.vocab_rows;
  gemm_.run_fp32_out(normed, lm_head_weight().bf16("the lm_head GEMM"), buffers_.logits_slice.as<float>(), rows,
                     shard.vocab_rows, config_.hidden_size, stream);
  dist::all_gather(link_->comm, buffers_.logits_slice.as<float>(), buffers_.logits_gathered.as<float>(),
                   static_cast<size_t>(rows) * slice, stream);
  if (!rank_zero()) return;
  for (int r = 0; r < shard.ranks; ++r) {
    const size_t first = static_cast<size_t>(r) * slice;
    if (first >= static_cast<size_t>(config_.vocab_size)) break;
    const size_t width = std::min(slice, static_cast<size_t>(config_.vocab_size) - first);
    DF_CHECK_CUDA(cudaMemcpy2DAsync(buffers_.logits.as<float>() + first, config_.vocab_size * sizeof(float),
                                    buffers_.logits_gathered.as<float>() + r * rows * slice, slice * sizeof(float),
                                    width * sizeof(float), rows, cudaMemcpyDeviceToDevice, stream));
  }
}

void ForwardPass::sample(int first_entry, int batch, cudaStream_t stream, int32_t* host_ids, SamplerExtras extras,
                         Source source) {
  if (split()) {
    // Rank 0 samples; every rank then feeds its ids (one sampler: no two draws can differ).
    int32_t* ids = buffers_.decode_ids() + first_entry;
    if (rank_zero()) sample_here(first_entry, batch, stream, host_ids, extras, source);
    dist::broadcast(link_->comm, ids, ids, batch, 0, stream);
    if (!rank_zero() && host_ids)
      DF_CHECK_CUDA(cudaMemcpyAsync(host_ids, ids, batch * sizeof(int32_t), cudaMemcpyDeviceToDevice, stream));
    return;
  }
  sample_here(first_entry, batch, stream, host_ids, extras, source);
}

void ForwardPass::sample_here(int first_entry, int batch, cudaStream_t stream, int32_t* host_ids, SamplerExtras extras,
                              Source source) {
  // Before the sampler overwrites decode_ids with this step's tokens they still hold the fed ones.
  const int32_t* fed_ids = source == Source::prompt ? nullptr : buffers_.decode_ids() + first_entry;
  if (extras.penalties) {
    kernels::TokenPenaltyParams t;
    t.logits = buffers_.logits.as<float>();
    t.counts = buffers_.counts_row(first_entry);
    t.slots = buffers_.penalties() + first_entry;
    t.fed_ids = fed_ids;
    t.batch = batch;
    t.vocab = config_.vocab_size;
    DF_CHECK_CUDA(kernels::launch_token_penalties(t, stream));
  }
  kernels::SamplingParams p;
  p.logits = buffers_.logits.as<float>();
  p.slots = buffers_.slots() + first_entry;
  p.ids = buffers_.decode_ids() + first_entry;
  p.host_ids = host_ids;
  p.fed_ids = source == Source::mixed_step ? buffers_.step_draws() + first_entry : fed_ids;
  p.token_bitmask = extras.token_masks ? buffers_.mask_row(first_entry) : nullptr;  // a fixed address: graphs replay it
  p.workspace = buffers_.sampling_workspace.data();
  p.batch = batch;
  p.vocab = config_.vocab_size;
  DF_CHECK_CUDA(kernels::launch_sampling(p, stream));
}

std::vector<GemmTuning> ForwardPass::tune_decode_gemms(cudaStream_t stream) {
  using Operands = kernels::CublasLtGemm::Operands;
  const int hidden = config_.hidden_size, q_size = config_.q_size();
  const int qkv_width = q_size + 2 * config_.kv_size();
  auto* residual = buffers_.residual.as<__nv_bfloat16>();
  auto* normed = buffers_.normed.as<__nv_bfloat16>();
  // FP8 weights: the attention GEMMs read a widened copy made per call (not tuned yet).
  const bool bf16_weights = weights_.layers.front().format == WeightFormat::bf16;
  const auto qkv = bf16_weights ? weights_.layer_operands(TensorGroup::qkv, config_, "tuning the QKV GEMM")
                                : std::vector<const __nv_bfloat16*>{};
  const auto o_proj = bf16_weights ? weights_.layer_operands(TensorGroup::o_proj, config_, "tuning the o_proj GEMM")
                                   : std::vector<const __nv_bfloat16*>{};
  const auto* o_bias = weights_.layers.front().vector(TensorGroup::o_bias);
  const auto* lm_head = lm_head_weight().bf16("tuning the lm_head GEMM");

  std::vector<GemmTuning> out;
  auto tune = [&](const char* op, const Operands& operands, const auto& weights) {
    out.push_back(gemm_.tune(op, operands, weights, stream));
  };
  // The operands each bucket's decode_step() passes (unfused_qkv, output_projection, the MLP, lm_head).
  for (const BucketPlan& bucket : plan_.buckets) {
    const int m = bucket.batch;
    if (bucket.front == FrontChoice::unfused && bf16_weights)
      tune("qkv", {m, qkv_width, hidden, residual, nullptr, nullptr, buffers_.qkv.data()}, qkv);
    if (bucket.o_proj == OProjChoice::cublaslt && bf16_weights)
      tune("o_proj", {m, hidden, q_size, buffers_.attention_out.as<__nv_bfloat16>(), o_bias, residual, residual},
           o_proj);
    if (bucket.mlp == MlpChoice::unfused) {
      std::vector<MlpLayer*> mlps;
      for (const GpuLayerWeights& w : weights_.layers) mlps.push_back(&w.mlp(MlpChoice::unfused));
      for (GemmTuning& t : MlpLayer::tune_unfused_gemms(mlps, m, true, stream)) out.push_back(std::move(t));
    }
    void* logits = split() ? buffers_.logits_slice.data() : buffers_.logits.data();
    tune("lm_head", {m, lm_head_rows(), hidden, normed, nullptr, nullptr, logits, true},
         std::span(&lm_head, 1));
  }
  return out;
}

int ForwardPass::launches_per_layer(int attention_launches, const BucketPlan& bucket) const {
  // [QKV GEMM, rope_kv_append] or the fused front, attention, o_proj (the cluster GEMV, or
  // cuBLASLt, counted as one although a split-K algorithm adds a reduction kernel), the MLP
  const int front = bucket.front == FrontChoice::fused ? 1 : 2;
  // After attention and after the MLP, one kernel each, less the sums the fused MLP does itself.
  const int all_reduces =
      split() ? 2 - static_cast<int>(mlp_sums_over_ranks(bucket.mlp, bucket.all_reduce, bucket.batch)) : 0;
  // FP8 GEMMs quantize their input first: one launch more for the front and for o_proj.
  const bool fp8_gemms = bucket.gemm == GemmChoice::fp8 && weights_.layers.front().format != WeightFormat::bf16;
  const int quantizations = fp8_gemms ? (bucket.front == FrontChoice::unfused) + (bucket.o_proj == OProjChoice::cublaslt) : 0;
  return front + attention_launches + 1 + quantizations +
         weights_.layers.front().mlp(bucket.mlp).launches_per_call(true, choice_row(bucket.gemm).mlp_gemms) +
         all_reduces;
}

int ForwardPass::launches_per_decode_step(const BucketPlan& bucket, const kernels::DecodeAttentionPlan& plan) const {
  // embedding, the layers, final norm, lm_head, sampling; tensor parallel: the logits' gather and
  // the ids' broadcast (rank 0, which samples)
  return 1 + config_.num_hidden_layers * launches_per_layer(kernels::decode_attention_launches(plan), bucket) + 3 +
         (split() ? 2 : 0);
}

}  // namespace deepfuse::runtime
