// DeepFusion SwiGLU MLP: y = down(silu(x·Wg^T) * (x·Wu^T)) (+ residual) in ONE launch.
//
// The two numbers (decode, tokens M <= 16): bytes = 3·H·I·2 of weights, FLOPs = 6·M·H·I, i.e.
// ~2·M FLOP per weight byte, far under the H200's ~180 FLOP/byte: the floor is weight bytes over
// the copy bandwidth (82 µs for Llama-3-8B's 4096x14336 at 4.3 TB/s).
//
// Work split. Block b owns a contiguous slice of the intermediate dimension (1..8 tiles of 16
// rows of I, balanced across the grid).
//   Phase 1: its warps compute g = x·Wg^T and u = x·Wu^T for that slice (warps split the slice's
//            tiles and, when tiles < warps, the H dimension; partials meet in shared memory),
//            then act = silu(g)*u, rounded to bf16, stays in shared memory.
//   Phase 2: the block multiplies its act slice by the matching columns of Wd: a partial y for
//            every output row, added into an fp32 accumulator in L2 with vector reductions
//            (red.global.add.v4.f32: one L2 operation per 4 tokens of a row).
//   Finish:  the last `finishers` blocks to arrive convert the accumulator to bf16 (+residual),
//            write y and zero the accumulator and counters for the next launch.
// The intermediate never leaves the SM; HBM sees the weights once, x, and y.
//
// Tensor cores: mma.m16n8k16 with weights on the 16-row side and tokens on the 8-wide side, so
// M = 1..8 costs one n-tile. Weights are pre-packed in fragment order (fragment.cuh): every lane
// fetches its A operand with one coalesced 16-byte load, no shared-memory staging. Loads run one
// step ahead (double-buffered registers) so each SM keeps tens of KB in flight.
//
// Tokens beyond 64 are handled in passes of 64 (weights re-read per pass): large M is the
// unfused variant's regime, the scheduler picks per batch size.
#include "kernels/mlp/swiglu_fused.cuh"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "kernels/mlp/fragment.cuh"

namespace deepfuse::kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxTilesPerBlock = 8;  // 16-row tiles of I one block owns
// bf16 per act row: the +8 makes the row stride 4 words mod 32 banks, so the 8 tokens x 4 lanes
// of a phase-2 B fragment load hit 32 different banks.
constexpr int kActStride = kMaxTilesPerBlock * 16 + 8;
constexpr int kMaxFinishers = 16;

template <int NT>  // NT = n-tiles of 8 tokens per pass
struct FusedConfig {
  static constexpr int kTokensPerPass = 8 * NT;
  static constexpr int kKUnroll = NT <= 2 ? 4 : 2;  // phase-1 k-steps loaded ahead
  static constexpr int kRowTiles = NT == 1 ? 8 : NT == 2 ? 4 : NT == 4 ? 2 : 1;  // phase-2 rows per item
};

template <int NT>
struct SharedStorage {
  __nv_bfloat16 act[8 * NT][kActStride];
  float partial[kWarps][2][NT][4][32];  // phase-1 split-H partials, lane-minor (conflict-free)
  unsigned ticket;
};

__device__ __forceinline__ void red_add_v4(float* address, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v4.f32 [%0], {%1,%2,%3,%4};" ::"l"(address), "f"(v.x), "f"(v.y), "f"(v.z),
               "f"(v.w)
               : "memory");
#else
  atomicAdd(address, v.x);
  atomicAdd(address + 1, v.y);
  atomicAdd(address + 2, v.z);
  atomicAdd(address + 3, v.w);
#endif
}

// Adds one 16x8 C tile (rows row_tile*16.., tokens token_base..) into accumulator[row][token].
// Lanes t and t^1 swap halves so each lane owns 4 consecutive tokens of one row: one v4 reduction.
__device__ __forceinline__ void add_tile_to_accumulator(float* accumulator, int padded_tokens, int tokens,
                                                        int row_tile, int token_base, const float (&c)[4],
                                                        int lane) {
  const int g = lane / 4, t = lane % 4;
  const bool even = (t & 1) == 0;
  const float send0 = even ? c[2] : c[0];
  const float send1 = even ? c[3] : c[1];
  const float recv0 = __shfl_xor_sync(0xffffffffu, send0, 1);
  const float recv1 = __shfl_xor_sync(0xffffffffu, send1, 1);
  const float4 v = even ? make_float4(c[0], c[1], recv0, recv1) : make_float4(recv0, recv1, c[2], c[3]);
  const int row = row_tile * 16 + g + (even ? 0 : 8);
  const int token = token_base + (even ? 2 * t : 2 * t - 2);
  float* target = accumulator + static_cast<size_t>(row) * padded_tokens + token;
  if (token + 3 < tokens) {
    red_add_v4(target, v);
  } else {
    if (token < tokens) atomicAdd(target, v.x);
    if (token + 1 < tokens) atomicAdd(target + 1, v.y);
    if (token + 2 < tokens) atomicAdd(target + 2, v.z);
  }
}

template <int NT>
__global__ void __launch_bounds__(kThreads, 2) swiglu_fused_kernel(const SwigluFusedParams p, int finishers) {
  using Config = FusedConfig<NT>;
  extern __shared__ __align__(16) unsigned char shared_raw[];
  auto& shared = *reinterpret_cast<SharedStorage<NT>*>(shared_raw);

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int hidden = p.hidden;
  const int h_tiles = hidden / 16;  // k-steps of phase 1 and row tiles of phase 2
  const int i_tiles = p.intermediate / 16;
  const int tile_begin = static_cast<int>(static_cast<long long>(blockIdx.x) * i_tiles / gridDim.x);
  const int tile_end = static_cast<int>(static_cast<long long>(blockIdx.x + 1) * i_tiles / gridDim.x);
  const int tiles = tile_end - tile_begin;  // 1..kMaxTilesPerBlock (the launcher sizes the grid)
  const int padded_tokens = (p.tokens + 7) & ~7;

  // Phase-1 roles: warp -> (tile, slice of H). Slices are whole groups of 4 k-steps.
  const int k_parts = kWarps / tiles;
  const int my_tile = warp % tiles, my_part = warp / tiles;
  const bool phase1_active = my_part < k_parts;
  const int k_groups = h_tiles / 4;
  const int k_begin = (my_part * k_groups / k_parts) * 4;
  const int k_end = ((my_part + 1) * k_groups / k_parts) * 4;

  // Phase-2 roles: warps take items of kRowTiles row tiles; the start is rotated per block so
  // blocks hit different accumulator rows at any moment and finish different rows last.
  constexpr int kRowTiles = Config::kRowTiles;
  const int row_groups = (h_tiles + kRowTiles - 1) / kRowTiles;
  const int rotation = static_cast<int>(static_cast<long long>(blockIdx.x) * row_groups / gridDim.x);

  for (int token0 = 0; token0 < p.tokens; token0 += Config::kTokensPerPass) {
    // ---------------- Phase 1: act = silu(x·Wg^T) * (x·Wu^T) for this block's slice of I.
    float acc_gate[NT][4] = {}, acc_up[NT][4] = {};
    if (phase1_active && k_begin < k_end) {
      const __nv_bfloat16* x_row[NT];
      bool token_valid[NT];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int token = token0 + nt * 8 + g;
        token_valid[nt] = token < p.tokens;
        x_row[nt] = p.x + static_cast<size_t>(token_valid[nt] ? token : 0) * hidden + 2 * t;
      }
      // gate_up: [tile][k-step][gate | up][32 lanes] uint4
      const uint4* weights = p.gate_up + static_cast<size_t>(tile_begin + my_tile) * h_tiles * 64 + lane;
      constexpr int U = Config::kKUnroll;
      uint4 next_gate[U], next_up[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        next_gate[u] = load_streaming(weights + static_cast<size_t>(k_begin + u) * 64);
        next_up[u] = load_streaming(weights + static_cast<size_t>(k_begin + u) * 64 + 32);
      }
      for (int k = k_begin; k < k_end; k += U) {
        uint4 gate[U], up[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          gate[u] = next_gate[u];
          up[u] = next_up[u];
        }
        if (k + U < k_end) {
#pragma unroll
          for (int u = 0; u < U; ++u) {
            next_gate[u] = load_streaming(weights + static_cast<size_t>(k + U + u) * 64);
            next_up[u] = load_streaming(weights + static_cast<size_t>(k + U + u) * 64 + 32);
          }
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int column = (k + u) * 16;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint32_t b0 = token_valid[nt] ? load_pair(x_row[nt] + column) : 0u;
            const uint32_t b1 = token_valid[nt] ? load_pair(x_row[nt] + column + 8) : 0u;
            mma_bf16_m16n8k16(acc_gate[nt], gate[u], b0, b1);
            mma_bf16_m16n8k16(acc_up[nt], up[u], b0, b1);
          }
        }
      }
    }
    // Split-H partials meet in shared memory; part 0 of each tile finishes the activation.
    if (phase1_active && my_part > 0) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          shared.partial[warp][0][nt][c][lane] = acc_gate[nt][c];
          shared.partial[warp][1][nt][c][lane] = acc_up[nt][c];
        }
    }
    __syncthreads();  // also: every warp has finished the previous pass's phase 2 (act reads)
    if (phase1_active && my_part == 0) {
      for (int part = 1; part < k_parts; ++part) {
        const int source = my_tile + part * tiles;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            acc_gate[nt][c] += shared.partial[source][0][nt][c][lane];
            acc_up[nt][c] += shared.partial[source][1][nt][c][lane];
          }
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int row = my_tile * 16 + g + (c >= 2 ? 8 : 0);
          const int token = nt * 8 + 2 * t + (c & 1);
          const float gate = acc_gate[nt][c];
          shared.act[token][row] = __float2bfloat16(gate / (1.0f + __expf(-gate)) * acc_up[nt][c]);
        }
    }
    __syncthreads();

    // ---------------- Phase 2: partial y = act_slice · Wd[:, slice]^T for every output row.
    // down: [I tile][row tile][32 lanes] uint4. Items (row group, I tile) stream one ahead.
    int group = warp;
    if (group < row_groups) {
      auto load_item = [&](uint4 (&a)[kRowTiles], int item_group, int j) {
        const int row_tile0 = ((item_group + rotation) % row_groups) * kRowTiles;
        const uint4* source = p.down + static_cast<size_t>(tile_begin + j) * h_tiles * 32 + lane;
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r)
          a[r] = row_tile0 + r < h_tiles ? load_streaming(source + static_cast<size_t>(row_tile0 + r) * 32)
                                         : make_uint4(0, 0, 0, 0);
      };
      float acc[kRowTiles][NT][4] = {};
      uint4 next[kRowTiles];
      int j = 0;
      load_item(next, group, 0);
      while (true) {
        uint4 a[kRowTiles];
#pragma unroll
        for (int r = 0; r < kRowTiles; ++r) a[r] = next[r];
        int next_group = group, next_j = j + 1;
        if (next_j == tiles) {
          next_j = 0;
          next_group += kWarps;
        }
        if (next_group < row_groups) load_item(next, next_group, next_j);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const __nv_bfloat16* act_row = &shared.act[nt * 8 + g][j * 16 + 2 * t];
          const uint32_t b0 = *reinterpret_cast<const uint32_t*>(act_row);
          const uint32_t b1 = *reinterpret_cast<const uint32_t*>(act_row + 8);
#pragma unroll
          for (int r = 0; r < kRowTiles; ++r) mma_bf16_m16n8k16(acc[r][nt], a[r], b0, b1);
        }
        if (j == tiles - 1) {  // this row group has seen the whole slice: flush it
          const int row_tile0 = ((group + rotation) % row_groups) * kRowTiles;
#pragma unroll
          for (int r = 0; r < kRowTiles; ++r) {
            if (row_tile0 + r < h_tiles) {
#pragma unroll
              for (int nt = 0; nt < NT; ++nt)
                add_tile_to_accumulator(p.accumulator, padded_tokens, p.tokens, row_tile0 + r,
                                        token0 + nt * 8, acc[r][nt], lane);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt)
#pragma unroll
              for (int c = 0; c < 4; ++c) acc[r][nt][c] = 0.0f;
          }
        }
        if (next_group >= row_groups) break;
        group = next_group;
        j = next_j;
      }
    }
  }

  // ---------------- Finish: the last `finishers` blocks to arrive write y.
  __threadfence();  // this thread's reductions are visible before the block's arrival counts
  __syncthreads();
  if (threadIdx.x == 0) shared.ticket = atomicAdd(&p.counters[0], 1u);
  __syncthreads();
  const unsigned blocks = gridDim.x;
  const unsigned ticket = shared.ticket;
  if (ticket < blocks - finishers) return;
  if (threadIdx.x == 0) {
    // At most finishers-1 blocks are still running; they hold resident slots, so this ends.
    while (*reinterpret_cast<volatile unsigned*>(&p.counters[0]) < blocks) __nanosleep(64);
  }
  __syncthreads();
  __threadfence();
  const int finisher = static_cast<int>(ticket - (blocks - finishers));
  const int row_begin = finisher * hidden / finishers, row_end = (finisher + 1) * hidden / finishers;
  for (int token = 0; token < p.tokens; ++token) {
    for (int row = row_begin + threadIdx.x; row < row_end; row += kThreads) {
      float* partial = p.accumulator + static_cast<size_t>(row) * padded_tokens + token;
      float value = __ldcg(partial);
      const size_t out = static_cast<size_t>(token) * hidden + row;
      if (p.residual) value += __bfloat162float(p.residual[out]);
      p.y[out] = __float2bfloat16(value);
      *partial = 0.0f;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    // The last finisher resets the counters: every finisher has left its wait loop by now.
    if (atomicAdd(&p.counters[1], 1u) == static_cast<unsigned>(finishers) - 1) {
      p.counters[0] = 0;
      p.counters[1] = 0;
    }
  }
}

// Grid shape per device and NT, worked out once.
struct LaunchShape {
  int sm_count = 0;
  int max_blocks_per_sm = 0;
};

template <int NT>
cudaError_t fused_launch_shape(LaunchShape& shape) {
  static std::mutex mutex;
  static std::unordered_map<int, LaunchShape> by_device;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto it = by_device.find(device); it != by_device.end()) {
    shape = it->second;
    return cudaSuccess;
  }
  const int smem = static_cast<int>(sizeof(SharedStorage<NT>));
  if (cudaError_t e = cudaFuncSetAttribute(swiglu_fused_kernel<NT>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
      e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&shape.sm_count, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess)
    return e;
  if (cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&shape.max_blocks_per_sm, swiglu_fused_kernel<NT>,
                                                                     kThreads, smem);
      e != cudaSuccess)
    return e;
  if (shape.max_blocks_per_sm < 1) return cudaErrorInvalidConfiguration;
  by_device[device] = shape;
  return cudaSuccess;
}

template <int NT>
cudaError_t launch_with_tiles(const SwigluFusedParams& p, const SwigluFusedTuning& tuning, cudaStream_t stream) {
  LaunchShape shape;
  if (cudaError_t e = fused_launch_shape<NT>(shape); e != cudaSuccess) return e;
  int blocks_per_sm = shape.max_blocks_per_sm;
  if (tuning.blocks_per_sm > 0) blocks_per_sm = std::min(blocks_per_sm, tuning.blocks_per_sm);
  const int i_tiles = p.intermediate / 16;
  const int resident = shape.sm_count * blocks_per_sm;
  int blocks = std::min(i_tiles, resident);
  blocks = std::max(blocks, (i_tiles + kMaxTilesPerBlock - 1) / kMaxTilesPerBlock);
  // Finishers wait for stragglers, so they must leave resident slots free for them.
  const int finishers = std::max(1, std::min({kMaxFinishers, blocks, shape.sm_count * shape.max_blocks_per_sm / 2}));
  swiglu_fused_kernel<NT><<<blocks, kThreads, sizeof(SharedStorage<NT>), stream>>>(p, finishers);
  return cudaGetLastError();
}

__global__ void pack_gate_up_kernel(const __nv_bfloat16* gate, const __nv_bfloat16* up, uint4* out, int hidden,
                                    int intermediate) {
  const size_t h_tiles = hidden / 16;
  const size_t total = static_cast<size_t>(intermediate / 16) * h_tiles * 64;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const bool is_up = (index / 32) % 2;
    const size_t step = index / 64;
    const int k = static_cast<int>(step % h_tiles);
    const int tile = static_cast<int>(step / h_tiles);
    out[index] = gather_a_fragment(is_up ? up : gate, hidden, tile * 16, k * 16, lane);
  }
}

__global__ void pack_down_kernel(const __nv_bfloat16* down, uint4* out, int hidden, int intermediate) {
  const size_t h_tiles = hidden / 16;
  const size_t total = static_cast<size_t>(intermediate / 16) * h_tiles * 32;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int lane = index % 32;
    const int row_tile = static_cast<int>((index / 32) % h_tiles);
    const int tile = static_cast<int>(index / 32 / h_tiles);
    out[index] = gather_a_fragment(down, intermediate, row_tile * 16, tile * 16, lane);
  }
}

bool valid_shape(int hidden, int intermediate) {
  return hidden > 0 && intermediate > 0 && hidden % 64 == 0 && intermediate % 64 == 0;
}

}  // namespace

size_t swiglu_fused_accumulator_floats(int hidden, int max_tokens) {
  return static_cast<size_t>(hidden) * ((max_tokens + 7) / 8 * 8);
}

cudaError_t launch_swiglu_fused(const SwigluFusedParams& p, const SwigluFusedTuning& tuning, cudaStream_t stream) {
  if (!valid_shape(p.hidden, p.intermediate) || p.tokens < 1 || !p.x || !p.gate_up || !p.down || !p.y ||
      !p.accumulator || !p.counters)
    return cudaErrorInvalidValue;
  if (p.tokens <= 8) return launch_with_tiles<1>(p, tuning, stream);
  if (p.tokens <= 16) return launch_with_tiles<2>(p, tuning, stream);
  if (p.tokens <= 32) return launch_with_tiles<4>(p, tuning, stream);
  return launch_with_tiles<8>(p, tuning, stream);
}

cudaError_t pack_swiglu_gate_up(const __nv_bfloat16* gate, const __nv_bfloat16* up, uint4* gate_up_packed,
                                int hidden, int intermediate, cudaStream_t stream) {
  if (!valid_shape(hidden, intermediate)) return cudaErrorInvalidValue;
  pack_gate_up_kernel<<<1024, 256, 0, stream>>>(gate, up, gate_up_packed, hidden, intermediate);
  return cudaGetLastError();
}

cudaError_t pack_swiglu_down(const __nv_bfloat16* down, uint4* down_packed, int hidden, int intermediate,
                             cudaStream_t stream) {
  if (!valid_shape(hidden, intermediate)) return cudaErrorInvalidValue;
  pack_down_kernel<<<1024, 256, 0, stream>>>(down, down_packed, hidden, intermediate);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
