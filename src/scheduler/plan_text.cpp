// The decode plan as `inspect --plan`, `bench decode --plan` and `deepfuse tune` print it.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>

#include "deepfuse/decode_plan.hpp"

namespace deepfuse {

std::string describe(const AttentionChoice& choice) {
  std::string text;
  if (choice.splits > 0) text += "splits=" + std::to_string(choice.splits) + " ";
  if (choice.warps > 0) text += "warps=" + std::to_string(choice.warps) + " ";
  if (choice.merge != kernels::SplitMerge::automatic) text += std::string("merge=") + choice_name(choice.merge) + " ";
  if (!choice.short_context) text += "short_context=off ";
  if (text.empty()) return "auto";
  text.pop_back();
  return text;
}

namespace {

// A cell of a choice's column (headed `header`), as wide as the header or the longest name.
template <typename Choice>
std::string cell(std::string_view text, std::string_view header) {
  std::string padded(text);
  padded.resize(std::max<size_t>(padded.size(), choice_column_width<Choice>(header)), ' ');
  return padded + "  ";
}

template <typename Choice>
std::string cell(Choice choice, std::string_view header) {
  return cell<Choice>(choice_name(choice), header);
}

}  // namespace

std::string describe(const DecodePlan& plan) {
  const bool split = plan.tensor_parallel > 1;
  // The gemm column only where a plan runs FP8 GEMMs (bf16 plans print as before).
  const bool gemms = plan.prefill_gemm != GemmChoice::bf16 ||
                     std::any_of(plan.buckets.begin(), plan.buckets.end(),
                                 [](const BucketPlan& b) { return b.gemm != GemmChoice::bf16; });
  std::string out = "bucket  " + cell<MlpChoice>("mlp", "mlp") + cell<FrontChoice>("front", "front") +
                    cell<OProjChoice>("o_proj", "o_proj") + (gemms ? cell<GemmChoice>("gemm", "gemm") : "") +
                    (split ? cell<AllReduceChoice>("all_reduce", "all_reduce") : "") + "attention\n";
  for (const BucketPlan& b : plan.buckets) {
    char batch[16];
    std::snprintf(batch, sizeof batch, "%6d  ", b.batch);
    out += batch + cell(b.mlp, "mlp") + cell(b.front, "front") + cell(b.o_proj, "o_proj") +
           (gemms ? cell(b.gemm, "gemm") : "") + (split ? cell(b.all_reduce, "all_reduce") : "") +
           describe(b.attention) + "\n";
  }
  out += std::string("prefill mlp: ") + choice_name(plan.prefill_mlp) +
         (gemms ? std::string(", gemm: ") + choice_name(plan.prefill_gemm) : "") + "\n";
  if (split) out += "tensor parallel: " + std::to_string(plan.tensor_parallel) + " GPUs (this is one rank's plan; prefill all-reduces: nccl)\n";
  out += "source: " + plan.source + "\n";
  return out;
}

}  // namespace deepfuse
