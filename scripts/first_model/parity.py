#!/usr/bin/env python3
"""The first-run model's greedy tokens on a deepfuse backend against transformers'.

    .venv-py/bin/python scripts/first_model/parity.py --deepfuse build/deepfuse --model DIR --backend reference
    python3 scripts/first_model/parity.py --deepfuse build-gpu/deepfuse --model DIR --backend cuda   # a GPU machine

For each prompt (plain text, and a chat rendered through the checkpoint's template): deepfuse's
tokenizer must give transformers' ids (`deepfuse tokenize`), then `deepfuse generate` on those ids
must produce exactly the 64 tokens transformers' greedy decoding produces (in fp32 from the stored
bf16 weights, end-of-sequence ignored on both sides). Prints one line per prompt with the smallest
top-1/top-2 logit margin transformers saw (how close the nearest tie came); exits 1 on any
difference. A trained model has few near-ties, so exact agreement is the bar, on the cuda backend too.
The smallest margin over all prompts is a property of the model alone: a model with near-ties on
its greedy path can lose parity on a bf16 GPU without any bug in deepfuse.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers

TEXT_PROMPTS = ["The decode step", "deepfuse is", "Prefill"]
CHAT_PROMPT = [{"role": "user", "content": "Tell me about the paged KV cache."}]


def run(command):
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"parity: {' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return done.stdout


def transformers_greedy(model, ids, tokens):
    """Greedy continuation of `ids` (the whole sequence run again each step: no cache API to track)
    and the smallest top-1/top-2 margin along it."""
    out, margin = list(ids), float("inf")
    with torch.no_grad():
        for _ in range(tokens):
            logits = model(input_ids=torch.tensor([out]), use_cache=False).logits[0, -1]
            top = torch.topk(logits, 2).values
            margin = min(margin, (top[0] - top[1]).item())
            out.append(int(torch.argmax(logits)))
    return out[len(ids):], margin


def deepfuse_greedy(deepfuse, ids_dir, backend, ids, tokens):
    command = [deepfuse, "generate", "--model", str(ids_dir), "--backend", backend, "--prompt-ids",
               ",".join(map(str, ids)), "--max-tokens", str(tokens), "--ignore-eos", "--temperature", "0"]
    if backend == "cuda":
        command += ["--kv-cache-mb", "64"]
    first_line = run(command).splitlines()[0]
    return [int(t) for t in first_line.split()]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deepfuse", required=True, help="the deepfuse binary")
    parser.add_argument("--model", required=True, type=pathlib.Path, help="the first-run model's directory")
    parser.add_argument("--backend", required=True, choices=["reference", "cuda"])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--json", type=pathlib.Path, help="write the per-prompt results here")
    args = parser.parse_args()

    transformers.utils.logging.disable_progress_bar()
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts = [(text, tokenizer(text)["input_ids"], ["--text", text]) for text in TEXT_PROMPTS]
    chat_ids = tokenizer.apply_chat_template(CHAT_PROMPT, add_generation_prompt=True, tokenize=True,
                                             return_dict=True)["input_ids"]
    prompts.append(("chat: " + CHAT_PROMPT[0]["content"], list(chat_ids), ["--chat", "--text", json.dumps(CHAT_PROMPT)]))

    results, failed = [], False
    with tempfile.TemporaryDirectory() as scratch:
        # The weights without tokenizer.json, so that generate prints ids rather than text.
        ids_dir = pathlib.Path(scratch)
        for name in ("config.json", "generation_config.json", "model.safetensors"):
            (ids_dir / name).symlink_to((args.model / name).resolve())
        for label, ids, tokenize_args in prompts:
            deepfuse_ids = json.loads(run([args.deepfuse, "tokenize", "--model", str(args.model), *tokenize_args]))
            expected, margin = transformers_greedy(model, ids, args.tokens)
            got = deepfuse_greedy(args.deepfuse, ids_dir, args.backend, ids, args.tokens)
            same = deepfuse_ids == ids and got == expected
            first_difference = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b),
                                    None if len(got) == len(expected) else min(len(got), len(expected)))
            print(f"{'ok  ' if same else 'FAIL'} {label!r}: prompt {len(ids)} tokens"
                  f"{'' if deepfuse_ids == ids else ' (deepfuse tokenized it differently: ' + str(deepfuse_ids) + ')'}, "
                  f"{args.tokens} greedy tokens {'equal' if got == expected else f'differ from token {first_difference}'}"
                  f", smallest top-2 margin {margin:.3f}; text: {tokenizer.decode(expected)!r}")
            if got != expected:
                print(f"     transformers: {expected}\n     deepfuse:     {got}")
            failed |= not same
            results.append(dict(prompt=label, prompt_ids=ids, transformers=expected, deepfuse=got,
                                min_margin=margin, equal=same))
    smallest = min(r["min_margin"] for r in results)
    print(f"smallest top-2 margin over all prompts: {smallest:.3f} (logits)")
    if args.json:
        args.json.write_text(json.dumps(dict(backend=args.backend, tokens=args.tokens,
                                             results=results), indent=1))
    print(f"first-model parity, {args.backend} backend vs transformers: {'FAIL' if failed else 'PASS'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
