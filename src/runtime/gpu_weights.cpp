#include "runtime/gpu_weights.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <utility>
#include <string>

#include "deepfuse/bf16.hpp"
#include "deepfuse/error.hpp"
#include "deepfuse/model_weights.hpp"
#include "deepfuse/rope.hpp"
#include "deepfuse/kernels/gemv_residual.hpp"
#include "deepfuse/kernels/gemv_packing.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "deepfuse/kernels/fill.hpp"
#include "deepfuse/kernels/folded_norm.hpp"
#include "model/float16.hpp"
#include "runtime/pinned_buffer.hpp"

namespace deepfuse::runtime {

namespace {

size_t bf16_bytes(size_t elements) { return elements * sizeof(__nv_bfloat16); }

// Element counts of one layer's tensors.
struct LayerSizes {
  size_t hidden, q, kv, intermediate;
  bool qkv_bias, o_bias;

  explicit LayerSizes(const ModelConfig& c)
      : hidden(c.hidden_size), q(c.q_size()), kv(c.kv_size()), intermediate(c.intermediate_size),
        qkv_bias(c.qkv_bias), o_bias(c.o_proj_bias) {}
  size_t qkv_rows() const { return q + 2 * kv; }
  size_t elements() const {
    return 2 * hidden + qkv_rows() * hidden + (qkv_bias ? qkv_rows() : 0) + hidden * q + (o_bias ? hidden : 0) +
           3 * hidden * intermediate;
  }
};

MlpShape mlp_shape(const ModelConfig& c) { return {c.hidden_size, c.intermediate_size}; }

std::string layer_prefix(int layer) { return "model.layers." + std::to_string(layer) + "."; }

std::string gib(size_t bytes) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1 << 30));
  return text;
}

// The MLP normalises its input with the layer's post-attention RMSNorm (uploaded before the MLP);
// the unfused MLP folds it into its weights as the fused one does (docs/runtime.md, "Norms folded
// into the unfused paths' weights").
MlpNorm post_attention_norm(const GpuLayerWeights& layer, const ModelConfig& config, MlpVariant variant) {
  return {layer.post_attention_norm.as<__nv_bfloat16>(), static_cast<float>(config.rms_norm_eps),
          variant == MlpVariant::unfused};
}

// After a layer's attention weights are uploaded: the decode kernels' fragment-packed copies (from
// the plain qkv and o_proj) the plan runs, then the input norm's weight folded into the row-major
// qkv the unfused front and prefill read.
void prepare_attention_weights(GpuLayerWeights& layer, const ModelConfig& config, const WeightLayouts& layouts,
                               cudaStream_t stream) {
  const LayerSizes s(config);
  if (layouts.front_packed) {
    layer.qkv_packed = DeviceBuffer(layer.qkv.bytes());
    DF_CHECK_CUDA(kernels::pack_qkv_weights(layer.qkv.as<__nv_bfloat16>(), layer.qkv_packed.as<uint4>(),
                                            static_cast<int>(s.qkv_rows()), static_cast<int>(s.hidden), stream));
  }
  if (layouts.o_proj_packed) {
    layer.o_proj_packed = DeviceBuffer(layer.o_proj.bytes());
    DF_CHECK_CUDA(kernels::pack_rows_fragments(layer.o_proj.as<__nv_bfloat16>(), layer.o_proj_packed.as<uint4>(),
                                               static_cast<int>(s.hidden), static_cast<int>(s.q), stream));
  }
  DF_CHECK_CUDA(kernels::launch_fold_norm_weight(layer.qkv.as<__nv_bfloat16>(), static_cast<int>(s.qkv_rows()),
                                                 static_cast<int>(s.hidden), layer.input_norm.as<__nv_bfloat16>(),
                                                 stream));
}

// Every buffer of a layer except the MLP, allocated in its final size (contents undefined).
GpuLayerWeights allocate_layer(const ModelConfig& config) {
  const LayerSizes s(config);
  GpuLayerWeights layer;
  layer.input_norm = DeviceBuffer(bf16_bytes(s.hidden));
  layer.qkv = DeviceBuffer(bf16_bytes(s.qkv_rows() * s.hidden));
  if (s.qkv_bias) layer.qkv_bias = DeviceBuffer(bf16_bytes(s.qkv_rows()));
  layer.o_proj = DeviceBuffer(bf16_bytes(s.hidden * s.q));
  if (s.o_bias) layer.o_bias = DeviceBuffer(bf16_bytes(s.hidden));
  layer.post_attention_norm = DeviceBuffer(bf16_bytes(s.hidden));
  return layer;
}

// One layer's gate, up and down in Hugging Face layout: what MlpLayer::load_weights copies or
// packs from. Reused by every layer (stream order keeps a layer's packing ahead of the next
// layer's uploads).
struct MlpStaging {
  DeviceBuffer gate, up, down;

  explicit MlpStaging(MlpShape shape)
      : gate(shape.weight_bytes() / 3), up(shape.weight_bytes() / 3), down(shape.weight_bytes() / 3) {}
  MlpHfWeights view() const {
    return {gate.as<__nv_bfloat16>(), up.as<__nv_bfloat16>(), down.as<__nv_bfloat16>()};
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
      layer.mlp_fused->load_weights(staging.view(), stream, post_attention_norm(layer, config_, MlpVariant::fused));
    }
    if (layouts_.mlp_unfused) {
      layer.mlp_unfused = std::make_unique<MlpLayer>(MlpVariant::unfused, shape, layouts_.max_tokens, scratch_);
      layer.mlp_unfused->load_weights(staging.view(), stream, post_attention_norm(layer, config_, MlpVariant::unfused));
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

// ---- checkpoint -> device

// n elements of `dtype` (BF16, F16 or F32, possibly unaligned in the mapping) -> bf16 bits.
void convert_to_bf16(const std::byte* source, SafetensorsDType dtype, size_t n, uint16_t* out) {
  switch (dtype) {
    case SafetensorsDType::BF16:
      std::memcpy(out, source, n * 2);
      return;
    case SafetensorsDType::F16:
      for (size_t i = 0; i < n; ++i) {
        uint16_t bits;
        std::memcpy(&bits, source + 2 * i, 2);
        out[i] = float_to_bf16_bits(half_bits_to_float(bits));
      }
      return;
    case SafetensorsDType::F32:
      for (size_t i = 0; i < n; ++i) {
        float value;
        std::memcpy(&value, source + 4 * i, 4);
        out[i] = float_to_bf16_bits(value);
      }
      return;
    default:
      throw Error(std::string("cannot load a ") + dtype_name(dtype) + " tensor as bf16");
  }
}

// A rectangle of a row-major tensor: what one rank holds of it.
struct Block {
  size_t row_begin, rows, column_begin, columns, row_length;
  static Block whole_rows(size_t begin, size_t count, size_t row_length) {
    return {begin, count, 0, row_length, row_length};
  }
  static Block vector_part(size_t begin, size_t count) { return {begin, count, 0, 1, 1}; }
};

// The blocks of each sliced tensor for `shard` (the whole tensor for one GPU). `model` is the
// whole model's config.
struct ShardBlocks {
  const ModelConfig& model;
  const dist::RankShard& shard;
  size_t head_dim() const { return model.head_dim; }
  size_t hidden() const { return model.hidden_size; }
  // Rows of q_proj / k_proj / v_proj (and their biases) this rank holds.
  Block q_rows(size_t columns) const {
    return {shard.q_head_begin * head_dim(), shard.q_heads * head_dim(), 0, columns, columns};
  }
  Block kv_rows(size_t columns) const {
    return {shard.kv_head_begin * head_dim(), shard.kv_heads * head_dim(), 0, columns, columns};
  }
  // o_proj [H, q_size]: the input columns of this rank's heads.
  Block o_proj_columns() const {
    return {0, hidden(), shard.q_head_begin * head_dim(), shard.q_heads * head_dim(),
            static_cast<size_t>(model.q_size())};
  }
  Block gate_up_rows() const { return Block::whole_rows(shard.intermediate_begin, shard.intermediate, hidden()); }
  Block down_columns() const {
    return {0, hidden(), static_cast<size_t>(shard.intermediate_begin), static_cast<size_t>(shard.intermediate),
            static_cast<size_t>(model.intermediate_size)};
  }
  Block lm_head_rows() const { return Block::whole_rows(shard.vocab_begin, shard.vocab_real, hidden()); }
};

// Copies checkpoint tensors to device memory as bf16, chunk by chunk through two pinned buffers
// used in turn: the host fills one while the previous chunk's copy from the other runs.
class StagedUploader {
 public:
  StagedUploader(const Checkpoint& checkpoint, size_t total_bytes, cudaStream_t stream, const LoadProgress& progress)
      : checkpoint_(checkpoint), stream_(stream), progress_(progress), total_(total_bytes) {
    for (PinnedBuffer& buffer : staging_) buffer = PinnedBuffer(bf16_bytes(kChunkElements));
    if (progress_) progress_(0, total_);
  }
  // Pending copies read the staging buffers: let them finish before the buffers are freed.
  ~StagedUploader() { cudaStreamSynchronize(stream_); }
  // Every tensor uploaded: the progress reaches its total (a split rank's total is an estimate).
  void finish() {
    if (progress_) progress_(total_, total_);
  }
  StagedUploader(const StagedUploader&) = delete;
  StagedUploader& operator=(const StagedUploader&) = delete;

  // Tensor `name` -> destination, which holds its element count of bf16.
  void upload(const std::string& name, void* destination) {
    const Checkpoint::Entry* entry = checkpoint_.find(name);
    DF_CHECK(entry != nullptr, "checkpoint is missing tensor '" + name + "'");
    const std::span<const std::byte> source = checkpoint_.data(*entry);
    const SafetensorsDType dtype = entry->info->dtype;
    const size_t source_element_bytes = dtype_size(dtype);
    const size_t elements = source.size() / source_element_bytes;
    auto* out = static_cast<uint16_t*>(destination);
    for (size_t first = 0; first < elements; first += kChunkElements) {
      const size_t count = std::min(kChunkElements, elements - first);
      staging_read_[next_].wait();  // the copy that last read this buffer is done
      convert_to_bf16(source.data() + first * source_element_bytes, dtype, count, staging_[next_].as<uint16_t>());
      DF_CHECK_CUDA(cudaMemcpyAsync(out + first, staging_[next_].data(), bf16_bytes(count), cudaMemcpyHostToDevice,
                                    stream_));
      staging_read_[next_].record(stream_);
      next_ ^= 1;
    }
    done_ += source.size();
    report();
  }

  // Uploads into `buffer` at element `offset` (one of q/k/v into the merged qkv).
  void upload(const std::string& name, DeviceBuffer& buffer, size_t offset = 0) {
    upload(name, buffer.as<uint16_t>() + offset);
  }

  // Rows [block.row_begin, +block.rows) x columns [block.column_begin, +block.columns) of tensor
  // `name` (a matrix of `block.row_length` columns; a vector is one column) -> `buffer` at element
  // `offset`, packed: a tensor-parallel rank's slice, read from the file and nothing else.
  void upload(const std::string& name, DeviceBuffer& buffer, size_t offset, const Block& block) {
    const Checkpoint::Entry* entry = checkpoint_.find(name);
    DF_CHECK(entry != nullptr, "checkpoint is missing tensor '" + name + "'");
    const std::span<const std::byte> source = checkpoint_.data(*entry);
    const SafetensorsDType dtype = entry->info->dtype;
    const size_t element_bytes = dtype_size(dtype);
    DF_CHECK(block.columns <= kChunkElements && (block.row_begin + block.rows) * block.row_length * element_bytes <=
                                                    source.size(),
             "internal: slice outside tensor '" + name + "'");
    auto* out = buffer.as<uint16_t>() + offset;
    const size_t rows_per_chunk = kChunkElements / block.columns;
    for (size_t first = 0; first < block.rows; first += rows_per_chunk) {
      const size_t rows = std::min(rows_per_chunk, block.rows - first);
      staging_read_[next_].wait();
      for (size_t r = 0; r < rows; ++r) {
        const size_t element = (block.row_begin + first + r) * block.row_length + block.column_begin;
        convert_to_bf16(source.data() + element * element_bytes, dtype, block.columns,
                        staging_[next_].as<uint16_t>() + r * block.columns);
      }
      DF_CHECK_CUDA(cudaMemcpyAsync(out + first * block.columns, staging_[next_].data(), bf16_bytes(rows * block.columns),
                                    cudaMemcpyHostToDevice, stream_));
      staging_read_[next_].record(stream_);
      next_ ^= 1;
    }
    done_ += block.rows * block.columns * element_bytes;
    report();
  }

 private:
  // Below the total until finish(), so an estimated total is neither reached early nor missed.
  void report() const {
    if (progress_) progress_(std::min(done_, total_ > 0 ? total_ - 1 : 0), total_);
  }

  static constexpr size_t kChunkElements = size_t{8} << 20;  // 16 MiB of bf16 per staging buffer

  const Checkpoint& checkpoint_;
  cudaStream_t stream_;
  const LoadProgress& progress_;
  size_t done_ = 0;
  size_t total_;
  PinnedBuffer staging_[2];
  CopyEvent staging_read_[2];
  int next_ = 0;
};

// ---- random weights

class RandomFiller {
 public:
  RandomFiller(uint64_t seed, int hidden, cudaStream_t stream)
      : seed_(seed), ones_(static_cast<size_t>(hidden), float_to_bf16_bits(1.0f)), stream_(stream) {}

  // uniform(-scale, scale), a fresh stream of numbers per tensor.
  void uniform(__nv_bfloat16* values, size_t count, float scale) {
    const uint64_t tensor_seed = seed_ + (++tensors_) * 0x9e3779b97f4a7c15ull;
    DF_CHECK_CUDA(kernels::fill_uniform_bf16(values, count, tensor_seed, scale, stream_));
  }
  void uniform(DeviceBuffer& buffer, float scale) {
    uniform(buffer.as<__nv_bfloat16>(), buffer.bytes() / sizeof(__nv_bfloat16), scale);
  }
  // Std 1/sqrt(fan_in), as a trained Linear roughly has: activations keep their scale.
  static float linear_scale(int fan_in) { return std::sqrt(3.0f / static_cast<float>(fan_in)); }
  void linear(DeviceBuffer& buffer, int fan_in) { uniform(buffer, linear_scale(fan_in)); }
  // Norm weights: exactly 1.
  void ones(DeviceBuffer& buffer) {
    // ones_ never changes and outlives the copies (the caller synchronises before returning).
    DF_CHECK_CUDA(cudaMemcpyAsync(buffer.data(), ones_.data(), buffer.bytes(), cudaMemcpyHostToDevice, stream_));
  }

 private:
  uint64_t seed_;
  uint64_t tensors_ = 0;
  std::vector<uint16_t> ones_;
  cudaStream_t stream_;
};

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

size_t gpu_weight_bytes(const ModelConfig& c, const WeightLayouts& layouts, const dist::RankShard& shard) {
  const size_t vocab_hidden = static_cast<size_t>(c.vocab_size) * c.hidden_size;
  const LayerSizes s(c);
  const size_t mlp = 3 * s.hidden * s.intermediate;
  const size_t mlp_copies = (layouts.mlp_fused ? 1 : 0) + (layouts.mlp_unfused ? 1 : 0);
  const size_t per_layer = s.elements() - mlp + mlp_copies * mlp + (layouts.front_packed ? s.qkv_rows() * s.hidden : 0) +
                           (layouts.o_proj_packed ? s.q * s.hidden : 0);
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
  const ModelConfig config = dist::rank_config(model, shard);
  const bool split = shard.split();
  const LayerSizes s(config);
  const ShardBlocks blocks{model, shard};
  // Bytes this rank reads: everything for one GPU; a split rank's slices, estimated from the
  // ratio of its weights to the whole model's (the uploader's progress stops short of an
  // estimated total until finish()).
  size_t total_bytes = 0;
  for (const ExpectedTensor& tensor : expected_tensors(model)) total_bytes += checkpoint.find(tensor.name)->info->byte_size();
  if (split) {
    const WeightLayouts plain{.mlp_fused = false, .mlp_unfused = true, .front_packed = false, .o_proj_packed = false};
    total_bytes = static_cast<size_t>(static_cast<double>(total_bytes) *
                                      static_cast<double>(gpu_weight_bytes(config, plain, shard)) /
                                      static_cast<double>(gpu_weight_bytes(model, plain)));
  }
  MlpStaging staging(mlp_shape(config));  // declared first: freed after the uploader has synchronised
  StagedUploader uploader(checkpoint, total_bytes, stream, progress);
  const MlpBuilder mlp_builder(config, layouts);

  GpuWeights w;
  w.embed_tokens = DeviceBuffer(bf16_bytes(static_cast<size_t>(config.vocab_size) * s.hidden));
  uploader.upload("model.embed_tokens.weight", w.embed_tokens);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    const std::string p = layer_prefix(l);
    GpuLayerWeights layer = allocate_layer(config);
    uploader.upload(p + "input_layernorm.weight", layer.input_norm);
    if (split) {
      uploader.upload(p + "self_attn.q_proj.weight", layer.qkv, 0, blocks.q_rows(s.hidden));
      uploader.upload(p + "self_attn.k_proj.weight", layer.qkv, s.q * s.hidden, blocks.kv_rows(s.hidden));
      uploader.upload(p + "self_attn.v_proj.weight", layer.qkv, (s.q + s.kv) * s.hidden, blocks.kv_rows(s.hidden));
      if (s.qkv_bias) {
        uploader.upload(p + "self_attn.q_proj.bias", layer.qkv_bias, 0, blocks.q_rows(1));
        uploader.upload(p + "self_attn.k_proj.bias", layer.qkv_bias, s.q, blocks.kv_rows(1));
        uploader.upload(p + "self_attn.v_proj.bias", layer.qkv_bias, s.q + s.kv, blocks.kv_rows(1));
      }
      uploader.upload(p + "self_attn.o_proj.weight", layer.o_proj, 0, blocks.o_proj_columns());
    } else {
      uploader.upload(p + "self_attn.q_proj.weight", layer.qkv, 0);
      uploader.upload(p + "self_attn.k_proj.weight", layer.qkv, s.q * s.hidden);
      uploader.upload(p + "self_attn.v_proj.weight", layer.qkv, (s.q + s.kv) * s.hidden);
      if (s.qkv_bias) {
        uploader.upload(p + "self_attn.q_proj.bias", layer.qkv_bias, 0);
        uploader.upload(p + "self_attn.k_proj.bias", layer.qkv_bias, s.q);
        uploader.upload(p + "self_attn.v_proj.bias", layer.qkv_bias, s.q + s.kv);
      }
      uploader.upload(p + "self_attn.o_proj.weight", layer.o_proj);
    }
    if (s.o_bias) uploader.upload(p + "self_attn.o_proj.bias", layer.o_bias);
    uploader.upload(p + "post_attention_layernorm.weight", layer.post_attention_norm);
    if (split) {
      uploader.upload(p + "mlp.gate_proj.weight", staging.gate, 0, blocks.gate_up_rows());
      uploader.upload(p + "mlp.up_proj.weight", staging.up, 0, blocks.gate_up_rows());
      uploader.upload(p + "mlp.down_proj.weight", staging.down, 0, blocks.down_columns());
    } else {
      uploader.upload(p + "mlp.gate_proj.weight", staging.gate);
      uploader.upload(p + "mlp.up_proj.weight", staging.up);
      uploader.upload(p + "mlp.down_proj.weight", staging.down);
    }
    mlp_builder.build(layer, staging, stream);
    prepare_attention_weights(layer, config, layouts, stream);
    w.layers.push_back(std::move(layer));
  }
  w.final_norm = DeviceBuffer(bf16_bytes(s.hidden));
  uploader.upload("model.norm.weight", w.final_norm);
  const std::string lm_head = config.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
  if (split) {
    w.lm_head = DeviceBuffer(bf16_bytes(static_cast<size_t>(shard.vocab_rows) * s.hidden));
    w.lm_head.zero(stream);  // rows past the vocabulary (the last slice's padding) score 0
    if (shard.vocab_real > 0) uploader.upload(lm_head, w.lm_head, 0, blocks.lm_head_rows());
  } else if (!config.tie_word_embeddings) {
    w.lm_head = DeviceBuffer(bf16_bytes(static_cast<size_t>(config.vocab_size) * s.hidden));
    uploader.upload(lm_head, w.lm_head);
  }
  w.rope_inv_freq = rope_table(config);
  DF_CHECK_CUDA(cudaStreamSynchronize(stream));
  uploader.finish();
  return w;
}

namespace {

// A tensor drawn whole (the same numbers as one GPU's), then this rank's blocks copied out of it.
class SlicedFill {
 public:
  SlicedFill(size_t max_elements, cudaStream_t stream) : whole_(bf16_bytes(max_elements)), stream_(stream) {}
  __nv_bfloat16* whole() { return whole_.as<__nv_bfloat16>(); }
  // Block of the whole tensor (drawn into whole()) -> destination at element `offset`.
  void copy(const Block& block, DeviceBuffer& destination, size_t offset = 0) {
    const auto* source = whole_.as<__nv_bfloat16>() + block.row_begin * block.row_length + block.column_begin;
    DF_CHECK_CUDA(cudaMemcpy2DAsync(destination.as<__nv_bfloat16>() + offset, bf16_bytes(block.columns), source,
                                    bf16_bytes(block.row_length), bf16_bytes(block.columns), block.rows,
                                    cudaMemcpyDeviceToDevice, stream_));
  }

 private:
  DeviceBuffer whole_;
  cudaStream_t stream_;
};

}  // namespace

GpuWeights make_random_weights(const ModelConfig& model, const WeightLayouts& layouts, uint64_t seed,
                               cudaStream_t stream, const dist::RankShard& shard) {
  const ModelConfig config = dist::rank_config(model, shard);
  const bool split = shard.split();
  const LayerSizes s(config), whole(model);
  RandomFiller fill(seed, config.hidden_size, stream);
  MlpStaging staging(mlp_shape(config));
  const MlpBuilder mlp_builder(config, layouts);
  constexpr float kBiasScale = 0.1f;
  const ShardBlocks blocks{model, shard};
  const size_t vocab_hidden = static_cast<size_t>(model.vocab_size) * whole.hidden;
  std::optional<SlicedFill> sliced;
  if (split)
    sliced.emplace(std::max({vocab_hidden, whole.qkv_rows() * whole.hidden, whole.intermediate * whole.hidden}), stream);
  // Draws the whole tensor of `elements` (as one GPU's engine would), then copies each (block,
  // offset) of it into `destination`.
  auto draw_sliced = [&](size_t elements, float scale, DeviceBuffer& destination,
                         std::initializer_list<std::pair<Block, size_t>> parts) {
    fill.uniform(sliced->whole(), elements, scale);
    for (const auto& [block, offset] : parts) sliced->copy(block, destination, offset);
  };

  GpuWeights w;
  w.embed_tokens = DeviceBuffer(bf16_bytes(static_cast<size_t>(config.vocab_size) * s.hidden));
  fill.uniform(w.embed_tokens, 1.0f);
  for (int l = 0; l < config.num_hidden_layers; ++l) {
    GpuLayerWeights layer = allocate_layer(config);
    fill.ones(layer.input_norm);
    if (split) {
      const size_t q_rows = whole.q, kv_rows = whole.kv;
      auto shift = [](Block b, size_t rows) { b.row_begin += rows; return b; };
      draw_sliced(whole.qkv_rows() * whole.hidden, RandomFiller::linear_scale(model.hidden_size),
                  layer.qkv,
                  {{blocks.q_rows(whole.hidden), 0},
                   {shift(blocks.kv_rows(whole.hidden), q_rows), s.q * s.hidden},
                   {shift(blocks.kv_rows(whole.hidden), q_rows + kv_rows), (s.q + s.kv) * s.hidden}});
      if (s.qkv_bias)
        draw_sliced(whole.qkv_rows(), kBiasScale, layer.qkv_bias,
                    {{blocks.q_rows(1), 0},
                     {shift(blocks.kv_rows(1), q_rows), s.q},
                     {shift(blocks.kv_rows(1), q_rows + kv_rows), s.q + s.kv}});
      draw_sliced(whole.hidden * whole.q, RandomFiller::linear_scale(model.q_size()), layer.o_proj,
                  {{blocks.o_proj_columns(), 0}});
    } else {
      fill.linear(layer.qkv, config.hidden_size);
      if (s.qkv_bias) fill.uniform(layer.qkv_bias, kBiasScale);
      fill.linear(layer.o_proj, config.q_size());
    }
    if (s.o_bias) fill.uniform(layer.o_bias, kBiasScale);
    fill.ones(layer.post_attention_norm);
    if (split) {
      const size_t mlp_elements = whole.intermediate * whole.hidden;
      auto gate_up = RandomFiller::linear_scale(model.hidden_size);
      draw_sliced(mlp_elements, gate_up, staging.gate, {{blocks.gate_up_rows(), 0}});
      draw_sliced(mlp_elements, gate_up, staging.up, {{blocks.gate_up_rows(), 0}});
      draw_sliced(mlp_elements, RandomFiller::linear_scale(model.intermediate_size), staging.down,
                  {{blocks.down_columns(), 0}});
    } else {
      fill.linear(staging.gate, config.hidden_size);
      fill.linear(staging.up, config.hidden_size);
      fill.linear(staging.down, config.intermediate_size);
    }
    mlp_builder.build(layer, staging, stream);
    prepare_attention_weights(layer, config, layouts, stream);
    w.layers.push_back(std::move(layer));
  }
  w.final_norm = DeviceBuffer(bf16_bytes(s.hidden));
  fill.ones(w.final_norm);
  if (split) {
    w.lm_head = DeviceBuffer(bf16_bytes(static_cast<size_t>(shard.vocab_rows) * s.hidden));
    w.lm_head.zero(stream);
    if (shard.vocab_real > 0) {
      if (config.tie_word_embeddings) {  // the slice of the (replicated) embedding table
        DF_CHECK_CUDA(cudaMemcpyAsync(w.lm_head.data(),
                                      w.embed_tokens.as<__nv_bfloat16>() + static_cast<size_t>(shard.vocab_begin) * s.hidden,
                                      bf16_bytes(static_cast<size_t>(shard.vocab_real) * s.hidden),
                                      cudaMemcpyDeviceToDevice, stream));
      } else {
        draw_sliced(vocab_hidden, RandomFiller::linear_scale(model.hidden_size), w.lm_head,
                    {{blocks.lm_head_rows(), 0}});
      }
    }
  } else if (!config.tie_word_embeddings) {
    w.lm_head = DeviceBuffer(bf16_bytes(static_cast<size_t>(config.vocab_size) * s.hidden));
    fill.linear(w.lm_head, config.hidden_size);
  }
  w.rope_inv_freq = rope_table(config);
  DF_CHECK_CUDA(cudaStreamSynchronize(stream));
  return w;
}

}  // namespace deepfuse::runtime
