// The CPU reference: plain fp32 math (fp64 where an oracle needs it), the ground truth every GPU
// op is tested against and the CPU backend. Clarity first; threads only where sizes demand.
#pragma once

#include <cstddef>

namespace deepfuse::reference {

// y[t, :] = down( silu(gate·x[t]) * (up·x[t]) ) (+ residual[t, :]) for t < tokens.
// gate, up: [I, H]; down: [H, I]; x, residual, y: [tokens, H]; residual may be null.
// Accumulates in double; `round_activation_to_bf16` rounds silu(g)*u through bf16 first, as the
// GPU variants do before their down projection (the default keeps full precision).
void swiglu_mlp(const float* x, const float* gate, const float* up, const float* down,
                const float* residual, double* y, int tokens, int hidden, int intermediate,
                bool round_activation_to_bf16 = false);

// silu(v) = v * sigmoid(v)
double silu(double v);

}  // namespace deepfuse::reference

// ---- Per-op references for the transformer layer. Declared here so the model side (reference
// decoder) and the GPU kernels (tests) share one oracle; implemented in src/reference/ops.cpp.
// All tensors are dense row-major fp32 host arrays.

#include <cstdint>
#include <span>
#include <vector>

#include "deepfuse/rope.hpp"
#include "deepfuse/sampling_params.hpp"
#include "deepfuse/token_bitmask.hpp"

namespace deepfuse::reference {

// out[t, :] = table[ids[t], :]; table is [vocab, hidden]. Throws deepfuse::Error on an id outside
// [0, vocab).
void embedding(const float* table, int vocab, int hidden, const int32_t* ids, int tokens, float* out);

// Hugging Face LlamaRMSNorm: out = x / sqrt(mean(x^2) + eps) * weight, per row of `hidden`.
void rms_norm(const float* x, const float* weight, int rows, int hidden, float eps, float* out);

// The fused form the GPU runs between blocks: residual += x (in place), out = rms_norm(residual).
// `round_residual_to_bf16` rounds the updated residual through bf16 before its norm is taken, as
// the bf16 GPU kernel (and Hugging Face in bf16) stores it.
void add_rms_norm(float* residual, const float* x, const float* weight, int rows, int hidden, float eps,
                  float* out, bool round_residual_to_bf16 = false);

// Rotates x [heads, head_dim] in place for `position`, HF rotate-half layout: pairs (i, i+d/2).
void apply_rope(float* x, int heads, int head_dim, int position, std::span<const double> inv_freq);

// One query position attending over a KV cache holding positions 0..length-1 (the query is at
// length-1): GQA (q head h uses kv head h / (q_heads / kv_heads)), softmax(q·k * scale) · v, only
// keys with position > length-1-sliding_window when sliding_window > 0.
// q, out: [q_heads, head_dim]; k_cache, v_cache: [length, kv_heads, head_dim].
void attention_decode(const float* q, const float* k_cache, const float* v_cache, int length, int q_heads,
                      int kv_heads, int head_dim, float scale, int sliding_window, float* out);

// Causal attention for a chunk of q_len query tokens at positions q_start .. q_start+q_len-1 over
// a cache holding positions 0 .. q_start+q_len-1 (the chunk's own keys included): row i is
// attention_decode with length = q_start + i + 1.
// q, out: [q_len, q_heads, head_dim]; k_cache, v_cache: [q_start + q_len, kv_heads, head_dim].
void attention_prefill(const float* q, const float* k_cache, const float* v_cache, int q_start, int q_len,
                       int q_heads, int kv_heads, int head_dim, float scale, int sliding_window, float* out);

// Sampling (SamplingParams: deepfuse/sampling_params.hpp).

// OpenAI's presence and frequency penalties, in place, before sampling: for every id that occurs
// count > 0 times in `generated` (the sequence's generated tokens; never the prompt),
// logits[id] -= presence + frequency * count, in fp32 (the GPU's kernels/token_penalties.hpp
// rounds the same way). Ids outside the vocabulary are an error.
void apply_presence_frequency_penalties(std::span<float> logits, float presence, float frequency,
                                        std::span<const int32_t> generated);

// Constrained decoding: every id `bitmask` leaves out (deepfuse/token_bitmask.hpp; at least
// token_bitmask_words(logits.size()) words) gets logit -inf, in place, before the penalties and
// the sampler, so no processor can pick it (the GPU sampler's SamplingParams::token_bitmask).
void apply_token_bitmask(std::span<float> logits, std::span<const uint32_t> bitmask);

// The distribution sampling draws from, after repetition penalty, temperature, top-k, top-p and
// min-p (in that order, as Hugging Face's processors apply them): probabilities summing to 1.
std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingParams& params,
                                          std::span<const int32_t> previous);

// The uniform number in [0, 1) for draw `step` of a sequence seeded with `seed`: a counter-based
// hash (splitmix64), so the CPU and the GPU sampler draw the same number for the same step.
// Exactly: z = seed + (step + 1) * 0x9e3779b97f4a7c15, the splitmix64 mix of z, then (z >> 11) / 2^53.
double sampling_uniform(uint64_t seed, uint64_t step);

// Samples one id: greedy when temperature <= 0, otherwise inverse CDF of sampling_distribution at
// sampling_uniform(params.seed, step).
int32_t sample(std::span<const float> logits, const SamplingParams& params, std::span<const int32_t> previous,
               uint64_t step);

// Tensor-parallel all-reduce (kernels/one_shot_all_reduce.hpp): out[i] = bf16(sum over r in rank
// order of float(inputs[r][i])), in fp32 starting from rank 0's value, rounded once (nearest even),
// exactly as every rank's kernel computes it. Values are bf16 bits; all inputs the same length.
std::vector<uint16_t> all_reduce_sum_bf16(const std::vector<std::vector<uint16_t>>& inputs);

}  // namespace deepfuse::reference
