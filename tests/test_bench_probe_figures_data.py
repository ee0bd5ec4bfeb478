"""benchmarks/bench_data.py: the printed (and --json) command names the benchmark itself with the options that
set the run, however main is called; a thread count below one is refused before anything runs."""

from __future__ import annotations

import json
import shlex

import pytest

from benchmark_scripts import load

bench = load("bench_data")


def test_the_command_names_the_benchmark_and_its_options(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(bench, "bench", lambda seq_len, args: {
        "seq_len": seq_len, "ratio_median": 2.0, "ratio_range": [1.0, 3.0],
        "ms_per_sample": {k: {"min": 1.0, "median": 2.0, "max": 3.0} for k in bench.BUILDERS}})
    out = tmp_path / "d a t a.json"
    argv = ["--seq-lens", "64,128", "--vocab", "300", "--rounds", "2", "--samples", "3", "--json", str(out)]
    assert bench.main(argv) == 0
    first = capsys.readouterr().out.splitlines()[0]
    expected = "python benchmarks/bench_data.py " + shlex.join(argv)
    assert first == f"# {expected}"
    assert json.loads(out.read_text())["command"] == expected


@pytest.mark.parametrize("threads", ["0", "-1"])
def test_threads_below_one_are_refused(monkeypatch, capsys, threads):
    monkeypatch.setattr(bench, "bench", lambda seq_len, args: pytest.fail("the benchmark ran"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--seq-lens", "64", "--vocab", "64", "--threads", threads])
    assert exc.value.code == 2 and "--threads must be >= 1" in capsys.readouterr().err
