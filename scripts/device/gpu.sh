#!/usr/bin/env bash
# shellcheck disable=SC2317  # step_* functions are called indirectly, as "step_$name"
# The one way to run deepfuse's GPU checks on a GPU machine: build (or take prebuilt binaries),
# run the GPU tests, compute-sanitizer memcheck and racecheck, parity with Hugging Face
# transformers and the benchmarks. Every log and JSON goes to OUT; OUT/summary.txt ends with one
# PASS/FAIL line per step and the script exits non-zero when any step failed.
usage() {
  cat <<'EOF'
usage: scripts/device/gpu.sh OUT [--bin DIR] [steps...]

  OUT        folder for the logs and JSON (created): OUT/summary.txt, OUT/<step>.log, details in
             OUT/<step>/, benchmark JSON in OUT/bench-<name>.json, parity in OUT/parity-hf-cuda.json
  --bin DIR  use prebuilt binaries: DIR/deepfuse and DIR/tests/test_*_gpu (a build directory, or
             binaries built elsewhere and carried here). Without it the tree is built first into
             build-gpu/ (Release, every core), with the packages of .debs/ (scripts/device/fetch-debs.sh,
             run beforehand where apt works) unpacked into .deps/: nothing is fetched from a network.
  steps      any of (default: all six, in this order)
               tests      every GPU test binary (and the kernels' host-side checks: *_checks,
                          *_params, *_plan), gtest XML and a log each in OUT/tests/; after a build
                          also the CPU tests (ctest -L cpu)
               memcheck   compute-sanitizer memcheck over the GPU kernel tests (quick mode), the
                          engine test, and `deepfuse generate` on a tiny model (graphs and eager)
               racecheck  compute-sanitizer racecheck over the GPU kernel tests (the MLP's up to 9 min)
               parity     scripts/parity/compare_hf_cuda.py: the cuda backend against transformers
               first-model  the first-run model (scripts/first_model/, trained here unless
                          build/first-model/<hash> came along): 64 greedy tokens per prompt on
                          the cuda backend equal transformers' (scripts/first_model/parity.py)
               bench      deepfuse bench mlp (plain and --norm), decode per model, attention, qkv,
                          sampling
             `build` alone builds and runs nothing else.

environment:
  DEEPFUSE_GPU_TESTS          narrows tests, memcheck and racecheck to these tests, by short name
                              (e.g. "mlp decode_attention"; "generate" is `deepfuse generate` under
                              the sanitizer), and the build to their binaries and the CLI
  DEEPFUSE_GTEST_FILTER       gtest filter for the tests step (default *)
  DEEPFUSE_CMAKE_ARGS         extra CMake configure arguments (e.g. -DDEEPFUSE_CUDA_ARCHS=90a)
  DEEPFUSE_BENCH_ARGS         extra arguments to `deepfuse bench mlp` (e.g. --fused-tunings b1c8,b2c4)
  DEEPFUSE_DECODE_BENCH_ARGS  extra arguments to each `deepfuse bench decode` (e.g. --batches 1)
  DEEPFUSE_PYTHON             the Python with torch and transformers for parity and first-model
                              (default python3)
  DEEPFUSE_COMMIT             commit stamped into the build (default: git rev-parse HEAD)

examples:
  scripts/device/gpu.sh out                                  build, then all six steps
  scripts/device/gpu.sh out --bin bin tests memcheck         prebuilt binaries, two steps
  DEEPFUSE_GPU_TESTS=mlp scripts/device/gpu.sh out --bin bin racecheck
EOF
}
set -euo pipefail
cd "$(dirname "$0")/../.."
# Every process below inherits this: NCCL's NVLink SHARP (multicast) setup fails on the lent
# multi-GPU machines; harmless where NCCL is not used.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH

all_steps=(tests memcheck racecheck parity first-model bench)
out="" bin="" steps=()
while (($#)); do
  case $1 in
    -h | --help) usage; exit 0 ;;
    --bin) bin=${2:?--bin needs a directory}; shift ;;
    build | tests | memcheck | racecheck | parity | first-model | bench) steps+=("$1") ;;
    -*) usage >&2; exit 2 ;;
    *) if [[ -z $out ]]; then out=$1; else echo "gpu.sh: unknown step '$1'" >&2; usage >&2; exit 2; fi ;;
  esac
  shift
done
[[ -n $out ]] || { usage >&2; exit 2; }
((${#steps[@]})) || steps=("${all_steps[@]}")
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
: >"$summary"

# ---- helpers ----------------------------------------------------------------------------------
step_log=$summary  # the running step's log
failed=0           # set by a step's checks when one fails
declare -A result=()
ran=()

# A line for the running step's log, the summary and the console.
say() {
  echo "$*"
  echo "$*" >>"$summary"
  [[ $step_log == "$summary" ]] || echo "$*" >>"$step_log"
}

# run_step NAME: runs step_NAME with its own log OUT/NAME.log and records PASS or FAIL.
run_step() {
  local name=$1 start=$SECONDS
  step_log="$out/$name.log"
  : >"$step_log"
  mkdir -p "$out/$name"
  failed=0
  echo "== $name" | tee -a "$summary"
  "step_$name"
  if ((failed)); then result[$name]=FAIL; else result[$name]=PASS; fi
  ran+=("$name")
  say "== $name: ${result[$name]} ($((SECONDS - start)) s)"
  step_log=$summary
}

# Short test names the caller narrowed to (DEEPFUSE_GPU_TESTS), or the given default list.
selected_tests() {
  if [[ -n ${DEEPFUSE_GPU_TESTS:-} ]]; then
    local t
    for t in ${DEEPFUSE_GPU_TESTS}; do
      t=${t#test_}
      echo "${t%_gpu}"
    done
  else
    printf '%s\n' "$@"
  fi
}

# ---- build ------------------------------------------------------------------------------------
step_build() {
  local log="$out/build/build.log" rc=0 targets=() t
  local configure=(-DCMAKE_BUILD_TYPE=Release "${prefix_args[@]}")
  # shellcheck disable=SC2206  # DEEPFUSE_CMAKE_ARGS is a list of words
  configure+=(${DEEPFUSE_CMAKE_ARGS:-})
  if [[ -n ${DEEPFUSE_GPU_TESTS:-} ]]; then
    targets=(--target deepfuse_cli)
    for t in $(selected_tests); do
      [[ $t == generate ]] || targets+=("test_${t}_gpu")
    done
  fi
  local generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  {
    cmake -S . -B "$bin" "${generator[@]}" "${configure[@]}" &&
      cmake --build "$bin" "${targets[@]}" --parallel "$(nproc)"
  } >"$log" 2>&1 || rc=$?
  if ((rc)); then
    failed=1
    say "build: FAILED (rc=$rc), last lines of $log:"
    grep -E 'error|FAILED' "$log" | head -n 30 | tee -a "$step_log" || tail -n 30 "$log" | tee -a "$step_log"
  else
    say "build: ok into $bin${targets[*]:+ (${targets[*]:1})}"
  fi
}

# ---- tests ------------------------------------------------------------------------------------
# Runs one gtest binary with XML and log in OUT/tests/.
run_gtest() {
  local binary=$1 name rc=0 start=$SECONDS
  name=$(basename "$binary")
  timeout 300 "$binary" --gtest_filter="${DEEPFUSE_GTEST_FILTER:-*}" --gtest_output="xml:$out/tests/$name.xml" \
    >"$out/tests/$name.log" 2>&1 || rc=$?
  local passed skipped
  passed=$(grep -c '^\[       OK \]' "$out/tests/$name.log" || true)
  skipped=$(grep -c '^\[  SKIPPED \]' "$out/tests/$name.log" || true)
  say "$name: rc=$rc ($((SECONDS - start)) s), $passed passed, $skipped skipped"
  if ((rc)); then
    failed=1
    grep -E '^\[  FAILED  \]|Failure|Expected|Which is|actual' "$out/tests/$name.log" | head -n 40 | tee -a "$step_log" || true
  fi
}

step_tests() {
  # The CLI tests' binary, wherever DIR came from.
  if [[ -x $bin/deepfuse ]]; then
    DEEPFUSE_CLI=$(realpath "$bin/deepfuse")
    export DEEPFUSE_CLI
  fi
  local t found=0 host_checks=() all=()
  for t in "$bin"/tests/test_*_gpu; do
    [[ -x $t ]] && t=${t##*/test_} && all+=("${t%_gpu}")
  done
  for t in $(selected_tests "${all[@]}"); do
    [[ -x $bin/tests/test_${t}_gpu ]] || continue
    found=1
    run_gtest "$bin/tests/test_${t}_gpu"
  done
  ((found)) || { failed=1; say "tests: no GPU test binary in $bin/tests"; }
  # The kernel launchers' host-side checks must hold where a GPU is present too (with a device
  # they take other paths: the launches after validation are real).
  if [[ -z ${DEEPFUSE_GPU_TESTS:-} ]]; then
    for t in "$bin"/tests/test_*_checks "$bin"/tests/test_*_params "$bin"/tests/test_*_plan; do
      [[ -x $t ]] && host_checks+=("$t")
    done
    for t in "${host_checks[@]}"; do run_gtest "$t"; done
    # After a build here, the CPU tests too (they need the source tree's fixtures).
    if [[ -z $prebuilt && -f $bin/CTestTestfile.cmake ]]; then
      local rc=0 start=$SECONDS
      timeout 420 ctest --test-dir "$bin" -L cpu -LE pypi --output-on-failure -j 4 --output-junit "$out/tests/ctest-cpu.xml" \
        >"$out/tests/ctest-cpu.log" 2>&1 || rc=$?
      say "ctest -L cpu: rc=$rc ($((SECONDS - start)) s): $(grep -E 'tests passed|tests failed' "$out/tests/ctest-cpu.log" || true)"
      if ((rc)); then
        failed=1
        grep -E '\*\*\*Failed|Failed  |Error' "$out/tests/ctest-cpu.log" | head -n 20 | tee -a "$step_log" || true
      fi
    fi
  fi
}

# ---- compute-sanitizer ------------------------------------------------------------------------
# sanitize TOOL NAME TIMEOUT: one GPU test binary in quick mode. racecheck also reports hazards
# inside cuBLAS's own nvjet kernels (the MLP tests' unfused variants): those are counted apart, and
# a run whose only reports are cuBLAS's passes.
sanitize() {
  local tool=$1 name=$2 limit=$3 log="$out/$1/$2.log" rc=0 start=$SECONDS ours
  if [[ $name == generate ]]; then sanitize_generate "$tool" "$limit"; return; fi
  local binary="$bin/tests/test_${name}_gpu"
  if [[ ! -x $binary ]]; then
    failed=1; say "$tool $name: no binary $binary"; return
  fi
  DEEPFUSE_TEST_QUICK=1 timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 99 "$binary" >"$log" 2>&1 || rc=$?
  ours=$(grep -E 'Race reported|Invalid|Error:' "$log" | grep -vc nvjet || true)
  say "$tool $name: rc=$rc ($((SECONDS - start)) s), reports outside cuBLAS: $ours;" \
    "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$log" | tr '\n' ' ' || true)"
  if ! ((rc == 0 || (rc == 99 && ours == 0))); then failed=1; fi
}

# The engine end to end: `deepfuse generate` on a tiny model, with CUDA graphs and eager.
sanitize_generate() {
  local tool=$1 limit=$2 tiny="$out/$1/tiny-cuda-model" graphs log rc
  rm -rf "$tiny"
  if ! "$bin/deepfuse" make-model --out "$tiny" --hidden 128 --heads 2 --kv-heads 1 --intermediate 256 --layers 2 \
    >"$out/$tool/make-model.log" 2>&1; then
    failed=1; say "$tool generate: make-model failed (see $out/$tool/make-model.log)"; return
  fi
  for graphs in "" --no-cuda-graphs; do
    log="$out/$tool/generate${graphs:+-eager}.log" rc=0
    local start=$SECONDS
    # shellcheck disable=SC2086  # $graphs is one flag or nothing
    timeout "$limit" compute-sanitizer --tool "$tool" --error-exitcode 99 "$bin/deepfuse" generate --backend cuda \
      --model "$tiny" --prompt-ids "$(seq -s, 1 40)" --max-tokens 12 --ignore-eos --max-context 128 --kv-cache-mb 64 \
      $graphs >"$log" 2>&1 || rc=$?
    say "$tool generate ${graphs:-(graphs)}: rc=$rc ($((SECONDS - start)) s); $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$log" || true)"
    ((rc == 0)) || failed=1
  done
}

step_memcheck() {
  local t
  for t in $(selected_tests mlp swiglu_wgmma decode_attention qkv_rope_fused gemv_residual sampling generate engine); do
    case $t in
      engine) sanitize memcheck "$t" 400 ;;
      *) sanitize memcheck "$t" 300 ;;
    esac
  done
}

step_racecheck() {
  local t
  for t in $(selected_tests decode_attention qkv_rope_fused gemv_residual sampling swiglu_wgmma mlp); do
    case $t in
      mlp) sanitize racecheck "$t" 580 ;;  # the unfused variants' cuBLAS kernels make it slow
      *) sanitize racecheck "$t" 300 ;;
    esac
  done
}

# ---- parity -----------------------------------------------------------------------------------
step_parity() {
  local rc=0
  timeout 600 "${DEEPFUSE_PYTHON:-python3}" scripts/parity/compare_hf_cuda.py --deepfuse "$bin/deepfuse" \
    --json "$out/parity-hf-cuda.json" >"$out/parity/compare_hf_cuda.txt" 2>&1 || rc=$?
  tee -a "$step_log" <"$out/parity/compare_hf_cuda.txt"
  say "parity, cuda backend vs transformers: rc=$rc"
  ((rc == 0)) || failed=1
}

# ---- the first-run model ----------------------------------------------------------------------
step_first-model() {
  local python=${DEEPFUSE_PYTHON:-python3} model rc=0
  if ! model=$(bash scripts/first_model/build.sh --python "$python" 2>"$out/first-model/train.log"); then
    failed=1
    say "first-model: training failed, last lines of $out/first-model/train.log:"
    tail -n 20 "$out/first-model/train.log" | tee -a "$step_log"
    return
  fi
  timeout 300 "$python" scripts/first_model/parity.py --deepfuse "$bin/deepfuse" --model "$model" --backend cuda \
    --json "$out/first-model-cuda.json" >"$out/first-model/parity.txt" 2>&1 || rc=$?
  tee -a "$step_log" <"$out/first-model/parity.txt"
  say "first-model ($model), cuda backend vs transformers, 64 greedy tokens per prompt: rc=$rc"
  ((rc == 0)) || failed=1
}

# ---- benchmarks -------------------------------------------------------------------------------
# bench NAME TIMEOUT deepfuse-bench-args...: JSON in OUT/bench-NAME.json, the table in the step log.
bench() {
  local name=$1 limit=$2 rc=0 start=$SECONDS
  shift 2
  timeout "$limit" "$bin/deepfuse" bench "$@" --json "$out/bench-$name.json" \
    >"$out/bench/$name.txt" 2>"$out/bench/$name.err" || rc=$?
  say "bench $name: rc=$rc ($((SECONDS - start)) s)"
  tee -a "$step_log" <"$out/bench/$name.txt"
  if ((rc)); then
    failed=1
    tail -n 20 "$out/bench/$name.err" | tee -a "$step_log"
  fi
}

step_bench() {
  # shellcheck disable=SC2086  # the *_ARGS variables are lists of words
  bench mlp 300 mlp ${DEEPFUSE_BENCH_ARGS:-}
  # shellcheck disable=SC2086
  bench mlp-norm 300 mlp --norm ${DEEPFUSE_BENCH_ARGS:-}
  # One process per model, as a server runs: in one process, Llama-3.2-1B's steps measured 5%
  # slower after another model's engine had run than alone (docs/runtime.md). With the cuBLASLt
  # algorithms timed at construction, the engine's fastest configuration.
  local arch
  for arch in llama3-8b llama3.2-1b qwen2.5-7b; do
    # shellcheck disable=SC2086
    bench "decode-$arch" 600 decode --archs "$arch" --tune-gemms ${DEEPFUSE_DECODE_BENCH_ARGS:-}
  done
  bench attention 300 attention
  bench qkv 300 qkv
  bench sampling 300 sampling
}

# ---- main -------------------------------------------------------------------------------------
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv 2>/dev/null) ||
  gpu="no GPU (nvidia-smi failed): the GPU tests will skip themselves"
echo "$gpu" >"$out/gpu.txt"
say "gpu: $(tail -n 1 "$out/gpu.txt")"
# A copied tree may carry no .git or a stale one: the caller's DEEPFUSE_COMMIT wins; CMake embeds it.
DEEPFUSE_COMMIT=${DEEPFUSE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
export DEEPFUSE_COMMIT
say "commit: $DEEPFUSE_COMMIT"
say "steps: ${steps[*]}${bin:+ (binaries from $bin)}"

# Packages the machine lacks, from .debs/ (sets prefix_args, extends LD_LIBRARY_PATH for the
# binaries either way).
# shellcheck source=scripts/device/unpack-debs.sh
source scripts/device/unpack-debs.sh

prebuilt=$bin
if [[ -z $prebuilt ]]; then
  bin=build-gpu
  run_step build
fi
if [[ ${result[build]:-PASS} == PASS ]]; then
  [[ -n $prebuilt && " ${steps[*]} " == " build " ]] && say "build: nothing to do with --bin"
  for step in "${all_steps[@]}"; do
    [[ " ${steps[*]} " == *" $step "* ]] && run_step "$step"
  done
fi

{
  echo
  echo "== summary ($DEEPFUSE_COMMIT, $(tail -n 1 "$out/gpu.txt"))"
  for step in "${ran[@]}"; do printf '%-10s %s\n' "$step" "${result[$step]}"; done
  if [[ ${result[build]:-PASS} == FAIL ]]; then echo "(build failed: nothing else ran)"; fi
} | tee -a "$summary"
for step in "${ran[@]}"; do
  [[ ${result[$step]} == PASS ]] || exit 1
done
exit 0
