"""``deepfuse.patch(model)``: Hugging Face Llama, Qwen2 and Mistral MLPs on the fused SwiGLU kernel.

Each decoder layer's ``post_attention_layernorm`` + ``mlp`` pair becomes one
:class:`FusedSwiGLUMLP` (the norm folded into the packed weights, ``nn.Identity`` in the norm's
place); the layer's own residual add is unchanged. So the layer's code is not touched, and the model
works as before with ``generate``, the static cache and ``torch.compile``. :func:`unpatch` puts the
original modules back; the original weights stay in the model throughout (the unfused path above
:data:`deepfuse.ops.FUSED_MLP_MAX_TOKENS` tokens, prefill, uses them), so patching adds one packed
copy of the MLP weights.
"""

from typing import Any, List

import torch
from torch import Tensor, nn

from . import ops

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


class FusedSwiGLUMLP(nn.Module):
    """``mlp(post_attention_layernorm(x))`` in one fused launch for decode (up to 8 tokens)."""

    def __init__(self, mlp: nn.Module, norm: nn.Module, variant: str = "auto"):
        super().__init__()
        eps = float(getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6)))
        self.weights = ops.pack_mlp_weights(mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight,
                                            norm_weight=norm.weight, eps=eps)
        self.variant = variant
        # Kept (not as submodules: state_dict and parameters() stay the unpatched model's) for unpatch().
        self._original = (mlp, norm)

    def forward(self, x: Tensor) -> Tensor:
        return ops.swiglu_mlp(x, self.weights, variant=self.variant)

    def extra_repr(self) -> str:
        w = self.weights
        return f"hidden={w.hidden}, intermediate={w.intermediate}, eps={w.eps}, variant={self.variant}"


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


@torch.no_grad()
def patch(model: nn.Module, variant: str = "auto") -> nn.Module:
    """Replaces every decoder layer's post-attention RMSNorm + SwiGLU MLP with :class:`FusedSwiGLUMLP`.

    Args:
        model: a transformers ``LlamaForCausalLM``/``Qwen2ForCausalLM``/``MistralForCausalLM``
            (or their base models), bf16 on a CUDA device. Hidden and intermediate sizes must be
            multiples of 64; MLPs with a bias are refused.
        variant: passed to :func:`deepfuse.swiglu_mlp` (``"auto"``: fused up to 8 tokens).

    Returns the same model, patched in place. Patching twice is an error; :func:`unpatch` undoes it.
    Call it before ``torch.compile``.
    """
    layers = _decoder_layers(model)
    if any(isinstance(layer.mlp, FusedSwiGLUMLP) for layer in layers):
        raise ValueError("deepfuse.patch: the model is already patched")
    for index, layer in enumerate(layers):
        _check_mlp(layer, index)
    for layer in layers:
        fused = FusedSwiGLUMLP(layer.mlp, layer.post_attention_layernorm, variant)
        layer.mlp = fused
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


__all__: List[Any] = ["patch", "unpatch", "is_patched", "FusedSwiGLUMLP", "SUPPORTED_MODEL_TYPES"]
