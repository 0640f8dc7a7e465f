// The decode plan's helpers, `--plan-override` parsing and application, and the registry's rules
// (each checked against the launcher limit it restates).
#include <gtest/gtest.h>

#include <algorithm>

#include "deepfuse/kernels/cluster_gemv.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "deepfuse/kernels/swiglu_batched.hpp"
#include "deepfuse/kernels/swiglu_wgmma.hpp"
#include "deepfuse/kernels/swiglu_fused.hpp"
#include "model/model_test_util.hpp"
#include "scheduler/builtin_plans.hpp"
#include "scheduler/scheduler_test_util.hpp"
#include "scheduler/variants.hpp"

namespace deepfuse {
namespace {

using namespace scheduler;
using testing::expect_error;

DecodePlan llama8b_h100_plan() {
  return builtin_plan(testing::model_shapes()[0].shape, testing::h100(), testing::buckets());
}

TEST(DecodePlan, BucketForPicksTheSmallestHoldingTheSequences) {
  const DecodePlan plan = llama8b_h100_plan();
  EXPECT_EQ(plan.bucket_for(1).batch, 1);
  EXPECT_EQ(plan.bucket_for(3).batch, 4);
  EXPECT_EQ(plan.bucket_for(8).batch, 8);
  EXPECT_EQ(plan.bucket_for(9).batch, 16);
  EXPECT_EQ(plan.bucket_for(1000).batch, 64);  // the largest otherwise
  expect_error([] { DecodePlan{}.bucket_for(1); }, {"no buckets"});
}

TEST(DecodePlan, UsesCountsEveryBucketAndPrefill) {
  DecodePlan plan = llama8b_h100_plan();
  EXPECT_TRUE(plan.uses(MlpChoice::fused));
  EXPECT_TRUE(plan.uses(MlpChoice::unfused));
  EXPECT_TRUE(plan.uses(OProjChoice::gemv));
  for (BucketPlan& b : plan.buckets)
    b.mlp = MlpChoice::fused, b.front = FrontChoice::unfused, b.o_proj = OProjChoice::cublaslt;
  EXPECT_TRUE(plan.uses(MlpChoice::unfused));  // prefill
  plan.prefill_mlp = MlpChoice::fused;
  EXPECT_FALSE(plan.uses(MlpChoice::unfused));
  EXPECT_FALSE(plan.uses(FrontChoice::fused));
  EXPECT_FALSE(plan.uses(OProjChoice::gemv));
  EXPECT_TRUE(plan.uses(FrontChoice::unfused));  // prefill's front and o_proj are always cuBLASLt
  EXPECT_TRUE(plan.uses(OProjChoice::cublaslt));
}

TEST(DecodePlan, ChoiceNames) {
  EXPECT_STREQ(choice_name(MlpChoice::fused), "fused");
  EXPECT_STREQ(choice_name(FrontChoice::unfused), "unfused");
  EXPECT_STREQ(choice_name(OProjChoice::gemv), "gemv");
  EXPECT_STREQ(choice_name(OProjChoice::cublaslt), "cublaslt");
  EXPECT_STREQ(choice_name(kernels::SplitMerge::workspace), "workspace");
  EXPECT_STREQ(choice_name(kernels::SplitMerge::cluster), "cluster");
  EXPECT_STREQ(choice_name(kernels::SplitMerge::automatic), "automatic");
}

TEST(PlanOverrides, ParsesEveryForm) {
  const auto overrides = parse_plan_overrides(
      "mlp=unfused, mlp@16=fused,front@32=fused,o_proj=cublaslt,attention.splits@1=8,attention.warps=4,"
      "attention.merge=workspace,attention.short_context=off,prefill.mlp=fused,attention.splits=auto");
  ASSERT_EQ(overrides.size(), 10u);
  EXPECT_EQ(overrides[0].op, "mlp");
  EXPECT_FALSE(overrides[0].bucket);
  EXPECT_EQ(overrides[0].value, "unfused");
  EXPECT_EQ(overrides[1].text, "mlp@16=fused");
  EXPECT_EQ(overrides[1].bucket, 16);
  EXPECT_EQ(overrides[4].op, "attention.splits");
  EXPECT_EQ(overrides[4].bucket, 1);
  EXPECT_EQ(overrides[4].value, "8");
  EXPECT_EQ(overrides[8].op, "prefill.mlp");
}

TEST(PlanOverrides, MalformedTextIsAOneLineErrorNamingIt) {
  expect_error([] { parse_plan_overrides("attn=fused"); }, {"'attn=fused'", "unknown op 'attn'"});
  expect_error([] { parse_plan_overrides("mlp=fast"); },
               {"'mlp=fast'", "bad value 'fast'", "fused, unfused, fused_batched or fused_wgmma"});
  expect_error([] { parse_plan_overrides("o_proj=fused"); }, {"gemv or cublaslt"});
  expect_error([] { parse_plan_overrides("attention.warps=6"); }, {"auto, 4 or 8"});
  expect_error([] { parse_plan_overrides("attention.splits=-1"); }, {"count of splits"});
  expect_error([] { parse_plan_overrides("attention.short_context=yes"); }, {"on or off"});
  expect_error([] { parse_plan_overrides("mlp@0=fused"); }, {"bucket '0'"});
  expect_error([] { parse_plan_overrides("mlp@x=fused"); }, {"bucket 'x'"});
  expect_error([] { parse_plan_overrides("mlp"); }, {"'mlp'", "OP[@BUCKET]=VALUE"});
  expect_error([] { parse_plan_overrides("mlp="); }, {"no value"});
  expect_error([] { parse_plan_overrides("mlp=fused,,front=fused"); }, {"empty entry"});
  expect_error([] { parse_plan_overrides(""); }, {"empty entry"});
  expect_error([] { parse_plan_overrides("prefill.mlp@8=fused"); }, {"prefill.mlp has no decode bucket"});
}

TEST(PlanOverrides, AppliesInOrderAndRecordsThemInTheSource) {
  const PlanShape shape = testing::model_shapes()[0].shape;
  const DecodePlan plan =
      apply_overrides(llama8b_h100_plan(), parse_plan_overrides("mlp@16=fused,attention.warps=4,attention.warps@1=8"),
                      shape, testing::h100());
  EXPECT_EQ(plan.bucket_for(16).mlp, MlpChoice::fused);
  EXPECT_EQ(plan.bucket_for(32).mlp, MlpChoice::unfused);
  EXPECT_EQ(plan.bucket_for(1).attention.warps, 8);
  EXPECT_EQ(plan.bucket_for(2).attention.warps, 4);
  EXPECT_EQ(plan.bucket_for(64).attention.warps, 4);
  EXPECT_EQ(plan.prefill_mlp, MlpChoice::unfused);
  EXPECT_EQ(plan.source, "built-in (sm_90) + overrides mlp@16=fused,attention.warps=4,attention.warps@1=8");
  EXPECT_NO_THROW(check_plan(plan, shape, testing::h100()));
}

TEST(PlanOverrides, MlpWithoutABucketCoversPrefillToo) {
  const PlanShape shape = testing::model_shapes()[0].shape;
  const DecodePlan plan =
      apply_overrides(llama8b_h100_plan(), parse_plan_overrides("mlp=fused"), shape, testing::h100());
  for (const BucketPlan& b : plan.buckets) EXPECT_EQ(b.mlp, MlpChoice::fused);
  EXPECT_EQ(plan.prefill_mlp, MlpChoice::fused);
}

TEST(PlanOverrides, AllReduceSetsEveryBucketOrOne) {
  const PlanShape shape = testing::model_shapes()[0].shape;
  const DecodePlan plan = apply_overrides(
      llama8b_h100_plan(),
      parse_plan_overrides("all_reduce=one_shot,all_reduce@64=nccl,all_reduce@1=one_shot_lines,"
                           "all_reduce@2=one_shot_flag,all_reduce@4=epilogue,all_reduce@8=in_mlp"),
      shape, testing::h100());
  for (const BucketPlan& b : plan.buckets) {
    const AllReduceChoice expected = b.batch == 64  ? AllReduceChoice::nccl
                                     : b.batch == 1 ? AllReduceChoice::one_shot_lines
                                     : b.batch == 2 ? AllReduceChoice::one_shot_flag
                                     : b.batch == 4 ? AllReduceChoice::epilogue
                                     : b.batch == 8 ? AllReduceChoice::in_mlp
                                                    : AllReduceChoice::one_shot;
    EXPECT_EQ(b.all_reduce, expected) << b.batch;
  }
  EXPECT_STREQ(choice_name(AllReduceChoice::one_shot), "one_shot");
  EXPECT_STREQ(choice_name(AllReduceChoice::one_shot_flag), "one_shot_flag");
  EXPECT_STREQ(choice_name(AllReduceChoice::one_shot_lines), "one_shot_lines");
  EXPECT_STREQ(choice_name(AllReduceChoice::epilogue), "epilogue");
  EXPECT_STREQ(choice_name(AllReduceChoice::in_mlp), "in_mlp");
  EXPECT_EQ(sums_in_mlp(MlpChoice::fused, AllReduceChoice::in_mlp), 2);
  EXPECT_EQ(sums_in_mlp(MlpChoice::fused, AllReduceChoice::epilogue), 1);
  EXPECT_EQ(sums_in_mlp(MlpChoice::fused, AllReduceChoice::one_shot_lines), 0);
  EXPECT_EQ(sums_in_mlp(MlpChoice::unfused, AllReduceChoice::in_mlp), 0);
  EXPECT_EQ(sums_in_mlp(MlpChoice::unfused, AllReduceChoice::epilogue), 0);
  try {
    parse_plan_overrides("all_reduce=ring");
    ADD_FAILURE() << "all_reduce=ring accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("nccl, one_shot, one_shot_flag, one_shot_lines, epilogue or in_mlp"),
              std::string::npos)
        << e.what();
  }
}

TEST(PlanOverrides, UnfusedFrontTakesOProjToCublaslt) {
  const PlanShape shape = testing::model_shapes()[0].shape;
  const DecodePlan plan =
      apply_overrides(llama8b_h100_plan(), parse_plan_overrides("front=unfused"), shape, testing::h100());
  for (const BucketPlan& b : plan.buckets) {
    EXPECT_EQ(b.front, FrontChoice::unfused);
    EXPECT_EQ(b.o_proj, OProjChoice::cublaslt);
  }
}

TEST(PlanOverrides, UnsupportedApplicationsNameTheOverrideBucketAndOp) {
  const PlanShape llama = testing::model_shapes()[0].shape;
  const PlanShape tiny = testing::model_shapes()[3].shape;
  auto apply = [&](const char* text, const PlanShape& shape, const GpuInfo& gpu) {
    apply_overrides(builtin_plan(shape, gpu, testing::buckets()), parse_plan_overrides(text), shape, gpu);
  };
  const GpuInfo h100 = testing::h100(), a100 = testing::a100();
  expect_error([&] { apply("mlp@3=unfused", llama, h100); },
               {"'mlp@3=unfused'", "3 is not one of the plan's buckets (1, 2, 4, 8, 16, 32, 64)"});
  expect_error([&] { apply("o_proj@32=gemv", llama, h100); },
               {"'o_proj@32=gemv'", "bucket 32", "o_proj=gemv", "needs the fused front"});
  expect_error([&] { apply("front@64=fused", llama, h100); }, {"'front@64=fused'", "bucket 64", "at most 32 tokens"});
  expect_error([&] { apply("attention.merge=cluster", llama, a100); }, {"bucket 1", "thread-block clusters"});
  expect_error([&] { apply("attention.warps@1=4,attention.merge@1=cluster", llama, h100); },
               {"'attention.merge@1=cluster'", "blocks of 8 warps"});
  expect_error([&] { apply("attention.splits@2=300", llama, h100); }, {"bucket 2", "0 (the planner's) to 256"});
  expect_error([&] { apply("front@1=fused", tiny, h100); }, {"'front@1=fused'", "head_dim 64 or 128"});
  expect_error([&] { apply("mlp@1=fused", llama, a100); }, {"'mlp@1=fused'", "resident blocks"});
  expect_error([&] { apply("attention.short_context=on", llama, a100); }, {"short-context", "clusters"});
}

TEST(PlanOverrides, HandBuiltOverridesAreCheckedToo) {
  const PlanShape llama = testing::model_shapes()[0].shape;
  auto apply = [&](PlanOverride o) {
    o.text = o.op + "=" + o.value;
    apply_overrides(llama8b_h100_plan(), {o}, llama, testing::h100());
  };
  expect_error([&] { apply({.op = "mlp", .value = "fast"}); }, {"'mlp=fast'", "bad value 'fast'"});
  expect_error([&] { apply({.op = "attention.splits", .value = "many"}); }, {"bad value 'many'"});
  expect_error([&] { apply({.op = "lm_head", .value = "gemv"}); }, {"unknown op 'lm_head'"});
}

TEST(SchedulerVariants, RulesRestateTheLaunchersLimits) {
  const PlanShape llama = testing::model_shapes()[0].shape;
  const GpuInfo h100 = testing::h100();
  EXPECT_EQ(why_unsupported(FrontChoice::fused, llama, kernels::kQkvFusedMaxTokens, h100), "");
  EXPECT_NE(why_unsupported(FrontChoice::fused, llama, kernels::kQkvFusedMaxTokens + 1, h100), "");
  EXPECT_EQ(why_unsupported(OProjChoice::gemv, FrontChoice::fused, llama, kernels::kGemvResidualMaxTokens, h100), "");
  EXPECT_NE(why_unsupported(OProjChoice::gemv, FrontChoice::fused, llama, kernels::kGemvResidualMaxTokens + 1, h100),
            "");
  EXPECT_EQ(why_unsupported(OProjChoice::gemv, FrontChoice::unfused, llama, 1, h100),
            "the o_proj GEMV needs the fused front");
  EXPECT_EQ(why_unsupported(MlpChoice::fused, llama, 1024, h100), "");  // passes of 32 tokens
  PlanShape odd = llama;
  odd.intermediate = 14336 + 32;
  EXPECT_NE(why_unsupported(MlpChoice::fused, odd, 1, h100).find("multiples of 64"), std::string::npos);
  // The unfused variants are every plan's fallback.
  for (const auto& [name, shape] : testing::model_shapes())
    for (const GpuInfo& gpu : testing::gpus()) {
      EXPECT_EQ(why_unsupported(MlpChoice::unfused, shape, 64, gpu), "") << name;
      EXPECT_EQ(why_unsupported(FrontChoice::unfused, shape, 64, gpu), "") << name;
      EXPECT_EQ(why_unsupported(OProjChoice::cublaslt, FrontChoice::unfused, shape, 64, gpu), "") << name;
    }
}

// The registry's answers are the kernels' own (their public headers' `..._unsupported`), over the
// README models, an odd shape, every token count a bucket or prefill chunk takes, each GPU class
// and each weight format.
TEST(SchedulerVariants, RulesAreTheKernelsAnswers) {
  std::vector<PlanShape> shapes;
  for (const auto& named : testing::model_shapes()) shapes.push_back(named.shape);
  PlanShape odd = shapes[0];
  odd.intermediate += 32, odd.hidden += 16, odd.kv_heads = 5;
  shapes.push_back(odd);
  for (size_t i = 0, bf16 = shapes.size(); i < bf16; ++i)
    for (WeightFormat format : {WeightFormat::fp8_e4m3, WeightFormat::fp8_e4m3_block128}) {
      shapes.push_back(shapes[i]);
      shapes.back().weights = format;
    }
  for (const PlanShape& shape : shapes)
    for (const GpuInfo& gpu : testing::gpus())
      for (int tokens : {0, 1, 8, 9, 16, 17, 32, 33, 64, 65, 128, 256, 257, 1024}) {
        const std::string where = shape.signature() + " " + gpu.name + " tokens " + std::to_string(tokens);
        const std::string gemv_gpu = kernels::cluster_gemv_unsupported(gpu.shared_bytes_per_block());
        const bool front = kernels::qkv_rope_fused_unsupported(
                               {tokens, shape.hidden, shape.q_heads, shape.kv_heads, shape.head_dim}, shape.weights)
                               .empty() &&
                           gemv_gpu.empty();
        EXPECT_EQ(why_unsupported(FrontChoice::fused, shape, tokens, gpu).empty(), front) << where;
        const bool gemv =
            kernels::gemv_residual_unsupported(tokens, shape.hidden, shape.q_heads * shape.head_dim, shape.weights)
                .empty() &&
            gemv_gpu.empty();
        EXPECT_EQ(why_unsupported(OProjChoice::gemv, FrontChoice::fused, shape, tokens, gpu).empty(), gemv) << where;
        const bool mlp = kernels::swiglu_fused_unsupported(shape.hidden, shape.intermediate, tokens,
                                                           {gpu.sms, gpu.clusters(), gpu.shared_bytes_per_sm()},
                                                           shape.weights)
                             .empty();
        EXPECT_EQ(why_unsupported(MlpChoice::fused, shape, tokens, gpu).empty(), mlp) << where;
        const bool batched = kernels::swiglu_batched_unsupported(shape.hidden, shape.intermediate, tokens,
                                                                 {gpu.sms, gpu.clusters(), gpu.shared_bytes_per_sm()},
                                                                 shape.weights)
                                 .empty();
        EXPECT_EQ(why_unsupported(MlpChoice::fused_batched, shape, tokens, gpu).empty(), batched) << where;
        const bool wgmma =
            kernels::swiglu_wgmma_unsupported(shape.hidden, shape.intermediate, tokens, {gpu.major, gpu.sms},
                                              shape.weights)
                .empty();
        EXPECT_EQ(why_unsupported(MlpChoice::fused_wgmma, shape, tokens, gpu).empty(), wgmma) << where;
      }
  const PlanShape llama = shapes[0];
  for (int splits : {0, 1, 8, 9, 256, 257})
    for (int warps : {0, 4, 8})
      for (kernels::SplitMerge merge : all_choices<kernels::SplitMerge>()) {
        const AttentionChoice choice{.splits = splits, .warps = warps, .merge = merge};
        EXPECT_EQ(why_unsupported(choice, llama, 1, testing::h100()).empty(),
                  kernels::decode_attention_forced_unsupported(splits, warps, merge, 4).empty())
            << describe(choice);
      }
}

TEST(SchedulerVariants, ClusterGemvKernelsNeedSm90SharedMemory) {
  const PlanShape llama = testing::model_shapes()[0].shape;
  for (const GpuInfo& gpu : {testing::a100(), testing::l40s()}) {
    EXPECT_NE(why_unsupported(FrontChoice::fused, llama, 1, gpu).find("200 KB"), std::string::npos) << gpu.name;
    EXPECT_NE(why_unsupported(OProjChoice::gemv, FrontChoice::fused, llama, 1, gpu).find("200 KB"), std::string::npos);
  }
}

TEST(SchedulerVariants, FusedMlpWithoutClustersFitsItsResidentBlocks) {
  const PlanShape llama8b = testing::model_shapes()[0].shape, llama1b = testing::model_shapes()[1].shape;
  // A100: one 90.8 KB block per SM at up to 8 tokens (6 x 16 x 108 = 10368 rows), two in
  // 32-token passes; L40S: one per SM (6 x 16 x 142 = 13632 rows).
  EXPECT_NE(why_unsupported(MlpChoice::fused, llama8b, 8, testing::a100()), "");
  EXPECT_EQ(why_unsupported(MlpChoice::fused, llama8b, 32, testing::a100()), "");
  EXPECT_EQ(why_unsupported(MlpChoice::fused, llama1b, 8, testing::a100()), "");
  EXPECT_NE(why_unsupported(MlpChoice::fused, llama8b, 32, testing::l40s()), "");
  EXPECT_EQ(why_unsupported(MlpChoice::fused, llama1b, 8, testing::l40s()), "");
}

TEST(SchedulerVariants, AttentionRules) {
  const PlanShape llama = testing::model_shapes()[0].shape;
  const GpuInfo h100 = testing::h100(), a100 = testing::a100();
  AttentionChoice cluster;
  cluster.merge = kernels::SplitMerge::cluster;
  EXPECT_EQ(why_unsupported(cluster, llama, 1, h100), "");
  EXPECT_NE(why_unsupported(cluster, llama, 1, a100), "");
  cluster.splits = 9;
  EXPECT_NE(why_unsupported(cluster, llama, 1, h100).find("at most 8 splits"), std::string::npos);
  PlanShape wide_group = llama;
  wide_group.kv_heads = 2;  // 16 query heads per kv head
  EXPECT_NE(why_unsupported(AttentionChoice{.merge = kernels::SplitMerge::cluster}, wide_group, 1, h100)
                .find("at most 8 query heads"),
            std::string::npos);
  const AttentionChoice splits40{.splits = 40};
  EXPECT_EQ(why_unsupported(splits40, llama, 1, h100, 1024), "");  // 64 pages
  EXPECT_NE(why_unsupported(splits40, llama, 1, h100, 512).find("32 pages"), std::string::npos);
}

TEST(SchedulerVariants, AttentionCandidatesSurroundThePlanner) {
  const PlanShape llama = testing::model_shapes()[0].shape;
  const GpuInfo h100 = testing::h100();
  for (int batch : {1, 8, 64}) {
    const auto candidates = attention_candidates(llama, batch, h100, 8192);
    ASSERT_FALSE(candidates.empty());
    EXPECT_EQ(candidates.front(), AttentionChoice{});  // automatic, short_context on
    for (size_t i = 0; i < candidates.size(); ++i) {
      EXPECT_EQ(why_unsupported(candidates[i], llama, batch, h100, 8192), "") << describe(candidates[i]);
      for (size_t j = 0; j < i; ++j) EXPECT_NE(candidates[i], candidates[j]);
    }
    const int planned = kernels::plan_decode_attention(batch, 32, 8, 128, 8192, h100.sms).splits_per_sequence;
    auto has_splits = [&](int s) {
      return std::any_of(candidates.begin(), candidates.end(), [&](const AttentionChoice& c) { return c.splits == s; });
    };
    if (planned >= 2) {
      EXPECT_TRUE(has_splits(planned / 2)) << batch;
    }
    if (planned * 2 <= 256) {
      EXPECT_TRUE(has_splits(planned * 2)) << batch;
    }
  }
  // Without the context: no split candidates; without clusters: no cluster merge or short plan.
  for (const AttentionChoice& c : attention_candidates(llama, 1, h100)) EXPECT_EQ(c.splits, 0);
  for (const AttentionChoice& c : attention_candidates(llama, 1, testing::a100(), 8192)) {
    EXPECT_NE(c.merge, kernels::SplitMerge::cluster);
    EXPECT_FALSE(c.short_context);
  }
}

TEST(SchedulerVariants, ShapeSignature) {
  EXPECT_EQ(testing::model_shapes()[0].shape.signature(), "h4096-i14336-q32-kv8-d128-l32-v128256");
  EXPECT_EQ(testing::model_shapes()[2].shape.signature(), "h3584-i18944-q28-kv4-d128-l28-v152064-bias");
  ModelConfig config;
  config.hidden_size = 2048, config.intermediate_size = 8192, config.num_attention_heads = 32;
  config.num_key_value_heads = 8, config.head_dim = 64, config.num_hidden_layers = 16, config.vocab_size = 128256;
  EXPECT_EQ(PlanShape::of(config).signature(), testing::model_shapes()[1].shape.signature());
  // FP8 weights are another plan (and tuning cache entry); bf16's keys stay as they were.
  EXPECT_EQ(PlanShape::of(config, WeightFormat::fp8_e4m3).signature(),
            testing::model_shapes()[1].shape.signature() + "-fp8_e4m3");
}

TEST(SchedulerVariants, CheckPlanNamesTheBucketAndOp) {
  const PlanShape llama = testing::model_shapes()[0].shape;
  DecodePlan plan = llama8b_h100_plan();
  plan.buckets[5].o_proj = OProjChoice::gemv;  // bucket 32, front unfused
  expect_error([&] { check_plan(plan, llama, testing::h100()); },
               {"built-in (sm_90)", "bucket 32", "o_proj=gemv", "needs the fused front"});
  plan = llama8b_h100_plan();
  std::swap(plan.buckets[0], plan.buckets[1]);
  expect_error([&] { check_plan(plan, llama, testing::h100()); }, {"ascending and distinct", "(2, 1, 4"});
  expect_error([&] { check_plan(DecodePlan{}, llama, testing::h100()); }, {"no buckets"});
}

}  // namespace
}  // namespace deepfuse
