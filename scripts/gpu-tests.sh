#!/usr/bin/env bash
# Quick GPU iteration: build only the named test binaries (and the CLI when asked), run them, and
# optionally a compute-sanitizer memcheck pass in quick mode. Logs go to OUT.
#   scripts/gpu-tests.sh OUT [--memcheck] test_name...      (DEEPFUSE_GTEST_FILTER narrows)
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/gpu-tests.sh OUT [--memcheck] test...}
shift
memcheck=0
[[ ${1:-} == --memcheck ]] && memcheck=1 && shift
export PATH=/usr/local/cuda/bin:$PATH
mkdir -p "$out"
source scripts/unpack-device-debs.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEEPFUSE_CUDA_ARCHS=90a "${prefix_args[@]}" >"$out/configure.log" 2>&1
if ! cmake --build build-gpu --target "$@" -j "$(nproc)" >"$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -n 30; exit 1
fi
status=0
for t in "$@"; do
  [[ -x build-gpu/tests/$t ]] || continue
  if build-gpu/tests/$t --gtest_filter="${DEEPFUSE_GTEST_FILTER:-*}" >"$out/$t.log" 2>&1; then
    echo "$t: PASSED ($(grep -c '^\[       OK' "$out/$t.log") ok)"
  else
    status=1; echo "$t: FAILED"; grep -E "FAILED|Failure|error|Expected|Which is|actual|relative" "$out/$t.log" | head -n 40
  fi
  if ((memcheck)); then
    DEEPFUSE_TEST_QUICK=1 compute-sanitizer --tool memcheck --error-exitcode 99 build-gpu/tests/$t >"$out/$t.memcheck.log" 2>&1
    echo "$t memcheck: rc=$? $(grep -E 'ERROR SUMMARY' "$out/$t.memcheck.log")"
  fi
done
exit $status
