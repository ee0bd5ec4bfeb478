"""The GPU benchmarks refuse what cannot run before their first case (a GPU session's minutes are few), and a
benchmark whose cases failed does not exit 0."""

from __future__ import annotations

import pytest
import torch

from benchmark_scripts import load

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


@no_cuda
@pytest.mark.parametrize("script, argv", [
    ("bench_attention", ["--device", "cuda", "--seq-lens", "2048", "--paths", "dense"]),
    ("bench_train", ["--device", "cuda", "--models", "dense", "--modes", "eager"]),
])
def test_device_cuda_without_cuda_is_refused_before_any_case(script, argv, capsys, monkeypatch):
    bench = load(script)
    started = []  # each case is a subprocess: none may start (every one failed on its own before, exit 0 or 1)
    monkeypatch.setattr(bench.subprocess, "run", lambda *a, **k: started.append(a))
    monkeypatch.setattr(bench.subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2 and not started
    assert "--device cuda: no CUDA device here" in capsys.readouterr().err
    assert bench.main([*argv, "--dry-run"]) == 0  # the dry run needs no device (tests/test_next_run.py)


def test_bench_attention_exits_1_when_a_case_failed(monkeypatch, capsys):
    bench = load("bench_attention")
    monkeypatch.setattr(bench, "spawn", lambda path, s, args: {"path": path, "seq_len": s, "error": "exit 1: boom"})
    assert bench.main(["--device", "cpu", "--paths", "dense", "--seq-lens", "64"]) == 1
    assert "failed: exit 1: boom" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "x", ",", "256,-1"])
def test_bench_ops_refuses_lengths_below_one(value, capsys):
    with pytest.raises(SystemExit) as exc:
        load("bench_ops").main(["--seq-lens", value])
    assert exc.value.code == 2 and "--seq-lens" in capsys.readouterr().err
