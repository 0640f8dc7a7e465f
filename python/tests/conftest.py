"""pytest setup for the Python package's tests (run by scripts/test.sh through scripts/test-python.sh)."""

import pytest
import torch


def gpu_skip_reason():
    """None when the GPU tests can run, else why not."""
    if not torch.cuda.is_available():
        return "no CUDA device visible to PyTorch (GPU tests run on a GPU machine)"
    import deepfuse

    if not deepfuse.kernels_available():
        return f"deepfuse's compiled kernels are missing at {deepfuse.library_path()}"
    major, _ = torch.cuda.get_device_capability()
    if major < 8:
        return "deepfuse's kernels need compute capability 8.0 or newer"
    return None


requires_gpu = pytest.mark.skipif(gpu_skip_reason() is not None, reason=str(gpu_skip_reason()))


@pytest.fixture
def seed():
    """A fresh seed each run, printed so a failure can be reproduced with torch.manual_seed."""
    value = int(torch.randint(0, 2**31 - 1, (1,), generator=torch.Generator().manual_seed(torch.seed() % 2**31)))
    print(f"seed {value}")
    torch.manual_seed(value)
    return value


def rel_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in fp64, as the C++ tests measure bf16 kernels."""
    out = out.double()
    ref = ref.double()
    return float((out - ref).norm() / ref.norm().clamp_min(1e-30))
