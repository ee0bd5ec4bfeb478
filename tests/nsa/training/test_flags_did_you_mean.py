"""nsa-train's flags: a misspelt flag names the closest one, on the command line and in a runbook's trainer args
(nsa.training.flags)."""

from __future__ import annotations

import pytest

from nsa.training import cli
from nsa.training.flags import build_parser, check_flag


def _usage_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("nsa-train: error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("argv, hint", [
    (["--stepz", "3"], "(--stepz: did you mean --steps?)"),
    (["--step=3"], "(--step: did you mean --steps?)"),
    (["--seq_len", "64", "--lr-x", "1"], "(--seq_len: did you mean --seq-len?; --lr-x: did you mean --lr?)"),
])
def test_unrecognized_flag_names_the_closest_flag(capsys, argv, hint):
    err = _usage_error(capsys, argv)
    assert f"unrecognized arguments: {' '.join(argv)} {hint} (see nsa-train --help)" in err


def test_unrecognized_flag_with_nothing_close_has_no_guess(capsys):
    err = _usage_error(capsys, ["--qqqqq", "x"])
    assert "unrecognized arguments: --qqqqq x (see nsa-train --help)" in err and "did you mean" not in err


def test_the_cli_entry_says_the_hint_too(capsys):
    with pytest.raises(SystemExit) as info:
        cli.main(["--config", "configs/tiny_cpu.yaml", "--save-evry", "5"])
    assert info.value.code == 2
    assert "(--save-evry: did you mean --save-every?)" in capsys.readouterr().err


def test_runbook_args_key_names_the_closest_flag():
    assert check_flag("stepz", 3).startswith("the trainer has no flag --stepz (did you mean --steps? its flags: ")
    assert check_flag("save_evry", 3).startswith("the trainer has no flag --save-evry (did you mean --save-every? ")
    assert check_flag("zzqq", 3).startswith("the trainer has no flag --zzqq (its flags: accum, ")
    assert check_flag("seq_len", 64) is None
