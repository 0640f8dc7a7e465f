"""``deepfuse.patch(model)``: Hugging Face Llama, Qwen2 and Mistral MLPs on the fused SwiGLU kernel.

Each decoder layer's ``post_attention_layernorm`` + ``mlp`` pair becomes one
:class:`FusedSwiGLUMLP` (the norm folded into the packed weights, ``nn.Identity`` in the norm's
place); the layer's own residual add is unchanged. So the layer's code is not touched, and the model
works as before with ``generate``, the static cache and ``torch.compile``. :func:`unpatch` puts the
original modules back; the original weights stay in the model throughout, so patching adds one
packed copy of the MLP weights.

Which token counts take the fused kernel is measured when the model is patched
(:func:`measure_dispatch`): at each count the fused kernel must beat the three cuBLAS GEMMs the
stock MLP runs, alone, with every layer's weights streaming from HBM. Above the largest such count
(prefill, large batches) the layer runs its own, original norm and MLP modules, so there the
patched model is the stock model, kernel for kernel, under ``torch.compile`` too.
"""

import dataclasses
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from . import _lib, _timing, ops

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")

#: Token counts (decode batch x new tokens) the dispatch is measured at. A count between two of
#: them takes the larger one's choice: neither path gets cheaper with more tokens. The largest is
#: the fused kernel's shared workspace (ops.DEFAULT_MLP_WORKSPACE_TOKENS); above it, the stock MLP.
DISPATCH_TOKENS = (1, 2, 4, 8, 16, 32, ops.DEFAULT_MLP_WORKSPACE_TOKENS)


@dataclasses.dataclass(frozen=True, eq=False)
class MlpDispatch:
    """Which path an MLP call of ``tokens`` tokens takes: fused up to ``fused_max_tokens``, the stock
    modules above (0: never fused). ``source`` says where the number came from; ``timings`` holds
    the measurement behind it (µs per layer: ``m``, ``fused_us``, ``gemms_us``), if any."""

    fused_max_tokens: int
    source: str
    timings: Sequence[Dict[str, float]] = ()

    def fused(self, tokens: int) -> bool:
        return tokens <= self.fused_max_tokens


def choose_fused_max_tokens(timings: Sequence[Dict[str, float]]) -> int:
    """The largest measured count up to which the fused kernel beats the GEMMs at every count (0 when
    it loses at the smallest). Stops at the first loss: a count it wins above one it loses is noise."""
    best = 0
    for row in sorted(timings, key=lambda r: r["m"]):
        if not row["fused_us"] < row["gemms_us"]:
            break
        best = int(row["m"])
    return best


@torch.no_grad()
def measure_dispatch(mlps: Sequence[nn.Module], packed: Sequence[ops.PackedMlpWeights],
                     tokens: Sequence[int] = DISPATCH_TOKENS) -> MlpDispatch:
    """Times, at each token count, one call per layer back to back in a CUDA graph (so each call reads
    its layer's weights from HBM, as in a decode step): the fused kernel with its folded norm, and the
    stock MLP's three cuBLAS GEMMs alone (gate, up, down; without its norm and ``silu * mul``, so the
    stock side is timed at its best and the fused kernel must beat what torch.compile can make of it)."""
    hidden, inter = packed[0].hidden, packed[0].intermediate
    device = packed[0].gate_up_packed.device
    # A model spread over GPUs (device_map): the first GPU's layers stand for all.
    pairs = [(mlp, w) for mlp, w in zip(mlps, packed) if w.gate_up_packed.device == device]
    mlps, packed = [mlp for mlp, _ in pairs], [w for _, w in pairs]
    timings = []
    for m in tokens:
        x = torch.randn(m, hidden, device=device).to(torch.bfloat16)  # the calls below read x and act when run
        act = torch.randn(m, inter, device=device).to(torch.bfloat16)
        fused = [lambda w=w: ops.swiglu_mlp(x, w, variant="fused") for w in packed]

        def gemms(mlp: nn.Module) -> None:
            F.linear(x, mlp.gate_proj.weight)
            F.linear(x, mlp.up_proj.weight)
            F.linear(act, mlp.down_proj.weight)

        stock = [lambda mlp=mlp: gemms(mlp) for mlp in mlps]
        timings.append({"m": m, "fused_us": round(_timing.graph_call_us(fused, replays=5), 2),
                        "gemms_us": round(_timing.graph_call_us(stock, replays=5), 2)})
    return MlpDispatch(choose_fused_max_tokens(timings), f"measured on {torch.cuda.get_device_name(device)}",
                       tuple(timings))


def engine_rule_dispatch() -> MlpDispatch:
    """Where nothing can be measured (meta-device tracing, no compiled kernels): the decode engine's
    built-in rule, fused up to :data:`deepfuse.ops.FUSED_MLP_MAX_TOKENS` tokens."""
    return MlpDispatch(ops.FUSED_MLP_MAX_TOKENS, "the decode engine's rule (nothing measured)")


class FusedSwiGLUMLP(nn.Module):
    """``mlp(post_attention_layernorm(x))``: one fused launch where ``dispatch`` says so, else the
    original norm and MLP modules."""

    def __init__(self, mlp: nn.Module, norm: nn.Module, dispatch: MlpDispatch, variant: str = "auto"):
        super().__init__()
        if variant not in ("auto", "fused", "unfused"):
            raise ValueError(f"deepfuse.patch: variant must be auto, fused or unfused, not {variant!r}")
        eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
        self.weights = ops.pack_mlp_weights(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight,
                                            norm_weight=norm.weight, eps=eps)
        self.dispatch = dispatch
        self.variant = variant
        # Kept (not as submodules: state_dict and parameters() stay the unpatched model's) for the
        # stock path and unpatch(). Their weights keep their address for torch.compile's CUDA graphs.
        self._original = (mlp, norm)
        ops._static(*mlp.parameters(), *norm.parameters())

    def forward(self, x: Tensor) -> Tensor:
        tokens = x.numel() // x.shape[-1]
        if self.variant == "fused" or (self.variant == "auto" and self.dispatch.fused(tokens)):
            return ops.swiglu_mlp(x, self.weights, variant="fused")
        mlp, norm = self._original
        return mlp(norm(x))

    def extra_repr(self) -> str:
        w = self.weights
        return (f"hidden={w.hidden}, intermediate={w.intermediate}, eps={w.eps}, variant={self.variant}, "
                f"fused up to {self.dispatch.fused_max_tokens} tokens ({self.dispatch.source})")


def _decoder_layers(model: nn.Module) -> List[nn.Module]:
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"deepfuse.patch supports model types {SUPPORTED_MODEL_TYPES}, not {model_type!r}")
    layers = [m for m in model.modules() if hasattr(m, "mlp") and hasattr(m, "post_attention_layernorm")]
    if not layers:
        raise ValueError("deepfuse.patch found no decoder layer (a module with .mlp and .post_attention_layernorm)")
    return layers


def _check_mlp(layer: nn.Module, index: int) -> None:
    mlp = layer.mlp
    for name in ("gate_proj", "up_proj", "down_proj"):
        proj = getattr(mlp, name, None)
        if proj is None or not isinstance(proj, nn.Linear):
            raise ValueError(f"layer {index}: mlp.{name} is not an nn.Linear")
        if proj.bias is not None:
            raise ValueError(f"layer {index}: mlp.{name} has a bias (mlp_bias), which the fused kernel does not add")
        w = proj.weight
        if w.dtype != torch.bfloat16 or w.device.type not in ("cuda", "meta"):  # meta: tracing only
            raise ValueError(f"layer {index}: MLP weights must be bfloat16 on a CUDA device (got {w.dtype} on {w.device}); "
                             "load the model with torch_dtype=torch.bfloat16 and move it to the GPU first")
    act = getattr(mlp, "act_fn", None)
    if act is not None and not isinstance(act, nn.SiLU) and type(act).__name__ not in ("SiLU", "SiLUActivation"):
        raise ValueError(f"layer {index}: activation {type(act).__name__} is not SiLU")


def _dispatch_for(layers: List[nn.Module], fused: List[FusedSwiGLUMLP], fused_max_tokens: Optional[int]) -> MlpDispatch:
    if fused_max_tokens is not None:
        if not 0 <= fused_max_tokens <= ops.DEFAULT_MLP_WORKSPACE_TOKENS:
            raise ValueError(f"deepfuse.patch: fused_max_tokens must be in 0..{ops.DEFAULT_MLP_WORKSPACE_TOKENS}, "
                             f"not {fused_max_tokens}")
        return MlpDispatch(fused_max_tokens, "given to patch()")
    if fused[0].weights.gate_up_packed.device.type != "cuda" or not _lib.available():
        return engine_rule_dispatch()
    return measure_dispatch([layer.mlp for layer in layers], [f.weights for f in fused])


@torch.no_grad()
def patch(model: nn.Module, variant: str = "auto", fused_max_tokens: Optional[int] = None) -> nn.Module:
    """Replaces every decoder layer's post-attention RMSNorm + SwiGLU MLP with :class:`FusedSwiGLUMLP`.

    Args:
        model: a transformers ``LlamaForCausalLM``/``Qwen2ForCausalLM``/``MistralForCausalLM``
            (or their base models), bf16 on a CUDA device. Hidden and intermediate sizes must be
            multiples of 64; MLPs with a bias are refused.
        variant: ``"auto"``: the fused kernel up to the token count where it beats the stock MLP on
            this GPU (measured here, about a second; see :func:`measure_dispatch`), the original
            modules above. ``"fused"``: the fused kernel at every call (up to 64 tokens);
            ``"unfused"``: always the original modules.
        fused_max_tokens: skip the measurement and fuse up to this many tokens (0..64).

    Returns the same model, patched in place. Patching twice is an error; :func:`unpatch` undoes it.
    Call it before ``torch.compile``. The choice made is in each ``FusedSwiGLUMLP.dispatch``.
    """
    layers = _decoder_layers(model)
    if any(isinstance(layer.mlp, FusedSwiGLUMLP) for layer in layers):
        raise ValueError("deepfuse.patch: the model is already patched")
    for index, layer in enumerate(layers):
        _check_mlp(layer, index)
    # Packed first with a placeholder choice, so the measurement runs on the weights the calls will read.
    fused = [FusedSwiGLUMLP(layer.mlp, layer.post_attention_layernorm, engine_rule_dispatch(), variant)
             for layer in layers]
    dispatch = _dispatch_for(layers, fused, fused_max_tokens)
    for layer, module in zip(layers, fused):
        module.dispatch = dispatch
        layer.mlp = module
        layer.post_attention_layernorm = nn.Identity()
    return model


def unpatch(model: nn.Module) -> nn.Module:
    """Restores the modules :func:`patch` replaced; frees the packed weights. Returns the model."""
    for layer in model.modules():
        mlp = getattr(layer, "mlp", None)
        if isinstance(mlp, FusedSwiGLUMLP):
            layer.mlp, layer.post_attention_layernorm = mlp._original
    return model


def is_patched(model: nn.Module) -> bool:
    """True when :func:`patch` has replaced at least one MLP of `model`."""
    return any(isinstance(m, FusedSwiGLUMLP) for m in model.modules())


def dispatch_of(model: nn.Module) -> Optional[MlpDispatch]:
    """The dispatch a patched model's MLPs follow (None when not patched)."""
    for m in model.modules():
        if isinstance(m, FusedSwiGLUMLP):
            return m.dispatch
    return None


__all__: List[Any] = ["patch", "unpatch", "is_patched", "dispatch_of", "measure_dispatch", "choose_fused_max_tokens",
                      "MlpDispatch", "FusedSwiGLUMLP", "SUPPORTED_MODEL_TYPES", "DISPATCH_TOKENS"]
