// Built-in plans: the rules the runtime hard-coded before the scheduler, as one function, so an
// untuned GPU runs exactly what it ran before. docs/scheduler.md lists each rule with the
// measurement it comes from. All GPU classes share the thresholds; the registry's rules
// (variants.cpp) then take out what a class cannot run, and those steps fall back to the unfused
// variants. Only sm_90 has measurements behind the thresholds; sm_80 and sm_89 are unmeasured.
#include "scheduler/builtin_plans.hpp"

#include "deepfuse/error.hpp"

namespace deepfuse::scheduler {

namespace {

// The fused MLP up to 8 tokens (the engine's rule before the scheduler): from 9 its 16-token passes
// lose to cuBLASLt's GEMMs in the step (docs/runtime.md, "The MLP's second copy").
constexpr int kFusedMlpMaxTokens = 8;
// The fused front up to 16 tokens (likewise): 1.18-1.25x at 16
// tokens, 0.64-0.81x at 32 (docs/kernels/qkv_rope_fused.md, "Current design and result").
constexpr int kFusedFrontMaxTokens = 16;
// The o_proj GEMV up to 8 tokens (likewise): at 16 cuBLASLt
// was faster (docs/runtime.md, "The MLP's second copy", and docs/kernels/qkv_rope_fused.md, "The
// stream, shared: o_proj + residual").
constexpr int kGemvOProjMaxTokens = 8;

// FP8 weights with per-channel scales run their cuBLASLt projections on FP8 tensor cores, the
// activations quantized per token (W8A8, as vLLM runs FP8 checkpoints on Hopper): the widened bf16
// GEMMs read and write each weight three times over (docs/kernels/fp8.md, "Measured"). The exact
// W8A16 arithmetic stays one override away (gemm=bf16). Block scales have no FP8 GEMM here.
GemmChoice builtin_gemm(const PlanShape& shape, const GpuInfo& gpu) {
  return why_unsupported(GemmChoice::fp8, shape, gpu).empty() ? GemmChoice::fp8 : GemmChoice::bf16;
}

BucketPlan builtin_bucket(int batch, const PlanShape& shape, const GpuInfo& gpu) {
  auto supported = [](const std::string& why) { return why.empty(); };
  BucketPlan bucket;
  bucket.batch = batch;
  bucket.mlp = batch <= kFusedMlpMaxTokens && supported(why_unsupported(MlpChoice::fused, shape, batch, gpu))
                   ? MlpChoice::fused
                   : MlpChoice::unfused;
  bucket.front = batch <= kFusedFrontMaxTokens && supported(why_unsupported(FrontChoice::fused, shape, batch, gpu))
                     ? FrontChoice::fused
                     : FrontChoice::unfused;
  bucket.o_proj = batch <= kGemvOProjMaxTokens &&
                          supported(why_unsupported(OProjChoice::gemv, bucket.front, shape, batch, gpu))
                      ? OProjChoice::gemv
                      : OProjChoice::cublaslt;
  bucket.gemm = builtin_gemm(shape, gpu);
  // The planner's splits, warps and merge; the short-context plan (cluster merge for short
  // sequences) wherever clusters exist (docs/kernels/decode_attention.md, "Splits merged in a
  // cluster").
  bucket.attention = AttentionChoice{};
  bucket.attention.short_context = gpu.clusters();
  return bucket;
}

}  // namespace

std::string gpu_class(const GpuInfo& gpu) {
  if (gpu.major == 9) return "sm_90";
  return "sm_" + std::to_string(gpu.major) + std::to_string(gpu.minor);
}

DecodePlan builtin_plan(const PlanShape& shape, const GpuInfo& gpu, std::span<const int> buckets) {
  DecodePlan plan;
  plan.source = "built-in (" + gpu_class(gpu) + ")";
  for (int batch : buckets) plan.buckets.push_back(builtin_bucket(batch, shape, gpu));
  // Prefill chunks run the unfused MLP: the fused kernel took 5-9x longer on hundreds of tokens
  // (docs/runtime.md, "The MLP's second copy").
  plan.prefill_mlp = MlpChoice::unfused;
  plan.prefill_gemm = builtin_gemm(shape, gpu);
  check_plan(plan, shape, gpu);
  return plan;
}

}  // namespace deepfuse::scheduler
