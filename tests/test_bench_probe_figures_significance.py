"""benchmarks/bench_significance.py: the rates of the power table are fractions of --reps simulated sweeps (the
documented denominator, whatever --reps is), the printed command reproduces the figures, and bad options are
refused before anything is simulated. The script is called through sys.argv, as from the command line."""

from __future__ import annotations

import json
import shlex
import sys

import numpy as np
import pytest

from benchmark_scripts import load

bench = load("bench_significance")


def _main(monkeypatch, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", ["benchmarks/bench_significance.py", *argv])
    bench.main()


def test_power_rates_are_fractions_of_reps_sweeps(monkeypatch):
    decided = []

    def fake_decide_all(y, default):
        decided.append(y.shape[0])
        # the first 3 sweeps name the faster variant "50", the 4th names "100", the rest none
        return ["50"] * 3 + ["100"] + [None] * (y.shape[0] - 4), [], 0.0

    monkeypatch.setattr(bench, "_decide_all", fake_decide_all)
    monkeypatch.setattr(bench, "recommended_repeats", lambda cv, effect, n_variants: 2)
    rows = bench.power(10, np.random.default_rng(0))
    assert decided == [10, 10]  # one table row per noise model, each over --reps 10 sweeps
    for row in rows:
        assert row["found"] == pytest.approx(3 / 10) and row["wrong_winner"] == pytest.approx(1 / 10)


def test_the_printed_command_reproduces_the_figures(monkeypatch, tmp_path, capsys):
    first = tmp_path / "new" / "first.json"  # a folder that does not exist yet
    _main(monkeypatch, "--reps", "4", "--seed", "3", "--only", "gate", "--only", "coverage", "--json", str(first))
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("reproduce: python benchmarks/bench_significance.py ")
    argv = shlex.split(line.removeprefix("reproduce: python benchmarks/bench_significance.py "))
    assert argv == ["--reps", "4", "--seed", "3", "--only", "gate", "--only", "coverage"]
    again = tmp_path / "again.json"
    _main(monkeypatch, *argv, "--json", str(again))
    assert json.loads(again.read_text()) == json.loads(first.read_text())
    # the tables share one generator: coverage alone (or first) draws other figures than after gate
    alone = tmp_path / "alone.json"
    _main(monkeypatch, "--reps", "4", "--seed", "3", "--only", "coverage", "--json", str(alone))
    assert json.loads(alone.read_text())["coverage"] != json.loads(first.read_text())["coverage"]


@pytest.mark.parametrize("argv, message", [(["--reps", "0"], "--reps must be >= 1"),
                                           (["--reps", "-5"], "--reps must be >= 1"),
                                           (["--seed", "-1"], "--seed must be >= 0"),
                                           (["--only", "nope"], "invalid choice: 'nope'")])
def test_bad_options_are_refused_before_any_table(monkeypatch, capsys, argv, message):
    for table in bench.TABLES:
        monkeypatch.setitem(vars(bench), table, lambda reps, rng: pytest.fail("a table ran"))
    with pytest.raises(SystemExit) as exc:
        _main(monkeypatch, *argv, "--only", "gate")
    assert exc.value.code == 2 and message in capsys.readouterr().err
