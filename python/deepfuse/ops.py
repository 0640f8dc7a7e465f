"""deepfuse's fused kernels as torch.library ops, and the Python API around them.

Every op is registered with :func:`torch.library.custom_op` under the ``deepfuse::`` namespace
(a schema, a CUDA implementation that launches the kernel on PyTorch's current stream, and a fake
implementation so ``torch.compile`` and ``FakeTensorMode`` can trace it). The CUDA implementations
allocate their outputs with PyTorch's allocator (or write into tensors they were given and declare
so in the schema), never synchronise with the host and read no environment variable, so they can
be captured in a ``torch.cuda.CUDAGraph`` and by ``torch.compile(mode="reduce-overhead")``.

Workspaces that a kernel needs zeroed (the fused MLP's fp32 partial sums and counters, the decode
attention plan's merge counters) are allocated once, zeroed, by :func:`pack_mlp_weights` and
:func:`plan_decode_attention`; the kernels leave them zero again, so they are inputs of the ops and
not declared mutated.

Tensors: activations and weights are bf16, contiguous, on one CUDA device. Paged KV pools are
``[num_pages, kv_heads, page_size (16), head_dim]`` bf16; block tables ``[rows, max_pages]`` int32.
"""

import dataclasses
import struct
from typing import Callable, List, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch import Tensor

import ctypes

from . import _lib

#: Tokens per page of the paged KV cache (include/deepfuse/kernels/paged_kv.hpp).
KV_PAGE_SIZE = 16
#: Most tokens the fused QKV + RoPE + append kernel takes in one call (kQkvFusedMaxTokens).
QKV_FUSED_MAX_TOKENS = 32
#: The decode engine's rule (docs/design.md): the fused MLP up to this many tokens, the unfused
#: copy above (the fused kernel measured slower from 16 tokens on the H200 and the H100).
FUSED_MLP_MAX_TOKENS = 8
#: fp32 partial-sum rows the shared MLP accumulator holds by default (the benchmark's largest M).
DEFAULT_MLP_WORKSPACE_TOKENS = 64
#: Integers describing a decode attention plan (csrc/capi.cpp, kPlanFields).
_PLAN_FIELDS = 11
_SLOT = struct.Struct("<fiffQQ")  # kernels::SamplingSlot: temperature, top_k, top_p, min_p, seed, step


def _static(*tensors: Tensor) -> None:
    """Tells torch.compile's CUDA graphs (mode="reduce-overhead") that these long-lived tensors keep
    their address, so graph replays read them in place instead of copying them into graph inputs."""
    for t in tensors:
        torch._dynamo.mark_static_address(t)


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream


def _ptr(t: Optional[Tensor]) -> Optional[int]:
    return None if t is None else t.data_ptr()


def _require(condition: bool, message: Union[str, Callable[[], str]]) -> None:
    # Messages that format shapes are passed as lambdas: built only on failure, so torch.compile
    # never traces the formatting of symbolic sizes.
    if not condition:
        raise ValueError(f"deepfuse: {message() if callable(message) else message}")


def _require_bf16(name: str, t: Tensor) -> None:
    _require(t.dtype == torch.bfloat16, lambda: f"{name} must be bfloat16, got {t.dtype}")
    _require(t.is_contiguous(), lambda: f"{name} must be contiguous")


# ---------------------------------------------------------------------------------------------
# Raw ops (deepfuse::*). The Python functions further down validate, pick variants and call these.
# ---------------------------------------------------------------------------------------------

@torch.library.custom_op("deepfuse::pack_swiglu", mutates_args=(), device_types="cuda")
def _pack_swiglu(gate: Tensor, up: Tensor, down: Tensor, norm_weight: Optional[Tensor]) -> Tuple[Tensor, Tensor]:
    intermediate, hidden = gate.shape
    gate_up_packed = torch.empty(2 * intermediate * hidden, dtype=torch.bfloat16, device=gate.device)
    down_packed = torch.empty(hidden * intermediate, dtype=torch.bfloat16, device=gate.device)
    _lib.check(_lib.lib().df_pack_swiglu(gate.data_ptr(), up.data_ptr(), _ptr(norm_weight), gate_up_packed.data_ptr(),
                                         down.data_ptr(), down_packed.data_ptr(), hidden, intermediate, _stream(gate)),
               "pack_swiglu")
    return gate_up_packed, down_packed


@_pack_swiglu.register_fake
def _(gate, up, down, norm_weight):
    intermediate, hidden = gate.shape
    return (gate.new_empty(2 * intermediate * hidden), gate.new_empty(hidden * intermediate))


@torch.library.custom_op("deepfuse::swiglu_fused", mutates_args=(), device_types="cuda")
def _swiglu_fused(x: Tensor, gate_up_packed: Tensor, down_packed: Tensor, residual: Optional[Tensor],
                  accumulator: Tensor, counters: Tensor, intermediate: int, rms_normalize: bool, eps: float) -> Tensor:
    tokens, hidden = x.shape
    y = torch.empty_like(x)
    _lib.check(_lib.lib().df_swiglu_fused(x.data_ptr(), gate_up_packed.data_ptr(), down_packed.data_ptr(),
                                          _ptr(residual), y.data_ptr(), int(rms_normalize), eps,
                                          accumulator.data_ptr(), counters.data_ptr(), tokens, hidden, intermediate,
                                          _stream(x)),
               "swiglu_fused")
    return y


@_swiglu_fused.register_fake
def _(x, gate_up_packed, down_packed, residual, accumulator, counters, intermediate, rms_normalize, eps):
    return torch.empty_like(x)


@torch.library.custom_op("deepfuse::rms_norm", mutates_args=(), device_types="cuda")
def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    rows, hidden = x.shape
    out = torch.empty_like(x)
    # launch_rms_norm reads `residual` only; the C ABI picks it when x (the addend) is null.
    _lib.check(_lib.lib().df_add_rms_norm(x.data_ptr(), None, weight.data_ptr(), out.data_ptr(), rows, hidden, eps,
                                          _stream(x)),
               "rms_norm")
    return out


@_rms_norm.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


@torch.library.custom_op("deepfuse::fused_add_rms_norm", mutates_args=("residual",), device_types="cuda")
def _fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> Tensor:
    rows, hidden = residual.shape
    out = torch.empty_like(residual)
    _lib.check(_lib.lib().df_add_rms_norm(residual.data_ptr(), x.data_ptr(), weight.data_ptr(), out.data_ptr(), rows,
                                          hidden, eps, _stream(x)),
               "fused_add_rms_norm")
    return out


@_fused_add_rms_norm.register_fake
def _(x, residual, weight, eps):
    return torch.empty_like(residual)


@torch.library.custom_op("deepfuse::pack_qkv", mutates_args=(), device_types="cuda")
def _pack_qkv(weight: Tensor) -> Tensor:
    rows, hidden = weight.shape
    packed = torch.empty(rows * hidden, dtype=torch.bfloat16, device=weight.device)
    _lib.check(_lib.lib().df_pack_qkv(weight.data_ptr(), packed.data_ptr(), rows, hidden, _stream(weight)), "pack_qkv")
    return packed


@_pack_qkv.register_fake
def _(weight):
    return weight.new_empty(weight.numel())


@torch.library.custom_op("deepfuse::qkv_rope_append", mutates_args=("k_pages", "v_pages"), device_types="cuda")
def _qkv_rope_append(x: Tensor, norm_weight: Tensor, packed: Tensor, bias: Optional[Tensor], inv_freq: Tensor,
                     positions: Tensor, sequences: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor,
                     q_heads: int, eps: float) -> Tensor:
    tokens, hidden = x.shape
    _, kv_heads, _, head_dim = k_pages.shape
    q = torch.empty(tokens, q_heads, head_dim, dtype=torch.bfloat16, device=x.device)
    _lib.check(_lib.lib().df_qkv_rope_fused(x.data_ptr(), norm_weight.data_ptr(), eps, packed.data_ptr(), _ptr(bias),
                                            inv_freq.data_ptr(), positions.data_ptr(), sequences.data_ptr(),
                                            q.data_ptr(), k_pages.data_ptr(), v_pages.data_ptr(),
                                            block_table.data_ptr(), block_table.shape[1], kv_heads, head_dim, tokens,
                                            hidden, q_heads, _stream(x)),
               "qkv_rope_append")
    return q


@_qkv_rope_append.register_fake
def _(x, norm_weight, packed, bias, inv_freq, positions, sequences, k_pages, v_pages, block_table, q_heads, eps):
    return x.new_empty(x.shape[0], q_heads, k_pages.shape[3])


@torch.library.custom_op("deepfuse::rope_kv_append", mutates_args=("k_pages", "v_pages"), device_types="cuda")
def _rope_kv_append(qkv: Tensor, bias: Optional[Tensor], inv_freq: Tensor, positions: Tensor, sequences: Tensor,
                    k_pages: Tensor, v_pages: Tensor, block_table: Tensor, q_heads: int) -> Tensor:
    tokens = qkv.shape[0]
    _, kv_heads, _, head_dim = k_pages.shape
    q = torch.empty(tokens, q_heads, head_dim, dtype=torch.bfloat16, device=qkv.device)
    _lib.check(_lib.lib().df_rope_kv_append(qkv.data_ptr(), _ptr(bias), inv_freq.data_ptr(), positions.data_ptr(),
                                            sequences.data_ptr(), q.data_ptr(), k_pages.data_ptr(),
                                            v_pages.data_ptr(), block_table.data_ptr(), block_table.shape[1],
                                            kv_heads, head_dim, tokens, q_heads, _stream(qkv)),
               "rope_kv_append")
    return q


@_rope_kv_append.register_fake
def _(qkv, bias, inv_freq, positions, sequences, k_pages, v_pages, block_table, q_heads):
    return qkv.new_empty(qkv.shape[0], q_heads, k_pages.shape[3])


@torch.library.custom_op("deepfuse::decode_attention", mutates_args=(), device_types="cuda")
def _decode_attention(q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor, seq_lens: Tensor,
                      workspace: Tensor, plan: List[int], scale: float, sliding_window: int) -> Tensor:
    out = torch.empty_like(q)
    values = (ctypes.c_int64 * _PLAN_FIELDS)(*plan)
    _lib.check(_lib.lib().df_decode_attention(values, q.data_ptr(), out.data_ptr(), k_pages.data_ptr(),
                                              v_pages.data_ptr(), block_table.data_ptr(), block_table.shape[1],
                                              seq_lens.data_ptr(), workspace.data_ptr(), scale, sliding_window,
                                              _stream(q)),
               "decode_attention")
    return out


@_decode_attention.register_fake
def _(q, k_pages, v_pages, block_table, seq_lens, workspace, plan, scale, sliding_window):
    return torch.empty_like(q)


@torch.library.custom_op("deepfuse::sample", mutates_args=("slots",), device_types="cuda")
def _sample(logits: Tensor, slots: Tensor) -> Tensor:
    batch, vocab = logits.shape
    ids = torch.empty(batch, dtype=torch.int32, device=logits.device)
    workspace_bytes = int(_lib.lib().df_sampling_workspace_bytes(batch, vocab))
    workspace = torch.empty(max(workspace_bytes, 1), dtype=torch.uint8, device=logits.device)
    _lib.check(_lib.lib().df_sample(logits.data_ptr(), slots.data_ptr(), ids.data_ptr(), workspace.data_ptr(), batch,
                                    vocab, _stream(logits)),
               "sample")
    return ids


@_sample.register_fake
def _(logits, slots):
    return logits.new_empty(logits.shape[0], dtype=torch.int32)


#: Every op this module registers, as torch.ops.deepfuse.<name>.
OP_NAMES = ("pack_swiglu", "swiglu_fused", "rms_norm", "fused_add_rms_norm", "pack_qkv", "qkv_rope_append",
            "rope_kv_append", "decode_attention", "sample")


# ---------------------------------------------------------------------------------------------
# SwiGLU MLP
# ---------------------------------------------------------------------------------------------

_mlp_workspaces: dict = {}


def _mlp_workspace(device: torch.device, hidden: int, tokens: int) -> Tuple[Tensor, Tensor]:
    """The fp32 accumulator and counters shared by every packed MLP of this device and hidden size.

    Calls on one stream never overlap and each leaves both zero, so one pair serves all layers.
    """
    key = (device, hidden)
    current = _mlp_workspaces.get(key)
    if current is None or current[0].numel() < tokens * hidden:
        current = (torch.zeros(tokens * hidden, dtype=torch.float32, device=device),
                   torch.zeros(4, dtype=torch.int32, device=device))
        _mlp_workspaces[key] = current
    return current


@dataclasses.dataclass(eq=False)
class PackedMlpWeights:
    """A SwiGLU MLP's weights in the fused kernel's fragment-packed layout (made by :func:`pack_mlp_weights`).

    ``gate``, ``up`` and ``down`` are the caller's tensors, kept by reference (no copy) for the
    unfused variant; ``norm_weight`` and ``eps`` are the RMSNorm folded into ``gate_up_packed``,
    if any.
    """

    gate_up_packed: Tensor
    down_packed: Tensor
    gate: Tensor
    up: Tensor
    down: Tensor
    hidden: int
    intermediate: int
    norm_weight: Optional[Tensor]
    eps: float
    accumulator: Tensor
    counters: Tensor

    @property
    def workspace_tokens(self) -> int:
        """Most tokens the fused variant takes per call with this workspace."""
        return self.accumulator.numel() // self.hidden


def pack_mlp_weights(gate: Tensor, up: Tensor, down: Tensor, norm_weight: Optional[Tensor] = None,
                     eps: float = 1e-6, max_fused_tokens: int = DEFAULT_MLP_WORKSPACE_TOKENS) -> PackedMlpWeights:
    """Packs Hugging Face layout MLP weights for :func:`swiglu_mlp`.

    Args:
        gate: ``gate_proj.weight``, ``[I, H]`` bf16 on a CUDA device.
        up: ``up_proj.weight``, ``[I, H]``.
        down: ``down_proj.weight``, ``[H, I]``.
        norm_weight: optional ``[H]`` RMSNorm weight applied to x first (a decoder layer's
            ``post_attention_layernorm``). It is multiplied into the packed gate/up columns (fp32
            product rounded once to bf16), and the kernel scales by 1/rms(x) itself.
        eps: that norm's epsilon.
        max_fused_tokens: tokens per call the shared fp32 workspace must hold for the fused variant.

    H and I must be multiples of 64. Runs two packing kernels on the current stream; call it
    outside graph capture. The packed copy is as large as the three weights.
    """
    intermediate, hidden = gate.shape
    _require(up.shape == (intermediate, hidden), lambda: f"up must be [{intermediate}, {hidden}], got {tuple(up.shape)}")
    _require(down.shape == (hidden, intermediate), lambda: f"down must be [{hidden}, {intermediate}], got {tuple(down.shape)}")
    _require(hidden % 64 == 0 and intermediate % 64 == 0,
             lambda: f"hidden ({hidden}) and intermediate ({intermediate}) must be multiples of 64")
    for name, t in (("gate", gate), ("up", up), ("down", down)):
        _require_bf16(name, t)
    if norm_weight is not None:
        _require_bf16("norm_weight", norm_weight)
        _require(norm_weight.shape == (hidden,), lambda: f"norm_weight must be [{hidden}]")
    gate_up_packed, down_packed = torch.ops.deepfuse.pack_swiglu(gate, up, down, norm_weight)
    accumulator, counters = _mlp_workspace(gate.device, hidden, max_fused_tokens)
    _static(gate_up_packed, down_packed, accumulator, counters)
    return PackedMlpWeights(gate_up_packed, down_packed, gate, up, down, hidden, intermediate, norm_weight, float(eps),
                            accumulator, counters)


def _hf_rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm as Hugging Face's LlamaRMSNorm computes it (fp32 statistics, bf16 result times weight)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def swiglu_mlp(x: Tensor, weights: PackedMlpWeights, residual: Optional[Tensor] = None,
               norm_weight: Optional[Tensor] = None, eps: Optional[float] = None, variant: str = "auto") -> Tensor:
    """``down(silu(gate(n)) * up(n)) [+ residual]`` with ``n = rms_norm(x)`` when a norm is given.

    Args:
        x: ``[..., H]`` bf16.
        weights: from :func:`pack_mlp_weights`; a norm folded in there always applies.
        residual: optional tensor of x's shape added to the result (in the same launch when fused).
        norm_weight: an RMSNorm weight to apply first when none was folded in at packing time
            (then a separate norm launch runs first). Passing the folded weight again is allowed.
        eps: the norm's epsilon (default: the packed one, else 1e-6).
        variant: ``"fused"`` (the DeepFusion kernel, one launch), ``"unfused"`` (PyTorch GEMMs and
            elementwise ops) or ``"auto"``: fused up to :data:`FUSED_MLP_MAX_TOKENS` tokens, as the
            decode engine's rule does (the fused kernel loses from 16 tokens on).

    Returns a new ``[..., H]`` bf16 tensor.
    """
    _require(variant in ("auto", "fused", "unfused"), lambda: f"variant must be auto, fused or unfused, not {variant!r}")
    hidden = weights.hidden
    _require(x.shape[-1] == hidden, lambda: f"x's last dimension must be {hidden}, got {x.shape[-1]}")
    shape = x.shape
    x2 = x.reshape(-1, hidden)
    tokens = x2.shape[0]
    res2 = None
    if residual is not None:
        _require(residual.shape == shape, lambda: f"residual must have x's shape {tuple(shape)}")
        res2 = residual.reshape(-1, hidden)
    folded = weights.norm_weight is not None
    if folded and norm_weight is not None:
        _require(norm_weight is weights.norm_weight, "a norm was folded into the packed weights; pass no other")
        norm_weight = None
    norm_eps = weights.eps if eps is None and folded else (1e-6 if eps is None else float(eps))
    use_fused = variant == "fused" or (variant == "auto" and tokens <= FUSED_MLP_MAX_TOKENS)
    if use_fused:
        _require(tokens <= weights.workspace_tokens,
                 lambda: f"{tokens} tokens exceed the fused workspace ({weights.workspace_tokens}); pack with a larger max_fused_tokens")
        if norm_weight is not None:
            x2 = torch.ops.deepfuse.rms_norm(x2.contiguous(), norm_weight, norm_eps)
        y = torch.ops.deepfuse.swiglu_fused(x2.contiguous(), weights.gate_up_packed, weights.down_packed,
                                            None if res2 is None else res2.contiguous(), weights.accumulator,
                                            weights.counters, weights.intermediate, folded, norm_eps)
        return y.reshape(shape)
    n = x2
    if folded or norm_weight is not None:
        n = _hf_rms_norm(x2, weights.norm_weight if folded else norm_weight, norm_eps)
    act = F.silu(F.linear(n, weights.gate)) * F.linear(n, weights.up)
    y = F.linear(act, weights.down)
    if res2 is not None:
        y = y + res2
    return y.reshape(shape)


# ---------------------------------------------------------------------------------------------
# RMSNorm
# ---------------------------------------------------------------------------------------------

def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """``rms_norm(x) * weight`` over the last dimension (a multiple of 8), fp32 statistics. Returns a new tensor."""
    _require_bf16("weight", weight)
    hidden = weight.shape[0]
    _require(x.shape[-1] == hidden and hidden % 8 == 0, lambda: f"x's last dimension must be the weight's ({hidden}), a multiple of 8")
    return torch.ops.deepfuse.rms_norm(x.reshape(-1, hidden).contiguous(), weight, float(eps)).reshape(x.shape)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6) -> Tensor:
    """``residual += x`` (in place, rounded to bf16), then returns ``rms_norm(residual) * weight``.

    The residual add between transformer blocks and the next block's norm in one launch, as
    vLLM's and SGLang's ``fused_add_rms_norm``. ``residual`` must be contiguous; shapes
    ``[..., H]`` with H a multiple of 8.
    """
    _require_bf16("residual", residual)
    _require_bf16("weight", weight)
    hidden = weight.shape[0]
    _require(x.shape == residual.shape and hidden == residual.shape[-1] and hidden % 8 == 0,
             "x and residual must have one shape [..., H], H the weight's size and a multiple of 8")
    out = torch.ops.deepfuse.fused_add_rms_norm(x.reshape(-1, hidden).contiguous(), residual.view(-1, hidden), weight,
                                                float(eps))
    return out.reshape(residual.shape)


# ---------------------------------------------------------------------------------------------
# QKV projection + RoPE + paged KV append
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class PackedQkvWeights:
    """Merged ``[q | k | v]`` projection weights, packed for the fused front half (:func:`pack_qkv_weights`)."""

    packed: Tensor
    merged: Tensor  # [(q_heads + 2 kv_heads) head_dim, H] row-major, for the unfused path (> 32 tokens)
    bias: Optional[Tensor]
    q_heads: int
    kv_heads: int
    head_dim: int
    hidden: int


def pack_qkv_weights(q_weight: Tensor, k_weight: Tensor, v_weight: Tensor, head_dim: int,
                     bias: Optional[Tensor] = None) -> PackedQkvWeights:
    """Merges and packs ``q_proj``/``k_proj``/``v_proj`` weights (``[heads * head_dim, H]`` bf16).

    ``bias``: the merged ``[q | k | v]`` bias (Qwen2) or None. H a multiple of 64; head_dim 64 or 128.
    """
    merged = torch.cat([q_weight, k_weight, v_weight], dim=0).contiguous()
    _require_bf16("qkv weights", merged)
    rows, hidden = merged.shape
    _require(hidden % 64 == 0 and rows % 16 == 0, lambda: f"hidden ({hidden}) must be a multiple of 64, rows ({rows}) of 16")
    _require(q_weight.shape[0] % head_dim == 0 and k_weight.shape[0] % head_dim == 0, "rows must be whole heads")
    if bias is not None:
        _require_bf16("bias", bias)
        _require(bias.shape == (rows,), lambda: f"bias must be [{rows}]")
    packed = torch.ops.deepfuse.pack_qkv(merged)
    _static(packed, merged)
    return PackedQkvWeights(packed, merged, bias, q_weight.shape[0] // head_dim, k_weight.shape[0] // head_dim, head_dim,
                            hidden)


def rope_inv_freq(head_dim: int, theta: float = 10000.0, device: Union[str, torch.device, None] = None) -> Tensor:
    """Default RoPE inverse frequencies ``theta^(-2i/head_dim)``, fp32 ``[head_dim / 2]``.

    For scaled RoPE (Llama 3) pass the model's own ``rotary_emb.inv_freq`` (as fp32) instead.
    """
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim)).float()


def qkv_rope_append(x: Tensor, weights: PackedQkvWeights, norm_weight: Tensor, inv_freq: Tensor, positions: Tensor,
                    sequences: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor, eps: float = 1e-6,
                    variant: str = "auto") -> Tensor:
    """A decoder layer's front half: ``q, k, v = rope(rms_norm(x) @ Wqkv^T + b)``; k, v appended to the cache.

    Args:
        x: ``[T, H]`` bf16 residual stream (not normalised).
        weights: from :func:`pack_qkv_weights`.
        norm_weight: ``[H]`` the layer's ``input_layernorm`` weight.
        inv_freq: ``[head_dim / 2]`` fp32 RoPE inverse frequencies (rotate-half layout).
        positions: ``[T]`` int32 position of each token; negative: a padded slot (q zeroed, cache untouched).
        sequences: ``[T]`` int32 block-table row of each token.
        k_pages, v_pages: one layer's ``[pages, kv_heads, 16, head_dim]`` bf16 pools, written in place.
        block_table: ``[rows, max_pages]`` int32 page ids.
        variant: ``"fused"`` (one launch, up to 32 tokens), ``"unfused"`` (norm kernel, PyTorch GEMM,
            ``rope_kv_append`` kernel) or ``"auto"`` (fused up to 32 tokens).

    Returns the rotated queries ``[T, q_heads, head_dim]`` bf16.
    """
    _require(variant in ("auto", "fused", "unfused"), lambda: f"variant must be auto, fused or unfused, not {variant!r}")
    _require_bf16("x", x)
    _require(k_pages.dim() == 4 and k_pages.shape[1] == weights.kv_heads and k_pages.shape[2] == KV_PAGE_SIZE
             and k_pages.shape[3] == weights.head_dim and v_pages.shape == k_pages.shape,
             lambda: f"k_pages and v_pages must be [pages, {weights.kv_heads}, {KV_PAGE_SIZE}, {weights.head_dim}] bf16")
    _require(positions.dtype == torch.int32 and sequences.dtype == torch.int32 and block_table.dtype == torch.int32,
             "positions, sequences and block_table must be int32")
    _require(inv_freq.dtype == torch.float32, "inv_freq must be float32")
    tokens = x.shape[0]
    if variant == "fused" or (variant == "auto" and tokens <= QKV_FUSED_MAX_TOKENS):
        _require(tokens <= QKV_FUSED_MAX_TOKENS, lambda: f"the fused variant takes at most {QKV_FUSED_MAX_TOKENS} tokens")
        return torch.ops.deepfuse.qkv_rope_append(x, norm_weight, weights.packed, weights.bias, inv_freq, positions,
                                                  sequences, k_pages, v_pages, block_table, weights.q_heads, float(eps))
    qkv = F.linear(torch.ops.deepfuse.rms_norm(x, norm_weight, float(eps)), weights.merged)
    return torch.ops.deepfuse.rope_kv_append(qkv, weights.bias, inv_freq, positions, sequences, k_pages, v_pages,
                                             block_table, weights.q_heads)


# ---------------------------------------------------------------------------------------------
# Decode attention
# ---------------------------------------------------------------------------------------------

@dataclasses.dataclass(eq=False)
class DecodeAttentionPlan:
    """A fixed launch shape for one batch bucket (:func:`plan_decode_attention`), reused by every call.

    ``fields`` are the planner's integers (batch, q_heads, kv_heads, head_dim, max_context, splits
    per sequence, pages per split, min pages per split, warps per block, cluster merge, workspace
    bytes); ``workspace`` is its zeroed merge workspace, which the kernel leaves zero.
    """

    fields: Tuple[int, ...]
    workspace: Tensor

    @property
    def batch(self) -> int:
        return self.fields[0]

    @property
    def q_heads(self) -> int:
        return self.fields[1]

    @property
    def kv_heads(self) -> int:
        return self.fields[2]

    @property
    def head_dim(self) -> int:
        return self.fields[3]

    @property
    def max_context(self) -> int:
        return self.fields[4]

    @property
    def splits_per_sequence(self) -> int:
        return self.fields[5]


def plan_decode_attention(batch: int, q_heads: int, kv_heads: int, head_dim: int, max_context: int,
                          device: Union[str, torch.device, int, None] = None, splits: int = 0) -> DecodeAttentionPlan:
    """Plans split-KV decode attention for a batch bucket and allocates its workspace (zeroed).

    Make one per batch bucket (and maximum context) when setting up, outside graph capture; the
    same plan then serves every step and every sequence length up to ``max_context``, in or out
    of CUDA graphs. ``splits`` > 0 forces that many splits per sequence. head_dim 64 or 128.
    """
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    num_sms = torch.cuda.get_device_properties(device).multi_processor_count
    values = (ctypes.c_int64 * _PLAN_FIELDS)()
    with torch.cuda.device(device):
        _lib.check(_lib.lib().df_plan_decode_attention(batch, q_heads, kv_heads, head_dim, max_context, num_sms, splits,
                                                       values),
                   "plan_decode_attention")
    fields = tuple(int(v) for v in values)
    workspace = torch.zeros(max(fields[10], 16), dtype=torch.uint8, device=device)
    _static(workspace)
    return DecodeAttentionPlan(fields, workspace)


def decode_attention(q: Tensor, k_pages: Tensor, v_pages: Tensor, block_table: Tensor, seq_lens: Tensor,
                     plan: DecodeAttentionPlan, scale: Optional[float] = None, sliding_window: int = 0) -> Tensor:
    """One query token per sequence over the paged KV cache (GQA, split-KV, merged in one launch).

    Args:
        q: ``[plan.batch, q_heads, head_dim]`` bf16 rotated queries (pad a smaller batch to the bucket).
        k_pages, v_pages: ``[pages, kv_heads, 16, head_dim]`` bf16 pools of one layer.
        block_table: ``[rows >= batch, max_pages]`` int32; row i belongs to sequence i.
        seq_lens: ``[batch]`` int32 keys per sequence including the current token; 0: a padded slot
            (its output is zeros). Read on the device, so one graph serves every length.
        plan: from :func:`plan_decode_attention` for this batch bucket.
        scale: softmax scale, default ``1/sqrt(head_dim)``.
        sliding_window: > 0 attends to the last ``sliding_window`` keys only (Mistral).

    Returns ``[batch, q_heads, head_dim]`` bf16.
    """
    _require_bf16("q", q)
    _require(q.shape == (plan.batch, plan.q_heads, plan.head_dim),
             lambda: f"q must be [{plan.batch}, {plan.q_heads}, {plan.head_dim}] for this plan, got {tuple(q.shape)}")
    _require(k_pages.dim() == 4 and k_pages.shape[1:] == (plan.kv_heads, KV_PAGE_SIZE, plan.head_dim)
             and v_pages.shape == k_pages.shape, "k_pages/v_pages do not match the plan")
    _require(seq_lens.dtype == torch.int32 and block_table.dtype == torch.int32, "seq_lens and block_table must be int32")
    scale = plan.head_dim ** -0.5 if scale is None else float(scale)
    return torch.ops.deepfuse.decode_attention(q, k_pages, v_pages, block_table, seq_lens, plan.workspace,
                                               list(plan.fields), scale, int(sliding_window))


# ---------------------------------------------------------------------------------------------
# Sampling
# ---------------------------------------------------------------------------------------------

def _per_row(value, batch: int, name: str) -> list:
    if isinstance(value, (list, tuple)):
        _require(len(value) == batch, lambda: f"{name} has {len(value)} entries for a batch of {batch}")
        return list(value)
    return [value] * batch


def make_sampling_slots(batch: int, temperature: Union[float, Sequence[float]] = 0.0,
                        top_k: Union[int, Sequence[int]] = 0, top_p: Union[float, Sequence[float]] = 1.0,
                        min_p: Union[float, Sequence[float]] = 0.0, seed: Union[int, Sequence[int]] = 0,
                        device: Union[str, torch.device, None] = "cuda") -> Tensor:
    """Per-row sampling parameters for :func:`sample`, as a ``[batch, 4]`` int64 tensor (32 bytes a row).

    Each argument is one value for every row or a sequence of ``batch`` values. temperature <= 0
    is greedy (argmax, lowest id on ties); top_k 0, top_p 1 and min_p 0 are off. Each row draws
    its n-th token from the uniform of ``(seed, n)``: :func:`sample` advances n on the device.
    """
    rows = zip(_per_row(temperature, batch, "temperature"), _per_row(top_k, batch, "top_k"),
               _per_row(top_p, batch, "top_p"), _per_row(min_p, batch, "min_p"), _per_row(seed, batch, "seed"))
    data = bytearray()
    for t, k, p, m, s in rows:
        data += _SLOT.pack(float(t), int(k), float(p), float(m), int(s) & (2**64 - 1), 0)
    return torch.frombuffer(data, dtype=torch.int64).reshape(batch, 4).clone().to(device)


def sample(logits: Tensor, slots: Tensor) -> Tensor:
    """Samples one id per row of ``logits`` ``[batch, vocab]`` (fp32; others are converted).

    ``slots`` from :func:`make_sampling_slots`; each row's draw counter is advanced in place.
    Greedy / temperature / top-k / top-p / min-p in one launch, with the CPU reference's semantics.
    Returns ``[batch]`` int32 ids.
    """
    _require(logits.dim() == 2, "logits must be [batch, vocab]")
    _require(slots.dtype == torch.int64 and slots.shape == (logits.shape[0], 4) and slots.is_contiguous(),
             "slots must be make_sampling_slots()'s [batch, 4] int64 tensor")
    return torch.ops.deepfuse.sample(logits.float().contiguous(), slots)
