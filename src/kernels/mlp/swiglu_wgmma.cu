// The Hopper MLP pair: act = silu(x·Wg^T) * (x·Wu^T), then y = act·Wd^T (+ residual), for 16 to
// 256 tokens on sm_90a. Design, predicted speed and status: docs/kernels/swiglu_fused.md, "The
// Hopper pair"; limits and tiles: swiglu_wgmma_config.hpp.
//
// Both kernels are one shape of block (384 threads, three warpgroups):
//   warp 0, lane 0   the producer: TMA loads of each stage's weight tile(s) and token columns into
//                    a ring of S stages (full barrier: its bytes landed; empty: every reader is done)
//   warps 1-3        phase 1 with the RMSNorm: sum x^2 per token from the x columns that pass by
//   warpgroups 1, 2  consumers: each owns half the token tile (n = tile / 2) and issues
//                    wgmma m64n{n}k16 over the stage: weights as A (64 rows x 16 of K), tokens as
//                    B, both from 128-byte-swizzled shared memory through matrix descriptors.
// Phase 1: block b holds rows 64b.. of gate and of up (two accumulators) over all of H, then writes
// act = bf16(silu(g / rms) * (u / rms)) for its 64 columns of I (act is [tokens, I], in L2).
// Phase 2: block (row tile r, split s) sums act·Wd^T for rows 64r.. of H over split s of I, adds
// its partial into an fp32 [tokens, H] accumulator (red.add in L2), and the last split of the row
// tile to arrive writes y = bf16(sum + residual) and zeroes the accumulator and its counter.
// Tokens past M are zero rows of the TMA box (the maps are [tokens, ...]) and never stored.
#include "deepfuse/kernels/swiglu_wgmma.hpp"

#include <cuda.h>

#include "core/device_attributes.hpp"
#include "core/per_device.hpp"
#include "kernels/common/hopper_async.cuh"
#include "kernels/common/l2_policy.cuh"
#include "kernels/common/residual_sum.cuh"
#include "kernels/mlp/silu.cuh"
#include "kernels/mlp/swiglu_wgmma_config.hpp"

namespace deepfuse::kernels {
namespace {

using namespace wgmma_mlp;

struct GateUpArgs {
  __nv_bfloat16* activations;
  int tokens, hidden, intermediate;
  bool rms_normalize;
  float norm_eps;
};

struct DownArgs {
  float* accumulator;
  unsigned* tile_counters;
  const __nv_bfloat16* residual;
  __nv_bfloat16* y;
  int tokens, hidden, intermediate, splits;
};

#ifdef DEEPFUSE_HOPPER_ASYNC
using namespace hopper;

// The block's shared memory: the ring from a 1024-byte aligned base, then the barriers, the
// per-token floats and one flag word (swiglu_wgmma_config.hpp, extras_bytes).
struct Shared {
  unsigned char* ring;
  uint64_t* full;
  uint64_t* empty;
  float* token_floats;
  unsigned* flag;

  __device__ Shared(unsigned char* raw, size_t ring_bytes) {
    const unsigned offset = shared_address(raw) % kAlignment;
    ring = raw + (offset == 0 ? 0 : kAlignment - offset);
    full = reinterpret_cast<uint64_t*>(ring + ring_bytes);
    empty = full + kMaxStages;
    token_floats = reinterpret_cast<float*>(empty + kMaxStages);
    flag = reinterpret_cast<unsigned*>(token_floats + kMaxTokens);
  }
  __device__ unsigned full_at(int slot) const { return shared_address(full + slot); }
  __device__ unsigned empty_at(int slot) const { return shared_address(empty + slot); }
};

// Thread 0 initialises the ring's barriers: full completes on the producer's arrival plus the
// stage's bytes, empty on one arrival per reading warp.
__device__ void init_ring(const Shared& shared, int stages, unsigned readers) {
  if (threadIdx.x == 0) {
    for (int slot = 0; slot < stages; ++slot) {
      mbarrier_init(shared.full_at(slot), 1);
      mbarrier_init(shared.empty_at(slot), readers);
    }
    fence_barrier_init();
  }
  __syncthreads();
}

// The producer's loop over a block's `count` stages: wait for the slot's readers to finish the
// stage S before, announce the stage's bytes, issue its loads (load(stage, slot address, barrier)).
template <int S, size_t StageBytes, typename Load>
__device__ __forceinline__ void produce(const Shared& shared, int count, Load load) {
  for (int stage = 0; stage < count; ++stage) {
    const int slot = stage % S;
    if (stage >= S) mbarrier_wait(shared.empty_at(slot), (stage / S - 1) & 1);
    mbarrier_arrive_expect_tx(shared.full_at(slot), static_cast<unsigned>(StageBytes));
    load(stage, shared_address(shared.ring + slot * StageBytes), shared.full_at(slot));
  }
}

// A consumer warpgroup's loop: per stage, wait for its bytes, issue the stage's wgmmas
// (mma(slot address)) as one group, and release the stage before once its group has finished
// (one arrival per warp: every warp of both groups has waited before the producer refills it).
template <int S, size_t StageBytes, typename Mma>
__device__ __forceinline__ void consume(const Shared& shared, int count, Mma mma) {
  const int lane = threadIdx.x % 32;
  for (int stage = 0; stage < count; ++stage) {
    const int slot = stage % S;
    mbarrier_wait(shared.full_at(slot), (stage / S) & 1);
    wgmma_fence();
    mma(shared_address(shared.ring + slot * StageBytes));
    wgmma_commit();
    wgmma_wait<1>();
    if (stage > 0) {
      __syncwarp();
      if (lane == 0) mbarrier_arrive(shared.empty_at((stage - 1) % S));
    }
  }
  wgmma_wait<0>();
}

// Phase 1's helper warps: sum x^2 per token over every x stage, then 1/rms per token into
// shared.token_floats, published to the consumers by named barrier 1.
template <int Tile, int S, size_t StageBytes>
__device__ void rms_of_tokens(const Shared& shared, const GateUpArgs& a, int count) {
  constexpr int kHelpers = kHelperWarps * 32, kRowsPerHelper = (Tile + kHelpers - 1) / kHelpers;
  const int helper = threadIdx.x - 32, lane = threadIdx.x % 32;
  float squares[kRowsPerHelper] = {};
  for (int stage = 0; stage < count; ++stage) {
    const int slot = stage % S;
    mbarrier_wait(shared.full_at(slot), (stage / S) & 1);
    const unsigned char* rows = shared.ring + slot * StageBytes + 2 * kTileBytes;
#pragma unroll
    for (int j = 0; j < kRowsPerHelper; ++j) {
      const int row = helper + j * kHelpers;
      if (row < Tile && row < a.tokens) {
        // A row's 128 bytes in any order: the swizzle permutes chunks within the row only.
#pragma unroll
        for (int chunk = 0; chunk < 8; ++chunk) {
          const uint4 bits = *reinterpret_cast<const uint4*>(rows + row * kTokenRowBytes + chunk * 16);
          const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
            squares[j] += pair.x * pair.x + pair.y * pair.y;
          }
        }
      }
    }
    __syncwarp();
    if (lane == 0) mbarrier_arrive(shared.empty_at(slot));
  }
#pragma unroll
  for (int j = 0; j < kRowsPerHelper; ++j) {
    const int row = helper + j * kHelpers;
    if (row < Tile) shared.token_floats[row] = rsqrtf(squares[j] / a.hidden + a.norm_eps);
  }
  named_barrier(1, kHelpers + 128 * kConsumerGroups);
}
#endif  // DEEPFUSE_HOPPER_ASYNC

// ---- Phase 1: act for rows 64 blockIdx.x.. of I.
template <int Tile>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(Tile))
    gate_up_kernel(const __grid_constant__ CUtensorMap x_map, const __grid_constant__ CUtensorMap weight_map,
                   const GateUpArgs a) {
#ifdef DEEPFUSE_HOPPER_ASYNC
  constexpr int S = gate_up_stages(Tile), N = Tile / kConsumerGroups;
  constexpr size_t kStage = gate_up_stage_bytes(Tile);
  extern __shared__ unsigned char raw[];
  const Shared shared(raw, S * kStage);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int count = a.hidden / kStageColumns, row0 = blockIdx.x * kRows;
  init_ring(shared, S, kConsumerGroups * 4 + (a.rms_normalize ? kHelperWarps : 0));

  if (warp == 0) {
    if (lane == 0) {
      const uint64_t streamed = evict_first_policy();  // weights are read once per call
      produce<S, kStage>(shared, count, [&](int stage, unsigned slot, unsigned full) {
        const int column = stage * kStageColumns;
        tma_load_2d(slot, &weight_map, column, row0, full, streamed);                          // gate rows
        tma_load_2d(slot + kTileBytes, &weight_map, column, a.intermediate + row0, full, streamed);  // up rows
        tma_load_2d(slot + 2 * kTileBytes, &x_map, column, 0, full);                           // the tokens
      });
    }
    return;
  }
  if (warp <= kHelperWarps) {
    if (a.rms_normalize) rms_of_tokens<Tile, S, kStage>(shared, a, count);
    return;
  }

  const int group = warp / 4 - 1, warp_in_group = warp % 4;
  float gate[N / 2], up[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) gate[i] = up[i] = 0.0f;
  consume<S, kStage>(shared, count, [&](unsigned stage) {
    fence_accumulators(gate);
    fence_accumulators(up);
#pragma unroll
    for (int k = 0; k < kStageColumns / kKStep; ++k) {
      const uint64_t tokens = descriptor_k_major_sw128(stage + 2 * kTileBytes + group * N * kTokenRowBytes + 32 * k);
      WgmmaBf16<N>::mma(gate, descriptor_k_major_sw128(stage + 32 * k), tokens);
      WgmmaBf16<N>::mma(up, descriptor_k_major_sw128(stage + kTileBytes + 32 * k), tokens);
    }
  });
  fence_accumulators(gate);
  fence_accumulators(up);
  if (a.rms_normalize) named_barrier(1, kHelperWarps * 32 + 128 * kConsumerGroups);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int token = group * N + accumulator_column(lane, i);
    if (token < a.tokens) {
      const float inverse_rms = a.rms_normalize ? shared.token_floats[token] : 1.0f;
      const int column = row0 + accumulator_row(warp_in_group, lane, i);
      a.activations[static_cast<size_t>(token) * a.intermediate + column] =
          __float2bfloat16(silu(gate[i] * inverse_rms) * (up[i] * inverse_rms));
    }
  }
#else
  __trap();  // sm_90a only: launch_swiglu_wgmma refuses other GPUs before launching
#endif
}

// ---- Phase 2: rows 64 r.. of y for split s of I, block r * splits + s.
template <int Tile>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(Tile))
    down_kernel(const __grid_constant__ CUtensorMap act_map, const __grid_constant__ CUtensorMap weight_map,
                const DownArgs a) {
#ifdef DEEPFUSE_HOPPER_ASYNC
  constexpr int S = down_stages(Tile), N = Tile / kConsumerGroups;
  constexpr size_t kStage = down_stage_bytes(Tile);
  extern __shared__ unsigned char raw[];
  const Shared shared(raw, S * kStage);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row_tile = blockIdx.x / a.splits, split = blockIdx.x % a.splits;
  const int chunks = a.intermediate / kStageColumns;
  const int first = chunks * split / a.splits, count = chunks * (split + 1) / a.splits - first;
  const int row0 = row_tile * kRows;
  init_ring(shared, S, kConsumerGroups * 4);

  if (warp == 0) {
    if (lane == 0) {
      const uint64_t streamed = evict_first_policy();
      produce<S, kStage>(shared, count, [&](int stage, unsigned slot, unsigned full) {
        const int column = (first + stage) * kStageColumns;
        tma_load_2d(slot, &weight_map, column, row0, full, streamed);  // Wd rows
        tma_load_2d(slot + kTileBytes, &act_map, column, 0, full);      // the tokens' act columns
      });
    }
    return;
  }
  if (warp <= kHelperWarps) return;

  const int group = warp / 4 - 1, warp_in_group = warp % 4, consumer = threadIdx.x - 128;
  float sums[N / 2];
#pragma unroll
  for (int i = 0; i < N / 2; ++i) sums[i] = 0.0f;
  consume<S, kStage>(shared, count, [&](unsigned stage) {
    fence_accumulators(sums);
#pragma unroll
    for (int k = 0; k < kStageColumns / kKStep; ++k)
      WgmmaBf16<N>::mma(sums, descriptor_k_major_sw128(stage + 32 * k),
                        descriptor_k_major_sw128(stage + kTileBytes + group * N * kTokenRowBytes + 32 * k));
  });
  fence_accumulators(sums);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const int token = group * N + accumulator_column(lane, i);
    if (token < a.tokens)
      atomicAdd(a.accumulator + static_cast<size_t>(token) * a.hidden + row0 + accumulator_row(warp_in_group, lane, i),
                sums[i]);
  }
  // The last split of this row tile to arrive finishes it (its partials, fenced before the
  // counter, are all in L2 by then).
  __threadfence();
  named_barrier(1, 128 * kConsumerGroups);
  if (consumer == 0) {
    const bool last = atomicAdd(a.tile_counters + row_tile, 1u) == static_cast<unsigned>(a.splits - 1);
    if (last) atomicExch(a.tile_counters + row_tile, 0u);  // ready for the next call
    *shared.flag = last ? 1u : 0u;
  }
  named_barrier(1, 128 * kConsumerGroups);
  if (*shared.flag == 0) return;
  __threadfence();
  // y = bf16(sum + residual) for the tile's 64 rows, two rows a thread at a time; zero behind.
  for (int pair = consumer; pair < a.tokens * (kRows / 2); pair += 128 * kConsumerGroups) {
    const int token = pair / (kRows / 2);
    const size_t at = static_cast<size_t>(token) * a.hidden + row0 + 2 * (pair % (kRows / 2));
    auto* sum = reinterpret_cast<float2*>(a.accumulator + at);
    const float2 v = __ldcg(sum);
    const uint32_t residual = a.residual ? *reinterpret_cast<const uint32_t*>(a.residual + at) : 0u;
    *reinterpret_cast<uint32_t*>(a.y + at) = residual_sum_pair(v.x, v.y, residual);
    __stcg(sum, make_float2(0.0f, 0.0f));
  }
#else
  __trap();  // sm_90a only: launch_swiglu_wgmma refuses other GPUs before launching
#endif
}

const CUtensorMap& as_map(const TensorMapBytes& bytes) { return *reinterpret_cast<const CUtensorMap*>(bytes.bytes); }

// Both kernels of a token tile opt into their shared memory once per device.
template <int Tile>
cudaError_t opt_in_shared() {
  static PerDevice<int> done;
  int ignored = 0;
  return done.get(ignored, [](int&) {
    if (cudaError_t e = cudaFuncSetAttribute(gate_up_kernel<Tile>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(gate_up_shared_bytes(Tile)));
        e != cudaSuccess)
      return e;
    return cudaFuncSetAttribute(down_kernel<Tile>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                static_cast<int>(down_shared_bytes(Tile)));
  });
}

template <int Tile>
cudaError_t launch_tile(const SwigluWgmmaParams& p, const SwigluWgmmaPlan& plan, cudaStream_t stream) {
  if (cudaError_t e = opt_in_shared<Tile>(); e != cudaSuccess) return e;
  // The tokens' maps have `tokens` rows: the box's rows past them are zero-filled.
  TensorMapBytes x_map, act_map;
  if (cudaError_t e = encode_tile_map(p.x, bf16_tile_map(p.tokens, p.hidden, Tile), x_map); e != cudaSuccess) return e;
  if (cudaError_t e = encode_tile_map(p.activations, bf16_tile_map(p.tokens, p.intermediate, Tile), act_map);
      e != cudaSuccess)
    return e;
  const GateUpArgs gate_up{p.activations, p.tokens, p.hidden, p.intermediate, p.rms_normalize, p.norm_eps};
  gate_up_kernel<Tile><<<plan.gate_up_blocks, kThreads, plan.gate_up_shared_bytes, stream>>>(
      as_map(x_map), as_map(p.weights->gate_up), gate_up);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const DownArgs down{p.accumulator, p.tile_counters, p.residual,      p.y,
                      p.tokens,      p.hidden,        p.intermediate, plan.down_splits};
  down_kernel<Tile><<<plan.down_blocks, kThreads, plan.down_shared_bytes, stream>>>(
      as_map(act_map), as_map(p.weights->down), down);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_swiglu_wgmma(const SwigluWgmmaParams& p, cudaStream_t stream) {
  if (!swiglu_wgmma_unsupported(p.hidden, p.intermediate, p.tokens, {}).empty() || !p.x || !p.weights || !p.y ||
      !p.activations || !p.accumulator || !p.tile_counters)
    return cudaErrorInvalidValue;
  DeviceAttributes device;
  if (cudaError_t e = current_device_attributes(device); e != cudaSuccess) return e;
  if (device.compute_major != 9) return cudaErrorNotSupported;
  const SwigluWgmmaPlan plan = plan_swiglu_wgmma(p.hidden, p.intermediate, p.tokens, device.sm_count);
  switch (plan.token_tile) {
    case 16: return launch_tile<16>(p, plan, stream);
    case 32: return launch_tile<32>(p, plan, stream);
    case 64: return launch_tile<64>(p, plan, stream);
    case 128: return launch_tile<128>(p, plan, stream);
    default: return launch_tile<256>(p, plan, stream);
  }
}

}  // namespace deepfuse::kernels
