"""``python -m deepfuse.bench``: deepfuse's torch ops against plain PyTorch on this GPU.

Suites (``--suite mlp,hf``):

- ``mlp``: the SwiGLU op (residual add included) against ``F.linear`` + ``silu * mul`` +
  ``F.linear`` + add, eager and ``torch.compile``d, M = 1..64 tokens. Each variant runs
  ``--reps`` calls back to back in one CUDA graph, rotating through copies of the weights that
  together are four times the L2 (so every call streams them from HBM); a cell is the median
  per-call time over the graph's replays, after at least 100 ms of warm-up. % copy: (weight +
  activation bytes) / time over the copy bandwidth, which is measured by the C++ benchmarks' own
  function (``deepfuse bench``: a 1 GiB device-to-device copy, read + write). Every cell is checked
  against the physical floor (src/core/roofline.hpp); one below it fails the run.
- ``hf``: a transformers ``LlamaForCausalLM`` with Llama-3-8B's shape and random weights, static
  KV cache, decode step ``torch.compile(mode="reduce-overhead", fullgraph=True)``, at every batch of
  ``--batches`` (1, 2, 4, ..., 64): stock, and a second model object sharing the same weights
  ``deepfuse.patch``ed (its measured dispatch is printed). Both are compiled, then timed in
  alternating rounds (``--rounds``; the order flips every round), so clock and power drift hit
  both alike; the medians and their ratio are reported for every batch, with each round's times.

Writes a table to stdout and, with ``--json``, the numbers, GPU, versions and ``--commit``.
Exits with status 1 when a figure is physically impossible.
"""

import argparse
import copy
import inspect
import json
import math
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

import deepfuse

from . import _timing


def _weight_copies(weight_bytes: int, l2_bytes: int) -> int:
    """Copies of a weight set that together cover four L2s (src/bench: l2_multiple 4), at least 2."""
    return max(2, math.ceil(4 * l2_bytes / weight_bytes))


def bench_mlp(shapes: List[tuple], ms: List[int], reps: int, floor: _timing.DeviceFloor) -> List[Dict]:
    rows = []
    for hidden, inter in shapes:
        copies = _weight_copies(3 * hidden * inter * 2, floor.l2_bytes)
        reps_per_graph = copies * math.ceil(reps / copies)
        weights = []
        for _ in range(copies):
            gate = (torch.randn(inter, hidden, device="cuda") * hidden ** -0.5).bfloat16()
            up = (torch.randn(inter, hidden, device="cuda") * hidden ** -0.5).bfloat16()
            down = (torch.randn(hidden, inter, device="cuda") * inter ** -0.5).bfloat16()
            weights.append((torch.cat([gate, up]).contiguous(), down,
                            deepfuse.pack_mlp_weights(gate, up, down, max_fused_tokens=max(ms))))
            del gate, up

        def torch_mlp(x, res, gate_up, down):
            g, u = F.linear(x, gate_up).chunk(2, dim=-1)
            return F.linear(F.silu(g) * u, down) + res

        compiled = torch.compile(torch_mlp, dynamic=True)
        for m in ms:
            x = torch.randn(m, hidden, device="cuda").bfloat16()
            res = torch.randn(m, hidden, device="cuda").bfloat16()
            bytes_moved = 3 * hidden * inter * 2 + 3 * m * hidden * 2
            variants = {
                "deepfuse_fused": lambda w: deepfuse.swiglu_mlp(x, w[2], residual=res, variant="fused"),
                "deepfuse_auto": lambda w: deepfuse.swiglu_mlp(x, w[2], residual=res, variant="auto"),
                "torch_eager": lambda w: torch_mlp(x, res, w[0], w[1]),
                "torch_compiled": lambda w: compiled(x, res, w[0], w[1]),
            }
            row = {"hidden": hidden, "intermediate": inter, "m": m, "bytes": bytes_moved, "weight_copies": copies}
            for name, fn in variants.items():
                calls = [lambda w=weights[i % copies], fn=fn: fn(w) for i in range(reps_per_graph)]
                us = _timing.graph_call_us(calls)
                row[name + "_us"] = round(us, 2)
                row[name + "_pct_copy"] = round(100.0 * bytes_moved / (us * 1e-6) / floor.copy_bytes_per_s, 1)
                row[name + "_physically_possible"] = floor.possible(bytes_moved, us)
            row["speedup_vs_eager"] = round(row["torch_eager_us"] / row["deepfuse_fused_us"], 3)
            row["speedup_vs_compiled"] = round(row["torch_compiled_us"] / row["deepfuse_fused_us"], 3)
            rows.append(row)
            print(f"mlp {hidden}x{inter} M={m:3d}: fused {row['deepfuse_fused_us']:8.1f} us ({row['deepfuse_fused_pct_copy']:5.1f}%)"
                  f"  auto {row['deepfuse_auto_us']:8.1f}  eager {row['torch_eager_us']:8.1f}"
                  f"  compiled {row['torch_compiled_us']:8.1f}  x{row['speedup_vs_eager']:.2f} / x{row['speedup_vs_compiled']:.2f}",
                  flush=True)
        del weights
        torch.cuda.empty_cache()
    return rows


def impossible_mlp_cells(rows: List[Dict]) -> List[str]:
    """The cells of ``bench_mlp``'s rows that beat the physical floor, named."""
    return [f"mlp {r['hidden']}x{r['intermediate']} M={r['m']} {key[:-len('_physically_possible')]}"
            for r in rows for key, ok in r.items() if key.endswith("_physically_possible") and not ok]


def _static_cache(model, batch: int, max_len: int):
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kwargs = {"config": model.config, "max_cache_len": max_len}
    for name, value in (("max_batch_size", batch), ("batch_size", batch), ("device", "cuda"),
                        ("dtype", torch.bfloat16)):
        if name in params:
            kwargs[name] = value
    return StaticCache(**kwargs)


class _CompiledDecode:
    """One model's compiled decode step at one batch: a static cache, a prompt prefilled, then
    ``time(steps)`` decodes ``steps`` tokens and returns ms per step (wall time over all of them,
    synchronised at both ends)."""

    def __init__(self, model, batch: int, prompt: int, max_steps: int, warmup: int):
        self.cache = _static_cache(model, batch, prompt + max_steps + 8)
        ids = torch.randint(0, model.config.vocab_size, (batch, prompt), device="cuda")
        with torch.no_grad():
            logits = model(ids, past_key_values=self.cache, cache_position=torch.arange(prompt, device="cuda"),
                           use_cache=True).logits
        self.token = logits[:, -1].argmax(-1, keepdim=True)
        self.position = prompt

        def decode_one(cur, cache_position):
            out = model(cur, past_key_values=self.cache, cache_position=cache_position,
                        position_ids=cache_position.unsqueeze(0).expand(cur.shape[0], -1), use_cache=True)
            return out.logits[:, -1].argmax(-1, keepdim=True)

        self.step = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
        start = time.perf_counter()
        self._run(self._positions(warmup))
        self.compile_s = time.perf_counter() - start

    def _positions(self, steps: int) -> List[Tensor]:
        # Made before the clock starts: a tensor built from a Python int is a host-to-device copy that
        # waits for the GPU, which would idle it between steps and time the host instead of the model.
        return [torch.tensor([self.position + i], device="cuda") for i in range(steps)]

    def _run(self, positions: List[Tensor]) -> None:
        with torch.no_grad():
            for position in positions:
                self.token = self.step(self.token, position).clone()
                self.position += 1
        torch.cuda.synchronize()

    def time(self, steps: int) -> float:
        positions = self._positions(steps)
        torch.cuda.synchronize()
        start = time.perf_counter()
        self._run(positions)
        return (time.perf_counter() - start) * 1000.0 / steps


def _llama_8b_shape(layers: int):
    import transformers

    config = transformers.LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                                      num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                      max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                                      tie_word_embeddings=False)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda"):
            return transformers.LlamaForCausalLM(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)


def _sharing_weights(model):
    """A second module tree over the same parameters and buffers (no copy of the weights), so one
    can be patched while the other stays stock and both stay compiled."""
    memo = {id(t): t for t in list(model.parameters()) + list(model.buffers())}
    return copy.deepcopy(model, memo)


def bench_hf(batches: List[int], steps: int, rounds: int, layers: int,
             on_row: Optional[Callable[[List[Dict]], None]] = None) -> List[Dict]:
    stock = _llama_8b_shape(layers)
    patched = deepfuse.patch(_sharing_weights(stock))
    dispatch = deepfuse.dispatch_of(patched)
    print(f"hf patch dispatch: fused up to {dispatch.fused_max_tokens} tokens ({dispatch.source})", flush=True)
    for t in dispatch.timings:
        print(f"  M={t['m']:3d}: fused {t['fused_us']:7.1f} us, stock GEMMs {t['gemms_us']:7.1f} us per layer", flush=True)
    rows = []
    for batch in batches:
        torch._dynamo.reset()
        decoders = {label: _CompiledDecode(model, batch, prompt=64, max_steps=rounds * steps + 8, warmup=4)
                    for label, model in (("stock", stock), ("patched", patched))}
        times: Dict[str, List[float]] = {"stock": [], "patched": []}
        # Alternating, and in the opposite order every other round (stock, patched, patched, stock, ...):
        # drift, and whatever running second costs, hit both alike.
        for r in range(rounds):
            order = list(decoders.items())
            for label, decoder in order if r % 2 == 0 else reversed(order):
                times[label].append(round(decoder.time(steps), 3))
        ms = {label: statistics.median(t) for label, t in times.items()}
        row = {"model": f"Llama-3-8B shape, {layers} layers, random bf16 weights", "batch": batch,
               "stock_ms_per_step": ms["stock"], "patched_ms_per_step": ms["patched"],
               "stock_tokens_per_s": round(batch * 1000.0 / ms["stock"], 1),
               "patched_tokens_per_s": round(batch * 1000.0 / ms["patched"], 1),
               "speedup_vs_stock": round(ms["stock"] / ms["patched"], 3),
               "patched_path": "fused" if dispatch.fused(batch) else "stock modules",
               "stock_rounds_ms": times["stock"], "patched_rounds_ms": times["patched"], "steps_per_round": steps,
               "warmup_and_compile_s": {label: round(d.compile_s, 1) for label, d in decoders.items()}}
        rows.append(row)
        print(f"hf batch {batch:2d}: stock {ms['stock']:.3f} ms/step, patched {ms['patched']:.3f} ms/step "
              f"({row['patched_path']}): patched / stock tokens/s = {row['speedup_vs_stock']:.3f} "
              f"(rounds {times['stock']} / {times['patched']})", flush=True)
        del decoders
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
    parser.add_argument("--reps", type=int, default=20, help="MLP calls per CUDA graph (rounded up to the weight copies)")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64", help="hf decode batch sizes")
    parser.add_argument("--steps", type=int, default=32, help="hf timed decode steps per round")
    parser.add_argument("--rounds", type=int, default=4,
                        help="hf alternating stock / patched rounds per batch (even: each goes first as often)")
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
    floor = _timing.measure_device_floor()
    result.update({"copy_bandwidth_gbs": round(floor.copy_bytes_per_s / 1e9, 1),
                   "dram_peak_gbs": round(floor.dram_peak_bytes_per_s / 1e9, 1), "l2_bytes": floor.l2_bytes})
    print(f"{result['gpu']}, torch {result['torch']}, commit {result['commit']}, copy bandwidth "
          f"{result['copy_bandwidth_gbs']} GB/s (read+write, as deepfuse bench), DRAM peak {result['dram_peak_gbs']} GB/s",
          flush=True)

    def save():
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f, indent=1)

    def hf_rows(rows):
        result["hf"] = rows
        save()

    impossible: List[str] = []
    if "mlp" in suites:
        shapes = [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
        result["mlp"] = bench_mlp(shapes, [int(m) for m in args.m.split(",")], args.reps, floor)
        impossible += impossible_mlp_cells(result["mlp"])
        save()
    if "hf" in suites:
        bench_hf([int(b) for b in args.batches.split(",")], args.steps, args.rounds, args.layers, hf_rows)
    save()
    if impossible:
        print("error: faster than reading their bytes can be (a timing bug, not a result): " + "; ".join(impossible),
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
