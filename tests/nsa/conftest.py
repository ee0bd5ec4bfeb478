"""Shared fixtures for the NSA test suite."""

import os
import sys

import pytest
import torch

# Make the helper modules (reference.py, nsa_test_utils.py) importable whatever
# pytest import mode is used.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from nsa.toggles import TOGGLES  # noqa: E402

NSA_ENV_VARS = tuple(TOGGLES)


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
