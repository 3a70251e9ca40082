"""Triton kernels run in Triton's CPU interpreter where no CUDA device is present.

NOTE: ``TRITON_INTERPRET`` is Triton's own switch and is read when a ``@triton.jit`` function
is defined, so it is set here, at the root of the tests, before any test module (engine and
model tests import kernels too) imports ``oscarkv.kernels``. The package itself never reads
environment variables.
"""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
