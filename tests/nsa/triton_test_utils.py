"""Helpers for the Triton kernel tests (tests/nsa/attention/kernels/).

Triton kernel tests need the `triton` package (the `gpu` extra; CI installs it). Without a GPU they run through
the interpreter (TRITON_INTERPRET=1, set by tests/nsa/conftest.py before anything imports triton): fp32, small
shapes. With a GPU the same tests run natively.
"""

import importlib.util

import pytest
import torch

HAVE_TRITON = importlib.util.find_spec("triton") is not None
ON_GPU = torch.cuda.is_available()

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="needs the triton package (pip install -e '.[gpu]')")

# Where the Triton kernels run in this session: cuda natively, else cpu through the interpreter.
KERNEL_DEVICE = torch.device("cuda" if ON_GPU else "cpu")
