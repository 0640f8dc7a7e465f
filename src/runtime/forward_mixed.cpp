// The mixed step (forward.hpp): prompt chunks and a decode step's entries in one pass, so the
// entries ride along in the GEMMs a prefill runs anyway instead of sitting the prefill out.
#include <string>

#include "deepfuse/error.hpp"
#include "runtime/forward.hpp"

namespace deepfuse::runtime {

void ForwardPass::mixed_step(const kernels::DecodeAttentionPlan& plan, bool decode, std::span<const StepChunk> chunks,
                             int32_t* host_sampled, SamplerExtras extras, cudaStream_t stream) {
  const int batch = plan.batch;
  DF_CHECK(!chunks.empty(), "internal: a mixed step without a prompt chunk");
  DF_CHECK(batch >= 1 && batch <= buffers_.max_batch && batch <= buffers_.logits_rows,
           "mixed step batch " + std::to_string(batch) + " outside 1.." + std::to_string(buffers_.max_batch));
  DF_CHECK(host_sampled, "a mixed step needs a host buffer for its sampled ids");
  int prompt_tokens = 0;
  for (const StepChunk& chunk : chunks) {
    DF_CHECK(chunk.tokens >= 1 && chunk.offset == prompt_tokens && chunk.row >= 0 && chunk.row < batch,
             "internal: a mixed step's chunks follow each other from token 0, each on one of its entries' rows");
    prompt_tokens += chunk.tokens;
  }
  const int tokens = prompt_tokens + batch;
  DF_CHECK(tokens <= buffers_.max_tokens, "mixed step of " + std::to_string(prompt_tokens) + " prompt tokens and " +
                                              std::to_string(batch) + " entries exceeds the " +
                                              std::to_string(buffers_.max_tokens) + " tokens its buffers hold");
  const size_t hidden = config_.hidden_size, q_size = config_.q_size();
  embed(buffers_.prefill_ids(), tokens, stream);
  // Without decode attention nothing writes the entries' attention rows: zeros, as a padded entry gets.
  if (!decode)
    DF_CHECK_CUDA(cudaMemsetAsync(buffers_.attention_out.as<__nv_bfloat16>() + prompt_tokens * q_size, 0,
                                  batch * q_size * sizeof(__nv_bfloat16), stream));
  if (decode) clear_attention_counters(plan, stream);
  const Attention attention{prefill_choices(), decode ? &plan : nullptr, prompt_tokens, chunks};
  for (int l = 0; l < config_.num_hidden_layers; ++l)
    layer(l, tokens, buffers_.prefill_positions(), buffers_.prefill_rows(), attention, nullptr, stream);
  // A chunk that ends its prompt: its last token's hidden state takes its sequence's entry (a
  // padded one: the sequence was not fed), whose logits and sample are then that token's.
  auto* residual = buffers_.residual.as<__nv_bfloat16>();
  for (const StepChunk& chunk : chunks)
    if (chunk.samples)
      DF_CHECK_CUDA(cudaMemcpyAsync(residual + (prompt_tokens + chunk.row) * hidden,
                                    residual + (chunk.offset + chunk.tokens - 1) * hidden,
                                    hidden * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, stream));
  final_norm(prompt_tokens, batch, stream);
  lm_head(0, batch, stream);
  if (!extras.token_masks) sample(0, batch, stream, host_sampled, extras, Source::mixed_step);  // else the caller's
}

}  // namespace deepfuse::runtime
