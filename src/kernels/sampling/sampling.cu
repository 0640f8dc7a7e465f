// GPU sampling: one token id per sequence from fp32 logits, with the CPU reference's semantics
// (reference::sample; Hugging Face's processors): temperature, then top-k, then top-p, then min-p,
// then the inverse CDF at u = sampling_uniform(seed, step) walking the kept tokens in ascending
// id order. Greedy (temperature <= 0) is the argmax, lowest id on ties. Design notes, passes and
// bytes: docs/kernels/sampling.md.
//
// Work split. Each sequence gets a cluster of C blocks (C = 16 while the batch's clusters of 16
// fit on the GPU at once, else 8 up to two waves of them, else 4; C = 1 before Hopper). Block r
// of the cluster owns 1/C of the vocabulary, split further into one contiguous segment per warp,
// read in rows of 32 consecutive ids (coalesced). The logits are read from L2 once and then stay
// on-chip: in registers where a warp's segment has at most 20 rows (clusters of 16 up to 163840
// ids), otherwise in L1 (76 KB per block at 152k / 8), which every pass below re-reads. Blocks
// combine results through distributed shared memory and cluster barriers,
// so one launch does everything with no host synchronisation and a fixed grid (batch x C).
//
// Passes (each a sweep over the block's logits, then a cluster exchange):
//  1. argmax: the max logit M and its lowest id. Greedy slots stop here.
//  2. top-k and top-p thresholds by a radix descent: a histogram of 256 bins over the candidates,
//     summed over the cluster; the bin holding the boundary (k-th largest by count, or the
//     descending mass reaching top_p * Z by mass) becomes the next level's candidate range.
//     Level 0 bins are linear in d = (M - l) / T (1/8 nat wide over 32 nats; below that one bin):
//     logits cluster in a few float exponents, so bins on the float bits would put most tokens in
//     one bin. Deeper levels bin 8 bits of an order-preserving 32-bit key of the logit, starting
//     at the highest bit where the bin's smallest and largest keys differ, so each level splits
//     the bin's actual range; the descent ends when the bin holds a single value (usually after
//     one or two levels). Bins also track counts, masses (fp64), and min / max keys.
//  3. top-p ties: tokens equal to the boundary value are ordered by id (the reference's stable
//     sort); when only some of them stay, the id of the first kept one is found by the same
//     id-order search as the draw.
//  4. the draw: the kept mass of each block, a prefix over the cluster to find the block where
//     u * W falls, then a warp-by-warp scan inside that block, in ascending id order.
// Kept mass is w = exp(-(M - l) / T) in fp32 (computed as exp2 of (l - M) * (1/T) * log2 e),
// summed in fp64: a CDF over 150k tokens summed in fp32 would drift by more than the gap between
// neighbouring tokens' boundaries.
#include "deepfuse/kernels/sampling.hpp"

#include <cmath>

#include "core/device_attributes.hpp"
#include "core/per_device.hpp"
#include "kernels/common/cluster_launch.hpp"
#include "kernels/common/log2e.cuh"
#include "kernels/sampling/sampling_primitives.cuh"

namespace deepfuse::kernels {
namespace {

using namespace sampling_detail;

constexpr int kWarps = 16;
constexpr int kThreads = kWarps * 32;
constexpr int kBins = 256;
constexpr float kLevel0BinsPerNat = 8.0f;
constexpr float kLevel0Nats = kBins / kLevel0BinsPerNat;  // tokens further below the max share the last bin

struct HistogramBin {
  double mass;  // sum of w over the bin (top-p levels only)
  uint32_t count;
  uint32_t key_min;
  uint32_t key_max;
};

template <int C>
struct SharedStorage {
  HistogramBin local[kBins];      // this block's histogram of the current level
  HistogramBin owned[kBins / C];  // bins rank, rank + C, ... summed over the cluster
  HistogramBin merged[kBins];     // the whole cluster histogram, gathered for the walk
  double warp_totals[kWarps];     // id-order search: each warp's weight
  // Never live at once (a cluster barrier ends every id-order search), so they share the space
  // and the fixed-point masses cost no shared memory (which the logits' L1 shares at batch > 7).
  union {
    double row_weights[32][33];     // id-order search: the owning warp's weights, [row][lane] (padded)
    uint32_t fixed_mass[2][kBins];  // level 0 of a top-p descent: 64-bit fixed-point masses (low, high words)
  };
  float warp_best[kWarps];
  int warp_best_id[kWarps];
  // Mailboxes the other blocks of the cluster read.
  float best_value;
  int best_id;
  double block_total;
  int found_id;
  // Block-wide broadcasts.
  float max_logit;
  int argmax_id;
  int chosen_bin;
  double chosen_above;  // metric of the bins before the chosen one
  double level_goal;
  int search_owner;
  double search_goal;
  int search_warp;
  double search_warp_goal;
};

// (value, id) pairs: the larger value wins, the lower id on ties; id < 0 is "none".
__device__ __forceinline__ bool beats(float value, int id, float other_value, int other_id) {
  if (id < 0) return false;
  if (other_id < 0) return true;
  return value > other_value || (value == other_value && id < other_id);
}

// Rows of 32 ids in each warp's segment: the vocabulary cut into one contiguous segment per warp
// of the cluster. The kernel lays the segments out by it, and the launcher picks Sequence<R> by it.
__host__ __device__ constexpr int rows_per_warp(int vocab, int cluster_size) {
  const int segments = cluster_size * kWarps;
  return ((vocab + segments - 1) / segments + 31) / 32;
}

// One sequence as this thread sees it: its warp's segment of the vocabulary, in rows of 32 ids.
// R > 0 (segments of at most R rows): the thread's logits live in registers, read once with every
// load in flight together; R = 0: each pass re-reads them through L1. Every function that takes
// a Sequence is force-inlined, so `cached` never leaves the registers.
template <int R>
struct Sequence {
  static constexpr int kRegisterRows = R;
  const float* logits;
  const uint32_t* allowed;  // the row's token bitmask, or null: every id allowed
  int vocab;
  int warp_begin;  // first id of this warp's segment
  int rows;
  int lane, warp, rank;
  float max_logit;
  float inverse_temperature;  // 1/T: distance() multiplies by it
  float cached[R > 0 ? R : 1];  // row i of this lane: id warp_begin + 32 i + lane

  // Nats below the max after temperature, >= 0; monotone (non-increasing) in the logit. A multiply
  // by 1/T and exp2 rather than a division and expf: fewer instructions per logit
  // (docs/kernels/sampling.md, "v6: a multiply by 1/T and exp2 per logit").
  __device__ __forceinline__ float distance(float v) const { return (max_logit - v) * inverse_temperature; }
  // Unnormalised probability, in (0, 1].
  __device__ __forceinline__ float mass(float v) const { return exp2f(-distance(v) * kLog2e); }
  // The logit of `id`, -inf where the bitmask leaves it out (reference::apply_token_bitmask). The
  // 32 lanes of a row read one mask word (rows start at multiples of 32): a broadcast.
  __device__ __forceinline__ float read(int id) const {
    const float v = __ldg(logits + id);
    return allowed && !token_allowed(allowed, id) ? -INFINITY : v;
  }

  __device__ __forceinline__ void load() {
    if constexpr (R > 0) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int id = warp_begin + i * 32 + lane;
        cached[i] = i < rows && id < vocab ? read(id) : 0.0f;
      }
    }
  }

  template <typename F>
  __device__ __forceinline__ void for_each_logit(F f) const {
    if constexpr (R > 0) {
#pragma unroll
      for (int i = 0; i < R; ++i) {
        const int id = warp_begin + i * 32 + lane;
        if (i < rows && id < vocab) f(id, cached[i]);
      }
    } else {
#pragma unroll 4
      for (int i = 0; i < rows; ++i) {
        const int id = warp_begin + i * 32 + lane;
        if (id < vocab) f(id, read(id));
      }
    }
  }
};

// ---- Pass 1: argmax over the cluster; every block gets (max_logit, argmax_id).
// The best of the warp's 32 (value, id) candidates, in every lane (beats is a total order, so the
// combining order does not matter).
__device__ __forceinline__ void warp_best(float& best, int& best_id) {
#pragma unroll
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(kFullMask, best, offset);
    const int other_id = __shfl_xor_sync(kFullMask, best_id, offset);
    if (beats(other, other_id, best, best_id)) best = other, best_id = other_id;
  }
}

// Combines each thread's (best, best_id) over the block, then over the cluster: one warp reads
// the warps' and then the blocks' candidates in parallel, one per lane.
template <int C>
__device__ __forceinline__ void combine_argmax(SharedStorage<C>& s, float best, int best_id, int lane, int warp) {
  static_assert(kWarps <= 32 && C <= 32, "one lane per warp and per block");
  warp_best(best, best_id);
  if (lane == 0) s.warp_best[warp] = best, s.warp_best_id[warp] = best_id;
  __syncthreads();
  if (warp == 0) {
    best = lane < kWarps ? s.warp_best[lane] : 0.0f;
    best_id = lane < kWarps ? s.warp_best_id[lane] : -1;
    warp_best(best, best_id);
    if (lane == 0) s.best_value = best, s.best_id = best_id;
  }
  cluster_barrier<C>();
  if (warp == 0) {
    best = lane < C ? *in_block<C>(&s.best_value, lane) : 0.0f;
    best_id = lane < C ? *in_block<C>(&s.best_id, lane) : -1;
    warp_best(best, best_id);
    if (lane == 0) s.max_logit = best, s.argmax_id = best_id;
  }
  __syncthreads();
}

// The float4 sweep of pass 1, for a row that is 16-byte aligned (vocab a multiple of 4) whose
// logits are not held in registers: the same warp segments, read as float4 with up to
// kSweepLoads loads per lane in flight at once. In the decode step the lm_head's weight stream has pushed most logits
// out of L2, and the scalar sweep (four loads in flight) waited on HBM four times
// (docs/kernels/sampling.md, "v5: greedy reads float4, every load in flight").
constexpr int kSweepLoads = 8;

__device__ __forceinline__ bool float4_sweep_fits(const float* logits, int vocab) {
  return vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0;
}

template <int C>
__device__ __forceinline__ void find_argmax_vectorized(SharedStorage<C>& s, const float* logits, int vocab) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, rank = blockIdx.x % C;
  const int rows = rows_per_warp(vocab, C);
  const int warp_begin = (rank * kWarps + warp) * rows * 32;
  const int end = min(vocab, warp_begin + rows * 32);  // both multiples of 4
  const float4* vectors = reinterpret_cast<const float4*>(logits);
  float best = 0.0f;
  int best_id = -1;
  for (int first = warp_begin / 4 + lane; first < end / 4; first += 32 * kSweepLoads) {
    float4 v[kSweepLoads];
#pragma unroll
    for (int j = 0; j < kSweepLoads; ++j)
      if (first + 32 * j < end / 4) v[j] = __ldg(vectors + first + 32 * j);
#pragma unroll
    for (int j = 0; j < kSweepLoads; ++j) {
      if (first + 32 * j >= end / 4) break;
      const float e[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
      for (int c = 0; c < 4; ++c)  // ids ascend per thread: ties keep the first
        if (!isnan(e[c]) && (best_id < 0 || e[c] > best)) best = e[c], best_id = (first + 32 * j) * 4 + c;
    }
  }
  combine_argmax(s, best, best_id, lane, warp);
}

// Pass 1 for any sequence view. Logits in registers were loaded all at once; read through L1,
// the float4 sweep where the row allows (its loads in flight together, the lines left in L1 for
// the passes after it), else one scalar sweep.
template <int C, typename Seq>
__device__ __forceinline__ void find_argmax(SharedStorage<C>& s, const Seq& q) {
  if constexpr (Seq::kRegisterRows == 0)
    if (!q.allowed && float4_sweep_fits(q.logits, q.vocab)) return find_argmax_vectorized(s, q.logits, q.vocab);
  float best = 0.0f;
  int best_id = -1;
  q.for_each_logit([&](int id, float v) {  // ids ascend per thread: ties keep the first
    if (!isnan(v) && (best_id < 0 || v > best)) best = v, best_id = id;
  });
  combine_argmax(s, best, best_id, q.lane, q.warp);
}

// ---- Pass 2: radix descent.
struct Level {
  bool linear;         // level 0: bins over distance(); else 8 key bits from `shift`
  bool by_mass;        // top-p: bins carry masses and the walk follows them
  uint32_t key_floor;  // candidates: key >= key_floor (top-p runs on top-k's survivors)
  uint32_t key_lo, key_hi;
  int shift;
};

// The fixed-point scale of linear bin b: ~2^31 e^(b/8) (any value close to it: quantising and
// converting back use the same one).
__device__ __forceinline__ float level0_mass_scale(int bin) {
  constexpr float kLog2eOverBinsPerNat = kLog2e / kLevel0BinsPerNat;
  return ldexpf(exp2f(static_cast<float>(bin) * kLog2eOverBinsPerNat), 31);
}

// This block's histogram of the level's candidates. Each thread folds runs of equal bins in
// registers before one set of shared atomics, so a bin that takes most tokens costs one atomic
// per thread rather than one per token.
//
// Masses: shared-memory atomics on doubles are compare-and-swap loops, which spin when lanes of a
// warp hit the same bin: at level 0 of a top-p descent, where every token lands in one of the
// bins near the body of the distribution, they were a quarter of the kernel's instructions
// (ncu, batch 32). Level 0 therefore sums in fixed point with native 32-bit atomics: a linear
// bin b holds w in (e^-(b+1)/8, e^-b/8] (the last bin: anything smaller), so w * 2^31 * e^(b/8)
// fits 31 bits and keeps ~31 bits of each w, more than the fp32 w itself has; the 64-bit sum
// (low word, carry into the high word) is exact, then converted to fp64 once per bin.
template <bool kFixedPoint, int C, typename Seq>
__device__ __forceinline__ void build_histogram(SharedStorage<C>& s, const Seq& q, const Level& level) {
  for (int b = threadIdx.x; b < kBins; b += kThreads) {
    s.local[b] = HistogramBin{0.0, 0u, 0xffffffffu, 0u};
    if (kFixedPoint) s.fixed_mass[0][b] = s.fixed_mass[1][b] = 0u;
  }
  __syncthreads();
  int run_bin = -1;
  uint32_t run_count = 0, run_min = 0, run_max = 0;
  // The run's mass: fp64, or fixed point (one of the two is unused and optimised away)
  double run_mass = 0.0;
  uint64_t run_fixed = 0;
  auto flush = [&] {
    if (run_count == 0) return;
    HistogramBin& bin = s.local[run_bin];
    atomicAdd(&bin.count, run_count);
    if constexpr (kFixedPoint) {
      const uint32_t low = static_cast<uint32_t>(run_fixed), high = static_cast<uint32_t>(run_fixed >> 32);
      const uint32_t before = atomicAdd(&s.fixed_mass[0][run_bin], low);
      const uint32_t carry = before + low < before ? 1u : 0u;
      if (high + carry) atomicAdd(&s.fixed_mass[1][run_bin], high + carry);
    } else if (level.by_mass) {
      atomicAdd(&bin.mass, run_mass);
    }
    atomicMin(&bin.key_min, run_min);
    atomicMax(&bin.key_max, run_max);
  };
  q.for_each_logit([&](int, float v) {
    if (isnan(v)) return;
    v = canonical(v);
    const uint32_t key = order_key(v);
    if (key < level.key_floor || key < level.key_lo || key > level.key_hi) return;
    const float d = q.distance(v);
    const int bin = level.linear ? (d < kLevel0Nats ? static_cast<int>(d * kLevel0BinsPerNat) : kBins - 1)
                                 : kBins - 1 - static_cast<int>((key >> level.shift) & 0xffu);
    if (bin != run_bin) {
      flush();
      run_bin = bin, run_count = 0, run_mass = 0.0, run_fixed = 0, run_min = key, run_max = key;
    }
    ++run_count;
    if constexpr (kFixedPoint)  // the product of two floats is exact in fp64, then one rounding
      run_fixed += __double2ull_rn(static_cast<double>(exp2f(-d * kLog2e)) * level0_mass_scale(bin));
    else if (level.by_mass)
      run_mass += exp2f(-d * kLog2e);
    run_min = min(run_min, key), run_max = max(run_max, key);
  });
  flush();
  __syncthreads();
  if constexpr (kFixedPoint) {
    for (int b = threadIdx.x; b < kBins; b += kThreads) {
      // < 2^53 (at most 2^17.3 tokens of < 2^32 each): exact in fp64
      const double sum = static_cast<double>(s.fixed_mass[1][b]) * 4294967296.0 + s.fixed_mass[0][b];
      s.local[b].mass = sum / level0_mass_scale(b);
    }
    __syncthreads();
  }
}

// Sums the cluster's histograms: block r sums bins r, r + C, ... over all blocks in a fixed order
// (every run adds the same way), then every block gathers the sums into `merged`. Each (owned
// bin, source block) pair is a thread: the C threads of a bin are adjacent lanes, each reads one
// remote copy, and a butterfly sums them in lane 0's order. One thread per bin reading the C
// copies in turn left the other warps waiting at the next barrier: ncu's top stall at batch 1
// (docs/kernels/sampling.md, "v7: the cluster exchanges in parallel").
template <int C>
__device__ void merge_histograms(SharedStorage<C>& s, int rank) {
  static_assert(kBins <= kThreads && 32 % C == 0, "one thread per (owned bin, source) pair, C lanes per bin");
  cluster_barrier<C>();  // every local histogram is complete
  if (threadIdx.x < kBins) {  // whole warps
    const int m = threadIdx.x / C, source = threadIdx.x % C;
    HistogramBin sum = *in_block<C>(&s.local[rank + C * m], source);
#pragma unroll
    for (int offset = 1; offset < C; offset *= 2) {
      sum.mass += __shfl_xor_sync(kFullMask, sum.mass, offset);
      sum.count += __shfl_xor_sync(kFullMask, sum.count, offset);
      sum.key_min = min(sum.key_min, __shfl_xor_sync(kFullMask, sum.key_min, offset));
      sum.key_max = max(sum.key_max, __shfl_xor_sync(kFullMask, sum.key_max, offset));
    }
    if (source == 0) s.owned[m] = sum;
  }
  cluster_barrier<C>();  // every owned sum is complete (and no one reads `local` any more)
  for (int b = threadIdx.x; b < kBins; b += kThreads) s.merged[b] = *in_block<C>(&s.owned[b / C], b % C);
  __syncthreads();
}

// Warp 0 walks the merged bins from the top (bin 0 holds the largest values) and picks the first
// non-empty bin where the cumulative metric (count, or mass) reaches the goal; if rounding leaves
// the goal unreached, the last non-empty bin. goal_is_fraction: goal *= the level's total.
template <int C>
__device__ void choose_bin(SharedStorage<C>& s, bool by_mass, double goal, bool goal_is_fraction) {
  if (threadIdx.x < 32) {
    constexpr int kPerLane = kBins / 32;
    const int lane = threadIdx.x;
    double values[kPerLane];
    double lane_sum = 0.0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const HistogramBin& bin = s.merged[lane * kPerLane + j];
      values[j] = by_mass ? bin.mass : static_cast<double>(bin.count);
      lane_sum += values[j];
    }
    const double inclusive = warp_inclusive_scan(lane_sum, lane);
    const double total = __shfl_sync(kFullMask, inclusive, 31);
    const double exclusive_raw = __shfl_up_sync(kFullMask, inclusive, 1);
    if (goal_is_fraction) goal *= total;
    double running = lane == 0 ? 0.0 : exclusive_raw;
    int hit = -1, last = -1;
    double hit_above = 0.0, last_above = 0.0;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int b = lane * kPerLane + j;
      if (s.merged[b].count > 0) {
        if (hit < 0 && running + values[j] >= goal) hit = b, hit_above = running;
        last = b, last_above = running;
      }
      running += values[j];
    }
    const unsigned hits = __ballot_sync(kFullMask, hit >= 0);
    const unsigned nonempty = __ballot_sync(kFullMask, last >= 0);
    const int source = hits ? __ffs(hits) - 1 : nonempty ? 31 - __clz(nonempty) : 0;
    const int chosen = __shfl_sync(kFullMask, hits ? hit : last, source);
    const double above = __shfl_sync(kFullMask, hits ? hit_above : last_above, source);
    if (lane == 0) s.chosen_bin = chosen, s.chosen_above = above, s.level_goal = goal;
  }
  __syncthreads();
}

// The boundary value (as a key) and what is left of the goal once every candidate above it is
// counted: `ties` tokens hold exactly that value.
struct Boundary {
  uint32_t key;
  uint32_t ties;
  double remaining;
};

// by_mass = false: goal is k, the boundary is the k-th largest logit. by_mass = true: goal is
// top_p (a fraction of the candidates' total mass), the boundary is the value at which the mass
// taken from the top first reaches it.
template <int C, typename Seq>
__device__ __forceinline__ Boundary descend(SharedStorage<C>& s, const Seq& q, bool by_mass, double goal,
                                            uint32_t key_floor) {
  Level level{true, by_mass, key_floor, 0u, 0xffffffffu, 0};
  bool goal_is_fraction = by_mass;
  for (;;) {
    // Fixed-point masses where every token is a candidate (no top-k before): see build_histogram.
    if (level.by_mass && level.linear && level.key_floor == 0)
      build_histogram<true>(s, q, level);
    else
      build_histogram<false>(s, q, level);
    merge_histograms(s, q.rank);
    choose_bin(s, by_mass, goal, goal_is_fraction);
    const int chosen = s.chosen_bin;
    if (chosen < 0) return Boundary{key_floor, 0u, 0.0};  // no candidates: cannot happen (M is one)
    goal = s.level_goal - s.chosen_above;
    goal_is_fraction = false;
    const HistogramBin bin = s.merged[chosen];
    if (bin.key_min == bin.key_max) return Boundary{bin.key_min, bin.count, goal};
    level.linear = false;
    level.key_lo = bin.key_min, level.key_hi = bin.key_max;
    level.shift = max(0, 31 - __clz(bin.key_min ^ bin.key_max) - 7);  // 8 bits ending at the top differing bit
  }
}

// ---- Passes 3 and 4: the first id (ascending) at which the running sum of weight(id, logit)
// exceeds offset + fraction * total; when rounding leaves it unreached, the last id with weight
// > 0; -1 when every weight is 0. Every block of the cluster gets the answer.
template <int C, typename Seq, typename Weight>
__device__ __forceinline__ int find_in_id_order(SharedStorage<C>& s, const Seq& q, Weight weight, double fraction,
                                                double offset) {
  double lane_sum = 0.0;
  q.for_each_logit([&](int id, float v) { lane_sum += weight(id, v); });
  const double warp_total = warp_sum(lane_sum);
  if (q.lane == 0) s.warp_totals[q.warp] = warp_total;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < kWarps; ++w) total += s.warp_totals[w];
    s.block_total = total;
  }
  cluster_barrier<C>();

  // Which block: a prefix over the cluster's block totals (C <= 32: one lane per block).
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    const double mine = lane < C ? *in_block<C>(&s.block_total, lane) : 0.0;
    const double inclusive = warp_inclusive_scan(mine, lane);
    const double goal = offset + fraction * __shfl_sync(kFullMask, inclusive, 31);
    const double exclusive_raw = __shfl_up_sync(kFullMask, inclusive, 1);
    const double exclusive = lane == 0 ? 0.0 : exclusive_raw;
    const unsigned over = __ballot_sync(kFullMask, mine > 0.0 && inclusive > goal);
    const unsigned positive = __ballot_sync(kFullMask, mine > 0.0);
    const int owner = over ? __ffs(over) - 1 : positive ? 31 - __clz(positive) : -1;
    const double owner_exclusive = __shfl_sync(kFullMask, exclusive, owner < 0 ? 0 : owner);
    if (lane == 0) s.search_owner = owner, s.search_goal = goal - owner_exclusive;
  }
  __syncthreads();
  const int owner = s.search_owner;

  if (owner == q.rank) {  // uniform over the block
    if (threadIdx.x == 0) {
      double before = 0.0, chosen_before = 0.0, last_before = 0.0;
      int chosen = -1, last = -1;
      for (int w = 0; w < kWarps; ++w) {
        const double t = s.warp_totals[w];
        if (t > 0.0) {
          if (chosen < 0 && before + t > s.search_goal) chosen = w, chosen_before = before;
          last = w, last_before = before;
        }
        before += t;
      }
      if (chosen < 0) chosen = last, chosen_before = last_before;
      s.search_warp = chosen;
      s.search_warp_goal = s.search_goal - chosen_before;
      s.found_id = -1;
    }
    __syncthreads();
    if (q.warp == s.search_warp) {
      const double goal = s.search_warp_goal;
      if constexpr (Seq::kRegisterRows > 0) {
        // The warp's weights go to shared memory, row by row; lane i sums row i, a scan over the
        // rows finds the row where the goal falls, and a scan inside that row the id.
        static_assert(Seq::kRegisterRows <= 32, "one lane per row");
        double(*weights)[33] = s.row_weights;
#pragma unroll
        for (int i = 0; i < Seq::kRegisterRows; ++i) {
          if (i >= q.rows) break;
          const int id = q.warp_begin + i * 32 + q.lane;
          weights[i][q.lane] = id < q.vocab ? weight(id, q.cached[i]) : 0.0;
        }
        __syncwarp();
        double row_total = 0.0;
        if (q.lane < q.rows)
          for (int j = 0; j < 32; ++j) row_total += weights[q.lane][j];
        const double row_inclusive = warp_inclusive_scan(row_total, q.lane);
        const unsigned over_rows = __ballot_sync(kFullMask, row_total > 0.0 && row_inclusive > goal);
        const unsigned positive_rows = __ballot_sync(kFullMask, row_total > 0.0);
        int found = -1;
        if (positive_rows) {  // else every weight is 0
          // The row where the goal falls, or the last row with weight when rounding leaves it unreached.
          const int row = over_rows ? __ffs(over_rows) - 1 : 31 - __clz(positive_rows);
          const double carry = __shfl_sync(kFullMask, row_inclusive - row_total, row);
          const double x = weights[row][q.lane];
          const double inclusive = warp_inclusive_scan(x, q.lane);
          const unsigned over = __ballot_sync(kFullMask, x > 0.0 && carry + inclusive > goal);
          const unsigned positive = __ballot_sync(kFullMask, x > 0.0);
          found = q.warp_begin + row * 32 + (over_rows && over ? __ffs(over) - 1 : 31 - __clz(positive));
        }
        if (q.lane == 0) s.found_id = found;
      } else {
        double carry = 0.0;
        int found = -1, last_positive = -1;
        for (int i = 0; i < q.rows && found < 0; ++i) {  // `found` is warp-uniform
          const int row_begin = q.warp_begin + i * 32;
          const int id = row_begin + q.lane;
          const double x = id < q.vocab ? weight(id, q.read(id)) : 0.0;
          const double inclusive = warp_inclusive_scan(x, q.lane);
          const unsigned over = __ballot_sync(kFullMask, x > 0.0 && carry + inclusive > goal);
          const unsigned positive = __ballot_sync(kFullMask, x > 0.0);
          if (over) found = row_begin + __ffs(over) - 1;
          if (positive) last_positive = row_begin + 31 - __clz(positive);
          carry += __shfl_sync(kFullMask, inclusive, 31);
        }
        if (q.lane == 0) s.found_id = found >= 0 ? found : last_positive;
      }
    }
  }
  cluster_barrier<C>();  // the owner's found_id is written
  return owner >= 0 ? *in_block<C>(&s.found_id, owner) : -1;
}

// This thread's view of sequence `sequence`'s logits (every field but max_logit, set by the passes).
template <int R, int C>
__device__ __forceinline__ Sequence<R> sequence_view(const SamplingParams& p, int sequence, float temperature) {
  Sequence<R> q;
  q.logits = p.logits + static_cast<size_t>(sequence) * p.vocab;
  q.allowed = p.token_bitmask ? p.token_bitmask + static_cast<size_t>(sequence) * token_bitmask_words(p.vocab) : nullptr;
  q.vocab = p.vocab;
  q.lane = threadIdx.x % 32, q.warp = threadIdx.x / 32, q.rank = blockIdx.x % C;
  q.rows = rows_per_warp(p.vocab, C);
  q.warp_begin = (q.rank * kWarps + q.warp) * q.rows * 32;
  q.inverse_temperature = 1.0f / temperature;
  q.max_logit = 0.0f;
  q.load();
  return q;
}

// Every pass for one sampling slot; returns the chosen id (-1: none), the same in every block.
template <int C, int R>
__device__ __forceinline__ int sample_slot(SharedStorage<C>& s, Sequence<R>& q, const SamplingSlot& slot,
                                           const SamplingParams& p) {
  find_argmax(s, q);
  const float max_logit = s.max_logit;
  const int argmax_id = s.argmax_id;
  q.max_logit = max_logit;
  int chosen = argmax_id;

  // Every branch below depends only on the slot and on cluster-wide results: all blocks of the
  // cluster take it together and meet the same barriers.
  const bool greedy = !(slot.temperature > 0.0f) || argmax_id < 0 || isinf(max_logit);
  if (!greedy) {
    uint32_t top_k_key = 0;  // keep key >= top_k_key
    if (slot.top_k > 0 && slot.top_k < p.vocab)
      top_k_key = descend(s, q, false, static_cast<double>(slot.top_k), 0u).key;

    uint32_t top_p_key = 0;  // keep key > top_p_key, and key == top_p_key from id top_p_first_id on
    int top_p_first_id = 0;
    if (slot.top_p < 1.0f) {
      const Boundary boundary = descend(s, q, true, static_cast<double>(slot.top_p), top_k_key);
      top_p_key = boundary.key;
      // Tied tokens sort by id in the reference (stable sort, ascending), so the tail keeps the
      // highest ids: as many as it takes to reach the goal, at least one.
      const float tie_mass = q.mass(key_value(boundary.key));
      uint32_t keep = boundary.ties;
      if (tie_mass > 0.0f) {
        const double needed = ceil(boundary.remaining / tie_mass);
        keep = needed <= 1.0 ? 1u : needed >= boundary.ties ? boundary.ties : static_cast<uint32_t>(needed);
      }
      if (keep < boundary.ties) {
        const uint32_t key = boundary.key;
        top_p_first_id = find_in_id_order(
            s, q, [key](int, float v) { return !isnan(v) && order_key(canonical(v)) == key ? 1.0 : 0.0; }, 0.0,
            static_cast<double>(boundary.ties - keep));
      }
    }

    const bool use_min_p = slot.min_p > 0.0f;
    const float min_p = slot.min_p;
    auto kept_mass = [&q, top_k_key, top_p_key, top_p_first_id, use_min_p, min_p](int id, float v) -> double {
      if (isnan(v)) return 0.0;
      v = canonical(v);
      const uint32_t key = order_key(v);
      if (key < top_k_key || key < top_p_key || (key == top_p_key && id < top_p_first_id)) return 0.0;
      const float w = q.mass(v);  // min-p: p < min_p * p_max  <=>  w < min_p, as p_max has w = 1
      return use_min_p && w < min_p ? 0.0 : static_cast<double>(w);
    };
    const int drawn = find_in_id_order(s, q, kept_mass, sampling_uniform(slot.seed, slot.step), 0.0);
    if (drawn >= 0) chosen = drawn;
  }
  return chosen;
}

// Two blocks per SM (at most 64 registers) where the logits stay in L1 (R = 0) in clusters of 4
// or 8, so more clusters are resident (launch_sampling picks the size by that count). Left to
// itself the compiler gave these instances 64-106 registers depending on unrelated code: with
// the fixed-point masses, clusters of 4 took 104 (one block per SM) and batch 32 in temperature
// mode went from 67 to 90 us. 0: no minimum, the compiler's choice (the register instances).
template <int C, int R>
constexpr int kMinBlocksPerSm = R == 0 && (C == 4 || C == 8) ? 2 : 0;

template <int C, int R>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm<C, R>) sampling_kernel(SamplingParams p) {
  __shared__ SharedStorage<C> s;
  const int sequence = blockIdx.x / C;
  const SamplingSlot slot = p.slots[sequence];  // read before the first barrier: the step is bumped after
  // A greedy slot needs pass 1 only: one sweep through L1 rather than the logits in registers
  // (scalar: 6.5 vs 7.3 us at batch 1 over 128256 ids). The branch depends only on the slot, so
  // every block of the cluster takes it.
  int chosen;
  if (!(slot.temperature > 0.0f)) {
    const Sequence<0> q = sequence_view<0, C>(p, sequence, slot.temperature);
    find_argmax(s, q);
    chosen = s.argmax_id;
  } else {
    Sequence<R> q = sequence_view<R, C>(p, sequence, slot.temperature);
    chosen = sample_slot(s, q, slot, p);
  }

  if (blockIdx.x % C == 0 && threadIdx.x == 0) {
    const bool sat_out = p.fed_ids && p.fed_ids[sequence] < 0;  // read before ids (maybe the same row) is written
    const int32_t id = chosen >= 0 ? chosen : 0;
    p.ids[sequence] = id;
    if (p.host_ids) __stwt(p.host_ids + sequence, id);  // straight to the host: no copy after the step
    if (!sat_out) p.slots[sequence].step = slot.step + 1;
  }
  cluster_barrier<C>();  // no block leaves while another may still read its shared memory
}

// ---- Host side.
// Segments of up to this many rows keep their logits in registers (Sequence<R>): 128256 and
// 152064 ids in clusters of 16 take 16 and 19 rows.
constexpr int kRegisterRows = 20;

template <int C>
cudaError_t launch_with_cluster(const SamplingParams& p, cudaStream_t stream) {
  const ClusterLaunch launch(static_cast<unsigned>(p.batch) * C, kThreads, 0, C, stream);
  auto kernel = rows_per_warp(p.vocab, C) <= kRegisterRows ? sampling_kernel<C, kRegisterRows> : sampling_kernel<C, 0>;
  if (cudaError_t e = cudaLaunchKernelEx(&launch.config, kernel, p); e != cudaSuccess) return e;
  return cudaGetLastError();
}

// How many clusters of C blocks of the sampling kernel can be resident at once (0: none).
template <int C>
int resident_clusters() {
  auto kernel = sampling_kernel<C, 0>;
  if (C > 8)
    for (auto instance : {sampling_kernel<C, 0>, sampling_kernel<C, kRegisterRows>})
      if (cudaFuncSetAttribute(instance, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess) return 0;
  const ClusterLaunch probe(C, kThreads, 0, C, nullptr);
  int clusters = 0;
  return cudaOccupancyMaxActiveClusters(&clusters, kernel, &probe.config) == cudaSuccess ? clusters : 0;
}

// What the current device supports, probed once per device (not during a launch of a captured
// graph's later replays: the first launch pays for it).
struct ClusterSupport {
  int clusters_of_4 = 0;  // resident at once; 0: unsupported
  int clusters_of_8 = 0;
  int clusters_of_16 = 0;
};

cudaError_t cluster_support(ClusterSupport& out) {
  static PerDevice<ClusterSupport> known;
  return known.get(out, [](ClusterSupport& support) {
    DeviceAttributes attributes;
    if (cudaError_t e = current_device_attributes(attributes); e != cudaSuccess) return e;
    // The logits stay in L1 between passes: a small shared-memory carveout (in percent) leaves L1
    // the room.
    constexpr int kCarveout = 25;
    for (auto kernel : {sampling_kernel<1, 0>, sampling_kernel<1, kRegisterRows>})
      if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, kCarveout);
          e != cudaSuccess)
        return e;
    if (!attributes.has_clusters()) return cudaSuccess;  // every count stays 0: unsupported
    for (auto kernel : {sampling_kernel<4, 0>, sampling_kernel<4, kRegisterRows>, sampling_kernel<8, 0>,
                        sampling_kernel<8, kRegisterRows>, sampling_kernel<16, 0>, sampling_kernel<16, kRegisterRows>})
      if (cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, kCarveout);
          e != cudaSuccess)
        return e;
    support.clusters_of_4 = resident_clusters<4>();
    support.clusters_of_8 = resident_clusters<8>();
    support.clusters_of_16 = resident_clusters<16>();
    (void)cudaGetLastError();  // a refused cluster probe means "unsupported", not the next launch's error
    return cudaSuccess;
  });
}

bool valid(const SamplingParams& p) {
  return p.logits && p.slots && p.ids && p.batch >= 1 && p.batch <= (1 << 24) && p.vocab >= 1 &&
         p.vocab <= (1 << 30);
}

}  // namespace

size_t sampling_workspace_bytes(int /*batch*/, int /*vocab*/) { return 0; }  // blocks share through DSMEM

cudaError_t launch_sampling(const SamplingParams& params, cudaStream_t stream) {
  if (!valid(params)) return cudaErrorInvalidValue;
  ClusterSupport support;
  if (cudaError_t e = cluster_support(support); e != cudaSuccess) return e;
  // 16 blocks per sequence while the batch's clusters of 16 fit the GPU at once; then 8 while
  // they take at most two waves; then 4 (one wave up to ~32 sequences): what measured fastest
  // (docs/kernels/sampling.md, "v3: clusters of 4 beyond two waves of 8").
  const int cluster = params.batch <= support.clusters_of_16    ? 16
                      : params.batch <= 2 * support.clusters_of_8 ? 8
                      : support.clusters_of_4 > 0                 ? 4
                      : support.clusters_of_8 > 0                 ? 8
                      : support.clusters_of_16 > 0                ? 16
                                                                  : 1;
  return launch_sampling_with_cluster_size(params, cluster, stream);
}

cudaError_t launch_sampling_with_cluster_size(const SamplingParams& params, int cluster_size, cudaStream_t stream) {
  if (!valid(params) || (cluster_size != 1 && cluster_size != 4 && cluster_size != 8 && cluster_size != 16))
    return cudaErrorInvalidValue;
  ClusterSupport support;
  if (cudaError_t e = cluster_support(support); e != cudaSuccess) return e;
  if (cluster_size == 1) return launch_with_cluster<1>(params, stream);
  if (cluster_size == 4 && support.clusters_of_4 > 0) return launch_with_cluster<4>(params, stream);
  if (cluster_size == 8 && support.clusters_of_8 > 0) return launch_with_cluster<8>(params, stream);
  if (cluster_size == 16 && support.clusters_of_16 > 0) return launch_with_cluster<16>(params, stream);
  return cudaErrorNotSupported;
}

}  // namespace deepfuse::kernels
