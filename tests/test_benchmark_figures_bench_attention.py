"""benchmarks/bench_attention.py's figures from known timings (its cases replaced by records with hand-made times):
min / median / max in ms, the ratio to dense worded by its direction (a case slower than dense is never "faster"),
no ratio from a zero median, tokens/s and the targets from the medians, a failed case in the JSON as failed (never
0 ms) and the reproduce line with the options given."""

from __future__ import annotations

import json

import pytest

from benchmark_scripts import load

bench = load("bench_attention")


def _case(path: str, s: int, fwd: tuple, bwd: tuple) -> dict:
    """A case as run_case writes it, from (min, median, max) seconds of the forward and the backward."""
    def stats(t):
        return {"min": t[0], "median": t[1], "max": t[2]}
    fwdbwd = tuple(f + b for f, b in zip(fwd, bwd))
    return {"path": path, "seq_len": s, "batch": 1, "repeats": 3, "peak_gb": 0.5,
            "times_s": {"fwd": stats(fwd), "bwd": stats(bwd), "fwdbwd": stats(fwdbwd)},
            "toks_per_s": s / fwdbwd[1] if fwdbwd[1] else None, "device": "cpu", "dtype": "fp32"}


def test_the_ratio_to_dense_is_worded_by_its_direction():
    dense = _case("dense", 64, (0.010, 0.020, 0.030), (0.040, 0.040, 0.050))
    nsa = _case("nsa-torch", 64, (0.030, 0.040, 0.050), (0.010, 0.020, 0.030))
    # fwd: 40 ms against dense's 20: 2x slower; bwd: 20 against 40: 2x faster; fwd+bwd 60 against 60
    assert bench.versus_dense(nsa, dense) == "fwd 2.00x slower, bwd 2.00x faster, fwd+bwd 1.00x faster"
    zero = _case("nsa-torch", 64, (0.0, 0.0, 0.0), (0.010, 0.020, 0.030))
    assert bench.versus_dense(zero, dense) == "bwd 2.00x faster, fwd+bwd 3.00x faster"  # no ratio from a zero fwd
    assert bench.versus_dense(nsa, _case("dense", 64, (0, 0, 0), (0, 0, 0))) == ""


def test_a_run_prints_its_figures_and_records_a_failed_case_as_failed(monkeypatch, tmp_path, capsys):
    dense = _case("dense", 64, (0.010, 0.020, 0.030), (0.040, 0.040, 0.050))
    nsa = _case("nsa-torch", 64, (0.030, 0.040, 0.050), (0.010, 0.020, 0.030))
    cases = {("dense", 64): dense, ("nsa-torch", 64): nsa,
             ("nsa-torch", 128): {"path": "nsa-torch", "seq_len": 128, "error": "exit 1: boom"}}
    order = []

    def spawn(path, s, args):
        order.append((s, path))
        return cases.get((path, s), {"path": path, "seq_len": s, "error": "out of memory"})

    monkeypatch.setattr(bench, "spawn", spawn)
    out = tmp_path / "a.json"
    argv = ["--paths", "nsa-torch,dense", "--seq-lens", "64,128", "--repeats", "3", "--json", str(out)]
    assert bench.main(argv) == 1  # a case failed
    assert order == [(64, "dense"), (64, "nsa-torch"), (128, "dense"), (128, "nsa-torch")]  # dense first at each S
    text = capsys.readouterr().out
    assert text.splitlines()[0] == "reproduce: python benchmarks/bench_attention.py " + " ".join(argv)
    line = next(x for x in text.splitlines() if x.strip().startswith("64 nsa-torch"))
    assert "fwd   30.00/  40.00/  50.00" in line and "fwd+bwd   40.00/  60.00/  80.00" in line
    assert f"{64 / 0.060:,.0f} tok/s" in line
    assert "vs dense (medians): fwd 2.00x slower, bwd 2.00x faster, fwd+bwd 1.00x faster" in line
    assert "128 nsa-torch   failed: exit 1: boom" in text
    data = json.loads(out.read_text())
    failed = [c for c in data["results"] if c["seq_len"] == 128]
    assert all("error" in c and "times_s" not in c for c in failed)  # no time at all, never 0 ms
    assert data["argv"] == argv


def test_cpu_targets_from_the_medians():
    class Args:
        device, dtype, shape = "cpu", "fp32", "small"

    t4 = _case("nsa-torch", 4096, (0.1, 0.2, 0.3), (0.1, 0.2, 0.3))  # fwd+bwd median 0.4 s
    t16 = _case("nsa-torch", 16384, (0.9, 1.0, 1.1), (1.3, 1.4, 1.5))  # 2.4 s: 6.0x the time for 4x the tokens
    checks = {name: (value, ok) for name, value, ok in
              bench.targets({("nsa-torch", 4096): t4, ("nsa-torch", 16384): t16}, Args, ["nsa-torch"])}
    assert checks["time(16384)/time(4096) <= 6"] == ("6.00", True)
    assert checks["S=16384 peak < 8 GB"] == ("0.50 GB", True)
    assert "torch kernels S=2048 >= 7,000 tok/s fwd+bwd" not in checks  # not measured in this run


def test_cuda_targets_are_dense_over_nsa_for_faster():
    class Args:
        device, dtype, shape = "cuda", "bf16", "m7c"

    nsa = _case("nsa-triton", 65536, (0.010, 0.010, 0.010), (0.020, 0.020, 0.020))
    dense = _case("dense", 65536, (0.060, 0.060, 0.060), (0.060, 0.060, 0.060))
    checks = {name: (value, ok) for name, value, ok in
              bench.targets({("nsa-triton", 65536): nsa, ("dense", 65536): dense}, Args, ["nsa-triton", "dense"])}
    assert checks["S=65536 fwd: NSA >= 3x faster than dense"] == ("6.00x", True)
    assert checks["S=65536 fwdbwd: NSA >= 4x faster than dense"] == ("4.00x", True)
    assert checks["S=65536 peak memory <= 1.5x dense"] == ("1.00x", True)


def test_cuda_targets_are_the_kernel_issues():
    """Issue 31's targets at 65,536: forward+backward >= 4x dense, forward >= 3x, peak memory within 1.5x dense;
    a 4.5x forward meets its target, 3.5x forward+backward and 1.6x the memory do not."""
    class Args:
        device, dtype, shape = "cuda", "bf16", "m7c"

    nsa = {**_case("nsa-triton", 65536, (0.010, 0.010, 0.010), (0.030, 0.030, 0.030)), "peak_gb": 1.6}
    dense = {**_case("dense", 65536, (0.045, 0.045, 0.045), (0.095, 0.095, 0.095)), "peak_gb": 1.0}
    checks = {name: (value, ok) for name, value, ok in
              bench.targets({("nsa-triton", 65536): nsa, ("dense", 65536): dense}, Args, ["nsa-triton", "dense"])}
    assert checks == {"S=65536 fwd: NSA >= 3x faster than dense": ("4.50x", True),
                      "S=65536 fwdbwd: NSA >= 4x faster than dense": ("3.50x", False),
                      "S=65536 peak memory <= 1.5x dense": ("1.60x", False)}


@pytest.mark.parametrize("argv", [["--quick"], ["--device", "cuda", "--seq-lens", "65536", "--paths", "nsa-triton"]])
def test_dry_run_lists_the_cases_and_runs_none(argv, monkeypatch, capsys):
    monkeypatch.setattr(bench, "spawn", lambda *a: pytest.fail("a dry run spawned a case"))
    assert bench.main([*argv, "--dry-run"]) == 0
    lines = [x for x in capsys.readouterr().out.splitlines() if "subprocess" in x]
    if argv == ["--quick"]:  # CPU: dense first, nsa-torch, the sequential oracle up to 2,048
        assert [x.split(":")[0].split() for x in lines] == [[str(s), p] for s in (512, 1024, 2048)
                                                            for p in ("dense", "nsa-torch", "sequential")]
    else:
        assert lines == [" 65536 nsa-triton: one subprocess, 3 warm-up and 10 timed passes"]
