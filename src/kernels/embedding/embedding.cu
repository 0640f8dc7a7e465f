// Embedding gather: out[t, :] = table[ids[t], :].
//
// The two numbers: bytes = tokens * hidden * 2 read + the same written (8 KB per token at
// hidden 4096), no FLOPs. A decode step gathers 1..64 rows: the cost is one launch and the
// latency of one round trip to HBM, so the only goal is to issue every load at once.
//
// Tiling: one thread per 16-byte vector (8 bf16) of an output row, a flat grid-stride loop over
// tokens x hidden/8. Consecutive threads read consecutive vectors of one row (coalesced), and a
// grid of at most a few thousand blocks covers a prefill chunk in one wave. An id outside
// [0, vocab) (padded slots use -1) writes zeros: a kernel cannot throw, and zeros keep the
// layers after it finite.
#include "deepfuse/kernels/embedding.hpp"

#include <algorithm>
#include <cstddef>

#include "kernels/common/pointer_checks.hpp"

namespace deepfuse::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 4096;

__global__ void embedding_kernel(EmbeddingParams p) {
  const int vectors_per_row = p.hidden / 8;
  const size_t total = static_cast<size_t>(p.tokens) * vectors_per_row;
  for (size_t index = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; index < total;
       index += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t token = index / vectors_per_row, vector = index % vectors_per_row;
    const int32_t id = __ldg(p.ids + token);
    uint4 bits = make_uint4(0, 0, 0, 0);  // bf16 zero is all-zero bits
    if (id >= 0 && id < p.vocab)
      bits = __ldg(reinterpret_cast<const uint4*>(p.table + static_cast<size_t>(id) * p.hidden) + vector);
    reinterpret_cast<uint4*>(p.out + token * p.hidden)[vector] = bits;
  }
}

}  // namespace

cudaError_t launch_embedding(const EmbeddingParams& p, cudaStream_t stream) {
  if (!p.table || !p.ids || !p.out || p.vocab < 1 || p.tokens < 1 || p.hidden < 8 || p.hidden % 8 != 0 ||
      !aligned16(p.table) || !aligned16(p.out))
    return cudaErrorInvalidValue;
  const size_t vectors = static_cast<size_t>(p.tokens) * (p.hidden / 8);
  const int blocks = static_cast<int>(std::min<size_t>((vectors + kThreads - 1) / kThreads, kMaxBlocks));
  embedding_kernel<<<blocks, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace deepfuse::kernels
