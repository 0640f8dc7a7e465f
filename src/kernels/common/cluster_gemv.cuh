// The weight stream shared by the decode-step projections that end in an epilogue of their own
// (the fused QKV front half, the o_proj + residual): out[unit rows][tokens] = x · W_unit^T, with
// an optional RMSNorm of x folded in, for up to 32 tokens.
//
// One thread-block cluster of C blocks per "unit" of kUnitRows output rows; the blocks split the
// inner (k) dimension. Each warp streams one 16-row tile (two warps share a tile when a unit has
// 4 tiles) through a per-thread cp.async ring, mma.m16n8k16 with the weights on the 16-row side
// and up to 8 tokens per n-tile; x (times the norm weight) is staged in shared memory for the
// block's k range, rows padded so B-fragment loads are conflict-free. Each warp stores its partial
// sums straight into the shared memory of the block whose epilogue finishes those rows (the
// caller's home_of: every block finishes its own slice), one slot per source warp; after one
// cluster barrier each block adds its rows' partials from its own shared memory and may leave
// without waiting for the others. Design history and timings: docs/kernels/qkv_rope_fused.md.
//
// Weights are fragment-packed by pack_rows_fragments (kernels/common/fragment.cuh's A layout): for
// each 16-row tile, for each 16-column k-step, 32 lanes x 16 bytes. FP8 weights (e4m3, packed by
// pack_rows_fragments_fp8) carry two k-steps per 16-byte load, half the bytes per row: the ring,
// the splits and the staged x count loads ("steps") of kColumns columns, the bytes widen to f16
// in registers, x is staged as f16 and the fp32 scales multiply the sums (per output row at the
// end, per 128x128 block as each block's k range ends). Design and timings: docs/kernels/fp8.md.
#pragma once

#include "core/per_device.hpp"

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <type_traits>
#include <utility>

#include "core/device_attributes.hpp"
#include "kernels/common/async_ring.cuh"
#include "kernels/common/cluster_launch.hpp"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/residual_sum.cuh"
#include "kernels/common/trace.cuh"
#include "deepfuse/kernels/cluster_gemv.hpp"
#include "deepfuse/kernels/gemv_packing.hpp"
#include "kernels/common/fragment.cuh"

namespace deepfuse::kernels::cluster_gemv {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxTokens = 32;
constexpr int kMaxCluster = 8;
constexpr int kMaxSharedBytes = kClusterGemvSharedBytes;

// The weight elements a stream reads; scale granularity is a runtime parameter (Inputs).
enum class Elements { bf16, e4m3 };
// Columns one 16-byte lane load covers: one k-step of bf16, two of e4m3.
template <Elements E>
constexpr int kColumns = E == Elements::bf16 ? 16 : 32;

// cp.async ring depth per thread (16 B per stage). 10 stages keep a block of up to 8 tokens
// under 56 KB, so 4 fit an SM and all 48 clusters of Llama-3-8B's QKV (48 heads) run in one wave
// (docs/kernels/qkv_rope_fused.md, "Versions", v3). ~150 KB in flight per SM. 32-token launches
// stage 4x the x rows: a shorter ring. Clusters of 4 (short inner dimensions, see dispatch) give
// each block twice the k-steps of a cluster of 8: 18 stages prime a warp's whole share at inner
// 2048, two blocks per SM (docs/kernels/qkv_rope_fused.md, "Clusters of 4 over a short inner
// dimension").
// This is the default depth; stream_unit and launch take the depth as kStages, and o_proj's
// packed grid of at most two blocks per SM gets two more (gemv_residual.cu).
template <int NT, int C>
constexpr int ring_stages() {
  return NT == 4 ? 6 : NT == 1 && C == 4 ? 18 : 10;
}
// The fused QKV kernel's spread grids (up to 8 tokens): a spread block has the shared memory of
// one of three per SM whatever its ring needs, room for 14 stages (qkv_rope_fused.cu).
constexpr int kSpreadRingStages = 14;

// Where the epilogue finishes an output row of the unit: block `rank` of the cluster, at `slot`
// among that block's rows.
struct RowHome {
  int rank;
  int slot;
};

// Rows one block may finish: its slice of the unit's rows, or (the QKV epilogue) its slice of the
// rotation pairs, two rows each.
template <int kUnitRows, int C>
constexpr int owned_rows() {
  return 2 * ((kUnitRows / 2 + C - 1) / C);
}
// Partial sums each row receives: one per warp streaming its tile, in each block of the cluster.
template <int kUnitRows, int C>
constexpr int sources() {
  return C * (kWarps / (kUnitRows / 16));
}

// Shared memory, carved from one dynamic allocation (sizes depend on the launch).
template <int kUnitRows, int C>
struct SharedLayout {
  int x_stride = 0;  // 16-bit values per staged x row: k range + 8 (padding: conflict-free B fragments)
  size_t ring = 0, received = 0, squares = 0, inverse_rms = 0, x = 0, total = 0;

  // max_ksteps: the most loads of `columns` columns a block streams.
  __host__ __device__ SharedLayout(int stages, int max_ksteps, int token_rows, int columns = 16) {
    x_stride = max_ksteps * columns + 8;
    ring = 0;
    received = ring + sizeof(uint4) * stages * kThreads;
    squares = received + sizeof(float) * sources<kUnitRows, C>() * owned_rows<kUnitRows, C>() * token_rows;
    inverse_rms = squares + sizeof(float) * C * kMaxTokens;
    x = inverse_rms + sizeof(float) * kMaxTokens;
    total = x + sizeof(__nv_bfloat16) * static_cast<size_t>(token_rows) * x_stride;
  }
};

struct Inputs {
  const __nv_bfloat16* x = nullptr;            // [tokens, inner]
  const __nv_bfloat16* norm_weight = nullptr;  // [inner] or null: no RMSNorm
  float norm_eps = 1e-6f;
  const uint4* weights = nullptr;              // fragment-packed [rows, inner]
  int tokens = 0;
  int inner = 0;                               // multiple of 16 (bf16) or 32 (e4m3)
  // [tokens, inner] fp32 or null: a sum a kernel before left for x (the fused MLP's defer_sum).
  // The rows used are bf16(x + pending), exactly what that kernel would have written into x.
  const float* pending = nullptr;
  // e4m3 weights: fp32 scales, one per output row ([rows]) or, with scale_block > 0, one per
  // scale_block x scale_block block ([rows / scale_block][inner / scale_block]).
  const float* scales = nullptr;
  int scale_block = 0;
};

// bf16(x + pending) for 8 consecutive columns, rounded as the fused MLP's finish rounds y.
__device__ __forceinline__ uint4 add_pending(uint4 bits, float4 low, float4 high) {
  return make_uint4(residual_sum_pair(low.x, low.y, bits.x), residual_sum_pair(low.z, low.w, bits.y),
                    residual_sum_pair(high.x, high.y, bits.z), residual_sum_pair(high.z, high.w, bits.w));
}

// The sums of this block's rows (the slots its home_of gave them), complete after stream_unit.
template <int NT, int kUnitRows, int C>
struct Partials {
  static constexpr int kRows = 8 * NT;
  static constexpr int kOwned = owned_rows<kUnitRows, C>();
  const float* received;     // [sources][kOwned][kRows]: every streaming warp's partial sums
  const float* inverse_rms;  // [tokens] 1/rms(x) over the whole row (1 without a norm)

  __device__ float sum(int slot, int token) const {
    float total = 0.0f;
#pragma unroll
    for (int source = 0; source < sources<kUnitRows, C>(); ++source)
      total += received[(source * kOwned + slot) * kRows + token];
    return total;
  }
};

// Streams unit `unit`'s weights; returns after the cluster barrier, with every partial sum of
// the rows home_of(row) puts in this block in its own shared memory, so the caller finishes its
// rows and leaves without another cluster barrier. after_upstream() runs once the upstream grids
// are complete, while the first weights are in flight: the place to start the epilogue's reads
// of what the kernel before wrote.
struct NothingAfterUpstream {
  __device__ void operator()() const {}
};
template <int NT, int kUnitRows, int C, int kStages, Elements E, typename HomeOf,
          typename AfterUpstream = NothingAfterUpstream>
__device__ Partials<NT, kUnitRows, C> stream_unit(const Inputs& in, int unit, int rank, unsigned char* shared_raw,
                                                  int max_ksteps, HomeOf home_of,
                                                  AfterUpstream after_upstream = {}) {
  constexpr int kRows = 8 * NT;  // token rows of the MMA (tokens padded with zeros)
  constexpr int kTiles = kUnitRows / 16;
  constexpr int kWarpsPerTile = kWarps / kTiles;
  static_assert(kTiles * kWarpsPerTile == kWarps, "a unit is 64 or 128 rows");
  constexpr int kOwned = owned_rows<kUnitRows, C>();
  constexpr bool kFp8 = E == Elements::e4m3;
  const SharedLayout<kUnitRows, C> layout(kStages, max_ksteps, kRows, kColumns<E>);
  auto* ring = reinterpret_cast<uint4(*)[kThreads]>(shared_raw + layout.ring);
  float* received = reinterpret_cast<float*>(shared_raw + layout.received);
  float* squares = reinterpret_cast<float*>(shared_raw + layout.squares);  // [C][kMaxTokens] per-block sums of x^2
  float* inverse_rms = reinterpret_cast<float*>(shared_raw + layout.inverse_rms);
  auto* xs = reinterpret_cast<__nv_bfloat16*>(shared_raw + layout.x);  // [kRows][x_stride] x (∘ w), bf16 or f16

  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int ksteps = in.inner / kColumns<E>;  // loads per row
  const int k_begin = split_point(ksteps, C, rank), k_count = split_point(ksteps, C, rank + 1) - k_begin;
  const int tile = warp % kTiles, part = warp / kTiles;
  const int warp_begin = k_begin + split_point(k_count, kWarpsPerTile, part);
  const int warp_end = k_begin + split_point(k_count, kWarpsPerTile, part + 1);
  const uint4* tile_weights = in.weights + static_cast<size_t>(unit * kTiles + tile) * ksteps * 32 + lane;

  const uint64_t streamed = evict_first_policy();  // the weights are read once
  auto issue = [&](int k, int stage, int) {
    copy16_async_streamed(&ring[stage][tid], tile_weights + static_cast<size_t>(k) * 32, streamed);
  };
  ring_prime<kStages, 1>(warp_begin, warp_end, issue);  // constant weights: before the upstream wait
  // Blocks write into each other's shared memory below (sums of squares, partial sums): only once
  // every block of the cluster has started. Here, before the upstream wait, the barrier is off
  // the critical path of a programmatic launch.
  cluster_barrier<C>();
  wait_for_upstream_grids();
  trace::stamp(trace::Kernel::unknown, trace::Mark::upstream);
  allow_downstream_launch();
  after_upstream();

  // Stage x (∘ w) for this block's k range (one warp per token row) while the first weights fly;
  // each row's sum of squares goes to every block of the cluster.
  const int vectors = k_count * kColumns<E> / 8;  // 8-column vectors
  for (int row = warp; row < kRows; row += kWarps) {
    float row_squares = 0.0f;
    for (int v = lane; v < vectors; v += 32) {
      const int column = k_begin * kColumns<E> + v * 8;
      // Every load first (one L2 round trip on the critical path after the upstream wait), then
      // the arithmetic.
      const bool live = row < in.tokens;
      const size_t offset = static_cast<size_t>(row) * in.inner + column;
      uint4 bits = make_uint4(0, 0, 0, 0), weight = make_uint4(0, 0, 0, 0);
      float4 pending_low = make_float4(0, 0, 0, 0), pending_high = pending_low;
      if (live) bits = *reinterpret_cast<const uint4*>(in.x + offset);
      if (live && in.pending) {
        pending_low = *reinterpret_cast<const float4*>(in.pending + offset);
        pending_high = *reinterpret_cast<const float4*>(in.pending + offset + 4);
      }
      if (in.norm_weight) weight = __ldg(reinterpret_cast<const uint4*>(in.norm_weight + column));
      if (live && in.pending) bits = add_pending(bits, pending_low, pending_high);
      if constexpr (kFp8) {  // f16 operands: x ∘ w in fp32, rounded once
        uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
        const uint32_t w[4] = {weight.x, weight.y, weight.z, weight.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float2 f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[j]));
          row_squares += f.x * f.x + f.y * f.y;
          float2 scale = make_float2(1.0f, 1.0f);
          if (in.norm_weight) scale = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w[j]));
          words[j] = f16x2_saturated(f.x * scale.x, f.y * scale.y);
        }
        bits = make_uint4(words[0], words[1], words[2], words[3]);
      } else if (in.norm_weight) {
        uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
        const uint32_t w[4] = {weight.x, weight.y, weight.z, weight.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const __nv_bfloat162 pair = *reinterpret_cast<const __nv_bfloat162*>(&words[j]);
          const float2 f = __bfloat1622float2(pair);
          row_squares += f.x * f.x + f.y * f.y;
          const __nv_bfloat162 scaled = __hmul2(pair, *reinterpret_cast<const __nv_bfloat162*>(&w[j]));
          words[j] = *reinterpret_cast<const uint32_t*>(&scaled);
        }
        bits = make_uint4(words[0], words[1], words[2], words[3]);
      }
      *reinterpret_cast<uint4*>(xs + row * layout.x_stride + v * 8) = bits;
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) row_squares += __shfl_xor_sync(0xffffffffu, row_squares, offset);
    if (lane < C) in_block<C>(squares, lane)[rank * kMaxTokens + row] = row_squares;  // to every block
  }
  __syncthreads();  // xs complete

  float acc[NT][4] = {};
  if constexpr (!kFp8) {
    ring_run<kStages, 1>(warp_begin, warp_end, issue, [&](int k, int stage, int) {
      const uint4 a = ring[stage][tid];
      const int column = (k - k_begin) * 16 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const __nv_bfloat16* b = xs + (nt * 8 + g) * layout.x_stride + column;
        mma_bf16_m16n8k16(acc[nt], a, *reinterpret_cast<const uint32_t*>(b), *reinterpret_cast<const uint32_t*>(b + 8));
      }
    });
  } else {
    // Raw sums of the current scale block, folded into acc times its scale where the block's
    // columns end (block scales) or once at the end (row scales, applied below).
    float part[NT][4] = {};
    const int tile_row = unit * kUnitRows + tile * 16;
    const int steps_per_block = in.scale_block / kColumns<E>;
    const float* block_scales =
        in.scale_block ? in.scales + static_cast<size_t>(tile_row / in.scale_block) * (in.inner / in.scale_block) : nullptr;
    ring_run<kStages, 1>(warp_begin, warp_end, issue, [&](int k, int stage, int) {
      const uint4 packed = ring[stage][tid];
      const uint4 a0 = e4m3_fragment_to_f16(packed.x, packed.y), a1 = e4m3_fragment_to_f16(packed.z, packed.w);
      const int column = (k - k_begin) * 32 + 2 * t;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const uint32_t* b = reinterpret_cast<const uint32_t*>(xs + (nt * 8 + g) * layout.x_stride + column);
        mma_f16_m16n8k16(part[nt], a0, b[0], b[4]);
        mma_f16_m16n8k16(part[nt], a1, b[8], b[12]);
      }
      const bool block_ends = block_scales && (k + 1) % steps_per_block == 0;
      if (block_ends || k == warp_end - 1) {
        const float scale = block_scales ? block_scales[k / steps_per_block] : 1.0f;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) acc[nt][c] += scale * part[nt][c], part[nt][c] = 0.0f;
      }
    });
    if (!block_scales) {
      const float low = in.scales[tile_row + g], high = in.scales[tile_row + g + 8];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) acc[nt][0] *= low, acc[nt][1] *= low, acc[nt][2] *= high, acc[nt][3] *= high;
    }
  }
  trace::stamp(trace::Kernel::unknown, trace::Mark::phase);
  // Each partial sum goes to its row's home, in this warp's own slot (no atomics, nothing to
  // zero first): plain distributed-shared-memory stores, ordered by the cluster barrier.
  const int source = rank * kWarpsPerTile + part;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const RowHome home = home_of(tile * 16 + g + 8 * half);
    float* slots = in_block<C>(received, home.rank) + (source * kOwned + home.slot) * kRows;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      slots[nt * 8 + 2 * t] = acc[nt][2 * half];
      slots[nt * 8 + 2 * t + 1] = acc[nt][2 * half + 1];
    }
  }
  cluster_barrier<C>();  // every partial sum and sum of squares is home
  trace::stamp(trace::Kernel::unknown, trace::Mark::barrier);

  if (tid < in.tokens) {
    float total = 0.0f;
#pragma unroll
    for (int b = 0; b < C; ++b) total += squares[b * kMaxTokens + tid];
    inverse_rms[tid] = in.norm_weight ? rsqrtf(total / in.inner + in.norm_eps) : 1.0f;
  }
  __syncthreads();
  return {received, inverse_rms};
}

// Loads (kColumns<E> columns each) of the largest of `Parts` near-equal shares of the inner dimension.
template <int Parts, Elements E = Elements::bf16>
constexpr int max_ksteps_per_share(int inner) {
  return (inner / kColumns<E> + Parts - 1) / Parts;
}
// ... of the largest block of a unit's cluster (the blocks split the inner dimension).
template <int C, Elements E = Elements::bf16>
constexpr int max_ksteps_per_block(int inner) {
  return max_ksteps_per_share<C, E>(inner);
}

// Spread grids (see dispatch): at most this many blocks per SM, for inner dimensions of at least
// kSpreadMinInner.
constexpr int kSpreadBlocksPerSm = 3;
constexpr int kSpreadMinInner = 3072;

// The dynamic shared memory per block that lets at most `per_sm` blocks share an SM: the SM's
// shared memory over per_sm, less the runtime's reservation per block (75 KB for 3 on an H200).
cudaError_t shared_bytes_for_blocks_per_sm(int per_sm, size_t& bytes);

// Launches kernel<<<units * C blocks in clusters of C>>>(params, max_ksteps) with the shared
// memory stream_unit<NT, kUnitRows, C> needs; cudaErrorNotSupported when that exceeds what one
// block may have (no clusters and a large inner dimension: the caller falls back). spread: each
// block asks for the shared memory of one of kSpreadBlocksPerSm blocks per SM, and the launch is
// refused with cudaErrorCooperativeLaunchTooLarge (nothing launched) unless every cluster of the
// grid can be resident at once.
template <int NT, int kUnitRows, int C, int kStages = ring_stages<NT, C>(), Elements E = Elements::bf16,
          typename Params>
cudaError_t launch(void (*kernel)(Params, int), const Params& params, int units, int inner, cudaStream_t stream,
                   bool spread = false) {
  const int max_ksteps = max_ksteps_per_block<C, E>(inner);
  const SharedLayout<kUnitRows, C> layout(kStages, max_ksteps, 8 * NT, kColumns<E>);
  if (layout.total > static_cast<size_t>(kMaxSharedBytes)) return cudaErrorNotSupported;
  // Per device: a kernel's shared-memory opt-in holds only on the device it was made on
  // (tensor-parallel engines launch this from one thread per GPU).
  static PerDevice<bool> opted_in;
  bool done = false;
  const cudaError_t attribute = opted_in.get(done, [&](bool& value) {
    cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSharedBytes);
    // The largest carve-out: 4 blocks of ~54 KB need more than the 200 KB one 3 blocks get.
    if (e == cudaSuccess)
      e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
    value = e == cudaSuccess;
    return e;
  });
  if (attribute != cudaSuccess) return attribute;
  size_t shared_bytes = layout.total;
  if (spread) {
    size_t spread_bytes = 0;
    if (cudaError_t e = shared_bytes_for_blocks_per_sm(kSpreadBlocksPerSm, spread_bytes); e != cudaSuccess) return e;
    shared_bytes = std::max(shared_bytes, spread_bytes);
    if (shared_bytes > static_cast<size_t>(kMaxSharedBytes)) return cudaErrorCooperativeLaunchTooLarge;
    // Resident clusters for this instantiation at this size, per device (queried once each).
    static std::mutex mutex;
    static std::map<std::pair<int, size_t>, int> resident;
    int device = 0, clusters = 0;
    if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto it = resident.find({device, shared_bytes});
      if (it == resident.end()) {
        const ClusterLaunch probe(static_cast<unsigned>(units * C), kThreads, shared_bytes, C, nullptr);
        if (cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe.config); e != cudaSuccess) return e;
        it = resident.emplace(std::pair{device, shared_bytes}, clusters).first;
      }
      clusters = it->second;
    }
    if (clusters < units) return cudaErrorCooperativeLaunchTooLarge;
  }
  const ClusterLaunch launch(static_cast<unsigned>(units * C), kThreads, shared_bytes, C, stream,
                            /*programmatic=*/true);
  return cudaLaunchKernelEx(&launch.config, kernel, params, max_ksteps);
}

// Calls launch_instance(nt, c, spread, sms) with std::integral_constant values nt (the n-tiles of
// 8 tokens `tokens` needs: 1, 2 or 4) and c (the cluster size), whether launch() spreads the
// grid, and the device's SM count. Without clusters (before Hopper, or fewer k-steps than
// kMaxCluster) c = 1.
//
// Spreading, at up to 16 tokens and inner >= kSpreadMinInner: a unit's blocks stream equal bytes,
// but blocks that share an SM with more of them finish later, and the packed grid ends with its
// most crowded SMs. So the grid takes at most kSpreadBlocksPerSm blocks per SM: clusters of 8 when
// all units' clusters are then resident at once, else clusters of 6 (more, smaller blocks per
// unit), else the packed grid of 8 (docs/kernels/qkv_rope_fused.md, "Spread grids: at most 3
// blocks per SM"). Up to 8 tokens a grid whose packed blocks already fall evenly on the SMs (the
// fullest at most 10% above the mean) stays packed: spreading it measured slower (same file, "One
// token: packed when the packed grid is already even", and "Clusters of 4 over a short inner
// dimension").
//
// Short inner dimensions (below kSpreadMinInner, packed grids) at up to 16 tokens take clusters
// of 4 instead of 8: half as many blocks, each with twice the k-steps, so the grid is placed
// sooner as the kernel before frees its SMs and pays its per-block costs (x staging, cluster
// barrier, epilogue) half as often (docs/kernels/qkv_rope_fused.md, "Clusters of 4 over a short
// inner dimension"). Wider inner dimensions measured slower in clusters of 4 and keep 8.
//
// FP8 weights (columns_per_load 32) take the same grids as bf16 of the same inner size (placing
// them by their bytes instead, as bf16 of half the inner size, measured slower: docs/kernels/fp8.md).
template <typename LaunchInstance>
cudaError_t dispatch(int tokens, int inner, int units, LaunchInstance&& launch_instance, int columns_per_load = 16) {
  DeviceAttributes device;
  if (cudaError_t e = current_device_attributes(device); e != cudaSuccess) return e;
  const int sms = device.sm_count;
  const bool clusters = device.has_clusters() && inner / columns_per_load >= kMaxCluster;
  const double packed_per_sm = static_cast<double>(units) * kMaxCluster / sms;
  const bool packed_is_even = std::ceil(packed_per_sm) <= 1.1 * packed_per_sm;
  using std::integral_constant;
  auto with_tiles = [&](auto nt) {
    if (!clusters) return launch_instance(nt, integral_constant<int, 1>{}, false, sms);
    if constexpr (decltype(nt)::value <= 2) {  // 32-token launches always take the packed grid of 8
      if (inner < kSpreadMinInner) return launch_instance(nt, integral_constant<int, 4>{}, false, sms);
      if (!(decltype(nt)::value == 1 && packed_is_even)) {
        cudaError_t e = launch_instance(nt, integral_constant<int, 8>{}, true, sms);
        if (e == cudaErrorCooperativeLaunchTooLarge) e = launch_instance(nt, integral_constant<int, 6>{}, true, sms);
        if (e != cudaErrorCooperativeLaunchTooLarge) return e;
      }
    }
    return launch_instance(nt, integral_constant<int, kMaxCluster>{}, false, sms);
  };
  if (tokens <= 8) return with_tiles(integral_constant<int, 1>{});
  if (tokens <= 16) return with_tiles(integral_constant<int, 2>{});
  return with_tiles(integral_constant<int, 4>{});
}

}  // namespace deepfuse::kernels::cluster_gemv
