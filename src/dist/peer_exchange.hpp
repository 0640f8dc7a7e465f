// Peer mappings for the one-shot all-reduce (kernels/one_shot_all_reduce.hpp): every GPU of the
// group maps every other one's memory, and each rank owns input buffers, receive areas its peers
// push into and a signal area that all ranks' kernels address directly.
#pragma once

#include <cuda_bf16.h>

#include <cstddef>
#include <string>
#include <vector>

#include "deepfuse/kernels/one_shot_all_reduce.hpp"

namespace deepfuse::dist {

// Enables peer access between every ordered pair of `devices` (already enabled is fine). False,
// with a one-line reason in *why_not (when given), where a pair has no peer path or enabling
// fails; the calling thread's current device is kept.
bool enable_peer_access(const std::vector<int>& devices, std::string* why_not);

// Per rank, on that rank's GPU: `slots` input buffers of max_elements bf16 each, per slot a receive
// area of ranks x max_elements bf16 (region s: what rank s pushed), and a zeroed signal area.
// Consecutive all-reduces alternate slots (the kernel's contract). Enables peer access itself;
// throws deepfuse::Error where it cannot or an allocation fails.
class OneShotBuffers {
 public:
  OneShotBuffers(const std::vector<int>& devices, size_t max_elements, int slots = 2);
  ~OneShotBuffers();
  OneShotBuffers(const OneShotBuffers&) = delete;
  OneShotBuffers& operator=(const OneShotBuffers&) = delete;

  int ranks() const { return static_cast<int>(devices_.size()); }
  int slots() const { return slots_; }
  size_t max_elements() const { return max_elements_; }

  // Where `rank` writes its contribution for a call that uses `slot` (on rank's GPU, 16-byte aligned).
  __nv_bfloat16* input(int rank, int slot) const;

  // The kernel's parameters for `rank`'s call on `slot` of `elements` (<= max_elements) into `out`
  // (on rank's GPU, not one of these buffers).
  kernels::OneShotAllReduceParams params(int rank, int slot, size_t elements, __nv_bfloat16* out) const;

 private:
  __nv_bfloat16* receive(int rank, int slot) const;  // `ranks` regions of slot_bytes_ each
  uint32_t* signals(int rank) const;
  int ranks_allocated() const { return static_cast<int>(allocations_.size()); }
  void release() noexcept;

  std::vector<int> devices_;
  size_t max_elements_ = 0;
  int slots_ = 0;
  size_t slot_bytes_ = 0;  // one input buffer or receive region, max_elements bf16 rounded up to 256 bytes
  std::vector<void*> allocations_;  // per rank: slots_ inputs, slots_ receive areas, then the signal area
};

}  // namespace deepfuse::dist
