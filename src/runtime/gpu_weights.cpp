#include "runtime/gpu_weights.hpp"

#include <cstdio>
#include <string>
#include <utility>

#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/rope.hpp"
#include "deepfuse/kernels/gemv_packing.hpp"
#include "deepfuse/kernels/folded_norm.hpp"
#include "runtime/weight_sources.hpp"

namespace deepfuse::runtime {

namespace {

// Norms, biases and the embedding are bf16 in every format.
size_t bf16_bytes(size_t elements) { return elements * sizeof(__nv_bfloat16); }

// A linear weight's elements in `format`, without its scales.
size_t element_bytes(WeightFormat format, size_t elements) { return elements * format_info(format).element_bytes; }

// fp32 scales of a [rows, columns] weight in `format`.
size_t scale_count(WeightFormat format, size_t rows, size_t columns) {
  const ScaleShape shape = scale_shape(format, rows, columns);
  return shape.rows * shape.columns;
}

// The format `spec` (of block `layer`) loads in: its stored one, or --quantize's (model_weights.hpp).
WeightFormat format_of(const TensorSpec& spec, int layer, const ModelConfig& model, const WeightLoadOptions& load) {
  return loaded_weight_format(model, {tensor_name(spec, layer), tensor_shape(spec, model), &spec, layer}, load);
}

MlpShape mlp_shape(const ModelConfig& c) { return {c.hidden_size, c.intermediate_size}; }

// The MLP's groups are staged in Hugging Face layout, then packed into its variants' layouts.
bool is_mlp(TensorGroup group) {
  return group == TensorGroup::gate || group == TensorGroup::up || group == TensorGroup::down;
}

// The groups the cluster GEMV stream reads fragment-packed, when the plan runs its kernel.
bool packed_in(TensorGroup group, const WeightLayouts& layouts) {
  return (group == TensorGroup::qkv && layouts.front_packed) || (group == TensorGroup::o_proj && layouts.o_proj_packed);
}

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

// The MLP normalises its input with the layer's post-attention RMSNorm (uploaded before the MLP);
// the unfused MLP folds it into its weights as the fused one does (docs/runtime.md, "Norms folded
// into the unfused paths' weights").
MlpNorm post_attention_norm(const GpuLayerWeights& layer, const ModelConfig& config, MlpVariant variant) {
  const bool folds = format_info(layer.formats[TensorGroup::gate]).folds_norm;
  return {layer.vector(TensorGroup::post_attention_norm), static_cast<float>(config.rms_norm_eps),
          variant == MlpVariant::unfused && folds};
}

// After a layer's attention weights are uploaded: the decode kernels' fragment-packed copies (from
// the plain qkv and o_proj) the plan runs, then the input norm's weight folded into the row-major
// qkv the unfused front and prefill read (bf16 only: docs/design.md, "Weight formats").
void prepare_attention_weights(GpuLayerWeights& layer, const ModelConfig& config, const WeightLayouts& layouts,
                               cudaStream_t stream) {
  const LinearWeight qkv = layer.linear(TensorGroup::qkv, WeightLayout::row_major, config);
  const LinearWeight o_proj = layer.linear(TensorGroup::o_proj, WeightLayout::row_major, config);
  // The packed copy: the same elements (its scales are the row-major copy's, LinearWeight::scales).
  auto pack = [&](const LinearWeight& weight, const char* who) {
    DeviceBuffer packed(element_bytes(weight.format, static_cast<size_t>(weight.rows) * weight.columns));
    if (weight.format == WeightFormat::bf16)
      DF_CHECK_CUDA(kernels::pack_rows_fragments(weight.bf16(who), packed.as<uint4>(), weight.rows, weight.columns, stream));
    else
      DF_CHECK_CUDA(kernels::pack_rows_fragments_fp8(weight.e4m3(who), packed.as<uint4>(), weight.rows, weight.columns,
                                                     stream));
    return packed;
  };
  if (packed_in(TensorGroup::qkv, layouts)) layer.fragments[TensorGroup::qkv] = pack(qkv, "packing the QKV fragments");
  if (packed_in(TensorGroup::o_proj, layouts))
    layer.fragments[TensorGroup::o_proj] = pack(o_proj, "packing the o_proj fragments");
  // A format that does not fold norms applies the weight to x as its kernels stage it instead.
  if (format_info(qkv.format).folds_norm)
    DF_CHECK_CUDA(kernels::launch_fold_norm_weight(layer.row_major[TensorGroup::qkv].as<__nv_bfloat16>(), qkv.rows,
                                                   qkv.columns, layer.vector(TensorGroup::input_norm), stream));
}

// One layer's gate, up and down in Hugging Face layout, in their formats with their scales: what
// MlpLayer::load_weights copies or packs from. Reused by every layer (stream order keeps a layer's
// packing ahead of the next layer's uploads; a layer in another format reallocates it).
struct MlpStaging {
  GroupFormats formats{};
  GroupBuffers groups;
  GroupBuffers scales;

  MlpHfWeights view(const ModelConfig& config) const {
    auto weight = [&](TensorGroup group) {
      return LinearWeight{formats[group], WeightLayout::row_major, groups[group].data(), scales[group].as<float>(),
                          nullptr, static_cast<int>(group_rows(group, config)),
                          static_cast<int>(group_columns(group, config))};
    };
    return {weight(TensorGroup::gate), weight(TensorGroup::up), weight(TensorGroup::down)};
  }
};

// What loading needs on the device besides the weights: one layer's MLP staged in Hugging Face
// layout (MlpStaging) while it is packed, in the blocks' format.
size_t staging_bytes(const ModelConfig& config, const WeightLoadOptions& load) {
  const WeightFormat format = block_weight_format(config, load);
  size_t bytes = 0;
  for (TensorGroup group : {TensorGroup::gate, TensorGroup::up, TensorGroup::down})
    bytes += linear_weight_bytes(format, static_cast<size_t>(group_rows(group, config)),
                                 static_cast<size_t>(group_columns(group, config)));
  return bytes;
}

// The layer's MLP in each layout the plan runs, from the staged Hugging Face tensors,
// stream-ordered. The unfused layers share one scratch: layers run one after another.
class MlpBuilder {
 public:
  MlpBuilder(const ModelConfig& config, const WeightLayouts& layouts) : config_(config), layouts_(layouts) {
    if (layouts.mlp_unfused) scratch_ = make_mlp_scratch(MlpVariant::unfused, mlp_shape(config), layouts.max_tokens);
  }
  void build(GpuLayerWeights& layer, const MlpStaging& staging, cudaStream_t stream) const {
    const MlpShape shape = mlp_shape(config_);
    if (layouts_.mlp_fused) {
      layer.mlp_fused = std::make_unique<MlpLayer>(MlpVariant::fused, shape, layouts_.max_tokens);
      layer.mlp_fused->set_fused_tuning({.programmatic_launch = true});
      layer.mlp_fused->load_weights(staging.view(config_), stream, post_attention_norm(layer, config_, MlpVariant::fused));
    }
    if (layouts_.mlp_unfused) {
      layer.mlp_unfused = std::make_unique<MlpLayer>(MlpVariant::unfused, shape, layouts_.max_tokens, scratch_);
      layer.mlp_unfused->load_weights(staging.view(config_), stream, post_attention_norm(layer, config_, MlpVariant::unfused));
    }
    if (layouts_.mlp_fused_batched) {
      layer.mlp_fused_batched = std::make_unique<MlpLayer>(MlpVariant::fused_batched, shape, layouts_.max_tokens);
      layer.mlp_fused_batched->load_weights(staging.view(config_), stream,
                                            post_attention_norm(layer, config_, MlpVariant::fused_batched));
    }
    if (layouts_.mlp_fused_wgmma) {
      layer.mlp_fused_wgmma = std::make_unique<MlpLayer>(MlpVariant::fused_wgmma, shape, layouts_.max_tokens);
      layer.mlp_fused_wgmma->load_weights(staging.view(config_), stream,
                                          post_attention_norm(layer, config_, MlpVariant::fused_wgmma));
    }
  }

 private:
  const ModelConfig& config_;
  WeightLayouts layouts_;
  std::shared_ptr<MlpScratch> scratch_;
};

DeviceBuffer rope_table(const ModelConfig& config) {
  const std::vector<double> inv_freq = rope_inverse_frequencies(config.rope);
  DF_CHECK(static_cast<int>(inv_freq.size()) * 2 == config.head_dim,
           "rope head_dim " + std::to_string(config.rope.head_dim) + " differs from the model's head_dim " +
               std::to_string(config.head_dim));
  return DeviceBuffer::from_host(std::vector<float>(inv_freq.begin(), inv_freq.end()));
}

// The one walk over the model table that builds the weights: each tensor the config asks for,
// this rank's slice of it (dist::slice_of) at its rows in its group's matrix, from `source`; each
// block's groups then packed into the layouts the plan runs. `model` is the whole model's config.
GpuWeights build_weights(const ModelConfig& model, const WeightLayouts& layouts, const dist::RankShard& shard,
                         TensorSource& source, cudaStream_t stream) {
  const ModelConfig config = dist::rank_config(model, shard);
  MlpStaging staging;
  const MlpBuilder mlp_builder(config, layouts);
  // A buffer of `bytes`: allocated for the group's first tensor, or reallocated where a staged
  // MLP group changes format (after the queued packing that reads it).
  auto hold = [&](DeviceBuffer& buffer, size_t bytes) {
    if (buffer.bytes() == bytes) return;
    if (!buffer.empty()) DF_CHECK_CUDA(cudaStreamSynchronize(stream));
    buffer = DeviceBuffer(bytes);
  };
  auto fill = [&](TensorScope scope, int layer, GroupFormats& formats, GroupBuffers& groups, GroupBuffers& scales,
                  MlpStaging* staged) {
    for (const TensorSpec* spec : tensors_in(scope)) {
      if (!spec->present(model)) continue;
      const TensorGroup group = spec->group;
      const bool in_staging = staged && is_mlp(group);
      GroupFormats& group_formats = in_staging ? staged->formats : formats;
      const WeightFormat format = format_of(*spec, layer, model, layouts.load);
      const int64_t first_row = row_in_group(*spec, config);
      if (first_row == 0) group_formats[group] = format;
      DF_CHECK(group_formats[group] == format,
               tensor_name(*spec, layer) + " loads as " + weight_format_name(format) + " but the tensors before it in " +
                   "its matrix on the GPU (q, k and v make one) as " + weight_format_name(group_formats[group]) +
                   ": they must share a format (quantization_config's ignore list)");
      const size_t rows = static_cast<size_t>(group_rows(group, config)), columns = static_cast<size_t>(group_columns(group, config));
      DeviceBuffer& destination = in_staging ? staged->groups[group] : groups[group];
      const bool made_below = group == TensorGroup::lm_head && shard.split();  // padded to vocab_rows
      if (first_row == 0 && !made_below) hold(destination, element_bytes(format, rows * columns));
      const dist::TensorSlice slice = dist::slice_of(*spec, model, shard);
      SliceTarget target{format, &destination, static_cast<size_t>(first_row) * slice.columns};
      DF_CHECK(element_bytes(format, target.offset + slice.elements()) <= destination.bytes(),
               "internal: " + tensor_name(*spec, layer) + "'s slice overruns its group on the device");
      if (format_info(format).scales != ScaleGranularity::none) {
        target.scales = in_staging ? &staged->scales[group] : &scales[group];
        if (first_row == 0 && !made_below) hold(*target.scales, scale_count(format, rows, columns) * sizeof(float));
        target.scale_offset = scale_count(format, static_cast<size_t>(first_row), columns);
      }
      if (slice.elements() > 0) source.fill(*spec, layer, slice, target);
    }
  };

  GpuWeights w;
  fill(TensorScope::input, 0, w.formats, w.groups, w.scales, nullptr);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    GpuLayerWeights layer;
    fill(TensorScope::layer, l, layer.formats, layer.row_major, layer.scales, &staging);
    for (TensorGroup group : {TensorGroup::gate, TensorGroup::up, TensorGroup::down})
      layer.formats[group] = staging.formats[group];
    for (TensorGroup group : {TensorGroup::qkv, TensorGroup::o_proj, TensorGroup::gate, TensorGroup::up, TensorGroup::down})
      if (layer.format == WeightFormat::bf16) layer.format = layer.formats[group];
    mlp_builder.build(layer, staging, stream);
    prepare_attention_weights(layer, config, layouts, stream);
    w.layers.push_back(std::move(layer));
  }
  DeviceBuffer& lm_head = w.groups[TensorGroup::lm_head];
  if (shard.split()) {
    // Every rank's slice is vocab_rows long; rows past the vocabulary (the last slice's padding)
    // score 0 (zero bytes, and zero scales in a format with scales). A tied model's slice is the
    // embedding's rows (the table is replicated, bf16).
    const TensorSpec& spec = tensor_spec(TensorRole::lm_head);
    const WeightFormat format = config.tie_word_embeddings ? WeightFormat::bf16 : format_of(spec, 0, model, layouts.load);
    const size_t rows = static_cast<size_t>(shard.vocab_rows);
    lm_head = DeviceBuffer(element_bytes(format, rows * config.hidden_size));
    lm_head.zero(stream);
    if (format_info(format).scales != ScaleGranularity::none) {
      DeviceBuffer& scales = w.scales[TensorGroup::lm_head];
      scales = DeviceBuffer(scale_count(format, rows, static_cast<size_t>(config.hidden_size)) * sizeof(float));
      scales.zero(stream);
    }
    if (config.tie_word_embeddings && shard.vocab_real > 0)
      DF_CHECK_CUDA(cudaMemcpyAsync(lm_head.data(), w.embedding() + static_cast<size_t>(shard.vocab_begin) * config.hidden_size,
                                    bf16_bytes(static_cast<size_t>(shard.vocab_real) * config.hidden_size),
                                    cudaMemcpyDeviceToDevice, stream));
  }
  fill(TensorScope::output, 0, w.formats, w.groups, w.scales, nullptr);
  w.rope_inv_freq = rope_table(config);
  source.finish();
  return w;
}

}  // namespace

WeightLayouts WeightLayouts::of(const DecodePlan& plan, int max_tokens, const WeightLoadOptions& load) {
  return {plan.uses(MlpChoice::fused), plan.uses(MlpChoice::unfused), plan.uses(FrontChoice::fused),
          plan.uses(OProjChoice::gemv), max_tokens, load, plan.uses(MlpChoice::fused_batched),
          plan.uses(MlpChoice::fused_wgmma)};
}

MlpLayer& GpuLayerWeights::mlp(MlpChoice choice) const {
  const std::unique_ptr<MlpLayer>& layer = choice == MlpChoice::fused           ? mlp_fused
                                           : choice == MlpChoice::fused_batched ? mlp_fused_batched
                                           : choice == MlpChoice::fused_wgmma   ? mlp_fused_wgmma
                                                                                : mlp_unfused;
  DF_CHECK(layer != nullptr, std::string("the weights hold no ") + choice_name(choice) + " MLP layout for this step");
  return *layer;
}

LinearWeight GpuLayerWeights::linear(TensorGroup group, WeightLayout layout, const ModelConfig& config) const {
  const DeviceBuffer& buffer = layout == WeightLayout::fragments ? fragments[group] : row_major[group];
  return {formats[group], layout, buffer.data(), scales[group].as<float>(), nullptr,
          static_cast<int>(group_rows(group, config)), static_cast<int>(group_columns(group, config))};
}

const __nv_bfloat16* GpuLayerWeights::vector(TensorGroup group) const { return row_major[group].as<__nv_bfloat16>(); }

const __nv_bfloat16* GpuWeights::embedding() const { return groups[TensorGroup::embed_tokens].as<__nv_bfloat16>(); }

const __nv_bfloat16* GpuWeights::vector(TensorGroup group) const { return groups[group].as<__nv_bfloat16>(); }

LinearWeight GpuWeights::lm_head(int rows, int hidden) const {
  const DeviceBuffer& head = groups[TensorGroup::lm_head];
  if (head.empty())  // tied on one GPU: the embedding table
    return {WeightFormat::bf16, WeightLayout::row_major, embedding(), nullptr, nullptr, rows, hidden};
  return {formats[TensorGroup::lm_head], WeightLayout::row_major, head.data(),
          scales[TensorGroup::lm_head].as<float>(), nullptr, rows, hidden};
}

std::vector<const __nv_bfloat16*> GpuWeights::layer_operands(TensorGroup group, const ModelConfig& config,
                                                             const char* who) const {
  std::vector<const __nv_bfloat16*> operands;
  for (const GpuLayerWeights& layer : layers)
    operands.push_back(layer.linear(group, WeightLayout::row_major, config).bf16(who));
  return operands;
}

namespace {

// Copies of an MLP weight's elements the layouts hold (held) or a decode step reads: the fused
// layout one (bf16 only); the unfused one, in FP8 the row-major bytes its widened GEMMs read and
// the packed ones its GEMVs read (MlpLayer's load_fp8), of which a step reads one.
size_t mlp_copies(const WeightLayouts& layouts, WeightFormat format, bool held) {
  const size_t unfused = format != WeightFormat::bf16 && held ? 2 : 1;
  return (layouts.mlp_fused ? 1 : 0) + (layouts.mlp_unfused ? unfused : 0) + (layouts.mlp_fused_batched ? 1 : 0) +
         (layouts.mlp_fused_wgmma ? 1 : 0);
}

size_t weight_bytes(const ModelConfig& c, const WeightLayouts& layouts, const dist::RankShard& shard, bool held) {
  // One weight of [rows, columns] in its format, its elements `copies` times with its scales once
  // a layout (the packed copy of qkv and o_proj shares the row-major one's scales, MLP layouts
  // hold their own).
  auto bytes = [&](const TensorSpec& spec, int layer, size_t rows, bool mlp) {
    const size_t columns = static_cast<size_t>(extent_size(spec.columns, c));
    const WeightFormat format = format_of(spec, layer, c, layouts.load);
    const size_t scales = scale_count(format, rows, columns) * sizeof(float);
    const size_t elements = element_bytes(format, rows * columns);
    if (!mlp) return (1 + (held && packed_in(spec.group, layouts) ? 1 : 0)) * elements + scales;
    const size_t layouts_held =
        (layouts.mlp_fused ? 1 : 0) + (layouts.mlp_unfused ? 1 : 0) + (layouts.mlp_fused_batched ? 1 : 0) +
        (layouts.mlp_fused_wgmma ? 1 : 0);
    return mlp_copies(layouts, format, held) * elements + (held ? layouts_held : 1) * scales;
  };
  size_t total = 0;
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    for (const TensorSpec* spec : tensors_in(TensorScope::layer)) {
      if (!spec->present(c)) continue;
      total += bytes(*spec, l, static_cast<size_t>(extent_size(spec->rows, c)), is_mlp(spec->group));
    }
  }
  // A split model keeps its lm_head slice apart from the replicated embedding, tied or not (a tied
  // one's is bf16, the embedding's rows).
  const TensorSpec& lm_head = tensor_spec(TensorRole::lm_head);
  if (shard.split())
    total += c.tie_word_embeddings ? bf16_bytes(static_cast<size_t>(shard.vocab_rows) * c.hidden_size)
                                   : bytes(lm_head, 0, static_cast<size_t>(shard.vocab_rows), false);
  else if (!c.tie_word_embeddings)
    total += bytes(lm_head, 0, static_cast<size_t>(c.vocab_size), false);
  return total + bf16_bytes(static_cast<size_t>(c.vocab_size) * c.hidden_size + c.hidden_size);  // embedding, final norm
}

}  // namespace

size_t gpu_weight_bytes(const ModelConfig& c, const WeightLayouts& layouts, const dist::RankShard& shard) {
  return weight_bytes(c, layouts, shard, /*held=*/true);
}

size_t decode_weight_bytes(const ModelConfig& c, const dist::RankShard& shard, const WeightLoadOptions& load) {
  const size_t embedding = bf16_bytes(static_cast<size_t>(c.vocab_size) * c.hidden_size);
  const WeightLayouts one_of_each{.mlp_fused = false, .mlp_unfused = true, .front_packed = false, .o_proj_packed = false,
                                  .load = load};
  const bool embedding_is_lm_head = c.tie_word_embeddings && !shard.split();
  return weight_bytes(c, one_of_each, shard, /*held=*/false) - (embedding_is_lm_head ? 0 : embedding);
}

bool fits_with_kv(const ModelConfig& config, const WeightLayouts& layouts, size_t free_bytes, size_t kv_reserve_bytes,
                  const dist::RankShard& shard) {
  return gpu_weight_bytes(config, layouts, shard) + staging_bytes(config, layouts.load) + kv_reserve_bytes <= free_bytes;
}

void check_weights_fit(const ModelConfig& config, const WeightLayouts& layouts, const std::string& what,
                       const dist::RankShard& shard) {
  size_t free_bytes = 0, total_bytes = 0;
  DF_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t weights = gpu_weight_bytes(config, layouts, shard);
  const size_t staging = staging_bytes(config, layouts.load);
  if (weights + staging > free_bytes) {
    int device = 0;
    DF_CHECK_CUDA(cudaGetDevice(&device));
    throw Error(what + ": the weights need " + std::to_string(weights) + " bytes (" + gib(weights) + ") plus " +
                std::to_string(staging) + " bytes of load staging, but only " + std::to_string(free_bytes) +
                " bytes (" + gib(free_bytes) + ") of GPU memory are free on device " + std::to_string(device));
  }
}

GpuWeights load_checkpoint_weights(const Checkpoint& checkpoint, const ModelConfig& model,
                                   const WeightLayouts& layouts, cudaStream_t stream, const LoadProgress& progress,
                                   const dist::RankShard& shard) {
  validate_checkpoint(checkpoint, model);
  check_weight_load_options(model, layouts.load);
  // Until the CUDA packing and kernels take a format (WeightFormatInfo::implemented), its
  // checkpoints load on the reference backend.
  require_implemented(model.quantization.format, "the CUDA backend (" + std::string(
      quantization_method_name(model.quantization.method)) + " checkpoint; use --backend reference)");
  require_implemented(layouts.load.quantize, "the CUDA backend (--quantize; use --backend reference)");
  const std::unique_ptr<TensorSource> source = checkpoint_source(checkpoint, model, shard, stream, progress);
  return build_weights(model, layouts, shard, *source, stream);
}

GpuWeights make_random_weights(const ModelConfig& model, const WeightLayouts& layouts, uint64_t seed,
                               cudaStream_t stream, const dist::RankShard& shard) {
  check_weight_load_options(model, layouts.load);
  require_implemented(layouts.load.quantize, "the CUDA backend (random weights)");
  const std::unique_ptr<TensorSource> source = random_source(model, seed, stream);
  return build_weights(model, layouts, shard, *source, stream);
}

}  // namespace deepfuse::runtime
