#!/usr/bin/env bash
# Tensor parallelism on a multi-GPU machine (nvidia-h100-x2 / -x4): the dist and TP engine tests,
# compute-sanitizer memcheck on a TP engine, `bench allreduce`, and `bench decode --tp` (Llama-3-8B
# TP 1 vs TP 2; Llama-3-70B TP 4 with NCCL vs the one-shot all-reduce and fused vs unfused MLP).
# usage: scripts/device/tp.sh OUT BIN [STEP...]   BIN: deepfuse and the test_*_gpu binaries (built
# elsewhere); steps: tests bench8b bench70b memcheck tune ratio8b allreduce70b batches8b (default all but
# tune, ratio8b, allreduce70b and batches8b, in that order).
# ratio8b: Llama-3-8B batch 1 / 512 at TP 1, TP 2 under the plan, and TP 2 with each all_reduce
# override in RATIO_VARIANTS (default: one_shot_lines epilogue in_mlp), three interleaved rounds
# (the TP 2 speedup with every side on the same clocks).
# allreduce70b: Llama-3-70B TP 4 at batches 1 and 8 (server memory plan: the fused MLP) under the
# plan and with each all_reduce override in SEVENTY_VARIANTS (default: epilogue in_mlp), two
# interleaved rounds. batches8b: Llama-3-8B TP 2 at batches 1, 2, 4 and 8 the same way, with the
# overrides in RATIO_VARIANTS.
# tune: `deepfuse tune` for Llama-3-8B on GPU 0 alone, the plan saved as OUT/tuning.json (for
# comparing plans between GPU kinds).
set -uo pipefail
out=${1:?usage: tp.sh OUT BIN [STEP...]} bin=${2:?usage: tp.sh OUT BIN [STEP...]}
shift 2
steps=${*:-tests bench8b bench70b memcheck}
ratio_variants=${RATIO_VARIANTS:-one_shot_lines epilogue in_mlp}
seventy_variants=${SEVENTY_VARIANTS:-epilogue in_mlp}
want() { [[ " $steps " == *" $1 "* ]]; }
mkdir -p "$out"
# NVLink multicast is forbidden on the lent machines (it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PATH=/usr/local/cuda/bin:$PATH
# The CLI's shared libraries the machine lacks (cpp-httplib, brotli), from .debs/.
cd "$(dirname "$0")/../.." && source scripts/device/unpack-debs.sh
# NCCL: the CUDA toolkit's if it has one, else PyTorch's wheel.
nccl=$(ldconfig -p | grep -o '/.*libnccl.so.2' | head -n1)
[[ -n $nccl ]] || nccl=$(find /usr/local/cuda*/lib* /opt /usr -name 'libnccl.so.2' 2>/dev/null | head -n1)
[[ -n $nccl ]] || { echo "tp.sh: no libnccl.so.2 on this machine" | tee "$out/summary.txt"; exit 1; }
export LD_LIBRARY_PATH=$(dirname "$nccl")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
gpus=$(nvidia-smi -L | wc -l)
{ echo "NCCL: $nccl"; nvidia-smi -L; nvidia-smi topo -m; } >"$out/machine.txt" 2>&1
summary="$out/summary.txt"
run() {  # run NAME LIMIT COMMAND...: log to OUT/NAME.log, one summary line
  local name=$1 limit=$2 start=$SECONDS rc=0; shift 2
  timeout "$limit" "$@" >"$out/$name.log" 2>&1 || rc=$?
  echo "$name: rc=$rc ($((SECONDS - start)) s) $(grep -E '^\[  (PASSED|FAILED) ' "$out/$name.log" | tr '\n' ' ')" | tee -a "$summary"
}
if want tests; then
  run test_one_shot_all_reduce 90 "$bin/test_one_shot_all_reduce_gpu"
  run test_nccl_group 90 "$bin/test_nccl_group_gpu"
  run test_tensor_parallel 300 "$bin/test_tensor_parallel_gpu"
  run test_epilogue_exchange 120 "$bin/test_epilogue_exchange_gpu"
  [[ -x $bin/test_engine_gpu ]] && run test_engine 200 "$bin/test_engine_gpu"
  run bench_allreduce 60 "$bin/deepfuse" bench allreduce --tp "$gpus" --json "$out/bench-allreduce.json"
  ((gpus > 2)) && run bench_allreduce_tp2 60 "$bin/deepfuse" bench allreduce --tp 2 --json "$out/bench-allreduce-tp2.json"
fi
decode=("$bin/deepfuse" bench decode --batches 1,8,32 --contexts 512,8192 --no-ttft --steps 24)
if want bench8b; then
  run bench_8b_tp1 120 "${decode[@]}" --archs llama3-8b --json "$out/bench-8b-tp1.json"
  run bench_8b_tp2 120 "${decode[@]}" --archs llama3-8b --tp 2 --plan --json "$out/bench-8b-tp2.json"
  # One rank's shape tuned (tune --tp 2), then the same rows under the tuned plan.
  run tune_8b_tp2 150 "$bin/deepfuse" tune --random-weights --arch llama3-8b --tp 2 --max-batch 32 --max-context 8192 \
    --tuning-cache "$out/tuning-tp2.json"
  run bench_8b_tp2_tuned 120 "${decode[@]}" --archs llama3-8b --tp 2 --plan --tuning-cache "$out/tuning-tp2.json" \
    --json "$out/bench-8b-tp2-tuned.json"
fi
if want bench70b && ((gpus >= 4)); then
  # Without the unfused MLP's second copy (28 GB per GPU) where max_batch x max_context of KV needs
  # the room: batch 32 at 8k holds 21 GB of KV per GPU.
  served=(--server-memory-plan --plan)
  run bench_70b_tp4 240 "${decode[@]}" --archs llama3-70b --tp 4 "${served[@]}" --json "$out/bench-70b-tp4.json"
  run bench_70b_tp4_nccl 240 "${decode[@]}" --archs llama3-70b --tp 4 "${served[@]}" --plan-override all_reduce=nccl --json "$out/bench-70b-tp4-nccl.json"
  run bench_70b_tp4_oneshot 240 "${decode[@]}" --archs llama3-70b --tp 4 "${served[@]}" --plan-override all_reduce=one_shot --json "$out/bench-70b-tp4-oneshot.json"
  # The paper's experiment, fused against unfused MLP, both with the copy (contexts of 512).
  short=("$bin/deepfuse" bench decode --batches 1,8,32 --contexts 512 --no-ttft --steps 24 --archs llama3-70b --tp 4)
  run bench_70b_tp4_fused 200 "${short[@]}" --plan-override mlp=fused --json "$out/bench-70b-tp4-fused.json"
  run bench_70b_tp4_unfused 200 "${short[@]}" --plan-override mlp=unfused --json "$out/bench-70b-tp4-unfused.json"
fi
# memcheck on a TP 2 engine through NCCL (the one-shot kernel spins on its peers: sanitizer-serialised
# launches could wait forever). API errors are not reported: NCCL meets (and handles) its own
# cudaErrorPeerAccessAlreadyEnabled about 90 times; the engine checks every call it makes itself.
# The epilogues' exchange spins on its peers too; under the sanitizer too, as the one-shot kernel.
if want memcheck; then
  sanitize=(compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 9)
  run memcheck_tp 150 "${sanitize[@]}" "$bin/test_tensor_parallel_gpu" \
    --gtest_filter='Ranks/TensorParallelTiny.LogitsMatchOneGpuNccl/tp2_llama*:Ranks/TensorParallelTiny.LogitsMatchOneGpuEpilogue/tp2_llama*:Ranks/TensorParallelTiny.LogitsMatchOneGpuInMlp/tp*_llama*'
  run memcheck_exchange 300 "${sanitize[@]}" "$bin/test_epilogue_exchange_gpu"
fi
if want ratio8b; then
  one=("$bin/deepfuse" bench decode --archs llama3-8b --batches 1 --contexts 512 --no-ttft --steps 128)
  for round in 1 2 3; do
    run ratio_tp1_r$round 120 "${one[@]}" --json "$out/ratio-tp1-r$round.json"
    run ratio_tp2_r$round 120 "${one[@]}" --tp 2 --plan --json "$out/ratio-tp2-r$round.json"
    for variant in $ratio_variants; do
      run ratio_tp2_${variant}_r$round 120 "${one[@]}" --tp 2 --plan --plan-override all_reduce=$variant \
        --json "$out/ratio-tp2-$variant-r$round.json"
    done
  done
  python3 - "$out" $ratio_variants <<'PY' | tee -a "$summary"
import json, sys
def ms(name, r):
    rows = [x for x in json.load(open(f"{sys.argv[1]}/ratio-{name}-r{r}.json"))["rows"] if x.get("kind") == "decode"]
    return rows[0]["ms_per_step"]
for r in (1, 2, 3):
    try:
        one = ms("tp1", r)
        cells = [f"TP 1 {one:.3f} ms", f"TP 2 plan {ms('tp2', r):.3f} ms ({one / ms('tp2', r):.3f}x)"]
        cells += [f"TP 2 {v} {ms('tp2-' + v, r):.3f} ms ({one / ms('tp2-' + v, r):.3f}x)" for v in sys.argv[2:]]
        print(f"round {r}: " + ", ".join(cells))
    except Exception as e:
        print(f"round {r}: {e}")
PY
fi
# compare NAME VARIANTS DEEPFUSE-ARGS...: `bench decode` under the plan and with each all_reduce
# override in VARIANTS, two interleaved rounds; one summary line per batch and context.
compare() {
  local name=$1 variants=$2 round variant
  shift 2
  for round in 1 2; do
    run ${name}_plan_r$round 240 "$@" --json "$out/$name-plan-r$round.json"
    for variant in $variants; do
      run ${name}_${variant}_r$round 240 "$@" --plan-override all_reduce=$variant --json "$out/$name-$variant-r$round.json"
    done
  done
  python3 - "$out" "$name" plan $variants <<'PY' | tee -a "$summary"
import json, sys
out, name, variants = sys.argv[1], sys.argv[2], sys.argv[3:]
def rows(variant, r):
    data = json.load(open(f"{out}/{name}-{variant}-r{r}.json"))
    return {(x["arch"], x["batch"], x["context"]): x for x in data["rows"] if x.get("kind") == "decode"}
try:
    runs = {(v, r): rows(v, r) for v in variants for r in (1, 2)}
    for key in sorted(runs[("plan", 1)]):
        cells = [f'{v} {runs[(v, 1)][key]["ms_per_step"]:.3f} {runs[(v, 2)][key]["ms_per_step"]:.3f}' for v in variants]
        print(f"{key[0]} batch {key[1]} / {key[2]}: " + ", ".join(cells) + " ms")
except Exception as e:
    print(f"{name}: {e}")
PY
}
if want allreduce70b && ((gpus >= 4)); then
  compare a70 "$seventy_variants" "$bin/deepfuse" bench decode --archs llama3-70b --tp 4 --server-memory-plan --plan \
    --batches 1,8 --contexts 512,8192 --no-ttft --steps 48
fi
if want batches8b; then
  compare b8b "$ratio_variants" "$bin/deepfuse" bench decode --archs llama3-8b --tp 2 --plan --batches 1,2,4,8 \
    --contexts 512 --no-ttft --steps 64
fi
if want tune; then
  run tune_8b 120 "$bin/deepfuse" tune --random-weights --arch llama3-8b --max-batch 64 --max-context 8192 \
    --tuning-cache "$out/tuning.json"
fi
cat "$summary"
