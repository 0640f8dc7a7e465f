// The decode plan's own helpers: bucket lookup, which layouts the weights must hold, and the parser
// of `--plan-override` (the values of each op from its choice's table). What a choice supports lives in variants.cpp; here only
// the text is checked, so a typo fails before any model or GPU is touched.
#include "deepfuse/decode_plan.hpp"

#include <algorithm>
#include <charconv>

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

int sums_in_mlp(MlpChoice mlp, AllReduceChoice all_reduce) {
  return choice_row(mlp).sums_over_ranks ? choice_row(all_reduce).mlp_sums : 0;
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

// Each op's check of its value: "" when `value` is one of its values, else the values as a
// message lists them.
template <typename Choice>
std::string bad_choice(std::string_view value) {
  return parse_choice<Choice>(value) ? "" : choice_names<Choice>();
}
std::string bad_count(std::string_view value) {
  if (value == "auto") return "";
  const std::optional<int> count = parse_int(value);
  return count && *count >= 0 ? "" : "auto or a count of splits (0: the planner's)";
}
std::string bad_warps(std::string_view value) {
  return value == "auto" || value == "0" || value == "4" || value == "8" ? "" : "auto, 4 or 8";
}
std::string bad_switch(std::string_view value) { return value == "on" || value == "off" ? "" : "on or off"; }

template <typename Choice>
std::string help_names() {
  return choice_names<Choice>("|", "|");
}

// The ops `--plan-override` takes (plan_checks.cpp applies them).
struct OverrideOp {
  std::string_view name;
  std::string (*bad_value)(std::string_view value);
  std::string (*values)();  // for the help
};
const OverrideOp kOverrideOps[] = {
    {"mlp", bad_choice<MlpChoice>, help_names<MlpChoice>},
    {"front", bad_choice<FrontChoice>, help_names<FrontChoice>},
    {"o_proj", bad_choice<OProjChoice>, help_names<OProjChoice>},
    {"gemm", bad_choice<GemmChoice>, help_names<GemmChoice>},
    {"attention.splits", bad_count, [] { return std::string("auto|N"); }},
    {"attention.warps", bad_warps, [] { return std::string("auto|4|8"); }},
    {"attention.merge", bad_choice<kernels::SplitMerge>, help_names<kernels::SplitMerge>},
    {"attention.short_context", bad_switch, [] { return std::string("on|off"); }},
    {"prefill.mlp", bad_choice<MlpChoice>, help_names<MlpChoice>},
    {"prefill.gemm", bad_choice<GemmChoice>, help_names<GemmChoice>},
    {"all_reduce", bad_choice<AllReduceChoice>, help_names<AllReduceChoice>},
};

const OverrideOp* find_op(std::string_view name) {
  for (const OverrideOp& op : kOverrideOps)
    if (op.name == name) return &op;
  return nullptr;
}

std::string op_names() {
  std::string text;
  for (const OverrideOp& op : kOverrideOps) text += (text.empty() ? "" : ", ") + std::string(op.name);
  return text;
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
  const OverrideOp* op = find_op(result.op);
  if (op == nullptr) fail("unknown op '" + result.op + "' (" + op_names() + ")");
  if (result.op.starts_with("prefill.") && result.bucket) fail(result.op + " has no decode bucket");
  if (const std::string allowed = op->bad_value(value); !allowed.empty())
    fail("bad value '" + result.value + "' for " + result.op + " (" + allowed + ")");
  return result;
}

}  // namespace

std::string plan_override_help() {
  std::string text;
  for (const OverrideOp& op : kOverrideOps)
    text += (text.empty() ? "" : ", ") + std::string(op.name) + "=" + op.values();
  return text;
}

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
