// The decode plan's own helpers: bucket lookup, which layouts the weights must hold, choice names,
// and the parser of `--plan-override`. What a choice supports lives in variants.cpp; here only
// the text is checked, so a typo fails before any model or GPU is touched.
#include "deepfuse/decode_plan.hpp"

#include <algorithm>
#include <charconv>
#include <initializer_list>

#include "deepfuse/error.hpp"

namespace deepfuse {

const BucketPlan& DecodePlan::bucket_for(int sequences) const {
  DF_CHECK(!buckets.empty(), "decode plan has no buckets");
  for (const BucketPlan& bucket : buckets)
    if (bucket.batch >= sequences) return bucket;
  return buckets.back();
}

// Prefill counts for the MLP: its layout must be in the weights when a chunk runs it.
bool DecodePlan::uses(MlpChoice mlp) const {
  return prefill_mlp == mlp ||
         std::any_of(buckets.begin(), buckets.end(), [&](const BucketPlan& b) { return b.mlp == mlp; });
}

// Prefill always runs the unfused front and cuBLASLt o_proj, so those layouts are always held
// (the row-major QKV and o_proj); these say whether the packed copies are needed.
bool DecodePlan::uses(FrontChoice front) const {
  return front == FrontChoice::unfused ||
         std::any_of(buckets.begin(), buckets.end(), [&](const BucketPlan& b) { return b.front == front; });
}

bool DecodePlan::uses(OProjChoice o_proj) const {
  return o_proj == OProjChoice::cublaslt ||
         std::any_of(buckets.begin(), buckets.end(), [&](const BucketPlan& b) { return b.o_proj == o_proj; });
}

const char* choice_name(MlpChoice choice) { return choice == MlpChoice::fused ? "fused" : "unfused"; }
const char* choice_name(FrontChoice choice) { return choice == FrontChoice::fused ? "fused" : "unfused"; }
const char* choice_name(OProjChoice choice) { return choice == OProjChoice::gemv ? "gemv" : "cublaslt"; }
const char* choice_name(AllReduceChoice choice) {
  switch (choice) {
    case AllReduceChoice::nccl: return "nccl";
    case AllReduceChoice::one_shot: return "one_shot";
    case AllReduceChoice::one_shot_flag: return "one_shot_flag";
    case AllReduceChoice::one_shot_lines: return "one_shot_lines";
    case AllReduceChoice::epilogue: return "epilogue";
    case AllReduceChoice::in_mlp: return "in_mlp";
  }
  return "?";
}
int sums_in_mlp(MlpChoice mlp, AllReduceChoice all_reduce) {
  if (mlp != MlpChoice::fused) return 0;
  return all_reduce == AllReduceChoice::in_mlp ? 2 : all_reduce == AllReduceChoice::epilogue ? 1 : 0;
}
const char* choice_name(MergeChoice choice) {
  switch (choice) {
    case MergeChoice::automatic: return "automatic";
    case MergeChoice::workspace: return "workspace";
    case MergeChoice::cluster: return "cluster";
  }
  return "?";
}

namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

std::optional<int> parse_int(std::string_view text) {
  int value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

bool one_of(std::string_view value, std::initializer_list<std::string_view> allowed) {
  return std::find(allowed.begin(), allowed.end(), value) != allowed.end();
}

// The values each op takes, as the message lists them; empty when `value` is one.
std::string bad_value(const std::string& op, std::string_view value) {
  if (op == "mlp" || op == "front" || op == "prefill.mlp")
    return one_of(value, {"fused", "unfused"}) ? "" : "fused or unfused";
  if (op == "o_proj") return one_of(value, {"gemv", "cublaslt"}) ? "" : "gemv or cublaslt";
  if (op == "attention.merge")
    return one_of(value, {"automatic", "workspace", "cluster"}) ? "" : "automatic, workspace or cluster";
  if (op == "attention.short_context") return one_of(value, {"on", "off"}) ? "" : "on or off";
  if (op == "all_reduce")
    return one_of(value, {"nccl", "one_shot", "one_shot_flag", "one_shot_lines", "epilogue", "in_mlp"})
               ? ""
               : "nccl, one_shot, one_shot_flag, one_shot_lines, epilogue or in_mlp";
  if (op == "attention.warps") return one_of(value, {"auto", "0", "4", "8"}) ? "" : "auto, 4 or 8";
  // attention.splits
  if (value == "auto") return "";
  const std::optional<int> splits = parse_int(value);
  return splits && *splits >= 0 ? "" : "auto or a count of splits (0: the planner's)";
}

PlanOverride parse_one(std::string_view text) {
  const std::string written(text);
  auto fail = [&](const std::string& why) { throw Error("plan override '" + written + "': " + why); };
  const size_t equals = text.find('=');
  if (equals == std::string_view::npos) fail("expected OP[@BUCKET]=VALUE");
  std::string_view target = trim(text.substr(0, equals));
  const std::string_view value = trim(text.substr(equals + 1));
  if (value.empty()) fail("no value after '='");

  PlanOverride result;
  result.text = written;
  result.value = std::string(value);
  if (const size_t at = target.find('@'); at != std::string_view::npos) {
    const std::string_view bucket = trim(target.substr(at + 1));
    const std::optional<int> batch = parse_int(bucket);
    if (!batch || *batch < 1) fail("bucket '" + std::string(bucket) + "' is not a positive batch size");
    result.bucket = *batch;
    target = trim(target.substr(0, at));
  }
  result.op = std::string(target);
  if (!one_of(result.op, {"mlp", "front", "o_proj", "attention.splits", "attention.warps", "attention.merge",
                          "attention.short_context", "prefill.mlp", "all_reduce"}))
    fail("unknown op '" + result.op +
         "' (mlp, front, o_proj, attention.splits, attention.warps, attention.merge, attention.short_context, "
         "prefill.mlp, all_reduce)");
  if (result.op == "prefill.mlp" && result.bucket) fail("prefill.mlp has no decode bucket");
  if (const std::string allowed = bad_value(result.op, value); !allowed.empty())
    fail("bad value '" + result.value + "' for " + result.op + " (" + allowed + ")");
  return result;
}

}  // namespace

std::vector<PlanOverride> parse_plan_overrides(std::string_view text) {
  std::vector<PlanOverride> overrides;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    const std::string_view part = trim(text.substr(begin, comma - begin));
    if (part.empty()) throw Error("plan override list '" + std::string(text) + "' has an empty entry");
    overrides.push_back(parse_one(part));
    begin = comma + 1;
  }
  return overrides;
}

}  // namespace deepfuse
