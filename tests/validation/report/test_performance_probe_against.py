"""The report's comparison with an earlier run (`run/report --against`), read from hand-built run directories
(training.csv files with known figures): the section's figures against a hand computation (scipy's t quantiles
and the log-ratios themselves), a launch with a figure outside its physical range shown as `compare` shows it,
and two identical runs that claim nothing."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/validation: the record builders
from decision_support import write_csv  # noqa: E402
from results_records import run_record  # noqa: E402

from validation.report import render  # noqa: E402
from validation.report.compare import performance_analysis, table_lines  # noqa: E402
from validation.report.performance import performance_view  # noqa: E402

FLAT = [1000.0 + (i % 5) for i in range(20)]  # its window's tokens over its time: 20 / sum(1 / v) = 1,001.998


def _launch(run_dir: Path, rel: str, values: list[float], **metrics) -> dict:
    write_csv(run_dir / rel, values)
    return {"csv": rel, "window": {"last": 20, "warmup": 0}, "status": "ok", **metrics}


def _run(run_dir: Path, launches: dict[str, dict]) -> dict:
    steps = {name: {"name": name, "kind": "train", "status": "passed", "runs": [], "metrics": m}
             for name, m in launches.items()}
    results = run_record({"runbook": {"name": "rb"}, "steps": steps})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(results))
    return results


def _against(now: dict, earlier: dict, now_dir: Path, earlier_dir: Path) -> dict:
    return {**now, "performance_analysis": performance_analysis(now, earlier, now_dir, earlier_dir)}


def test_a_figure_outside_its_physical_range_reads_as_compare_prints_it(tmp_path):
    """B's tokens/s of 4.096e18 (a step time of a femtosecond; its device's peak allows 1e6): the row is shown, not
    compared, and its figure reads 4.096e+18 as compare's table and the row's own note print it, not as the 25-digit
    '4,096,000,000,000,000,000.0' the section printed."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    ctx = {"peak_flops": 1e15, "flops_per_token": 1e9, "world_size": 1}  # at most 1e6 tokens/s
    earlier = _run(a_dir, {"fast": _launch(a_dir, "fast.csv", FLAT, context=ctx)})
    now = _run(b_dir, {"fast": _launch(b_dir, "fast.csv", [4.096e18] * 20, context=ctx,
                                       toks_per_s={"mean": 4.096e18, "n": 20})})
    results = _against(now, earlier, b_dir, a_dir)
    (row,) = performance_view(results)["rows"]
    assert (row["mean_a"], row["mean_b"], row["verdict"], row["p"]) == ("1,002.0", "4.096e+18", "inconclusive",
                                                                        "not tested")
    assert "toks_per_s.mean = 4.096e+18 outside" in row["note"]
    compared = next(ln for ln in table_lines(results["performance_analysis"]) if ln.startswith("fast "))
    assert compared.split()[2:4] == ["1,002.0", "4.096e+18"]
    md = render(results, "md")
    assert "| fast | toks_per_s | 1,002.0 | 4.096e+18 |" in md


def test_the_section_states_the_change_its_interval_and_holm_p_as_computed_by_hand(tmp_path):
    """Three single-run steps, B 10%, 8% and 15% slower (flat windows: their block means have no spread): the
    common change is the mean log-ratio with a t interval over the 3 steps (2 df); each step's row is held to the
    robust spread of the steps' changes (1.4826 x MAD / sqrt 2 a side, 2 df); Holm over the 4 p-values. Nothing is
    significant (each step row's floor is 50%, the common p after Holm is above 5%)."""
    ratios = {"s1": 0.90, "s2": 0.92, "s3": 0.85}
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    earlier = _run(a_dir, {n: _launch(a_dir, f"{n}.csv", [1000.0] * 20) for n in ratios})
    now = _run(b_dir, {n: _launch(b_dir, f"{n}.csv", [1000.0 * r] * 20) for n, r in ratios.items()})
    view = performance_view(_against(now, earlier, b_dir, a_dir))
    rows = {r["step"]: r for r in view["rows"] if r["metric"] == "toks_per_s"}

    d = [math.log(r) for r in ratios.values()]
    mean = sum(d) / 3
    se = math.sqrt(sum((x - mean) ** 2 for x in d) / 2) / math.sqrt(3)
    t = sps.t.ppf(0.975, 2)
    common_p = 2 * sps.t.sf(abs(mean / se), 2)
    med = sorted(d)[1]
    side = 1.4826 * sorted(abs(x - med) for x in d)[1] / math.sqrt(2)  # one run's share of the steps' spread
    step_p = {n: 2 * sps.t.sf(abs(math.log(r)) / (math.sqrt(2) * side), 2) for n, r in ratios.items()}
    ps = sorted([common_p, *step_p.values()])
    holm, running = [], 0.0
    for k, p in enumerate(ps):
        running = max(running, min(1.0, (4 - k) * p))
        holm.append(running)
    adjusted = dict(zip(ps, holm))

    def pct(x: float) -> str:
        return f"{x * 100:+.1f}%"

    common = rows["all steps (common change)"]
    assert (common["rel_delta"], common["ci_range"]) == (
        pct(math.expm1(mean)), f"{pct(math.expm1(mean - t * se))} to {pct(math.expm1(mean + t * se))}")
    assert common["p"] == f"{adjusted[common_p]:.3f}" and common["significant"] == "no"
    for name, r in ratios.items():
        half = t * math.sqrt(2) * side
        assert rows[name]["rel_delta"] == pct(r - 1)
        assert rows[name]["ci_range"] == f"{pct(math.expm1(math.log(r) - half))} to {pct(math.expm1(math.log(r) + half))}"
        assert rows[name]["p"] == f"{adjusted[step_p[name]]:.3f}" and rows[name]["verdict"] == "inconclusive"
    assert (common["rel_delta"], rows["s3"]["ci_range"]) == ("-11.0%", "-26.1% to -2.2%")  # the figures, written out
    assert view["summary"] == "4 metrics compared, 4 tested: 0 significantly better, 0 significantly worse"
    assert view["gate"] == "no significant regression"


def test_a_run_against_an_identical_run_claims_no_change(tmp_path):
    """The same three launches on both sides: every change +0.0%, nothing significant, no regression gated, and
    the key finding says none changed."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    launches = {n: [v * k for v in FLAT] for n, k in (("s1", 1.0), ("s2", 2.0), ("s3", 3.0))}
    earlier = _run(a_dir, {n: _launch(a_dir, f"{n}.csv", v) for n, v in launches.items()})
    now = _run(b_dir, {n: _launch(b_dir, f"{n}.csv", v) for n, v in launches.items()})
    results = _against(now, earlier, b_dir, a_dir)
    view = performance_view(results)
    toks = [r for r in view["rows"] if r["metric"] == "toks_per_s"]
    assert len(toks) == 4 and all(r["rel_delta"] == "+0.0%" and r["significant"] == "no" for r in toks)
    assert view["summary"].endswith("0 significantly better, 0 significantly worse")
    assert view["key_finding"].startswith("none: no metric changed significantly")
    assert results["performance_analysis"]["exit_code"] == 0 and view["gate"] == "no significant regression"


def test_a_launch_that_did_not_pass_is_shown_not_compared(tmp_path):
    """B's train step timed out after writing a training.csv at 0.3x the earlier speed: its figures are no
    measurement of the configuration. It was tested, called significantly worse and made compare exit 1 (a
    regression), with no word of its status; now shown, not compared, never gating, and named."""
    from validation.report.compare import compare_runs

    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    names = ("s1", "s2", "s3")
    earlier = _run(a_dir, {n: _launch(a_dir, f"{n}.csv", [1000.0 + (i % 3) for i in range(20)]) for n in names})
    now = _run(b_dir, {n: _launch(b_dir, f"{n}.csv", [(300.0 if n == "s1" else 1000.0) + (i % 3) for i in range(20)])
                       for n in names})
    now["steps"]["s1"]["status"] = "timeout"
    out = compare_runs(earlier, now, a_dir, b_dir)
    row = next(r for r in out["rows"] if r["step"] == "s1" and r["metric"] == "toks_per_s")
    assert row["tested"] is False and row["verdict"] == "inconclusive" and "did not pass (B: timeout)" in row["note"]
    assert out["exit_code"] == 0 and not out.get("regressions")
    assert any("did not pass in either run" in w and "s1 (B: timeout)" in w for w in out["warnings"])


def test_the_earlier_runs_start_and_sha_are_said_without_a_verdict(tmp_path):
    # an earlier run cut off before its verdict: its start and git sha were dropped with the missing verdict
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    earlier = _run(a_dir, {"s": _launch(a_dir, "s.csv", FLAT)})
    earlier.update(verdict=None, started="2026-11-30T10:00:00+0000")
    earlier.setdefault("environment", {})["git_sha"] = "0123456789abcdef"
    (a_dir / "results.json").write_text(json.dumps(earlier))
    now = _run(b_dir, {"s": _launch(b_dir, "s.csv", FLAT)})
    view = performance_view(_against(now, earlier, b_dir, a_dir))
    assert view["against_about"] == "started 2026-11-30T10:00:00+0000, git 0123456789ab"
    md = render(_against(now, earlier, b_dir, a_dir), "md")
    assert "(started 2026-11-30T10:00:00+0000, git 0123456789ab):" in md
