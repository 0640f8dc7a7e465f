#!/usr/bin/env python3
"""Time to the first streamed token of `deepfuse serve`, one request at a time, as different HTTP
clients see it (issue 53: an aiohttp client saw p50 41.5 ms where urllib saw 16.5 ms).

Clients, each sending the same streamed completion (random prompt ids, greedy, --output-len out):
  keepalive  one kept-alive connection for every request, the request in one write, TCP_NODELAY
             on, the stream read as it comes: aiohttp's pattern (standard library)
  fresh      a new connection per request (urllib's pattern; standard library)
  aiohttp    aiohttp.ClientSession, when aiohttp is installed
  openai     the `openai` client (httpx), when installed
  curl       `curl -N`, one process per request (its start-up is in the figure), when on PATH
and `whole`: a non-streamed request on a kept-alive connection (its response is two writes, the
headers and the body). The first request of each client is a warm-up and is not counted.

  python3 scripts/bench/first_token_latency.py --base-url http://127.0.0.1:8000 --model llama3-8b \\
      --input-len 512 --requests 50 [--json out.json]
"""
import argparse
import http.client
import json
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.parse
import urllib.request


def body(args, prompt, stream):
    return json.dumps({"model": args.model, "prompt": prompt, "max_tokens": args.output_len, "temperature": 0,
                       "ignore_eos": True, "stream": stream}).encode()


class KeepAliveClient:
    """One HTTP/1.1 connection kept alive across requests; the stream parsed as it arrives."""

    def __init__(self, host, port):
        self.sock = socket.create_connection((host, port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.host, self.port = host, port
        self.buffer = b""

    def _read(self):
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("server closed the connection")
        self.buffer += data

    def _line(self):
        while b"\r\n" not in self.buffer:
            self._read()
        line, self.buffer = self.buffer.split(b"\r\n", 1)
        return line

    def _exactly(self, n):
        while len(self.buffer) < n:
            self._read()
        data, self.buffer = self.buffer[:n], self.buffer[n:]
        return data

    def _headers(self):
        status = int(self._line().split()[1])
        headers = {}
        while True:
            line = self._line()
            if not line:
                return status, headers
            name, value = line.decode().split(":", 1)
            headers[name.strip().lower()] = value.strip()

    def request(self, path, payload):
        """Sends a POST; returns (seconds to the first body byte of a token event, whole body)."""
        request = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\nContent-Type: application/json\r\n"
                   f"Content-Length: {len(payload)}\r\nConnection: keep-alive\r\n\r\n").encode() + payload
        start = time.perf_counter()
        self.sock.sendall(request)
        status, headers = self._headers()
        if status != 200:
            raise RuntimeError(f"HTTP {status}")
        first, body = None, b""
        if headers.get("transfer-encoding") == "chunked":
            while True:
                size = int(self._line().split(b";")[0], 16)
                data = self._exactly(size)
                self._exactly(2)
                if size == 0:
                    break
                if first is None and b'"choices"' in data:
                    first = time.perf_counter() - start
                body += data
        else:
            body = self._exactly(int(headers["content-length"]))
            first = time.perf_counter() - start
        return first, body


def first_token_fresh(url, payload):
    start = time.perf_counter()
    request = urllib.request.Request(url, data=payload, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as response:
        for line in response:
            if line.startswith(b"data: {") and b'"choices"' in line:
                first = time.perf_counter() - start
                response.read()
                return first
    raise RuntimeError("no token event")


def first_token_curl(url, payload):
    start = time.perf_counter()
    process = subprocess.Popen(["curl", "-sN", "-H", "Content-Type: application/json", "--data-binary", "@-", url],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    process.stdin.write(payload)
    process.stdin.close()
    first = None
    for line in process.stdout:
        if first is None and line.startswith(b"data: {") and b'"choices"' in line:
            first = time.perf_counter() - start
    process.wait()
    return first


def run_aiohttp(url, payloads):
    import asyncio

    import aiohttp

    async def main():
        times = []
        async with aiohttp.ClientSession() as session:
            for payload in payloads:
                start = time.perf_counter()
                async with session.post(url, data=payload, headers={"Content-Type": "application/json"}) as r:
                    first = None
                    async for line in r.content:
                        if first is None and line.startswith(b"data: {") and b'"choices"' in line:
                            first = time.perf_counter() - start
                times.append(first)
        return times

    return asyncio.run(main())


def run_openai(base_url, model, prompts, args):
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="none", max_retries=0)
    times = []
    for prompt in prompts:
        start = time.perf_counter()
        stream = client.completions.create(model=model, prompt=prompt, max_tokens=args.output_len, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        first = None
        for chunk in stream:
            if first is None and chunk.choices:
                first = time.perf_counter() - start
        times.append(first)
    return times


def summary(times):
    ms = sorted(1000 * t for t in times[1:])  # the first is a warm-up
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p90_ms": ms[int(0.9 * (len(ms) - 1))],
            "min_ms": ms[0], "max_ms": ms[-1]}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input-len", type=int, default=512)
    parser.add_argument("--output-len", type=int, default=2)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--vocab", type=int, default=32000, help="random prompt ids are drawn below this")
    parser.add_argument("--clients", default="keepalive,fresh,whole,aiohttp,openai,curl")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()

    parsed = urllib.parse.urlparse(args.base_url)
    url = args.base_url + "/v1/completions"
    rng = random.Random(0)
    # A different prompt per request, so the prefix cache serves none of it.
    prompts = [[rng.randrange(1, args.vocab) for _ in range(args.input_len)] for _ in range(args.requests + 1)]
    results = {}
    for name in args.clients.split(","):
        try:
            if name == "keepalive":
                client = KeepAliveClient(parsed.hostname, parsed.port)
                times = [client.request("/v1/completions", body(args, p, True))[0] for p in prompts]
            elif name == "whole":
                client = KeepAliveClient(parsed.hostname, parsed.port)
                times = [client.request("/v1/completions", body(args, p, False))[0] for p in prompts]
            elif name == "fresh":
                times = [first_token_fresh(url, body(args, p, True)) for p in prompts]
            elif name == "aiohttp":
                times = run_aiohttp(url, [body(args, p, True) for p in prompts])
            elif name == "openai":
                times = run_openai(args.base_url, args.model, prompts, args)
            elif name == "curl":
                if not shutil.which("curl"):
                    raise ImportError("curl is not on PATH")
                times = [first_token_curl(url, body(args, p, True)) for p in prompts]
            else:
                raise SystemExit(f"unknown client {name}")
        except ImportError as e:
            print(f"{name:>9}: skipped ({e})")
            continue
        results[name] = summary(times)
        r = results[name]
        print(f"{name:>9}: first token p50 {r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms "
              f"(min {r['min_ms']:.2f}, max {r['max_ms']:.2f}, {r['n']} requests)")
        sys.stdout.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
