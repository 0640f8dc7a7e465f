"""``python -m deepfuse.bench``: deepfuse's torch ops against plain PyTorch on this GPU.

Suites (``--suite mlp,hf``):

- ``mlp``: the SwiGLU op (residual add included) against ``F.linear`` + ``silu * mul`` +
  ``F.linear`` + add, eager and ``torch.compile``d, M = 1..64 tokens. Each variant runs
  ``--reps`` calls back to back in one CUDA graph; a cell is the median per-call time over the
  graph's replays, after at least 100 ms of warm-up. % copy: (weight + activation bytes) / time
  over the device-to-device copy bandwidth measured in the same run (1 GiB, read + write).
- ``hf``: a transformers ``LlamaForCausalLM`` with Llama-3-8B's shape and random weights, static
  KV cache, decode step ``torch.compile(mode="reduce-overhead", fullgraph=True)``, batch 1 and 8:
  decode tokens/s stock, then ``deepfuse.patch``ed, in one process.

Writes a table to stdout and, with ``--json``, the numbers, GPU, versions and ``--commit``.
"""

import argparse
import inspect
import json
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F

import deepfuse


def _graph_time_us(fn: Callable[[], object], reps: int, replays: int = 15) -> float:
    """Median per-call microseconds of `reps` calls of fn captured back to back in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(reps):
            fn()
    start_wall = time.perf_counter()
    while time.perf_counter() - start_wall < 0.1:  # warm-up: clocks up
        graph.replay()
        torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) * 1000.0 / reps)
    del graph
    return statistics.median(times)


def copy_bandwidth_gbs() -> float:
    """Device-to-device copy of 1 GiB, bytes read + written per second, in GB/s."""
    n = 1 << 30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    us = _graph_time_us(lambda: dst.copy_(src), reps=5, replays=10)
    return 2 * n / (us * 1e-6) / 1e9


def bench_mlp(shapes: List[tuple], ms: List[int], reps: int, copy_gbs: float) -> List[Dict]:
    rows = []
    for hidden, inter in shapes:
        gate = (torch.randn(inter, hidden, device="cuda") * hidden ** -0.5).bfloat16()
        up = (torch.randn(inter, hidden, device="cuda") * hidden ** -0.5).bfloat16()
        down = (torch.randn(hidden, inter, device="cuda") * inter ** -0.5).bfloat16()
        gate_up = torch.cat([gate, up]).contiguous()
        packed = deepfuse.pack_mlp_weights(gate, up, down, max_fused_tokens=max(ms))

        def torch_mlp(x, res):
            g, u = F.linear(x, gate_up).chunk(2, dim=-1)
            return F.linear(F.silu(g) * u, down) + res

        compiled = torch.compile(torch_mlp, dynamic=True)
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").bfloat16()
            res = torch.randn(m, hidden, device="cuda").bfloat16()
            bytes_moved = 3 * hidden * inter * 2 + 3 * m * hidden * 2
            cells = {
                "deepfuse_fused": lambda: deepfuse.swiglu_mlp(x, packed, residual=res, variant="fused"),
                "deepfuse_auto": lambda: deepfuse.swiglu_mlp(x, packed, residual=res, variant="auto"),
                "torch_eager": lambda: torch_mlp(x, res),
                "torch_compiled": lambda: compiled(x, res),
            }
            row = {"hidden": hidden, "intermediate": inter, "m": m, "bytes": bytes_moved}
            for name, fn in cells.items():
                us = _graph_time_us(fn, reps)
                row[name + "_us"] = round(us, 2)
                row[name + "_pct_copy"] = round(100.0 * bytes_moved / (us * 1e-6) / 1e9 / copy_gbs, 1)
            row["speedup_vs_eager"] = round(row["torch_eager_us"] / row["deepfuse_fused_us"], 3)
            row["speedup_vs_compiled"] = round(row["torch_compiled_us"] / row["deepfuse_fused_us"], 3)
            rows.append(row)
            print(f"mlp {hidden}x{inter} M={m:3d}: fused {row['deepfuse_fused_us']:8.1f} us ({row['deepfuse_fused_pct_copy']:5.1f}%)"
                  f"  auto {row['deepfuse_auto_us']:8.1f}  eager {row['torch_eager_us']:8.1f}"
                  f"  compiled {row['torch_compiled_us']:8.1f}  x{row['speedup_vs_eager']:.2f} / x{row['speedup_vs_compiled']:.2f}",
                  flush=True)
        del gate, up, down, gate_up, packed
        torch.cuda.empty_cache()
    return rows


def _static_cache(model, batch: int, max_len: int):
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kwargs = {"config": model.config, "max_cache_len": max_len}
    for name, value in (("max_batch_size", batch), ("batch_size", batch), ("device", "cuda"),
                        ("dtype", torch.bfloat16)):
        if name in params:
            kwargs[name] = value
    return StaticCache(**kwargs)


def _decode_tokens_per_s(model, batch: int, prompt: int, steps: int, warmup: int) -> Dict:
    cache = _static_cache(model, batch, prompt + warmup + steps + 8)
    ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
    with torch.no_grad():
        logits = model(ids, past_key_values=cache, cache_position=torch.arange(prompt, device="cuda"),
                       use_cache=True).logits
    token = logits[:, -1].argmax(-1, keepdim=True)

    def decode_one(cur, cache_position):
        out = model(cur, past_key_values=cache, cache_position=cache_position,
                    position_ids=cache_position.unsqueeze(0).expand(cur.shape[0], -1), use_cache=True)
        return out.logits[:, -1].argmax(-1, keepdim=True)

    step = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
    position = prompt
    compile_start = time.perf_counter()
    with torch.no_grad():
        for _ in range(warmup):
            token = step(token, torch.tensor([position], device="cuda")).clone()
            position += 1
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - compile_start
        start = time.perf_counter()
        for _ in range(steps):
            token = step(token, torch.tensor([position], device="cuda")).clone()
            position += 1
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1000.0 / steps
    return {"batch": batch, "ms_per_step": round(ms, 3), "tokens_per_s": round(batch * 1000.0 / ms, 1),
            "warmup_and_compile_s": round(compile_s, 1), "steps": steps}


def bench_hf(batches: List[int], steps: int, layers: int,
             on_row: Optional[Callable[[List[Dict]], None]] = None) -> List[Dict]:
    import transformers

    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                                      tie_word_embeddings=False)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            model = transformers.LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
    rows = []
    for batch in batches:
        pair = {}
        for label in ("stock", "patched"):
            if label == "patched":
                deepfuse.patch(model)
            torch._dynamo.reset()
            row = {"model": f"Llama-3-8B shape, {layers} layers, random bf16 weights", "variant": label,
                   **_decode_tokens_per_s(model, batch, prompt=64, steps=steps, warmup=4)}
            rows.append(row)
            pair[label] = row
            print(f"hf {label:8s} batch {batch}: {row['ms_per_step']:.3f} ms/step, {row['tokens_per_s']:.1f} tok/s "
                  f"(warm-up incl. compile {row['warmup_and_compile_s']} s)", flush=True)
            if on_row:
                on_row(rows)
        deepfuse.unpatch(model)
        ratio = pair["patched"]["tokens_per_s"] / pair["stock"]["tokens_per_s"]
        pair["patched"]["speedup_vs_stock"] = round(ratio, 3)
        print(f"hf batch {batch}: patched / stock tokens/s = {ratio:.3f}", flush=True)
        if on_row:
            on_row(rows)
    return rows


def _commit(given: Optional[str]) -> str:
    if given:
        return given
    try:
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deepfuse.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="mlp,hf", help="comma-separated: mlp, hf (run in that order)")
    parser.add_argument("--shapes", default="4096x14336,2048x8192", help="MLP shapes HxI")
    parser.add_argument("--m", default="1,2,4,8,16,32,64", help="MLP token counts")
    parser.add_argument("--reps", type=int, default=20, help="MLP calls per CUDA graph")
    parser.add_argument("--batches", default="1,8", help="hf decode batch sizes")
    parser.add_argument("--steps", type=int, default=64, help="hf timed decode steps")
    parser.add_argument("--layers", type=int, default=32, help="hf decoder layers (Llama-3-8B: 32)")
    parser.add_argument("--json", help="write results here")
    parser.add_argument("--commit", help="the commit to stamp (default: git rev-parse HEAD)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("deepfuse.bench needs a CUDA device", file=sys.stderr)
        return 2
    suites = [s.strip() for s in args.suite.split(",") if s.strip()]
    result: Dict = {
        "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "deepfuse": deepfuse.__version__, "commit": _commit(args.commit),
    }
    try:
        import transformers

        result["transformers"] = transformers.__version__
    except ImportError:
        pass
    result["copy_bandwidth_gbs"] = round(copy_bandwidth_gbs(), 1)
    print(f"{result['gpu']}, torch {result['torch']}, commit {result['commit']}, "
          f"copy bandwidth {result['copy_bandwidth_gbs']} GB/s", flush=True)

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    def hf_rows(rows):
        result["hf"] = rows
        save()

    if "mlp" in suites:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        result["mlp"] = bench_mlp(shapes, [int(m) for m in args.m.split(",")], args.reps, result["copy_bandwidth_gbs"])
        save()
    if "hf" in suites:
        bench_hf([int(b) for b in args.batches.split(",")], args.steps, args.layers, hf_rows)
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
