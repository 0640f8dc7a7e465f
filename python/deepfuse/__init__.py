"""deepfuse for PyTorch: deepfuse's fused decode kernels as ``torch.ops.deepfuse`` ops.

Ops (each also a ``torch.ops.deepfuse.*`` op with a schema and a fake implementation, so
``torch.compile`` traces it and CUDA graphs capture it):

- :func:`swiglu_mlp` with :func:`pack_mlp_weights`: the whole SwiGLU MLP (RMSNorm and residual
  add optional) in one launch;
- :func:`fused_add_rms_norm` and :func:`rms_norm`;
- :func:`qkv_rope_append` with :func:`pack_qkv_weights`: norm + QKV + RoPE + paged KV append;
- :func:`decode_attention` with :func:`plan_decode_attention`: split-KV paged GQA attention;
- :func:`sample` with :func:`make_sampling_slots`: greedy / temperature / top-k / top-p / min-p.

:func:`patch` / :func:`unpatch` put Hugging Face Llama, Qwen2 and Mistral MLPs on the fused
kernel, at the token counts where it measured faster than the stock MLP on this GPU. ``python -m deepfuse.bench`` compares them with plain PyTorch. See docs/python.md.
"""

try:
    import torch  # noqa: F401
except ImportError as error:  # pragma: no cover - exercised only without PyTorch
    raise ImportError("deepfuse needs PyTorch (2.4 or newer): pip install torch") from error

from ._lib import DeepfuseKernelError, DeepfuseLibraryError, available as kernels_available, library_path
from .ops import (
    FUSED_MLP_MAX_TOKENS,
    KV_PAGE_SIZE,
    OP_NAMES,
    QKV_FUSED_MAX_TOKENS,
    DecodeAttentionPlan,
    PackedMlpWeights,
    PackedQkvWeights,
    decode_attention,
    fused_add_rms_norm,
    make_sampling_slots,
    pack_mlp_weights,
    pack_qkv_weights,
    plan_decode_attention,
    qkv_rope_append,
    rms_norm,
    rope_inv_freq,
    sample,
    swiglu_mlp,
)
from .patch import FusedSwiGLUMLP, MlpDispatch, dispatch_of, is_patched, patch, unpatch

__version__ = "0.1.0"

__all__ = [
    "DecodeAttentionPlan", "DeepfuseKernelError", "DeepfuseLibraryError", "FUSED_MLP_MAX_TOKENS", "FusedSwiGLUMLP",
    "KV_PAGE_SIZE", "MlpDispatch", "OP_NAMES", "PackedMlpWeights", "PackedQkvWeights", "QKV_FUSED_MAX_TOKENS", "decode_attention",
    "dispatch_of", "fused_add_rms_norm", "is_patched", "kernels_available", "library_path", "make_sampling_slots",
    "pack_mlp_weights", "pack_qkv_weights", "patch", "plan_decode_attention", "qkv_rope_append", "rms_norm",
    "rope_inv_freq", "sample", "swiglu_mlp", "unpatch",
]
