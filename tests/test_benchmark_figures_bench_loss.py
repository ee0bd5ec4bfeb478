"""benchmarks/bench_loss.py's figures from known timings (each implementation's call replaced by one that takes a
given time on a fake clock): rounds alternated with the order reversed every round, the check call and the warm-up
calls never timed, min / median / max in ms, and each round's ratio to the reference's time in the same round
(its median is the median of those ratios, not a ratio of medians)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from benchmark_scripts import load

bench = load("bench_loss")

# seconds of each impl's timed calls, round by round; untimed calls (the check, the warm-up) take 1,000 s
TIMED = {"reference": [0.010, 0.020, 0.030], "chunked": [0.005, 0.030, 0.012], "fused": [0.020, 0.020, 0.060]}
UNTIMED = 1 + 2  # the check call and --warmup 2


def _fake(monkeypatch):
    clock = {"now": 0.0}
    calls: list[str] = []
    seen: dict[str, int] = {}

    def step(impl, args, hidden, weight, targets):
        n = seen[impl] = seen.get(impl, -1) + 1
        calls.append(impl)
        clock["now"] += 1000.0 if n < UNTIMED else TIMED[impl][n - UNTIMED]
        return torch.tensor(2.0), torch.zeros(2), torch.zeros(2)

    monkeypatch.setattr(bench, "_step", step)
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: clock["now"]))
    return calls


def test_rounds_alternate_reversed_and_ratios_are_per_round(monkeypatch):
    calls = _fake(monkeypatch)
    args = bench.parse(["--tokens", "8", "--vocab", "16", "--dim", "4", "--repeats", "3", "--warmup", "2",
                        "--impls", "chunked,fused"])
    rows = bench.run(args)
    timed = calls[-9:]
    assert timed == ["reference", "chunked", "fused", "fused", "chunked", "reference", "reference", "chunked", "fused"]
    assert calls[:3] == ["reference", "chunked", "fused"]  # the checks come first, untimed
    ch = rows["chunked"]
    assert (ch["ms_min"], ch["ms_median"], ch["ms_max"]) == pytest.approx((5.0, 12.0, 30.0))
    # per round 5/10, 30/20, 12/30: median 0.5 (the ratio of the medians, 12/20, would be 0.6)
    assert (ch["ratio_min"], ch["ratio_median"], ch["ratio_max"]) == pytest.approx((0.4, 0.5, 1.5))
    fu = rows["fused"]
    assert (fu["ratio_min"], fu["ratio_median"], fu["ratio_max"]) == pytest.approx((1.0, 2.0, 2.0))
    assert rows["reference"]["ratio_median"] == 1.0 and rows["reference"]["ms_median"] == pytest.approx(20.0)
    assert ch["peak_gib"] is None  # no CUDA: no peak, never 0


def test_the_printed_table_and_the_json_carry_the_same_figures(monkeypatch, tmp_path, capsys):
    _fake(monkeypatch)
    out = tmp_path / "loss.json"
    argv = ["--tokens", "8", "--vocab", "16", "--dim", "4", "--repeats", "3", "--warmup", "2", "--impls", "chunked",
            "--json", str(out)]
    assert bench.main(argv) == 0
    text = capsys.readouterr().out
    line = next(x for x in text.splitlines() if x.startswith("chunked "))
    # reference 10, 20, 30 ms; chunked 5, 30, 12 (rounds 1 and 3 in order, round 2 reversed)
    assert "    5.00    12.00    30.00     0.500 (0.400-1.500)" in line
    assert "reproduce: python benchmarks/bench_loss.py " + " ".join(argv) in text
    data = json.loads(out.read_text())
    assert data["by_impl"]["chunked"]["ms_median"] == pytest.approx(12.0) and data["repeats"] == 3


def test_dry_run_times_nothing(monkeypatch, capsys):
    monkeypatch.setattr(bench, "run", lambda args: pytest.fail("a dry run ran the cases"))
    assert bench.main(["--device", "cuda", "--fused-configs", "8192x16", "--dry-run"]) == 0
    assert "reference, chunked, fused, fused@8192x16" in capsys.readouterr().out


# --------------------------------------------------------------------------- the gradient check, on real small runs
TINY = ["--tokens", "48", "--vocab", "90", "--dim", "16", "--chunk", "16", "--repeats", "1", "--warmup", "0",
        "--impls", "chunked"]
LINEAR_CROSS_ENTROPY = bench.linear_cross_entropy


def _scaled_gradient(monkeypatch, which: str, factor: float):
    """The chunked loss with the same value but its gradient w.r.t. `which` (hidden or weight) times `factor`."""
    real = LINEAR_CROSS_ENTROPY

    def scaled(hidden, weight, targets, **kwargs):
        bump = lambda t: t + (factor - 1.0) * (t - t.detach())  # noqa: E731 - same value, gradient x factor
        if which == "hidden":
            hidden = bump(hidden)
        else:
            weight = bump(weight)
        return real(hidden, weight, targets, **kwargs)

    monkeypatch.setattr(bench, "linear_cross_entropy", scaled)


@pytest.mark.parametrize("which,name", [("hidden", "hidden states"), ("weight", "head weight")])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_gradient_beyond_its_tolerance_exits_1_naming_it(monkeypatch, capsys, which, name, dtype):
    """The loss is the reference's to the last bit, one gradient is off (by 50%, then by 1.5 x GRAD_TOLERANCE,
    norm-wise): the run ends before anything is timed, with a message naming the implementation, the gradient and
    the difference (exit status 1)."""
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: pytest.fail("timed a wrong gradient")))
    for factor in (1.5, None):
        tol = bench.GRAD_TOLERANCE[dtype] if factor is None else None
        _scaled_gradient(monkeypatch, which, factor or 1.0 + 1.5 * tol)
        with pytest.raises(SystemExit) as exc:
            bench.main(TINY + ["--dtype", dtype])
        message = str(exc.value.code)  # a message, not an int: the interpreter exits with status 1
        assert not isinstance(exc.value.code, int)
        assert message.startswith(f"chunked: the gradient w.r.t. the {name} differs from the reference's by ")
        rel = float(message.split(" by ")[1].split(" ")[0])
        made = factor - 1.0 if factor else 1.5 * tol
        assert rel == pytest.approx(made, rel=0.2)  # the figure it names is the difference made
        assert f"more than {bench.GRAD_TOLERANCE[dtype]:g} in {dtype}" in message


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_gradients_within_their_tolerance_pass_and_are_reported(monkeypatch, tmp_path, dtype):
    """The chunked loss as it is (bf16: CPU autocast), and with its weight gradient 0.5 x GRAD_TOLERANCE off: both
    pass, and the JSON carries each gradient's norm-wise difference."""
    out = tmp_path / "loss.json"
    assert bench.main(TINY + ["--dtype", dtype, "--json", str(out)]) == 0
    row = json.loads(out.read_text())["by_impl"]["chunked"]
    assert 0 <= row["grad_hidden_rel_diff"] < bench.GRAD_TOLERANCE[dtype] / 2
    assert 0 <= row["grad_weight_rel_diff"] < bench.GRAD_TOLERANCE[dtype] / 2
    _scaled_gradient(monkeypatch, "weight", 1.0 + 0.5 * bench.GRAD_TOLERANCE[dtype])
    assert bench.main(TINY + ["--dtype", dtype, "--json", str(out)]) == 0
    row = json.loads(out.read_text())["by_impl"]["chunked"]
    assert row["grad_weight_rel_diff"] == pytest.approx(0.5 * bench.GRAD_TOLERANCE[dtype], rel=0.3)
