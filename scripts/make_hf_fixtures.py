#!/usr/bin/env python3
"""Parity fixtures: tiny random-weight checkpoints written by Hugging Face transformers itself,
with the logits transformers computes for a few prompts, for ctest to compare the reference
backend against (tests/model/test_hf_parity.cpp) with no Python at test time.

    python3 -m venv .venv-hf && .venv-hf/bin/pip install torch transformers
    .venv-hf/bin/python scripts/make_hf_fixtures.py            # rewrites tests/fixtures/hf/

Each case directory holds what save_pretrained writes (config.json, model.safetensors, ...) plus
logits.json: {"prompts": [{"input_ids", "full_logits" [n][vocab], "prefill_length",
"incremental_logits" [n][vocab]}]}: the full forward, and a teacher-forced run that prefills
prefill_length tokens and then feeds one token at a time through the KV cache.

Weights are random, stored in the case's dtype (BF16 / F16 / F32); the logits are computed in fp32
from exactly the stored values, so fp32 agreement is expected up to summation order.
"""
import json
import math
import pathlib
import sys

import torch
import transformers

ROOT = pathlib.Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "hf"

# Small enough to keep every fixture a few tens of KB; each case covers what the issue asks for.
COMMON = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
              max_position_embeddings=64, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)

CASES = {
    # Llama 3 rope scaling (original_max_position small enough that all three bands occur),
    # GQA 4:2 and head_dim 16 != hidden/heads = 8.
    "llama3_gqa_headdim": dict(
        cls=transformers.LlamaConfig, dtype=torch.bfloat16,
        config=dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=4.0, low_freq_factor=1.0,
                                         high_freq_factor=4.0, original_max_position_embeddings=16))),
    # Qwen2: q/k/v biases, tied embeddings, GQA 4:1.
    "qwen2_bias_tied": dict(
        cls=transformers.Qwen2Config, dtype=torch.float16,
        config=dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True,
                    rope_parameters=dict(rope_type="default", rope_theta=1000000.0))),
    # Mistral with a sliding window (3) much shorter than the prompts, GQA 4:2.
    "mistral_sliding_window": dict(
        cls=transformers.MistralConfig, dtype=torch.float32,
        config=dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=3, tie_word_embeddings=False,
                    rope_parameters=dict(rope_type="default", rope_theta=10000.0))),
}

PROMPTS = [[1, 17, 42, 5, 63, 8, 8, 30], [1, 3, 9, 27, 18, 54, 33, 36, 45, 7, 21, 0]]
PREFILL_LENGTH = 3


def randomize(model, dtype, generator):
    """Non-trivial weights (HF init leaves biases 0 and norms 1), rounded to the storage dtype."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=generator)
            if "norm" in name:
                value = 1.0 + 0.1 * noise
            elif name.endswith("bias"):
                value = 0.2 * noise
            elif "embed_tokens" in name:
                value = noise
            else:
                value = noise / math.sqrt(p.shape[-1])
            p.copy_(value.to(dtype).to(torch.float32))


def logits_rows(tensor):
    return [[float(f"{v:.8g}") for v in row] for row in tensor[0].tolist()]


def record(model, ids):
    input_ids = torch.tensor([ids])
    with torch.no_grad():
        full = model(input_ids).logits
        out = model(input_ids[:, :PREFILL_LENGTH], use_cache=True)
        rows, cache = [out.logits], out.past_key_values
        for t in range(PREFILL_LENGTH, len(ids)):
            out = model(input_ids[:, t:t + 1], past_key_values=cache, use_cache=True)
            rows.append(out.logits)
            cache = out.past_key_values
        incremental = torch.cat(rows, dim=1)
    difference = (full - incremental).norm() / full.norm()
    assert difference < 1e-5, f"transformers disagrees with itself: {difference}"
    return dict(input_ids=ids, full_logits=logits_rows(full), prefill_length=PREFILL_LENGTH,
                incremental_logits=logits_rows(incremental))


def main():
    generator = torch.Generator().manual_seed(20240611)
    for name, case in CASES.items():
        config = case["cls"](**COMMON, **case["config"])
        config._attn_implementation = "eager"
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        randomize(model, case["dtype"], generator)
        directory = OUT / name
        directory.mkdir(parents=True, exist_ok=True)
        model.to(case["dtype"]).save_pretrained(directory)
        # Logits from the checkpoint as a user loads it. (Not from `model` cast back to fp32: .to()
        # also rounds the rotary inv_freq buffer to the storage dtype, which no loader does.)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            directory, dtype=torch.float32, attn_implementation="eager").eval()
        fixtures = dict(transformers_version=transformers.__version__, torch_version=torch.__version__,
                        prompts=[record(model, ids) for ids in PROMPTS])
        (directory / "logits.json").write_text(json.dumps(fixtures, separators=(",", ":")) + "\n")
        print(f"{name}: {sorted(p.name for p in directory.iterdir())}", file=sys.stderr)


if __name__ == "__main__":
    main()
