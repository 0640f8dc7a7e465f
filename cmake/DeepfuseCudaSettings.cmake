# The C++20 / CUDA settings and GPU targets every deepfuse build shares: the library (top-level
# CMakeLists.txt) and the Python package (python/CMakeLists.txt). Targets are sm_90a (wgmma-capable
# Hopper) and sm_80 by default, managed here rather than through CMAKE_CUDA_ARCHITECTURES so the
# arch-specific "a" suffix works on every CMake we meet.
set(DEEPFUSE_CUDA_ARCHS "90a;80" CACHE STRING "CUDA compute capabilities to build for (e.g. 90a;80)")
set(CMAKE_CUDA_ARCHITECTURES OFF)
set(CMAKE_CXX_STANDARD 20)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
# CMake 3.25 does not know nvcc's C++20 flag; tell it (nvcc 12+ accepts -std=c++20).
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
set(deepfuse_gencode "")
foreach(arch IN LISTS DEEPFUSE_CUDA_ARCHS)
  string(APPEND deepfuse_gencode " -gencode=arch=compute_${arch},code=sm_${arch}")
endforeach()
string(APPEND CMAKE_CUDA_FLAGS "${deepfuse_gencode} --expt-relaxed-constexpr")
message(STATUS "deepfuse CUDA targets:${deepfuse_gencode}")
