#!/usr/bin/env python3
"""Serving benchmark for `deepfuse serve` (or any OpenAI-compatible server), after vLLM's
benchmark_serving: requests arrive as a Poisson process at a given rate (or all at once), at most
--max-concurrency in flight, each streamed; it reports request throughput, output tokens/s, time to
first token (TTFT), inter-token latency (ITL) and end-to-end latency, p50 and p99.

Prompts are random token ids (the server must accept `prompt` as an id array, as OpenAI's API
does), `ignore_eos` fixes every output length, and each streamed chunk is one token (as
`deepfuse serve` sends them). Scenarios:
  random   --input-len ids in, --output-len out
  agentic  every prompt starts with one shared prefix of --prefix-len ids (an agent's long history),
           then --input-len ids of its own; the first request warms the prefix
Standard library only, so it runs wherever Python does.

  python3 scripts/bench/bench_serve.py --base-url http://127.0.0.1:8000 --model llama3-8b \\
      --scenario random --rates 1,4,inf --num-prompts 64 --json out.json
"""
import argparse
import http.client
import json
import math
import random
import statistics
import sys
import threading
import time
import urllib.parse


def percentile(values, q):
    if not values:
        return float("nan")
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Result:
    def __init__(self):
        self.ok = False
        self.error = ""
        self.sent = 0.0
        self.token_times = []
        self.prompt_len = 0
        self.cached_tokens = None


def stream_request(url, model, prompt, output_len, api_key, result):
    parsed = urllib.parse.urlparse(url)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": output_len, "temperature": 0,
                       "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}})
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    result.prompt_len = len(prompt)
    try:
        conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=600)
        result.sent = time.perf_counter()
        conn.request("POST", "/v1/completions", body=body, headers=headers)
        response = conn.getresponse()
        if response.status != 200:
            result.error = f"HTTP {response.status}: {response.read()[:200]!r}"
            return
        while True:
            line = response.fp.readline()
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data: "):
                continue
            data = line[6:]
            if data == b"[DONE]":
                result.ok = True
                break
            chunk = json.loads(data)
            if chunk.get("choices"):
                result.token_times.append(time.perf_counter())
            elif chunk.get("usage"):
                details = chunk["usage"].get("prompt_tokens_details") or {}
                result.cached_tokens = details.get("cached_tokens")
        conn.close()
    except Exception as e:  # noqa: BLE001 - reported per request
        result.error = repr(e)


def run_rate(args, prompts, rate, concurrency):
    results = [Result() for _ in prompts]
    threads = []
    gate = threading.Semaphore(concurrency) if concurrency else None
    rng = random.Random(args.seed)
    start = time.perf_counter()

    def worker(i):
        try:
            stream_request(args.base_url, args.model, prompts[i], args.output_len, args.api_key, results[i])
        finally:
            if gate:
                gate.release()

    for i in range(len(prompts)):
        if gate:
            gate.acquire()
        t = threading.Thread(target=worker, args=(i,))
        t.start()
        threads.append(t)
        if rate != math.inf:
            time.sleep(rng.expovariate(rate))
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    done = [r for r in results if r.ok]
    ttft = [(r.token_times[0] - r.sent) * 1e3 for r in done if r.token_times]
    itl = [(b - a) * 1e3 for r in done for a, b in zip(r.token_times, r.token_times[1:])]
    e2e = [(r.token_times[-1] - r.sent) * 1e3 for r in done if r.token_times]
    out_tokens = sum(len(r.token_times) for r in done)
    summary = {
        "rate": "inf" if rate == math.inf else rate,
        "max_concurrency": concurrency or None,
        "requests": len(prompts),
        "completed": len(done),
        "errors": [r.error for r in results if not r.ok][:5],
        "duration_s": duration,
        "request_throughput": len(done) / duration,
        "output_tokens_per_s": out_tokens / duration,
        "mean_prompt_tokens": statistics.mean(r.prompt_len for r in results),
        "ttft_ms": {"p50": percentile(ttft, 50), "p99": percentile(ttft, 99), "mean": statistics.mean(ttft) if ttft else None},
        "itl_ms": {"p50": percentile(itl, 50), "p99": percentile(itl, 99), "mean": statistics.mean(itl) if itl else None},
        "e2e_ms": {"p50": percentile(e2e, 50), "p99": percentile(e2e, 99)},
        "cached_tokens_mean": statistics.mean([r.cached_tokens or 0 for r in done]) if done else None,
    }
    return summary


def make_prompts(args):
    rng = random.Random(args.seed)
    ids = lambda n: [rng.randrange(args.id_low, args.id_high) for _ in range(n)]
    if args.scenario == "random":
        return [ids(args.input_len) for _ in range(args.num_prompts)]
    prefix = ids(args.prefix_len)
    return [prefix + ids(args.input_len) for _ in range(args.num_prompts)]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default="")
    p.add_argument("--scenario", choices=["random", "agentic"], default="random")
    p.add_argument("--rates", default="inf", help="comma-separated request rates per second; inf: all at once")
    p.add_argument("--max-concurrency", type=int, default=0, help="requests in flight at most (0: no limit)")
    p.add_argument("--num-prompts", type=int, default=64)
    p.add_argument("--input-len", type=int, default=512)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--prefix-len", type=int, default=6144, help="agentic: the shared prefix's length")
    p.add_argument("--id-low", type=int, default=1000, help="random ids are drawn from [id-low, id-high)")
    p.add_argument("--id-high", type=int, default=30000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--label", default="")
    p.add_argument("--json", help="append the results to this JSON file (a list)")
    args = p.parse_args()

    prompts = make_prompts(args)
    if args.scenario == "agentic":  # one request alone first: uncached prefix TTFT, and it warms the cache
        cold = run_rate(args, prompts[:1], math.inf, 1)
        warm = run_rate(args, prompts[1:2], math.inf, 1)
        print(f"agentic: prefix {args.prefix_len} ids: TTFT first (cold) {cold['ttft_ms']['p50']:.1f} ms, "
              f"second (shared prefix) {warm['ttft_ms']['p50']:.1f} ms, cached tokens {warm['cached_tokens_mean']}")
        prompts = prompts[2:]
    runs = []
    for rate_text in args.rates.split(","):
        rate = math.inf if rate_text in ("inf", "") else float(rate_text)
        s = run_rate(args, prompts, rate, args.max_concurrency)
        s.update(scenario=args.scenario, input_len=args.input_len, output_len=args.output_len, label=args.label)
        if args.scenario == "agentic":
            s.update(prefix_len=args.prefix_len, cold_ttft_ms=cold["ttft_ms"]["p50"],
                     warm_ttft_ms=warm["ttft_ms"]["p50"], warm_cached_tokens=warm["cached_tokens_mean"])
        runs.append(s)
        print(f"{args.label or args.scenario} rate {s['rate']} conc {args.max_concurrency or '-'}: "
              f"{s['completed']}/{s['requests']} ok in {s['duration_s']:.2f} s, "
              f"{s['request_throughput']:.2f} req/s, {s['output_tokens_per_s']:.1f} out tok/s, "
              f"TTFT p50/p99 {s['ttft_ms']['p50']:.1f}/{s['ttft_ms']['p99']:.1f} ms, "
              f"ITL p50/p99 {s['itl_ms']['p50']:.2f}/{s['itl_ms']['p99']:.2f} ms", flush=True)
        if s["errors"]:
            print("  errors:", s["errors"], file=sys.stderr)
    if args.json:
        try:
            with open(args.json) as f:
                existing = json.load(f)
        except (OSError, ValueError):
            existing = []
        with open(args.json, "w") as f:
            json.dump(existing + runs, f, indent=1)


if __name__ == "__main__":
    main()
