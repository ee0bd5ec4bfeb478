"""Run configs (nsa/training/config.py): the shipped YAML files, key-by-key validation with messages naming the file
and dotted key, command-line overrides, and save/load round trips."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from nsa.training.config import DataConfig
from nsa.model import ModelConfig
from nsa.training.config import (ConfigError, RunConfig, TrainConfig, apply_overrides, config_from_dict, load_config,
                            save_config)

REPO = Path(__file__).resolve().parents[3]
CONFIGS = sorted((REPO / "configs").glob("*.yaml"))
TINY = REPO / "configs" / "tiny_cpu.yaml"


def base_raw() -> dict:
    """The tiny CPU config as a plain dict, to be broken one key at a time."""
    return yaml.safe_load(TINY.read_text())


def write(tmp_path: Path, raw=None, text: str | None = None, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text if text is not None else yaml.safe_dump(raw, sort_keys=False))
    return path


def load_error(path: Path, *named: str) -> str:
    """load_config(path) raises ConfigError: one line, naming the file and every string in `named`."""
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg, msg
    for part in named:
        assert part in msg, f"{part!r} not named in: {msg}"
    assert "\n" not in msg, msg
    return msg


def broken(section: str, key: str, value) -> dict:
    raw = base_raw()
    raw[section][key] = value
    return raw


# -------------------------------------------------------------------------------------------------- shipped configs


def test_shipped_configs_are_found():
    names = {p.stem for p in CONFIGS}
    assert {"m7c_125m_2xa100_production", "m7c_125m_40g", "tiny_cpu"} <= names, names


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    assert isinstance(cfg.model, ModelConfig) and isinstance(cfg.train, TrainConfig)
    assert isinstance(cfg.data, DataConfig)
    # every key written in the file arrives in the config with the value written
    raw = yaml.safe_load(path.read_text())
    resolved = cfg.to_dict()
    for section, values in raw.items():
        for key, value in (values or {}).items():
            got = resolved[section][key]
            if isinstance(value, str) and isinstance(got, float):
                value = float(value)
            assert got == value, f"{path.name}: {section}.{key} = {got!r}, file says {value!r}"


def test_production_config_has_the_issue_values():
    cfg = load_config(REPO / "configs" / "m7c_125m_2xa100_production.yaml")
    m, t = cfg.model, cfg.train
    assert (m.dim, m.n_layers, m.n_heads, m.n_kv_groups, m.nsa.d_k, m.nsa.d_v) == (768, 12, 12, 2, 64, 64)
    assert (m.nsa.l, m.nsa.d, m.nsa.l_sel, m.nsa.n_sel, m.nsa.w) == (32, 16, 64, 16, 512)
    assert t.precision == "bf16"
    assert (t.seq_len, t.batch_size, t.accum) == (2048, 2, 2)
    assert isinstance(t.lr, float) and t.lr == 2e-4
    assert t.warmup_steps == 2000 and t.lr_schedule == "cosine"
    assert t.weight_decay == 0.01 and t.grad_clip == 1.0
    assert (t.log_every, t.save_every, t.seed) == (20, 5000, 1337)
    assert t.out_dir == "artifacts/m7c_125m_2xa100_prod"


def test_40g_and_tiny_cpu_configs():
    big = load_config(REPO / "configs" / "m7c_125m_40g.yaml")
    assert (big.train.seq_len, big.train.batch_size) == (4096, 4)
    assert load_config(TINY).train.device == "cpu"


# ------------------------------------------------------------------------------------------------- error messages


def test_file_not_found(tmp_path):
    load_error(tmp_path / "nope.yaml", "not found")


def test_directory_is_not_a_config_file(tmp_path):
    load_error(tmp_path)


@pytest.mark.parametrize("text", ["model: [unclosed\n", "model:\n\tdim: 3\n", "a: b: c\n"])
def test_invalid_yaml(tmp_path, text):
    load_error(write(tmp_path, text=text), "YAML")


@pytest.mark.parametrize("text", ["", "- model\n- train\n", "just a string\n"])
def test_top_level_must_be_a_mapping(tmp_path, text):
    load_error(write(tmp_path, text=text), "mapping")


def test_non_utf8_file_is_a_config_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x01model: 1\n")
    load_error(path)


@pytest.mark.parametrize("section,key", [("train", "stepz"), ("model", "dimm"), ("data", "datset")])
def test_unknown_key_names_file_and_dotted_key(tmp_path, section, key):
    raw = base_raw()
    raw[section][key] = 1
    load_error(write(tmp_path, raw), f"{section}.{key}")


def test_unknown_section(tmp_path):
    raw = base_raw()
    raw["trian"] = {"steps": 3}
    load_error(write(tmp_path, raw), "trian")


def test_missing_model_section(tmp_path):
    raw = base_raw()
    del raw["model"]
    load_error(write(tmp_path, raw), "model")


def test_missing_required_model_key(tmp_path):
    raw = base_raw()
    del raw["model"]["vocab_size"]
    load_error(write(tmp_path, raw), "model.vocab_size")


def test_missing_optional_sections_and_keys_take_defaults(tmp_path):
    raw = {"model": base_raw()["model"]}
    cfg = load_config(write(tmp_path, raw))
    assert cfg.train == TrainConfig() and cfg.data == DataConfig()
    raw["train"] = {"steps": 7}
    cfg = load_config(write(tmp_path, raw))
    assert cfg.train == dataclasses.replace(TrainConfig(), steps=7)


@pytest.mark.parametrize("section,key,value", [
    ("train", "steps", "10"),  # string for int
    ("train", "steps", 10.0),  # float for int
    ("train", "steps", 10.5),
    ("train", "steps", True),  # bool for int
    ("train", "steps", "1e3"),  # YAML reads 1e3 as a string; not an integer
    ("train", "compile", 1),  # int for bool
    ("train", "compile", "true"),  # string for bool
    ("train", "out_dir", ["a", "b"]),  # list for str
    ("train", "precision", 16),  # int for str
    ("train", "lr", "fast"),  # non-numeric string for float
    ("train", "lr", True),  # bool for float
    ("train", "lr", [2e-4]),
    ("model", "dim", "64"),
    ("model", "tie_embeddings", "yes please"),
    ("model", "rope_theta", {"base": 10000}),
    ("data", "dataset", 5),
    ("data", "loader_timeout_s", "soon"),
])
def test_wrong_type_names_the_key(tmp_path, section, key, value):
    load_error(write(tmp_path, broken(section, key, value)), f"{section}.{key}")


@pytest.mark.parametrize("section,key", [("train", "steps"), ("train", "lr"), ("train", "precision"),
                                         ("model", "vocab_size"), ("model", "tie_embeddings"), ("data", "dataset")])
def test_null_for_a_non_optional_key(tmp_path, section, key):
    load_error(write(tmp_path, broken(section, key, None)), f"{section}.{key}", "null")


def test_null_for_an_optional_key_is_none(tmp_path):
    raw = base_raw()
    raw["train"].update(decay_steps=None, peak_tflops=None)
    raw["model"]["ffn_hidden"] = None
    cfg = load_config(write(tmp_path, raw))
    assert cfg.train.decay_steps is None and cfg.train.peak_tflops is None and cfg.model.ffn_hidden is None


@pytest.mark.parametrize("section,key,value", [
    ("train", "steps", 0),
    ("train", "steps", -3),
    ("train", "seq_len", 0),
    ("train", "accum", 0),
    ("train", "lr", 0),
    ("train", "lr", -1e-3),
    ("train", "warmup_steps", -1),
    ("train", "weight_decay", -0.1),
    ("train", "grad_clip", -1.0),
    ("train", "beta1", 1.0),
    ("train", "decay_steps", 0),
    ("train", "precision", "fp8"),
    ("train", "parallel", "tp"),
    ("train", "lr_schedule", "linear"),
    ("train", "device", "tpu"),
    ("train", "min_lr_ratio", 5.0),  # a cosine "decay" up to 5x the peak
    ("train", "pg_timeout_s", 1e300),  # overflowed torch's timedelta (a traceback, not an error naming it)
    ("train", "out_dir", ""),  # would write into the working directory
    ("train", "out_dir", "  "),
])
def test_out_of_range_train_value_names_the_key(tmp_path, section, key, value):
    load_error(write(tmp_path, broken(section, key, value)), f"{section}.{key}")


@pytest.mark.parametrize("section,key,value", [
    ("model", "vocab_size", 0),
    ("model", "n_kv_groups", 3),  # does not divide n_heads = 4
    ("model", "n_sel", 2),
    ("model", "phi", "conv"),
    ("data", "dataset", "imagenet"),
    ("data", "loader_timeout_s", 0),
])
def test_out_of_range_model_or_data_value_names_the_field(tmp_path, section, key, value):
    # the model/data dataclasses name their own field (e.g. "ModelConfig.vocab_size"), not "model.vocab_size"
    load_error(write(tmp_path, broken(section, key, value)), key)


@pytest.mark.parametrize("key", ["weight_decay", "grad_clip", "min_lr_ratio"])
def test_nan_is_rejected(tmp_path, key):
    raw = base_raw()
    raw["train"][key] = float("nan")
    path = write(tmp_path, raw)
    assert f"{key}: .nan" in path.read_text()
    load_error(path, f"train.{key}")


@pytest.mark.parametrize("value", [[], False, 0, ""])
def test_falsy_non_mapping_section_is_an_error(tmp_path, value):
    raw = base_raw()
    raw["train"] = value
    load_error(write(tmp_path, raw), "train")


def test_truthy_non_mapping_section_is_an_error(tmp_path):
    raw = base_raw()
    raw["train"] = [1, 2]
    load_error(write(tmp_path, raw), "train", "mapping")


def test_yaml_exponent_without_dot_is_accepted_as_a_float(tmp_path):
    text = TINY.read_text().replace("lr: 3.0e-3", "lr: 2e-4")
    assert "lr: 2e-4" in text
    assert yaml.safe_load(text)["train"]["lr"] == "2e-4"  # PyYAML (YAML 1.1) reads it as a string
    cfg = load_config(write(tmp_path, text=text))
    assert isinstance(cfg.train.lr, float) and cfg.train.lr == 2e-4


def test_int_for_float_is_accepted_as_float(tmp_path):
    cfg = load_config(write(tmp_path, broken("train", "grad_clip", 2)))
    assert isinstance(cfg.train.grad_clip, float) and cfg.train.grad_clip == 2.0


def test_config_from_dict_rejects_non_mapping():
    with pytest.raises(ConfigError, match="somewhere"):
        config_from_dict(["model"], "somewhere")


# --------------------------------------------------------------------------------------------------------- overrides


def test_apply_overrides_changes_values_and_nothing_else():
    cfg = load_config(TINY)
    new = apply_overrides(cfg, {"train.steps": 10, "train.lr": 1, "model.n_layers": 3, "data.dataset": "synthetic"})
    assert new.train.steps == 10
    assert isinstance(new.train.lr, float) and new.train.lr == 1.0
    assert new.model.n_layers == 3
    assert new.train == dataclasses.replace(cfg.train, steps=10, lr=1.0)
    assert new.model == dataclasses.replace(cfg.model, n_layers=3)
    assert new.data == cfg.data
    assert cfg.train.steps == 60 and cfg.model.n_layers == 2  # the original is untouched
    assert apply_overrides(cfg, {}) == cfg


@pytest.mark.parametrize("overrides,named", [
    ({"train.steps": 0}, "train.steps"),
    ({"train.steps": "ten"}, "train.steps"),
    ({"train.precision": "fp8"}, "train.precision"),
    ({"train.out_dir": None}, "train.out_dir"),
    ({"model.n_kv_groups": 3}, "n_kv_groups"),
])
def test_apply_overrides_revalidates(overrides, named):
    with pytest.raises(ConfigError) as err:
        apply_overrides(load_config(TINY), overrides)
    assert named in str(err.value) and "command line" in str(err.value), str(err.value)


@pytest.mark.parametrize("dotted", ["train.stepz", "trian.steps", "steps", "model", "model.", "train.steps.x"])
def test_apply_overrides_unknown_key(dotted):
    with pytest.raises(ConfigError) as err:
        apply_overrides(load_config(TINY), {dotted: 1})
    assert repr(dotted) in str(err.value) or dotted in str(err.value), str(err.value)


# ---------------------------------------------------------------------------------------------------- save / load


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_save_then_load_round_trips(tmp_path, path):
    cfg = load_config(path)
    out = tmp_path / "config.yaml"
    save_config(cfg, out)
    assert load_config(out) == cfg
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temp file left behind


def test_save_then_load_round_trips_non_defaults(tmp_path):
    cfg = apply_overrides(load_config(TINY), {
        "train.lr": 2e-4, "train.decay_steps": 123, "train.peak_tflops": 312.5, "train.min_lr_ratio": 0.0,
        "train.compile": True, "train.parallel": "ddp", "train.out_dir": "artifacts/some where/x: y",
        "model.ffn_hidden": 96, "model.norm_eps": 1e-6, "model.rope_theta": 500000.0, "model.gate": "softmax",
        "model.tie_embeddings": True, "model.activation_checkpointing": True,
        "data.dataset": "text", "data.path": "data/*.txt", "data.text_key": "body",
    })
    out = tmp_path / "config.yaml"
    save_config(cfg, out)
    again = load_config(out)
    assert again == cfg
    assert again.to_dict() == cfg.to_dict()
    # the file is a readable YAML document with the three sections
    assert set(yaml.safe_load(out.read_text())) == {"model", "train", "data"}
    # and saving over an existing file replaces it
    save_config(load_config(TINY), out)
    assert load_config(out) == load_config(TINY)


def test_to_dict_is_plain_data():
    d = load_config(TINY).to_dict()
    assert set(d) == {"model", "train", "data"}
    assert d == copy.deepcopy(d)
    assert config_from_dict(d) == load_config(TINY)
