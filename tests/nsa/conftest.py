"""Shared fixtures for the NSA test suite."""

import os
import sys

import pytest
import torch

# The Triton kernels run through Triton's interpreter where there is no GPU. The interpreter is chosen when a
# kernel is defined (@triton.jit), so the variable must be set before any kernel module is imported; the ahead-of-
# time compile test runs its compiler in a subprocess without it (nsa.attention.kernels.aot).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Make the helper modules (reference.py, nsa_test_utils.py) importable whatever
# pytest import mode is used.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from nsa import toggles  # noqa: E402
from nsa.toggles import TOGGLES  # noqa: E402

NSA_ENV_VARS = tuple(name for name, toggle in TOGGLES.items() if toggle.affects_run)


@pytest.fixture(autouse=True, scope="session")
def _interpreter_address_check():
    """Through Triton's interpreter every kernel access is checked against its launch's tensors
    (nsa.attention.kernels.interpreter_check: a kernel's out-of-bounds access raises where it happens instead of
    corrupting the heap); NSA_TEST_NO_BOUNDS=1 turns the check off. The interpreter runs without its own check of
    every 32-bit add, sub and mul for overflow (NSA_TEST_OVERFLOW_CHECK=1 keeps it), patches the language once per
    launch, not again at each helper call, looks a type's numpy dtype up once, and computes the xor reductions of
    tl.sort and the index build's segmented count with numpy (interpreter_speed.py says why none of them changes what
    a kernel computes)."""
    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") != "1":
        yield
        return
    from nsa.attention.kernels import interpreter_check
    from interpreter_speed import cached_np_dtypes, one_patch_per_launch, overflow_checks, vectorized_combines

    with overflow_checks(toggles.parse("NSA_TEST_OVERFLOW_CHECK")), one_patch_per_launch(), cached_np_dtypes(), \
            vectorized_combines():
        if toggles.parse("NSA_TEST_NO_BOUNDS"):
            yield
            return
        with interpreter_check.checking():
            yield


@pytest.fixture(autouse=True)
def _no_nsa_env_overrides(monkeypatch):
    """Tests run with the override variables unset unless a test sets them."""
    for name in NSA_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture(autouse=True)
def _seed():
    """Every test starts from the same torch RNG state (tests also seed explicitly)."""
    torch.manual_seed(0)
    yield
