// Peer mappings for the one-shot all-reduce (kernels/one_shot_all_reduce.hpp): every GPU of the
// group maps every other one's memory, and each rank owns input buffers, receive areas its peers
// push into and a signal area that all ranks' kernels address directly.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <string>
#include <vector>

#include "deepfuse/kernels/line_exchange.hpp"
#include "deepfuse/kernels/one_shot_all_reduce.hpp"

namespace deepfuse::dist {

// Enables peer access between every ordered pair of `devices` (already enabled is fine). False,
// with a one-line reason in *why_not (when given), where a pair has no peer path or enabling
// fails; the calling thread's current device is kept.
bool enable_peer_access(const std::vector<int>& devices, std::string* why_not);

// Per rank, on that rank's GPU: `slots` input buffers of input_elements bf16 each, per slot a
// receive area and a line area of `ranks` regions each (region s: what rank s pushed) for
// messages of up to exchange_elements under either protocol, and a signal area, all zeroed. The inputs can be larger
// than any message (the engine's partial sums of a whole prefill chunk live there, and NCCL
// reduces those). Consecutive all-reduces alternate slots (the kernel's contract). Enables peer
// access itself; throws deepfuse::Error where it cannot or an allocation fails.
class OneShotBuffers {
 public:
  OneShotBuffers(const std::vector<int>& devices, size_t input_elements, size_t exchange_elements, int slots = 2);
  ~OneShotBuffers();
  OneShotBuffers(const OneShotBuffers&) = delete;
  OneShotBuffers& operator=(const OneShotBuffers&) = delete;

  int ranks() const { return static_cast<int>(devices_.size()); }
  int slots() const { return slots_; }
  size_t input_elements() const { return input_elements_; }
  size_t exchange_elements() const { return exchange_elements_; }  // the largest message

  // Where `rank` writes its contribution for a call that uses `slot` (on rank's GPU, 16-byte aligned).
  __nv_bfloat16* input(int rank, int slot) const;

  // The kernel's parameters for `rank`'s call on `slot` of `elements` (<= exchange_elements) into
  // `out` (on rank's GPU, not one of these buffers); protocol automatic.
  kernels::OneShotAllReduceParams params(int rank, int slot, size_t elements, __nv_bfloat16* out) const;

  // The same slot's line areas and `rank`'s signal area for an epilogue that exchanges its own
  // output of `elements` (<= exchange_elements) over the ranks (kernels/line_exchange.hpp).
  kernels::LineExchange line_exchange(int rank, int slot, size_t elements) const;

 private:
  // Per slot: the receive area (`ranks` regions of region_bytes_), then the line area (`ranks`
  // regions of line_region_bytes_).
  char* slot_areas(int rank, int slot) const;
  uint32_t* signals(int rank) const;
  int ranks_allocated() const { return static_cast<int>(allocations_.size()); }
  void release() noexcept;

  std::vector<int> devices_;
  size_t input_elements_ = 0, exchange_elements_ = 0;
  int slots_ = 0;
  size_t input_bytes_ = 0;   // one input buffer, rounded up to 256 bytes
  size_t region_bytes_ = 0;       // one receive region, rounded up to 256 bytes
  size_t line_region_bytes_ = 0;  // one line region, rounded up to 256 bytes
  std::vector<void*> allocations_;  // per rank: slots_ inputs, slots_ receive areas, then the signal area
};

}  // namespace deepfuse::dist
