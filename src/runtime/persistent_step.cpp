#include "runtime/persistent_step.hpp"

#include <cmath>
#include <vector>

#include "deepfuse/error.hpp"

namespace deepfuse::runtime {

PersistentDecodeStep::PersistentDecodeStep(const ModelConfig& config, const GpuWeights& weights, const KvCache& kv,
                                           int device, cudaStream_t stream) {
  kernels::PersistentDecodeShape shape;
  shape.layers = config.num_hidden_layers;
  shape.hidden = config.hidden_size;
  shape.intermediate = config.intermediate_size;
  shape.q_heads = config.num_attention_heads;
  shape.kv_heads = config.num_key_value_heads;
  shape.head_dim = config.head_dim;
  shape.vocab = config.vocab_size;
  if (!kernels::persistent_decode_supported(shape, device)) {
    why_not_ = "the persistent decode kernel needs sm_90, head_dim 64 or 128, at most 8 query heads per KV head "
               "and H, I, q_size multiples of 256";
    return;
  }
  std::vector<kernels::PersistentDecodeLayer> table;
  for (int l = 0; l < shape.layers; ++l) {
    const GpuLayerWeights& w = weights.layers[l];
    const MlpLayer* row_major = w.mlp_unfused ? w.mlp_unfused.get() : w.mlp.get();
    const MlpLayer::RowMajorWeights mlp = row_major->row_major_weights();
    if (!mlp.gate_up) {
      why_not_ = "the persistent decode kernel streams row-major MLP weights: the unfused variant or the fused "
                 "variant's unfused copy (fused_mlp_max_tokens below the largest step)";
      return;
    }
    const kernels::PagedKv pools = kv.layer(l);
    kernels::PersistentDecodeLayer d;
    d.qkv = w.qkv.as<__nv_bfloat16>();
    d.qkv_bias = w.qkv_bias.empty() ? nullptr : w.qkv_bias.as<__nv_bfloat16>();
    d.input_norm = weights.input_norms_folded ? nullptr : w.input_norm.as<__nv_bfloat16>();
    d.o_proj = w.o_proj.as<__nv_bfloat16>();
    d.o_bias = w.o_bias.empty() ? nullptr : w.o_bias.as<__nv_bfloat16>();
    d.gate_up = mlp.gate_up;
    d.post_norm = mlp.norm_folded ? nullptr : w.post_attention_norm.as<__nv_bfloat16>();
    d.down = mlp.down;
    d.k_pages = pools.k_pages;
    d.v_pages = pools.v_pages;
    table.push_back(d);
  }
  int sms = 0;
  DF_CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  layers_ = DeviceBuffer(table.size() * sizeof(table[0]));
  layers_.upload(table.data(), layers_.bytes());
  workspace_ = DeviceBuffer(kernels::persistent_decode_workspace_bytes(shape, sms));
  workspace_.zero(stream);  // the kernel expects zero counters and leaves them zero

  const kernels::PagedKv first = kv.layer(0);
  params_.shape = shape;
  params_.layers = layers_.as<kernels::PersistentDecodeLayer>();
  params_.embed_tokens = weights.embed_tokens.as<__nv_bfloat16>();
  params_.inv_freq = weights.rope_inv_freq.as<float>();
  params_.block_table = first.block_table;  // row 0
  params_.max_pages_per_seq = first.max_pages_per_seq;
  params_.norm_eps = static_cast<float>(config.rms_norm_eps);
  params_.attention_scale = 1.0f / std::sqrt(static_cast<float>(config.head_dim));
  params_.sliding_window = config.sliding_window;
  params_.workspace = workspace_.data();
}

void PersistentDecodeStep::run(const int32_t* id, const int32_t* position, const int32_t* seq_len,
                               __nv_bfloat16* residual, cudaStream_t stream) const {
  DF_CHECK(available(), why_not_);
  kernels::PersistentDecodeParams p = params_;
  p.id = id;
  p.position = position;
  p.seq_len = seq_len;
  p.residual = residual;
  DF_CHECK_CUDA(kernels::launch_persistent_decode(p, stream));
}

}  // namespace deepfuse::runtime
