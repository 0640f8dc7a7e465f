// The choice tables: a value added as one row reaches parse, the plan's JSON, `--plan-override` and
// `inspect --plan` (a test-only table with a third MLP value shows it), and every row of the real
// tables goes through the real plan's text forms and maps to what the kernels take.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "deepfuse/plan_choices.hpp"
#include "model/model_test_util.hpp"
#include "scheduler/builtin_plans.hpp"
#include "scheduler/plan_json.hpp"
#include "scheduler/scheduler_test_util.hpp"
#include "scheduler/tuning_cache.hpp"

// A new variant value as its author adds it: one row (here in a test-only table, for a test-only
// enum with the value a third MLP kernel would add).
namespace deepfuse::testing {
enum class FakeMlp { fused, unfused, fp8_fused };
}  // namespace deepfuse::testing

template <>
struct deepfuse::ChoiceTable<deepfuse::testing::FakeMlp> {
  using F = deepfuse::testing::FakeMlp;
  static constexpr std::array rows{
      ChoiceRow<F>{F::fused, "fused", "one launch"},
      ChoiceRow<F>{F::unfused, "unfused", "cuBLASLt"},
      ChoiceRow<F>{F::fp8_fused, "fp8_fused", "one launch over fp8 weights"},
  };
};
static_assert(deepfuse::choice_table_well_formed<deepfuse::testing::FakeMlp>());

namespace deepfuse {
namespace {

using namespace scheduler;
using testing::expect_error;
using testing::FakeMlp;

TEST(ChoiceTable, AFakeValueRoundTripsThroughParseJsonOverrideAndInspect) {
  // Parse and name: the third value has its own name (the old two-valued ternaries printed it
  // under the second's).
  EXPECT_EQ(parse_choice<FakeMlp>("fp8_fused"), FakeMlp::fp8_fused);
  EXPECT_STREQ(choice_name(FakeMlp::fp8_fused), "fp8_fused");
  EXPECT_STREQ(choice_name(FakeMlp::unfused), "unfused");
  EXPECT_FALSE(parse_choice<FakeMlp>("fp8"));
  EXPECT_EQ(choice_names<FakeMlp>(), "fused, unfused or fp8_fused");
  const auto values = all_choices<FakeMlp>();
  EXPECT_EQ(std::vector<FakeMlp>(values.begin(), values.end()),
            (std::vector<FakeMlp>{FakeMlp::fused, FakeMlp::unfused, FakeMlp::fp8_fused}));

  // JSON: written as its name, read back strictly, as plan_json does for every choice field.
  for (FakeMlp value : all_choices<FakeMlp>()) {
    const nlohmann::json written = choice_name(value);
    EXPECT_EQ(choice_from_json<FakeMlp>(nlohmann::json::parse(written.dump()), "mlp"), value);
  }
  expect_error([] { choice_from_json<FakeMlp>(nlohmann::json("fp4"), "mlp"); },
               {"unknown mlp 'fp4'", "(fused, unfused, fp8_fused)"});
  expect_error([] { choice_from_json<FakeMlp>(nlohmann::json(2), "mlp"); }, {"mlp is not a string"});

  // Override: the value of `mlp@8=fp8_fused` as apply_overrides reads every choice op.
  const PlanOverride o{.op = "mlp", .bucket = 8, .value = "fp8_fused", .text = "mlp@8=fp8_fused"};
  EXPECT_EQ(override_choice<FakeMlp>(o), FakeMlp::fp8_fused);
  expect_error([] { override_choice<FakeMlp>({.op = "mlp", .value = "fp4", .text = "mlp=fp4"}); },
               {"'mlp=fp4'", "bad value 'fp4' for mlp (fused, unfused or fp8_fused)"});

  // Inspect: the column widens to the longest name, so rows stay aligned.
  EXPECT_EQ(choice_column_width<FakeMlp>("mlp"), 9);
  EXPECT_EQ(choice_column_width<MlpChoice>("mlp"), 13);  // "fused_batched"
}

TEST(ChoiceTable, AValueWithoutARowIsAnError) {
  expect_error([] { choice_name(static_cast<FakeMlp>(3)); }, {"no row"});
  expect_error([] { choice_name(static_cast<AllReduceChoice>(6)); }, {"no row"});
}

// Every row of the plan's tables through the real plan's JSON, overrides and inspect text: a row
// added to a table is covered here without a new line.
template <typename Choice, typename Set>
void every_value_round_trips(const char* op, Set set) {
  const PlanShape shape = testing::model_shapes()[0].shape;
  for (Choice value : all_choices<Choice>()) {
    DecodePlan plan = builtin_plan(shape, testing::h100(), testing::buckets());
    plan.tensor_parallel = 2;  // all_reduce is written only under tensor parallelism
    set(plan.buckets[0], value);
    EXPECT_EQ(plan_from_json(plan_to_json(plan)), plan) << op << "=" << choice_name(value);
    const std::string text = std::string(op) + "@1=" + choice_name(value);
    const std::vector<PlanOverride> overrides = parse_plan_overrides(text);
    ASSERT_EQ(overrides.size(), 1u);
    EXPECT_EQ(overrides[0].value, choice_name(value));
    EXPECT_EQ(override_choice<Choice>(overrides[0]), value);
    // describe prints the attention's planner defaults as "auto".
    if constexpr (std::is_same_v<Choice, kernels::SplitMerge>)
      if (value == kernels::SplitMerge::automatic) continue;
    // ... and leaves out the gemm column while every GEMM is bf16.
    if constexpr (std::is_same_v<Choice, GemmChoice>)
      if (value == GemmChoice::bf16) continue;
    EXPECT_NE(describe(plan).find(choice_name(value)), std::string::npos) << text;
  }
}

TEST(ChoiceTable, EveryPlanValueRoundTripsThroughTheRealPlan) {
  every_value_round_trips<MlpChoice>("mlp", [](BucketPlan& b, MlpChoice c) { b.mlp = c; });
  every_value_round_trips<FrontChoice>("front", [](BucketPlan& b, FrontChoice c) { b.front = c; });
  every_value_round_trips<OProjChoice>("o_proj", [](BucketPlan& b, OProjChoice c) { b.o_proj = c; });
  every_value_round_trips<GemmChoice>("gemm", [](BucketPlan& b, GemmChoice c) { b.gemm = c; });
  every_value_round_trips<AllReduceChoice>("all_reduce", [](BucketPlan& b, AllReduceChoice c) { b.all_reduce = c; });
  every_value_round_trips<kernels::SplitMerge>("attention.merge",
                                               [](BucketPlan& b, kernels::SplitMerge c) { b.attention.merge = c; });
}

TEST(ChoiceTable, InspectColumnsFitTheLongestName) {
  DecodePlan plan = builtin_plan(testing::model_shapes()[0].shape, testing::h100(), testing::buckets());
  plan.tensor_parallel = 2;
  plan.buckets[0].all_reduce = AllReduceChoice::one_shot_lines;
  plan.buckets[1].all_reduce = AllReduceChoice::nccl;
  const std::string text = describe(plan);
  const size_t header = text.find("attention");
  const size_t first = text.find('\n') + 1;
  const size_t second = text.find('\n', first) + 1;
  // The attention column starts at the same offset in the header and both rows.
  EXPECT_EQ(text.find("auto", first) - first, header);
  EXPECT_EQ(text.find("auto", second) - second, header);
}

TEST(ChoiceTable, PlanChoicesMapToWhatTheKernelsTake) {
  for (MlpChoice choice : all_choices<MlpChoice>())
    EXPECT_STREQ(mlp_variant_name(choice_row(choice).variant), choice_name(choice));
  using P = kernels::OneShotProtocol;
  EXPECT_FALSE(choice_row(AllReduceChoice::nccl).protocol);
  EXPECT_EQ(choice_row(AllReduceChoice::one_shot).protocol, P::automatic);
  EXPECT_EQ(choice_row(AllReduceChoice::one_shot_flag).protocol, P::flag_after_data);
  for (AllReduceChoice choice : {AllReduceChoice::one_shot_lines, AllReduceChoice::epilogue, AllReduceChoice::in_mlp})
    EXPECT_EQ(choice_row(choice).protocol, P::flags_in_data) << choice_name(choice);
}

TEST(ChoiceTable, OverrideHelpListsEveryOpAndValue) {
  const std::string help = plan_override_help();
  EXPECT_NE(help.find("mlp=fused|unfused"), std::string::npos) << help;
  EXPECT_NE(help.find("all_reduce=nccl|one_shot|one_shot_flag|one_shot_lines|epilogue|in_mlp"), std::string::npos)
      << help;
  EXPECT_NE(help.find("attention.merge=automatic|workspace|cluster"), std::string::npos) << help;
  EXPECT_NE(help.find("prefill.mlp="), std::string::npos) << help;
}

}  // namespace
}  // namespace deepfuse
