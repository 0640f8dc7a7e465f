#include "deepfuse/kernels/speculative_accept.hpp"

namespace deepfuse::kernels {
namespace {

constexpr int kThreads = 128;

__global__ void __launch_bounds__(kThreads) speculative_accept_kernel(SpeculativeAcceptParams p) {
  const int sequence = blockIdx.x * kThreads + threadIdx.x;
  if (sequence >= p.sequences) return;
  const int drafts = min(max(p.draft_counts[sequence], 0), p.rows - 1);
  const int32_t* chosen = p.chosen + static_cast<size_t>(sequence) * p.rows;
  const int32_t* draft = p.drafts + static_cast<size_t>(sequence) * (p.rows - 1);
  int32_t* emitted = p.emitted + static_cast<size_t>(sequence) * p.rows;
  int count = 0;
  for (;;) {
    const int32_t token = chosen[count];
    emitted[count++] = token;
    if (count > drafts || token != draft[count - 1]) break;
  }
  for (int row = count; row < p.rows; ++row) emitted[row] = -1;
  p.emitted_counts[sequence] = count;
  if (p.next_ids) p.next_ids[sequence] = emitted[count - 1];
}

bool valid(const SpeculativeAcceptParams& p) {
  // One row per sequence verifies no draft: the drafts array is empty then, and never read.
  return p.chosen && (p.drafts || p.rows == 1) && p.draft_counts && p.emitted && p.emitted_counts &&
         p.sequences >= 1 && p.sequences <= 65535 && p.rows >= 1 && p.rows <= kSpeculativeMaxRows;
}

}  // namespace

cudaError_t launch_speculative_accept(const SpeculativeAcceptParams& params, cudaStream_t stream) {
  if (!valid(params)) return cudaErrorInvalidValue;
  speculative_accept_kernel<<<(params.sequences + kThreads - 1) / kThreads, kThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
