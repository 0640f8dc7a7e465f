// Built-in plans: every choice supported on every shape and GPU class, and the sm_90 plan exactly
// the rules the runtime hard-coded before the scheduler (so the engine's behaviour is unchanged).
#include <gtest/gtest.h>

#include "scheduler/builtin_plans.hpp"
#include "scheduler/tuning_cache.hpp"
#include "scheduler/scheduler_test_util.hpp"
#include "model/model_test_util.hpp"

namespace deepfuse {
namespace {

using namespace scheduler;

TEST(BuiltinPlan, GpuClass) {
  EXPECT_EQ(gpu_class(testing::h100()), "sm_90");
  EXPECT_EQ(gpu_class(testing::gpu("NVIDIA H200", 9, 0, 132, 141)), "sm_90");
  EXPECT_EQ(gpu_class(testing::a100()), "sm_80");
  EXPECT_EQ(gpu_class(testing::l40s()), "sm_89");
  EXPECT_EQ(gpu_class(testing::gpu("Tesla T4", 7, 5, 40, 16)), "sm_75");
}

TEST(BuiltinPlan, EveryOpOfEveryBucketIsSupported) {
  for (const auto& [name, shape] : testing::model_shapes())
    for (const GpuInfo& gpu : testing::gpus()) {
      SCOPED_TRACE(name + " on " + gpu.name);
      const DecodePlan plan = builtin_plan(shape, gpu, testing::buckets());
      EXPECT_EQ(plan.source, "built-in (" + gpu_class(gpu) + ")");
      ASSERT_EQ(plan.buckets.size(), testing::buckets().size());
      EXPECT_NO_THROW(check_plan(plan, shape, gpu));
      for (const BucketPlan& b : plan.buckets) {
        EXPECT_EQ(why_unsupported(b.mlp, shape, b.batch, gpu), "") << b.batch;
        EXPECT_EQ(why_unsupported(b.front, shape, b.batch, gpu), "") << b.batch;
        EXPECT_EQ(why_unsupported(b.o_proj, b.front, shape, b.batch, gpu), "") << b.batch;
        EXPECT_EQ(why_unsupported(b.attention, shape, b.batch, gpu, 32768), "") << b.batch;
      }
      EXPECT_EQ(why_unsupported(plan.prefill_mlp, shape, 1024, gpu), "");
    }
}

// The runtime's rules before the scheduler (commit 6f5ce0c), restated from the code that held
// them: the fused MLP up to 8 tokens; the fused front up to 16 (head_dim 64 or 128, hidden % 64
// == 0); the o_proj GEMV up to 8 with the fused front; attention automatic with the
// short-context plan; prefill on the unfused MLP.
TEST(BuiltinPlan, Sm90IsTodaysRules) {
  for (const GpuInfo& gpu : {testing::h100(), testing::gpu("NVIDIA H200", 9, 0, 132, 141)})
    for (const auto& [name, shape] : testing::model_shapes()) {
      SCOPED_TRACE(name + " on " + gpu.name);
      const bool fused_qkv = (shape.head_dim == 64 || shape.head_dim == 128) && shape.hidden % 64 == 0;
      const DecodePlan plan = builtin_plan(shape, gpu, testing::buckets());
      EXPECT_EQ(plan.prefill_mlp, MlpChoice::unfused);
      for (const BucketPlan& b : plan.buckets) {
        const bool front = fused_qkv && b.batch <= 16;
        EXPECT_EQ(b.mlp, b.batch <= 8 ? MlpChoice::fused : MlpChoice::unfused) << b.batch;
        EXPECT_EQ(b.front, front ? FrontChoice::fused : FrontChoice::unfused) << b.batch;
        EXPECT_EQ(b.o_proj, front && b.batch <= 8 ? OProjChoice::gemv : OProjChoice::cublaslt) << b.batch;
        EXPECT_EQ(b.attention, AttentionChoice{}) << b.batch;  // automatic, short_context on
      }
    }
}

TEST(BuiltinPlan, OlderGpusKeepTheRulesTheyCanRun) {
  for (const GpuInfo& gpu : {testing::a100(), testing::l40s()})
    for (const auto& [name, shape] : testing::model_shapes()) {
      SCOPED_TRACE(name + " on " + gpu.name);
      const DecodePlan plan = builtin_plan(shape, gpu, testing::buckets());
      for (const BucketPlan& b : plan.buckets) {
        // The cluster GEMV kernels ask for more shared memory than these GPUs give a block.
        EXPECT_EQ(b.front, FrontChoice::unfused);
        EXPECT_EQ(b.o_proj, OProjChoice::cublaslt);
        EXPECT_FALSE(b.attention.short_context);
        EXPECT_EQ(b.attention.merge, kernels::SplitMerge::automatic);
        const bool fused_mlp = b.batch <= 8 && why_unsupported(MlpChoice::fused, shape, b.batch, gpu).empty();
        EXPECT_EQ(b.mlp, fused_mlp ? MlpChoice::fused : MlpChoice::unfused);
      }
    }
  // Llama-3.2-1B's MLP fits the resident blocks of both; Llama-3-8B's does not.
  const PlanShape llama8b = testing::model_shapes()[0].shape, llama1b = testing::model_shapes()[1].shape;
  EXPECT_EQ(builtin_plan(llama1b, testing::a100(), testing::buckets()).bucket_for(8).mlp, MlpChoice::fused);
  EXPECT_EQ(builtin_plan(llama1b, testing::l40s(), testing::buckets()).bucket_for(1).mlp, MlpChoice::fused);
  EXPECT_EQ(builtin_plan(llama8b, testing::a100(), testing::buckets()).bucket_for(1).mlp, MlpChoice::unfused);
}

TEST(BuiltinPlan, ShapesTheFusedKernelsRefuseFallBackToUnfused) {
  const PlanShape tiny = testing::model_shapes()[3].shape;  // head_dim 16
  const DecodePlan plan = builtin_plan(tiny, testing::h100(), testing::buckets());
  for (const BucketPlan& b : plan.buckets) {
    EXPECT_EQ(b.front, FrontChoice::unfused);
    EXPECT_EQ(b.o_proj, OProjChoice::cublaslt);
  }
  PlanShape odd = testing::model_shapes()[0].shape;
  odd.intermediate = 14336 + 32;
  for (const BucketPlan& b : builtin_plan(odd, testing::h100(), testing::buckets()).buckets)
    EXPECT_EQ(b.mlp, MlpChoice::unfused);
}

// FP8 weights: the plan asks each kernel about the format. The fused MLP takes per-row fp8_e4m3
// up to 16 tokens (the built-in rule keeps it to 8, as in bf16) and no block-scaled FP8, whose
// buckets run the unfused MLP; front and o_proj are bf16's choices.
TEST(BuiltinPlan, Fp8WeightsFollowTheKernelsLimits) {
  for (const auto& [name, bf16] : testing::model_shapes()) {
    if (bf16.head_dim % 64 != 0) continue;  // the tiny shape: unfused everywhere in every format
    for (WeightFormat format : {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128}) {
      PlanShape fp8 = bf16;
      fp8.weights = format;
      SCOPED_TRACE(name + " " + weight_format_name(format));
      const DecodePlan plan = builtin_plan(fp8, testing::h100(), testing::buckets());
      const DecodePlan reference = builtin_plan(bf16, testing::h100(), testing::buckets());
      ASSERT_EQ(plan.buckets.size(), reference.buckets.size());
      for (size_t i = 0; i < plan.buckets.size(); ++i) {
        const BucketPlan& b = plan.buckets[i];
        const bool fused = b.batch <= 8 && why_unsupported(MlpChoice::fused, fp8, b.batch, testing::h100()).empty();
        EXPECT_EQ(b.mlp, fused ? MlpChoice::fused : MlpChoice::unfused) << b.batch;
        if (format == WeightFormat::fp8_e4m3_block128) EXPECT_EQ(b.mlp, MlpChoice::unfused) << b.batch;
        EXPECT_EQ(b.front, reference.buckets[i].front) << b.batch;
        EXPECT_EQ(b.o_proj, reference.buckets[i].o_proj) << b.batch;
      }
      EXPECT_EQ(plan.prefill_mlp, MlpChoice::unfused);
    }
  }
  PlanShape fp8 = testing::model_shapes()[0].shape;
  fp8.weights = WeightFormat::fp8_e4m3;
  const DecodePlan plan = builtin_plan(fp8, testing::h100(), testing::buckets());
  EXPECT_EQ(plan.bucket_for(1).mlp, MlpChoice::fused);
  testing::expect_error([&] { apply_overrides(plan, parse_plan_overrides("mlp@32=fused"), fp8, testing::h100()); },
                        {"mlp@32=fused", "at most 16 tokens of FP8"});
  fp8.weights = WeightFormat::fp8_e4m3_block128;
  testing::expect_error([&] { apply_overrides(builtin_plan(fp8, testing::h100(), testing::buckets()),
                                              parse_plan_overrides("mlp@1=fused"), fp8, testing::h100()); },
                        {"mlp@1=fused", "fp8_e4m3_block128"});
}

// The FP8 GEMMs (gemm=fp8): never built in yet; an override turns them on for every bucket and
// prefill (or one bucket, or prefill alone), they show in the plan's table and survive its JSON,
// and they are refused with the reason for weights they cannot read and GPUs without them.
// Per-channel FP8 weights run their cuBLASLt projections on FP8 tensor cores where the GPU has
// them (sm_90); gemm=bf16 (all, one bucket, or prefill) takes the widened W8A16 GEMMs back. bf16
// and block-scaled weights, and GPUs without FP8 GEMMs, keep bf16 and refuse gemm=fp8.
TEST(BuiltinPlan, Fp8GemmsBuiltInForPerChannelFp8) {
  PlanShape fp8 = testing::model_shapes()[0].shape;
  fp8.weights = WeightFormat::fp8_e4m3;
  const DecodePlan builtin = builtin_plan(fp8, testing::h100(), testing::buckets());
  for (const BucketPlan& b : builtin.buckets) EXPECT_EQ(b.gemm, GemmChoice::fp8) << b.batch;
  EXPECT_EQ(builtin.prefill_gemm, GemmChoice::fp8);
  EXPECT_NE(describe(builtin).find("prefill mlp: unfused, gemm: fp8"), std::string::npos) << describe(builtin);
  EXPECT_EQ(scheduler::plan_from_json(scheduler::plan_to_json(builtin)), builtin);

  const DecodePlan widened = apply_overrides(builtin, parse_plan_overrides("gemm=bf16"), fp8, testing::h100());
  for (const BucketPlan& b : widened.buckets) EXPECT_EQ(b.gemm, GemmChoice::bf16) << b.batch;
  EXPECT_EQ(widened.prefill_gemm, GemmChoice::bf16);
  EXPECT_EQ(describe(widened).find("fp8"), std::string::npos) << describe(widened);

  const DecodePlan one = apply_overrides(widened, parse_plan_overrides("gemm@64=fp8"), fp8, testing::h100());
  EXPECT_EQ(one.bucket_for(64).gemm, GemmChoice::fp8);
  EXPECT_EQ(one.bucket_for(1).gemm, GemmChoice::bf16);
  EXPECT_EQ(one.prefill_gemm, GemmChoice::bf16);
  const DecodePlan prefill = apply_overrides(builtin, parse_plan_overrides("prefill.gemm=bf16"), fp8, testing::h100());
  EXPECT_EQ(prefill.prefill_gemm, GemmChoice::bf16);
  EXPECT_EQ(prefill.bucket_for(64).gemm, GemmChoice::fp8);
  EXPECT_EQ(scheduler::plan_from_json(scheduler::plan_to_json(prefill)), prefill);

  testing::expect_error([&] { parse_plan_overrides("prefill.gemm@4=fp8"); }, {"prefill.gemm has no decode bucket"});
  testing::expect_error([&] { parse_plan_overrides("gemm=fp16"); }, {"bad value 'fp16'", "bf16 or fp8"});
  const PlanShape bf16 = testing::model_shapes()[0].shape;
  const DecodePlan bf16_plan = builtin_plan(bf16, testing::h100(), testing::buckets());
  EXPECT_EQ(bf16_plan.prefill_gemm, GemmChoice::bf16);
  testing::expect_error([&] { apply_overrides(bf16_plan, parse_plan_overrides("gemm=fp8"), bf16, testing::h100()); },
                        {"gemm=fp8", "fp8_e4m3 weights"});
  PlanShape block = fp8;
  block.weights = WeightFormat::fp8_e4m3_block128;
  const DecodePlan block_plan = builtin_plan(block, testing::h100(), testing::buckets());
  for (const BucketPlan& b : block_plan.buckets) EXPECT_EQ(b.gemm, GemmChoice::bf16) << b.batch;
  testing::expect_error([&] { apply_overrides(block_plan, parse_plan_overrides("prefill.gemm=fp8"), block,
                                              testing::h100()); },
                        {"prefill.gemm=fp8", "fp8_e4m3_block128"});
  const DecodePlan a100 = builtin_plan(fp8, testing::a100(), testing::buckets());
  EXPECT_EQ(a100.prefill_gemm, GemmChoice::bf16);
  testing::expect_error([&] { apply_overrides(a100, parse_plan_overrides("gemm=fp8"), fp8, testing::a100()); },
                        {"gemm=fp8", "sm_90"});
}

TEST(BuiltinPlan, FollowsTheEnginesBuckets) {
  const std::vector<int> buckets{1, 2, 4, 6};  // max_batch 6
  const DecodePlan plan = builtin_plan(testing::model_shapes()[0].shape, testing::h100(), buckets);
  ASSERT_EQ(plan.buckets.size(), 4u);
  EXPECT_EQ(plan.buckets.back().batch, 6);
  EXPECT_EQ(plan.bucket_for(5).batch, 6);
}

}  // namespace
}  // namespace deepfuse
