#!/usr/bin/env python3
"""Builds the tokenizer parity fixtures under tests/fixtures/tokenizers/ with the real Hugging Face
`tokenizers` library (pip install tokenizers jinja2). For each kind of tokenizer deepfuse supports
it trains a small one, saves tokenizer.json + tokenizer_config.json (with a chat template), and
records in expected.json the ids HF produces for a varied corpus (with and without special
tokens), HF's decode of them, and the chat renderings jinja2 produces the way transformers
renders chat templates. ctest compares deepfuse against these; no Python is needed at test time.

    python3 scripts/make_tokenizer_fixtures.py [OUT_DIR]
"""
import json
import os
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_fixture_templates as templates  # noqa: E402

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")

TRAINING_TEXT = """The quick brown fox jumps over the lazy dog. It's a sunny day and we're going to the park.
I'll bring sandwiches, you'll bring drinks, and they've promised to bring a ball. Don't be late!
Tokenizers split text into pieces; byte pair encoding merges the most frequent pairs first.
Numbers like 2024, 3.14159 and 1,000,000 appear in text, as do emails like someone@example.com.
def tokenize(text):\n    return [piece for piece in text.split() if piece]\n
The weather today: sunny, 25 degrees. Tomorrow: rain, 18 degrees. Hello world, hello again.
User: Hi there! Assistant: Hello! How can I help you today? User: Tell me a story about a dragon.
Once upon a time, in a kingdom far away, there lived a dragon who loved reading books.
Café, naïve, résumé and façade keep their accents. Über Straße. ¿Qué tal? Ça va bien.
"""

CORPUS = [
    "", "a", " ", "   ", "\n", "Hello world", "Hello, world! How's it going? I'm fine; they'll see, we've done it.",
    "DON'T SHOUT, I'LL STOP. She'S here", "  leading spaces", "trailing spaces   ", "naïve café résumé Zoë façade",
    "ÀÉÎÕÜ àéîõü ß ẞ Ωμέγα", "日本語のテキストです。中文也可以。", "한국어 텍스트", "مرحبا بالعالم",
    "emoji 😀👍🏽 family 👨‍👩‍👧‍👦 flag 🇯🇵 done", "😀", "non\u00a0breaking\u00a0space", "ideographic\u3000space\u3000here",
    "tabs\tand\t\tmore\t", "lines\n\n\nruns\r\n\r\nend\n", "\n\n\n\n", "digits 1234567890 3.14159 and 12,345 x2y",
    "def f(x):\n    return x**2  # square\n", "URL https://example.com/path?q=1&r=2 #tag @user",
    "supercalifragilisticexpialidocious", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "e\u0301 combining acute, cafe\u0301 decomposed", "zero\u200bwidth\u200djoiner", "mixed 中文 and English 123",
    "mongolian  \u180e vowel separator \u180e\u180e  x", "line\u2028separator and next\x85line",
]



def mixed_text(seed, length):
    """Seeded random text over a mixed alphabet: letters, accents, CJK, emoji, ZWJ, digits,
    punctuation and every kind of space, so regex and merge edge cases meet each other."""
    import random
    rng = random.Random(seed)
    alphabet = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJ0123456789") + list(".,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`")
                + ["é", "ß", "ñ", "Ω", "ж", "日", "本", "語", "中", "한", "😀", "👍", "🏽", "\u200d", "\u0301"]
                + [" ", " ", " ", " ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00a0", "\u3000", "'s", "'ll", "'T"])
    return "".join(rng.choice(alphabet) for _ in range(length))


CORPUS += [TRAINING_TEXT, mixed_text(1, 600), mixed_text(2, 600), mixed_text(3, 80)]


def byte_level(pattern, specials, extra_added, bos):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TRAINING_TEXT] * 3 + CORPUS, trainer)
    if bos:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                          special_tokens=[(bos, tok.token_to_id(bos))])])
    else:
        tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_tokens(extra_added)
    return tok


def sentencepiece_style(metaspace, drop_bytes, extra_added):
    """BPE over '▁'-marked text with <0xNN> byte fallback, like Llama 2 (Prepend + Replace
    normalizers) or Mistral (Metaspace pre-tokenizer). drop_bytes removes byte tokens so that
    some characters fall to a fused <unk>."""
    trainer_tok = Tokenizer(models.BPE())
    trainer_tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True)
    trainer = trainers.BpeTrainer(vocab_size=600, show_progress=False, limit_alphabet=80)
    trainer_tok.train_from_iterator([TRAINING_TEXT] * 3, trainer)
    trained = json.loads(trainer_tok.to_str())["model"]

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        if b not in drop_bytes:
            vocab[f"<0x{b:02X}>"] = len(vocab)
    for token in sorted(trained["vocab"], key=trained["vocab"].get):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in trained["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    if metaspace:
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                     decoders.Strip(content=" ", left=1, right=0)])
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A <s> $B",
                                                       special_tokens=[("<s>", 1)])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ["<unk>", "<s>", "</s>"]])
    tok.add_tokens(extra_added)
    return tok


def render_chat(template, messages, add_generation_prompt, bos, eos, extra):
    """Renders like transformers' apply_chat_template (same environment and helpers)."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return {"expected": env.from_string(template).render(
            messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos, eos_token=eos, **extra)}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e)}


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"}},
                   "required": ["city"]}}}

CONVERSATIONS = [
    ({"messages": [{"role": "user", "content": "Hi there!"}]}, {}),
    ({"messages": [{"role": "system", "content": "  You are terse.  "}, {"role": "user", "content": "Hello"},
                   {"role": "assistant", "content": " Hi! \n"}, {"role": "user", "content": "Say bye"}]}, {}),
    ({"messages": [{"role": "user", "content": "Weather in Paris?"},
                   {"role": "assistant", "content": "", "tool_calls": [
                       {"id": "call12345", "type": "function",
                        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                   {"role": "tool", "content": "{\"temp\": 21}", "tool_call_id": "call12345"},
                   {"role": "user", "content": "Thanks ünïcode 日本"}]}, {"tools": [WEATHER_TOOL]}),
    ({"messages": [{"role": "assistant", "content": "I speak first"}, {"role": "user", "content": "odd"}]}, {}),
]


def chat_cases(template, bos, eos):
    cases = []
    for conversation, extra in CONVERSATIONS:
        for add_generation_prompt in (False, True):
            case = {"messages": conversation["messages"], "add_generation_prompt": add_generation_prompt,
                    "extra": extra}
            case.update(render_chat(template, conversation["messages"], add_generation_prompt, bos, eos, extra))
            cases.append(case)
    return cases


def save(name, tok, config, extra_corpus, out_dir, merges_as_strings=False, ignore_merges=False):
    spec = json.loads(tok.to_str())
    if merges_as_strings:  # the older "a b" serialization; byte-level tokens never contain a space
        spec["model"]["merges"] = [" ".join(m) for m in spec["model"]["merges"]]
    spec["model"]["ignore_merges"] = ignore_merges
    tok = Tokenizer.from_str(json.dumps(spec, ensure_ascii=False))
    directory = os.path.join(out_dir, name)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(spec, f, ensure_ascii=False, separators=(",", ":"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)

    cases = []
    for text in CORPUS + extra_corpus:
        ids = tok.encode(text, add_special_tokens=True).ids
        ids_plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "ids_no_special": ids_plain,
                      "decoded": tok.decode(ids, skip_special_tokens=False),
                      "decoded_skip_special": tok.decode(ids, skip_special_tokens=True)})
    bos, eos = config.get("bos_token") or "", config.get("eos_token") or ""
    chats = chat_cases(config["chat_template"], bos, eos)
    if "feature_template" in config:
        chats += [dict(c, template="feature_template") for c in chat_cases(config["feature_template"], bos, eos)]
    expected = {"tokenizer": name, "tokenizers_version": __import__("tokenizers").__version__,
                "jinja2_version": jinja2.__version__, "cases": cases, "chats": chats}
    with open(os.path.join(directory, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(expected, f, ensure_ascii=False, indent=0)
    print(f"{name}: vocab {tok.get_vocab_size()}, {len(cases)} texts, {len(chats)} chats")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "tokenizers")
    llama3_specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                       "<|eom_id|>", "<|python_tag|>"]
    llama3 = byte_level(LLAMA3_PATTERN, llama3_specials,
                        [AddedToken("<|tool|>", lstrip=True, rstrip=True, special=True, normalized=False)],
                        "<|begin_of_text|>")
    save("llama3_bytelevel", llama3,
         {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": templates.LLAMA3,
          "feature_template": templates.FEATURES},
         ["<|begin_of_text|>special inside<|eot_id|> text", "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>",
          "a <|tool|>  b", "x<|tool|>y", "<|eot_id|><|eot_id|>", "<|begin_of_text|"],
         out_dir, merges_as_strings=True, ignore_merges=True)

    qwen_specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    qwen = byte_level(QWEN2_PATTERN, qwen_specials,
                      [AddedToken("café", normalized=True, special=False)], None)
    qwen.normalizer = normalizers.NFC()
    save("qwen2_bytelevel", qwen,
         {"bos_token": None, "eos_token": "<|im_end|>", "chat_template": templates.QWEN25},
         ["<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", "un café, un cafe\u0301", "<|endoftext|>"],
         out_dir)

    llama2 = sentencepiece_style(False, set(), [AddedToken("<mask>", lstrip=True, special=True, normalized=False),
                                                AddedToken("yes", single_word=True, special=False, normalized=False)])
    save("llama2_sentencepiece", llama2,
         {"bos_token": "<s>", "eos_token": "</s>", "chat_template": templates.MISTRAL_V1},
         ["<s>Hello</s> there", "a <mask> b", "yes yesterday eyes yes.", " <s> spaced",
          "e\u0301yes _yes yes_ \u200dyes ²yes yes² Ⓐyes 1yes"], out_dir)

    mistral = sentencepiece_style(True, set(range(0xF0, 0xF5)),
                                  [AddedToken("[INST]", special=True, normalized=False),
                                   AddedToken("[/INST]", special=True, normalized=False)])
    save("mistral_metaspace", mistral,
         {"bos_token": "<s>", "eos_token": "</s>", "add_bos_token": True, "add_eos_token": False,
          "chat_template": templates.MISTRAL},
         ["[INST] Hi [/INST] Hello</s>", "😀😀 two emoji then text 😀", "[INST]no space[/INST]"], out_dir)


if __name__ == "__main__":
    main()
