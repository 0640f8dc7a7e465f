#!/usr/bin/env python3
"""Structured output on the CUDA backend, as a client sees it (standard library only: the GPU
machines have no `openai` client). Against a running `deepfuse serve` whose checkpoint has a
tokenizer and Qwen2.5's chat template (scripts/device/serve-gpu.sh structured makes one):

1. json_schema (tests/server/structured_cases.py's nested ORDER_SCHEMA) on chat and completions,
   greedy and sampled (n=3), streamed and not: every answer finishes "stop", parses and validates.
2. json_object: every answer that finishes "stop" parses as an object.
3. tool_choice "required" and a named function: one call whose arguments validate, finish
   "tool_calls", streamed and not.
4. Pace: a constrained stream against an unconstrained one of the same length (ignore_eos), at 1
   and 16 concurrent streams: inter-token latency (median over streams) and output tokens/s
   overall.

usage: serve_structured.py PORT [--json OUT]; exit status 1 when a check fails.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "server"))
from structured_cases import CLOCK, ORDER_SCHEMA, WEATHER, validate  # noqa: E402

BASE = None
FAILURES = []
ORDER = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA, "strict": True}}
USER = [{"role": "user", "content": "Write an order as JSON."}]


def check(cond, what):
    print(("PASS " if cond else "FAIL ") + what, flush=True)
    if not cond:
        FAILURES.append(what)


def post(path, body):
    req = urllib.request.Request(BASE + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def stream(path, body):
    """Every choice's text (or tool call arguments), finish reason and tool names, the arrival time
    of each content chunk, and the usage."""
    body = dict(body, stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(BASE + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    texts, finishes, tools, times, usage = {}, {}, {}, [], None
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for c in chunk.get("choices", []):
                i = c["index"]
                piece = c.get("text") or (c.get("delta") or {}).get("content") or ""
                for call in (c.get("delta") or {}).get("tool_calls") or []:
                    fn = call.get("function") or {}
                    tools.setdefault(i, {"name": "", "arguments": ""})
                    tools[i]["name"] += fn.get("name") or ""
                    tools[i]["arguments"] += fn.get("arguments") or ""
                    piece = piece or fn.get("arguments") or fn.get("name") or ""
                if piece:
                    times.append(time.perf_counter())
                texts[i] = texts.get(i, "") + piece
                finishes[i] = c.get("finish_reason") or finishes.get(i)
    return texts, finishes, tools, times, usage


def schema_answers():
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "seed": 7, "n": 3}):
        chat = {"messages": USER, "response_format": ORDER, "max_tokens": 300, **sampling}
        text = {"prompt": "JSON:", "response_format": ORDER, "max_tokens": 300, **sampling}
        answers = [(c["message"]["content"], c["finish_reason"]) for c in post("/v1/chat/completions", chat)["choices"]]
        answers += [(c["text"], c["finish_reason"]) for c in post("/v1/completions", text)["choices"]]
        for path, body in (("/v1/chat/completions", chat), ("/v1/completions", text)):
            texts, finishes, _, _, _ = stream(path, body)
            answers += [(texts[i], finishes[i]) for i in sorted(texts)]
        for answer, finish in answers:
            try:
                validate(json.loads(answer), ORDER_SCHEMA)
                valid = finish == "stop"
            except (ValueError, AssertionError) as e:
                valid = False
                answer += f"  ({e})"
            check(valid, f"json_schema {sampling}: finish {finish}, {answer[:160]}")


def json_object_answers():
    body = {"messages": USER, "response_format": {"type": "json_object"}, "max_tokens": 200, "temperature": 1.0,
            "seed": 5, "n": 4}
    ended = 0
    for c in post("/v1/chat/completions", body)["choices"]:
        text = c["message"]["content"]
        check(text.startswith("{"), f"json_object starts an object: {text[:80]}")
        if c["finish_reason"] == "stop":
            ended += 1
            try:
                check(isinstance(json.loads(text), dict), f"json_object parses: {text[:160]}")
            except ValueError:
                check(False, f"json_object parses: {text[:160]}")
    print(f"json_object: {ended} of 4 ended within 200 tokens", flush=True)


def tool_calls():
    ask = [{"role": "user", "content": "What is the weather in Oslo?"}]
    tools = {"get_weather": WEATHER, "get_time": CLOCK}
    for choice, names in (("required", set(tools)), ({"type": "function", "function": {"name": "get_time"}},
                                                     {"get_time"})):
        body = {"messages": ask, "tools": [WEATHER, CLOCK], "tool_choice": choice, "max_tokens": 200,
                "temperature": 0}
        calls = []
        c = post("/v1/chat/completions", body)["choices"][0]
        for call in c["message"].get("tool_calls") or []:
            calls.append((call["function"]["name"], call["function"]["arguments"], c["finish_reason"]))
        _, finishes, streamed, _, _ = stream("/v1/chat/completions", body)
        calls += [(streamed[i]["name"], streamed[i]["arguments"], finishes[i]) for i in sorted(streamed)]
        check(len(calls) == 2, f"tool_choice {choice}: one call streamed and one not ({len(calls)} found)")
        for name, arguments, finish in calls:
            try:
                ok = name in names and finish == "tool_calls"
                validate(json.loads(arguments), tools[name]["function"]["parameters"])
            except (ValueError, AssertionError, KeyError) as e:
                ok = False
                arguments += f"  ({e})"
            check(ok, f"tool_choice {choice}: {name}({arguments}), finish {finish}")


def pace(streams, constrained, tokens):
    """`streams` concurrent chat streams of `tokens` tokens each (constrained: ORDER, whose answers
    end by themselves; else ignore_eos with max_tokens = tokens). Inter-token latency per stream
    (first to last token over the gaps between them, ms; the median over streams: one write may
    carry several tokens, so single gaps mislead), output tokens/s overall, and the token count of
    the first stream."""
    body = {"messages": USER, "temperature": 0, "max_tokens": tokens}
    if constrained:
        body["response_format"] = ORDER
    else:
        body["ignore_eos"] = True
    results = [None] * streams

    def one(i):
        results[i] = stream("/v1/chat/completions", body)

    start = time.perf_counter()
    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - start
    itl, total = [], 0
    for _, _, _, times, usage in results:
        total += usage["completion_tokens"]
        if usage["completion_tokens"] > 1:
            itl.append((times[-1] - times[0]) / (usage["completion_tokens"] - 1) * 1e3)
    return {"streams": streams, "constrained": constrained, "itl_ms": statistics.median(itl),
            "tokens_per_s": total / wall, "tokens": results[0][4]["completion_tokens"]}


def main():
    global BASE
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--json", help="write the pace rows here")
    args = parser.parse_args()
    BASE = f"http://127.0.0.1:{args.port}"
    schema_answers()
    json_object_answers()
    tool_calls()
    rows = []
    for streams in (1, 16):
        # Untimed first: the buckets' graphs (with and without masks) are captured on first use.
        pace(streams, False, pace(streams, True, 300)["tokens"])
        constrained = pace(streams, True, 300)
        unconstrained = pace(streams, False, constrained["tokens"])
        rows += [constrained, unconstrained]
        for r in (constrained, unconstrained):
            print(f"pace: {streams:2d} streams, {'constrained  ' if r['constrained'] else 'unconstrained'}: "
                  f"inter-token {r['itl_ms']:.2f} ms, {r['tokens_per_s']:.1f} output tokens/s "
                  f"({r['tokens']} tokens a stream)", flush=True)
        print(f"pace: {streams:2d} streams, constrained inter-token / unconstrained = "
              f"{constrained['itl_ms'] / unconstrained['itl_ms']:.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{len(FAILURES)} checks failed" if FAILURES else "all structured output checks passed", flush=True)
    sys.exit(1 if FAILURES else 0)


if __name__ == "__main__":
    main()
