// The SwiGLU MLP of Llama/Qwen2/Mistral:  y = down( silu(x·Wg^T) * (x·Wu^T) ) [+ residual]
//
//   x [tokens, H] bf16, Wg and Wu [I, H], Wd [H, I] (Hugging Face gate_proj/up_proj/down_proj
//   layout), y [tokens, H] bf16, fp32 accumulation. H and I must be multiples of 64.
//
// Variants behind one entry point (MlpLayer::run):
//   naive    what eager PyTorch does: gate GEMM, up GEMM, SiLU, multiply, down GEMM (cuBLASLt
//            plus simple elementwise kernels): 5 launches, 6 with the residual.
//   unfused  what SGLang and vLLM do: one merged gate_up GEMM, one silu_and_mul kernel, one down
//            GEMM whose epilogue adds the residual: 3 launches.
//   fused    DeepFusion: ONE launch; silu(g)*u lives in shared memory and never reaches HBM.
//            See docs/kernels/swiglu_fused.md for the design and measured versions.
//   fused_batched  the same in one launch for batches (1-256 tokens, built for 16-256): every block
//            holds a whole pass of up to 128 tokens against its weights, silu(g)*u passes through
//            L2 once (deepfuse/kernels/swiglu_batched.hpp). Reads fused's packed layout.
//   fused_wgmma  the Hopper pair for 1-256 tokens (built for 16-256; sm_90 only, bf16): two launches,
//            gate_up + SiLU on warpgroup MMA fed by TMA, act through L2, then down + residual
//            (deepfuse/kernels/swiglu_wgmma.hpp). Row-major weights as unfused's, its own copy.
// The CPU reference lives in deepfuse/reference.hpp (reference::swiglu_mlp).
//
// Weight layouts on the device, made by MlpLayer::load_weights from Hugging Face tensors:
//   naive    gate [I,H], up [I,H], down [H,I] as given.
//   unfused, fused_wgmma  gate_up [2I,H] (gate rows then up rows), down [H,I].
//   fused, fused_batched  "fragment-packed": every 16x16 bf16 tile stored as the 32 lanes x 16 bytes that an
//            mma.m16n8k16 A operand wants, so one coalesced 16-byte load per lane fetches a tile.
//            gate_up: for each 16-row I tile, for each 16-wide H step: gate tile, then up tile.
//            down:    for each 16-wide I tile, for each 16-row H tile: the Wd tile.
//
// Determinism: naive and unfused are deterministic for a given cuBLASLt algorithm. fused adds its
// partial sums in fp32 in whatever order they arrive (distributed-shared-memory atomics, then L2
// bulk reductions, or atomics before sm_90; fused_batched, fused_wgmma: L2 atomics), so results can differ in the last bits between runs
// (not bitwise deterministic); the error bound vs the reference is unaffected.
//
// RMSNorm folded in (MlpNorm, given to load_weights): every run() works on rms_norm(x) * weight,
// as a transformer block's post-attention norm feeds it. fused multiplies the norm weight into
// its packed gate/up columns once at load (x·(W∘w)^T = (x∘w)·W^T; one extra bf16 rounding of
// those weights) and scales the sums by 1/rms(x) inside its one launch; naive and unfused run one
// extra norm launch, unless unfused is asked to fold the norm as fused does (MlpNorm). (Multiplying
// x by the weight per k-step was slower: docs/kernels/swiglu_fused.md, "v6: the norm weight in the
// packed columns".)
//
// Aliasing: y may alias residual (in-place residual add). x must not alias y, except with an
// MlpNorm, where x, residual and y may all be the residual stream (y = x + mlp(norm(x))).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "deepfuse/gemm_tuning.hpp"
#include "deepfuse/kernels/swiglu_fused.hpp"
#include "deepfuse/weight_format.hpp"

namespace deepfuse {

enum class MlpVariant { naive, unfused, fused, fused_batched, fused_wgmma };

// How the unfused variant's GEMMs read FP8 weights in calls above the FP8 GEMV's tokens: widened
// to bf16 per call for a bf16 GEMM, or on FP8 tensor cores with x and silu(g)*u quantized to e4m3
// per token (kernels::CublasLtGemm::run_fp8; fp8_e4m3 weights only). bf16 weights ignore it.
enum class MlpGemms { bf16, fp8 };

const char* mlp_variant_name(MlpVariant variant);
MlpVariant parse_mlp_variant(const std::string& name);  // throws deepfuse::Error on unknown names

struct MlpShape {
  int hidden = 0;        // H
  int intermediate = 0;  // I
  // gate, up and down in `format` (elements and scales).
  size_t weight_bytes(WeightFormat format = WeightFormat::bf16) const {
    return 3 * linear_weight_bytes(format, static_cast<size_t>(hidden), static_cast<size_t>(intermediate));
  }
};

// Throws deepfuse::Error naming the problem unless H and I are positive multiples of 64.
void validate_mlp_shape(const MlpShape& shape);

// Hugging Face layout (row-major) weights on the device. Every variant packs bf16 today; another
// format is refused by load_weights in one line (WeightFormatInfo::implemented).
struct MlpHfWeights {
  LinearWeight gate;  // [I, H]
  LinearWeight up;    // [I, H]
  LinearWeight down;  // [H, I]

  // Row-major bf16 tensors of `shape` (tests, benchmarks).
  static MlpHfWeights bf16(const void* gate, const void* up, const void* down, MlpShape shape);
};

// The RMSNorm applied to x first; weight == nullptr: none. Its weight is 16-bit in every weight
// format; it is folded into the packed columns only where the format folds norms
// (WeightFormatInfo::folds_norm: bf16; docs/design.md, "Weight formats").
struct MlpNorm {
  const __nv_bfloat16* weight = nullptr;  // [H]
  float eps = 1e-6f;
  // unfused only: multiply the weight into gate_up at load and scale by 1/rms(x) inside
  // silu_and_mul, as the fused variant does (3 launches, the decode engine's choice), instead of
  // a norm launch of its own (4 launches, as SGLang and vLLM run it).
  bool fold_into_weights = false;
};

// Scratch memory of the cuBLASLt variants (naive, unfused) for up to max_tokens tokens per call:
// the intermediates, a normalised copy of x, a cuBLASLt handle with its 32 MiB workspace. Layers
// whose calls never overlap (a model's layers, all on one stream) may share one: Llama-3-8B's 32
// layers at 1024 tokens would otherwise hold ~3.8 GB of it. fused needs none.
struct MlpScratch;
std::shared_ptr<MlpScratch> make_mlp_scratch(MlpVariant variant, MlpShape shape, int max_tokens);

// One MLP layer for one variant: owns its weights in the variant's layout, its reduction buffers
// (fused) and, unless given a shared one, its scratch, for up to max_tokens tokens per call.
// run() enqueues work on `stream` only: no allocation, no synchronisation, CUDA-graph capturable.
class MlpLayer {
 public:
  // `scratch` (naive, unfused; ignored by fused): made by make_mlp_scratch for this variant and
  // shape and at least max_tokens tokens, else the constructor throws; null: the layer makes its own.
  MlpLayer(MlpVariant variant, MlpShape shape, int max_tokens, std::shared_ptr<MlpScratch> scratch = nullptr);
  ~MlpLayer();
  MlpLayer(MlpLayer&&) noexcept;
  MlpLayer& operator=(MlpLayer&&) noexcept;

  // Copies (naive), merges (unfused) or packs (fused) the given device tensors. With norm.weight
  // set, every run() normalises x first (see "RMSNorm folded in" above).
  void load_weights(const MlpHfWeights& weights, cudaStream_t stream, const MlpNorm& norm = {});

  // y = mlp(x) (+ residual when residual != nullptr), x normalised first when load_weights had a
  // norm. Throws deepfuse::Error on bad arguments (tokens outside 1..max_tokens, null pointers)
  // and on launch failures.
  void run(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens, cudaStream_t stream,
           MlpGemms gemms = MlpGemms::bf16);

  // Fused variant only: mlp(x) left in this layer's fp32 buffer [tokens, H], which is returned;
  // nothing else is written. The caller's later kernels must add it where y would have gone and
  // zero all tokens x H floats of it before this layer runs again (the decode step does both:
  // kernels::QkvRopeFusedParams::pending, kernels::GemvResidualParams::pending).
  float* run_deferred(const __nv_bfloat16* x, int tokens, cudaStream_t stream);

  // Fused variant only, tensor parallel: as run(), then y is summed over the ranks inside the
  // same launch (kernels::SwigluFusedParams::exchange); every rank calls it alike.
  void run_exchanged(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                     const kernels::LineExchange& exchange, cudaStream_t stream);

  // As run_exchanged, with x first written, inside the same launch, with the sum over the ranks of
  // every rank's x_partial (kernels::SwigluFusedParams::x_exchange: the other slot's lines).
  void run_summed_exchanged(const __nv_bfloat16* x_partial, const kernels::LineExchange& x_exchange,
                            __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                            const kernels::LineExchange& exchange, cudaStream_t stream);

  void set_fused_tuning(const FusedMlpTuning& tuning);

  // Unfused layers sharing one scratch (a model's): times cuBLASLt's candidate algorithms for
  // their gate_up and down GEMMs at `tokens` tokens, over all of the layers' weights, and keeps
  // the fastest for later run() calls of that many tokens (with a residual when with_residual).
  // Overwrites the scratch; synchronises the stream; not during a graph capture.
  static std::vector<GemmTuning> tune_unfused_gemms(std::span<MlpLayer* const> layers, int tokens,
                                                    bool with_residual, cudaStream_t stream);

  MlpVariant variant() const;
  MlpShape shape() const;
  int max_tokens() const;
  int launches_per_call(bool with_residual, MlpGemms gemms = MlpGemms::bf16) const;

 private:
  void run_exchanged_checks(const __nv_bfloat16* x, const __nv_bfloat16* y, int tokens) const;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepfuse
