"""The first-run model (scripts/first_model/): deepfuse's reference backend against transformers,
64 greedy tokens per prompt, exactly (scripts/first_model/parity.py). scripts/test-python.sh trains
the model (cached) and points this test at it and at the deepfuse binary; scripts/device/gpu.sh's
first-model step runs the same script on the cuda backend."""

import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODEL = os.environ.get("DEEPFUSE_FIRST_MODEL")
CLI = os.environ.get("DEEPFUSE_CLI")


@pytest.mark.skipif(not (MODEL and CLI), reason="DEEPFUSE_FIRST_MODEL and DEEPFUSE_CLI unset: scripts/test-python.sh "
                                                "sets them after building the model and the deepfuse binary")
def test_reference_backend_greedy_tokens_equal_transformers():
    done = subprocess.run([sys.executable, str(ROOT / "scripts/first_model/parity.py"), "--deepfuse", CLI,
                           "--model", MODEL, "--backend", "reference", "--tokens", "64"],
                          capture_output=True, text=True, timeout=600)
    print(done.stdout, done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("\nok  ") + done.stdout.startswith("ok  ") == 4, done.stdout
