#include "deepfuse/kernels/token_penalties.hpp"

namespace deepfuse::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kIdsPerBlock = 4096;  // 16 per thread: ~38 blocks per row over a 152k vocabulary

__global__ void __launch_bounds__(kThreads) token_penalties_kernel(TokenPenaltyParams p) {
  const int row = blockIdx.y;
  const PenaltySlot slot = p.slots[row];
  if (slot.presence == 0.0f && slot.frequency == 0.0f) return;  // penalized(), on the device
  const size_t offset = static_cast<size_t>(row) * p.vocab;
  int32_t* counts = p.counts + offset;
  float* logits = p.logits + offset;
  const int fed = p.fed_ids ? p.fed_ids[row] : -1;
  const int end = min(p.vocab, static_cast<int>(blockIdx.x + 1) * kIdsPerBlock);
  // Each id belongs to one thread, which also counts the fed id: no atomics, no ordering across blocks.
  for (int id = blockIdx.x * kIdsPerBlock + threadIdx.x; id < end; id += kThreads) {
    int count = counts[id];
    if (id == fed) counts[id] = ++count;
    if (count == 0) continue;
    // Rounded as the CPU rounds it (no fused multiply-add): the two backends penalize bit for bit.
    const float penalty = __fadd_rn(slot.presence, __fmul_rn(slot.frequency, static_cast<float>(count)));
    logits[id] = __fsub_rn(logits[id], penalty);
  }
}

bool valid(const TokenPenaltyParams& p) {
  return p.logits && p.counts && p.slots && p.batch >= 1 && p.batch <= 65535 && p.vocab >= 1 && p.vocab <= (1 << 30);
}

}  // namespace

cudaError_t launch_token_penalties(const TokenPenaltyParams& params, cudaStream_t stream) {
  if (!valid(params)) return cudaErrorInvalidValue;
  const dim3 grid((params.vocab + kIdsPerBlock - 1) / kIdsPerBlock, params.batch);
  token_penalties_kernel<<<grid, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
