#include "dist/peer_exchange.hpp"

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <utility>

#include "core/current_device_guard.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::dist {
namespace {

std::string gpu(int device) { return "GPU " + std::to_string(device); }

}  // namespace

bool enable_peer_access(const std::vector<int>& devices, std::string* why_not) {
  auto refuse = [&](const std::string& reason) {
    if (why_not) *why_not = reason;
    return false;
  };
  for (size_t i = 0; i < devices.size(); ++i)
    if (std::count(devices.begin(), devices.end(), devices[i]) > 1)
      return refuse(gpu(devices[i]) + " is listed twice");
  CurrentDeviceGuard restore;
  for (int from : devices) {
    for (int to : devices) {
      if (from == to) continue;
      int can = 0;
      if (cudaError_t e = cudaDeviceCanAccessPeer(&can, from, to); e != cudaSuccess)
        return refuse("cudaDeviceCanAccessPeer(" + gpu(from) + ", " + gpu(to) + "): " + cudaGetErrorString(e));
      if (!can) return refuse(gpu(from) + " cannot map " + gpu(to) + "'s memory (no peer-to-peer path)");
      // Peer access lasts for the process: a pair enabled before (an earlier engine, or the
      // one-shot buffers after RankGroup) is not asked again, so no API error is raised for it.
      static std::mutex mutex;
      static std::set<std::pair<int, int>> enabled;
      std::lock_guard lock(mutex);
      if (enabled.count({from, to})) continue;
      if (cudaError_t e = cudaSetDevice(from); e != cudaSuccess)
        return refuse("cudaSetDevice(" + std::to_string(from) + "): " + cudaGetErrorString(e));
      const cudaError_t e = cudaDeviceEnablePeerAccess(to, 0);
      if (e == cudaSuccess || e == cudaErrorPeerAccessAlreadyEnabled) enabled.insert({from, to});
      if (e == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // not an error here; clear it so the next launcher's check does not see it
      } else if (e != cudaSuccess) {
        return refuse("enabling peer access from " + gpu(from) + " to " + gpu(to) + ": " + cudaGetErrorString(e));
      }
    }
  }
  return true;
}

OneShotBuffers::OneShotBuffers(const std::vector<int>& devices, size_t input_elements, size_t exchange_elements,
                               int slots)
    : devices_(devices), input_elements_(input_elements), exchange_elements_(exchange_elements), slots_(slots) {
  DF_CHECK(!devices.empty() && static_cast<int>(devices.size()) <= kernels::kMaxTensorParallelRanks,
           "one-shot all-reduce: " + std::to_string(devices.size()) + " ranks (1 to " +
               std::to_string(kernels::kMaxTensorParallelRanks) + " supported)");
  DF_CHECK(input_elements > 0 && exchange_elements > 0 && exchange_elements <= input_elements && slots >= 1,
           "one-shot all-reduce: buffers of " + std::to_string(input_elements) + " input and " +
               std::to_string(exchange_elements) + " message elements asked for");
  std::string why_not;
  DF_CHECK(enable_peer_access(devices, &why_not), "one-shot all-reduce needs peer access: " + why_not);
  auto round_up = [](size_t bytes) { return (bytes + 255) / 256 * 256; };
  input_bytes_ = round_up(input_elements * sizeof(__nv_bfloat16));
  region_bytes_ = round_up(exchange_elements * sizeof(__nv_bfloat16));
  line_region_bytes_ = round_up(kernels::one_shot_lines(exchange_elements) * sizeof(uint4));
  const size_t bytes =
      (input_bytes_ + (region_bytes_ + line_region_bytes_) * devices.size()) * slots_ + kernels::one_shot_signal_bytes();
  CurrentDeviceGuard restore;
  try {
    for (int device : devices) {
      DF_CHECK_CUDA(cudaSetDevice(device));
      void* allocation = nullptr;
      DF_CHECK_CUDA(cudaMalloc(&allocation, bytes));
      allocations_.push_back(allocation);
      // Synchronous: epochs, flags and lines are zero before any kernel of any rank can run.
      DF_CHECK_CUDA(cudaMemset(allocation, 0, bytes));
    }
  } catch (...) {
    release();  // the destructor does not run for a half-built object
    throw;
  }
}

OneShotBuffers::~OneShotBuffers() { release(); }

void OneShotBuffers::release() noexcept {
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) return;
  for (size_t r = 0; r < allocations_.size(); ++r) {
    cudaSetDevice(devices_[r]);
    cudaFree(allocations_[r]);  // nothing to report from a destructor
  }
  allocations_.clear();
  cudaSetDevice(current);
}

__nv_bfloat16* OneShotBuffers::input(int rank, int slot) const {
  DF_CHECK(rank >= 0 && rank < ranks() && slot >= 0 && slot < slots_,
           "one-shot all-reduce: no buffer for rank " + std::to_string(rank) + ", slot " + std::to_string(slot));
  return reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(allocations_[rank]) + input_bytes_ * slot);
}

char* OneShotBuffers::slot_areas(int rank, int slot) const {
  const size_t offset = input_bytes_ * slots_ + (region_bytes_ + line_region_bytes_) * ranks() * slot;
  return static_cast<char*>(allocations_[rank]) + offset;
}

uint32_t* OneShotBuffers::signals(int rank) const {
  return reinterpret_cast<uint32_t*>(static_cast<char*>(allocations_[rank]) +
                                     (input_bytes_ + (region_bytes_ + line_region_bytes_) * ranks()) * slots_);
}

kernels::OneShotAllReduceParams OneShotBuffers::params(int rank, int slot, size_t elements, __nv_bfloat16* out) const {
  DF_CHECK(elements <= exchange_elements_, "one-shot all-reduce: " + std::to_string(elements) +
                                               " elements exceed the " + std::to_string(exchange_elements_) +
                                               " the buffers exchange");
  kernels::OneShotAllReduceParams p;
  p.own_input = input(rank, slot);  // checks rank and slot
  for (int r = 0; r < ranks(); ++r) {
    char* areas = slot_areas(r, slot);
    p.receive[r] = reinterpret_cast<__nv_bfloat16*>(areas);
    p.lines[r] = reinterpret_cast<uint4*>(areas + region_bytes_ * ranks());
    p.signals[r] = signals(r);
  }
  p.receive_stride = region_bytes_ / sizeof(__nv_bfloat16);
  p.line_stride = line_region_bytes_ / sizeof(uint4);
  p.out = out;
  p.ranks = ranks();
  p.rank = rank;
  p.elements = elements;
  return p;
}

kernels::LineExchange OneShotBuffers::line_exchange(int rank, int slot, size_t elements) const {
  const kernels::OneShotAllReduceParams p = params(rank, slot, elements, nullptr);  // checks all three
  kernels::LineExchange x;
  for (int r = 0; r < ranks(); ++r) x.lines[r] = p.lines[r];
  x.line_stride = p.line_stride;
  x.signals = p.signals[rank];
  x.ranks = ranks();
  x.rank = rank;
  return x;
}

}  // namespace deepfuse::dist
