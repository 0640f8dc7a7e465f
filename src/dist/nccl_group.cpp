#include "dist/nccl_group.hpp"

#include <cstdlib>

#include "core/current_device_guard.hpp"
#include "deepfuse/error.hpp"

namespace deepfuse::dist {
namespace {

// "<what>: <status> (<NCCL's last message>)": NCCL's own string for the status is generic, its
// last-error text names the actual cause (a missing peer path, a bad device, ...).
[[noreturn]] void fail(const std::string& what, ncclResult_t status, ncclComm_t comm) {
  std::string detail = ncclGetLastError(comm) ? ncclGetLastError(comm) : "";
  throw Error(what + " failed: " + ncclGetErrorString(status) + (detail.empty() ? "" : " (" + detail + ")"));
}

void check(ncclResult_t status, const char* what, ncclComm_t comm) {
  if (status != ncclSuccess) fail(what, status, comm);
}

std::string device_list(const std::vector<int>& devices) {
  std::string text = "[";
  for (size_t i = 0; i < devices.size(); ++i) {
    if (i) text += ',';
    text += std::to_string(devices[i]);
  }
  return text + ']';
}

}  // namespace

NcclGroup::NcclGroup(const std::vector<int>& devices) : devices_(devices) {
  DF_CHECK(!devices.empty(), "NcclGroup: no devices");
  // Checked before the group starts: a rank that failed inside it would leave the others waiting.
  int count = 0;
  DF_CHECK_CUDA(cudaGetDeviceCount(&count));
  for (size_t r = 0; r < devices.size(); ++r) {
    DF_CHECK(devices[r] >= 0 && devices[r] < count, "NcclGroup: GPU " + std::to_string(devices[r]) +
                                                        " does not exist (this machine has " + std::to_string(count) + ")");
    for (size_t q = 0; q < r; ++q)
      DF_CHECK(devices[q] != devices[r], "NcclGroup: GPU " + std::to_string(devices[r]) + " is listed twice");
  }
  // NVLink multicast (NVLS) is forbidden on our machines: setting up multicast objects can take a
  // shared host's GPUs out of service. NCCL reads its environment once, at its first
  // initialization in the process, so this must precede it; the library writes the variable
  // (overriding any value) and reads none.
  setenv("NCCL_NVLS_ENABLE", "0", 1);

  ncclUniqueId id;
  check(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr);
  CurrentDeviceGuard restore;
  comms_.assign(devices.size(), nullptr);
  const std::string what = "NCCL communicators for devices " + device_list(devices);
  check(ncclGroupStart(), "ncclGroupStart", nullptr);
  // Nothing may throw between ncclGroupStart and ncclGroupEnd (the group would stay open).
  ncclResult_t init_status = ncclSuccess;
  cudaError_t device_status = cudaSuccess;
  for (size_t r = 0; r < devices.size(); ++r) {
    if ((device_status = cudaSetDevice(devices[r])) != cudaSuccess) break;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 1;  // collectives return once enqueued; abort() still unblocks a hung peer
    init_status = ncclCommInitRankConfig(&comms_[r], static_cast<int>(devices.size()), id, static_cast<int>(r), &config);
    if (init_status != ncclSuccess) break;
  }
  const ncclResult_t end_status = ncclGroupEnd();
  const ncclResult_t status = init_status != ncclSuccess ? init_status : end_status;
  if (status != ncclSuccess || device_status != cudaSuccess) {
    for (ncclComm_t& comm : comms_)
      if (comm) ncclCommAbort(comm);  // a half-made group: tear down without waiting on peers
    comms_.clear();
    if (device_status != cudaSuccess)
      throw Error(what + ": cudaSetDevice failed: " + cudaGetErrorString(device_status));
    fail(what, status, nullptr);
  }
}

NcclGroup::~NcclGroup() {
  if (comms_.empty() || aborted_) return;  // abort() already freed them
  // Finalizing waits on every peer's communicator, so one thread finalizes all of them in one
  // group before destroying them one by one. Errors cannot be reported from a destructor.
  ncclGroupStart();
  for (ncclComm_t comm : comms_) ncclCommFinalize(comm);
  ncclGroupEnd();
  for (ncclComm_t comm : comms_) ncclCommDestroy(comm);
}

void NcclGroup::abort() {
  std::lock_guard<std::mutex> lock(abort_mutex_);  // several failing rank threads may call it at once
  if (aborted_) return;
  aborted_ = true;
  // Aborting here, not in the destructor, is what frees peers blocked on a failed rank's work.
  for (ncclComm_t comm : comms_) ncclCommAbort(comm);
}

ncclComm_t NcclGroup::comm(int rank) const {
  DF_CHECK(!aborted_, "NcclGroup: communicators were aborted");
  DF_CHECK(rank >= 0 && rank < size(), "NcclGroup: rank " + std::to_string(rank) + " outside [0, " +
                                           std::to_string(size()) + ")");
  return comms_[rank];
}

void all_reduce_sum(ncclComm_t comm, const __nv_bfloat16* send, __nv_bfloat16* recv, size_t elements,
                    cudaStream_t stream) {
  check(ncclAllReduce(send, recv, elements, ncclBfloat16, ncclSum, comm, stream), "ncclAllReduce (bf16 sum)", comm);
}

void all_gather(ncclComm_t comm, const float* send, float* recv, size_t elements_per_rank, cudaStream_t stream) {
  check(ncclAllGather(send, recv, elements_per_rank, ncclFloat32, comm, stream), "ncclAllGather (fp32)", comm);
}

void broadcast(ncclComm_t comm, const int32_t* send, int32_t* recv, size_t count, int root, cudaStream_t stream) {
  check(ncclBroadcast(send, recv, count, ncclInt32, root, comm, stream), "ncclBroadcast (int32)", comm);
}

std::string nccl_version() {
  int code = 0;
  check(ncclGetVersion(&code), "ncclGetVersion", nullptr);
  // Since 2.9 the code is major * 10000 + minor * 100 + patch.
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

}  // namespace deepfuse::dist
