"""deepfuse.patch on small random-weight Hugging Face models: logits against the unpatched model,
generate with the static cache, torch.compile(fullgraph=True) over a patched decoder layer, and
capture and replay in a torch.cuda.CUDAGraph."""

import pytest
import torch

import deepfuse
from conftest import gpu_skip_reason, rel_error
from deepfuse.patch import DISPATCH_TOKENS, choose_fused_max_tokens

if gpu_skip_reason() is not None:
    pytest.skip(gpu_skip_reason(), allow_module_level=True)
transformers = pytest.importorskip("transformers", reason="transformers is not installed")


def tiny_model(kind: str):
    common = dict(hidden_size=256, intermediate_size=704, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=1000, max_position_embeddings=512, rms_norm_eps=1e-5)
    if kind == "llama":
        config = transformers.LlamaConfig(**common)
        cls = transformers.LlamaForCausalLM
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**common)
        cls = transformers.Qwen2ForCausalLM
    else:
        config = transformers.MistralConfig(sliding_window=64, **common)
        cls = transformers.MistralForCausalLM
    torch.manual_seed(0)
    model = cls(config).to(device="cuda", dtype=torch.bfloat16).eval()
    with torch.no_grad():  # norms other than 1, so folding the norm weight is exercised
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.2 * torch.randn_like(p.float()))
    return model


def rotary_and_layer_input(model, tokens: int, batch: int = 2):
    hidden = (torch.randn(batch, tokens, model.config.hidden_size, device="cuda")).to(torch.bfloat16)
    positions = torch.arange(tokens, device="cuda")[None].expand(batch, -1)
    return hidden, positions, model.model.rotary_emb(hidden, positions)


def run_layer(layer, hidden, positions, position_embeddings):
    out = layer(hidden, attention_mask=None, position_ids=positions, position_embeddings=position_embeddings)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
def test_patched_logits_match(seed, kind):
    model = tiny_model(kind)
    ids = torch.randint(0, 1000, (3, 12), device="cuda")
    with torch.no_grad():
        ref = model(ids).logits.float()
        deepfuse.patch(model, fused_max_tokens=8)  # not measured: tiny MLPs may never fuse
        assert deepfuse.is_patched(model)
        assert sum(isinstance(m, deepfuse.FusedSwiGLUMLP) for m in model.modules()) == 2
        prefill = model(ids).logits.float()  # 36 tokens: the unfused path
        last = model(ids[:, -1:]).logits.float()  # 3 tokens: the fused kernel (no cache: position 0)
        deepfuse.unpatch(model)
        assert not deepfuse.is_patched(model)
        ref_last = model(ids[:, -1:]).logits.float()
        again = model(ids).logits.float()
    assert torch.equal(again, ref)  # unpatch restores the original modules exactly
    assert rel_error(prefill, ref) < 2e-2
    assert rel_error(last, ref_last) < 2e-2
    assert (last.argmax(-1) == ref_last.argmax(-1)).float().mean() >= 0.6


def test_generate_with_static_cache(seed):
    model = tiny_model("llama")
    ids = torch.randint(0, 1000, (2, 7), device="cuda")
    with torch.no_grad():
        stock = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
        deepfuse.patch(model, fused_max_tokens=8)
        patched = model.generate(ids, max_new_tokens=6, do_sample=False, cache_implementation="static")
    assert patched.shape == stock.shape == (2, 13)
    assert torch.equal(patched[:, :7], ids)


def test_patch_measures_its_dispatch(seed):
    """patch() without fused_max_tokens times the fused kernel against the stock GEMMs at every
    dispatch token count on this GPU and fuses up to the last count of its unbroken lead."""
    model = tiny_model("llama")
    deepfuse.patch(model)
    dispatch = deepfuse.dispatch_of(model)
    assert dispatch.source.startswith("measured on ")
    assert [row["m"] for row in dispatch.timings] == list(DISPATCH_TOKENS)
    assert all(row["fused_us"] > 0 and row["gemms_us"] > 0 for row in dispatch.timings)
    assert dispatch.fused_max_tokens == choose_fused_max_tokens(dispatch.timings)
    assert all(m.dispatch is dispatch for m in model.modules() if isinstance(m, deepfuse.FusedSwiGLUMLP))


def test_compile_fullgraph_patched_decoder_layer(seed):
    model = tiny_model("qwen2")
    deepfuse.patch(model, fused_max_tokens=8)
    layer = model.model.layers[0]
    torch._dynamo.reset()
    compiled = torch.compile(layer, fullgraph=True)
    with torch.no_grad():
        for tokens in (1, 20):  # 2 and 40 tokens: the fused and the unfused branch
            hidden, positions, pe = rotary_and_layer_input(model, tokens)
            eager = run_layer(layer, hidden, positions, pe)
            out = run_layer(compiled, hidden, positions, pe)
            assert rel_error(out, eager) < 1e-2


def test_cuda_graph_capture_and_replay_of_patched_layer(seed):
    model = tiny_model("mistral")
    deepfuse.patch(model, fused_max_tokens=8)
    layer = model.model.layers[1]
    with torch.no_grad():
        hidden, positions, pe = rotary_and_layer_input(model, 1, batch=4)
        static_in = hidden.clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            run_layer(layer, static_in, positions, pe)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = run_layer(layer, static_in, positions, pe)
        for _ in range(3):
            fresh = torch.randn_like(hidden.float()).to(torch.bfloat16)
            static_in.copy_(fresh)
            graph.replay()
            eager = run_layer(layer, fresh, positions, pe)
            torch.cuda.synchronize()
            assert rel_error(static_out, eager) < 1e-3
