"""compare: B against A per trainer run on block means plus the measured run-to-run variation, Holm over all rows,
exit 1 on a significant regression (a CI gate), names never cut; performance_analysis for --against. Synthetic run
directories (training.csv files with a known truth) and a seeded simulation of identical runs."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
from decision_support import ar1_series, write_csv
from results_records import run_record

from validation.report.compare import (COMMON_MIN_SHIFT, COMMON_ROW, UNKNOWN_RUN_NOISE, UNREPEATED_MIN_FLOOR, compare_runs,
                                step_spread,
                                environment_differences, performance_analysis, table_lines)
from validation.analysis.significance import adjust_family, block_units, compare_series, run_noise
from validation.analysis.significance.comparison import compare_shift
from validation.analysis.significance.simulate import ar1

REPO = Path(__file__).resolve().parents[2]
REPS = 2000
LONG = "a_step_name_that_is_much_longer_than_nine_characters_and_then_some_more"


def _csv(path, values):
    write_csv(path, values)


def _results(final_loss=4.0):
    return {"runbook": {"name": "rb"}, "verdict": "GO",
            "environment": {"host": "a", "gpu_count": 2, "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27",
                            "python": "3.11", "git_sha": "x", "gpus": [{"name": "A100"}, {"name": "A100"}]},
            "steps": {"baseline": {"name": "baseline", "runs": [], "metrics": {
                "csv": "baseline/out/training.csv", "window": {"last": 20, "warmup": 0},
                "final_loss": final_loss, "mem_peak_gb": 1.5}}}}


def test_a_step_without_repeats_resolves_only_a_large_change(tmp_path):
    """One run of the step on each side: its run-to-run variation is unknown, so 10% is inconclusive however
    precise the block means, while a change beyond half (2.5x faster, 60% slower) is beyond the floor such a row is held to."""
    a_dir, b_dir, c_dir = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    base = [1000 + (i % 5) for i in range(20)]
    _csv(a_dir / "baseline/out/training.csv", base)
    _csv(b_dir / "baseline/out/training.csv", [v * 1.10 for v in base])
    _csv(c_dir / "baseline/out/training.csv", [v * 2.5 for v in base])
    a, b = _results(), _results(final_loss=3.0)
    out = compare_runs(a, b, a_dir, b_dir)
    rows = {r["metric"]: r for r in out["rows"]}
    toks = rows["toks_per_s"]
    assert toks["verdict"] == "inconclusive" and not toks["significant"] and toks["p_value"] < 1e-4
    assert toks["noise_floor"] == UNREPEATED_MIN_FLOOR and "inconclusive (noise floor 50.0%)" in toks["text"]
    assert toks["note"] == UNKNOWN_RUN_NOISE and toks["rel_delta"] > 0.09 and toks["method"] == "blocks"
    assert rows["final_loss"]["verdict"] == "better" and rows["final_loss"]["tested"] is False  # lower is better
    assert rows["mem_peak_gb"]["verdict"] == "same"
    assert out["exit_code"] == 0 and out["improvements"] == 0
    # no repeats in either run: no step's run-to-run variation is measured, and the output says so
    assert out["run_noise"] is None and any("run-to-run variation not measured" in w for w in out["warnings"])
    big = compare_runs(a, _results(), a_dir, c_dir)
    assert big["rows"][0]["verdict"] == "better" and big["rows"][0]["significant"]
    worse = compare_runs(_results(), a, c_dir, a_dir)
    assert worse["exit_code"] == 1 and worse["regressions"][0]["step"] == "baseline"



def test_a_wide_noise_never_calls_a_large_change_of_a_summary_row_same(tmp_path):
    """final_loss and mem_peak_gb, one value per run, shown, not tested: --noise sets their "same" band, but at most
    the largest floor a tested row may be "same" within (25%): with --noise 0.9 a loss 4.0 -> 0.48 (-88%) is
    better, and 4.0 -> 3.6 (-10%) same."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    base = [1000 + (i % 5) for i in range(20)]
    _csv(a_dir / "baseline/out/training.csv", base)
    _csv(b_dir / "baseline/out/training.csv", base)
    far = {r["metric"]: r for r in compare_runs(_results(), _results(final_loss=0.48), a_dir, b_dir, 0.9)["rows"]}
    assert far["final_loss"]["verdict"] == "better" and far["final_loss"]["rel_delta"] < -0.87
    near = {r["metric"]: r for r in compare_runs(_results(), _results(final_loss=3.6), a_dir, b_dir, 0.9)["rows"]}
    assert near["final_loss"]["verdict"] == "same"

def test_a_disturbed_launch_is_inconclusive_and_never_gates(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    base = [1000 + (i % 5) for i in range(20)]
    _csv(a_dir / "baseline/out/training.csv", base)
    _csv(b_dir / "baseline/out/training.csv", [v * 0.2 for v in base])
    b = _results()
    b["steps"]["baseline"]["metrics"]["interference"] = {
        "disturbed": True, "text": "other processes used 1.40 of 2 cores on average in 5 of 8 samples (62%)"}
    out = compare_runs(_results(), b, a_dir, b_dir)
    row = out["rows"][0]
    assert row["verdict"] == "inconclusive" and row["disturbed"] is True and row["tested"] is False
    assert "B: other processes used 1.40 of 2 cores" in row["note"] and out["exit_code"] == 0
    assert any("measured while other work used the machine" in w for w in out["warnings"])


def test_environment_differences_are_warned():
    a = _results()
    b = copy.deepcopy(a)
    b["environment"]["torch"] = "2.7.1"
    b["environment"]["gpus"] = [{"name": "H100"}]
    b["environment"]["gpu_count"] = 1
    warnings = environment_differences(a, b)
    assert any("torch differs" in w for w in warnings) and any("GPUs differ" in w for w in warnings)
    assert any("gpu_count" in w for w in warnings)
    assert environment_differences(a, copy.deepcopy(a)) == []


def smoke_like(run_dir: Path, seed: int, shift: dict[str, float] | None = None, run_cv: float = 0.08) -> dict:
    """A cpu_smoke-like run directory: a sweep of 3 points x 2 repeats, and single runs (one with a long name);
    every run's level varies by run_cv, its steps are AR(1) (phi 0.7, CV 9%), 15-step windows."""
    rng = np.random.default_rng(seed)
    shift = shift or {}

    def run(rel_dir: str, label_key: str) -> dict:
        level = 1e4 * (1 + shift.get(label_key, 0.0)) * (1 + run_cv * rng.standard_normal())
        _csv(run_dir / rel_dir / "out/training.csv", ar1_series(int(rng.integers(1 << 30)), 15, level, 0.09, 0.7))
        return {"csv": f"{rel_dir}/out/training.csv", "window": {"last": 15, "warmup": 0}, "final_loss": 4.0}

    sweep_runs = [{"label": f"NSA_DDP_BUCKET_MB={mb}", "repeat": r, "status": "passed",
                   "params": {"env.NSA_DDP_BUCKET_MB": str(mb)}, "metrics": run(f"sw/{mb}_r{r + 1}", f"sw{mb}")}
                  for r in range(2) for mb in (25, 50, 100)]
    steps = {"bucket_sweep": {"name": "bucket_sweep", "kind": "sweep", "runs": sweep_runs, "metrics": {}}}
    for name in ("baseline", "single", "profiling", LONG):
        steps[name] = {"name": name, "kind": "train", "runs": [], "metrics": run(name, name)}
    results = {"runbook": {"name": "cpu_smoke"}, "verdict": "GO", "started": "t", "environment": {},
               "steps": steps}
    (run_dir / "results.json").write_text(json.dumps(run_record(results)))  # complete: compare reads it checked
    return results


def test_unmeasured_run_noise_says_why(tmp_path):
    """No step's run-to-run variation measured: the warning says whether no step ran repeats or every repeat was
    disturbed (a run compared with itself on a busy machine), never "no step ran repeats" when some did."""
    a = smoke_like(tmp_path / "a", 1)
    for run in a["steps"]["bucket_sweep"]["runs"]:
        run["metrics"]["interference"] = {"disturbed": True, "text": "other processes used 1.0 of 2 cores"}
    out = compare_runs(a, a, tmp_path / "a", tmp_path / "a")
    unmeasured = [w for w in out["warnings"] if w.startswith("run-to-run variation not measured")]
    assert out["run_noise"] is None and len(unmeasured) == 1
    assert "(their repeats were measured while other work used the machine)" in unmeasured[0]
    assert out["exit_code"] == 0


def test_identical_runs_flag_no_row_and_a_regression_exits_1(cli, tmp_path):
    """Two cpu_smoke-like runs with no difference but 8% run-to-run variation: no row flagged, exit 0, Holm and
    each step's own run-to-run variation in the JSON and in the text; a baseline 85% slower in B: exit 1."""
    a = smoke_like(tmp_path / "a", 1)
    b = smoke_like(tmp_path / "b", 2)
    out = compare_runs(a, b, tmp_path / "a", tmp_path / "b")
    tested = [r for r in out["rows"] if r["tested"]]
    # 6 sweep launches, 4 single-run steps, and the change common to all 7 step labels
    assert len(tested) == 11 and not any(r["significant"] for r in tested) and out["exit_code"] == 0
    assert list(out["run_noise"]) == ["bucket_sweep"]  # the only step with repeats
    assert out["run_noise"]["bucket_sweep"]["runs"] == 12 and out["run_noise"]["bucket_sweep"]["df"] == 6
    assert {r["step"] for r in tested} >= {"bucket_sweep[NSA_DDP_BUCKET_MB=25, repeat 2]", LONG, COMMON_ROW}
    # each row held to the larger of its step's own run-to-run variation and the spread of the steps' changes
    spread = out["step_spread"]["total"]
    assert out["step_spread"]["groups"] == 7
    sweep_rows = [r for r in tested if r["step"].startswith("bucket_sweep[")]
    assert len(sweep_rows) == 6 and all(
        r["run_to_run"] == max(out["run_noise"]["bucket_sweep"]["total"], spread) for r in sweep_rows)
    singles = [r for r in tested if r["step"] in ("baseline", "single", "profiling", LONG)]
    assert all(r["run_to_run"] == spread and r["noise_floor"] >= UNREPEATED_MIN_FLOOR for r in singles)
    common = next(r for r in tested if r["step"] == COMMON_ROW)
    assert common["method"] == "common" and common["n_a"] == 7 and common["noise_floor"] >= 0.05

    proc = cli("compare", tmp_path / "a", tmp_path / "b", "--json")
    assert proc.returncode == 0, proc.stderr
    js = json.loads(proc.stdout)
    assert js["family"]["correction"] == "holm" and js["family"]["family_size"] == 11
    assert "Holm" in js["family"]["statement"] and js["exit_code"] == 0
    for row in (r for r in js["rows"] if r["tested"]):
        assert row["family_size"] == 11 and row["p_adjusted"] >= row["p_value"]
        assert {"ci_low", "ci_high", "noise_floor", "method", "ess_a", "run_to_run", "text"} <= set(row)

    smoke_like(tmp_path / "c", 2, shift={"baseline": -0.85})
    text = subprocess.run([sys.executable, "-m", "validation.cli", "compare", str(tmp_path / "a"),
                           str(tmp_path / "c")], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "COLUMNS": "60"})  # a narrow terminal, not a TTY
    assert text.returncode == 1, text.stdout + text.stderr
    lines = text.stdout.splitlines()
    assert any(line.startswith(LONG) for line in lines)  # never cut, whatever the width
    assert any(line.startswith("baseline ") and "worse (significant)" in line for line in lines)
    assert "Holm's step-down correction over 11 comparisons" in text.stdout
    assert "Result: 1 regression beyond the noise floor" in text.stdout and "(exit 1)" in text.stdout
    assert cli("compare", tmp_path / "a", tmp_path / "nosuch").returncode == 2


def test_performance_analysis_names_the_key_finding(tmp_path):
    earlier = smoke_like(tmp_path / "a", 1)
    now = smoke_like(tmp_path / "b", 2, shift={"single": 0.8})
    pa = performance_analysis(now, earlier, tmp_path / "b", tmp_path / "a")
    assert pa["against"]["run_dir"] == str(tmp_path / "a") and pa["against"]["runbook"] == "cpu_smoke"
    assert pa["key_finding"]["step"] == "single" and pa["key_finding"]["verdict"] == "better"
    assert pa["key_finding"]["text"].startswith("single toks_per_s better: +")
    same = performance_analysis(earlier, earlier, tmp_path / "a", tmp_path / "a")
    assert same["key_finding"]["step"] is None and same["key_finding"]["text"].startswith("none: ")
    assert table_lines(pa)[0].startswith("B = ")


def test_report_against_stores_the_analysis(cli, tmp_path):
    smoke_like(tmp_path / "a", 1)
    smoke_like(tmp_path / "b", 2)
    proc = cli("report", tmp_path / "b", "--against", tmp_path / "a", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    stored = json.loads((tmp_path / "b" / "results.json").read_text())["performance_analysis"]
    assert stored["key_finding"]["text"].startswith("none") and stored["family"]["family_size"] == 11
    assert cli("report", tmp_path / "b", "--against", tmp_path / "nosuch").returncode == 2


def test_report_against_a_run_with_nothing_in_common_is_refused_as_compare_refuses_it(cli, tmp_path):
    """`report --against` of a run with no trainer run in common exits 2 as `compare` does, naming both runs, and
    leaves results.json as it was (it stored a comparison of nothing and exited 0)."""
    smoke_like(tmp_path / "a", 1)
    other = smoke_like(tmp_path / "b", 2)
    other["steps"] = {f"other_{name}": {**step, "name": f"other_{name}"} for name, step in other["steps"].items()}
    (tmp_path / "b" / "results.json").write_text(json.dumps(run_record(other)))
    before = (tmp_path / "b" / "results.json").read_bytes()
    for argv in (("report", tmp_path / "b", "--against", tmp_path / "a"), ("compare", tmp_path / "a", tmp_path / "b")):
        proc = cli(*argv)
        assert proc.returncode == 2, (argv, proc.stdout, proc.stderr)
        assert "no trainer run in common" in proc.stderr and str(tmp_path / "a") in proc.stderr, proc.stderr
    assert (tmp_path / "b" / "results.json").read_bytes() == before


def _simulated_family(rng, shift: float = 0.0):
    """One pair of cpu_smoke-like runs as compare tests them (a 3 x 2 sweep whose rows are held to its own run-to-run
    variation, 6 single-run steps held to UNREPEATED_MIN_FLOOR, the change common to the 9 step labels; every run's
    level varies by 8%, its 15 steps are AR(1), phi 0.7, CV 9%); B's every launch `shift` slower. The Family."""
    rows = 12
    level = 1e4 * (1 + 0.08 * rng.standard_normal((2, rows)))
    level[1] *= 1 - shift
    y = level[..., None] * (1 + ar1(rng, (2, rows, 15), 0.7, 0.09))
    groups = [[(y[s, 2 * g + r].mean(), block_units(y[s, 2 * g + r]).rel_se) for r in range(2)]
              for s in range(2) for g in range(3)]
    means = y.mean(axis=2)
    ratios = [np.log(means[1, 2 * g:2 * g + 2].sum() / means[0, 2 * g:2 * g + 2].sum()) for g in range(3)]
    ratios += [np.log(means[1, j] / means[0, j]) for j in range(6, rows)]
    rn, spread = run_noise(groups), step_spread([float(r) for r in ratios])
    held = max(rn, spread, key=lambda x: x.total)
    comps = [compare_series(y[0, j], y[1, j], run_noise=held, min_floor=COMMON_MIN_SHIFT) for j in range(6)]
    comps += [compare_series(y[0, j], y[1, j], run_noise=spread, min_floor=UNREPEATED_MIN_FLOOR)
              for j in range(6, rows)]
    comps.append(compare_shift(ratios, min_shift=COMMON_MIN_SHIFT))
    return adjust_family(comps)


def test_identical_runs_rarely_flag_a_row_and_a_common_slowdown_is_found():
    """2,000 simulated pairs of identical cpu_smoke-like runs: a pair has a significant row in <= 5%, and a 20%
    slowdown of every launch of B is a regression of the common change in >= 80% of 300 pairs (no single row
    resolves it on its own)."""
    rng = np.random.default_rng(7)
    false = sum(bool(_simulated_family(rng).significant) for _ in range(REPS))
    found = [_simulated_family(rng, shift=0.2) for _ in range(300)]
    common = sum(any(c.method == "common" and c.verdict == "worse" for c in f.comparisons) for f in found)
    print(f"\nidentical cpu_smoke-like runs: a significant row in {false / REPS:.1%} of {REPS} pairs; a 20% slowdown "
          f"of every launch found by the common change in {common / 300:.1%} of 300 pairs")
    assert false / REPS <= 0.05
    assert common / 300 >= 0.8


AA_NOISE = {"run_sd": 0.073, "launch_sd": 0.12, "pairs": 70}  # runbooks/aa_cpu.yaml's declaration


def test_a_whole_run_shift_within_the_runbooks_declared_noise_is_not_a_regression(tmp_path):
    """Two runs whose every step moved 12% (with 3% step to step), as two A/A runs on a 2-core machine did: a
    regression of the common change when nothing says how much runs differ as a whole; not one where the runbook
    declares its A/A noise (compare.run_sd / launch_sd), which still finds a 25% slowdown of every step."""
    steps = ("sw25", "sw50", "sw100", "baseline", "single", "profiling", LONG)
    jitter = dict(zip(steps, (0.0, 0.03, -0.02, 0.02, -0.03, 0.01, -0.01)))
    a = smoke_like(tmp_path / "a", 3, run_cv=0.01)
    b = smoke_like(tmp_path / "b", 4, shift={k: -0.12 + v for k, v in jitter.items()}, run_cv=0.01)
    out = compare_runs(a, b, tmp_path / "a", tmp_path / "b")
    assert out["exit_code"] == 1 and COMMON_ROW in {r["step"] for r in out["regressions"]}
    assert out["declared_noise"] is None
    for run in (a, b):
        run["runbook"]["compare"] = AA_NOISE
    out = compare_runs(a, b, tmp_path / "a", tmp_path / "b")
    assert out["exit_code"] == 0, out["regressions"]
    declared = out["declared_noise"]
    assert declared["run_sd"] == 0.073 and abs(declared["launch_sd"] - 0.12) < 1e-12 and declared["df"] == 69
    common = next(r for r in out["rows"] if r["step"] == COMMON_ROW)
    assert common["rel"] < -0.1 and common["df"] == 69 and common["noise_floor"] >= 1.96 * 0.073
    assert "run_sd 7.3%" in common["note"]
    c = smoke_like(tmp_path / "c", 4, shift={k: -0.25 + v for k, v in jitter.items()}, run_cv=0.01)
    c["runbook"]["compare"] = AA_NOISE
    out = compare_runs(a, c, tmp_path / "a", tmp_path / "c")
    assert out["exit_code"] == 1 and COMMON_ROW in {r["step"] for r in out["regressions"]}


def test_a_step_that_moved_between_runs_with_the_machine_is_not_a_change_but_one_that_moved_alone_is(tmp_path):
    """Two validation runs differ step by step by more than the repeats inside each show: B's sweep 12% faster in
    every repeat (its repeats agree within 1%) while the other steps moved by up to 12% either way is the machine
    between the runs, held to the spread of every step's change; one sweep point 55% slower while the rest moved
    together is a regression (45% was flagged only while compare_units counted the spread's 6 df twice: its
    Holm-adjusted p is 0.07 with 6 df)."""
    shifts = {"sw25": 0.12, "sw50": 0.12, "sw100": 0.12, "baseline": -0.08, "single": 0.1, "profiling": -0.12,
              LONG: 0.06}
    a = smoke_like(tmp_path / "a", 3, run_cv=0.01)
    b = smoke_like(tmp_path / "b", 4, shift=shifts, run_cv=0.01)
    out = compare_runs(a, b, tmp_path / "a", tmp_path / "b")
    assert out["exit_code"] == 0 and not [r for r in out["rows"] if r.get("significant")], \
        [(r["step"], r["rel"], r["noise_floor"]) for r in out["rows"] if r.get("significant")]
    assert out["step_spread"]["total"] > out["run_noise"]["bucket_sweep"]["total"]
    c = smoke_like(tmp_path / "c", 4, shift={**shifts, "sw50": -0.55}, run_cv=0.01)
    out = compare_runs(a, c, tmp_path / "a", tmp_path / "c")
    flagged = {r["step"] for r in out["regressions"]}
    assert out["exit_code"] == 1 and flagged and all(s.startswith("bucket_sweep[NSA_DDP_BUCKET_MB=50,") for s in flagged)
