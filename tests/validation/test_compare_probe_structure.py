"""compare's structure and words as a user reads them: what it cannot put side by side (a step in one run only, a
renamed step, a step whose kind changed, a step that failed in one run, a summary metric one run lacks) is named,
never dropped unsaid; a zero baseline's verdict follows the metric's direction; a throughput row that could not be
tested is "inconclusive", with why, never "better" or "worse"; the text names each run's runbook and verdict.
Synthetic run directories (training.csv files with known figures) compared with hand-computed expectations."""

from __future__ import annotations

import json
from pathlib import Path

from decision_support import write_csv
from results_records import run_record

from validation.report.compare import compare_runs, table_lines
from validation.run import compare_run_dirs

FLAT = [1000.0 + (i % 5) for i in range(20)]  # mean 1002.0


def _launch(run_dir: Path, rel: str, values: list[float], last: int = 20, **metrics) -> dict:
    write_csv(run_dir / rel, values)
    return {"csv": rel, "window": {"last": last, "warmup": 0}, "status": "ok", **metrics}


def _train(name: str, metrics: dict, kind: str = "train", status: str = "passed", reason: str | None = None) -> dict:
    return {"name": name, "kind": kind, "status": status, "reason": reason, "runs": [], "metrics": metrics}


def _write(run_dir: Path, steps: dict, verdict: str = "GO", runbook: str = "rb") -> dict:
    results = run_record({"runbook": {"name": runbook}, "verdict": verdict, "steps": steps})
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(results))
    return results


def test_a_zero_baseline_summary_metric_follows_its_direction(tmp_path):
    """Memory 0 -> 0.5 GB has no percentage (n/a) but is worse (lower is better), not "same"; 0.5 -> 0 is -100%,
    better; a loss of 0 in both runs is +0.0%, same."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = _write(a_dir, {"up": _train("up", _launch(a_dir, "up.csv", FLAT, mem_peak_gb=0.0, final_loss=0.0)),
                       "down": _train("down", _launch(a_dir, "down.csv", FLAT, mem_peak_gb=0.5))})
    b = _write(b_dir, {"up": _train("up", _launch(b_dir, "up.csv", FLAT, mem_peak_gb=0.5, final_loss=0.0)),
                       "down": _train("down", _launch(b_dir, "down.csv", FLAT, mem_peak_gb=0.0))})
    rows = {(r["step"], r["metric"]): r for r in compare_runs(a, b, a_dir, b_dir)["rows"]}
    up = rows[("up", "mem_peak_gb")]
    assert up["rel_delta"] is None and up["delta"] == 0.5 and up["verdict"] == "worse" and up["tested"] is False
    down = rows[("down", "mem_peak_gb")]
    assert down["rel_delta"] == -1.0 and down["verdict"] == "better"
    loss = rows[("up", "final_loss")]
    assert loss["rel_delta"] == 0.0 and loss["verdict"] == "same"
    lines = table_lines(compare_runs(a, b, a_dir, b_dir))
    line = next(ln for ln in lines if ln.startswith("up ") and "mem_peak_gb" in ln)
    assert "n/a" in line and "worse (not tested)" in line


def test_a_throughput_row_too_short_to_test_is_inconclusive_and_says_why(tmp_path):
    """A 3-step window (cpu_smoke's profiling step) cannot be tested: a 2.4% slower B is no "worse" (a tested row
    needs at least a 5% floor and an interval); the text says why the row was not tested."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = _write(a_dir, {"profiling": _train("profiling", _launch(a_dir, "p.csv", [1000.0] * 3, last=3))})
    b = _write(b_dir, {"profiling": _train("profiling", _launch(b_dir, "p.csv", [976.0] * 3, last=3))})
    out = compare_runs(a, b, a_dir, b_dir)
    row = next(r for r in out["rows"] if r["metric"] == "toks_per_s")
    assert row["tested"] is False and abs(row["rel_delta"] - (-0.024)) < 1e-12
    assert row["verdict"] == "inconclusive" and row["note"].startswith("not tested: ")
    assert out["exit_code"] == 0 and not out["regressions"]
    lines = table_lines(out)
    assert any(ln.startswith("profiling ") and "inconclusive (not tested)" in ln for ln in lines)
    assert f"  profiling: {row['note']}" in lines
    assert not any("have one value per run: shown" in ln and "toks_per_s" not in ln for ln in lines)


def test_launches_compare_cannot_pair_are_named(tmp_path):
    """A step renamed (single -> single_proc), a step in A only (longrun), a step that failed in B with no
    launch (baseline), a step whose kind changed (profiling: train -> profile): each is in a warning; the rows
    that remain are the common launches."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = _write(a_dir, {
        "baseline": _train("baseline", _launch(a_dir, "baseline.csv", FLAT)),
        "single": _train("single", _launch(a_dir, "single.csv", FLAT)),
        "longrun": _train("longrun", _launch(a_dir, "longrun.csv", FLAT), kind="longrun"),
        "profiling": _train("profiling", _launch(a_dir, "profiling.csv", FLAT)),
        "tests": {"name": "tests", "kind": "pytest", "status": "passed", "runs": [], "metrics": {}}})
    b = _write(b_dir, {
        "baseline": _train("baseline", {}, status="failed", reason="exit code 1"),
        "single_proc": _train("single_proc", _launch(b_dir, "single.csv", FLAT)),
        "profiling": _train("profiling", _launch(b_dir, "profiling.csv", FLAT), kind="profile")}, verdict="NO-GO")
    out = compare_runs(a, b, a_dir, b_dir)
    assert {r["step"] for r in out["rows"]} == {"profiling"}
    warnings = out["warnings"]
    assert ("steps with trainer launches in one run only, not compared: A only: single, longrun; B only: "
            "single_proc (a step added, removed or renamed between the runs)") in warnings
    assert ("step baseline: 1 trainer launch of A with none of the same label in B, not compared (baseline); B's "
            "step failed (exit code 1)") in warnings
    assert ("step profiling is a train step in A and a profile step in B: its rows compare two kinds of step"
            in warnings)
    assert not any("tests" in w for w in warnings)  # a step without trainer launches is not compare's


def test_a_launch_its_run_recorded_without_a_training_csv_is_named_so(tmp_path):
    """B's sweep point wrote no training.csv when it ran (its metrics say "missing"): the warning names what the
    run recorded, not only that the file is not there now."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"

    def sweep(run_dir: Path, missing: bool) -> dict:
        runs = []
        for mb in (25, 50, 100):
            rel = f"sw/{mb}/training.csv"
            metrics = ({"csv": rel, "status": "missing", "reason": f"missing: {rel}"} if missing and mb == 50
                       else _launch(run_dir, rel, FLAT))
            runs.append({"label": f"B={mb}", "status": "passed", "params": {}, "metrics": metrics})
        return {"sweep": {"name": "sweep", "kind": "sweep", "status": "passed", "runs": runs, "metrics": {}}}

    a, b = _write(a_dir, sweep(a_dir, False)), _write(b_dir, sweep(b_dir, True))
    out = compare_runs(a, b, a_dir, b_dir)
    unread = [w for w in out["warnings"] if "not compared on toks_per_s" in w]
    assert len(unread) == 1 and "sweep[B=50] (B: missing: sw/50/training.csv when it ran)" in unread[0]


def test_a_summary_metric_one_run_lacks_is_named(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a = _write(a_dir, {"baseline": _train("baseline", _launch(a_dir, "b.csv", FLAT, mem_peak_gb=1.5, final_loss=3.0))})
    b = _write(b_dir, {"baseline": _train("baseline", _launch(b_dir, "b.csv", FLAT, final_loss=3.0))})
    out = compare_runs(a, b, a_dir, b_dir)
    assert not any(r["metric"] == "mem_peak_gb" for r in out["rows"])
    assert "mem_peak_gb recorded in one run only for 1 launch, not shown: baseline (A only)" in out["warnings"]


def test_the_text_names_each_runs_runbook_and_verdict_and_a_failed_run_does_not_gate(cli, tmp_path):
    """B ended NO-GO with its baseline failed: the text's first line says so; the exit code stays the documented
    one (no significant regression among the launches compared: 0), the failed step named in a warning."""
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    _write(a_dir, {"baseline": _train("baseline", _launch(a_dir, "b.csv", FLAT)),
                   "single": _train("single", _launch(a_dir, "s.csv", FLAT))}, runbook="cpu_smoke")
    _write(b_dir, {"baseline": _train("baseline", {}, status="failed", reason="exit code 1"),
                   "single": _train("single", _launch(b_dir, "s.csv", FLAT))}, verdict="NO-GO", runbook="cpu_smoke")
    out, lines = compare_run_dirs(a_dir, b_dir)
    assert lines[0] == f"B = {b_dir} (runbook cpu_smoke, NO-GO) against A = {a_dir} (runbook cpu_smoke, GO)"
    proc = cli("compare", a_dir, b_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == lines[0]
    assert "warning: step baseline: 1 trainer launch of A with none of the same label in B" in proc.stderr
