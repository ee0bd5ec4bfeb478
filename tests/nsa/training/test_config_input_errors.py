"""nsa-train's reading of its run config: inputs that were a raw traceback, silently read as another value, or an
error that named neither what was wrong nor where (nsa.training.config, through nsa.training.cli.main)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from nsa.training import cli
from nsa.training.config import ConfigError, apply_overrides, config_from_dict, load_config

REPO = Path(__file__).resolve().parents[3]
TINY = yaml.safe_load((REPO / "configs" / "tiny_cpu.yaml").read_text(encoding="utf-8"))
TINY_TEXT = (REPO / "configs" / "tiny_cpu.yaml").read_text(encoding="utf-8")


@pytest.fixture
def clean_env(monkeypatch):
    """No CONFIG and no NSA_* toggle from the caller's environment."""
    for name in list(os.environ):
        if name == "CONFIG" or name.startswith("NSA_"):
            monkeypatch.delenv(name)


def _main_error(capsys, argv) -> str:
    """nsa-train's one-line error for `argv` (exit 2 before the trainer is imported)."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("nsa-train: error: ") and err.count("\n") == 1, err
    return err


def test_config_path_too_long_for_the_system_is_a_config_error(tmp_path, capsys, clean_env):
    """A --config name past the system's 255 bytes: Path.is_file raises ENAMETOOLONG (it ignores only ENOENT and its
    kin), which escaped as a raw OSError traceback."""
    path = tmp_path / ("a" * 300 + ".yaml")
    with pytest.raises(ConfigError, match=r"cannot read the config file \(File name too long\)$"):
        load_config(path)
    assert "File name too long" in _main_error(capsys, ["--config", str(path)])


def test_yaml_syntax_error_names_the_problem_and_its_line(tmp_path):
    """PyYAML's text starts with its context ("while scanning for the next token"): the message said only that, not
    what is wrong (a tab) nor where (line 3)."""
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  vocab_size: 256\n\tdim: 64\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid YAML (line 3: ")
    assert "found character '\\t' that cannot start any token" in message
    assert "while scanning" not in message


def test_out_dir_with_a_nul_character_is_refused_before_the_run(tmp_path, capsys, clean_env):
    """`out_dir: "run\\0x"` (a double-quoted YAML escape) was accepted; creating it failed in the trainer's start-up
    with a raw 'ValueError: embedded null byte' traceback, after torch had been imported."""
    raw = {**TINY, "train": {**TINY["train"], "out_dir": "run\0x"}}
    with pytest.raises(ConfigError, match=r"train\.out_dir must not contain a NUL character"):
        config_from_dict(raw)
    path = tmp_path / "run.yaml"
    path.write_text(TINY_TEXT.replace("out_dir: artifacts/tiny_cpu", 'out_dir: "run\\0x"'), encoding="utf-8")
    assert "NUL character" in _main_error(capsys, ["--config", str(path)])


@pytest.mark.parametrize("written, read, why", [
    ("steps: 010", 8, "octal"),
    ("steps: 0100", 64, "octal"),
    ("steps: 1:30", 90, "base 60"),
])
def test_number_yaml_reads_as_octal_or_base_60_is_refused(tmp_path, written, read, why):
    """YAML 1.1 (PyYAML) reads a plain 010 as 8 and 1:30 as 90: the run took that figure without a word."""
    path = tmp_path / "run.yaml"
    text = TINY_TEXT.replace("steps: 60", written)
    path.write_text(text, encoding="utf-8")
    line = text.splitlines().index(f"  {written}") + 1
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert f"'train.steps' at line {line}: '{written.split(': ')[1]}' reads as {read} " in message
    assert why in message


def test_numbers_that_read_as_written_still_load(tmp_path):
    """A single digit after a 0 reads the same in either base; a quoted value is text; hex stays accepted."""
    path = tmp_path / "run.yaml"
    path.write_text(TINY_TEXT.replace("steps: 60", "steps: 07").replace("seed: 1337", "seed: 0x10")
                    .replace("out_dir: artifacts/tiny_cpu", "out_dir: '0755'"), encoding="utf-8")
    cfg = load_config(path)
    assert (cfg.train.steps, cfg.train.seed, cfg.train.out_dir) == (7, 16, "0755")


def test_unknown_keys_suggest_the_closest_known_key():
    """A misspelt section or key named the closest known one nowhere (the runbook loader's errors do)."""
    with pytest.raises(ConfigError, match=r"unknown section 'modle' \(did you mean model\? expected one of"):
        config_from_dict({**TINY, "modle": {}})
    with pytest.raises(ConfigError, match=r"unknown key 'train\.stepz' \(did you mean train\.steps\? known keys: "):
        config_from_dict({**TINY, "train": {"stepz": 3}})
    with pytest.raises(ConfigError, match=r"unknown key 'model\.n_head' \(did you mean model\.n_heads\? "):
        config_from_dict({**TINY, "model": {**TINY["model"], "n_head": 4}})
    with pytest.raises(ConfigError,
                       match=r"^command line: unknown key 'trian\.steps' \(did you mean train\.steps\?\)$"):
        apply_overrides(config_from_dict(TINY), {"trian.steps": 3})
    # nothing close: no guess
    with pytest.raises(ConfigError, match=r"unknown key 'train\.zzzzqq' \(known keys: steps, "):
        config_from_dict({**TINY, "train": {"zzzzqq": 3}})


@pytest.mark.parametrize("theta", [1e-300, 1e-50, 0.5])
def test_rope_base_below_one_is_refused(theta):
    """RoPE's frequencies theta^(-2j/d_k) lie in (0, 1] only for a base of at least 1. `rope_theta: 1e-300` was
    accepted: in fp32 the base is 0, every frequency inf, and the first forward's scores NaN (the dense twin's loss
    NaN, NSA's selection failing inside its kernel)."""
    with pytest.raises(ConfigError, match=r"NSAConfig\.rope_theta must be at least 1 "):
        config_from_dict({**TINY, "model": {**TINY["model"], "rope_theta": theta}})


@pytest.mark.parametrize("theta", [1.0, 10000.0, 500000.0])
def test_rope_base_of_one_or_more_loads(theta):
    assert config_from_dict({**TINY, "model": {**TINY["model"], "rope_theta": theta}}).model.nsa.rope_theta == theta


def test_config_path_that_is_a_directory_says_so(tmp_path, capsys, clean_env):
    """`--config configs` (a directory) was reported as 'config file not found', which it is not."""
    with pytest.raises(ConfigError, match=r": a directory, not a config file$"):
        load_config(tmp_path)
    assert f"{tmp_path}: a directory, not a config file" in _main_error(capsys, ["--config", str(tmp_path)])
    with pytest.raises(ConfigError, match=r": config file not found$"):
        load_config(tmp_path / "nowhere.yaml")
