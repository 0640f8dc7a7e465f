#include "runtime/gpu_weights.hpp"

#include <cstdio>
#include <string>
#include <utility>

#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/rope.hpp"
#include "deepfuse/kernels/gemv_packing.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "deepfuse/kernels/folded_norm.hpp"
#include "runtime/weight_sources.hpp"

namespace deepfuse::runtime {

namespace {

// Every weight is stored 16-bit: norms, biases and the embedding in all formats, linear weights in
// bf16, the one format implemented (the loader refuses the others first).
size_t bf16_bytes(size_t elements) { return elements * sizeof(__nv_bfloat16); }

MlpShape mlp_shape(const ModelConfig& c) { return {c.hidden_size, c.intermediate_size}; }

// The MLP's groups are staged in Hugging Face layout, then packed into its variants' layouts.
bool is_mlp(TensorGroup group) {
  return group == TensorGroup::gate || group == TensorGroup::up || group == TensorGroup::down;
}

// The groups the cluster GEMV stream reads fragment-packed, when the plan runs its kernel.
bool packed_in(TensorGroup group, const WeightLayouts& layouts) {
  return (group == TensorGroup::qkv && layouts.front_packed) || (group == TensorGroup::o_proj && layouts.o_proj_packed);
}

size_t group_elements(TensorGroup group, const ModelConfig& config) {
  return static_cast<size_t>(group_rows(group, config) * group_columns(group, config));
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
  return {layer.vector(TensorGroup::post_attention_norm), static_cast<float>(config.rms_norm_eps),
          variant == MlpVariant::unfused};
}

// After a layer's attention weights are uploaded: the decode kernels' fragment-packed copies (from
// the plain qkv and o_proj) the plan runs, then the input norm's weight folded into the row-major
// qkv the unfused front and prefill read (bf16 only: docs/design.md, "Weight formats").
void prepare_attention_weights(GpuLayerWeights& layer, const ModelConfig& config, const WeightLayouts& layouts,
                               cudaStream_t stream) {
  const LinearWeight qkv = layer.linear(TensorGroup::qkv, WeightLayout::row_major, config);
  const LinearWeight o_proj = layer.linear(TensorGroup::o_proj, WeightLayout::row_major, config);
  if (packed_in(TensorGroup::qkv, layouts)) {
    DeviceBuffer& packed = layer.fragments[TensorGroup::qkv] = DeviceBuffer(qkv.bytes());
    DF_CHECK_CUDA(kernels::pack_qkv_weights(qkv.bf16("packing the QKV fragments"), packed.as<uint4>(), qkv.rows,
                                            qkv.columns, stream));
  }
  if (packed_in(TensorGroup::o_proj, layouts)) {
    DeviceBuffer& packed = layer.fragments[TensorGroup::o_proj] = DeviceBuffer(o_proj.bytes());
    DF_CHECK_CUDA(kernels::pack_rows_fragments(o_proj.bf16("packing the o_proj fragments"), packed.as<uint4>(),
                                               o_proj.rows, o_proj.columns, stream));
  }
  // A format that does not fold norms applies the weight to x as its kernels stage it instead.
  if (format_info(qkv.format).folds_norm)
    DF_CHECK_CUDA(kernels::launch_fold_norm_weight(layer.row_major[TensorGroup::qkv].as<__nv_bfloat16>(), qkv.rows,
                                                   qkv.columns, layer.vector(TensorGroup::input_norm), stream));
}

// One layer's gate, up and down in Hugging Face layout: what MlpLayer::load_weights copies or
// packs from. Reused by every layer (stream order keeps a layer's packing ahead of the next
// layer's uploads).
struct MlpStaging {
  GroupBuffers groups;

  explicit MlpStaging(const ModelConfig& config) {
    for (TensorGroup group : {TensorGroup::gate, TensorGroup::up, TensorGroup::down})
      groups[group] = DeviceBuffer(bf16_bytes(group_elements(group, config)));
  }
  MlpHfWeights view(const ModelConfig& config) const {
    return MlpHfWeights::bf16(groups[TensorGroup::gate].data(), groups[TensorGroup::up].data(),
                              groups[TensorGroup::down].data(), mlp_shape(config));
  }
};

// What loading needs on the device besides the weights: one layer's MLP staged in Hugging Face
// layout (MlpStaging) while it is packed.
size_t staging_bytes(const ModelConfig& config) { return mlp_shape(config).weight_bytes(); }

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
  MlpStaging staging(config);
  const MlpBuilder mlp_builder(config, layouts);
  auto fill = [&](TensorScope scope, int layer, GroupBuffers& groups, GroupBuffers* staged) {
    for (const TensorSpec* spec : tensors_in(scope)) {
      if (!spec->present(model)) continue;
      DeviceBuffer& destination = staged && is_mlp(spec->group) ? (*staged)[spec->group] : groups[spec->group];
      if (destination.empty()) destination = DeviceBuffer(bf16_bytes(group_elements(spec->group, config)));
      const dist::TensorSlice slice = dist::slice_of(*spec, model, shard);
      const size_t offset = static_cast<size_t>(row_in_group(*spec, config)) * slice.columns;
      DF_CHECK(bf16_bytes(offset + slice.elements()) <= destination.bytes(),
               "internal: " + tensor_name(*spec, layer) + "'s slice overruns its group on the device");
      if (slice.elements() > 0) source.fill(*spec, layer, slice, destination, offset);
    }
  };

  GpuWeights w;
  fill(TensorScope::input, 0, w.groups, nullptr);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    GpuLayerWeights layer;
    fill(TensorScope::layer, l, layer.row_major, &staging.groups);
    mlp_builder.build(layer, staging, stream);
    prepare_attention_weights(layer, config, layouts, stream);
    w.layers.push_back(std::move(layer));
  }
  DeviceBuffer& lm_head = w.groups[TensorGroup::lm_head];
  if (shard.split()) {
    // Every rank's slice is vocab_rows long; rows past the vocabulary (the last slice's padding)
    // score 0. A tied model's slice is the embedding's rows (the table is replicated).
    lm_head = DeviceBuffer(bf16_bytes(static_cast<size_t>(shard.vocab_rows) * config.hidden_size));
    lm_head.zero(stream);
    if (config.tie_word_embeddings && shard.vocab_real > 0)
      DF_CHECK_CUDA(cudaMemcpyAsync(lm_head.data(), w.embedding() + static_cast<size_t>(shard.vocab_begin) * config.hidden_size,
                                    bf16_bytes(static_cast<size_t>(shard.vocab_real) * config.hidden_size),
                                    cudaMemcpyDeviceToDevice, stream));
  }
  fill(TensorScope::output, 0, w.groups, nullptr);
  w.rope_inv_freq = rope_table(config);
  source.finish();
  return w;
}

}  // namespace

WeightLayouts WeightLayouts::of(const DecodePlan& plan, int max_tokens) {
  return {plan.uses(MlpChoice::fused), plan.uses(MlpChoice::unfused), plan.uses(FrontChoice::fused),
          plan.uses(OProjChoice::gemv), max_tokens};
}

MlpLayer& GpuLayerWeights::mlp(MlpChoice choice) const {
  const std::unique_ptr<MlpLayer>& layer = choice == MlpChoice::fused ? mlp_fused : mlp_unfused;
  DF_CHECK(layer != nullptr, std::string("the weights hold no ") + choice_name(choice) + " MLP layout for this step");
  return *layer;
}

LinearWeight GpuLayerWeights::linear(TensorGroup group, WeightLayout layout, const ModelConfig& config) const {
  const DeviceBuffer& buffer = layout == WeightLayout::fragments ? fragments[group] : row_major[group];
  return {format, layout, buffer.data(), scales[group].as<float>(), nullptr, static_cast<int>(group_rows(group, config)),
          static_cast<int>(group_columns(group, config))};
}

const __nv_bfloat16* GpuLayerWeights::vector(TensorGroup group) const { return row_major[group].as<__nv_bfloat16>(); }

const __nv_bfloat16* GpuWeights::embedding() const { return groups[TensorGroup::embed_tokens].as<__nv_bfloat16>(); }

const __nv_bfloat16* GpuWeights::vector(TensorGroup group) const { return groups[group].as<__nv_bfloat16>(); }

LinearWeight GpuWeights::lm_head(int rows, int hidden) const {
  const DeviceBuffer& head = groups[TensorGroup::lm_head];
  return {WeightFormat::bf16, WeightLayout::row_major, head.empty() ? embedding() : head.data(), nullptr, nullptr,
          rows, hidden};
}

std::vector<const __nv_bfloat16*> GpuWeights::layer_operands(TensorGroup group, const ModelConfig& config,
                                                             const char* who) const {
  std::vector<const __nv_bfloat16*> operands;
  for (const GpuLayerWeights& layer : layers)
    operands.push_back(layer.linear(group, WeightLayout::row_major, config).bf16(who));
  return operands;
}

size_t gpu_weight_bytes(const ModelConfig& c, const WeightLayouts& layouts, const dist::RankShard& shard) {
  const size_t vocab_hidden = static_cast<size_t>(c.vocab_size) * c.hidden_size;
  const size_t mlp_copies = (layouts.mlp_fused ? 1 : 0) + (layouts.mlp_unfused ? 1 : 0);
  size_t per_layer = 0;
  for (const TensorSpec* spec : tensors_in(TensorScope::layer)) {
    if (!spec->present(c)) continue;
    const size_t copies = is_mlp(spec->group) ? mlp_copies : 1 + (packed_in(spec->group, layouts) ? 1 : 0);
    per_layer += copies * static_cast<size_t>(extent_size(spec->rows, c) * extent_size(spec->columns, c));
  }
  // A split model keeps its lm_head slice apart from the replicated embedding, tied or not.
  const size_t lm_head = shard.split() ? static_cast<size_t>(shard.vocab_rows) * c.hidden_size
                         : c.tie_word_embeddings ? 0
                                                 : vocab_hidden;
  return bf16_bytes(vocab_hidden + c.num_hidden_layers * per_layer + c.hidden_size + lm_head);
}

size_t decode_weight_bytes(const ModelConfig& c, const dist::RankShard& shard) {
  const size_t embedding = bf16_bytes(static_cast<size_t>(c.vocab_size) * c.hidden_size);
  const WeightLayouts one_of_each{.mlp_fused = false, .mlp_unfused = true, .front_packed = false, .o_proj_packed = false};
  const bool embedding_is_lm_head = c.tie_word_embeddings && !shard.split();
  return gpu_weight_bytes(c, one_of_each, shard) - (embedding_is_lm_head ? 0 : embedding);
}

bool fits_with_kv(const ModelConfig& config, const WeightLayouts& layouts, size_t free_bytes, size_t kv_reserve_bytes,
                  const dist::RankShard& shard) {
  return gpu_weight_bytes(config, layouts, shard) + staging_bytes(config) + kv_reserve_bytes <= free_bytes;
}

void check_weights_fit(const ModelConfig& config, const WeightLayouts& layouts, const std::string& what,
                       const dist::RankShard& shard) {
  size_t free_bytes = 0, total_bytes = 0;
  DF_CHECK_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  const size_t weights = gpu_weight_bytes(config, layouts, shard);
  const size_t staging = staging_bytes(config);
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
  // FP8 checkpoints load on the reference backend; the CUDA packing and kernels are issue 51's.
  require_implemented(model.quantization.format, "the CUDA backend (" + std::string(
      quantization_method_name(model.quantization.method)) + " checkpoint; use --backend reference)");
  const std::unique_ptr<TensorSource> source = checkpoint_source(checkpoint, model, shard, stream, progress);
  return build_weights(model, layouts, shard, *source, stream);
}

GpuWeights make_random_weights(const ModelConfig& model, const WeightLayouts& layouts, uint64_t seed,
                               cudaStream_t stream, const dist::RankShard& shard) {
  const std::unique_ptr<TensorSource> source = random_source(model, seed, stream);
  return build_weights(model, layouts, shard, *source, stream);
}

}  // namespace deepfuse::runtime
