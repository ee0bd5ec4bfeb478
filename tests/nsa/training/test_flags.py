"""nsa-train's flags come from one table, read from the config dataclasses (nsa.training.flags): `--help`, the
parser, the config keys a command line sets and the runbook checker of trainer `args` agree by construction. A field
added to a config dataclass with a flag shows up in all of them."""

from __future__ import annotations

import dataclasses

import pytest

from nsa.config import Flag, setting
from nsa.training import cli, config, flags
from nsa.training.config import TrainConfig, UsageError
from train_utils import TINY
from validation.runbook.loader import RunbookError, load_runbook

# The flags and the keys they set, written out here (an independent record of what the command line meant before
# the table was derived from the dataclasses): flag -> (argv value, dotted key, config value).
EXPECTED = {
    "dataset": ("text", "data.dataset", "text"), "data-path": ("x.txt", "data.path", "x.txt"),
    "loader-timeout": ("2.5", "data.loader_timeout_s", 2.5), "steps": ("7", "train.steps", 7),
    "seq-len": ("64", "train.seq_len", 64), "batch-size": ("3", "train.batch_size", 3),
    "accum": ("2", "train.accum", 2), "precision": ("fp32", "train.precision", "fp32"),
    "lr": ("1e-3", "train.lr", 1e-3), "seed": ("5", "train.seed", 5), "out-dir": ("o", "train.out_dir", "o"),
    "device": ("cpu", "train.device", "cpu"), "log-every": ("3", "train.log_every", 3),
    "save-every": ("9", "train.save_every", 9), "eval-every": ("4", "train.eval_every", 4),
    "profile-steps": ("2", "train.profile_steps", 2), "pg-timeout": ("30", "train.pg_timeout_s", 30.0),
    "attention": ("dense", "model.attention", "dense"), "ddp": ("0", "train.parallel", "none"),
    "activation-checkpointing": ("1", "model.activation_checkpointing", True),
    "compile": (None, "train.compile", True), "compile-backend": ("aot_eager", "train.compile_backend", "aot_eager"),
    "cuda-graphs": (None, "train.cuda_graphs", True),
    "fsdp": (None, "train.parallel", "fsdp"), "fsdp-no-reshard": (None, "train.fsdp_reshard", False),
}


def test_every_flag_sets_the_key_it_names():
    specs = flags.flag_specs()
    assert set(specs) == set(EXPECTED) | {"config", "resume"}
    assert specs["config"].key is None and specs["resume"].key is None and specs["resume"].switch
    parser = flags.build_parser()
    for name, (value, key, expected) in EXPECTED.items():
        spec = specs[name]
        assert spec.key == key and spec.help.endswith(f"({key})"), spec
        args = parser.parse_args([f"--{name}"] + ([] if value is None else [value]))
        got = flags.overrides(args)
        assert got[key] == expected and type(got[key]) is type(expected), (name, got)
        if name == "fsdp-no-reshard":
            assert got == {key: False, "train.parallel": "fsdp"}  # implies --fsdp
        else:
            assert got == {key: expected}
    # the choices are the fields' own
    assert specs["precision"].choices == config.PRECISIONS and specs["dataset"].choices == config.DATASETS
    assert specs["ddp"].choices == (0, 1) and specs["ddp"].type is int and specs["steps"].choices is None


def test_two_flags_setting_one_key_differently_are_exclusive(tmp_path):
    parser = flags.build_parser()
    for argv, message in ((["--fsdp", "--ddp", "1"], "--fsdp and --ddp 1 are exclusive"),
                          (["--fsdp-no-reshard", "--ddp", "1"], "--fsdp-no-reshard and --ddp 1 are exclusive")):
        with pytest.raises(UsageError, match=message):
            flags.overrides(parser.parse_args(argv))
    args = parser.parse_args(["--fsdp", "--fsdp-no-reshard", "--config", str(TINY)])
    cfg, _ = cli.resolve_config(args, environ={})
    assert cfg.train.parallel == "fsdp" and cfg.train.fsdp_reshard is False


def _runbook(tmp_path, args: str):
    path = tmp_path / "rb.yaml"
    path.write_text(f"name: t\ndefaults: {{config: {TINY}, args: {args}}}\n"
                    "phases: [{name: p, steps: [{name: s, kind: train}]}]\n")
    return load_runbook(path)


def test_a_field_added_to_a_config_dataclass_is_a_flag_everywhere(monkeypatch, tmp_path):
    """A throwaway TrainConfig with one more field, declared the way the real fields are, put in the run config's
    sections: --help lists its flag, the parser takes it, the config gets its value and a runbook's trainer
    `args` are checked against it."""
    with pytest.raises(RunbookError, match="the trainer has no flag --warp-factor"):
        _runbook(tmp_path, "{warp_factor: 3}")
    extended = dataclasses.make_dataclass(
        "TrainConfig", [("warp_factor", int, setting(2, flags=Flag("warp-factor", "how far to jump")))],
        bases=(TrainConfig,), frozen=True)
    monkeypatch.setitem(config.SECTIONS, "train", extended)

    assert "how far to jump (train.warp_factor)" in " ".join(flags.build_parser().format_help().split())
    args = flags.build_parser().parse_args(["--config", str(TINY), "--warp-factor", "5"])
    assert flags.overrides(args) == {"train.warp_factor": 5}
    cfg, _ = cli.resolve_config(args, environ={})
    assert isinstance(cfg.train, extended) and cfg.train.warp_factor == 5
    with pytest.raises(SystemExit):
        flags.build_parser().parse_args(["--warp-factor", "far"])

    assert flags.check_flag("warp_factor", 4) is None
    rb = _runbook(tmp_path, "{warp_factor: 3}")
    assert rb.defaults.args["warp_factor"] == 3
    with pytest.raises(RunbookError, match="warp_factor: the trainer's --warp-factor takes an integer, got 'far'"):
        _runbook(tmp_path, "{warp_factor: far}")
