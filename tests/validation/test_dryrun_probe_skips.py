"""`run --dry-run` says of each step what the run then does with it: a step it shows as launching is launched, and a
step it shows as skipped is not, for the reason the run records. The runs go through the real runner
(validation.run.run_runbook); only the launch is a stand-in: a trainer launch writes what a trainer leaves behind
(decision_support.FakeTrainer), a benchmark launch writes its JSON or fails, as `FAIL` says. The combinations: a
step using a sweep's winner when --only or --skip leaves the sweep out, a --resume whose sweep ended without a
winner, a --resume where a step with on_failure: stop failed, --reuse of the sweep's phase (with --only), and a
--rerun of a step whose sweep was taken from an earlier run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from validation.execution import runner
from validation.launch import environment
from validation.launch.spec import LaunchResult
from validation.results import reuse
from validation.results.store import read_results
from validation.run import RunRequest, not_run, prepare, run_runbook

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decision_support import FAKE_ENV, FakeTrainer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
DIGEST = "d" * 64  # the source digest of every run here (the tree may change while the tests run)

RUNBOOK = """\
name: dry_vs_run
requirements: {gpus: 0, backend: gloo}
defaults:
  config: {config}
  env: {NSA_TB_DISABLE: "1"}
  args: {dataset: synthetic, ddp: 0, steps: 8}
  nproc_per_node: 1
  timeout_s: 60
  window: 6
  warmup_steps: 2
phases:
  - name: tune
    steps:
      - name: sw
        kind: sweep
        matrix: {env.FOO_S: ["a", "b"]}
        repeats: 1
  - name: use
    steps:
      - {name: after, kind: train, env: {FOO_S: "${sw.winner.env.FOO_S}"}}
  - name: gate
    steps:
      - {name: check, kind: bench, command: [check.py], on_failure: stop}
  - name: tail
    steps:
      - {name: last, kind: bench, command: [last.py]}
"""


class Launcher:
    """runner.launch: a trainer launch writes a trainer's files (failing every launch of the steps in `fail`); a
    benchmark launch writes its --json, or fails when its step is in `fail`. `launched` holds the steps launched."""

    def __init__(self):
        self.fail: set[str] = set()
        self.launched: list[str] = []
        self.trainer = FakeTrainer(lambda spec: 3000.0 if spec.params.get("env.FOO_S") == "a" else 1000.0, cv=0.01)

    def __call__(self, spec) -> LaunchResult:
        self.launched.append(spec.step)
        argv = [str(a) for a in spec.argv]
        failed = spec.step in self.fail
        if spec.trainer_out_dir is not None and not failed:
            return self.trainer(spec)
        log = Path(spec.step_dir) / "stdout.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("stand-in\n")
        if not failed:
            Path(argv[argv.index("--json") + 1]).write_text(json.dumps({"x": 1.0}))
        return LaunchResult(status="failed" if failed else "ok", returncode=1 if failed else 0, duration_s=0.01,
                            argv=argv, log_path=log, rank_logs={}, reason="exited 1" if failed else "exited 0",
                            excerpt=None, stack_dumps=[], attempts=1)


@pytest.fixture
def setup(monkeypatch, tmp_path):
    launcher = Launcher()
    monkeypatch.setattr(runner, "launch", launcher)
    monkeypatch.setattr(environment, "probe", lambda cwd=None: {**FAKE_ENV, "source_digest": DIGEST})
    monkeypatch.setattr(reuse, "source_digest", lambda root=None: DIGEST)
    for script in ("check.py", "last.py"):
        (tmp_path / script).write_text("")
    path = tmp_path / "dry_vs_run.yaml"
    path.write_text(RUNBOOK.replace("{config}", str(REPO / "configs" / "tiny_cpu.yaml")))
    return path, launcher


def dry_then_run(launcher: Launcher, request: RunRequest) -> tuple[dict, dict]:
    """(what the dry run says would not launch, by step; results.json of the run), after checking that the run
    launched exactly the steps the dry run shows as launching, recorded each step the dry run says it skips for
    that reason (or kept, untouched, the step whose result a --resume keeps; or took it from the earlier run
    --reuse names), and launched no step the dry run says it skips."""
    prepared = prepare(request)
    said = not_run(prepared)
    before = {} if request.resume is None else json.loads(json.dumps(read_results(request.resume)["steps"]))
    launcher.launched.clear()
    results = run_runbook(request).results
    steps = [s.name for s in prepared.runbook.steps()]
    assert sorted(set(launcher.launched)) == sorted(n for n in steps if n not in said)
    for name, why in said.items():
        record = results["steps"][name]
        if "is kept (--resume" in why:
            assert record == before[name], name
        elif "(--reuse)" in why:
            assert record.get("reused"), name
        else:
            assert (record["status"], record["reason"]) == ("skipped", why), name
    return said, results


def request(path, **kw) -> RunRequest:
    return RunRequest(runbook=path, cwd=path.parent, no_report=True, **kw)


@pytest.mark.parametrize("options", [{"only": ("use",)}, {"skip": ("tune",)}], ids=["only", "skip"])
def test_a_step_using_the_winner_of_a_sweep_left_out_is_said_skipped(setup, tmp_path, options):
    """--only use (the step alone, without the sweep it needs) or --skip tune: the run skips `after` ("needs the
    winner of sw, which has none (skipped)"); the dry run showed it launching."""
    path, launcher = setup
    said, results = dry_then_run(launcher, request(path, out=tmp_path / "run", **options))
    assert said["after"] == "needs the winner of sw, which has none (skipped)"
    assert "check" not in said if "skip" in options else said["check"] == "phase gate not selected (--only use)"


def test_a_full_run_launches_every_step(setup, tmp_path):
    path, launcher = setup
    said, results = dry_then_run(launcher, request(path, out=tmp_path / "run"))
    assert said == {} and results["steps"]["sw"]["choice"]["params"] == {"env.FOO_S": "a"}


def test_a_resume_of_a_run_whose_sweep_has_no_winner_says_the_step_using_it_is_skipped(setup, tmp_path):
    """The sweep was skipped (--skip tune), and `after` with it. --resume --rerun after keeps the skipped sweep, so
    the run skips `after` again ("... which has none (skipped)"); the dry run showed it launching."""
    path, launcher = setup
    run_dir = tmp_path / "run"
    run_runbook(request(path, out=run_dir, skip=("tune",)))
    said, _ = dry_then_run(launcher, request(path, resume=run_dir, rerun=("after",)))
    assert said["after"] == "needs the winner of sw, which has none (skipped)"
    assert said["sw"].startswith(f"its result in {run_dir} is kept")


def test_a_resume_of_a_run_whose_sweep_failed_launches_the_step_with_the_kept_default(setup, tmp_path):
    """A sweep whose every launch failed keeps its default point (its choice): --resume --rerun after launches
    `after` with it, as the dry run says."""
    path, launcher = setup
    run_dir = tmp_path / "run"
    launcher.fail = {"sw"}
    run_runbook(request(path, out=run_dir))
    sweep = read_results(run_dir)["steps"]["sw"]
    assert sweep["status"] == "failed" and sweep["choice"]["kept_default"]
    launcher.fail = set()
    said, _ = dry_then_run(launcher, request(path, resume=run_dir, rerun=("after",)))
    assert "after" not in said


def test_a_resume_after_a_stopping_step_failed_says_the_steps_after_it_do_not_run(setup, tmp_path):
    """`check` (on_failure: stop) failed, so `last` was not run. --resume --rerun last: the run skips it again ("not
    run: step check failed and on_failure is stop"); the dry run showed it launching."""
    path, launcher = setup
    run_dir = tmp_path / "run"
    launcher.fail = {"check"}
    run_runbook(request(path, out=run_dir))
    assert read_results(run_dir)["steps"]["last"]["reason"] == "not run: step check failed and on_failure is stop"
    launcher.fail = set()
    said, _ = dry_then_run(launcher, request(path, resume=run_dir, rerun=("last",)))
    assert said["last"] == "not run: step check failed and on_failure is stop"


def test_a_reused_sweep_phase_is_taken_even_outside_only_and_its_winner_is_used(setup, tmp_path):
    """--reuse tune=EARLIER --only use: the run takes the sweep from the earlier run (its winner with it) and
    launches `after`; the dry run said the sweep was left out by --only."""
    path, launcher = setup
    earlier = tmp_path / "earlier"
    run_runbook(request(path, out=earlier, only=("tune",)))
    said, results = dry_then_run(launcher, request(path, out=tmp_path / "run", only=("use",),
                                                   reuse=(f"tune={earlier}",)))
    assert said["sw"] == f"taken from {earlier / 'results.json'} (--reuse)" and "after" not in said
    assert results["steps"]["after"]["status"] == "passed"


def test_a_rerun_of_a_step_whose_sweep_was_reused_launches_it(setup, tmp_path):
    """A run that took the sweep from an earlier one (--reuse), resumed with --rerun after: the kept, reused sweep
    has its winner, so `after` is launched again, as the dry run says; and a resume with --only of another phase
    says the sweep's result is kept (it is not skipped: its record stays as it was)."""
    path, launcher = setup
    earlier, run_dir = tmp_path / "earlier", tmp_path / "run"
    run_runbook(request(path, out=earlier, only=("tune",)))
    run_runbook(request(path, out=run_dir, reuse=(f"tune={earlier}",)))
    said, _ = dry_then_run(launcher, request(path, resume=run_dir, rerun=("after",)))
    assert "after" not in said
    said, _ = dry_then_run(launcher, request(path, resume=run_dir, rerun=("last",), only=("tail",)))
    assert said["sw"].startswith(f"its result in {run_dir} is kept") and "last" not in said


def test_a_resume_refuses_to_take_a_phase_whose_steps_it_keeps(setup, tmp_path):
    """A run that measured the sweep itself, resumed with --reuse tune=EARLIER: the resume keeps the sweep's own
    result, so results.json would record the phase as taken from EARLIER ("nothing of it ran here") beside the
    sweep's own measurement. It is refused, naming the step, and nothing is written."""
    from validation.run import RunError

    path, launcher = setup
    earlier, run_dir = tmp_path / "earlier", tmp_path / "run"
    run_runbook(request(path, out=earlier, only=("tune",)))
    run_runbook(request(path, out=run_dir, skip=("tail",)))
    saved = (run_dir / "results.json").read_bytes()
    with pytest.raises(RunError, match=f"--reuse tune and --resume {run_dir}: step sw of phase tune has its own "
                                       r"result there \(passed\), which a resume keeps"):
        run_runbook(request(path, resume=run_dir, rerun=("last",), reuse=(f"tune={earlier}",)))
    assert (run_dir / "results.json").read_bytes() == saved


def test_a_resume_given_the_reuse_its_run_started_with_goes_on(setup, tmp_path):
    """A run that took the sweep from EARLIER, resumed with the same --reuse (what the command that continues an
    interrupted run gives): the sweep's record is the one taken, kept; `last` runs."""
    path, launcher = setup
    earlier, other = tmp_path / "earlier", tmp_path / "other"
    run_runbook(request(path, out=earlier, only=("tune",)))
    run_runbook(request(path, out=other, skip=("tail",), reuse=(f"tune={earlier}",)))
    said, results = dry_then_run(launcher, request(path, resume=other, rerun=("last",), reuse=(f"tune={earlier}",)))
    assert said["sw"].startswith(f"its result in {other} is kept") and "last" not in said
    assert results["steps"]["sw"]["reused"]["from"] == str(earlier / "results.json")
    assert [r["phase"] for r in results["reused"]] == ["tune"]


def test_the_dry_run_of_cpu_smoke_with_only_the_audit_says_it_is_skipped(monkeypatch, tmp_path):
    """`nsa-validate run --dry-run --only sdpa_audit runbooks/cpu_smoke.yaml`: the audit uses bucket_sweep's winner,
    which --only leaves out, so the run skips it; the dry run said it would launch."""
    from typer.testing import CliRunner

    from validation.cli import app

    monkeypatch.chdir(REPO)
    result = CliRunner().invoke(app, ["run", "runbooks/cpu_smoke.yaml", "--only", "sdpa_audit", "--out",
                                      str(tmp_path / "run"), "--dry-run"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert ("sdpa_audit / sdpa_audit (train)  SKIPPED here: needs the winner of bucket_sweep, which has none "
            "(skipped)") in result.output
    assert not (tmp_path / "run").exists()
