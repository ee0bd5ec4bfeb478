"""A repeat measured under interference is run again before a step decides (validation.kinds.trainer.run_all,
the runbook's `retry_disturbed`): the ab, sweep and triage kinds. Over fake launches whose telemetry says which were
disturbed: the whole repeat runs again in <dir>_retry<n>, the first attempt's runs move to `superseded` with what
replaced them, at most `retry_disturbed` attempts, none with `retry_disturbed: 0` or for a kind that does not decide
from repeats; and an A/B whose baseline stays disturbed keeps its default and says that nothing was compared."""

from __future__ import annotations

from pathlib import Path
import pytest

from decision_support import ab_runbook, run_ab_step
from validation.runbook.plan import step_launches
from validation.runbook.loader import RunbookError, load_runbook
from validation.kinds import ab as ab_mod
from validation.kinds import trainer as trainer_mod

REPO = Path(__file__).resolve().parents[3]


def _step(tmp_path, extra=""):
    path = tmp_path / "rb.yaml"
    path.write_text(ab_runbook(2, defaults=extra))
    return load_runbook(path, cwd=str(REPO)).steps()[0]


def _run(monkeypatch, tmp_path, disturbed, extra=""):
    """AB.run over fake launches: batched 10x faster; `disturbed(spec)` says which launches other work disturbed.
    Returns (result, the directories launched in order)."""
    launched = []

    def collect(spec):
        launched.append(spec)
        shaken = disturbed(spec)
        return {"toks_per_s": {"mean": 10000.0 if spec.label == "batched" else 1000.0}, "throughput_stable": True,
                "interference": {"disturbed": shaken, "share": 0.5 if shaken else 0.0,
                                 "text": "other processes used 1.50 of 2 cores" if shaken else "no interference"}}

    def values(run):
        return [10000.0 + run["repeat"]] * 8 if run["label"] == "batched" else [1000.0 + 3 * run["repeat"]] * 8

    result = run_ab_step(monkeypatch, tmp_path, ab_runbook(2, defaults=extra), collect, values)
    return result, [s.dir for s in launched]


def test_a_disturbed_repeat_runs_again_whole_and_the_decision_stands_on_the_new_runs(monkeypatch, tmp_path):
    result, dirs = _run(monkeypatch, tmp_path, lambda spec: spec.label == "baseline" and spec.repeat == 1
                        and "_retry" not in spec.dir)
    assert len(dirs) == 6 and sorted(dirs[4:]) == ["pick/baseline_r2_retry1", "pick/batched_r2_retry1"]
    assert [r["dir"] for r in result["runs"]].count("pick/baseline_r2_retry1") == 1 and len(result["runs"]) == 4
    old = {r["dir"]: r["superseded_by"] for r in result["superseded"]}
    assert old == {"pick/baseline_r2": "pick/baseline_r2_retry1", "pick/batched_r2": "pick/batched_r2_retry1"}
    assert any("run again" in n and "pick/baseline_r2" in n for n in result["notes"])
    assert result["decision"]["significant"] and result["choice"]["label"] == "batched"
    assert result["decision"]["disturbed_runs"] == []


def test_retry_spec_moves_the_trainers_out_dir_with_the_launch(tmp_path):
    spec = step_launches(_step(tmp_path), {}, tmp_path)[0]
    again = trainer_mod.retry_spec(spec, 2)
    assert again.dir == spec.dir + "_retry2" and again.out_dir == spec.dir + "_retry2/out"
    assert again.argv[again.argv.index("--out-dir") + 1] == str(tmp_path / (spec.dir + "_retry2") / "out")
    assert again.label == spec.label and again.repeat == spec.repeat and again.env == spec.env


def test_attempts_are_bounded_and_a_baseline_still_disturbed_keeps_the_default(monkeypatch, tmp_path):
    result, dirs = _run(monkeypatch, tmp_path, lambda spec: spec.label == "baseline" and spec.repeat == 1,
                        extra=", retry_disturbed: 2")
    assert len(dirs) == 4 + 2 + 2 and dirs[-2:] == [d.replace("_retry1", "_retry2") for d in dirs[-4:-2]]
    assert len(result["superseded"]) == 4 and len(result["notes"]) >= 2
    d = result["decision"]
    assert not d["significant"] and d["choice"] == "baseline" and d["kept_default"]
    assert "only batched was measured undisturbed" in d["reason"] and "the default baseline is kept" in d["reason"]
    assert ab_mod.AB().summary_line(ab_mod.AB().read(result)) == " no decision, nothing compared: baseline kept"


def test_no_retry_when_the_runbook_says_0(monkeypatch, tmp_path):
    result, dirs = _run(monkeypatch, tmp_path, lambda spec: spec.label == "baseline" and spec.repeat == 1,
                        extra=", retry_disturbed: 0")
    assert len(dirs) == 4 and "superseded" not in result
    assert result["decision"]["disturbed_runs"] == [{"label": "baseline", "repeat": 1}]


def test_retry_disturbed_must_be_a_count(tmp_path):
    with pytest.raises(RunbookError, match="retry_disturbed"):
        _step(tmp_path, ", retry_disturbed: -1")


def test_only_a_kind_that_decides_from_repeats_takes_retry_disturbed(tmp_path):
    """In `defaults` it applies to the ab, sweep and triage steps; on a train step it would do nothing, so it is
    refused there with the file's line, not silently accepted."""
    assert _step(tmp_path, ", retry_disturbed: 2").launch.retry_disturbed == 2
    path = tmp_path / "train.yaml"
    path.write_text(ab_runbook(2).replace("kind: ab", "kind: train").split("        baseline:")[0]
                    .replace("kind: train\n", "kind: train\n        retry_disturbed: 1\n"))
    with pytest.raises(RunbookError, match=r"train.yaml:\d+: .*retry_disturbed: unknown key"):
        load_runbook(path, cwd=str(REPO))
