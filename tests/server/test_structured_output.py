#!/usr/bin/env python3
"""Structured output and forced tool calls end to end: `deepfuse serve` on the CPU reference
backend (or, with --backend cuda on a GPU machine, the CUDA engine) with the tiny random model,
driven by the `openai` client.

The model is random, so nothing it writes is valid by itself: every answer that parses and
validates here does so because the grammar (src/server/grammar, xgrammar) allowed nothing else.
Schemas keep every value bounded (enums, integer ranges, maxLength, maxItems), so an answer
always completes within max_tokens; the checks are strict (finish_reason "stop", the JSON parses
and validates), never "if it finished". The tiny model's chat template is Qwen2.5's (Hermes
<tool_call> tags), so tools render and parse as on a real checkpoint.

Run by ctest (tests/server/tests.cmake) with test_server.py's helpers and venv.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import unittest

import openai
from openai.lib.streaming.chat import ChatCompletionStreamState

import test_server
from structured_cases import CLOCK, ORDER_SCHEMA, WEATHER, use_qwen_template, validate
from test_server import Server

MODEL = None  # the tiny model with Qwen2.5's chat template

# The CUDA kernels take head_dim 64 or 128: the tiny preset's 16 is the reference backend's only.
CUDA_SHAPE = ["--hidden", "256", "--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--intermediate", "512"]


def make_model():
    """A tiny random model with room for the tools' system prompt (4096 positions) and Qwen2.5's
    chat template."""
    cuda = test_server.ARGS.backend == "cuda"
    # The served model's name is its folder's: the same for both shapes.
    path = os.path.join(test_server.ARGS.work_dir, *(["cuda"] if cuda else []), "tiny-qwen-template")
    if not os.path.exists(os.path.join(path, "config.json")):
        subprocess.run([test_server.ARGS.deepfuse, "make-model", "--out", path, "--max-position", "4096",
                        *(CUDA_SHAPE if cuda else [])], check=True, stdout=subprocess.DEVNULL)
    use_qwen_template(path, test_server.ARGS.fixtures)
    return path


def assemble(stream):
    state = ChatCompletionStreamState()
    chunks = 0
    for chunk in stream:
        state.handle_chunk(chunk)
        chunks += 1
    return state.get_final_completion(), chunks


class StructuredOutput(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = Server(command=[test_server.ARGS.deepfuse, "serve", "--model", MODEL,
                                                         "--backend", test_server.ARGS.backend, "--port", "0",
                                                         "--max-batch", "8"])
        cls.client = cls.server.client()

    @classmethod
    def tearDownClass(cls):
        cls.server.stop()

    def chat(self, content="Answer in JSON.", **kw):
        kw.setdefault("max_tokens", 300)
        return self.client.chat.completions.create(model="tiny-qwen-template",
                                                   messages=[{"role": "user", "content": content}], **kw)

    def completion(self, **kw):
        kw.setdefault("max_tokens", 300)
        return self.client.completions.create(model="tiny-qwen-template", prompt="JSON:", **kw)

    @staticmethod
    def gather(stream, piece):
        """Every choice's (text, finish_reason) from a stream's raw chunks."""
        texts, finishes = {}, {}
        for chunk in stream:
            for c in chunk.choices:
                texts[c.index] = texts.get(c.index, "") + (piece(c) or "")
                finishes[c.index] = c.finish_reason or finishes.get(c.index)
        return [(texts[i], finishes[i]) for i in sorted(texts)]

    def answers(self, response_format, sampling, **kw):
        """(text, finish_reason) of every way to ask: chat and completions, streamed and not."""
        chat = self.chat(response_format=response_format, **sampling, **kw)
        out = [(c.message.content, c.finish_reason) for c in chat.choices]
        # The openai client's completions take response_format as an extra field (vLLM's extension).
        text = self.completion(extra_body={"response_format": response_format}, **sampling, **kw)
        out += [(c.text, c.finish_reason) for c in text.choices]
        out += self.gather(self.chat(response_format=response_format, stream=True, **sampling, **kw),
                           lambda c: c.delta.content)
        out += self.gather(self.completion(extra_body={"response_format": response_format}, stream=True, **sampling,
                                           **kw), lambda c: c.text)
        return out

    def test_json_object_parses_whenever_it_ends(self):
        # Any object: a random model's strings can run past max_tokens (nothing bounds them), but
        # an answer that ends is a whole object, and most sampled ones end.
        ended = 0
        for text, finish in self.answers({"type": "json_object"}, dict(temperature=1.0, seed=11, n=4)):
            self.assertTrue(text.startswith("{"), text)
            if finish == "stop":
                self.assertIsInstance(json.loads(text), dict, text)
                ended += 1
            else:
                self.assertEqual(finish, "length", text)
        self.assertGreater(ended, 0)

    def test_json_schema_parses_and_validates(self):
        schema = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA, "strict": True}}
        texts = set()
        for sampling in (dict(temperature=0), dict(temperature=1.0, seed=7, n=3)):
            for text, finish in self.answers(schema, sampling):
                self.assertEqual(finish, "stop", text)
                validate(json.loads(text), ORDER_SCHEMA)
                texts.add(text)
        self.assertGreater(len(texts), 2)  # sampled answers differ: the grammar allows, the model chooses
        final, chunks = assemble(self.chat(response_format=schema, stream=True, temperature=0))
        self.assertGreater(chunks, 10)  # token by token, and the client's own stream helper reads it
        validate(json.loads(final.choices[0].message.content), ORDER_SCHEMA)

    def test_logprobs_of_a_constrained_answer(self):
        # Inside an enum most ids are left out: the alternatives listed are allowed ones only.
        schema = {"type": "json_schema", "json_schema": {"name": "order", "schema": ORDER_SCHEMA}}
        r = self.chat(response_format=schema, temperature=0, logprobs=True, top_logprobs=5)
        validate(json.loads(r.choices[0].message.content), ORDER_SCHEMA)
        tokens = r.choices[0].logprobs.content
        self.assertGreater(len(tokens), 10)
        self.assertTrue(any(len(t.top_logprobs) < 5 for t in tokens))  # forced tokens: fewer than asked
        for t in tokens:
            self.assertTrue(t.top_logprobs)
            self.assertGreaterEqual(t.logprob, t.top_logprobs[0].logprob - 1e-6)  # greedy: the most likely
            self.assertLessEqual(sum(math.exp(a.logprob) for a in t.top_logprobs), 1 + 1e-4)

    def test_unconstrained_answer_is_not_json(self):
        # The same model and prompt without a response format: what the grammar changes.
        text = self.chat(temperature=0, max_tokens=40).choices[0].message.content
        with self.assertRaises(ValueError):
            json.loads(text)

    def tools_chat(self, **kw):
        kw.setdefault("max_tokens", 200)
        messages = kw.pop("messages", [{"role": "user", "content": "What is the weather in Oslo?"}])
        return self.client.chat.completions.create(model="tiny-qwen-template", messages=messages,
                                                   tools=[WEATHER, CLOCK], **kw)

    def check_call(self, choice, names):
        self.assertEqual(choice.finish_reason, "tool_calls")
        self.assertFalse(choice.message.content)
        self.assertEqual(len(choice.message.tool_calls), 1)
        call = choice.message.tool_calls[0]
        self.assertIn(call.function.name, names)
        tool = {"get_weather": WEATHER, "get_time": CLOCK}[call.function.name]
        validate(json.loads(call.function.arguments), tool["function"]["parameters"])
        return call

    def test_required_and_named_tool_choices_always_call(self):
        for choice, names in (("required", {"get_weather", "get_time"}),
                              ({"type": "function", "function": {"name": "get_time"}}, {"get_time"}),
                              ({"type": "function", "function": {"name": "get_weather"}}, {"get_weather"})):
            with self.subTest(choice=choice):
                for sampling in (dict(temperature=0), dict(temperature=1.0, seed=3, n=2)):
                    for c in self.tools_chat(tool_choice=choice, **sampling).choices:
                        self.check_call(c, names)
                final, _ = assemble(self.tools_chat(tool_choice=choice, stream=True, temperature=0))
                self.check_call(final.choices[0], names)

    def test_auto_and_none_tool_choices(self):
        # auto: the model may answer or call; whichever it does is consistent.
        for c in self.tools_chat(tool_choice="auto", temperature=0).choices:
            if c.message.tool_calls:
                self.assertEqual(c.finish_reason, "tool_calls")
            else:
                self.assertIn(c.finish_reason, ("stop", "length"))
        r = self.tools_chat(tool_choice="none", temperature=0, max_tokens=20)
        self.assertFalse(r.choices[0].message.tool_calls)
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))

    def test_a_tool_loop_call_result_answer(self):
        messages = [{"role": "system", "content": "You can look up the weather."},
                    {"role": "user", "content": "Weather in Rome for 3 days?"}]
        first = self.tools_chat(messages=messages, tool_choice="required", temperature=0)
        call = self.check_call(first.choices[0], {"get_weather", "get_time"})
        messages.append(first.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": json.dumps({"forecast": "sun"})})
        # The answer after the tool result, constrained to JSON so it is checkable.
        schema = {"type": "object", "properties": {"summary": {"type": "string", "enum": ["sunny", "rainy"]}},
                  "required": ["summary"], "additionalProperties": False}
        second = self.client.chat.completions.create(
            model="tiny-qwen-template", messages=messages, tools=[WEATHER, CLOCK], tool_choice="auto", temperature=0,
            max_tokens=100, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        self.assertEqual(second.choices[0].finish_reason, "stop")
        validate(json.loads(second.choices[0].message.content), schema)
        # The template rendered the call and its result into the second prompt.
        self.assertGreater(second.usage.prompt_tokens, first.usage.prompt_tokens + 20)

    def test_malformed_and_unsupported_fields_are_400s_naming_them(self):
        chat = "/v1/chat/completions"
        user = [{"role": "user", "content": "x"}]
        schema_with = lambda extra: {"type": "json_schema", "json_schema": {  # noqa: E731
            "name": "s", "schema": {"type": "object", "properties": {"tags": {"type": "array", **extra}}}}}
        base = "response_format.json_schema.schema.properties.tags"
        cases = [
            ({"response_format": {"type": "xml"}}, "response_format.type"),
            ({"response_format": "json"}, "response_format"),
            ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
            ({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "response_format.json_schema.name"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "bad name!", "schema": {}}}},
             "response_format.json_schema.name"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": []}}},
             "response_format.json_schema.schema"),
            ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {}, "strict": "yes"}}},
             "response_format.json_schema.strict"),
            ({"response_format": {"type": "json_object", "schema": {}}}, "response_format.schema"),
            ({"response_format": schema_with({"uniqueItems": True})}, base + ".uniqueItems"),
            ({"response_format": schema_with({"contains": {"type": "integer"}})}, base + ".contains"),
            ({"response_format": schema_with({"items": {"not": {"type": "null"}}})}, base + ".items.not"),
            ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
            ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
             "tool_choice.function.name"),
            ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
            ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
             "response_format"),
            ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"x": {"type": "string", "pattern": "a+", "maxLength": 3}}}}}],
              "tool_choice": "required"}, "tools.[0].function.parameters.properties.x.maxLength"),
        ]
        for extra, param in cases:
            with self.subTest(param=param, body=extra):
                status, data = self.server.request("POST", chat, {"messages": user, **extra})
                self.assertEqual(status, 400, data[:300])
                self.assertEqual(json.loads(data)["error"]["param"], param, data[:300])
        status, data = self.server.request("POST", "/v1/completions", {
            "prompt": "x", "response_format": schema_with({"uniqueItems": True})})
        self.assertEqual((status, json.loads(data)["error"]["param"]), (400, base + ".uniqueItems"))
        with self.assertRaises(openai.BadRequestError) as refused:
            self.chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": {"if": {}}}})
        self.assertEqual(refused.exception.body["param"], "response_format.json_schema.schema.if")
        self.assertEqual(self.chat(max_tokens=3).usage.completion_tokens, 3)  # still serving


def main():
    global MODEL
    parser = argparse.ArgumentParser()
    parser.add_argument("--deepfuse", required=True)
    parser.add_argument("--work-dir", required=True)
    parser.add_argument("--fixtures", required=True, help="tests/fixtures")
    parser.add_argument("--backend", choices=("reference", "cuda"), default="reference",
                        help="cuda: on a GPU machine (scripts/device/serve-gpu.sh structured)")
    args, rest = parser.parse_known_args()
    test_server.ARGS = args
    os.makedirs(args.work_dir, exist_ok=True)
    MODEL = make_model()
    unittest.main(argv=[sys.argv[0], "-v", *rest])


if __name__ == "__main__":
    main()
