// The batched fused SwiGLU MLP: y = down(silu(x·Wg^T) * (x·Wu^T)) (+ residual) in ONE launch for
// 16 to 256 tokens. Design and predicted speed: docs/kernels/swiglu_fused.md, "The batched kernel".
//
// Why another kernel: the clustered kernel (swiglu_fused.cu) puts tokens on the 8-wide side of
// mma.m16n8k16 in passes of at most 32 and sums a partial y per cluster in L2, so its cost grows
// with M. Here every block holds a whole pass (up to 128 tokens) against its weights, so each
// weight byte is read once per pass, and only one partial y per block and output row reaches L2.
//
// The grid is one co-resident block per SM (8 warps). Per pass of up to 128 tokens:
//   gate_up_pass  block b owns a contiguous run of I's 16-row tiles (an even split: 6-9 tiles at
//                 the shapes of interest), streamed in groups of up to 8 tiles over all of H:
//                 g and u stay in registers, act = bf16(silu(g/rms)*(u/rms)) goes to an
//                 [tokens, I] buffer that stays in L2 (3.7 MB at 128 tokens of I = 14336).
//   grid barrier  every act of the pass is written (phase 2's first weight stages are already
//                 in flight: they do not depend on act).
//   down_pass     the (8 row tiles of H) x (64 columns of I) units are split evenly over the
//                 blocks (stream-K): each block adds its partial y of a unit run into an fp32
//                 [tokens, H] accumulator (one red.add per value, about two partials per value).
// Then a last grid barrier, and every block converts its share of the accumulator to bf16 (+
// residual) and zeroes it for the next call.
//
// Streaming: weights and the pass's x or act columns go through a cp.async ring in shared memory
// filled by all threads (4 stages in phase 1, 6-7 of half the weights in phase 2: 80-96 KB of
// weights per SM in flight), weights marked evict-first in L2; operands of the tensor cores:
// weights from the fragment-packed layout with one 16-byte shared load per lane and fragment,
// tokens by ldmatrix from swizzled 128-byte rows.
// Portable (sm_80 and later): mma.sync and cp.async, no Hopper-only instruction; a first step
// towards wgmma + TMA (the doc says what that would change).
#include "deepfuse/kernels/swiglu_batched.hpp"

#include <algorithm>

#include "core/device_attributes.hpp"
#include "core/per_device.hpp"
#include "kernels/common/async_ring.cuh"
#include "kernels/common/fragment.cuh"
#include "kernels/common/l2_policy.cuh"
#include "kernels/common/residual_sum.cuh"
#include "kernels/common/shared_opt_in.hpp"
#include "kernels/common/warp_tiles.cuh"
#include "kernels/mlp/silu.cuh"
#include "kernels/mlp/swiglu_batched_config.cuh"

namespace deepfuse::kernels {
namespace {

using batched::kGroupTiles;
using batched::kRowTiles;
using batched::kStages;
using batched::kStageColumns;
using batched::kStepsPerStage;
using batched::kThreads;
using batched::Tiles;

static_assert(kStepsPerStage * 64 == kThreads, "one gate_up tile's stage is one 16-byte copy per thread");
static_assert(kRowTiles * 32 == kThreads, "one down k-step of a unit is one 16-byte copy per thread");
static_assert(kRowTiles == batched::kWarps, "phase 2: one row tile per warp");

// Every block of the grid arrives before any leaves; the grid is co-resident (the launcher's
// residency rule). barrier[0] counts arrivals, barrier[1] is the generation: the last block to
// arrive resets the count and opens the next generation, so neither needs a reset between calls.
__device__ void grid_barrier(unsigned* barrier) {
  __syncthreads();
  if (threadIdx.x == 0) {
    volatile unsigned* generation = barrier + 1;
    const unsigned current = *generation;  // cannot move before this block arrives
    __threadfence();                        // this block's writes (act, partial sums) before the arrival
    if (atomicAdd(barrier, 1u) == gridDim.x - 1) {
      atomicExch(barrier, 0u);
      __threadfence();
      atomicAdd(barrier + 1, 1u);
    } else {
      while (*generation == current) __nanosleep(64);
    }
    __threadfence();
  }
  __syncthreads();
}

// Token rows of a stage: 64 bf16 columns = 8 chunks of 16 bytes, chunk c of row r stored at
// c ^ (r % 8), so the 8 rows an ldmatrix reads at one logical chunk hit 8 different bank groups.
__device__ __forceinline__ unsigned row_chunk_offset(int row, int chunk) {
  return static_cast<unsigned>(row * 128 + ((chunk ^ (row & 7)) * 16));
}

// Columns column0..column0+63 of rows token0.. of a [*, ld] bf16 matrix into a stage's rows;
// rows at or past `tokens` are zero-filled.
template <int NT>
__device__ __forceinline__ void issue_rows(unsigned char* rows, const __nv_bfloat16* source, size_t ld, int column0,
                                           int token0, int tokens) {
  constexpr int kChunks = Tiles<NT>::kPassTokens * 8;
#pragma unroll
  for (int index = threadIdx.x; index < kChunks; index += kThreads) {
    const int row = index / 8, chunk = index % 8, token = token0 + row;
    const bool valid = token < tokens;
    const __nv_bfloat16* from = source + static_cast<size_t>(valid ? token : 0) * ld + column0 + chunk * 8;
    copy16_async(rows + row_chunk_offset(row, chunk), from, valid);
  }
}

// The B fragments (tokens) of n-tiles 2 * pair and 2 * pair + 1 at k-step ks of a stage's rows:
// {b0, b1} of the first, then of the second (fragment.cuh's B layout: row = token, columns = k).
__device__ __forceinline__ uint4 load_token_pair(unsigned rows, int pair, int ks, int lane) {
  const int matrix = lane / 8;
  const int row = 16 * pair + 8 * (matrix / 2) + lane % 8, chunk = 2 * ks + matrix % 2;
  return warp_tiles::load_matrix_x4(rows + row_chunk_offset(row, chunk));
}

__device__ __forceinline__ void mma_pair(float (&c0)[4], float (&c1)[4], const uint4& a, const uint4& b) {
  mma_bf16_m16n8k16(c0, a, b.x, b.y);
  mma_bf16_m16n8k16(c1, a, b.z, b.w);
}

// The ring of S stages over a phase's stages (shared by all threads): stages 0..S-2 were issued
// (one commit group each, empty past the end) by the caller; issue(stage, slot) fills a slot,
// consume reads one. The barrier at the top of each step publishes the landed stage and retires the
// slot the step refills. (Phase 2 issues its first stages' weights and rows as two sets of S-1
// groups; waiting for all but the S-2 newest groups still finds stage i whole at step i.)
template <int S, typename Issue, typename Consume>
__device__ __forceinline__ void run_ring(int stages, Issue issue, Consume consume) {
  for (int stage = 0; stage < stages; ++stage) {
    wait_async<S - 2>();
    __syncthreads();
    const int next = stage + S - 1;
    if (next < stages) issue(next, next % S);
    commit_async();
    consume(stage, stage % S);
  }
  wait_async<0>();
  __syncthreads();  // every warp is done with the ring before the next phase fills it
}

template <int S, typename Issue>
__device__ __forceinline__ void prime_ring(int stages, Issue issue) {
#pragma unroll
  for (int stage = 0; stage < S - 1; ++stage) {
    if (stage < stages) issue(stage, stage);
    commit_async();
  }
}

// ---- Phase 1: g and u of this block's I tiles for the pass's tokens token0.., act into L2.
template <int NT>
__device__ void gate_up_pass(const SwigluBatchedParams& p, unsigned char* shared, float* norm_squares, int token0,
                             uint64_t streamed) {
  using T = Tiles<NT>;
  constexpr int WR = T::kWarpRows, TW = T::kTilesPerWarp, NW = T::kNTilesPerWarp;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, tq = lane % 4;
  const int wr = warp % WR, wc = warp / WR;
  const int h_tiles = p.hidden / 16, chunks = p.hidden / kStageColumns;
  const int i_tiles = p.intermediate / 16;
  const int tile_begin = split_point(i_tiles, gridDim.x, blockIdx.x);
  const int own = split_point(i_tiles, gridDim.x, blockIdx.x + 1) - tile_begin;
  const int groups = (own + kGroupTiles - 1) / kGroupTiles;
  auto group_first = [&](int group) { return split_point(own, groups, group); };

  auto issue = [&](int stage, int slot) {
    const int group = stage / chunks, chunk = stage % chunks;
    const int first = group_first(group), count = group_first(group + 1) - first;
    unsigned char* base = shared + slot * T::kStageBytes;
    auto* weights = reinterpret_cast<uint4*>(base);
    // gate_up: [tile][k-step][gate | up][32 lanes] uint4: a tile's stage is 256 contiguous uint4.
    const uint4* source = p.gate_up + (static_cast<size_t>(tile_begin + first) * h_tiles + chunk * kStepsPerStage) * 64 + tid;
    for (int t = 0; t < count; ++t)
      copy16_async_streamed(weights + t * kThreads + tid, source + static_cast<size_t>(t) * h_tiles * 64, streamed);
    issue_rows<NT>(base + T::kWeightBytes, p.x, p.hidden, chunk * kStageColumns, token0, p.tokens);
  };

  // RMSNorm: each thread sums x^2 over fixed (row, chunk) cells of group 0's stages, which cover H.
  constexpr int kCells = T::kPassTokens * 8, kCellsPerThread = (kCells + kThreads - 1) / kThreads;
  float squares[kCellsPerThread] = {};
  float acc_gate[TW][NW][4] = {}, acc_up[TW][NW][4] = {};

  auto consume = [&](int stage, int slot) {
    const int group = stage / chunks, chunk = stage % chunks;
    const int first = group_first(group), count = group_first(group + 1) - first;
    unsigned char* base = shared + slot * T::kStageBytes;
    const auto* weights = reinterpret_cast<const uint4*>(base);
    const unsigned rows = shared_address(base + T::kWeightBytes);
    if (p.rms_normalize && group == 0) {
#pragma unroll
      for (int j = 0; j < kCellsPerThread; ++j) {
        const int cell = tid + j * kThreads;
        if (cell < kCells) {
          const uint4 bits = *reinterpret_cast<const uint4*>(base + T::kWeightBytes + row_chunk_offset(cell / 8, cell % 8));
          const uint32_t words[4] = {bits.x, bits.y, bits.z, bits.w};
#pragma unroll
          for (int w = 0; w < 4; ++w) {
            const float2 pair = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&words[w]));
            squares[j] += pair.x * pair.x + pair.y * pair.y;
          }
        }
      }
    }
#pragma unroll
    for (int ks = 0; ks < kStepsPerStage; ++ks) {
      uint4 tokens[NW / 2];
#pragma unroll
      for (int pair = 0; pair < NW / 2; ++pair) tokens[pair] = load_token_pair(rows, wc * NW / 2 + pair, ks, lane);
#pragma unroll
      for (int tw = 0; tw < TW; ++tw) {
        const int t = wr + WR * tw;
        if (t < count) {
          const uint4 gate = weights[(t * kStepsPerStage + ks) * 64 + lane];
          const uint4 up = weights[(t * kStepsPerStage + ks) * 64 + 32 + lane];
#pragma unroll
          for (int pair = 0; pair < NW / 2; ++pair) {
            mma_pair(acc_gate[tw][2 * pair], acc_gate[tw][2 * pair + 1], gate, tokens[pair]);
            mma_pair(acc_up[tw][2 * pair], acc_up[tw][2 * pair + 1], up, tokens[pair]);
          }
        }
      }
    }
    if (chunk != chunks - 1) return;
    // The group's sums are complete: act = bf16(silu(g / rms) * (u / rms)) into L2.
    if (p.rms_normalize && group == 0) {  // block-uniform: the barrier is safe
#pragma unroll
      for (int j = 0; j < kCellsPerThread; ++j)
        if (tid + j * kThreads < kCells) atomicAdd(&norm_squares[(tid + j * kThreads) / 8], squares[j]);
      __syncthreads();
    }
#pragma unroll
    for (int tw = 0; tw < TW; ++tw) {
      const int t = wr + WR * tw;
#pragma unroll
      for (int n = 0; n < NW; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int local = (wc * NW + n) * 8 + 2 * tq + (c & 1), token = token0 + local;
          if (t < count && token < p.tokens) {
            const int column = (tile_begin + first + t) * 16 + g + (c >= 2 ? 8 : 0);
            const float inverse_rms = p.rms_normalize ? rsqrtf(norm_squares[local] / p.hidden + p.norm_eps) : 1.0f;
            const float activation = silu(acc_gate[tw][n][c] * inverse_rms) * (acc_up[tw][n][c] * inverse_rms);
            p.activations[static_cast<size_t>(token) * p.intermediate + column] = __float2bfloat16(activation);
          }
          acc_gate[tw][n][c] = 0.0f;
          acc_up[tw][n][c] = 0.0f;
        }
    }
  };

  const int stages = groups * chunks;
  prime_ring<kStages>(stages, issue);
  run_ring<kStages>(stages, issue, consume);
}

// ---- Phase 2: this block's run of (row group, I chunk) units of y = act · Wd^T, added into the
// accumulator whenever the run leaves a row group. The weights of its first stages are issued
// before the grid barrier (prime_weights), the activations after it (prime_rows).
template <int NT>
struct DownPass {
  using T = Tiles<NT>;
  const SwigluBatchedParams& p;
  unsigned char* shared;
  int token0;
  uint64_t streamed;
  int h_tiles, chunks, unit_begin, stages;

  __device__ DownPass(const SwigluBatchedParams& params, unsigned char* shared_bytes, int first_token, uint64_t policy)
      : p(params), shared(shared_bytes), token0(first_token), streamed(policy) {
    h_tiles = p.hidden / 16;
    chunks = p.intermediate / kStageColumns;
    const int units = h_tiles / kRowTiles * chunks;
    unit_begin = split_point(units, gridDim.x, blockIdx.x);
    stages = split_point(units, gridDim.x, blockIdx.x + 1) - unit_begin;
  }
  __device__ void issue_weights(int stage, int slot) const {
    const int unit = unit_begin + stage, group = unit / chunks, chunk = unit % chunks;
    auto* weights = reinterpret_cast<uint4*>(shared + slot * T::kStageBytes2);
    // down: [I tile][row tile][32 lanes] uint4: a k-step's 8 row tiles are 256 contiguous uint4.
    const uint4* source =
        p.down + (static_cast<size_t>(chunk * kStepsPerStage) * h_tiles + group * kRowTiles) * 32 + threadIdx.x;
#pragma unroll
    for (int ks = 0; ks < kStepsPerStage; ++ks)
      copy16_async_streamed(weights + ks * kThreads + threadIdx.x, source + static_cast<size_t>(ks) * h_tiles * 32,
                            streamed);
  }
  __device__ void issue_rows_of(int stage, int slot) const {
    const int chunk = (unit_begin + stage) % chunks;
    issue_rows<NT>(shared + slot * T::kStageBytes2 + T::kWeightBytes2, p.activations, p.intermediate,
                   chunk * kStageColumns, token0, p.tokens);
  }

  __device__ void run() const {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, tq = lane % 4;
    float acc[NT][4] = {};
    auto issue = [&](int stage, int slot) {
      issue_weights(stage, slot);
      issue_rows_of(stage, slot);
    };
    auto consume = [&](int stage, int slot) {
      const int unit = unit_begin + stage, group = unit / chunks, chunk = unit % chunks;
      const unsigned char* base = shared + slot * T::kStageBytes2;
      const auto* weights = reinterpret_cast<const uint4*>(base);
      const unsigned rows = shared_address(base + T::kWeightBytes2);
#pragma unroll
      for (int ks = 0; ks < kStepsPerStage; ++ks) {
        const uint4 a = weights[ks * kThreads + warp * 32 + lane];
#pragma unroll
        for (int pair = 0; pair < NT / 2; ++pair)
          mma_pair(acc[2 * pair], acc[2 * pair + 1], a, load_token_pair(rows, pair, ks, lane));
      }
      if (chunk != chunks - 1 && stage != stages - 1) return;
      // The run leaves this row group: its partial y into the accumulator.
      const int row_tile = group * kRowTiles + warp;
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int token = token0 + n * 8 + 2 * tq + (c & 1);
          const int row = row_tile * 16 + g + (c >= 2 ? 8 : 0);
          if (token < p.tokens) atomicAdd(p.accumulator + static_cast<size_t>(token) * p.hidden + row, acc[n][c]);
          acc[n][c] = 0.0f;
        }
    };
    run_ring<T::kStages2>(stages, issue, consume);
  }
};

// y = bf16(accumulator + residual) for this block's share, the accumulator zeroed behind it.
__device__ void finish_output(const SwigluBatchedParams& p) {
  const int quads = p.tokens * p.hidden / 4;
  const int end = split_point(quads, gridDim.x, blockIdx.x + 1);
  auto* sums = reinterpret_cast<float4*>(p.accumulator);
  for (int quad = split_point(quads, gridDim.x, blockIdx.x) + threadIdx.x; quad < end; quad += kThreads) {
    const float4 v = __ldcg(sums + quad);
    const uint2 residual = p.residual ? *reinterpret_cast<const uint2*>(p.residual + 4 * static_cast<size_t>(quad))
                                      : make_uint2(0, 0);
    *reinterpret_cast<uint2*>(p.y + 4 * static_cast<size_t>(quad)) =
        make_uint2(residual_sum_pair(v.x, v.y, residual.x), residual_sum_pair(v.z, v.w, residual.y));
    __stcg(sums + quad, make_float4(0.0f, 0.0f, 0.0f, 0.0f));
  }
}

template <int NT>
__global__ void __launch_bounds__(kThreads, 1) swiglu_batched_kernel(const SwigluBatchedParams p) {
  using T = Tiles<NT>;
  extern __shared__ __align__(128) unsigned char shared[];
  float* norm_squares = reinterpret_cast<float*>(shared + T::kRingBytes);
  const uint64_t streamed = evict_first_policy();  // the weights are read once per pass
  for (int token0 = 0; token0 < p.tokens; token0 += T::kPassTokens) {
    if (threadIdx.x < T::kPassTokens) norm_squares[threadIdx.x] = 0.0f;  // read after the ring's barriers
    gate_up_pass<NT>(p, shared, norm_squares, token0, streamed);
    const DownPass<NT> down(p, shared, token0, streamed);
    prime_ring<T::kStages2>(down.stages, [&](int stage, int slot) { down.issue_weights(stage, slot); });
    grid_barrier(p.barrier);  // every act of the pass is in L2
    prime_ring<T::kStages2>(down.stages, [&](int stage, int slot) { down.issue_rows_of(stage, slot); });
    down.run();
  }
  grid_barrier(p.barrier);  // every partial y is in the accumulator
  finish_output(p);
}

// How many blocks of the NT instance one SM holds (0 where its shared memory does not fit), asked
// once per device.
template <int NT>
cudaError_t blocks_per_sm(int& out) {
  static PerDevice<int> known;
  return known.get(out, [](int& blocks) {
    DeviceAttributes device;
    if (cudaError_t e = current_device_attributes(device); e != cudaSuccess) return e;
    const int bytes = static_cast<int>(Tiles<NT>::kSharedBytes);
    blocks = 0;
    if (bytes > device.shared_bytes_per_block_optin) return cudaSuccess;
    return opt_in_blocks_per_sm(swiglu_batched_kernel<NT>, kThreads, bytes, blocks);
  });
}

template <int NT>
cudaError_t launch_with_pass(const SwigluBatchedParams& p, cudaStream_t stream) {
  int per_sm = 0;
  if (cudaError_t e = blocks_per_sm<NT>(per_sm); e != cudaSuccess) return e;
  if (per_sm < 1) return cudaErrorNotSupported;
  DeviceAttributes device;
  if (cudaError_t e = current_device_attributes(device); e != cudaSuccess) return e;
  // Co-resident (grid barriers), and at least one I tile per block.
  const int blocks = std::min(p.intermediate / 16, device.sm_count * per_sm);
  swiglu_batched_kernel<NT><<<blocks, kThreads, Tiles<NT>::kSharedBytes, stream>>>(p);
  return cudaGetLastError();
}

bool valid_shape(int hidden, int intermediate) {
  return hidden > 0 && intermediate > 0 && hidden % batched::kHiddenMultiple == 0 &&
         intermediate % batched::kIntermediateMultiple == 0;
}

size_t shared_bytes_for(int tokens) {
  return tokens <= 16 ? Tiles<2>::kSharedBytes
         : tokens <= 32 ? Tiles<4>::kSharedBytes
         : tokens <= 64 ? Tiles<8>::kSharedBytes
                        : Tiles<16>::kSharedBytes;
}

}  // namespace

std::string swiglu_batched_unsupported(int hidden, int intermediate, int tokens, const SwigluFusedDevice& device,
                                       WeightFormat format) {
  if (format != WeightFormat::bf16)
    return std::string("the batched fused MLP reads bf16 weights, not ") + weight_format_name(format);
  if (!valid_shape(hidden, intermediate))
    return "the batched fused MLP needs a hidden size that is a multiple of " +
           std::to_string(batched::kHiddenMultiple) + " and an intermediate size that is a multiple of " +
           std::to_string(batched::kIntermediateMultiple);
  if (tokens < 1 || tokens > batched::kMaxTokens)
    return "the batched fused MLP takes 1 to " + std::to_string(batched::kMaxTokens) + " tokens, not " +
           std::to_string(tokens);
  const size_t needed = shared_bytes_for(tokens) + batched::kSharedReservedPerBlock;
  if (device.shared_bytes_per_sm > 0 && needed > static_cast<size_t>(device.shared_bytes_per_sm))
    return "the batched fused MLP needs " + std::to_string(needed / 1024) + " KB of shared memory per SM at " +
           std::to_string(tokens) + " tokens; this GPU has " + std::to_string(device.shared_bytes_per_sm / 1024);
  return "";
}

size_t swiglu_batched_activation_elements(int intermediate, int max_tokens) {
  return static_cast<size_t>(intermediate) * std::min(max_tokens, batched::kMaxTokens);
}

size_t swiglu_batched_accumulator_floats(int hidden, int max_tokens) {
  return static_cast<size_t>(hidden) * std::min(max_tokens, batched::kMaxTokens);
}

cudaError_t launch_swiglu_batched(const SwigluBatchedParams& p, cudaStream_t stream) {
  static_assert(kSwigluBatchedMaxTokens == batched::kMaxTokens, "one token limit");
  if (!valid_shape(p.hidden, p.intermediate) || p.tokens < 1 || p.tokens > batched::kMaxTokens || !p.x ||
      !p.gate_up || !p.down || !p.y || !p.activations || !p.accumulator || !p.barrier)
    return cudaErrorInvalidValue;
  if (p.tokens <= 16) return launch_with_pass<2>(p, stream);
  if (p.tokens <= 32) return launch_with_pass<4>(p, stream);
  if (p.tokens <= 64) return launch_with_pass<8>(p, stream);
  return launch_with_pass<16>(p, stream);
}

}  // namespace deepfuse::kernels
