"""A list option of a benchmark that names one value twice would run one case twice and keep one of its results
(the results are keyed by the case): bench_attention, bench_train, bench_ops and bench_significance refuse it at
argument parsing (exit 2, the option and the value named), before any case is measured."""

from __future__ import annotations

import pytest

from benchmark_scripts import load


def _refused(capsys, run) -> str:
    with pytest.raises(SystemExit) as exc:
        run()
    assert exc.value.code == 2
    return capsys.readouterr().err


def _no_subprocess(bench, monkeypatch) -> list:
    started = []  # every case is a subprocess: a refused command starts none
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: started.append(a))
    monkeypatch.setattr(bench.subprocess, "Popen", lambda *a, **k: started.append(a))
    return started


@pytest.mark.parametrize("argv, option, value", [
    (["--seq-lens", "256,256"], "--seq-lens", "256"),
    (["--seq-lens", "256,512,0256"], "--seq-lens", "256"),  # the same length, written otherwise
    (["--paths", "dense,dense"], "--paths", "dense"),
    (["--paths", "dense, nsa-torch,dense", "--seq-lens", "256"], "--paths", "dense"),
    (["--device", "cuda", "--seq-lens", "2048,65536,2048"], "--seq-lens", "2048"),
])
def test_bench_attention_refuses_a_repeated_case(argv, option, value, capsys, monkeypatch):
    bench = load("bench_attention")
    started = _no_subprocess(bench, monkeypatch)
    err = _refused(capsys, lambda: bench.main([*argv, "--dry-run"]))
    assert f"{option}: {value} given more than once" in err and not started


def test_bench_attention_runs_each_distinct_case_once(capsys):
    assert load("bench_attention").main(["--seq-lens", "256,512", "--paths", "dense,nsa-torch", "--dry-run"]) == 0
    cases = [line.split(":")[0].split() for line in capsys.readouterr().out.splitlines() if "one subprocess" in line]
    assert sorted(map(tuple, cases)) == [("256", "dense"), ("256", "nsa-torch"), ("512", "dense"),
                                         ("512", "nsa-torch")]


@pytest.mark.parametrize("argv, option, value", [
    (["--modes", "eager,eager"], "--modes", "eager"),
    (["--models", "nsa,nsa", "--quick"], "--models", "nsa"),
    (["--device", "cuda", "--models", "dense,nsa,dense"], "--models", "dense"),
    (["--device", "cuda", "--modes", "graphs,eager,graphs"], "--modes", "graphs"),
    (["--device", "cuda", "--contexts", "2048,2048"], "--contexts", "2048"),
    (["--device", "cuda", "--contexts", "16384,32768,016384"], "--contexts", "16384"),
    (["--device", "cuda", "--variant", "a", "--variant", "a:NSA_OPT_FUSED=1"], "--variant", "label a"),
])
def test_bench_train_refuses_a_repeated_case(argv, option, value, capsys, monkeypatch):
    bench = load("bench_train")
    started = _no_subprocess(bench, monkeypatch)
    err = _refused(capsys, lambda: bench.main([*argv, "--dry-run"]))
    assert f"{option}: {value} given more than once" in err and not started


def test_bench_train_case_names_stay_one_per_case(capsys):
    # distinct values (and two variants of one environment under two labels, an A/A) are accepted, one name a case
    argv = ["--device", "cuda", "--models", "nsa,dense", "--modes", "eager,graphs", "--contexts", "2048,16384",
            "--variant", "a", "--variant", "b", "--dry-run"]
    assert load("bench_train").main(argv) == 0
    names = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if ": model " in line]
    assert len(names) == 2 * 2 * 2 * 2 == len(set(names))


def test_bench_ops_refuses_a_repeated_length(capsys, monkeypatch):
    bench = load("bench_ops")

    def measured(*a, **k):
        raise AssertionError("a length was counted")

    monkeypatch.setattr(bench, "make_layer", measured)
    monkeypatch.setattr(bench, "count_layer", measured)
    err = _refused(capsys, lambda: bench.main(["--seq-lens", "256,1024,256"]))
    assert "--seq-lens: 256 given more than once" in err


def test_bench_significance_refuses_a_repeated_table(capsys, monkeypatch):
    bench = load("bench_significance")
    ran = []
    monkeypatch.setattr(bench, "null", lambda reps, rng: ran.append("null") or [{"x": 0.0}])
    err = _refused(capsys, lambda: bench.main(["--reps", "1", "--only", "null", "--only", "null"]))
    assert "--only: null given more than once" in err and not ran
