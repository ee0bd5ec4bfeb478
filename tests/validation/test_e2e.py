"""nsa-validate end to end, as a user runs it: real subprocesses, real trainer launches."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from process_checks import heartbeat_pids, orphans
from verdicts import assert_go_or_disturbed

REPO = Path(__file__).resolve().parents[2]
# The README's main job runs beside other tests (pytest-xdist): on a machine that busy its verdict may be INCOMPLETE
# naming the disturbance (verdicts.py), and its prefill A/B may leave disturbed runs out. That the A/B recommends its
# replicated effect beside one busy process is test_prefill_recommendation.py's, which runs alone.


def small_runbook(tmp_path, body: str, name="small") -> Path:
    path = tmp_path / f"{name}.yaml"
    path.write_text(f"""\
name: {name}
requirements: {{gpus: 0, backend: gloo}}
defaults:
  config: configs/tiny_cpu.yaml
  env: {{NSA_TB_DISABLE: "1"}}
  args: {{steps: 6, save_every: 1000}}
  nproc_per_node: 1
  timeout_s: 120
  stall_timeout_s: 30
  window: 3
  warmup_steps: 1
{body}""")
    return path


@pytest.fixture(scope="module")
def smoke(cli, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    # retry_disturbed 0: beside the other xdist worker the machine stays busy for the whole run, so an A/B or sweep
    # repeat run again would be disturbed again; the retries (tests/validation/kinds/test_retry_disturbed.py) only
    # doubled those steps here, past the timeout on a slow machine. The timeout is the CLI's own wall time.
    proc = cli("run", "runbooks/cpu_smoke.yaml", "--out", run_dir, "--set", "defaults.retry_disturbed=0", timeout=2400)
    return run_dir, proc


def test_cpu_smoke_ends_go_with_every_artifact(smoke):
    """GO; on a busy machine INCOMPLETE, every inconclusive criterion naming its disturbance (verdicts.py)."""
    run_dir, proc = smoke
    results = json.loads((run_dir / "results.json").read_text())
    word = assert_go_or_disturbed(proc, results)
    assert all(s["status"] == "passed" for s in results["steps"].values()), \
        {n: (s["status"], s["reason"]) for n, s in results["steps"].items()}
    for name in ("report.md", "report.html", "junit.xml"):
        assert (run_dir / name).is_file(), name
    assert list((run_dir / "plots").glob("*.png"))
    # every launch left its command, environment and logs
    for step in results["steps"].values():
        if step["kind"] != "snapshot":
            assert step["command"], step["name"]
    assert (run_dir / "baseline" / "command.json").is_file()
    assert (run_dir / "baseline" / "out" / "training.csv").is_file()
    assert (run_dir / "snapshot" / "collect_env.txt").is_file()
    sweep = results["steps"]["bucket_sweep"]  # 3 points x 2 repeats; a decision, significant or the default kept
    assert len(sweep["runs"]) == 6 and sweep["choice"]["label"].startswith("NSA_DDP_BUCKET_MB=")
    # decided, unless other work disturbed every run of a point, so that nothing was compared (then not decided)
    compared = bool(sweep["decision"]["comparisons"])
    assert sweep["metrics"]["decided"] is compared and isinstance(sweep["decision"]["order_seed"], int)
    assert compared or sweep["interference"]["disturbed"], sweep["decision"]["reason"]
    chosen = sweep["choice"]["params"]["env.NSA_DDP_BUCKET_MB"]
    assert results["steps"]["sdpa_audit"]["env"]["NSA_DDP_BUCKET_MB"] == chosen  # carried into the later step
    assert results["recommendations"]["env"].get("NSA_DDP_BUCKET_MB") == (
        chosen if sweep["decision"].get("recommendable") else None)  # recommended only when replicated
    assert results["recommendations"]["env"]["NSA_DDP_COMPRESS"] == "bf16"
    assert {c["status"] for c in results["acceptance"]} <= {"pass", "warn", "inconclusive"}
    # the prefill A/B's 14x effect, replicated in its interleaved repeats, is recommended unless other work left
    # its runs out (a neighbouring test's ranks: more than the one busy process the A/B is made to stand, which
    # test_prefill_recommendation.py checks); the fused AdamW A/B (one run each) never is
    prefill = results["steps"]["prefill"]
    if prefill["decision"]["recommendable"]:
        assert results["recommendations"]["env"]["NSA_PREFILL_BATCHED"] == "1"
    else:
        assert "left out because other work used the machine" in prefill["decision"]["reason"], \
            prefill["decision"]["reason"]
        # the runbook's own `recommend` (NSA_PREFILL_BATCHED=1) stays, and the note says it is not this step's
        note = next(n for n in results["recommendations"]["notes"] if n.startswith("prefill: "))
        assert "not recommended from this step" in note and \
            "NSA_PREFILL_BATCHED=1 (the runbook's recommendation) stays" in note, note
    assert "NSA_OPT_FUSED" not in results["recommendations"]["env"]
    assert not results["steps"]["fused_adamw"]["decision"]["recommendable"]
    if word == "GO":  # disturbed evidence may stand beside GO only where no required criterion reads it (a warn
        # criterion such as "Long run throughput steady" on a disturbed long run is inconclusive, and the run says so)
        evidence = results.get("evidence") or {}
        assert all(c["severity"] != "fail" for c in results["acceptance"] if c["status"] != "pass")
        if evidence.get("disturbed"):
            assert evidence.get("rerun"), evidence
    # the fused AdamW A/B compares two different settings on a CPU too: the variant's trainer ran torch's fused
    # AdamW and said nothing was ignored, so the step raises no open problem of its own making
    fused = results["steps"]["fused_adamw"]
    for label, want in (("baseline", False), ("fused", True)):
        env = json.loads((run_dir / "fused_adamw" / label / "out" / "env.json").read_text())
        assert env["optimizer"] == {"name": "AdamW", "fused": want}, label
    assert not [n for n in fused.get("notes") or [] if "ignored" in n], fused.get("notes")
    report = (run_dir / "report.md").read_text()
    assert word in report and "Bucket" in report or "bucket" in report
    assert "ignored NSA_OPT_FUSED" not in report


def test_every_trainer_step_has_telemetry_summary_and_time_to_first_step(smoke):
    run_dir, proc = smoke
    results = json.loads((run_dir / "results.json").read_text())
    report = (run_dir / "report.md").read_text()
    for name in ("baseline", "sdpa_audit", "profiling", "single", "longrun"):
        m = results["steps"][name]["metrics"]
        assert (run_dir / name / "telemetry.csv").is_file(), name
        assert m["telemetry"]["samples"] >= 1 and m["cpu_util"]["mean"] > 0 and m["rss_gb"]["max"] > 0.05, name
        assert m["gpu_util"] is None and m["throttled"] is None  # CPU: no GPU figures, said in the notes
        assert m["summary"]["steps"] == results["steps"][name]["metrics"]["last_step"], name
        assert 0 < m["time_to_first_step_s"] < results["steps"][name]["duration_s"], name
        assert (run_dir / "plots" / f"telemetry_{name}.png").is_file(), name
        section = report[report.index(f"- Step: `{name}` ("):]
        section = section[:min(section.find(m) % (len(section) + 1) for m in ("\n#### ", "\n## "))]
        assert "**Training Summary**" in section and "**Time to first step**: " in section, name
        assert "Telemetry (" in section and "GPU telemetry: none" in section, name
    # 2 ranks under torchrun: the agent and both ranks are in the sampled tree
    with open(run_dir / "baseline" / "telemetry.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert max(int(r["procs"]) for r in rows) >= 3
    # and what else used the machine beside it, judged over the statistics window
    assert all(r["other_cpu_pct"] != "" for r in rows[1:]) and "disturbed" in results["steps"]["baseline"][
        "metrics"]["interference"]
    for run in results["steps"]["bucket_sweep"]["runs"]:  # sweeps: per run, in compact form
        assert run["metrics"]["telemetry"]["samples"] >= 1 and run["metrics"]["summary"]["steps"] == 20
    assert "Training Summary per run:" in report
    html = (run_dir / "report.html").read_text()
    assert "<h5>Training Summary</h5>" in html and 'alt="Telemetry: ' in html


def test_the_profile_step_attributes_step_time_by_category(smoke):
    """validation.analysis.attribution on the profile step's real trace: shares of step time that sum to 1, the attention
    branches and the optimizer (its nsa.optim range) present, a bar chart and a report line."""
    run_dir, _ = smoke
    results = json.loads((run_dir / "results.json").read_text())
    att = results["steps"]["profiling"]["metrics"]["profile"]["attribution"]
    shares = att["categories"]
    assert att["steps"] >= 1 and abs(sum(shares.values()) - 1.0) < 1e-6, att
    assert shares["attention branches"] > 0 and shares["optimizer"] > 0 and shares["importance and top-k"] > 0, att
    assert (run_dir / "plots" / "attribution_profiling.png").is_file()
    assert "Step time by category (" in (run_dir / "report.md").read_text()


def test_report_rerenders_identically_from_results_json(cli, smoke):
    run_dir, proc = smoke
    again = cli("report", run_dir, "--format", "md")
    assert again.returncode == 0, again.stderr
    assert again.stdout == (run_dir / "report.md").read_text()
    junit = cli("report", run_dir, "--format", "junit")
    assert junit.stdout == (run_dir / "junit.xml").read_text()


def test_compare_a_run_with_itself_changes_nothing(cli, smoke):
    """Every row 0%: "same" where its interval lies inside the noise floor, else "inconclusive" (the floor is
    wider than the interval can show), never better or worse; exit 0. Its only warnings: launches other work
    disturbed, and (on a machine busy enough for a window's tokens/s to vary by more than half their mean) launches
    with a figure the run itself holds outside its physical range."""
    from validation.analysis.plausibility import step_implausible
    run_dir, _ = smoke
    proc = cli("compare", run_dir, run_dir, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["rows"] and all(r["verdict"] in ("same", "inconclusive") for r in out["rows"])
    assert all(r["rel_delta"] == 0 for r in out["rows"] if r["metric"] == "toks_per_s" and r.get("rel_delta") is not None)
    assert out["exit_code"] == 0 and out["family"]["correction"] == "holm" and not out["regressions"]
    steps = json.loads((run_dir / "results.json").read_text())["steps"].values()
    implausible = any(step_implausible(step) for step in steps)
    expected = ("other work used the machine",) + (("outside its physical range",) if implausible else ())
    assert all(any(words in w for words in expected) for w in out["warnings"]), out["warnings"]


def test_list_shows_runbooks(cli, smoke):
    proc = cli("list")
    assert proc.returncode == 0 and "cpu_smoke" in proc.stdout and "ddp_2xa100" in proc.stdout


def test_plan_lists_every_command_and_runs_nothing(cli, tmp_path):
    proc = cli("plan", "runbooks/ddp_2xa100.yaml")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # shell-quoted, as a shell would run it (an unquoted <free> would be a redirection)
    assert "-m torch.distributed.run --nproc_per_node=2 '--master-port=<free>'" in out and "-m nsa.training" in out
    assert "NSA_DDP_COMPRESS=bf16" in out and "NSA_DDP_BUCKET_MB=100" in out and "--steps 1200" in out
    assert "SKIPPED here: needs 2 GPU(s), found 0" in out
    data = json.loads(cli("plan", "runbooks/cpu_smoke.yaml", "--json").stdout)
    assert [r["step"] for r in data][:3] == ["snapshot", "sanity_tests", "baseline"]
    assert not list(tmp_path.iterdir())


def test_the_plan_shows_the_command_the_launcher_ran(cli, smoke):
    """`plan` prints the launcher's own command lines (validation.launch.torchrun.local_command_lines): the smoke
    run's two-rank baseline ran exactly the planned command, its port and run directory filled in."""
    run_dir, _ = smoke
    rows = {r["step"]: r for r in json.loads(cli("plan", "runbooks/cpu_smoke.yaml", "--json").stdout)}
    ran = json.loads((run_dir / "baseline" / "command.json").read_text())
    planned = rows["baseline"]["launches"][0]["commands"]
    assert len(planned) == 1 and "torch.distributed.run" in " ".join(planned[0])
    filled = [a.replace("<free>", str(ran["master_port"])).replace("RUN_DIR", str(run_dir)) for a in planned[0]]
    assert filled == ran["argv"]


def test_schema_error_exits_2_naming_key_and_line(cli, tmp_path):
    path = small_runbook(tmp_path, "phases:\n  - name: p\n    steps:\n      - {name: a, kind: train, stepz: 1}\n")
    proc = cli("run", path, "--out", tmp_path / "r")
    assert proc.returncode == 2
    assert f"{path}:15: phases[0].steps[0].stepz: unknown key" in proc.stderr
    assert not (tmp_path / "r").exists()
    bad = small_runbook(tmp_path, "phases:\n  - name: p\n    steps:\n      - {name: a, kind: train}\n"
                                  "acceptance:\n  - {name: c, expr: 'a.toks_per_s.mean >>> 1'}\n", name="bad")
    proc = cli("plan", bad)
    assert proc.returncode == 2 and "acceptance[0].expr" in proc.stderr and ":17:" in proc.stderr


def test_failing_criterion_is_no_go_and_unmet_requirement_is_skipped(cli, tmp_path):
    """A correctness criterion (the loss), so that it decides on a busy machine too: a throughput criterion would
    be inconclusive there whichever way it went (INCOMPLETE), which test_evidence.py covers."""
    path = small_runbook(tmp_path, """\
phases:
  - name: p
    steps:
      - {name: fast, kind: train}
      - {name: gpu_only, kind: train, requires: {gpus: 1}}
acceptance:
  - {name: impossible, expr: "fast.loss_drop >= 1000", target: ">= 1000 nats"}
  - {name: gpu, expr: "gpu_only.toks_per_s.mean > 0", severity: warn}
""")
    proc = cli("run", path, "--out", tmp_path / "r")
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["verdict"] == "NO-GO" and "impossible" in results["verdict_reason"]
    assert results["steps"]["fast"]["status"] == "passed"
    assert results["steps"]["gpu_only"]["status"] == "skipped"
    assert "needs 1 GPU(s), found 0" in results["steps"]["gpu_only"]["reason"]
    by_name = {c["name"]: c for c in results["acceptance"]}
    assert by_name["impossible"]["status"] == "fail" and "fast.loss_drop" in by_name["impossible"]["actual"]
    assert by_name["gpu"]["status"] == "skipped"


@pytest.mark.slow  # the fault matrix (test_faults.py) covers a crash, a hang with its stack dumps and no orphans in CI
@pytest.mark.reliability
def test_crashing_and_hanging_steps_are_reported_and_leave_no_process(cli, tmp_path, reliability):
    path = small_runbook(tmp_path, """\
phases:
  - name: p
    steps:
      - {name: crash, kind: train, env: {NSA_FAULT: "crash@3"}}
      - {name: hang, kind: train, nproc_per_node: 2, env: {NSA_FAULT: "hang@3:1"}, stall_timeout_s: 4,
         args: {ddp: 1, pg-timeout: 300}}
""")
    t0 = time.time()
    proc = cli("run", path, "--out", tmp_path / "r", timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert time.time() - t0 < 200  # the hang ended at the stall timeout, not the 300 s process-group timeout
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    crash, hang = results["steps"]["crash"], results["steps"]["hang"]
    reliability.record_fault("NSA_FAULT crash (1 rank)", "failed", crash["status"])
    reliability.record_fault("NSA_FAULT hang", "hang", hang["status"])
    assert crash["status"] == "failed" and "NSA_FAULT injected crash" in (crash["excerpt"] or crash["reason"])
    assert hang["status"] == "hang" and "rank 1" in hang["reason"]
    assert hang["stack_dumps"], "no stack dumps collected from the hung ranks"
    report = (tmp_path / "r" / "report.md").read_text()
    assert "NSA_FAULT injected crash" in report
    pids = heartbeat_pids(tmp_path / "r" / "hang" / "out") + heartbeat_pids(tmp_path / "r" / "crash" / "out")
    assert len(pids) == 3
    assert orphans(pids, cmdline_contains=str(tmp_path / "r")) == [], "trainer processes left behind"


@pytest.mark.slow  # in CI: SIGINT/SIGTERM/SIGHUP at every stage (test_signals.py, with --resume keeping the finished
@pytest.mark.reliability  # step) and SIGKILL mid-step then --resume (test_faults.py)
def test_interrupt_then_resume_skips_finished_steps(cli, tmp_path, reliability):
    path = small_runbook(tmp_path, """\
phases:
  - name: p
    steps:
      - {name: first, kind: train}
      - {name: second, kind: train, args: {steps: 100000}}
""")
    run_dir = tmp_path / "r"
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    proc = subprocess.Popen([sys.executable, "-m", "validation.cli", "run", str(path), "--out", str(run_dir)],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not list((run_dir / "second" / "out").glob("heartbeat_rank0.jsonl")):
            time.sleep(0.2)
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGINT)
        out, errs = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    results = json.loads((run_dir / "results.json").read_text())
    reliability.record_fault("nsa-validate SIGINT mid-step", "exit 130, INCOMPLETE, step interrupted",
                             f"exit {proc.returncode}, {results['verdict']}, step {results['steps']['second']['status']}")
    assert proc.returncode == 130, out[-2000:] + errs[-2000:]
    assert results["verdict"] == "INCOMPLETE"
    assert results["steps"]["first"]["status"] == "passed"
    assert results["steps"]["second"]["status"] == "interrupted"
    assert orphans(heartbeat_pids(run_dir / "second" / "out"), cmdline_contains=str(run_dir)) == []
    first_csv = (run_dir / "first" / "out" / "training.csv").stat().st_mtime
    resumed = cli("run", path, "--resume", run_dir, "--set", "phases.p.steps.second.args.steps=4")
    final = json.loads((run_dir / "results.json").read_text())
    reliability.record_fault("--resume after SIGINT", "GO (exit 0)", f"{final['verdict']} (exit {resumed.returncode})")
    kept = final["steps"]["first"] == results["steps"]["first"] and \
        (run_dir / "first" / "out" / "training.csv").stat().st_mtime == first_csv  # not re-run
    reliability.record_results(lost=0 if kept else 1, checked=1)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert final["verdict"] == "GO" and final["steps"]["second"]["status"] == "passed"
    assert kept


def test_only_and_skip_select_phases(cli, tmp_path):
    path = small_runbook(tmp_path, """\
phases:
  - name: first
    steps:
      - {name: a, kind: train, args: {steps: 3}}
  - name: second
    steps:
      - {name: b, kind: train, args: {steps: 3}}
""")
    proc = cli("run", path, "--out", tmp_path / "r", "--only", "second")
    results = json.loads((tmp_path / "r" / "results.json").read_text())
    assert results["steps"]["a"]["status"] == "skipped" and "not selected" in results["steps"]["a"]["reason"]
    assert results["steps"]["b"]["status"] == "passed"
    assert proc.returncode == 0, proc.stdout[-2000:]
    bad = cli("run", path, "--out", tmp_path / "r2", "--skip", "nosuch")
    assert bad.returncode == 2 and "no phase 'nosuch'" in bad.stderr
