// ForwardPass::verify_step: speculative decoding's verify pass (issue 54, docs/runtime.md,
// "Speculative decoding"). The entries are a larger decode batch: the layers append each entry's
// K/V at its own (row, position), decode attention reads its sequence's row up to its own
// position (so a sequence's entries see each other causally), and lm_head and the sampler run
// over every entry. speculative_accept then keeps the drafts the chosen tokens confirm.
#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/kernels/speculative_accept.hpp"
#include "runtime/forward.hpp"

namespace deepfuse::runtime {

void ForwardPass::verify_step(const VerifyPass& pass, const kernels::DecodeAttentionPlan& plan,
                              const BucketPlan* bucket, cudaStream_t stream) {
  const int entries = pass.sequences * pass.rows;
  DF_CHECK(!split(), "speculative decoding runs on one GPU (no tensor parallel verify step)");
  DF_CHECK(pass.rows >= 1 && pass.rows <= kernels::kSpeculativeMaxRows && pass.sequences >= 1,
           "internal: a verify step of " + std::to_string(pass.sequences) + " sequences x " +
               std::to_string(pass.rows) + " rows");
  DF_CHECK(entries == plan.batch && entries <= buffers_.max_tokens && entries <= buffers_.logits_rows,
           "internal: a verify step of " + std::to_string(entries) + " entries beyond its buffers or plan");
  DF_CHECK(!bucket || bucket->batch >= entries, "internal: a verify step's ops from a bucket too small for it");
  embed(pass.ids, entries, stream);
  Attention attention{bucket ? choices_of(*bucket) : prefill_choices(), &plan, 0, {}};
  attention.seq_lens = pass.seq_lens;
  attention.sequences = pass.block_rows;
  attention.workspace = pass.attention_workspace;
  // A sequence's entries append keys p..p + rows - 1 in this pass, which may straddle a page:
  // attention must not read the page before a query's newest ahead of the QKV kernel.
  attention.appended_keys = pass.rows;
  float* pending = nullptr;
  for (int l = 0; l < config_.num_hidden_layers; ++l)
    pending = layer(l, entries, pass.positions, pass.block_rows, attention, pending, stream);
  DF_CHECK(!pending, "the last block's MLP sum must reach the residual stream");
  final_norm(0, entries, stream);
  lm_head(0, entries, stream);

  // Each entry's token, with its own draw index (the slots say), as a plain step would choose it.
  DF_CHECK_CUDA(kernels::launch_sampling({.logits = buffers_.logits.as<float>(),
                                           .slots = pass.slots,
                                           .ids = pass.chosen,
                                           .workspace = pass.sampling_workspace,
                                           .batch = entries,
                                           .vocab = config_.vocab_size},
                                          stream));

  kernels::SpeculativeAcceptParams a;
  a.chosen = pass.chosen;
  a.drafts = pass.rows > 1 ? pass.drafts : nullptr;
  a.draft_counts = pass.draft_counts;
  a.sequences = pass.sequences;
  a.rows = pass.rows;
  a.emitted = pass.emitted;
  a.emitted_counts = pass.emitted_counts;
  DF_CHECK_CUDA(kernels::launch_speculative_accept(a, stream));
}

}  // namespace deepfuse::runtime
