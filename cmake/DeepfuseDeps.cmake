# Finds every external dependency in one place. All come from the CUDA toolkit or Debian
# packages (scripts/install-deps.sh); on the GPU machine, from the prefix scripts/gpu.sh unpacks.
find_package(CUDAToolkit REQUIRED)
find_package(Threads REQUIRED)
find_package(nlohmann_json 3.10 REQUIRED)
find_package(CLI11 REQUIRED)
if(DEEPFUSE_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
