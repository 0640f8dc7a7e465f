// The Hopper MLP pair: act = silu(x·Wg^T) * (x·Wu^T), then y = act·Wd^T (+ residual), for 16 to
// 256 tokens on sm_90a. Design, predicted speed and status: docs/kernels/swiglu_fused.md, "The
// Hopper pair"; limits and tiles: swiglu_wgmma_config.hpp.
//
// Both phases are one kernel template, phase_kernel<Tile, GateUp | Down>, one shape of block (384
// threads, three warpgroups):
//   warp 0, lane 0   the producer: TMA loads of each stage's weight tile(s) and token columns into
//                    a ring of S stages (full barrier: its bytes landed; empty: every reader is done)
//   warps 1-3        phase 1 with the RMSNorm: sum x^2 per token from the x columns that pass by
//   warpgroups 1, 2  consumers: each owns half the token tile (n = tile / 2) and issues
//                    wgmma m64n{n}k16 over the stage: weights as A (64 rows x 16 of K), tokens as
//                    B, both from 128-byte-swizzled shared memory through matrix descriptors.
// Phase 1 (PhaseBlock<GateUp>): block b holds rows 64b.. of gate and of up (two accumulators) over all of H, then writes
// act = bf16(silu(g / rms) * (u / rms)) for its 64 columns of I (act is [tokens, I], in L2).
// Phase 2 (PhaseBlock<Down>): block (row tile r, split s) sums act·Wd^T for rows 64r.. of H over split s of I, adds
// its partial into an fp32 [tokens, H] accumulator (red.add in L2), and the last split of the row
// tile to arrive writes y = bf16(sum + residual) and zeroes the accumulator and its counter.
// Tokens past M: the TMA box has min(M, tile) rows, so the tile's rows past M hold whatever the
// ring slot held before; they reach only D's columns past M (every output column is its own dot
// product), which the epilogues never store, and the RMSNorm sums skip them.
#include "deepfuse/kernels/swiglu_wgmma.hpp"

#include <cuda.h>

#include <algorithm>
#include <type_traits>

#include "core/device_attributes.hpp"
#include "core/per_device.hpp"
#include "kernels/common/cluster_launch.hpp"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/common/hopper_async.cuh"
#include "kernels/common/l2_policy.cuh"
#include "kernels/common/residual_sum.cuh"
#include "kernels/mlp/silu.cuh"
#include "kernels/mlp/swiglu_wgmma_config.hpp"

namespace deepfuse::kernels {
namespace {

using namespace wgmma_mlp;

// token_rows: the TMA box's rows of x or act, min(tokens, tile) (the bytes a stage's tokens bring).
struct GateUpArgs {
  __nv_bfloat16* activations;
  int tokens, token_rows, hidden, intermediate;
  bool rms_normalize;
  float norm_eps;
};

struct DownArgs {
  float* accumulator;
  unsigned* tile_counters;
  const __nv_bfloat16* residual;
  __nv_bfloat16* y;
  int tokens, token_rows, hidden, intermediate, splits;
};

// The two phases, the kernel's template argument; what a block of each does is PhaseBlock<Phase>
// (sm_90a code only).
struct GateUp {
  using Args = GateUpArgs;
};
struct Down {
  using Args = DownArgs;
};
template <typename Phase>
struct PhaseBlock;

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

// The producer's loop over a block's stages first..count-1: wait for the slot's readers to finish
// the stage S before, announce the stage's bytes (`bytes`), issue its loads (load(stage, slot
// address, barrier)).
template <int S, size_t StageBytes, typename Load>
__device__ __forceinline__ void produce(const Shared& shared, int count, unsigned bytes, Load load, int first = 0) {
  for (int stage = first; stage < count; ++stage) {
    const int slot = stage % S;
    if (stage >= S) mbarrier_wait(shared.empty_at(slot), (stage / S - 1) & 1);
    mbarrier_arrive_expect_tx(shared.full_at(slot), bytes);
    load(stage, shared_address(shared.ring + slot * StageBytes), shared.full_at(slot));
  }
}

// A consumer warpgroup's loop: per stage, wait for its bytes, issue the stage's wgmmas
// (mma(slot address)) as one group, and release the stage before once its group has finished
// (one arrival per warp: every warp of both groups has waited before the producer refills it).
template <int S, size_t StageBytes, typename Mma>
__device__ __forceinline__ void consume_ring(const Shared& shared, int count, Mma mma) {
  const int lane = threadIdx.x % 32;
  for (int stage = 0; stage < count; ++stage) {
    const int slot = stage % S;
    mbarrier_wait(shared.full_at(slot), (stage / S) & 1);
    __syncwarp();  // the wgmma instructions are .aligned: the warp arrives at them converged
    wgmma_fence();
    mma(shared_address(shared.ring + slot * StageBytes));
    wgmma_commit();
    wgmma_wait<1>();
    if (stage > 0) {
      __syncwarp();
      if (lane == 0) mbarrier_arrive(shared.empty_at((stage - 1) % S));
      __syncwarp();
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

// ---- Phase 1: act for rows 64 blockIdx.x.. of I, from gate and up over all of H.
template <>
struct PhaseBlock<GateUp> {
  using Args = GateUpArgs;
  static constexpr int stages(int tile) { return gate_up_stages(tile); }
  static constexpr size_t stage_bytes(int tile) { return gate_up_stage_bytes(tile); }

  __device__ static int stage_count(const Args& a) { return a.hidden / kStageColumns; }
  __device__ static unsigned readers(const Args& a) {
    return kConsumerGroups * 4 + (a.rms_normalize ? kHelperWarps : 0);
  }
  // A stage: 64 rows of gate, the same rows of up, the tokens' x; 64 columns of H.
  template <int Tile, int S>
  __device__ static void produce_all(const Shared& shared, const Args& a, const void* tokens, const void* weights,
                                     int count, uint64_t streamed) {
    const int row0 = blockIdx.x * kRows;
    const unsigned bytes = 2 * kTileBytes + a.token_rows * kTokenRowBytes;
    produce<S, stage_bytes(Tile)>(shared, count, bytes, [&](int stage, unsigned slot, unsigned full) {
      const int column = stage * kStageColumns;
      tma_load_2d(slot, weights, column, row0, full, streamed);
      tma_load_2d(slot + kTileBytes, weights, column, a.intermediate + row0, full, streamed);
      tma_load_2d(slot + 2 * kTileBytes, tokens, column, 0, full);
    });
  }
  template <int Tile, int S>
  __device__ static void help(const Shared& shared, const Args& a, int count) {
    if (a.rms_normalize) rms_of_tokens<Tile, S, stage_bytes(Tile)>(shared, a, count);
  }
  // Two accumulator sets (gate, up) for the group's half of the tokens; then act.
  template <int Tile, int S>
  __device__ static void consume(const Shared& shared, const Args& a, int count) {
    constexpr int N = Tile / kConsumerGroups;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = warp / 4 - 1;
    float gate[N / 2], up[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) gate[i] = up[i] = 0.0f;
    consume_ring<S, stage_bytes(Tile)>(shared, count, [&](unsigned stage) {
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
    if (a.rms_normalize) named_barrier(1, kHelperWarps * 32 + 128 * kConsumerGroups);  // 1/rms is in
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const int token = group * N + accumulator_column(lane, i);
      if (token < a.tokens) {
        const float inverse_rms = a.rms_normalize ? shared.token_floats[token] : 1.0f;
        const int column = blockIdx.x * kRows + accumulator_row(warp % 4, lane, i);
        a.activations[static_cast<size_t>(token) * a.intermediate + column] =
            __float2bfloat16(silu(gate[i] * inverse_rms) * (up[i] * inverse_rms));
      }
    }
  }
};

// ---- Phase 2: rows 64 r.. of y over split s of I, block r * splits + s.
template <>
struct PhaseBlock<Down> {
  using Args = DownArgs;
  static constexpr int stages(int tile) { return down_stages(tile); }
  static constexpr size_t stage_bytes(int tile) { return down_stage_bytes(tile); }

  // The block's split of I's 64-column chunks: [first_chunk, first_chunk(next split)).
  __device__ static int first_chunk(const Args& a, int split) {
    return a.intermediate / kStageColumns * split / a.splits;
  }
  __device__ static int stage_count(const Args& a) {
    const int split = blockIdx.x % a.splits;
    return first_chunk(a, split + 1) - first_chunk(a, split);
  }
  __device__ static unsigned readers(const Args&) { return kConsumerGroups * 4; }
  // A stage: 64 rows of down, the tokens' act; 64 columns of I. Launched as a programmatic
  // dependent of phase 1, the block may start while phase 1's last blocks run: the first S stages'
  // weights are issued at once, their act columns only once phase 1 is complete.
  template <int Tile, int S>
  __device__ static void produce_all(const Shared& shared, const Args& a, const void* tokens, const void* weights,
                                     int count, uint64_t streamed) {
    constexpr size_t kStage = stage_bytes(Tile);
    const int first = first_chunk(a, blockIdx.x % a.splits), row0 = blockIdx.x / a.splits * kRows;
    const int early = count < S ? count : S;
    const unsigned bytes = kTileBytes + a.token_rows * kTokenRowBytes;
    for (int stage = 0; stage < early; ++stage) {
      mbarrier_arrive_expect_tx(shared.full_at(stage), bytes);
      tma_load_2d(shared_address(shared.ring + stage * kStage), weights, (first + stage) * kStageColumns, row0,
                  shared.full_at(stage), streamed);
    }
    wait_for_upstream_grids();
    for (int stage = 0; stage < early; ++stage)
      tma_load_2d(shared_address(shared.ring + stage * kStage) + kTileBytes, tokens,
                  (first + stage) * kStageColumns, 0, shared.full_at(stage));
    produce<S, kStage>(
        shared, count, bytes,
        [&](int stage, unsigned slot, unsigned full) {
          const int column = (first + stage) * kStageColumns;
          tma_load_2d(slot, weights, column, row0, full, streamed);
          tma_load_2d(slot + kTileBytes, tokens, column, 0, full);
        },
        early);
  }
  template <int Tile, int S>
  __device__ static void help(const Shared&, const Args&, int) {}
  // One accumulator set; its partial sums into L2, and the row tile's last split writes y.
  template <int Tile, int S>
  __device__ static void consume(const Shared& shared, const Args& a, int count) {
    constexpr int N = Tile / kConsumerGroups;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, group = warp / 4 - 1;
    float sums[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) sums[i] = 0.0f;
    consume_ring<S, stage_bytes(Tile)>(shared, count, [&](unsigned stage) {
      fence_accumulators(sums);
#pragma unroll
      for (int k = 0; k < kStageColumns / kKStep; ++k)
        WgmmaBf16<N>::mma(sums, descriptor_k_major_sw128(stage + 32 * k),
                          descriptor_k_major_sw128(stage + kTileBytes + group * N * kTokenRowBytes + 32 * k));
    });
    fence_accumulators(sums);
    const int row_tile = blockIdx.x / a.splits, row0 = row_tile * kRows;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const int token = group * N + accumulator_column(lane, i);
      if (token < a.tokens)
        atomicAdd(a.accumulator + static_cast<size_t>(token) * a.hidden + row0 + accumulator_row(warp % 4, lane, i),
                  sums[i]);
    }
    // The last split of this row tile to arrive finishes it (its partials, fenced before the
    // counter, are all in L2 by then). Phase 1 is complete (its act came in), and with it every
    // kernel before it; the wait says so to this thread before it touches y, which may alias x.
    wait_for_upstream_grids();
    const int consumer = threadIdx.x - 128;
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
  }
};
#endif  // DEEPFUSE_HOPPER_ASYNC

// Both phases' kernel: one block's roles over its ring (the opening comment). tokens_map: x or
// act; weight_map: gate_up or down.
template <int Tile, typename Phase>
__global__ void __launch_bounds__(kThreads, blocks_per_sm(Tile))
    phase_kernel(const __grid_constant__ CUtensorMap tokens_map, const __grid_constant__ CUtensorMap weight_map,
                 const typename Phase::Args a) {
#ifdef DEEPFUSE_HOPPER_ASYNC
  using Block = PhaseBlock<Phase>;
  constexpr int S = Block::stages(Tile);
  constexpr size_t kStage = Block::stage_bytes(Tile);
  extern __shared__ unsigned char raw[];
  const Shared shared(raw, S * kStage);
  const int warp = threadIdx.x / 32, count = Block::stage_count(a);
  // Phase 1 lets the down phase (a programmatic dependent) be scheduled at once: its blocks take
  // SMs as phase 1's blocks leave them and start on their weights.
  if constexpr (std::is_same_v<Phase, GateUp>) allow_downstream_launch();
  init_ring(shared, S, Block::readers(a));
  if (warp == 0) {
    if (threadIdx.x != 0) return;
    const uint64_t streamed = evict_first_policy();  // weights are read once per call
    Block::template produce_all<Tile, S>(shared, a, &tokens_map, &weight_map, count, streamed);
  } else if (warp <= kHelperWarps) {
    Block::template help<Tile, S>(shared, a, count);
  } else {
    Block::template consume<Tile, S>(shared, a, count);
  }
#else
  __trap();  // sm_90a only: launch_swiglu_wgmma refuses other GPUs before launching
#endif
}

const CUtensorMap& as_map(const TensorMapBytes& bytes) { return *reinterpret_cast<const CUtensorMap*>(bytes.bytes); }

// A kernel's dynamic shared memory, and the largest shared-memory carveout so that the tiles
// planned at two blocks per SM get them.
template <typename Kernel>
cudaError_t opt_in(Kernel kernel, size_t shared_bytes) {
  if (cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared_bytes));
      e != cudaSuccess)
    return e;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
}

// Both kernels of a token tile opt in once per device.
template <int Tile>
cudaError_t opt_in_shared() {
  static PerDevice<int> done;
  int ignored = 0;
  return done.get(ignored, [](int&) {
    if (cudaError_t e = opt_in(phase_kernel<Tile, GateUp>, gate_up_shared_bytes(Tile)); e != cudaSuccess) return e;
    return opt_in(phase_kernel<Tile, Down>, down_shared_bytes(Tile));
  });
}

template <int Tile>
cudaError_t launch_tile(const SwigluWgmmaParams& p, const SwigluWgmmaPlan& plan, cudaStream_t stream) {
  if (cudaError_t e = opt_in_shared<Tile>(); e != cudaSuccess) return e;
  // The tokens' maps have `tokens` rows and boxes of min(tokens, Tile) rows (a box never taller
  // than its tensor); the tile's rows past them are never loaded (token_rows).
  const int token_rows = std::min(p.tokens, Tile);
  TensorMapBytes x_map, act_map;
  if (cudaError_t e = encode_tile_map(p.x, bf16_tile_map(p.tokens, p.hidden, token_rows), x_map); e != cudaSuccess)
    return e;
  if (cudaError_t e = encode_tile_map(p.activations, bf16_tile_map(p.tokens, p.intermediate, token_rows), act_map);
      e != cudaSuccess)
    return e;
  const GateUpArgs gate_up{p.activations, p.tokens,        token_rows,   p.hidden,
                           p.intermediate, p.rms_normalize, p.norm_eps};
  phase_kernel<Tile, GateUp><<<plan.gate_up_blocks, kThreads, plan.gate_up_shared_bytes, stream>>>(
      as_map(x_map), as_map(p.weights->gate_up), gate_up);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  const DownArgs down{p.accumulator, p.tile_counters, p.residual,     p.y,
                      p.tokens,      token_rows,      p.hidden,       p.intermediate,
                      plan.down_splits};
  // A programmatic dependent launch (PhaseBlock<Down>::produce_all says what it overlaps).
  const ClusterLaunch launch(plan.down_blocks, kThreads, plan.down_shared_bytes, 1, stream, /*programmatic=*/true);
  return cudaLaunchKernelEx(&launch.config, phase_kernel<Tile, Down>, as_map(act_map), as_map(p.weights->down), down);
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
