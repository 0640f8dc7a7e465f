#!/usr/bin/env bash
# The GPU checks after a build, on the binaries in BIN (a build directory, or binaries built
# elsewhere and carried to the GPU machine: BIN/deepfuse, BIN/tests/test_*_gpu), logs and JSON in
# OUT. scripts/gpu.sh runs them after its build; a device call whose time limit cannot hold a
# build runs them one step at a time.
#   scripts/gpu-checks.sh BIN OUT step...   steps: tests memcheck racecheck racecheck-mlp parity bench
# tests: every GPU test binary; memcheck / racecheck: compute-sanitizer over the streaming kernels'
# tests (racecheck-mlp apart: it takes up to 9 minutes), memcheck also over the engine end to end;
# parity: the cuda backend against transformers; bench: mlp (plain and --norm), decode per model,
# attention, qkv, sampling.
# DEEPFUSE_BENCH_ARGS adds arguments to `deepfuse bench mlp` (e.g. --fused-tunings b1c8,b2c4),
# DEEPFUSE_DECODE_BENCH_ARGS to each `deepfuse bench decode` (e.g. --batches 1 --contexts 512).
# DEEPFUSE_PYTHON is the Python with torch and transformers for the parity step (default python3).
set -uo pipefail
cd "$(dirname "$0")/.."
bin=${1:?usage: scripts/gpu-checks.sh BIN OUT step...}
out=${2:?usage: scripts/gpu-checks.sh BIN OUT step...}
shift 2
mkdir -p "$out"
summary="$out/summary.txt"
note() { echo "$*" | tee -a "$summary"; }
sanitize() {  # tool test timeout
  local start=$SECONDS log="$out/sanitizer-$2-$1.log"
  DEEPFUSE_TEST_QUICK=1 timeout "$3" compute-sanitizer --tool "$1" --error-exitcode 99 "$bin/tests/test_$2_gpu" >"$log" 2>&1
  local rc=$?
  # racecheck also reports hazards inside cuBLAS's own nvjet kernels (the MLP tests' unfused
  # variants): count ours apart.
  local ours=$(grep -E 'Race reported|Invalid|Error:' "$log" | grep -vc nvjet)
  note "compute-sanitizer $1 ($2): rc=$rc ($((SECONDS - start)) s), reports outside cuBLAS: $ours; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|PASSED|FAILED' "$log" | tr '\n' ' ')"
}
for step in "$@"; do
  case $step in
    tests)
      export DEEPFUSE_CLI=$(realpath "$bin/deepfuse")  # the CLI tests' binary, wherever BIN came from
      for t in "$bin"/tests/test_*_gpu; do
        start=$SECONDS
        timeout 300 "$t" >"$out/$(basename "$t").log" 2>&1
        note "$(basename "$t"): rc=$? ($((SECONDS - start)) s) $(grep -E '^\[  (PASSED|FAILED) ' "$out/$(basename "$t").log" | tr '\n' ' ')"
      done ;;
    memcheck)
      for test in mlp decode_attention qkv_rope_fused gemv_residual sampling; do sanitize memcheck $test 300; done
      tiny="$out/tiny-cuda-model"
      rm -rf "$tiny"
      "$bin/deepfuse" make-model --out "$tiny" --hidden 128 --heads 2 --kv-heads 1 --intermediate 256 --layers 2 >/dev/null
      for graphs in "" --no-cuda-graphs; do
        log="$out/sanitizer-memcheck-generate${graphs:+-eager}.log"
        start=$SECONDS
        timeout 300 compute-sanitizer --tool memcheck --error-exitcode 99 "$bin/deepfuse" generate --backend cuda \
          --model "$tiny" --prompt-ids "$(seq -s, 1 40)" --max-tokens 12 --ignore-eos --max-context 128 --kv-cache-mb 64 \
          $graphs >"$log" 2>&1
        note "compute-sanitizer memcheck, generate ${graphs:-(graphs)}: rc=$? ($((SECONDS - start)) s); $(grep -E 'ERROR SUMMARY' "$log")"
      done
      sanitize memcheck engine 400 ;;
    racecheck)
      for test in decode_attention qkv_rope_fused gemv_residual sampling; do sanitize racecheck $test 300; done ;;
    racecheck-mlp)
      sanitize racecheck mlp 580 ;;
    parity)
      start=$SECONDS
      timeout 600 "${DEEPFUSE_PYTHON:-python3}" scripts/compare_hf_cuda.py --deepfuse "$bin/deepfuse" --json "$out/parity-hf-cuda.json" \
        >"$out/parity-hf-cuda.txt" 2>&1
      note "parity, cuda backend vs transformers: rc=$? ($((SECONDS - start)) s)"
      cat "$out/parity-hf-cuda.txt" ;;
    bench)
      bench() {  # name timeout args...
        local name=$1 limit=$2 start=$SECONDS
        shift 2
        timeout "$limit" "$bin/deepfuse" bench "$@" --json "$out/bench-$name.json" >"$out/bench-$name.txt" 2>"$out/bench-$name.err"
        note "bench $name: rc=$? ($((SECONDS - start)) s)"
        cat "$out/bench-$name.txt"
      }
      bench mlp 300 mlp ${DEEPFUSE_BENCH_ARGS:-}
      bench mlp-norm 300 mlp --norm ${DEEPFUSE_BENCH_ARGS:-}
      # One process per model, as a server runs: in one process, Llama-3.2-1B's steps measured 5%
      # slower after another model's engine had run than alone (docs/runtime.md). With the
      # cuBLASLt algorithms timed at construction, the engine's fastest configuration.
      for arch in llama3-8b llama3.2-1b qwen2.5-7b; do
        bench "decode-$arch" 600 decode --archs "$arch" --tune-gemms ${DEEPFUSE_DECODE_BENCH_ARGS:-}
      done
      bench attention 300 attention
      bench qkv 300 qkv
      bench sampling 300 sampling ;;
    *) note "unknown step $step"; exit 2 ;;
  esac
done
