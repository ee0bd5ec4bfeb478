"""NSAConfig validation and environment overrides."""

import dataclasses
import re

import pytest
import torch

from nsa import NSAAttention, NSAConfig

REQUIRED = dict(dim=64, n_heads=4, n_kv_groups=2, d_k=16, d_v=16)


def _names_field(message: str, field: str) -> bool:
    # the field name as a whole identifier: "d" must not match inside "d_k"
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(field)}(?![A-Za-z0-9_])", message) is not None


def test_defaults_and_dataclass():
    cfg = NSAConfig(**REQUIRED)
    assert dataclasses.is_dataclass(cfg)
    assert (cfg.l, cfg.d, cfg.l_sel, cfg.n_sel, cfg.w) == (32, 16, 64, 16, 512)
    assert cfg.phi == "mlp" and cfg.gate == "sigmoid"
    assert cfg.rope_theta == 10000.0
    assert cfg.prefill == "batched" and cfg.selection == "v2"
    cfg2 = dataclasses.replace(cfg, prefill="sequential", selection="v1")
    assert cfg2.prefill == "sequential" and cfg2.selection == "v1"
    assert cfg.prefill == "batched"


@pytest.mark.parametrize(
    "overrides",
    [
        dict(phi="avg"),
        dict(gate="softmax"),
        dict(prefill="sequential"),
        dict(selection="v1"),
        dict(n_sel=3),
        dict(l=16, d=8, l_sel=8),  # l > l_sel is allowed as long as d divides both
        dict(n_kv_groups=1),
        dict(n_kv_groups=4),
        dict(rope_theta=500.0),
    ],
)
def test_valid_configs_construct(overrides):
    NSAConfig(**{**REQUIRED, **overrides})


SIZE_FIELDS = ["dim", "n_heads", "n_kv_groups", "d_k", "d_v", "l", "d", "l_sel", "n_sel", "w"]

INVALID = (
    [pytest.param(f, {f: 0}, id=f"{f}=0") for f in SIZE_FIELDS]
    + [pytest.param(f, {f: -4}, id=f"{f}=-4") for f in SIZE_FIELDS]
    + [
        pytest.param("d", dict(l=32, d=12, l_sel=48), id="d_not_dividing_l"),
        pytest.param("d", dict(l=32, d=16, l_sel=72), id="d_not_dividing_l_sel"),
        pytest.param("n_kv_groups", dict(n_heads=4, n_kv_groups=3), id="groups_not_dividing_heads"),
        pytest.param("n_sel", dict(n_sel=2), id="n_sel=2"),
        pytest.param("n_sel", dict(n_sel=1), id="n_sel=1"),
        pytest.param("d_k", dict(d_k=15), id="d_k_odd"),
        pytest.param("phi", dict(phi="max"), id="phi"),
        pytest.param("gate", dict(gate="relu"), id="gate"),
        pytest.param("prefill", dict(prefill="parallel"), id="prefill"),
        pytest.param("selection", dict(selection="v3"), id="selection"),
        pytest.param("rope_theta", dict(rope_theta=0.0), id="rope_theta=0"),
        pytest.param("rope_theta", dict(rope_theta=-1.0), id="rope_theta<0"),
    ]
)


@pytest.mark.parametrize("field,overrides", INVALID)
def test_invalid_config_raises_value_error_naming_field(field, overrides):
    with pytest.raises(ValueError) as excinfo:
        NSAConfig(**{**REQUIRED, **overrides})
    msg = str(excinfo.value)
    # The offending field must be named.  For a divisibility relation the field
    # under test is required; the relation partner alone is not enough.
    assert _names_field(msg, field), f"ValueError message does not name {field!r}: {msg!r}"


def test_replace_validates_too():
    cfg = NSAConfig(**REQUIRED)
    with pytest.raises(ValueError, match="n_sel"):
        dataclasses.replace(cfg, n_sel=2)


SMALL = dict(dim=32, n_heads=4, n_kv_groups=2, d_k=8, d_v=8, l=8, d=4, l_sel=8, n_sel=3, w=16)


@pytest.mark.parametrize(
    "variable,field,value,start,expected",
    [("NSA_PREFILL_BATCHED", "prefill", "0", "batched", "sequential"),
     ("NSA_PREFILL_BATCHED", "prefill", "1", "sequential", "batched"),
     ("NSA_PREFILL_BATCHED", "prefill", "0", "sequential", "sequential"),
     ("NSA_PREFILL_BATCHED", "prefill", "1", "batched", "batched"),
     ("NSA_SEL_RANGES_V2", "selection", "0", "v2", "v1"),
     ("NSA_SEL_RANGES_V2", "selection", "1", "v1", "v2"),
     ("NSA_SEL_RANGES_V2", "selection", "0", "v1", "v1"),
     ("NSA_SEL_RANGES_V2", "selection", "1", "v2", "v2")],
)
def test_env_override(monkeypatch, variable, field, value, start, expected):
    monkeypatch.setenv(variable, value)
    attn = NSAAttention(NSAConfig(**SMALL, **{field: start}))
    assert getattr(attn.cfg, field) == expected


def test_env_overrides_together_and_other_fields_kept(monkeypatch):
    monkeypatch.setenv("NSA_PREFILL_BATCHED", "0")
    monkeypatch.setenv("NSA_SEL_RANGES_V2", "0")
    cfg = NSAConfig(**SMALL, phi="avg", gate="softmax")
    attn = NSAAttention(cfg)
    assert attn.cfg.prefill == "sequential" and attn.cfg.selection == "v1"
    assert attn.cfg.phi == "avg" and attn.cfg.gate == "softmax"
    assert dataclasses.replace(attn.cfg, prefill="batched", selection="v2") == cfg


def test_no_env_keeps_config():
    cfg = NSAConfig(**SMALL, prefill="sequential", selection="v1")
    attn = NSAAttention(cfg)
    assert attn.cfg.prefill == "sequential" and attn.cfg.selection == "v1"


@pytest.mark.parametrize("var", ["NSA_PREFILL_BATCHED", "NSA_SEL_RANGES_V2"])
@pytest.mark.parametrize("value", ["maybe", "2", "yes please"])
def test_invalid_env_value_raises_naming_variable(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as excinfo:
        NSAAttention(NSAConfig(**SMALL))
    assert var in str(excinfo.value), f"message does not name {var}: {excinfo.value!r}"


def test_module_built_under_overrides_loads_the_same_state_dict(monkeypatch):
    """A module built under the overrides loads the same state dict."""
    torch.manual_seed(0)
    base = NSAAttention(NSAConfig(**SMALL))
    monkeypatch.setenv("NSA_PREFILL_BATCHED", "0")
    monkeypatch.setenv("NSA_SEL_RANGES_V2", "0")
    other = NSAAttention(NSAConfig(**SMALL))
    other.load_state_dict(base.state_dict())
    assert other.cfg.prefill == "sequential"
