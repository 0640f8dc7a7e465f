// The variant registry: each op's candidates and whether one supports a model shape, a bucket's
// token count and the GPU. Built-in plans, overrides, the profiler and the engine all ask it, so a
// plan never names a variant the kernels would refuse.
#pragma once

#include <string>
#include <vector>

#include "deepfuse/decode_plan.hpp"
#include "deepfuse/model_config.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse::scheduler {

// The GPU facts the choices depend on.
struct GpuInfo {
  std::string name;        // cudaDeviceProp::name
  int major = 0, minor = 0;  // compute capability
  int sms = 0;
  size_t memory_bytes = 0;
  bool clusters() const { return major >= 9; }  // thread-block clusters (sm_90)
  int shared_bytes_per_block() const;           // what a block may opt into
  int shared_bytes_per_sm() const;
};

// The model facts the choices depend on.
struct PlanShape {
  int hidden = 0, intermediate = 0;
  int q_heads = 0, kv_heads = 0, head_dim = 0;
  int layers = 0, vocab = 0;
  bool qkv_bias = false;
  WeightFormat weights = WeightFormat::bf16;  // the blocks' linear weights (block_weight_format)
  static PlanShape of(const ModelConfig& config, WeightFormat weights = WeightFormat::bf16);
  // "h4096-i14336-q32-kv8-d128-l32-v128256" (+"-bias", +"-fp8_e4m3" for weights other than bf16):
  // the tuning cache's model key.
  std::string signature() const;
};

// Empty when supported; otherwise the one-line reason (e.g. "the fused front needs head_dim 64
// or 128"). tokens: the bucket's batch (decode) or the prefill chunk.
std::string why_unsupported(MlpChoice choice, const PlanShape& shape, int tokens, const GpuInfo& gpu);
std::string why_unsupported(FrontChoice choice, const PlanShape& shape, int tokens, const GpuInfo& gpu);
std::string why_unsupported(OProjChoice choice, FrontChoice front, const PlanShape& shape, int tokens,
                            const GpuInfo& gpu);
// Tokens do not matter to the GEMMs' support: any M runs.
std::string why_unsupported(GemmChoice choice, const PlanShape& shape, const GpuInfo& gpu);
std::string why_unsupported(const AttentionChoice& choice, const PlanShape& shape, int batch, const GpuInfo& gpu);
// ... and where the plan's context is known: forced splits also at most one per page of it.
std::string why_unsupported(const AttentionChoice& choice, const PlanShape& shape, int batch, const GpuInfo& gpu,
                            int max_context);

// Every candidate of each op (the profiler tries the supported ones).
std::vector<MlpChoice> mlp_candidates();
std::vector<FrontChoice> front_candidates();
std::vector<OProjChoice> o_proj_candidates();
std::vector<GemmChoice> gemm_candidates();
// A few attention shapes around the planner's: automatic, and forced splits / warps / merges that
// `shape` and the GPU support for that batch.
std::vector<AttentionChoice> attention_candidates(const PlanShape& shape, int batch, const GpuInfo& gpu);
// ... with the context the attention plans serve: also the planner's splits halved and doubled
// (kernels::plan_decode_attention's choice for this batch, context and GPU). max_context 0: as above.
std::vector<AttentionChoice> attention_candidates(const PlanShape& shape, int batch, const GpuInfo& gpu,
                                                  int max_context);


// Throws deepfuse::Error naming the bucket, the op and the reason when any choice of `plan` is
// unsupported, or the buckets are not ascending and distinct.
void check_plan(const DecodePlan& plan, const PlanShape& shape, const GpuInfo& gpu);

// `plan` with the overrides applied in order (each to its bucket, or to all), "+ overrides ..."
// appended to its source. Throws deepfuse::Error naming the override when its op or value is
// unknown, its bucket is not one of the plan's, or the variant does not support the bucket.
// `front=unfused` also moves a bucket's o_proj from the GEMV to cuBLASLt (the GEMV needs the
// fused front); `o_proj=gemv` on a bucket whose front is unfused is an error.
DecodePlan apply_overrides(DecodePlan plan, const std::vector<PlanOverride>& overrides, const PlanShape& shape,
                           const GpuInfo& gpu);

}  // namespace deepfuse::scheduler
