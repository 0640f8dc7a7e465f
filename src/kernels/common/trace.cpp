#include "kernels/common/trace.hpp"

#include <cuda_runtime_api.h>

#include <algorithm>

#include "deepfuse/error.hpp"

namespace deepfuse::kernels::trace {
namespace {
Buffer buffer;  // the one device buffer; its address goes into each unit's symbol
}

bool compiled_in() {
#if defined(DEEPFUSE_TRACE)
  return true;
#else
  return false;
#endif
}

void begin(unsigned capacity) {
  DF_CHECK(compiled_in(), "tracing needs a build configured with -DDEEPFUSE_TRACE=ON");
  DF_CHECK(capacity > 0, "trace capacity must be positive");
  if (capacity > buffer.capacity) {
    if (buffer.events) {
      DF_CHECK_CUDA(cudaFree(buffer.events));
      DF_CHECK_CUDA(cudaFree(buffer.count));
    }
    DF_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&buffer.events), sizeof(Event) * capacity));
    DF_CHECK_CUDA(cudaMalloc(reinterpret_cast<void**>(&buffer.count), sizeof(unsigned)));
    buffer.capacity = capacity;
    ++buffer.generation;
  }
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  DF_CHECK_CUDA(cudaMemset(buffer.count, 0, sizeof(unsigned)));
  DF_CHECK_CUDA(cudaDeviceSynchronize());
}

std::vector<Event> collect() {
  DF_CHECK(buffer.events, "trace::collect before trace::begin");
  DF_CHECK_CUDA(cudaDeviceSynchronize());
  unsigned count = 0;
  DF_CHECK_CUDA(cudaMemcpy(&count, buffer.count, sizeof count, cudaMemcpyDeviceToHost));
  std::vector<Event> events(std::min(count, buffer.capacity));
  DF_CHECK_CUDA(cudaMemcpy(events.data(), buffer.events, sizeof(Event) * events.size(), cudaMemcpyDeviceToHost));
  return events;
}

Buffer current_buffer() { return buffer; }

const char* kernel_name(std::uint8_t kernel) {
  switch (static_cast<Kernel>(kernel)) {
    case Kernel::fused_qkv: return "fused_qkv";
    case Kernel::decode_attention: return "decode_attention";
    case Kernel::gemv_residual: return "gemv_residual";
    case Kernel::fused_mlp: return "fused_mlp";
    default: return "unknown";
  }
}

const char* mark_name(std::uint8_t mark) {
  static const char* const names[] = {"start", "upstream", "phase", "barrier", "end", "finish"};
  return mark < sizeof names / sizeof names[0] ? names[mark] : "unknown";
}

}  // namespace deepfuse::kernels::trace
