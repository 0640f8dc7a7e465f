#!/usr/bin/env python3
"""CUDA backend vs Hugging Face transformers, end to end, on the GPU machine (no network).

For each architecture (Llama with Llama 3 rope scaling, Llama with head_dim 128, Qwen2 with q/k/v
biases and tied embeddings, Mistral with a sliding window shorter than the prompt) this builds a
small random-weight model with transformers itself, saves it with save_pretrained in bf16, and
computes the teacher-forced logits of random ids with transformers in fp32 from exactly the saved
bf16 values. Then `deepfuse score --backend cuda --json` scores the same ids from the saved
directory, and every position's logits are compared:

  relative error ||deepfuse - hf|| / ||hf|| < 2e-2 at every position, and
  top-1 agreement > 99%, where a different pick counts as agreement only at a near tie of the
  transformers logits (the two within 5% of the row's RMS: bf16 may swap those; see
  tests/logits_check.hpp).

    python3 scripts/parity/compare_hf_cuda.py [--deepfuse build-gpu/deepfuse] [--json results.json]

Prints a table; exits 1 when a model fails, 2 when deepfuse itself fails to run.
"""
import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "fixtures"))
from make_hf_fixtures import randomize  # noqa: E402  trained-like random weights, the fixtures' recipe

MAX_ERROR = 2e-2
MIN_TOP1_AGREEMENT = 0.99
NEAR_TIE_FRACTION = 0.05
PROMPT_TOKENS = 96
TRANSFORMERS_MAJOR = int(transformers.__version__.split(".")[0])

# Small, but with every dimension a multiple of 64 as the kernels need; the vocabulary is odd.
COMMON = dict(vocab_size=1001, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
              max_position_embeddings=512, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)


def rope(theta, scaling=None):
    """Rope settings in the config fields of the installed transformers (v5 groups them)."""
    if TRANSFORMERS_MAJOR >= 5:
        parameters = dict(rope_type="default", rope_theta=theta)
        parameters.update(scaling or {})
        return dict(rope_parameters=parameters)
    return dict(rope_theta=theta, rope_scaling=scaling)


LLAMA3_SCALING = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_max_position_embeddings=64)

CASES = {
    "llama3_gqa": (transformers.LlamaConfig,
                   dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, tie_word_embeddings=False,
                        **rope(500000.0, LLAMA3_SCALING))),
    "llama_headdim128": (transformers.LlamaConfig,
                         dict(num_attention_heads=4, num_key_value_heads=1, head_dim=128, tie_word_embeddings=False,
                              **rope(10000.0))),
    "qwen2_bias_tied": (transformers.Qwen2Config,
                        dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=True,
                             **rope(1000000.0))),
    "mistral_window32": (transformers.MistralConfig,
                         dict(num_attention_heads=4, num_key_value_heads=2, head_dim=64, sliding_window=32,
                              tie_word_embeddings=False, **rope(10000.0))),
}


def dtype_kwarg(dtype):
    return dict(dtype=dtype) if TRANSFORMERS_MAJOR >= 5 else dict(torch_dtype=dtype)


def hf_logits(config_class, fields, directory, ids, generator):
    config = config_class(**COMMON, **fields)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                          **dtype_kwarg(torch.float32)).eval()
    randomize(model, torch.bfloat16, generator)
    model.to(torch.bfloat16).save_pretrained(directory)
    # Reloaded as a user loads it, in fp32 from the bf16 file (casting `model` back would also
    # round the rotary inv_freq buffer to bf16, which no loader does).
    model = transformers.AutoModelForCausalLM.from_pretrained(directory, attn_implementation="eager",
                                                              **dtype_kwarg(torch.float32)).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].tolist()


def deepfuse_logits(binary, directory, ids, json_path):
    command = [binary, "score", "--backend", "cuda", "--model", str(directory), "--prompt-ids",
               ",".join(map(str, ids)), "--max-context", str(len(ids)), "--kv-cache-mb", "256",
               "--json", str(json_path)]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        print(f"deepfuse failed (exit {run.returncode}): {' '.join(command)}\n{run.stderr}", file=sys.stderr)
        sys.exit(2)
    return json.loads(pathlib.Path(json_path).read_text())["logits"]


def compare(ours, theirs):
    """Worst and mean per-position relative error; top-1 same / swapped at near ties / wrong."""
    ours, theirs = torch.tensor(ours, dtype=torch.float64), torch.tensor(theirs, dtype=torch.float64)
    errors = (ours - theirs).norm(dim=1) / theirs.norm(dim=1)
    same = near_tie = 0
    wrong = []
    for position, (mine, row) in enumerate(zip(ours, theirs)):
        my_pick, their_pick = int(mine.argmax()), int(row.argmax())
        rms = float(row.pow(2).mean().sqrt())
        if my_pick == their_pick:
            same += 1
        elif abs(float(row[my_pick] - row[their_pick])) < NEAR_TIE_FRACTION * rms:
            near_tie += 1
        else:
            wrong.append(position)
    worst = float(errors.max()) if not torch.isnan(errors).any() else float("nan")
    return dict(positions=len(theirs), worst_error=worst, worst_position=int(errors.nan_to_num(1e9).argmax()),
                mean_error=float(errors.mean()), top1_same=same, top1_near_tie=near_tie, top1_wrong=wrong,
                top1_agreement=(same + near_tie) / len(theirs))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deepfuse", default=os.path.join(os.environ.get("DEEPFUSE_BUILD_DIR", "build"), "deepfuse"))
    parser.add_argument("--json", help="write the per-model results here")
    parser.add_argument("--seed", type=int, default=20251121)
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(args.seed)
    results = {}
    with tempfile.TemporaryDirectory(prefix="deepfuse_hf_cuda_") as scratch:
        for name, (config_class, fields) in CASES.items():
            directory = pathlib.Path(scratch) / name
            ids = [COMMON["bos_token_id"]] + torch.randint(0, COMMON["vocab_size"], (PROMPT_TOKENS - 1,),
                                                           generator=generator).tolist()
            theirs = hf_logits(config_class, fields, directory, ids, generator)
            ours = deepfuse_logits(args.deepfuse, directory, ids, pathlib.Path(scratch) / f"{name}.json")
            result = compare(ours, theirs)
            result["passed"] = result["worst_error"] < MAX_ERROR and result["top1_agreement"] > MIN_TOP1_AGREEMENT
            results[name] = result

    print(f"transformers {transformers.__version__}, torch {torch.__version__}; {PROMPT_TOKENS} teacher-forced "
          f"positions per model; bounds: relative error < {MAX_ERROR}, top-1 agreement > {MIN_TOP1_AGREEMENT:.0%}")
    header = f"{'model':<18} {'worst err':>10} {'at':>4} {'mean err':>10} {'top-1 same':>10} {'near-tie':>8} " \
             f"{'wrong':>6}  result"
    print(header + "\n" + "-" * len(header))
    for name, r in results.items():
        print(f"{name:<18} {r['worst_error']:>10.2e} {r['worst_position']:>4} {r['mean_error']:>10.2e} "
              f"{r['top1_same']:>10} {r['top1_near_tie']:>8} {len(r['top1_wrong']):>6}  "
              f"{'ok' if r['passed'] else 'FAILED'}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(dict(transformers=transformers.__version__,
                                                           torch=torch.__version__, models=results), indent=2) + "\n")
    sys.exit(0 if all(r["passed"] for r in results.values()) else 1)


if __name__ == "__main__":
    main()
