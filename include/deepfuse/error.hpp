// Errors and the check macros every layer uses.
//
// A failing CUDA, cuBLAS or NCCL call throws deepfuse::Error whose message names the call, the
// library's own error string, and the file:line of the check, so one line in a log says what
// went wrong and where. Bad user input (shapes, files, requests) also throws deepfuse::Error,
// through DF_CHECK / DF_FAIL, with a message that names the offending thing.
#pragma once

#include <cuda_runtime_api.h>

#include <stdexcept>
#include <string>

namespace deepfuse {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
[[noreturn]] void fail_library(const char* library, int status, const char* status_text,
                               const char* call, const char* file, int line);
[[noreturn]] void fail_check(const std::string& message, const char* file, int line);
}  // namespace detail

}  // namespace deepfuse

#define DF_CHECK_CUDA(call)                                                                  \
  do {                                                                                       \
    const cudaError_t df_status_ = (call);                                                   \
    if (df_status_ != cudaSuccess)                                                           \
      ::deepfuse::detail::fail_library("CUDA", static_cast<int>(df_status_),                 \
                                       cudaGetErrorString(df_status_), #call, __FILE__,      \
                                       __LINE__);                                            \
  } while (0)

// Checks the last kernel launch: the launch error now, not some later call's.
#define DF_CHECK_LAUNCH() DF_CHECK_CUDA(cudaGetLastError())

// cuBLAS(Lt) and NCCL: the status string comes from the library at the call site, so only code
// that uses the library needs its header.
#define DF_CHECK_CUBLAS(call)                                                                \
  do {                                                                                       \
    const auto df_status_ = (call);                                                          \
    if (df_status_ != CUBLAS_STATUS_SUCCESS)                                                 \
      ::deepfuse::detail::fail_library("cuBLAS", static_cast<int>(df_status_),               \
                                       cublasLtGetStatusString(df_status_), #call, __FILE__, \
                                       __LINE__);                                            \
  } while (0)

#define DF_CHECK_NCCL(call)                                                                  \
  do {                                                                                       \
    const auto df_status_ = (call);                                                          \
    if (df_status_ != ncclSuccess)                                                           \
      ::deepfuse::detail::fail_library("NCCL", static_cast<int>(df_status_),                 \
                                       ncclGetErrorString(df_status_), #call, __FILE__,      \
                                       __LINE__);                                            \
  } while (0)

// Precondition on user input: throws deepfuse::Error(message) when cond is false.
#define DF_CHECK(cond, message)                                                              \
  do {                                                                                       \
    if (!(cond)) ::deepfuse::detail::fail_check((message), __FILE__, __LINE__);              \
  } while (0)
