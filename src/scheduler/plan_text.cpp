// The decode plan as `inspect --plan`, `bench decode --plan` and `deepfuse tune` print it.
#include <cstdio>
#include <string>

#include "deepfuse/decode_plan.hpp"

namespace deepfuse {

std::string describe(const AttentionChoice& choice) {
  std::string text;
  if (choice.splits > 0) text += "splits=" + std::to_string(choice.splits) + " ";
  if (choice.warps > 0) text += "warps=" + std::to_string(choice.warps) + " ";
  if (choice.merge != MergeChoice::automatic) text += std::string("merge=") + choice_name(choice.merge) + " ";
  if (!choice.short_context) text += "short_context=off ";
  if (text.empty()) return "auto";
  text.pop_back();
  return text;
}

std::string describe(const DecodePlan& plan) {
  const bool split = plan.tensor_parallel > 1;
  std::string out = split ? "bucket  mlp      front    o_proj    all_reduce  attention\n"
                          : "bucket  mlp      front    o_proj    attention\n";
  char line[160];
  for (const BucketPlan& b : plan.buckets) {
    if (split)
      std::snprintf(line, sizeof line, "%6d  %-7s  %-7s  %-8s  %-10s  %s\n", b.batch, choice_name(b.mlp),
                    choice_name(b.front), choice_name(b.o_proj), choice_name(b.all_reduce),
                    describe(b.attention).c_str());
    else
      std::snprintf(line, sizeof line, "%6d  %-7s  %-7s  %-8s  %s\n", b.batch, choice_name(b.mlp),
                    choice_name(b.front), choice_name(b.o_proj), describe(b.attention).c_str());
    out += line;
  }
  out += std::string("prefill mlp: ") + choice_name(plan.prefill_mlp) + "\n";
  if (split) out += "tensor parallel: " + std::to_string(plan.tensor_parallel) + " GPUs (this is one rank's plan; prefill all-reduces: nccl)\n";
  out += "source: " + plan.source + "\n";
  return out;
}

}  // namespace deepfuse
