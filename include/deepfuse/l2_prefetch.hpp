// A byte range a kernel asks the L2 cache to fetch once its own loads are out: the next op's
// weights. Decode kernels stream weights from HBM one after another; between them (launch gaps,
// a kernel's first and last microseconds, attention at a short context) HBM idles. A kernel that
// hands the next one's weights to L2 as it finishes keeps HBM busy across the boundary, and the
// next kernel reads them from L2. A hint: a null or empty range does nothing, and the result never
// depends on it.
#pragma once

#include <cstddef>

namespace deepfuse {

struct L2PrefetchRange {
  const void* data = nullptr;  // 16-byte aligned
  size_t bytes = 0;            // whole 16-byte units are fetched; a tail under 16 bytes is not
};

}  // namespace deepfuse
