#!/usr/bin/env python3
"""End-to-end tests of `deepfuse serve` on the CPU reference backend with a tiny random model.

Run by ctest (tests/server/tests.cmake) with the venv that setup_venv.sh made: the `openai` client
for completions and chat, streamed and not; curl for the raw server-sent events; the standard
library's http.client for everything a client library would refuse to send (malformed bodies).
Each server runs on a free port; every wait is bounded.
"""
import argparse
import concurrent.futures
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import unittest

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

ARGS = None
TINY = None


def make_tiny_model():
    path = os.path.join(ARGS.work_dir, "tiny")
    if not os.path.exists(os.path.join(path, "config.json")):
        subprocess.run([ARGS.deepfuse, "make-model", "--out", path], check=True, stdout=subprocess.DEVNULL)
    return path


class Server:
    """A `deepfuse serve` process on a free port, ready when its 'ready' line is printed (or another
    command's `ready` line)."""

    def __init__(self, *extra, command=None, ready="ready:"):
        self.process = subprocess.Popen(
            command or [ARGS.deepfuse, "serve", "--model", TINY, "--backend", "reference", "--port", "0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines = []
        deadline = time.time() + 60
        self.port = None
        while time.time() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("server exited: " + "".join(self.lines))
            self.lines.append(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                self.port = int(m.group(1))
            if ready in line:
                break
        assert self.port, "no port line"
        # Keep draining the output so the server never blocks on a full pipe.
        self.reader = threading.Thread(target=self._drain, daemon=True)
        self.reader.start()
        self.base = f"http://127.0.0.1:{self.port}"

    def _drain(self):
        for line in self.process.stdout:
            self.lines.append(line)

    def client(self, api_key="none", **kw):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=api_key, timeout=120, max_retries=0, **kw)

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        data = r.read()
        conn.close()
        return r.status, data

    def metrics(self):
        status, data = self.request("GET", "/metrics")
        assert status == 200
        values = {}
        for line in data.decode().splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                values[name] = float(value)
        return values

    def wait_idle(self, seconds=20):
        deadline = time.time() + seconds
        while time.time() < deadline:
            m = self.metrics()
            if m["deepfuse_sequences_running"] == 0 and m["deepfuse_sequences_waiting"] == 0 \
                    and m["deepfuse_kv_pages_used"] == 0:
                return m
            time.sleep(0.05)
        raise AssertionError(f"server not idle after {seconds} s: {self.metrics()}")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                raise
        self.reader.join(10)
        self.process.stdout.close()


def greedy(client, prompt, max_tokens=16, **kw):
    return client.completions.create(model="tiny", prompt=prompt, max_tokens=max_tokens, temperature=0, **kw)


class MainServer(unittest.TestCase):
    """One server for the API, concurrency, prefix cache and bad requests."""

    @classmethod
    def setUpClass(cls):
        cls.server = Server("--max-batch", "8", "--max-step-tokens", "64")
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def test_a_second_server_on_the_same_port_fails(self):
        out = subprocess.run([ARGS.deepfuse, "serve", "--model", TINY, "--backend", "reference", "--port",
                              str(self.server.port)], capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 2, out.stdout + out.stderr)
        self.assertIn("address in use", out.stderr)

    def test_health_and_models(self):
        status, body = self.server.request("GET", "/health")
        self.assertEqual(status, 200)
        self.assertEqual(json.loads(body)["status"], "ok")
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["tiny"])

    def test_completion_streamed_and_not_agree(self):
        whole = greedy(self.client, "Once upon a time", max_tokens=12, extra_body={"ignore_eos": True})
        self.assertEqual(whole.object, "text_completion")
        self.assertEqual(whole.choices[0].finish_reason, "length")
        self.assertEqual(whole.usage.completion_tokens, 12)
        self.assertGreater(whole.usage.prompt_tokens, 0)
        self.assertEqual(whole.usage.total_tokens, whole.usage.prompt_tokens + 12)
        stream = greedy(self.client, "Once upon a time", max_tokens=12, stream=True,
                        stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        chunks = list(stream)
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        self.assertEqual(text, whole.choices[0].text)
        self.assertEqual([c.choices[0].finish_reason for c in chunks if c.choices][-1], "length")
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, 12)

    def test_chat_streamed_and_not_agree(self):
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}]
        whole = self.client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0)
        self.assertEqual(whole.object, "chat.completion")
        self.assertEqual(whole.choices[0].message.role, "assistant")
        self.assertIn(whole.choices[0].finish_reason, ("stop", "length"))
        stream = self.client.chat.completions.create(model="tiny", messages=messages, max_tokens=10, temperature=0,
                                                     stream=True)
        chunks = list(stream)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks)
        self.assertEqual(text, whole.choices[0].message.content)
        self.assertEqual(chunks[-1].choices[0].finish_reason, whole.choices[0].finish_reason)

    def test_metadata_fields_and_plain_defaults_are_accepted(self):
        r = self.client.chat.completions.create(
            model="tiny", messages=[{"role": "developer", "content": "Be brief."},
                                    {"role": "user", "content": [{"type": "text", "text": "Hello"}], "name": "ann"}],
            max_completion_tokens=3, temperature=0, user="u-1", metadata={"team": "agents"}, store=False,
            service_tier="auto", response_format={"type": "text"}, logit_bias={}, parallel_tool_calls=True,
            extra_body={"ignore_eos": True})
        self.assertEqual(r.usage.completion_tokens, 3)

    def test_max_completion_tokens_and_n(self):
        r = self.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_completion_tokens=5, n=3, temperature=1.0, seed=3,
                                                extra_body={"ignore_eos": True})
        self.assertEqual(len(r.choices), 3)
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1, 2])
        self.assertEqual(r.usage.completion_tokens, 15)

    def test_seeded_sampling_is_reproducible(self):
        kw = dict(model="tiny", prompt="The sea", max_tokens=10, temperature=0.9, top_p=0.9, seed=42,
                  extra_body={"top_k": 50, "min_p": 0.01, "ignore_eos": True})
        a = self.client.completions.create(**kw).choices[0].text
        b = self.client.completions.create(**kw).choices[0].text
        self.assertEqual(a, b)

    def test_stop_string_spanning_tokens_is_not_leaked(self):
        full = greedy(self.client, "Stop test: the", max_tokens=24, extra_body={"ignore_eos": True}).choices[0].text
        self.assertGreater(len(full), 8)
        stop = full[3:7]  # most likely spans a token boundary; either way it must be honoured
        expected = full[:full.index(stop)]
        r = greedy(self.client, "Stop test: the", max_tokens=24, stop=[stop], extra_body={"ignore_eos": True})
        self.assertEqual(r.choices[0].text, expected)
        self.assertEqual(r.choices[0].finish_reason, "stop")
        streamed = greedy(self.client, "Stop test: the", max_tokens=24, stop=stop, stream=True,
                          extra_body={"ignore_eos": True})
        chunks = list(streamed)
        self.assertEqual("".join(c.choices[0].text for c in chunks), expected)
        self.assertEqual(chunks[-1].choices[0].finish_reason, "stop")

    def test_logprobs(self):
        r = greedy(self.client, "Numbers:", max_tokens=4, logprobs=3, extra_body={"ignore_eos": True})
        lp = r.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 4)
        self.assertEqual(len(lp.token_logprobs), 4)
        self.assertTrue(all(1 <= len(t) <= 3 for t in lp.top_logprobs))
        self.assertTrue(all(x <= 0 for x in lp.token_logprobs))
        # Greedy picks the most likely token: no alternative beats it. (Tokens of the tiny byte-level
        # vocabulary may share a text, so the top dict can hold fewer entries.)
        for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
            self.assertGreaterEqual(chosen + 1e-5, max(top.values()))
        c = self.client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}],
                                                max_tokens=3, temperature=0, logprobs=True, top_logprobs=2,
                                                extra_body={"ignore_eos": True})
        content = c.choices[0].logprobs.content
        self.assertEqual(len(content), 3)
        self.assertEqual(len(content[0].top_logprobs), 2)

    def test_raw_sse_framing_with_curl(self):
        body = json.dumps({"model": "tiny", "prompt": "Hello", "max_tokens": 5, "temperature": 0, "stream": True,
                           "ignore_eos": True})
        out = subprocess.run(["curl", "-sN", "--max-time", "60", "-H", "Content-Type: application/json", "-d", body,
                              self.server.base + "/v1/completions"], capture_output=True, text=True, check=True).stdout
        self.assertTrue(out.endswith("data: [DONE]\n\n"), out[-200:])
        events = [e for e in out.split("\n\n") if e]
        for event in events:
            self.assertTrue(event.startswith("data: "), event)
            self.assertNotIn("\n", event)
        payloads = [json.loads(e[len("data: "):]) for e in events[:-1]]
        self.assertEqual(len(payloads), 6)  # one chunk per token, then one with the finish reason
        self.assertTrue(all(p["choices"][0]["finish_reason"] is None for p in payloads[:5]))
        self.assertEqual(payloads[-1]["choices"][0]["finish_reason"], "length")
        # The last chunk carries whatever text was held back (the end of a character), if any.
        whole = greedy(self.client, "Hello", max_tokens=5, extra_body={"ignore_eos": True}).choices[0].text
        self.assertEqual("".join(p["choices"][0]["text"] for p in payloads), whole)
        self.assertTrue(all(p["object"] == "text_completion" for p in payloads))

    def test_64_concurrent_streams_match_their_solo_outputs(self):
        prompts = [f"Stream {i}: once upon a time" for i in range(8)]
        solo = {p: greedy(self.client, p, max_tokens=16, extra_body={"ignore_eos": True}).choices[0].text
                for p in prompts}

        def stream(i):
            client = self.server.client()
            p = prompts[i % len(prompts)]
            chunks = list(greedy(client, p, max_tokens=16, stream=True, extra_body={"ignore_eos": True}))
            return p, "".join(c.choices[0].text for c in chunks), chunks[-1].choices[0].finish_reason

        start = time.time()
        with concurrent.futures.ThreadPoolExecutor(64) as pool:
            results = list(pool.map(stream, range(64), timeout=300))
        self.assertLess(time.time() - start, 300)
        self.assertEqual(len(results), 64)
        for p, text, finish in results:
            self.assertEqual(finish, "length")
            self.assertEqual(text, solo[p], p)
        metrics = self.server.wait_idle()
        self.assertEqual(metrics["deepfuse_kv_pages_used"], 0)
        self.assertEqual(self.server.request("GET", "/health")[0], 200)

    def test_prefix_cache_reports_cached_tokens_and_same_output(self):
        history = "agent loop history %d: " % time.time_ns() + "the quick brown fox jumps over the lazy dog. " * 8
        first = greedy(self.client, history + "Question one?", max_tokens=8, extra_body={"ignore_eos": True})
        second = greedy(self.client, history + "Question one?", max_tokens=8, extra_body={"ignore_eos": True})
        self.assertEqual(first.usage.prompt_tokens_details.cached_tokens, 0)
        cached = second.usage.prompt_tokens_details.cached_tokens
        self.assertGreaterEqual(cached, 16 * ((first.usage.prompt_tokens - 1) // 16))
        self.assertEqual(second.choices[0].text, first.choices[0].text)
        other = greedy(self.client, history + "Another question entirely", max_tokens=8, stream=True,
                       stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        usage = list(other)[-1].usage
        self.assertGreater(usage.prompt_tokens_details.cached_tokens, 0)
        m = self.server.metrics()
        self.assertGreater(m["deepfuse_prefix_cache_hits_total"], 0)

    def test_cancelled_stream_frees_its_pages(self):
        # Closing the connection cancels a running stream. On a loaded machine the tiny model can
        # finish all its tokens before the server's writer sees the closed socket (finish_reason
        # "length", also correct), so this tries a few streams and needs at least one cancelled.
        key = 'deepfuse_requests_total{finish_reason="cancelled"}'
        before = self.server.metrics().get(key, 0)
        for attempt in range(6):
            conn = http.client.HTTPConnection("127.0.0.1", self.server.port, timeout=30)
            conn.request("POST", "/v1/completions", body=json.dumps(
                {"model": "tiny", "prompt": "cancel me %d" % attempt, "max_tokens": 400, "temperature": 0,
                 "stream": True, "ignore_eos": True}), headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            self.assertEqual(r.status, 200)
            r.fp.readline()  # the first event
            conn.sock.shutdown(2)
            conn.close()
            self.server.wait_idle(20)  # every page back, whichever way the stream ended
            if self.server.metrics().get(key, 0) > before:
                break
        self.assertGreater(self.server.metrics().get(key, 0), before, "no stream was cancelled in 6 tries")

    def test_first_token_is_not_held_back_on_a_kept_alive_connection(self):
        """aiohttp keeps connections alive; the client then delays its ACKs, and with
        Nagle's algorithm on, the server's second small write (the first token after the headers,
        or a whole response's body) waited for that ACK: ~40 ms. TCP_NODELAY removes the wait, so a
        kept-alive connection is as quick as a fresh one (urllib's pattern)."""
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "bench"))
        import first_token_latency as probe
        args = argparse.Namespace(model="tiny", output_len=1)
        rng = random.Random(time.time_ns())
        def prompts():  # fresh ids each time: the prefix cache must not favour one client
            return [[rng.randrange(1, 256) for _ in range(24)] for _ in range(13)]
        client = probe.KeepAliveClient("127.0.0.1", self.server.port)
        kept = [client.request("/v1/completions", probe.body(args, p, True))[0] for p in prompts()]
        whole = [client.request("/v1/completions", probe.body(args, p, False))[0] for p in prompts()]
        fresh = [probe.first_token_fresh(self.server.base + "/v1/completions", probe.body(args, p, True))
                 for p in prompts()]
        kept, whole, fresh = (statistics.median(t[1:]) for t in (kept, whole, fresh))  # the first warms up
        print(f"first token p50: kept-alive {1000 * kept:.1f} ms, fresh connection {1000 * fresh:.1f} ms; "
              f"whole response on a kept-alive connection {1000 * whole:.1f} ms", file=sys.stderr)
        self.assertLess(kept, fresh + 0.015)
        self.assertLess(whole, fresh + 0.015)

    def test_metrics_exposition(self):
        greedy(self.client, "metrics", max_tokens=2)
        m = self.server.metrics()
        for name in ["deepfuse_prompt_tokens_total", "deepfuse_generation_tokens_total",
                     "deepfuse_time_to_first_token_seconds_count", "deepfuse_inter_token_latency_seconds_count",
                     "deepfuse_sequences_running", "deepfuse_sequences_waiting", "deepfuse_kv_pages_used",
                     "deepfuse_kv_pages_total", "deepfuse_prefix_cache_hits_total", "deepfuse_preemptions_total"]:
            self.assertIn(name, m)
        self.assertGreater(m["deepfuse_generation_tokens_total"], 0)

    def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(self):
        ids_over_context = list(range(1, 300)) * 2  # 598 ids, the tiny model's context is 512
        cases = [
            ("malformed JSON", "/v1/completions", '{"prompt": "x", ', 400, None),
            ("body not an object", "/v1/completions", "[1, 2]", 400, None),
            ("wrong type", "/v1/completions", {"prompt": "x", "temperature": "hot"}, 400, "temperature"),
            ("wrong type max_tokens", "/v1/completions", {"prompt": "x", "max_tokens": "9"}, 400, "max_tokens"),
            ("missing prompt", "/v1/completions", {"model": "tiny"}, 400, "prompt"),
            ("missing messages", "/v1/chat/completions", {"model": "tiny"}, 400, "messages"),
            ("unknown model", "/v1/completions", {"model": "gpt-4", "prompt": "x"}, 404, "model"),
            ("max_tokens 0", "/v1/completions", {"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
            ("max_tokens negative", "/v1/completions", {"prompt": "x", "max_tokens": -3}, 400, "max_tokens"),
            ("max_tokens beyond context", "/v1/completions", {"prompt": "x", "max_tokens": 100000}, 400, "max_tokens"),
            ("prompt over context", "/v1/completions", {"prompt": ids_over_context}, 400, "prompt"),
            ("token id out of range", "/v1/completions", {"prompt": [1, 2, 320]}, 400, "prompt"),
            ("negative token id", "/v1/completions", {"prompt": [-5]}, 400, "prompt"),
            ("invalid UTF-8", "/v1/completions", b'{"prompt": "\xff\xfe bad"}', 400, None),
            ("10 MB body", "/v1/completions", '{"prompt": "' + "a" * (10 << 20) + '"}', 413, None),
            ("unknown endpoint", "/v1/embeddings", {"input": "x"}, 404, None),
            ("unknown role", "/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400,
             "messages.[0].role"),
            ("image part", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
             "messages.[0].content.[0].type"),
            ("tool message without its call id", "/v1/chat/completions",
             {"messages": [{"role": "tool", "content": "21"}]}, 400, "messages.[0].tool_call_id"),
            ("schema keyword not enforced", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {
                 "name": "s", "schema": {"type": "array", "uniqueItems": True}}}}, 400,
             "response_format.json_schema.schema.uniqueItems"),
            ("logit_bias not implemented", "/v1/completions", {"prompt": "x", "logit_bias": {"5": 3}}, 400,
             "logit_bias"),
            ("unknown field", "/v1/completions", {"prompt": "x", "temprature": 0.5}, 400, "temprature"),
            ("temperature above 2", "/v1/completions", {"prompt": "x", "temperature": 2.5}, 400, "temperature"),
            ("stream_options without stream", "/v1/completions",
             {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
            ("tools on a template that renders none", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER_TOOL]}, 400, "tools"),
        ]
        for name, path, body, status, param in cases:
            with self.subTest(name):
                got, data = self.server.request("POST", path, body)
                self.assertEqual(got, status, data[:300])
                error = json.loads(data)["error"]
                self.assertEqual(set(error), {"message", "type", "param", "code"})
                self.assertTrue(error["message"])
                self.assertNotIn("\n", error["message"])
                if param:
                    self.assertEqual(error["param"], param)
        # The openai client surfaces them as its own exceptions.
        with self.assertRaises(openai.NotFoundError):
            self.client.completions.create(model="nope", prompt="x", max_tokens=2)
        with self.assertRaises(openai.BadRequestError):
            self.client.completions.create(model="tiny", prompt="x", max_tokens=0)
        with self.assertRaises(openai.BadRequestError) as refused:
            self.client.chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
        self.assertEqual(refused.exception.body["param"], "messages.[0].role")
        self.assertEqual(self.server.request("GET", "/health")[0], 200)
        self.assertEqual(greedy(self.client, "still here", max_tokens=3).usage.completion_tokens, 3)
        self.assertEqual(self.server.request("GET", "/nowhere")[0], 404)


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


def script(text):
    """A user message that makes the scripted model answer `text`."""
    return {"role": "user", "content": f"SCRIPT:{text}:END"}


def scripted_server(fixture):
    """tests/server/scripted_server.cpp on the tiny tokenizer with the chat template of a fixture."""
    model = os.path.join(ARGS.work_dir, "tiny-template-" + fixture)
    os.makedirs(model, exist_ok=True)
    with open(os.path.join(TINY, "tokenizer_config.json")) as f:
        config = json.load(f)
    with open(os.path.join(ARGS.fixtures, "tokenizers", fixture, "tokenizer_config.json")) as f:
        config["chat_template"] = json.load(f)["chat_template"]
    with open(os.path.join(model, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    shutil.copy(os.path.join(TINY, "tokenizer.json"), model)
    return Server(command=[ARGS.scripted_server, "--model", model, "--port", "0"], ready="listening on")


def hermes_call(name, arguments):
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


class ToolCalls(unittest.TestCase):
    """Tool calls end to end with the `openai` client. The chat template is Qwen2.5's (Hermes
    <tool_call> tags) on the tiny tokenizer; the model is tests/server/scripted_server.cpp, which
    answers what the prompt's SCRIPT: ... :END says, so every call is well-formed (or malformed)
    on purpose. The server code is deepfuse serve's: parsing, rendering, parsers, streaming."""

    @classmethod
    def setUpClass(cls):
        cls.server = scripted_server("qwen2_bytelevel")
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat(self, messages, **kw):
        return self.client.chat.completions.create(model="scripted", messages=messages, tools=[WEATHER_TOOL, TIME_TOOL],
                                                   max_tokens=400, **kw)

    def streamed(self, messages, **kw):
        state = ChatCompletionStreamState()
        chunks = 0
        for chunk in self.chat(messages, stream=True, **kw):
            state.handle_chunk(chunk)
            chunks += 1
        return state.get_final_completion(), chunks

    def test_a_call_is_parsed_streamed_or_not(self):
        messages = [script(hermes_call("get_weather", {"city": "Paris"}))]
        whole = self.chat(messages)
        streamed, chunks = self.streamed(messages)
        self.assertGreater(chunks, 10)  # token by token
        for r in (whole, streamed):
            choice = r.choices[0]
            self.assertEqual(choice.finish_reason, "tool_calls")
            self.assertFalse(choice.message.content)
            self.assertEqual(len(choice.message.tool_calls), 1)
            call = choice.message.tool_calls[0]
            self.assertEqual(call.type, "function")
            self.assertEqual(call.function.name, "get_weather")
            self.assertEqual(json.loads(call.function.arguments), {"city": "Paris"})
            self.assertTrue(call.id.startswith("call_"), call.id)

    def test_content_then_two_calls_and_parallel_off(self):
        text = "Checking both. " + hermes_call("get_weather", {"city": "Paris"}) + "\n" + \
            hermes_call("get_time", {"city": "Paris"})
        for r in (self.chat([script(text)]), self.streamed([script(text)])[0]):
            message = r.choices[0].message
            self.assertEqual(message.content, "Checking both. ")
            self.assertEqual([c.function.name for c in message.tool_calls], ["get_weather", "get_time"])
            self.assertEqual(len({c.id for c in message.tool_calls}), 2)
        for r in (self.chat([script(text)], parallel_tool_calls=False),
                  self.streamed([script(text)], parallel_tool_calls=False)[0]):
            self.assertEqual([c.function.name for c in r.choices[0].message.tool_calls], ["get_weather"])

    def test_a_malformed_call_is_content(self):
        text = '<tool_call>{"name": 3}</tool_call>'
        for r in (self.chat([script(text)]), self.streamed([script(text)])[0]):
            self.assertEqual(r.choices[0].finish_reason, "stop")
            self.assertEqual(r.choices[0].message.content, text)
            self.assertFalse(r.choices[0].message.tool_calls)

    def test_tool_choice_none_and_no_tools_parse_nothing(self):
        text = hermes_call("get_weather", {"city": "Paris"})
        r = self.chat([script(text)], tool_choice="none")
        self.assertEqual(r.choices[0].message.content, text)
        r = self.client.chat.completions.create(model="scripted", messages=[script(text)], max_tokens=400)
        self.assertEqual(r.choices[0].message.content, text)
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_a_tool_loop_call_result_answer(self):
        messages = [{"role": "system", "content": "You can look up the weather."},
                    script(hermes_call("get_weather", {"city": "Paris"}))]
        first = self.chat(messages)
        call = first.choices[0].message.tool_calls[0]
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": "SCRIPT:It is 21 C in Paris.:END"})
        second = self.chat(messages)
        self.assertEqual(second.choices[0].finish_reason, "stop")
        self.assertEqual(second.choices[0].message.content, "It is 21 C in Paris.")
        self.assertGreater(second.usage.prompt_tokens, first.usage.prompt_tokens + 20)


class ToolLoopsOnMistralAndLlamaTemplates(unittest.TestCase):
    """A tool loop (call, result, answer) in the Mistral and Llama 3.1 formats: each call parsed,
    then sent back and rendered by its template (Mistral's demands 9-character call ids)."""

    def loop(self, fixture, call_text, id_length):
        server = scripted_server(fixture)
        try:
            client = server.client()
            messages = [script(call_text)]
            calls = []
            for stream in (False, True):
                kw = dict(model="scripted", messages=messages, tools=[WEATHER_TOOL], max_tokens=400)
                if stream:
                    state = ChatCompletionStreamState()
                    for chunk in client.chat.completions.create(stream=True, **kw):
                        state.handle_chunk(chunk)
                    r = state.get_final_completion()
                else:
                    r = client.chat.completions.create(**kw)
                self.assertEqual(r.choices[0].finish_reason, "tool_calls")
                call = r.choices[0].message.tool_calls[0]
                self.assertEqual((call.function.name, json.loads(call.function.arguments)),
                                 ("get_weather", {"city": "Paris"}))
                self.assertEqual(len(call.id), id_length)
                calls.append(r)
            messages.append(calls[0].choices[0].message.model_dump(exclude_none=True))
            messages.append({"role": "tool", "tool_call_id": calls[0].choices[0].message.tool_calls[0].id,
                             "content": "SCRIPT:It is 21 C in Paris.:END"})
            answer = client.chat.completions.create(model="scripted", messages=messages, tools=[WEATHER_TOOL],
                                                    max_tokens=400)
            self.assertEqual(answer.choices[0].message.content, "It is 21 C in Paris.")
            self.assertEqual(answer.choices[0].finish_reason, "stop")
        finally:
            server.stop()

    def test_mistral(self):
        self.loop("mistral_metaspace", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]', 9)

    def test_llama3(self):
        self.loop("llama3_bytelevel", '{"name": "get_weather", "parameters": {"city": "Paris"}}', 29)


class Speculative(unittest.TestCase):
    """`--speculative suffix` on the reference backend: every text as without it (greedy, sampled
    with a seed, with penalties), batched, repeated (drafts from the suffix cache) and opted out per
    request, with the same logprobs; the drafts counted in /metrics; usage unchanged."""

    def test_same_text_with_drafts_verified_and_counted(self):
        plain, spec = Server("--max-batch", "4"), Server("--max-batch", "4", "--speculative", "suffix")
        try:
            prompts = [f"Speculate {i}: " + "a rose is a rose is " * (i + 1) for i in range(4)]
            kw = dict(max_tokens=40, extra_body={"ignore_eos": True})
            want = [greedy(plain.client(), p, **kw) for p in prompts]
            for _ in range(2):  # the second round repeats each request: proposed from the cache
                with concurrent.futures.ThreadPoolExecutor(4) as pool:
                    got = list(pool.map(lambda p: greedy(spec.client(), p, **kw), prompts, timeout=300))
                self.assertEqual([r.choices[0].text for r in got], [r.choices[0].text for r in want])
                self.assertEqual([r.usage.completion_tokens for r in got], [40] * 4)
            m = spec.wait_idle()
            self.assertGreater(m["deepfuse_spec_accepted_tokens_total"], 0)
            self.assertGreaterEqual(m["deepfuse_spec_draft_tokens_total"], m["deepfuse_spec_accepted_tokens_total"])
            self.assertEqual(m["deepfuse_generation_tokens_total"], 4 * 2 * 40)
            self.assertEqual(plain.metrics()["deepfuse_spec_draft_tokens_total"], 0)
            opted_out = greedy(spec.client(), prompts[0], max_tokens=40,
                               extra_body={"ignore_eos": True, "speculative": False})
            self.assertEqual(opted_out.choices[0].text, want[0].choices[0].text)
            self.assertEqual(spec.metrics()["deepfuse_spec_draft_tokens_total"], m["deepfuse_spec_draft_tokens_total"])
            sampled = dict(model="tiny", prompt=prompts[1], max_tokens=30, temperature=0.9, seed=11,
                           extra_body={"ignore_eos": True})
            self.assertEqual(spec.client().completions.create(**sampled).choices[0].text,
                             plain.client().completions.create(**sampled).choices[0].text)
            # Penalties over the accepted drafts and logprobs of each verified row: as without drafts.
            penalized = dict(model="tiny", prompt=prompts[2], max_tokens=30, temperature=0, presence_penalty=0.4,
                             frequency_penalty=0.3, logprobs=3, extra_body={"ignore_eos": True})
            a, b = spec.client().completions.create(**penalized), plain.client().completions.create(**penalized)
            self.assertEqual(a.choices[0].text, b.choices[0].text)
            self.assertEqual(a.choices[0].logprobs.token_logprobs, b.choices[0].logprobs.token_logprobs)
            self.assertEqual(a.choices[0].logprobs.top_logprobs, b.choices[0].logprobs.top_logprobs)
            status, data = spec.request("POST", "/v1/completions", {"prompt": "x", "speculative": "yes"})
            self.assertEqual(status, 400, data)
        finally:
            plain.stop()
            spec.stop()


class PreemptionAndShutdown(unittest.TestCase):
    """A server with a small KV cache and an API key: preemption, 401, SIGTERM."""

    def test_small_cache_preempts_and_every_stream_still_matches_alone(self):
        server = Server("--kv-pages", "24", "--max-batch", "6", "--max-step-tokens", "48", "--api-key", "sekrit")
        try:
            status, data = server.request("POST", "/v1/completions", {"prompt": "x"})
            self.assertEqual(status, 401)
            self.assertEqual(json.loads(data)["error"]["code"], "invalid_api_key")
            with self.assertRaises(openai.AuthenticationError):
                server.client(api_key="wrong").completions.create(model="tiny", prompt="x", max_tokens=2)
            client = server.client(api_key="sekrit")
            prompts = [f"Preempt {i}: " + "a long enough prompt " * 3 for i in range(6)]
            solo = {p: greedy(client, p, max_tokens=120, extra_body={"ignore_eos": True}).choices[0].text
                    for p in prompts}
            with concurrent.futures.ThreadPoolExecutor(6) as pool:
                texts = list(pool.map(lambda p: greedy(client, p, max_tokens=120, extra_body={"ignore_eos": True})
                                      .choices[0].text, prompts, timeout=300))
            self.assertEqual(texts, [solo[p] for p in prompts])
            m = server.wait_idle()
            self.assertGreater(m["deepfuse_preemptions_total"], 0)
            # A request that could never fit in the cache (24 pages, 384 tokens) is refused at once.
            with self.assertRaises(openai.BadRequestError):
                client.completions.create(model="tiny", prompt="x", max_tokens=450)
        finally:
            server.stop()
        self.assertEqual(server.process.returncode, 0)

    def test_sigterm_finishes_running_streams_and_exits_0(self):
        server = Server()
        client = server.client()
        stream = greedy(client, "Shutdown:", max_tokens=300, stream=True, stream_options={"include_usage": True},
                        extra_body={"ignore_eos": True})
        first = next(iter(stream))
        self.assertTrue(first.choices)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.2)
        # No new work is admitted once shutting down.
        try:
            status, _ = server.request("POST", "/v1/completions", {"prompt": "late", "max_tokens": 2})
            self.assertEqual(status, 503)
        except (ConnectionError, OSError):
            pass  # already stopped listening
        rest = list(stream)
        self.assertEqual(rest[-2].choices[0].finish_reason, "length")
        self.assertEqual(rest[-1].usage.completion_tokens, 300)
        self.assertEqual(server.process.wait(60), 0)
        server.stop()
        self.assertIn("stopped", "".join(server.lines))


def main():
    global ARGS, TINY
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepfuse", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--scripted-server", required=True, help="tests/server/scripted_server.cpp's binary")
    parser.add_argument("--fixtures", required=True, help="tests/fixtures")
    ARGS, rest = parser.parse_known_args()
    os.makedirs(ARGS.work_dir, exist_ok=True)
    TINY = make_tiny_model()
    unittest.main(argv=[sys.argv[0], "-v", *rest])


if __name__ == "__main__":
    main()
