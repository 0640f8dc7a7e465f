#!/usr/bin/env bash
# A short, bounded libFuzzer run (ctest): seeds are generated now (a small sharded checkpoint from
# `deepfuse make-model`, presets' configs, and the Hugging Face fixtures' configs), then the fuzzer
# mutates them for at most FUZZ_SECONDS seconds / FUZZ_RUNS inputs. Any crash fails the test.
# usage: run_fuzz.sh FUZZER DEEPFUSE_CLI FIXTURES_DIR WORK_DIR
set -euo pipefail
fuzzer=$1 cli=$2 fixtures=$3 work=$4
seconds=${FUZZ_SECONDS:-20}
runs=${FUZZ_RUNS:-300000}

rm -rf "$work"
mkdir -p "$work/seeds" "$work/corpus"
small=(--vocab 16 --hidden 8 --intermediate 8 --layers 1 --heads 2 --kv-heads 1 --dtype f32)
"$cli" make-model --out "$work/llama" "${small[@]}" --shards 2 >/dev/null
"$cli" make-model --out "$work/llama3" --preset llama3.2-1b "${small[@]}" >/dev/null
"$cli" make-model --out "$work/qwen2" --preset qwen2.5-7b "${small[@]}" >/dev/null
"$cli" make-model --out "$work/mistral" --preset mistral-7b "${small[@]}" >/dev/null
for model in llama llama3 qwen2 mistral; do
  for f in "$work/$model"/*; do cp "$f" "$work/seeds/${model}_$(basename "$f")"; done
done
for f in "$fixtures"/hf/*/config.json "$fixtures"/hf/*/generation_config.json; do
  cp "$f" "$work/seeds/hf_$(basename "$(dirname "$f")")_$(basename "$f")"
done

"$fuzzer" -max_total_time="$seconds" -runs="$runs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "$work/corpus" "$work/seeds"
