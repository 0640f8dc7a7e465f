// The weight stream shared by the decode-step projections that end in an epilogue of their own
// (the fused QKV front half, o_proj + residual): sums[rows][tokens] = W · x^T for up to 16
// tokens, split over warps "stream-K" style so that every SM streams the same number of bytes.
//
// Why stream-K. The weights are fragment-packed (packing.cuh): 16-row tiles, each a run of
// k-steps of 512 bytes (32 lanes x 16 B, mma.m16n8k16's A operand), so the matrix is one array of
// tiles x ksteps "units". Every warp of the grid (kBlocksPerSm blocks of kWarps warps per SM)
// takes an equal contiguous run of units, whatever the shape. The cluster GEMV this replaces gave
// each cluster of 8 blocks one head: Llama-3-8B's QKV launched 48 clusters where 45 fit at once,
// and its SMs sat idle 38% of the kernel (ncu: 28.5k active of 45.4k cycles, 24 µs for 12 µs of
// bytes); o_proj's 32 clusters left SMs with 1 to 3 blocks (72% active).
//
// Tiles split between warps. A run may start or end inside a tile; the tiles wholly inside it are
// the warp's own, and their epilogue runs as soon as they are done. The (at most two) tiles at the
// ends may be shared: when its run is over, a warp adds those fp32 partial sums into the tile's
// slot of an L2-resident workspace (red.global.add), fences, and takes a ticket from the tile's
// counter. The warps that share a tile follow from the split, so the one that draws the last
// ticket knows it: it reads the sums back, zeroes the slot and the counter for the next launch,
// and runs the caller's epilogue on the tile's 16 rows. No block waits for another, and the fences
// come after a warp's loads are drained (a fence mid-stream would wait for its copies in flight).
//
// Operands. A (16 weight rows) from the packed weights, B (up to 8 tokens per n-tile,
// x[token][k-step columns]) straight from global x, both through the warp's own cp.async ring in
// shared memory: one k-step per stage, each lane reading back only what it copied (no barriers).
// The weights are constants: the first stages are requested before the upstream wait of a
// programmatic dependent launch; x comes from the kernel before, so only after it.
//
// Bytes in flight: 11 stages x 512 B of weights per warp, 16 warps per SM: ~90 KB per SM, about
// 3x what Little's law asks at 4.3 TB/s and ~1 µs (33 KB per SM).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/common/async_ring.cuh"
#include "kernels/common/cluster_launch.hpp"
#include "kernels/common/dependent_launch.cuh"
#include "kernels/mlp/fragment.cuh"

namespace deepfuse::kernels::streamk_gemv {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kTileRows = 16;
constexpr int kMaxTokens = 16;  // two n-tiles of 8

// The ring of a warp: S stages of C consecutive k-steps each, one commit group per stage, so a
// warp asks for C x 512 contiguous bytes at a time. RING selects the (C, S) under test.
template <int NT, int RING>
struct Ring {
  static constexpr int C = RING == 0 ? 1 : RING == 1 ? 4 : (NT == 1 ? 8 : 4);
  static constexpr int S = RING == 0 ? (NT == 1 ? 12 : 8) : RING == 1 ? (NT == 1 ? 4 : 3) : (NT == 1 ? 2 : 3);
  static constexpr int kSlots = C * S;
  static constexpr int kSlotBytes = 32 * (16 + 8 * NT);  // A: 16 B per lane; B: two 4-byte x words per n-tile
  static constexpr int kSharedBytes = kWarps * kSlots * kSlotBytes;
  static constexpr int kBlocksPerSm = (227 * 1024) / (kSharedBytes + 1024) >= 2 ? 2 : 1;
};

// Workspace: fp32 sums [tiles][16 rows][kMaxTokens], then u32 counters [tiles]. Zero it once when
// it is allocated; every launch leaves it zero again. Launches that share one must not overlap.
inline size_t workspace_bytes(int rows) {
  const size_t tiles = static_cast<size_t>(rows) / kTileRows;
  return tiles * kTileRows * kMaxTokens * sizeof(float) + tiles * sizeof(unsigned);
}

struct Problem {
  const uint4* weights = nullptr;   // fragment-packed [tiles * 16 rows, inner]
  const __nv_bfloat16* x = nullptr; // [tokens, inner]
  void* workspace = nullptr;        // workspace_bytes(tiles * 16), zero
  int tokens = 0;                   // 1 .. kMaxTokens
  int inner = 0;                    // multiple of 16
  int tiles = 0;
  int warps = 0;                    // warps that take a run (planned by launch())
};

// A finished tile's sums, as its epilogue sees them. Each (row, token) is taken exactly once:
// taking it zeroes the workspace slot for the next launch.
struct TileSums {
  float* slot;  // [16][kMaxTokens]

  __device__ float take(int row, int token) const {
    float* p = slot + row * kMaxTokens + token;
    const float value = __ldcg(p);
    __stcg(p, 0.0f);
    return value;
  }
};

template <int NT, int RING>
class WarpStream {
 public:
  using R = Ring<NT, RING>;
  static constexpr int S = R::S, C = R::C;

  __device__ WarpStream(const Problem& problem, unsigned char* shared) : p_(problem) {
    const int warp = threadIdx.x / 32;
    lane_ = threadIdx.x % 32;
    unsigned char* ring = shared + warp * R::kSlots * R::kSlotBytes;
    a_ring_ = reinterpret_cast<uint4*>(ring);
    b_ring_ = reinterpret_cast<uint2*>(ring + R::kSlots * 32 * sizeof(uint4));
    ksteps_ = p_.inner / 16;
    units_ = static_cast<long long>(p_.tiles) * ksteps_;
    const int w = blockIdx.x * kWarps + warp;
    const long long begin = w < p_.warps ? units_ * w / p_.warps : 0;
    const long long end = w < p_.warps ? units_ * (w + 1) / p_.warps : 0;
    unit_begin_ = begin;
    steps_ = static_cast<int>(end - begin);
    first_k_ = static_cast<int>(begin % ksteps_);
    // Lanes whose n-tile rows are padding tokens never copy: their B words stay zero.
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int token = nt * 8 + lane_ / 4;
      x_valid_[nt] = token < p_.tokens;
      if (!x_valid_[nt])
        for (int slot = 0; slot < R::kSlots; ++slot) b_ring_[(slot * NT + nt) * 32 + lane_] = make_uint2(0u, 0u);
    }
  }

  // Before the upstream wait: the first S - 1 stages of weights, one commit group each.
  __device__ void request_weights() {
    const uint4* source = p_.weights + unit_begin_ * 32 + lane_;
#pragma unroll
    for (int stage = 0; stage < S - 1; ++stage) {
#pragma unroll
      for (int c = 0; c < C; ++c) {
        const int i = stage * C + c;
        if (i < steps_) copy16_async(&a_ring_[i * 32 + lane_], source + i * 32);
      }
      commit_async();
    }
  }

  // After the upstream wait: streams the run; finish(tile, TileSums) runs on the whole warp for
  // every tile this warp completes last.
  template <typename Finish>
  __device__ void run(Finish&& finish) {
    if (steps_ == 0) return;
    const int t = lane_ % 4;
    // x rows of this lane's tokens, at the current issue column.
    const __nv_bfloat16* x_row[NT];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) x_row[nt] = p_.x + static_cast<size_t>(x_valid_[nt] ? nt * 8 + lane_ / 4 : 0) * p_.inner + 2 * t;
    int issue_k = first_k_;
    auto issue_x = [&](int slot) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
        if (x_valid_[nt]) {
          uint2* target = &b_ring_[(slot * NT + nt) * 32 + lane_];
          copy4_async(&target->x, x_row[nt] + issue_k * 16, true);
          copy4_async(&target->y, x_row[nt] + issue_k * 16 + 8, true);
        }
      if (++issue_k == ksteps_) issue_k = 0;
    };
    for (int i = 0; i < (S - 1) * C && i < steps_; ++i) issue_x(i);
    commit_async();
    wait_async<0>();  // the primed stages, weights and x

    constexpr int kAhead = (S - 1) * C;  // k-steps between a step and the one issued with it
    const uint4* next_weights = p_.weights + (unit_begin_ + kAhead) * 32 + lane_;
    float acc[NT][4] = {}, head[NT][4] = {};
    bool head_pending = false;
    long long tile = unit_begin_ / ksteps_;
    int tile_k = first_k_;
    for (int base = 0; base < steps_; base += S * C) {
#pragma unroll
      for (int s = 0; s < S; ++s) {
        const int i0 = base + s * C;
        if (i0 >= steps_) break;
        const int issue_stage = (s + S - 1) % S;  // compile-time after unrolling
#pragma unroll
        for (int c = 0; c < C; ++c)
          if (i0 + kAhead + c < steps_) {
            copy16_async(&a_ring_[(issue_stage * C + c) * 32 + lane_], next_weights);
            next_weights += 32;
            issue_x(issue_stage * C + c);
          }
        commit_async();
        wait_async<S - 1>();  // stage s (issued S - 1 groups ago) has landed
#pragma unroll
        for (int c = 0; c < C; ++c) {
          const int i = i0 + c;
          if (i >= steps_) break;
          const int slot = s * C + c;
          const uint4 a = a_ring_[slot * 32 + lane_];
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const uint2 b = b_ring_[(slot * NT + nt) * 32 + lane_];
            mma_bf16_m16n8k16(acc[nt], a, b.x, b.y);
          }
          if (++tile_k == ksteps_ && i + 1 < steps_) {  // a tile ends inside the run
            if (tile == unit_begin_ / ksteps_ && first_k_ != 0) {
              move(acc, head);  // begun by the warp before: shared, added at the end of the run
              head_pending = true;
            } else {
              finish_owned(tile, acc, finish);
            }
            tile_k = 0;
            ++tile;
          }
        }
      }
    }
    // End of the run: the last tile, then the first if it was kept back.
    finish_shared(tile, acc, finish);
    if (head_pending) finish_shared(unit_begin_ / ksteps_, head, finish);
  }

 private:
  __device__ static void move(float (&from)[NT][4], float (&to)[NT][4]) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) to[nt][c] = from[nt][c], from[nt][c] = 0.0f;
  }

  __device__ float* slot(long long tile) const {
    return static_cast<float*>(p_.workspace) + tile * kTileRows * kMaxTokens;
  }

  // Adds (atomic) or stores this warp's sums into the tile's slot; zeroes acc.
  template <bool kAtomic>
  __device__ void deposit(long long tile, float (&acc)[NT][4]) {
    const int g = lane_ / 4, t = lane_ % 4;
    float* sums = slot(tile);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int token = nt * 8 + 2 * t + (c & 1), row = g + (c >= 2 ? 8 : 0);
        if (token < p_.tokens) {
          if constexpr (kAtomic) {
            atomicAdd(sums + row * kMaxTokens + token, acc[nt][c]);
          } else {
            sums[row * kMaxTokens + token] = acc[nt][c];
          }
        }
        acc[nt][c] = 0.0f;
      }
  }

  // A tile that lies wholly inside this warp's run: no other warp adds to it.
  template <typename Finish>
  __device__ void finish_owned(long long tile, float (&acc)[NT][4], Finish& finish) {
    deposit<false>(tile, acc);
    __syncwarp();  // orders the lanes' stores before the epilogue's loads
    finish(tile, TileSums{slot(tile)});
  }

  // The warp that owns unit u (runs are [units * w / warps, units * (w + 1) / warps)).
  __device__ long long owner(long long u) const { return ((u + 1) * p_.warps - 1) / units_; }

  // A tile at either end of the run, maybe shared: add, take a ticket, finish if last.
  template <typename Finish>
  __device__ void finish_shared(long long tile, float (&acc)[NT][4], Finish& finish) {
    const long long first = tile * ksteps_;
    const unsigned sharers = static_cast<unsigned>(owner(first + ksteps_ - 1) - owner(first) + 1);
    if (sharers == 1) return finish_owned(tile, acc, finish);
    deposit<true>(tile, acc);
    __syncwarp();
    auto* counters = reinterpret_cast<unsigned*>(static_cast<float*>(p_.workspace) +
                                                 static_cast<size_t>(p_.tiles) * kTileRows * kMaxTokens);
    unsigned ticket = 0;
    if (lane_ == 0) {
      __threadfence();  // the warp's sums (ordered before by the warp barrier) are visible GPU-wide
      ticket = atomicAdd(counters + tile, 1u);
    }
    ticket = __shfl_sync(0xffffffffu, ticket, 0);
    if (ticket != sharers - 1) return;
    __threadfence();  // every sharer's sums are visible to this warp's loads
    if (lane_ == 0) counters[tile] = 0u;
    finish(tile, TileSums{slot(tile)});
  }

  Problem p_;
  uint4* a_ring_;
  uint2* b_ring_;
  bool x_valid_[NT];
  long long units_ = 0, unit_begin_ = 0;
  int ksteps_ = 0, steps_ = 0, first_k_ = 0, lane_ = 0;
};

// The ring configuration launches use: DEEPFUSE_GEMV_RING (0, 1, 2; default 1), read once.
int ring_choice();

// Warps for `tiles` tiles of `inner` columns on the current device with blocks_per_sm blocks per
// SM, or fewer when there are fewer k-steps than that (every warp then takes at least one).
inline cudaError_t plan(Problem& problem, int blocks_per_sm) {
  int device = 0, sms = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return e;
  if (cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device); e != cudaSuccess) return e;
  const long long units = static_cast<long long>(problem.tiles) * (problem.inner / 16);
  problem.warps = static_cast<int>(std::min<long long>(static_cast<long long>(sms) * blocks_per_sm * kWarps, units));
  return cudaSuccess;
}

// Plans `problem` and launches kernel<<<blocks, kThreads, R::kSharedBytes>>>(args..., problem) as a
// programmatic dependent (unless DEEPFUSE_PDL=0).
template <typename R, typename Kernel, typename Params>
cudaError_t launch(Kernel kernel, const Params& params, Problem problem, cudaStream_t stream) {
  if (cudaError_t e = plan(problem, R::kBlocksPerSm); e != cudaSuccess) return e;
  // Set on every call: it is per device, and costs nothing inside a captured graph.
  if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, R::kSharedBytes);
      e != cudaSuccess)
    return e;
  const unsigned blocks = static_cast<unsigned>((problem.warps + kWarps - 1) / kWarps);
  const ClusterLaunch launch(blocks, kThreads, R::kSharedBytes, 1, stream, programmatic_launches_enabled());
  return cudaLaunchKernelEx(&launch.config, kernel, params, problem);
}

// Calls launch_instance(nt, ring) with std::integral_constant values for the token count.
template <typename LaunchInstance>
cudaError_t dispatch(int tokens, LaunchInstance&& launch_instance) {
  auto with_ring = [&](auto nt) {
    switch (ring_choice()) {
      case 0: return launch_instance(nt, std::integral_constant<int, 0>{});
      case 2: return launch_instance(nt, std::integral_constant<int, 2>{});
      default: return launch_instance(nt, std::integral_constant<int, 1>{});
    }
  };
  return tokens <= 8 ? with_ring(std::integral_constant<int, 1>{}) : with_ring(std::integral_constant<int, 2>{});
}

}  // namespace deepfuse::kernels::streamk_gemv
