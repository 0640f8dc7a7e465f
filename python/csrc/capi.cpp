// The C ABI of the Python package: one plain function per kernel launcher of
// include/deepfuse/kernels/, taking raw device pointers, sizes and a cudaStream_t (PyTorch's
// current stream). python/deepfuse/_lib.py loads this library with ctypes and
// python/deepfuse/ops.py registers the torch.library ops around it.
//
// Every function returns 0 on success, a cudaError_t code where a launcher returned one, or -1
// where a deepfuse::Error (or another C++ exception) was thrown; df_last_error() then gives the
// message. Nothing here allocates, synchronises or reads the environment: every call only
// enqueues work on the given stream, so it can be captured in a CUDA graph. The one exception is
// the benchmark support at the end (python -m deepfuse.bench), which measures the device.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <string>

#include "core/roofline.hpp"
#include "deepfuse/device.hpp"
#include "deepfuse/kernels/decode_attention.hpp"
#include "deepfuse/kernels/paged_kv.hpp"
#include "deepfuse/kernels/qkv_rope_fused.hpp"
#include "deepfuse/kernels/rms_norm.hpp"
#include "deepfuse/kernels/rope_kv_append.hpp"
#include "deepfuse/kernels/sampling.hpp"
#include "deepfuse/kernels/swiglu_elementwise.hpp"
#include "deepfuse/kernels/swiglu_fused.hpp"

#define DF_API extern "C" __attribute__((visibility("default")))

namespace {

thread_local std::string last_error;

template <typename F>
int guarded(F&& body) {
  try {
    const cudaError_t status = body();
    if (status != cudaSuccess) last_error = cudaGetErrorString(status);
    return static_cast<int>(status);
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  } catch (...) {
    last_error = "unknown C++ exception";
    return -1;
  }
}

using bf16 = __nv_bfloat16;
inline const bf16* cbf(const void* p) { return static_cast<const bf16*>(p); }
inline bf16* mbf(void* p) { return static_cast<bf16*>(p); }
inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

deepfuse::kernels::PagedKv paged_kv(void* k_pages, void* v_pages, const void* block_table, int max_pages_per_seq,
                                    int kv_heads, int head_dim) {
  deepfuse::kernels::PagedKv kv;
  kv.k_pages = mbf(k_pages);
  kv.v_pages = mbf(v_pages);
  kv.block_table = static_cast<const int32_t*>(block_table);
  kv.max_pages_per_seq = max_pages_per_seq;
  kv.kv_heads = kv_heads;
  kv.head_dim = head_dim;
  return kv;
}

// The plan travels through Python as these integers, in this order.
constexpr int kPlanFields = 11;

void plan_to_ints(const deepfuse::kernels::DecodeAttentionPlan& p, int64_t* out) {
  const int64_t values[kPlanFields] = {p.batch, p.q_heads, p.kv_heads, p.head_dim, p.max_context,
                                       p.splits_per_sequence, p.pages_per_split, p.min_pages_per_split,
                                       p.warps_per_block, p.cluster_merge ? 1 : 0,
                                       static_cast<int64_t>(p.workspace_bytes)};
  std::memcpy(out, values, sizeof(values));
}

deepfuse::kernels::DecodeAttentionPlan plan_from_ints(const int64_t* v) {
  deepfuse::kernels::DecodeAttentionPlan p;
  p.batch = static_cast<int>(v[0]);
  p.q_heads = static_cast<int>(v[1]);
  p.kv_heads = static_cast<int>(v[2]);
  p.head_dim = static_cast<int>(v[3]);
  p.max_context = static_cast<int>(v[4]);
  p.splits_per_sequence = static_cast<int>(v[5]);
  p.pages_per_split = static_cast<int>(v[6]);
  p.min_pages_per_split = static_cast<int>(v[7]);
  p.warps_per_block = static_cast<int>(v[8]);
  p.cluster_merge = v[9] != 0;
  p.workspace_bytes = static_cast<size_t>(v[10]);
  return p;
}

}  // namespace

DF_API const char* df_last_error() { return last_error.c_str(); }
DF_API int df_abi_version() { return 2; }
DF_API int df_plan_fields() { return kPlanFields; }
DF_API int df_kv_page_size() { return deepfuse::kernels::kKvPageSize; }
DF_API int df_qkv_fused_max_tokens() { return deepfuse::kernels::kQkvFusedMaxTokens; }
DF_API int df_swiglu_fused_counters() { return deepfuse::kernels::kSwigluFusedCounters; }

// ---- SwiGLU MLP ----
DF_API int df_pack_swiglu(const void* gate, const void* up, const void* norm_weight, void* gate_up_packed,
                          const void* down, void* down_packed, int hidden, int intermediate, void* stream) {
  return guarded([&] {
    cudaError_t e = deepfuse::kernels::pack_swiglu_gate_up(cbf(gate), cbf(up), cbf(norm_weight),
                                                            static_cast<uint4*>(gate_up_packed), hidden,
                                                            intermediate, as_stream(stream));
    if (e != cudaSuccess) return e;
    return deepfuse::kernels::pack_swiglu_down(cbf(down), static_cast<uint4*>(down_packed), hidden, intermediate,
                                               as_stream(stream));
  });
}

DF_API int df_swiglu_fused(const void* x, const void* gate_up_packed, const void* down_packed, const void* residual,
                           void* y, int rms_normalize, float eps, void* accumulator, void* counters, int tokens,
                           int hidden, int intermediate, void* stream) {
  return guarded([&] {
    deepfuse::kernels::SwigluFusedParams p;
    p.x = cbf(x);
    p.gate_up = static_cast<const uint4*>(gate_up_packed);
    p.down = static_cast<const uint4*>(down_packed);
    p.residual = cbf(residual);
    p.y = mbf(y);
    p.rms_normalize = rms_normalize != 0;
    p.norm_eps = eps;
    p.accumulator = static_cast<float*>(accumulator);
    p.counters = static_cast<unsigned*>(counters);
    p.tokens = tokens;
    p.hidden = hidden;
    p.intermediate = intermediate;
    return deepfuse::kernels::launch_swiglu_fused(p, deepfuse::FusedMlpTuning{}, as_stream(stream));
  });
}

DF_API int df_silu_and_mul(const void* gate_up, void* act, int tokens, int intermediate, void* stream) {
  return guarded([&] {
    return deepfuse::kernels::silu_and_mul(cbf(gate_up), mbf(act), tokens, intermediate, as_stream(stream));
  });
}

// ---- RMSNorm ----
DF_API int df_add_rms_norm(void* residual, const void* x, const void* weight, void* out, int rows, int hidden,
                           float eps, void* stream) {
  return guarded([&] {
    deepfuse::kernels::RmsNormParams p;
    p.residual = mbf(residual);
    p.x = cbf(x);
    p.weight = cbf(weight);
    p.out = mbf(out);
    p.rows = rows;
    p.hidden = hidden;
    p.eps = eps;
    return x ? deepfuse::kernels::launch_add_rms_norm(p, as_stream(stream))
             : deepfuse::kernels::launch_rms_norm(p, as_stream(stream));
  });
}

// ---- QKV + RoPE + paged append ----
DF_API int df_pack_qkv(const void* weights, void* packed, int rows, int hidden, void* stream) {
  return guarded([&] {
    return deepfuse::kernels::pack_qkv_weights(cbf(weights), static_cast<uint4*>(packed), rows, hidden,
                                               as_stream(stream));
  });
}

DF_API int df_qkv_rope_fused(const void* x, const void* norm_weight, float eps, const void* packed, const void* bias,
                             const void* inv_freq, const void* positions, const void* sequences, void* q_out,
                             void* k_pages, void* v_pages, const void* block_table, int max_pages_per_seq,
                             int kv_heads, int head_dim, int tokens, int hidden, int q_heads, void* stream) {
  return guarded([&] {
    deepfuse::kernels::QkvRopeFusedParams p;
    p.x = cbf(x);
    p.norm_weight = cbf(norm_weight);
    p.norm_eps = eps;
    p.weights = static_cast<const uint4*>(packed);
    p.bias = cbf(bias);
    p.inv_freq = static_cast<const float*>(inv_freq);
    p.positions = static_cast<const int32_t*>(positions);
    p.sequences = static_cast<const int32_t*>(sequences);
    p.q_out = mbf(q_out);
    p.kv = paged_kv(k_pages, v_pages, block_table, max_pages_per_seq, kv_heads, head_dim);
    p.tokens = tokens;
    p.hidden = hidden;
    p.q_heads = q_heads;
    return deepfuse::kernels::launch_qkv_rope_fused(p, as_stream(stream));
  });
}

DF_API int df_rope_kv_append(const void* qkv, const void* bias, const void* inv_freq, const void* positions,
                             const void* sequences, void* q_out, void* k_pages, void* v_pages,
                             const void* block_table, int max_pages_per_seq, int kv_heads, int head_dim, int tokens,
                             int q_heads, void* stream) {
  return guarded([&] {
    deepfuse::kernels::RopeKvAppendParams p;
    p.qkv = cbf(qkv);
    p.qkv_bias = cbf(bias);
    p.inv_freq = static_cast<const float*>(inv_freq);
    p.positions = static_cast<const int32_t*>(positions);
    p.sequences = static_cast<const int32_t*>(sequences);
    p.q_out = mbf(q_out);
    p.kv = paged_kv(k_pages, v_pages, block_table, max_pages_per_seq, kv_heads, head_dim);
    p.tokens = tokens;
    p.q_heads = q_heads;
    return deepfuse::kernels::launch_rope_kv_append(p, as_stream(stream));
  });
}

// ---- Decode attention ----
DF_API int df_plan_decode_attention(int batch, int q_heads, int kv_heads, int head_dim, int max_context, int num_sms,
                                    int forced_splits, int64_t* plan_out) {
  return guarded([&] {
    const auto plan = deepfuse::kernels::plan_decode_attention(batch, q_heads, kv_heads, head_dim, max_context,
                                                               num_sms, forced_splits);
    plan_to_ints(plan, plan_out);
    return cudaSuccess;
  });
}

DF_API int df_decode_attention(const int64_t* plan_ints, const void* q, void* out, void* k_pages, void* v_pages,
                               const void* block_table, int max_pages_per_seq, const void* seq_lens, void* workspace,
                               float scale, int sliding_window, void* stream) {
  return guarded([&] {
    const auto plan = plan_from_ints(plan_ints);
    deepfuse::kernels::DecodeAttentionParams p;
    p.q = cbf(q);
    p.out = mbf(out);
    p.kv = paged_kv(k_pages, v_pages, block_table, max_pages_per_seq, plan.kv_heads, plan.head_dim);
    p.seq_lens = static_cast<const int32_t*>(seq_lens);
    p.workspace = workspace;
    p.scale = scale;
    p.sliding_window = sliding_window;
    return deepfuse::kernels::launch_decode_attention(plan, p, as_stream(stream));
  });
}

// ---- Sampling ----
DF_API int df_sampling_slot_bytes() { return static_cast<int>(sizeof(deepfuse::kernels::SamplingSlot)); }

DF_API int64_t df_sampling_workspace_bytes(int batch, int vocab) {
  return static_cast<int64_t>(deepfuse::kernels::sampling_workspace_bytes(batch, vocab));
}

DF_API int df_sample(const void* logits, void* slots, void* ids, void* workspace, int batch, int vocab, void* stream) {
  return guarded([&] {
    deepfuse::kernels::SamplingParams p;
    p.logits = static_cast<const float*>(logits);
    p.slots = static_cast<deepfuse::kernels::SamplingSlot*>(slots);
    p.ids = static_cast<int32_t*>(ids);
    p.workspace = workspace;
    p.batch = batch;
    p.vocab = vocab;
    return deepfuse::kernels::launch_sampling(p, as_stream(stream));
  });
}

// ---- Benchmark support: what `deepfuse bench` measures, so both report against one floor ----
// The device-to-device copy bandwidth exactly as the C++ benchmarks measure it (a 1 GiB copy,
// read + write counted, median of `repetitions`, core/device.cpp): allocates two buffers of
// `bytes` and synchronises. Writes bytes/s to *out.
DF_API int df_measure_copy_bandwidth(int64_t bytes, int repetitions, void* stream, double* out) {
  return guarded([&] {
    *out = deepfuse::measure_copy_bandwidth(static_cast<size_t>(bytes), repetitions, as_stream(stream));
    return cudaSuccess;
  });
}

// Device `ordinal`'s DRAM peak and the fastest any read goes there given the measured copy
// bandwidth (bytes/s), and its L2 size: the inputs of df_physically_possible (core/roofline.hpp).
DF_API int df_read_ceiling(int ordinal, double copy_bytes_per_s, double* dram_peak, double* read_ceiling,
                           int64_t* l2_bytes) {
  return guarded([&] {
    const deepfuse::DeviceInfo device = deepfuse::query_device(ordinal);
    *dram_peak = deepfuse::dram_peak_bandwidth(device);
    *read_ceiling = deepfuse::read_ceiling(device, copy_bytes_per_s);
    *l2_bytes = static_cast<int64_t>(device.l2_bytes);
    return cudaSuccess;
  });
}

// 1 when a call that must read `bytes` can take `seconds` (core/roofline.hpp), 0 when it cannot,
// -1 for bad input (df_last_error says which). Pure: needs no device.
DF_API int df_physically_possible(double bytes, double seconds, double read_bytes_per_s, int64_t l2_bytes) {
  try {
    return deepfuse::physically_possible(bytes, seconds, read_bytes_per_s, static_cast<size_t>(l2_bytes)) ? 1 : 0;
  } catch (const std::exception& e) {
    last_error = e.what();
    return -1;
  }
}
