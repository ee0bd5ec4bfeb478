"""NSAConfig validation and the toggles that override it (read once: nsa.toggles.Toggles)."""

import dataclasses
import re

import pytest
import torch

from nsa import NSAAttention, NSAConfig
from nsa.config import ModelConfig
from nsa.toggles import Toggles

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
        pytest.param("index_build", dict(index_build="sorted"), id="index_build"),
        pytest.param("rope", dict(rope="triton"), id="rope"),
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
     ("NSA_SEL_RANGES_V2", "selection", "1", "v2", "v2"),
     ("NSA_KERNEL", "kernel", "torch", "auto", "torch"),
     ("NSA_KERNEL", "kernel", "triton", "torch", "triton"),
     ("NSA_INDEX_BUILD", "index_build", "torch", "auto", "torch"),
     ("NSA_INDEX_BUILD", "index_build", "triton", "torch", "triton"),
     ("NSA_INDEX_BUILD", "index_build", "auto", "triton", "auto"),
     ("NSA_ROPE", "rope", "fused", "auto", "fused"),
     ("NSA_ROPE", "rope", "reference", "fused", "reference"),
     ("NSA_ROPE", "rope", "auto", "reference", "auto")],
)
def test_toggle_override(variable, field, value, start, expected):
    """The toggles read once at start-up (Toggles.read) change the config the layers are built from."""
    tg = Toggles.read({variable: value})
    cfg = NSAConfig(**SMALL, **{field: start}).with_toggles(tg)
    assert getattr(cfg, field) == expected
    model = ModelConfig(vocab_size=16, n_layers=1, nsa=NSAConfig(**SMALL, **{field: start}))
    assert getattr(model.with_toggles(tg).nsa, field) == expected


def test_toggle_overrides_together_and_other_fields_kept():
    tg = Toggles.read({"NSA_PREFILL_BATCHED": "0", "NSA_SEL_RANGES_V2": "0"})
    cfg = NSAConfig(**SMALL, phi="avg", gate="softmax")
    resolved = cfg.with_toggles(tg)
    assert resolved.prefill == "sequential" and resolved.selection == "v1"
    assert resolved.phi == "avg" and resolved.gate == "softmax"
    assert dataclasses.replace(resolved, prefill="batched", selection="v2") == cfg


def test_unset_toggles_keep_the_config_and_the_layer_reads_none(monkeypatch):
    cfg = NSAConfig(**SMALL, prefill="sequential", selection="v1")
    assert cfg.with_toggles(Toggles.read({})) is cfg
    model = ModelConfig(vocab_size=16, n_layers=1, nsa=cfg)
    assert model.with_toggles(Toggles.read({})) is model
    for name, value in (("NSA_PREFILL_BATCHED", "1"), ("NSA_SEL_RANGES_V2", "1"), ("NSA_KERNEL", "triton")):
        monkeypatch.setenv(name, value)
    attn = NSAAttention(cfg)  # the environment reaches a layer only through its config
    assert attn.cfg == cfg


@pytest.mark.parametrize("var", ["NSA_PREFILL_BATCHED", "NSA_SEL_RANGES_V2"])
@pytest.mark.parametrize("value", ["maybe", "2", "yes please"])
def test_invalid_env_value_raises_naming_variable(var, value):
    with pytest.raises(ValueError) as excinfo:
        Toggles.read({var: value})
    assert var in str(excinfo.value), f"message does not name {var}: {excinfo.value!r}"


def test_module_built_under_overrides_loads_the_same_state_dict():
    """A module built under the overrides loads the same state dict."""
    torch.manual_seed(0)
    base = NSAAttention(NSAConfig(**SMALL))
    tg = Toggles.read({"NSA_PREFILL_BATCHED": "0", "NSA_SEL_RANGES_V2": "0"})
    other = NSAAttention(NSAConfig(**SMALL).with_toggles(tg))
    other.load_state_dict(base.state_dict())
    assert other.cfg.prefill == "sequential"


def test_env_json_records_the_toggles_it_always_had():
    """env.json's "toggles" (Toggles.record) keep their keys and their text; the layer toggles added to Toggles are
    recorded under env.json's "env" and in its attention_kernel instead."""
    record = Toggles.read({"NSA_FAULT": "crash@3:1", "NSA_SEL_RANGES_V2": "0", "NSA_DDP_BUCKET_MB": "50"}).record()
    assert list(record) == ["ddp_compress", "ddp_bucket_mb", "sdpa_audit", "sdpa_flash_only", "sdpa_no_flash", "nvtx",
                            "tb_disable", "aux_stats_disable", "opt_fused", "fault", "kernel"]
    assert record["fault"] == "{'kind': 'crash', 'step': 3, 'rank': 1, 'seq_len': None, 'stage': None}"
    assert (record["ddp_bucket_mb"], record["kernel"], record["sdpa_audit"]) == ("50", "None", "False")
