#!/usr/bin/env bash
# On a GPU machine: `deepfuse serve` on the CUDA backend with random Llama-3-8B weights.
#   smoke  scripts/device/serve_smoke.py through HTTP (API, concurrency, cancellation, errors)
#   bench  scripts/bench/bench_serve.py: one stream, 16 streams, Poisson arrivals and the agentic
#          shared-prefix mix; then `bench decode` at batch 1 and 16 for comparison, on the same GPU
#   ttft   scripts/bench/first_token_latency.py: one stream's first token, 512 ids in, as a kept-alive
#          client (aiohttp's pattern), fresh connections (urllib's), aiohttp / openai / curl where
#          present; then `bench decode`'s isolated 512-token prefill on the same GPU (issue 53)
#   mixed  16 streams of 512 ids in and 128 out, and Poisson 8 req/s, with mixed steps on (the
#          default) and off (--no-mixed-steps), then `bench decode` batch 1 and 16 and the isolated
#          512-token prefill (issue 53's targets)
#   structured  structured output on the CUDA backend: scripts/device/serve_structured.py (json_schema,
#          json_object, tool_choice required / named: every answer parses and validates; a constrained
#          stream's pace against an unconstrained one at 1 and 16 streams) against a make-model
#          checkpoint with a tokenizer (random weights have none; preset STRUCTURED_PRESET, default
#          llama3.2-1b), then tests/server/test_structured_output.py --backend cuda where the `openai`
#          client is installed
# Carry .whl/ (scripts/device/fetch-wheels.sh) for the openai and aiohttp clients.
# usage: scripts/device/serve-gpu.sh OUT BUILD_DIR [smoke] [bench] [ttft] [mixed] [structured]
set -euo pipefail
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${1:?OUT}; bin=${2:?BUILD_DIR}; shift 2
mkdir -p "$out"
port=8123
arch=llama3-8b
pid=""

# The clients the ttft and structured steps compare, from .whl/ (scripts/device/fetch-wheels.sh)
# into a private folder when the machine lacks them.
if [[ -d .whl ]] && ! python3 -c "import openai, aiohttp" 2>/dev/null; then
  python3 -m pip install --no-index --find-links .whl --target /tmp/deepfuse-clients -q openai aiohttp &&
    export PYTHONPATH="/tmp/deepfuse-clients${PYTHONPATH:+:$PYTHONPATH}"
fi

start_server() { start_server_with --random-weights --arch "$arch" "$@"; }

start_server_with() {
  "$bin/deepfuse" serve --port "$port" "$@" >"$out/serve.log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null &&
      return 0
    kill -0 "$pid" 2>/dev/null || { cat "$out/serve.log"; return 1; }
    sleep 0.5
  done
  echo "server not ready"; return 1
}

metrics() {
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:$port/metrics').read().decode())" >"$1"
}

stop_server() {
  [[ -n $pid ]] || return 0
  kill -TERM "$pid"
  wait "$pid" && echo "server exited 0 on SIGTERM" || echo "server exited $?"
  pid=""
  tail -n 3 "$out/serve.log"
}
# A failed check must not leave its server running: the next step would measure against it.
trap stop_server EXIT

for step in "$@"; do
  case $step in
    smoke)
      start_server --max-batch 16 --max-context 8192
      python3 scripts/device/serve_smoke.py "$port" "$arch" 2>&1 | tee "$out/smoke.log" || true
      stop_server
      # Deterministic (no fused MLP), without prefix caching or a prefill budget: the checks that
      # compare two generations of one prompt alone are strict here; batching may still change
      # greedy outputs (random weights: near-ties everywhere, bf16 GEMMs round per batch size).
      start_server --max-batch 16 --max-context 8192 --no-prefix-cache --max-step-tokens 1000000 \
        --plan-override mlp=unfused
      python3 scripts/device/serve_smoke.py "$port" "$arch" deterministic 2>&1 |
        sed 's/^/[deterministic, no prefix cache, no budget] /' | tee -a "$out/smoke.log" || true
      stop_server ;;
    bench)
      start_server --max-batch 16 --max-context 8192
      b="python3 scripts/bench/bench_serve.py --model $arch --base-url http://127.0.0.1:$port --json $out/serve.json"
      $b --label one-stream --max-concurrency 1 --num-prompts 8 2>&1 | tee -a "$out/bench.txt"
      $b --label 16-streams --max-concurrency 16 --num-prompts 64 2>&1 | tee -a "$out/bench.txt"
      # Decode-bound: short prompts, long outputs (prefill is about 1% of the GPU time, not 20%); their
      # mean context is 576 too, as bench decode measures below.
      $b --label 16-streams-long --max-concurrency 16 --num-prompts 32 --input-len 64 --output-len 1024 2>&1 |
        tee -a "$out/bench.txt"
      $b --label poisson --rates 2,8 --num-prompts 64 --max-concurrency 16 2>&1 | tee -a "$out/bench.txt"
      # Llama-3-8B's context is 8192: a 7552-token prefix with 512 ids of its own and 128 out, and an
      # 8000-token prefix with a short turn of its own (64 ids), as an agent loop sends.
      $b --label agentic --scenario agentic --prefix-len 7552 --max-concurrency 16 --num-prompts 34 2>&1 |
        tee -a "$out/bench.txt"
      $b --label agentic-short-turn --scenario agentic --prefix-len 8000 --input-len 64 --seed 1 \
        --max-concurrency 16 --num-prompts 18 2>&1 | tee -a "$out/bench.txt"
      metrics "$out/metrics.txt"
      stop_server
      "$bin/deepfuse" bench decode --archs "$arch" --batches 1,16 --contexts 576 --ttft-prompts 512,8064 \
        --json "$out/decode.json" 2>&1 | tee "$out/decode.txt" ;;
    ttft)
      start_server --max-batch 64 --max-context 4608
      python3 scripts/bench/first_token_latency.py --base-url "http://127.0.0.1:$port" --model "$arch" \
        --input-len 512 --output-len 2 --requests 50 --vocab 128000 --json "$out/ttft.json" 2>&1 |
        tee "$out/ttft.txt"
      stop_server
      "$bin/deepfuse" bench decode --archs "$arch" --batches 1 --contexts 576 --ttft-prompts 512 2>&1 |
        tee -a "$out/ttft.txt" ;;
    mixed)
      for steps in --mixed-steps --no-mixed-steps; do
        start_server --max-batch 16 --max-context 8192 "$steps"
        b="python3 scripts/bench/bench_serve.py --model $arch --base-url http://127.0.0.1:$port --json $out/mixed.json"
        $b --label "16-streams $steps" --max-concurrency 16 --num-prompts 64 2>&1 | tee -a "$out/mixed.txt"
        $b --label "one-stream $steps" --max-concurrency 1 --num-prompts 8 2>&1 | tee -a "$out/mixed.txt"
        $b --label "poisson $steps" --rates 8 --num-prompts 64 --max-concurrency 16 2>&1 | tee -a "$out/mixed.txt"
        metrics "$out/metrics$steps.txt"
        stop_server
      done
      "$bin/deepfuse" bench decode --archs "$arch" --batches 1,16 --contexts 576 --ttft-prompts 512 \
        --json "$out/mixed-decode.json" 2>&1 | tee -a "$out/mixed.txt" ;;
    structured)
      model=/tmp/deepfuse-structured-${STRUCTURED_PRESET:-llama3.2-1b}
      [[ -f $model/config.json ]] ||
        "$bin/deepfuse" make-model --out "$model" --preset "${STRUCTURED_PRESET:-llama3.2-1b}" >/dev/null
      python3 -c "import sys; sys.path.insert(0, 'tests/server'); import structured_cases as s
s.use_qwen_template('$model', 'tests/fixtures')"
      start_server_with --model "$model" --max-batch 16 --max-context 4096
      python3 scripts/device/serve_structured.py "$port" --json "$out/structured.json" 2>&1 |
        tee "$out/structured.log" || true
      metrics "$out/metrics-structured.txt"
      stop_server
      if python3 -c "import openai" 2>/dev/null; then
        python3 tests/server/test_structured_output.py --backend cuda --deepfuse "$bin/deepfuse" \
          --work-dir /tmp/deepfuse-structured-test --fixtures tests/fixtures 2>&1 |
          tee "$out/structured-openai.log" || true
      else
        echo "no openai client: tests/server/test_structured_output.py --backend cuda not run" |
          tee -a "$out/structured.log"
      fi ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
