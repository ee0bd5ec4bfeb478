"""What the run itself measured with and without a setting: the key finding, the Performance analysis of the run's
own comparisons, each recommended setting with its measured effect or its reason, the conclusion, the environment's
git branch and dirty flag, and the quiet wording of a healthy run (plurals, near-zero ratios, CPU ranks)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pytest

from validation.report import findings, render
from validation.formatting import plural
from validation.report.view import build_view, key_figure_lines

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture
def results():
    return json.loads((FIXTURES / "results_example.json").read_text())


def _prefill_step(significant: bool = True) -> dict:
    comp = {"baseline": "baseline", "variant": "batched", "metric": "toks_per_s", "mean_a": 1_271.9,
            "mean_b": 26_310.3, "rel": 19.686, "rel_delta": 19.686, "ci_low": 17.2, "ci_high": 22.4,
            "p_value": 1e-6 if significant else 0.4, "significant": significant,
            "verdict": "better" if significant else "same", "noise_floor": 0.05}
    runs = [{"label": "baseline", "repeat": 0, "status": "passed", "params": {"env.NSA_PREFILL_BATCHED": "0"},
             "metrics": {"toks_per_s": {"mean": 1_271.9, "n": 12}}},
            {"label": "batched", "repeat": 0, "status": "passed", "params": {"env.NSA_PREFILL_BATCHED": "1"},
             "metrics": {"toks_per_s": {"mean": 26_310.3, "n": 12}}}]
    choice = {"label": "batched" if significant else "baseline",
              "params": {"env.NSA_PREFILL_BATCHED": "1"} if significant else {}, "significant": significant,
              "kept_default": not significant, "explanation": "x"}
    return {"name": "prefill", "kind": "ab", "title": "Prefill A/B", "status": "passed", "runs": runs,
            "comparison": [comp], "choice": choice, "winner": choice if significant else None,
            "decision": {"significant": significant, "comparison": comp, "method": "blocks", "repeats": 1,
                         "noise_floor": 0.05, "reason": "r", "excluded_ignored": []},
            "metrics": {}, "env": {"NSA_PREFILL_BATCHED": "1"}}


def _with_prefill(results: dict, significant: bool = True) -> dict:
    out = copy.deepcopy(results)
    out["steps"]["prefill"] = _prefill_step(significant)
    out["phases"].append({"name": "prefill", "title": "Prefill", "steps": ["prefill"]})
    env = out.setdefault("recommendations", {}).setdefault("env", {})
    env["NSA_PREFILL_BATCHED"] = "1"
    env["NSA_DDP_COMPRESS"] = "bf16"
    return out


def test_the_key_finding_is_the_largest_significant_with_and_without_effect(results):
    res = _with_prefill(results)
    comps = findings.comparisons(res)
    assert {c.step for c in comps} >= {"prefill"}
    finding = findings.key_finding(comps)
    assert finding["step"] == "prefill" and finding["rel"] == pytest.approx(19.686)
    text = finding["text"]
    assert "NSA_PREFILL_BATCHED=1" in text and "NSA_PREFILL_BATCHED=0" in text
    assert "26,310.3" in text and "1,271.9" in text and "95% CI" in text and "20.7x" in text
    md = render(res, "md")
    assert f"**Key finding** (the largest significant effect this run measured, with and without): {text}" in md
    assert "## Performance Analysis" in md and "### With and without, measured in this run" in md
    assert any(line.startswith("Key finding: ") and "NSA_PREFILL_BATCHED=1" in line for line in key_figure_lines(res))
    html = render(res, "html")
    assert "With and without, measured in this run" in html and "26,310.3" in html


def test_a_variant_that_runs_more_steps_names_its_setting_and_says_its_length_apart(results):
    """cpu_smoke's batched prefill runs 40 steps against the baseline's 10 (so its window lasts about as long): the
    finding names the setting, NSA_PREFILL_BATCHED=1, with the run length beside its label, never "args.steps=40" as
    if it were a setting that mattered."""
    res = _with_prefill(results)
    res["steps"]["prefill"]["runs"][1]["params"]["args.steps"] = 40
    text = findings.key_finding(findings.comparisons(res))["text"]
    assert "NSA_PREFILL_BATCHED=1 (batched, 40 steps)" in text and "args.steps" not in text
    md = render(res, "md")
    assert "args.steps=40" not in md.split("## Acceptance Criteria")[0].split("## Performance Analysis")[1]
    assert "Key finding: NSA_PREFILL_BATCHED=1 (batched, 40 steps)" in md.split("## Conclusion")[1]


def test_no_significant_effect_is_said_and_an_ignored_setting_is_never_a_finding(results):
    res = _with_prefill(results, significant=False)
    fused = res["steps"]["fused_adamw"]
    fused.setdefault("decision", {})["excluded_ignored"] = ["fused"]
    for comp in fused.get("comparison") or []:
        comp["significant"], comp["verdict"] = True, "better"  # even if it looked significant
    comps = findings.comparisons(res)
    assert all(not c.significant for c in comps if c.step == "fused_adamw")
    assert any(c.ignored for c in comps if c.step == "fused_adamw")
    finding = findings.key_finding(comps)
    assert finding["text"].startswith("none: no significant effect in ")
    assert findings.key_finding([]) is None


def test_each_recommended_setting_says_its_measured_effect_or_why_it_is_always_recommended(results):
    res = _with_prefill(results)
    rows = {r["name"]: r for r in findings.recommendation_rows(res, findings.comparisons(res))}
    assert rows["NSA_PREFILL_BATCHED"]["source"] == "measured"
    assert rows["NSA_PREFILL_BATCHED"]["why"].startswith("measured in this run: ") and "95% CI" in \
        rows["NSA_PREFILL_BATCHED"]["why"]
    compress = rows["NSA_DDP_COMPRESS"]
    assert compress["source"] == "always" and compress["why"].startswith("always recommended")
    assert "compression" in compress["why"]  # what the setting does (nsa.toggles)
    # an --only run that never ran with it says so
    only = copy.deepcopy(res)
    for step in only["steps"].values():
        step.get("env", {}).pop("NSA_DDP_COMPRESS", None)
    rows = {r["name"]: r for r in findings.recommendation_rows(only, findings.comparisons(only))}
    assert "No step of this run ran with it: not measured here." in rows["NSA_DDP_COMPRESS"]["why"]
    md = render(res, "md")
    assert "- `NSA_DDP_COMPRESS=bf16`: always recommended" in md
    assert "- `NSA_PREFILL_BATCHED=1`: measured in this run: " in md


def test_the_conclusion_names_what_passed_what_failed_and_the_next_action(results):
    res = _with_prefill(results)
    failing = [c["name"] for c in res["acceptance"] if c["status"] in ("fail", "error")]
    c = build_view(res)["conclusion"]
    assert failing and all(name in c["failed"] for name in failing) and "failed criteria" in c["next"]
    for crit in res["acceptance"]:
        crit["status"] = "pass"
    for step in res["steps"].values():
        if step.get("status") != "skipped":
            step["status"] = "passed"
    res["verdict"] = "GO"
    c = build_view(res)["conclusion"]
    assert "prefill" in c["passed"] and c["failed"] == "nothing failed"
    assert "NSA_PREFILL_BATCHED=1" in c["next"]
    broken = copy.deepcopy(res)
    broken["steps"]["longrun"]["status"] = "failed"
    broken["verdict"] = "NO-GO"
    c = build_view(broken)["conclusion"]
    assert "1 step failed (longrun)" in c["failed"] and "`longrun/`" in c["next"] and "--resume" in c["next"]
    md = render(broken, "md")
    assert "## Conclusion" in md and "**NO-GO.** Passed: " in md and "Next: fix what failed" in md


def test_a_warning_criterion_that_could_not_be_computed_is_open_not_failed(results):
    """A warn-severity criterion in error (a figure its step did not record: MFU where the device's peak is unknown)
    does not fail the run (the verdict names it among the warnings): the conclusion lists it under Open, not
    Failed; a required criterion in error is still a failure."""
    res = _with_prefill(results)
    for crit in res["acceptance"]:
        crit["status"] = "pass"
    for step in res["steps"].values():
        step["status"] = "passed"
    res["acceptance"][0].update(status="error", severity="warn")
    name = res["acceptance"][0]["name"]
    res["verdict"] = "GO"
    c = build_view(res)["conclusion"]
    assert c["failed"] == "nothing failed"
    assert f"1 criterion only warned, not computable ({name})" in c["open"]
    res["acceptance"][0]["severity"] = "fail"
    res["verdict"] = "NO-GO"
    c = build_view(res)["conclusion"]
    assert f"1 criterion failed ({name})" in c["failed"] and name not in c["open"]

def test_the_conclusion_keeps_what_did_not_finish_or_only_warned_out_of_failed(results):
    """An interrupted step, a skipped step and a criterion that only warned neither passed nor failed: the conclusion
    lists them under Open, and Failed says nothing failed."""
    res = _with_prefill(results)
    for crit in res["acceptance"]:
        crit["status"] = "pass"
    res["acceptance"][0]["status"] = "warn"
    warned = res["acceptance"][0]["name"]
    names = sorted(res["steps"])
    for name in names:
        res["steps"][name]["status"] = "passed"
    res["steps"][names[0]]["status"] = "interrupted"
    res["steps"][names[1]]["status"] = "skipped"
    res["verdict"] = "INCOMPLETE"
    c = build_view(res)["conclusion"]
    assert c["failed"] == "nothing failed"
    assert f"1 step did not finish ({names[0]})" in c["open"] and f"1 step skipped ({names[1]})" in c["open"]
    assert f"1 criterion only warned ({warned})" in c["open"]
    md = render(res, "md")
    assert f"Failed: nothing failed. Open: 1 step did not finish ({names[0]})" in md
    res["steps"][names[0]]["status"] = res["steps"][names[1]]["status"] = "passed"
    res["acceptance"][0]["status"] = "pass"
    res["verdict"] = "GO"
    assert build_view(res)["conclusion"]["open"] == "" and "Open:" not in render(res, "md")


def test_git_branch_and_dirty_flag_are_recorded_and_shown(tmp_path, results):
    from validation.launch.environment import git_state

    assert git_state(tmp_path) == {"git_branch": None, "git_dirty": None, "git_changes": None}
    run = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)  # noqa: E731
    run("init", "-q", "-b", "work")
    (tmp_path / "f.txt").write_text("a\n")
    run("add", "f.txt")
    run("-c", "user.email=a@b", "-c", "user.name=a", "commit", "-qm", "x")
    assert git_state(tmp_path) == {"git_branch": "work", "git_dirty": False, "git_changes": 0}
    (tmp_path / "f.txt").write_text("b\n")
    (tmp_path / "untracked.txt").write_text("u\n")  # untracked files do not make a tree dirty
    assert git_state(tmp_path) == {"git_branch": "work", "git_dirty": True, "git_changes": 1}
    res = copy.deepcopy(results)
    res["environment"].update(git_branch="work", git_dirty=True, git_changes=1)
    md = render(res, "md")
    assert "| Git branch | work |" in md and "| Working tree | dirty: 1 tracked file changed since the commit |" in md


def test_quiet_wording_plurals_near_zero_ratios_and_cpu_ranks(results):
    from validation.kinds.train_report import init_growth, telemetry_notes
    from validation.results.codec import decode
    from validation.results.trainer_launch import LaunchMetrics

    assert plural(1, "sample") == "1 sample" and plural(3, "sample") == "3 samples"
    launch = {"telemetry": {"samples": 1, "period": "the window", "files": ["telemetry.csv"]}}
    note = telemetry_notes(decode(LaunchMetrics, launch, lenient=True))[0]
    assert note.startswith("Telemetry (1 sample over the window")
    small = init_growth({"init_s": 0.1, "n_params": 100}, [("single", {"init_s": 0.039, "n_params": 100})])
    assert "x)" not in small["text"] and "not compared as a ratio" in small["text"] and not small["flagged"]
    big = init_growth({"init_s": 20.0, "n_params": 100}, [("single", {"init_s": 4.0, "n_params": 100})])
    assert "(5.00x)" in big["text"] and big["flagged"]
    cpu = copy.deepcopy(results)
    cpu["environment"].update(gpu_count=0, gpus=[], cpu_count=2)
    for step in cpu["steps"].values():
        for m in [step.get("metrics") or {}] + [(r.get("metrics") or {}) for r in step.get("runs") or []]:
            m.setdefault("context", {})["device"] = "cpu"
    md = render(cpu, "md")
    assert "| Per GPU, window mean |" not in md and "| Per rank, window mean |" in md
    figure = next(f for f in build_view(cpu)["key_figures"] if f["label"] == "Scaling efficiency")
    assert "1 core per rank against 2 for the single process" in figure["note"]
    assert "tokens/s per rank" in figure["note"] and "per GPU" not in figure["note"]


def test_a_cpu_only_run_does_not_list_the_missing_nvidia_smi(results):
    from validation.report.problems import open_problems

    cpu = copy.deepcopy(results)
    cpu["steps"]["snapshot"].update(status="passed", reason="nvidia-smi not found: no GPU inventory XML")
    assert any("nvidia-smi not found" in p["what"] for p in open_problems(cpu))  # device unknown: still listed
    for step in cpu["steps"].values():
        if isinstance(step.get("metrics"), dict) and step["metrics"].get("csv"):
            step["metrics"].setdefault("context", {})["device"] = "cpu"
    assert cpu["environment"]["gpu_count"] == 0
    assert not any("nvidia-smi not found" in p["what"] for p in open_problems(cpu))
    gpu = copy.deepcopy(cpu)
    gpu["steps"]["baseline"]["metrics"]["context"]["device"] = "NVIDIA H100"
    assert any("nvidia-smi not found" in p["what"] for p in open_problems(gpu))


def test_the_next_command_is_one_the_cli_takes_with_the_run_s_set_and_quoted_paths():
    """The conclusion's next action names a command `nsa-validate run` accepts for the run as it ended: a finished
    run's failed steps run again into it (--rerun; a plain --resume of a finished run is refused), only failed
    criteria a new run, a finished INCOMPLETE run its skipped and disturbed steps again, a run cut off --resume; each
    with the --set the steps ran with and every path shell-quoted."""
    from results_records import run_record

    def nxt(**partial) -> str:
        base = {"runbook": {"path": "my runbooks/rb.yaml"}, "run_dir": "my runs/r 1", "verdict": "NO-GO",
                "options": {"only": [], "skip": [], "set": ["defaults.args.steps=14", "defaults.env.X=a b"]},
                "steps": {"one": {}, "two": {}, "three": {}}}
        base.update(partial)
        return findings.conclusion(run_record(base), [], None)["next"]

    head = "nsa-validate run 'my runbooks/rb.yaml'"
    sets = "--set defaults.args.steps=14 --set 'defaults.env.X=a b'"
    failed = nxt(steps={"one": {}, "two": {"status": "failed"}, "three": {"status": "timeout"}})
    assert failed.endswith(f"then `{head} --resume 'my runs/r 1' --rerun three --rerun two {sets}`"), failed
    crit = nxt(acceptance=[{"name": "Floor", "expr": "one.x >= 1", "target": ">= 1", "severity": "fail",
                            "description": "", "status": "fail", "actual": "0", "detail": None}])
    assert crit.endswith(f"then start a new run: `{head} {sets}`"), crit
    incomplete = nxt(verdict="INCOMPLETE", steps={"one": {}, "two": {"status": "skipped"}, "three": {}},
                     evidence={"disturbed": [{"step": "three", "text": "busy", "launches": []}]})
    assert incomplete == ("run the steps that did not run or were disturbed again: "
                          f"`{head} --resume 'my runs/r 1' --rerun two --rerun three {sets}`"), incomplete
    cut = nxt(verdict="INCOMPLETE", interrupted_by="SIGINT", steps={"one": {}, "two": {"status": "interrupted"}})
    assert cut == f"finish the run: `{head} --resume 'my runs/r 1' {sets}`", cut
    resumed = nxt(verdict="INCOMPLETE", interrupted_by="SIGINT", steps={"one": {}, "two": {"status": "interrupted"}},
                  resumes=[{"at": "x", "previous_end": None, "previous_state": "interrupted by SIGINT",
                            "steps": ["two"], "rerun": [], "replaced": {}, "runbook_changed": False,
                            "options": {"only": [], "skip": [], "set": []}}])
    assert resumed == f"finish the run: `{head} --resume 'my runs/r 1'`", resumed  # what the last attempt ran with
