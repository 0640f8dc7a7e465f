#!/usr/bin/env python3
"""The first-run model: a small Llama trained on the project's own docs, so `scripts/run.sh` and
`deepfuse chat` print words on a fresh machine with nothing downloaded but PyPI packages.

    python3 scripts/first_model/train.py --hash          # the cache key (needs only the standard library)
    .venv-py/bin/python scripts/first_model/train.py --out DIR

The corpus is README.md and docs/design.md: prose paragraphs (code blocks, tables and paragraphs of
measurements left out), every tenth paragraph held out. It is small on purpose: the model sees it
about 80 times and all but memorizes it, so its greedy paths are far more confident (parity.py
prints how near they come to a tie, which a bf16 GPU may break the other way), at the price of a
poor held-out perplexity. On the training paragraphs it learns a byte-level BPE tokenizer (1024
ids, the Llama 3 pre-tokenizer, so deepfuse's tokenizer loader reads it), then trains a 4-layer
Llama (hidden 128, head_dim 64, GQA 2:1, intermediate 512: shapes the CUDA kernels take; small,
since at this budget a smaller model sees more text and ends with the lower loss) on the
text and on chat turns made from the docs' sections (a heading asked about, its first paragraph as
the answer), for a fixed number of small steps (many updates on few windows memorize faster) on 2 CPU threads with deterministic algorithms and fixed
seeds. DIR receives a Hugging Face checkpoint (config.json, generation_config.json,
model.safetensors in bf16, tokenizer.json, tokenizer_config.json with the chat template) and
heldout.txt, the held-out paragraphs that fit in the context, for `deepfuse score`.
"""
import argparse
import hashlib
import math
import pathlib
import random
import re
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
SEED = 1234
THREADS = 2
VOCAB = 1024
CONTEXT = 256            # max_position_embeddings and the training window
BATCH = 4                # windows per step
STEPS = 800
LEARNING_RATE = 4e-3
WARMUP = 20
HOLD_OUT_EVERY = 10      # every tenth paragraph is held out

BOS, EOS = "<|begin|>", "<|end|>"
SPECIALS = [BOS, EOS, "<|system|>", "<|user|>", "<|assistant|>"]
# Jinja that both transformers and deepfuse's template subset render the same way.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + '<|end|>\\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}")
# Llama 3's pre-tokenizer split (deepfuse's tiny tokenizer uses the same).
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QUESTIONS = ["{}", "What is {}?", "Tell me about {}.", "Explain {}."]


def corpus_files():
    return [ROOT / "README.md", ROOT / "docs" / "design.md"]


def content_hash():
    """What the checkpoint depends on: this script and its corpus."""
    digest = hashlib.sha256(pathlib.Path(__file__).read_bytes())
    for path in corpus_files():
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def sections(text):
    """(heading, [paragraphs]) in order: prose only, each paragraph's wrapped lines joined."""
    out, heading, paragraph, in_code = [], "", [], False

    def end_paragraph():
        if paragraph:
            out[-1][1].append(" ".join(paragraph))
            paragraph.clear()

    out.append((heading, []))
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            in_code = not in_code
            end_paragraph()
            continue
        if in_code or stripped.startswith("|") or line.startswith("    "):
            end_paragraph()
            continue
        if stripped.startswith("#"):
            end_paragraph()
            heading = stripped.lstrip("#").strip().strip("`")
            out.append((heading, []))
        elif not stripped:
            end_paragraph()
        else:
            paragraph.append(stripped)
    end_paragraph()
    return [(h, [p for p in ps if is_prose(p)]) for h, ps in out]


def is_prose(paragraph):
    """Mostly letters and hardly any digits: the docs' measurement lists would teach it numbers."""
    letters = sum(c.isalpha() for c in paragraph)
    digits = sum(c.isdigit() for c in paragraph)
    return letters > 0.6 * len(paragraph) and digits <= 0.03 * len(paragraph)


def split_corpus():
    """Training sections, and the held-out paragraphs (every HOLD_OUT_EVERY-th one)."""
    train, held_out, index = [], [], 0
    for path in corpus_files():
        for heading, paragraphs in sections(path.read_text(encoding="utf-8")):
            kept = []
            for p in paragraphs:
                index += 1
                (held_out if index % HOLD_OUT_EVERY == 0 else kept).append(p)
            train.append((heading, kept))
    return train, held_out


def train_tokenizer(texts):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, chat_template=CHAT_TEMPLATE,
                                   model_max_length=CONTEXT)


def documents(train_sections, tokenizer, rng):
    """Token lists: each section's text as one document, and chat turns made from the sections."""
    docs = []
    for heading, paragraphs in train_sections:
        if paragraphs:
            text = (f"{heading}\n\n" if heading else "") + "\n\n".join(paragraphs)
            docs.append(tokenizer(text)["input_ids"] + [tokenizer.eos_token_id])
        if heading and paragraphs:
            for question in rng.sample(QUESTIONS, 2):
                messages = [{"role": "user", "content": question.format(heading)},
                            {"role": "assistant", "content": paragraphs[0]}]
                ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
                if len(ids) <= CONTEXT // 2:
                    docs.append(list(ids))
    return docs


def learning_rate_factor(step):
    """Linear warm-up, then a cosine from 1 down to 0.1."""
    return min(1.0, (step + 1) / WARMUP) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(step, STEPS) / STEPS)))


def train(out):
    import torch
    import transformers
    torch.manual_seed(SEED)
    torch.set_num_threads(THREADS)
    torch.use_deterministic_algorithms(True)
    rng = random.Random(SEED)
    start = time.time()

    train_sections, held_out = split_corpus()
    tokenizer = train_tokenizer(p for _, ps in train_sections for p in ps)
    tokenizer.model_max_length = 1 << 30  # whole sections are tokenized before windows are cut
    docs = documents(train_sections, tokenizer, rng)
    rng.shuffle(docs)
    stream = torch.tensor([t for d in docs for t in d])
    print(f"corpus: {len(docs)} documents, {stream.numel()} training tokens, {len(held_out)} held-out paragraphs "
          f"({time.time() - start:.0f} s)", flush=True)

    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=4, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, max_position_embeddings=CONTEXT, rms_norm_eps=1e-5,
        rope_parameters=dict(rope_type="default", rope_theta=10000.0), tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, attn_implementation="sdpa")
    model = transformers.LlamaForCausalLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, betas=(0.9, 0.95), weight_decay=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor)
    model.train()
    for step in range(STEPS):
        offsets = torch.randint(0, stream.numel() - CONTEXT, (BATCH,))
        batch = torch.stack([stream[o:o + CONTEXT] for o in offsets.tolist()])
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if step % 20 == 0 or step == STEPS - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}  {time.time() - start:.0f} s", flush=True)

    # Stored in bf16, the dtype the CUDA engine runs; every check below reads these stored values.
    model = model.to(torch.bfloat16).eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    model.generation_config.save_pretrained(out)
    tokenizer.model_max_length = CONTEXT
    tokenizer.save_pretrained(out)
    tokenizer.model_max_length = 1 << 30
    heldout_ids = held_out_text(tokenizer, held_out, out / "heldout.txt")
    with torch.no_grad():
        loss = model.float()(input_ids=torch.tensor([heldout_ids]), labels=torch.tensor([heldout_ids])).loss
    print(f"held-out perplexity (transformers, {len(heldout_ids) - 1} tokens scored): {math.exp(loss.item()):.2f}")
    print(f"trained in {time.time() - start:.0f} s into {out}")


def held_out_text(tokenizer, paragraphs, path):
    """Writes the held-out paragraphs that fit in the context (with BOS) to `path`; their ids."""
    text = ""
    for p in paragraphs:
        longer = f"{text}\n\n{p}" if text else p
        if len(tokenizer(longer)["input_ids"]) > CONTEXT:
            break
        text = longer
    path.write_text(text, encoding="utf-8")
    return tokenizer(text)["input_ids"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hash", action="store_true", help="print the cache key (script + corpus) and exit")
    parser.add_argument("--out", type=pathlib.Path, help="checkpoint directory to write")
    args = parser.parse_args()
    if args.hash:
        print(content_hash())
        return 0
    if not args.out:
        parser.error("give --out DIR (or --hash)")
    train(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
