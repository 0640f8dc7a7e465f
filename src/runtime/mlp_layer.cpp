// MlpLayer: one public entry point over the three GPU variants (see include/deepfuse/mlp.hpp).
#include <algorithm>
#include <memory>
#include <string>

#include "deepfuse/error.hpp"
#include "deepfuse/mlp.hpp"
#include "deepfuse/tensor.hpp"
#include "deepfuse/kernels/cublaslt_gemm.hpp"
#include "deepfuse/kernels/dequantize.hpp"
#include "deepfuse/kernels/gemv_packing.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/swiglu_elementwise.hpp"
#include "deepfuse/kernels/swiglu_batched.hpp"
#include "deepfuse/kernels/swiglu_fused.hpp"
#include "deepfuse/kernels/swiglu_wgmma.hpp"
#include "deepfuse/kernels/rms_norm.hpp"
#include "runtime/fp8_projection.hpp"

namespace deepfuse {

const char* mlp_variant_name(MlpVariant variant) {
  switch (variant) {
    case MlpVariant::naive: return "naive";
    case MlpVariant::unfused: return "unfused";
    case MlpVariant::fused: return "fused";
    case MlpVariant::fused_batched: return "fused_batched";
    case MlpVariant::fused_wgmma: return "fused_wgmma";
  }
  return "?";
}

MlpVariant parse_mlp_variant(const std::string& name) {
  for (MlpVariant v : {MlpVariant::naive, MlpVariant::unfused, MlpVariant::fused, MlpVariant::fused_batched,
                       MlpVariant::fused_wgmma})
    if (name == mlp_variant_name(v)) return v;
  throw Error("unknown MLP variant '" + name + "' (expected naive, unfused, fused, fused_batched or fused_wgmma)");
}

void validate_mlp_shape(const MlpShape& shape) {
  DF_CHECK(shape.hidden > 0 && shape.hidden % 64 == 0,
           "MLP hidden size " + std::to_string(shape.hidden) + " is not a positive multiple of 64");
  DF_CHECK(shape.intermediate > 0 && shape.intermediate % 64 == 0,
           "MLP intermediate size " + std::to_string(shape.intermediate) + " is not a positive multiple of 64");
}

struct MlpScratch {
  MlpVariant variant;
  MlpShape shape;
  int max_tokens;
  DeviceBuffer intermediate_a, intermediate_b, mlp_out;  // activations (mlp_out: naive only)
  DeviceBuffer normed;                                   // rms_norm(x) when the layer has a norm
  DeviceBuffer widened;  // FP8 layers: one projection widened to bf16 for a GEMM (made at their first load)
  // fp8_e4m3 layers: a GEMM's input quantized per token for the FP8 GEMMs, up to
  // [max_tokens, max(H, I)] (made at their first load)
  runtime::E4m3Activations e4m3;
  kernels::CublasLtGemm gemm;
};

std::shared_ptr<MlpScratch> make_mlp_scratch(MlpVariant variant, MlpShape shape, int max_tokens) {
  validate_mlp_shape(shape);
  DF_CHECK(variant != MlpVariant::fused && variant != MlpVariant::fused_batched && variant != MlpVariant::fused_wgmma,
           "the fused MLPs need no scratch");
  DF_CHECK(max_tokens >= 1, "MLP max_tokens must be at least 1");
  auto s = std::make_shared<MlpScratch>();
  s->variant = variant;
  s->shape = shape;
  s->max_tokens = max_tokens;
  const size_t th_bytes = static_cast<size_t>(max_tokens) * shape.hidden * sizeof(__nv_bfloat16);
  const size_t ti_bytes = static_cast<size_t>(max_tokens) * shape.intermediate * sizeof(__nv_bfloat16);
  s->normed = DeviceBuffer(th_bytes);
  // naive: gate and up outputs apart, down into mlp_out before the residual add;
  // unfused: the merged gate_up output, then silu(g)*u.
  s->intermediate_a = DeviceBuffer(variant == MlpVariant::naive ? ti_bytes : 2 * ti_bytes);
  s->intermediate_b = DeviceBuffer(ti_bytes);
  if (variant == MlpVariant::naive) s->mlp_out = DeviceBuffer(th_bytes);
  return s;
}

struct MlpLayer::Impl {
  MlpVariant variant;
  MlpShape shape;
  int max_tokens;
  // Weights in the variant's layout.
  DeviceBuffer gate, up, gate_up, down;  // naive: gate, up, down; unfused: gate_up, down; fused: gate_up, down (packed)
  DeviceBuffer norm_weight;              // naive/unfused: their norm launch's weight
  bool normalize = false;
  bool norm_folded = false;              // fused, and unfused asked to: the weight is in gate_up
  float norm_eps = 0.0f;
  std::shared_ptr<MlpScratch> scratch;   // naive/unfused
  DeviceBuffer accumulator, counters;    // fused reduction state (fused_batched: counters hold its grid barrier)
  DeviceBuffer activations;              // fused_batched, fused_wgmma: silu(g)*u of a call, [tokens, I]
  kernels::SwigluWgmmaWeights wgmma_maps;  // fused_wgmma: TMA maps of gate_up and down (made at load)
  bool wgmma_loaded = false;
  FusedMlpTuning fused_tuning;
  // FP8 (unfused only): gate_up [2I, H] and down [H, I] as e4m3, row-major (the widening for GEMMs)
  // and packed for the cluster GEMV (calls of up to kGemvResidualMaxTokens tokens), and their scales.
  WeightFormat format = WeightFormat::bf16;
  DeviceBuffer gate_up_tiles, down_tiles, gate_up_scales, down_scales;
  DeviceBuffer x_fragments;  // fused FP8: the kernel's x times the norm weight, as f16 operands

  LinearWeight fp8_gate_up() const {
    return {format, WeightLayout::row_major, gate_up.data(), gate_up_scales.as<float>(), nullptr, 2 * shape.intermediate,
            shape.hidden};
  }
  LinearWeight fp8_down() const {
    return {format, WeightLayout::row_major, down.data(), down_scales.as<float>(), nullptr, shape.hidden,
            shape.intermediate};
  }
  // rms_norm(x) * norm_weight into the scratch's normed rows, in a launch of its own.
  const __nv_bfloat16* normalized(const __nv_bfloat16* x, int tokens, cudaStream_t stream) const {
    kernels::RmsNormParams n;
    n.residual = const_cast<__nv_bfloat16*>(x);  // only read by launch_rms_norm
    n.weight = norm_weight.as<__nv_bfloat16>();
    n.out = scratch->normed.as<__nv_bfloat16>();
    n.rows = tokens;
    n.hidden = shape.hidden;
    n.eps = norm_eps;
    DF_CHECK_CUDA(kernels::launch_rms_norm(n, stream));
    return n.out;
  }
  void load_fp8(const MlpHfWeights& w, cudaStream_t stream);
  void run_fp8(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
               MlpGemms gemms, cudaStream_t stream);

  size_t hi_bytes() const { return static_cast<size_t>(shape.hidden) * shape.intermediate * sizeof(__nv_bfloat16); }

  void check_tokens(int tokens) const {
    DF_CHECK(tokens >= 1 && tokens <= max_tokens,
             "MLP tokens " + std::to_string(tokens) + " outside 1.." + std::to_string(max_tokens));
  }

  // The fields both fused kernels' params share: the packed weights, the call's rows, the folded
  // norm, the fp32 accumulator.
  template <typename Params>
  Params packed_params(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens) const {
    Params p;
    p.x = x;
    p.gate_up = gate_up.as<uint4>();
    p.down = down.as<uint4>();
    p.residual = residual;
    p.y = y;
    p.rms_normalize = normalize;
    p.norm_eps = norm_eps;
    p.accumulator = accumulator.as<float>();
    p.tokens = tokens;
    p.hidden = shape.hidden;
    p.intermediate = shape.intermediate;
    return p;
  }

  void launch_fused(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                    bool defer_sum, cudaStream_t stream, const kernels::LineExchange& exchange = {},
                    const __nv_bfloat16* x_partial = nullptr, const kernels::LineExchange& x_exchange = {}) {
    auto p = packed_params<kernels::SwigluFusedParams>(x, residual, y, tokens);
    p.counters = counters.as<unsigned>();
    p.defer_sum = defer_sum;
    p.exchange = exchange;
    p.x_partial = x_partial;
    p.x_exchange = x_exchange;
    if (format != WeightFormat::bf16) {
      p.format = format;
      p.gate_up_scales = gate_up_scales.as<float>();
      p.down_scales = down_scales.as<float>();
      p.norm_weight = normalize ? norm_weight.as<__nv_bfloat16>() : nullptr;
      p.x_fragments = x_fragments.as<uint4>();
    }
    DF_CHECK_CUDA(kernels::launch_swiglu_fused(p, fused_tuning, stream));
  }

  void launch_batched(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                      cudaStream_t stream) {
    DF_CHECK(tokens <= kernels::kSwigluBatchedMaxTokens,
             "the batched fused MLP takes at most " + std::to_string(kernels::kSwigluBatchedMaxTokens) +
                 " tokens per call, not " + std::to_string(tokens));
    auto p = packed_params<kernels::SwigluBatchedParams>(x, residual, y, tokens);
    p.activations = activations.as<__nv_bfloat16>();
    p.barrier = counters.as<unsigned>();
    DF_CHECK_CUDA(kernels::launch_swiglu_batched(p, stream));
  }

  // The batched variants' weights and scratch (act [tokens, I], fp32 sums [tokens, H] and counter
  // words, the last two zero as their kernels expect and leave them); `unsupported` is the
  // kernel's refusal of the shape.
  void allocate_batched(const std::string& unsupported, size_t accumulator_floats, size_t activation_elements,
                        size_t counter_words) {
    if (!unsupported.empty()) throw Error(unsupported);
    gate_up = DeviceBuffer(2 * hi_bytes());
    down = DeviceBuffer(hi_bytes());
    accumulator = DeviceBuffer(accumulator_floats * sizeof(float));
    activations = DeviceBuffer(activation_elements * sizeof(__nv_bfloat16));
    counters = DeviceBuffer(counter_words * sizeof(unsigned));
    accumulator.zero();
    counters.zero();
    DF_CHECK_CUDA(cudaDeviceSynchronize());
  }

  void launch_wgmma(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                    cudaStream_t stream) {
    DF_CHECK(tokens <= kernels::kSwigluWgmmaMaxTokens,
             "the Hopper MLP pair takes at most " + std::to_string(kernels::kSwigluWgmmaMaxTokens) +
                 " tokens per call, not " + std::to_string(tokens));
    DF_CHECK(wgmma_loaded, "the Hopper MLP pair runs only after load_weights");
    kernels::SwigluWgmmaParams p;
    p.x = x;
    p.weights = &wgmma_maps;
    p.residual = residual;
    p.y = y;
    p.rms_normalize = normalize;
    p.norm_eps = norm_eps;
    p.activations = activations.as<__nv_bfloat16>();
    p.accumulator = accumulator.as<float>();
    p.tile_counters = counters.as<unsigned>();
    p.tokens = tokens;
    p.hidden = shape.hidden;
    p.intermediate = shape.intermediate;
    DF_CHECK_CUDA(kernels::launch_swiglu_wgmma(p, stream));
  }
};

MlpLayer::MlpLayer(MlpVariant variant, MlpShape shape, int max_tokens, std::shared_ptr<MlpScratch> scratch)
    : impl_(std::make_unique<Impl>()) {
  validate_mlp_shape(shape);
  DF_CHECK(max_tokens >= 1, "MLP max_tokens must be at least 1");
  Impl& s = *impl_;
  s.variant = variant;
  s.shape = shape;
  s.max_tokens = max_tokens;
  switch (variant) {
    case MlpVariant::naive:
      s.gate = DeviceBuffer(s.hi_bytes());
      s.up = DeviceBuffer(s.hi_bytes());
      s.down = DeviceBuffer(s.hi_bytes());
      break;
    case MlpVariant::unfused:
      s.gate_up = DeviceBuffer(2 * s.hi_bytes());
      s.down = DeviceBuffer(s.hi_bytes());
      break;
    case MlpVariant::fused:
      s.gate_up = DeviceBuffer(2 * s.hi_bytes());
      s.down = DeviceBuffer(s.hi_bytes());
      s.accumulator = DeviceBuffer(kernels::swiglu_fused_accumulator_floats(shape.hidden, max_tokens) * sizeof(float));
      s.counters = DeviceBuffer(kernels::kSwigluFusedCounters * sizeof(unsigned));
      s.accumulator.zero();
      s.counters.zero();
      DF_CHECK_CUDA(cudaDeviceSynchronize());
      return;
    case MlpVariant::fused_batched:  // up to kSwigluBatchedMaxTokens tokens a call: its scratch no larger
      s.allocate_batched(kernels::swiglu_batched_unsupported(shape.hidden, shape.intermediate, 1, {}),
                         kernels::swiglu_batched_accumulator_floats(shape.hidden, max_tokens),
                         kernels::swiglu_batched_activation_elements(shape.intermediate, max_tokens),
                         kernels::kSwigluBatchedBarrierWords);
      return;
    case MlpVariant::fused_wgmma:  // up to kSwigluWgmmaMaxTokens tokens a call: its scratch no larger
      s.allocate_batched(kernels::swiglu_wgmma_unsupported(shape.hidden, shape.intermediate, 1, {}),
                         kernels::swiglu_wgmma_accumulator_floats(shape.hidden, max_tokens),
                         kernels::swiglu_wgmma_activation_elements(shape.intermediate, max_tokens),
                         kernels::swiglu_wgmma_counter_words(shape.hidden));
      return;
  }
  if (!scratch) scratch = make_mlp_scratch(variant, shape, max_tokens);
  DF_CHECK(scratch->variant == variant && scratch->shape.hidden == shape.hidden &&
               scratch->shape.intermediate == shape.intermediate && scratch->max_tokens >= max_tokens,
           std::string("MLP scratch made for ") + mlp_variant_name(scratch->variant) + " " +
               std::to_string(scratch->shape.hidden) + "x" + std::to_string(scratch->shape.intermediate) + " up to " +
               std::to_string(scratch->max_tokens) + " tokens cannot serve a " + mlp_variant_name(variant) + " " +
               std::to_string(shape.hidden) + "x" + std::to_string(shape.intermediate) + " layer of " +
               std::to_string(max_tokens) + " tokens");
  s.scratch = std::move(scratch);
}

MlpLayer::~MlpLayer() = default;
MlpLayer::MlpLayer(MlpLayer&&) noexcept = default;
MlpLayer& MlpLayer::operator=(MlpLayer&&) noexcept = default;

void MlpLayer::set_fused_tuning(const FusedMlpTuning& tuning) {
  DF_CHECK(tuning.cluster_size == 0 || tuning.cluster_size == 1 || tuning.cluster_size == 2 ||
               tuning.cluster_size == 4 || tuning.cluster_size == 8,
           "fused MLP cluster size must be 1, 2, 4 or 8");
  DF_CHECK(tuning.blocks_per_sm >= 0, "fused MLP blocks per SM must be >= 0");
  impl_->fused_tuning = tuning;
}

MlpVariant MlpLayer::variant() const { return impl_->variant; }
MlpShape MlpLayer::shape() const { return impl_->shape; }
int MlpLayer::max_tokens() const { return impl_->max_tokens; }

int MlpLayer::launches_per_call(bool with_residual, MlpGemms gemms) const {
  const bool with_norm = impl_->normalize && !impl_->norm_folded;
  const bool fp8 = impl_->format != WeightFormat::bf16;
  switch (impl_->variant) {
    case MlpVariant::naive: return (with_residual ? 6 : 5) + (with_norm ? 1 : 0);
    // the residual rides in the down GEMM's epilogue; FP8 decode calls: the two GEMVs and
    // silu_and_mul, or with FP8 GEMMs the norm, two quantizations, two GEMMs and silu_and_mul
    case MlpVariant::unfused:
      if (fp8 && gemms == MlpGemms::fp8) return 5 + (with_norm ? 1 : 0);
      return 3 + (with_norm && !fp8 ? 1 : 0);
    case MlpVariant::fused:
    case MlpVariant::fused_batched: return 1;
    case MlpVariant::fused_wgmma: return 2;
  }
  return 0;
}

MlpHfWeights MlpHfWeights::bf16(const void* gate, const void* up, const void* down, MlpShape shape) {
  const int H = shape.hidden, I = shape.intermediate;
  auto row_major = [](const void* data, int rows, int columns) {
    return LinearWeight{WeightFormat::bf16, WeightLayout::row_major, data, nullptr, nullptr, rows, columns};
  };
  return {row_major(gate, I, H), row_major(up, I, H), row_major(down, H, I)};
}

// FP8 weights: gate and up rows merged as for bf16, each scale array after the other (per-row
// [I] + [I], or per-block [I/128][H/128] twice: row-major either way). unfused keeps them
// row-major (the widened GEMMs) and packed for the cluster GEMV; fused packs them in its FP8
// fragment orders (per-row scales only, swiglu_fused.hpp).
void MlpLayer::Impl::load_fp8(const MlpHfWeights& w, cudaStream_t stream) {
  const int H = shape.hidden, I = shape.intermediate;
  DF_CHECK(variant == MlpVariant::unfused || (variant == MlpVariant::fused && format == WeightFormat::fp8_e4m3),
           std::string("the ") + mlp_variant_name(variant) + " MLP does not read " + weight_format_name(format) +
               " weights (the unfused MLP reads every FP8 format)");
  DF_CHECK(w.up.format == w.gate.format && w.down.format == w.gate.format,
           "MlpLayer::load_weights: gate, up and down in different formats");
  for (const LinearWeight* l : {&w.gate, &w.up, &w.down})
    DF_CHECK(!l->empty() && l->scales && !l->tensor_scale && l->layout == WeightLayout::row_major,
             "MlpLayer::load_weights: FP8 weights need row-major bytes and per-row or per-block scales");
  // gate's [I, H] (its blocks, then up's, make gate_up's scales) and down's [H, I].
  for (const auto& [rows, inner] : {std::pair{I, H}, std::pair{H, I}}) {
    const std::string unsupported = kernels::gemv_residual_unsupported(1, rows, inner, format);
    DF_CHECK(unsupported.empty(), "the FP8 MLP's GEMV " + unsupported);
  }
  const size_t elements = static_cast<size_t>(H) * I;
  auto bytes_of_scales = [&](int rows, int columns) {
    const ScaleShape shape = scale_shape(format, rows, columns);
    return shape.rows * shape.columns * sizeof(float);
  };
  const size_t scale_bytes = bytes_of_scales(I, H), down_scale_bytes = bytes_of_scales(H, I);
  gate_up = DeviceBuffer(2 * elements);
  down = DeviceBuffer(elements);
  gate_up_scales = DeviceBuffer(2 * scale_bytes);
  down_scales = DeviceBuffer(down_scale_bytes);
  auto copy = [&](void* to, const void* from, size_t bytes) {
    DF_CHECK_CUDA(cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToDevice, stream));
  };
  copy(gate_up.data(), w.gate.data, elements);
  copy(gate_up.as<char>() + elements, w.up.data, elements);
  copy(down.data(), w.down.data, elements);
  copy(gate_up_scales.data(), w.gate.scales, scale_bytes);
  copy(gate_up_scales.as<char>() + scale_bytes, w.up.scales, scale_bytes);
  copy(down_scales.data(), w.down.scales, down_scale_bytes);
  if (variant == MlpVariant::fused) {
    DF_CHECK_CUDA(kernels::pack_swiglu_gate_up_fp8(static_cast<const uint8_t*>(w.gate.data),
                                                   static_cast<const uint8_t*>(w.up.data), gate_up.as<uint4>(), H, I,
                                                   stream));
    DF_CHECK_CUDA(kernels::pack_swiglu_down_fp8(static_cast<const uint8_t*>(w.down.data), down.as<uint4>(), H, I, stream));
    x_fragments = DeviceBuffer(kernels::swiglu_fused_x_fragments_bytes(H));  // each call writes what it reads
    return;
  }
  gate_up_tiles = DeviceBuffer(2 * elements);
  down_tiles = DeviceBuffer(elements);
  DF_CHECK_CUDA(kernels::pack_rows_fragments_fp8(gate_up.as<uint8_t>(), gate_up_tiles.as<uint4>(), 2 * I, H, stream));
  DF_CHECK_CUDA(kernels::pack_rows_fragments_fp8(down.as<uint8_t>(), down_tiles.as<uint4>(), H, I, stream));
  if (scratch->widened.empty()) scratch->widened = DeviceBuffer(2 * elements * sizeof(__nv_bfloat16));
  if (format == WeightFormat::fp8_e4m3 && scratch->e4m3.empty())
    scratch->e4m3 = runtime::E4m3Activations(static_cast<size_t>(scratch->max_tokens), static_cast<size_t>(std::max(H, I)));
}

// Up to kGemvResidualMaxTokens tokens: the cluster GEMV over the packed e4m3 (the norm applied to
// x as it is staged), silu_and_mul, the GEMV with the residual: three launches reading the FP8
// bytes once. More tokens: FP8 tensor-core GEMMs on per-token e4m3 activations (MlpGemms::fp8),
// or each projection widened to bf16, then the bf16 GEMM (docs/kernels/fp8.md).
void MlpLayer::Impl::run_fp8(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                             MlpGemms gemms, cudaStream_t stream) {
  const int H = shape.hidden, I = shape.intermediate;
  auto* a = scratch->intermediate_a.as<__nv_bfloat16>();
  auto* b = scratch->intermediate_b.as<__nv_bfloat16>();
  if (tokens <= kernels::kGemvResidualMaxTokens) {
    kernels::GemvResidualParams up;
    up.x = x;
    up.weights = gate_up_tiles.as<uint4>();
    up.format = format;
    up.scales = gate_up_scales.as<float>();
    up.norm_weight = normalize ? norm_weight.as<__nv_bfloat16>() : nullptr;
    up.norm_eps = norm_eps;
    up.y = a;
    up.tokens = tokens;
    up.rows = 2 * I;
    up.inner = H;
    DF_CHECK_CUDA(kernels::launch_gemv_residual(up, stream));
    DF_CHECK_CUDA(kernels::silu_and_mul(a, b, tokens, I, stream, {}));
    kernels::GemvResidualParams down_params = up;
    down_params.x = b;
    down_params.weights = down_tiles.as<uint4>();
    down_params.scales = down_scales.as<float>();
    down_params.norm_weight = nullptr;
    down_params.residual = residual;
    down_params.y = y;
    down_params.rows = H;
    down_params.inner = I;
    DF_CHECK_CUDA(kernels::launch_gemv_residual(down_params, stream));
    return;
  }
  if (normalize) x = normalized(x, tokens, stream);
  if (gemms == MlpGemms::fp8) {
    DF_CHECK(format == WeightFormat::fp8_e4m3, std::string("the MLP's FP8 GEMMs need fp8_e4m3 weights, not ") +
                                                   weight_format_name(format));
    scratch->e4m3.project(scratch->gemm, x, fp8_gate_up(), nullptr, nullptr, a, tokens, "the MLP's gate_up GEMM", stream);
    DF_CHECK_CUDA(kernels::silu_and_mul(a, b, tokens, I, stream, {}));
    scratch->e4m3.project(scratch->gemm, b, fp8_down(), nullptr, residual, y, tokens, "the MLP's down GEMM", stream);
    return;
  }
  auto* widened = scratch->widened.as<__nv_bfloat16>();
  DF_CHECK_CUDA(kernels::launch_dequantize_to_bf16(fp8_gate_up(), widened, stream));
  scratch->gemm.run(x, widened, nullptr, a, tokens, 2 * I, H, stream);
  DF_CHECK_CUDA(kernels::silu_and_mul(a, b, tokens, I, stream, {}));
  DF_CHECK_CUDA(kernels::launch_dequantize_to_bf16(fp8_down(), widened, stream));
  scratch->gemm.run(b, widened, residual, y, tokens, H, I, stream);
}

void MlpLayer::load_weights(const MlpHfWeights& w, cudaStream_t stream, const MlpNorm& norm) {
  Impl& s = *impl_;
  const size_t bytes = s.hi_bytes();
  const int H = s.shape.hidden, I = s.shape.intermediate;
  DF_CHECK(w.gate.rows == I && w.gate.columns == H && w.up.rows == I && w.up.columns == H && w.down.rows == H &&
               w.down.columns == I,
           "MlpLayer::load_weights: weights shaped for another MLP than H " + std::to_string(H) + ", I " +
               std::to_string(I));
  s.format = w.gate.format;
  if (s.format != WeightFormat::bf16) {
    DF_CHECK(!norm.fold_into_weights || format_info(s.format).folds_norm || s.variant == MlpVariant::unfused,
             "only the unfused MLP takes MlpNorm::fold_into_weights");
    s.normalize = norm.weight != nullptr;
    s.norm_folded = false;  // FP8 applies the norm weight to x as staged (docs/design.md, "Weight formats")
    s.norm_eps = norm.eps;
    if (s.normalize) {
      s.norm_weight = DeviceBuffer(static_cast<size_t>(H) * sizeof(__nv_bfloat16));
      DF_CHECK_CUDA(cudaMemcpyAsync(s.norm_weight.data(), norm.weight, s.norm_weight.bytes(), cudaMemcpyDeviceToDevice,
                                    stream));
    }
    s.load_fp8(w, stream);
    return;
  }
  // Every variant packs bf16 (the dispatch refuses other formats and null pointers here).
  const __nv_bfloat16* gate = w.gate.bf16("packing the MLP's gate_proj");
  const __nv_bfloat16* up = w.up.bf16("packing the MLP's up_proj");
  const __nv_bfloat16* down = w.down.bf16("packing the MLP's down_proj");
  DF_CHECK(!norm.fold_into_weights || s.variant == MlpVariant::unfused,
           std::string("only the unfused MLP takes MlpNorm::fold_into_weights, not ") + mlp_variant_name(s.variant));
  s.normalize = norm.weight != nullptr;
  // Folded only in a format that folds norms (bf16); the others apply the weight to x as they
  // stage it (docs/design.md, "Weight formats").
  s.norm_folded = s.normalize && format_info(w.gate.format).folds_norm &&
                  (s.variant == MlpVariant::fused || s.variant == MlpVariant::fused_batched ||
                   s.variant == MlpVariant::fused_wgmma || norm.fold_into_weights);
  s.norm_eps = norm.eps;
  if (s.normalize && !s.norm_folded) {
    s.norm_weight = DeviceBuffer(static_cast<size_t>(H) * sizeof(__nv_bfloat16));
    DF_CHECK_CUDA(cudaMemcpyAsync(s.norm_weight.data(), norm.weight, s.norm_weight.bytes(), cudaMemcpyDeviceToDevice, stream));
  }
  switch (s.variant) {
    case MlpVariant::naive:
      DF_CHECK_CUDA(cudaMemcpyAsync(s.gate.data(), gate, bytes, cudaMemcpyDeviceToDevice, stream));
      DF_CHECK_CUDA(cudaMemcpyAsync(s.up.data(), up, bytes, cudaMemcpyDeviceToDevice, stream));
      DF_CHECK_CUDA(cudaMemcpyAsync(s.down.data(), down, bytes, cudaMemcpyDeviceToDevice, stream));
      break;
    case MlpVariant::unfused:
    case MlpVariant::fused_wgmma:  // the same row-major copy, its tensor maps made below
      DF_CHECK_CUDA(cudaMemcpyAsync(s.gate_up.data(), gate, bytes, cudaMemcpyDeviceToDevice, stream));
      DF_CHECK_CUDA(cudaMemcpyAsync(s.gate_up.as<char>() + bytes, up, bytes, cudaMemcpyDeviceToDevice, stream));
      DF_CHECK_CUDA(cudaMemcpyAsync(s.down.data(), down, bytes, cudaMemcpyDeviceToDevice, stream));
      if (s.norm_folded)
        DF_CHECK_CUDA(kernels::launch_fold_norm_weight(s.gate_up.as<__nv_bfloat16>(), 2 * I, H, norm.weight, stream));
      if (s.variant == MlpVariant::fused_wgmma) {
        DF_CHECK_CUDA(kernels::make_swiglu_wgmma_weights(s.gate_up.as<__nv_bfloat16>(), s.down.as<__nv_bfloat16>(), H,
                                                         I, s.wgmma_maps));
        s.wgmma_loaded = true;
      }
      break;
    case MlpVariant::fused:
    case MlpVariant::fused_batched:
      DF_CHECK_CUDA(kernels::pack_swiglu_gate_up(gate, up, norm.weight, s.gate_up.as<uint4>(), H, I, stream));
      DF_CHECK_CUDA(kernels::pack_swiglu_down(down, s.down.as<uint4>(), H, I, stream));
      break;
  }
}

void MlpLayer::run(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                   cudaStream_t stream, MlpGemms gemms) {
  Impl& s = *impl_;
  s.check_tokens(tokens);
  DF_CHECK(x && y, "MLP input or output pointer is null");
  DF_CHECK(s.normalize || static_cast<const void*>(x) != static_cast<const void*>(y),
           "MLP output must not alias its input");
  const int H = s.shape.hidden, I = s.shape.intermediate;
  if (s.variant == MlpVariant::fused) {
    s.launch_fused(x, residual, y, tokens, false, stream);
    return;
  }
  if (s.variant == MlpVariant::fused_batched) {
    s.launch_batched(x, residual, y, tokens, stream);
    return;
  }
  if (s.variant == MlpVariant::fused_wgmma) {
    s.launch_wgmma(x, residual, y, tokens, stream);
    return;
  }
  if (s.format != WeightFormat::bf16) {
    s.run_fp8(x, residual, y, tokens, gemms, stream);
    return;
  }
  MlpScratch& scratch = *s.scratch;
  kernels::FoldedRmsNorm folded_norm;  // applied by silu_and_mul
  if (s.norm_folded) folded_norm = {x, H, s.norm_eps};
  if (s.normalize && !s.norm_folded) x = s.normalized(x, tokens, stream);  // the baselines' own norm launch
  const size_t ti = static_cast<size_t>(tokens) * I;
  auto* a = scratch.intermediate_a.as<__nv_bfloat16>();
  auto* b = scratch.intermediate_b.as<__nv_bfloat16>();
  kernels::CublasLtGemm& gemm = scratch.gemm;
  if (s.variant == MlpVariant::naive) {
    gemm.run(x, s.gate.as<__nv_bfloat16>(), nullptr, a, tokens, I, H, stream);
    gemm.run(x, s.up.as<__nv_bfloat16>(), nullptr, b, tokens, I, H, stream);
    DF_CHECK_CUDA(kernels::silu_inplace(a, ti, stream));
    DF_CHECK_CUDA(kernels::multiply(a, b, a, ti, stream));
    if (residual) {
      auto* out = scratch.mlp_out.as<__nv_bfloat16>();
      gemm.run(a, s.down.as<__nv_bfloat16>(), nullptr, out, tokens, H, I, stream);
      DF_CHECK_CUDA(kernels::add(out, residual, y, static_cast<size_t>(tokens) * H, stream));
    } else {
      gemm.run(a, s.down.as<__nv_bfloat16>(), nullptr, y, tokens, H, I, stream);
    }
    return;
  }
  gemm.run(x, s.gate_up.as<__nv_bfloat16>(), nullptr, a, tokens, 2 * I, H, stream);
  DF_CHECK_CUDA(kernels::silu_and_mul(a, b, tokens, I, stream, folded_norm));
  gemm.run(b, s.down.as<__nv_bfloat16>(), residual, y, tokens, H, I, stream);
}

void MlpLayer::run_exchanged_checks(const __nv_bfloat16* x, const __nv_bfloat16* y, int tokens) const {
  const Impl& s = *impl_;
  s.check_tokens(tokens);
  DF_CHECK(s.variant == MlpVariant::fused, "only the fused MLP exchanges its output over the ranks itself");
  DF_CHECK(x && y, "MLP input or output pointer is null");
  DF_CHECK(s.normalize || static_cast<const void*>(x) != static_cast<const void*>(y),
           "MLP output must not alias its input");
}

void MlpLayer::run_exchanged(const __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                             const kernels::LineExchange& exchange, cudaStream_t stream) {
  run_exchanged_checks(x, y, tokens);
  impl_->launch_fused(x, residual, y, tokens, false, stream, exchange);
}

void MlpLayer::run_summed_exchanged(const __nv_bfloat16* x_partial, const kernels::LineExchange& x_exchange,
                                    __nv_bfloat16* x, const __nv_bfloat16* residual, __nv_bfloat16* y, int tokens,
                                    const kernels::LineExchange& exchange, cudaStream_t stream) {
  DF_CHECK(x_partial && x_exchange.active(), "the MLP's input sum needs this rank's partial and a line exchange");
  DF_CHECK(static_cast<const void*>(x_partial) != static_cast<const void*>(x), "the MLP's input partial must not alias x");
  run_exchanged_checks(x, y, tokens);
  impl_->launch_fused(x, residual, y, tokens, false, stream, exchange, x_partial, x_exchange);
}

std::vector<GemmTuning> MlpLayer::tune_unfused_gemms(std::span<MlpLayer* const> layers, int tokens,
                                                     bool with_residual, cudaStream_t stream) {
  DF_CHECK(!layers.empty(), "no MLP layers to tune");
  const Impl& first = *layers.front()->impl_;
  first.check_tokens(tokens);
  // FP8 layers run their own GEMVs up to kGemvResidualMaxTokens tokens and cuBLASLt's default
  // algorithm on the widened weights beyond (not tuned yet).
  if (first.format != WeightFormat::bf16) return {};
  std::vector<const __nv_bfloat16*> gate_up, down;
  for (const MlpLayer* layer : layers) {
    const Impl& s = *layer->impl_;
    DF_CHECK(s.variant == MlpVariant::unfused && s.scratch == first.scratch,
             "tuned MLP layers must be unfused and share one scratch");
    gate_up.push_back(s.gate_up.as<__nv_bfloat16>());
    down.push_back(s.down.as<__nv_bfloat16>());
  }
  MlpScratch& scratch = *first.scratch;
  const int H = first.shape.hidden, I = first.shape.intermediate;
  // Scratch operands as run() uses them: x and the residual from the normalised-copy buffer.
  auto* x = scratch.normed.as<__nv_bfloat16>();
  kernels::CublasLtGemm::Operands up_op{tokens, 2 * I, H, x, nullptr, nullptr, scratch.intermediate_a.data()};
  kernels::CublasLtGemm::Operands down_op{tokens, H, I, scratch.intermediate_b.as<__nv_bfloat16>(), nullptr,
                                          with_residual ? x : nullptr, x};
  return {scratch.gemm.tune("mlp gate_up", up_op, gate_up, stream),
          scratch.gemm.tune("mlp down", down_op, down, stream)};
}

float* MlpLayer::run_deferred(const __nv_bfloat16* x, int tokens, cudaStream_t stream) {
  Impl& s = *impl_;
  DF_CHECK(s.variant == MlpVariant::fused, "only the fused MLP can leave its sum for the next kernels");
  s.check_tokens(tokens);
  DF_CHECK(x, "MLP input pointer is null");
  s.launch_fused(x, nullptr, nullptr, tokens, true, stream);
  return s.accumulator.as<float>();
}

}  // namespace deepfuse
