"""benchmarks/bench_startup.py's figures from known timings (each command's runs given): the warm-up run never
counted, min / median / max of the wall times, the median CPU, the 1 s target judged on the median, and the command
that reproduces the figures printed last; a command that fails ends it with exit code 1."""

from __future__ import annotations

import sys

import pytest

from benchmark_scripts import load

bench = load("bench_startup")


def _scripted(monkeypatch, walls: dict[str, list[float]]) -> None:
    """Each command's wall times after its warm-up run (which takes 100 s and must not count); CPU = wall / 2."""
    seen: dict[str, int] = {}

    def run_once(cmd):
        label = " ".join(cmd)
        n = seen[label] = seen.get(label, -1) + 1
        if label == f"{sys.executable} -c pass":
            return 0.05, 0.05
        wall = 100.0 if n == 0 else walls.get(label, [0.2, 0.2, 0.2])[n - 1]
        return wall, wall / 2

    monkeypatch.setattr(bench, "run_once", run_once)
    monkeypatch.setattr(bench, "command", lambda tool, argv: [tool, *argv])
    monkeypatch.setattr(bench, "loaded", lambda tool, argv: ["numpy"] if argv == ["list"] else [])


def test_rows_are_min_median_max_and_the_target_is_judged_on_the_median(monkeypatch, capsys):
    _scripted(monkeypatch, {"nsa-validate list": [1.5, 0.4, 0.9], "nsa-validate --help": [0.3, 0.1, 2.0]})
    monkeypatch.setattr(sys, "argv", ["bench_startup.py", "--repeats", "3"])  # as run from the shell
    assert bench.main() == 0
    lines = capsys.readouterr().out.splitlines()
    row = {ln.split("  ")[0].strip(): ln for ln in lines}
    assert row["nsa-validate list"].split()[2:] == ["0.400s", "0.900s", "1.500s", "0.450s", "numpy"]
    assert row["nsa-validate --help"].split()[2:] == ["0.100s", "0.300s", "2.000s", "0.150s", "none"]
    assert lines[-2] == "target: nsa-validate --help, nsa-validate list, nsa-train --help under 1 s: met"
    assert lines[-1] == "reproduce: python benchmarks/bench_startup.py --repeats 3"


def test_a_median_at_the_target_is_not_met_and_a_failing_command_exits_1(monkeypatch, capsys):
    _scripted(monkeypatch, {"nsa-train --help": [1.0, 1.0, 0.1]})
    assert bench.main(["--repeats", "3"]) == 0
    assert "under 1 s: NOT met by nsa-train --help" in capsys.readouterr().out

    def fails(cmd):
        raise SystemExit(f"{' '.join(cmd)} exited 2: boom")

    monkeypatch.setattr(bench, "run_once", fails)
    with pytest.raises(SystemExit) as exc:
        bench.main(["--repeats", "3"])
    assert "exited 2: boom" in str(exc.value.code)  # a message: Python exits 1 with it
