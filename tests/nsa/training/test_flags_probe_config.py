"""Run configs refused when they are read (nsa/training/config.py): numbers that are not finite in any section, and
values of different sections that the trainer would refuse together only after start-up (a sequence shorter than
one compression block, a vocabulary smaller than the data source's token ids), given in the file or by a flag."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from nsa.training import flags
from nsa.training.config import ConfigError, apply_overrides, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs" / "tiny_cpu.yaml"  # model.l 16, vocab_size 256, dataset synthetic


def _raw() -> dict:
    return yaml.safe_load(TINY.read_text())


def _with_flags(*argv: str):
    """The tiny config with nsa-train's command line `argv` applied, as nsa.training.cli.resolve_config does."""
    specs = flags.flag_specs()
    return apply_overrides(load_config(TINY), flags.overrides(flags.build_parser(specs).parse_args(list(argv)), specs))


def _refused(fn, *named: str) -> str:
    with pytest.raises(ConfigError) as err:
        fn()
    msg = str(err.value)
    for part in named:
        assert part in msg, f"{part!r} not named in: {msg}"
    assert "\n" not in msg, msg
    return msg


# ------------------------------------------------------------------------------------------- numbers not finite
@pytest.mark.parametrize("key", ["norm_eps", "rope_theta", "init_std"])
@pytest.mark.parametrize("text", [".inf", "-.inf", ".nan"])
def test_a_model_number_that_is_not_finite_is_refused_in_the_file(tmp_path, key, text):
    """`.inf` passed the model's `> 0` checks: norm_eps .inf makes every normalised activation 0 (a model that
    cannot learn), init_std .inf every weight infinite."""
    config_text = TINY.read_text().replace("  vocab_size: 256\n", f"  vocab_size: 256\n  {key}: {text}\n")
    assert yaml.safe_load(config_text)["model"][key] != 1.0  # the YAML float itself, not a string
    path = tmp_path / "run.yaml"
    path.write_text(config_text)
    _refused(lambda: load_config(path), str(path), f"model.{key}", "finite")


@pytest.mark.parametrize("value", ["inf", "Infinity", "1e400", float("inf")])
def test_a_model_number_that_is_not_finite_is_refused_as_an_override(value):
    _refused(lambda: apply_overrides(load_config(TINY), {"model.norm_eps": value}), "model.norm_eps", "finite")


def test_finite_model_numbers_still_load():
    cfg = apply_overrides(load_config(TINY), {"model.norm_eps": "1e-6", "model.rope_theta": 500000,
                                              "model.init_std": 0.01})
    assert (cfg.model.norm_eps, cfg.model.nsa.rope_theta, cfg.model.init_std) == (1e-6, 500000.0, 0.01)


@pytest.mark.parametrize("key", ["lr", "weight_decay"])
def test_a_train_number_that_is_not_finite_is_still_refused_naming_the_key(key):
    _refused(lambda: apply_overrides(load_config(TINY), {f"train.{key}": "nan"}), f"train.{key}")


# ---------------------------------------------------------------------------------- sections together
def test_a_sequence_shorter_than_one_compression_block_is_refused_by_the_flag():
    # the tiny model's compression blocks are l = 16 tokens; the trainer refuses seq_len 15 only after start-up
    _refused(lambda: _with_flags("--seq-len", "15"), "train.seq_len=15", "model.l=16")
    assert _with_flags("--seq-len", "16").train.seq_len == 16


def test_a_sequence_shorter_than_one_compression_block_is_refused_in_the_file(tmp_path):
    raw = _raw()
    raw["model"].update(l=32, l_sel=32)  # d = 8 divides both
    raw["train"]["seq_len"] = 31
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    _refused(lambda: load_config(path), str(path), "train.seq_len=31", "model.l=32")


@pytest.mark.parametrize("dataset", ["text", "fineweb_edu"])
def test_a_vocabulary_below_the_byte_tokenizer_is_refused_at_load(dataset):
    # the byte tokenizer's ids are 0..255: 256 token ids
    raw = _raw()
    raw["data"] = {"dataset": dataset, "path": "corpus"}
    raw["model"]["vocab_size"] = 255
    _refused(lambda: config_from_dict(raw, "run.yaml"), "run.yaml", "data.dataset", "model.vocab_size=255", "256")
    raw["model"]["vocab_size"] = 256
    assert config_from_dict(raw).model.vocab_size == 256


def test_a_vocabulary_too_small_for_the_synthetic_process_is_refused_at_load():
    raw = _raw()
    raw["model"]["vocab_size"] = 15
    _refused(lambda: config_from_dict(raw, "run.yaml"), "run.yaml", "model.vocab_size", "16", "15")
    raw["model"]["vocab_size"] = 16
    assert config_from_dict(raw).model.vocab_size == 16


def test_a_dataset_flag_over_a_small_vocabulary_is_refused_naming_the_dataset(tmp_path):
    raw = _raw()
    raw["model"]["vocab_size"] = 128  # fine for the file's synthetic data
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    assert load_config(path).model.vocab_size == 128
    specs = flags.flag_specs()
    args = flags.build_parser(specs).parse_args(["--dataset", "text", "--data-path", "corpus.txt"])
    _refused(lambda: apply_overrides(load_config(path), flags.overrides(args, specs)),
             "data.dataset 'text'", "model.vocab_size=128")


def test_the_vocabulary_bounds_are_those_of_the_data_sources():
    from nsa.training import config, corpus, synthetic
    assert config.BYTE_VOCAB == corpus.BYTE_VOCAB == 256
    assert config.SYNTHETIC_MIN_VOCAB == synthetic.SyntheticSource.MIN_VOCAB == 16
