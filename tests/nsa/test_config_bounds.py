"""The model's config refuses what torch would fail on without a word about the setting: a size past a tensor
dimension's int64 (vocab_size 10**23 failed inside torch's C++ with an overflow), and an infinite norm_eps,
init_std or rope_theta (or one past a float's range) built directly (the trainer's config loader refuses them too: an infinite norm_eps zeroed
every normalised activation and trained nothing)."""

from __future__ import annotations

import math

import pytest

from nsa.config import ModelConfig

BASE = dict(vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_groups=2, d_k=8, d_v=8, l=8, d=4, l_sel=8, n_sel=4,
            w=16)


@pytest.mark.parametrize("key", ["vocab_size", "dim", "n_layers", "w", "ffn_hidden"])
def test_a_size_past_int64_is_refused_naming_it(key):
    with pytest.raises(ValueError, match=key):
        ModelConfig.from_flat({**BASE, key: 10 ** 23})
    ModelConfig.from_flat({**BASE, key: 2 ** 6 if key != "n_layers" else 2})  # an ordinary one loads


@pytest.mark.parametrize("key", ["norm_eps", "init_std", "rope_theta"])
@pytest.mark.parametrize("value", [math.inf, 10 ** 400])
def test_an_infinite_scale_or_one_past_a_floats_range_is_refused(key, value):
    with pytest.raises(ValueError, match=f"{key} must be a positive finite number"):
        ModelConfig.from_flat({**BASE, key: value})
    ModelConfig.from_flat({**BASE, key: 1e-5 if key != "rope_theta" else 1e4})  # an ordinary one loads
