"""A --resume keeps the steps that ended, but a step that takes a setting from another step's choice
(${STEP.winner.env.X}) was measured with the value that choice had then: when --rerun STEP chooses otherwise, the
step is run again with the new value (its results would otherwise stand for a setting the run no longer holds),
and so is a step that was skipped for want of a choice the run now has. A kept step still measured under other
settings than the run now gives it is named in the verdict's reason with the command that measures it again.

The launches are synthetic (decision_support.FakeTrainer: no process starts) with a known truth: which bucket size
is 30% faster than the others, so which point the sweep must choose."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decision_support import FAKE_ENV, FakeTrainer  # noqa: E402

from validation.execution import runner  # noqa: E402
from validation.execution.runner import RunOptions, Runner, judge_resume, no_winner_reason  # noqa: E402
from validation.launch import environment  # noqa: E402
from validation.results.run import Step as StepRecord  # noqa: E402
from validation.results.store import read_results, resume_note, write_results  # noqa: E402
from validation.run import RunRequest, not_run, prepare  # noqa: E402
from validation.runbook.loader import load_runbook  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

RUNBOOK = f"""\
name: superseded
requirements: {{gpus: 0, backend: gloo}}
defaults:
  config: {REPO / "configs" / "tiny_cpu.yaml"}
  args: {{steps: 30}}
  window: 25
  warmup_steps: 5
phases:
  - name: sweep
    steps:
      - name: sw
        kind: sweep
        matrix: {{env.NSA_DDP_BUCKET_MB: [25, 50, 100]}}
        repeats: 2
        prefer: {{env.NSA_DDP_BUCKET_MB: 50}}
  - name: later
    steps:
      - {{name: after, kind: train, env: {{NSA_DDP_BUCKET_MB: "${{sw.winner.env.NSA_DDP_BUCKET_MB}}",
                                          OTHER_MB: "${{sw.winner.env.NSA_DDP_BUCKET_MB}}"}}}}
acceptance:
  - {{name: decided, expr: "sw.decided", target: "a decision"}}
"""


class Fast:
    """The launcher: the bucket size `fast` is 30% faster than the others (changed between attempts)."""

    def __init__(self, fast: str):
        self.fast = fast
        self.trainer = FakeTrainer(lambda spec: 13_000.0 if spec.env.get("NSA_DDP_BUCKET_MB") == self.fast
                                   else 10_000.0, cv=0.01, run_cv=0.002)

    def __call__(self, spec):
        return self.trainer(spec)

    def launched(self, step: str) -> list:
        return [s for s in self.trainer.launched if s.step == step]


@pytest.fixture
def setup(monkeypatch, tmp_path):
    fast = Fast("100")
    monkeypatch.setattr(runner, "launch", fast)
    monkeypatch.setattr(environment, "probe", lambda cwd=None: dict(FAKE_ENV))
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    return load_runbook(path), tmp_path / "run", fast


def _resume(rb, run_dir, *rerun, overrides=(), only=()):
    previous = read_results(run_dir)
    rb = load_runbook(rb.path, list(overrides)) if overrides else rb
    options = RunOptions(cwd=run_dir.parent, rerun=tuple(rerun), overrides=tuple(overrides), only=tuple(only),
                         resume=judge_resume(rb, previous, tuple(rerun)))
    return Runner(rb, run_dir, options, previous=previous).run()


def test_a_rerun_sweep_that_chooses_otherwise_runs_the_step_using_its_choice_again(setup):
    rb, run_dir, fast = setup
    first = Runner(rb, run_dir, RunOptions(cwd=run_dir.parent)).run()
    assert first["steps"]["sw"]["choice"]["params"] == {"env.NSA_DDP_BUCKET_MB": "100"}
    assert first["steps"]["after"]["env"]["NSA_DDP_BUCKET_MB"] == "100"

    fast.fast = "25"  # the machine changed: 25 MB is now the fast one, and --rerun sw finds it
    fast.trainer.launched.clear()
    after = _resume(rb, run_dir, "sw")
    assert after["steps"]["sw"]["choice"]["params"] == {"env.NSA_DDP_BUCKET_MB": "25"}
    # the later step measured again, with the value the run now recommends, not kept with 100
    (launch,) = fast.launched("after")
    assert launch.env["NSA_DDP_BUCKET_MB"] == "25" and launch.env["OTHER_MB"] == "25"
    step = after["steps"]["after"]
    assert step["status"] == "passed" and step["env"]["NSA_DDP_BUCKET_MB"] == "25"
    assert after["recommendations"]["env"]["NSA_DDP_BUCKET_MB"] == "25"
    assert any("env.NSA_DDP_BUCKET_MB: 100 when it ran, 25 now (the choice of sw)" in n for n in step["notes"])
    entry = after["resumes"][-1]
    assert entry["rerun"] == ["sw", "after"] and entry["replaced"]["after"]["status"] == "passed"
    assert "after run again (it had passed)" in resume_note(after)
    assert "kept_changed" not in entry and after["verdict"] == "GO"
    assert "other settings" not in after["verdict_reason"]


def test_a_rerun_sweep_that_chooses_the_same_point_keeps_the_later_step(setup):
    rb, run_dir, fast = setup
    first = Runner(rb, run_dir, RunOptions(cwd=run_dir.parent)).run()
    fast.trainer.launched.clear()
    after = _resume(rb, run_dir, "sw")
    assert after["steps"]["sw"]["choice"]["params"] == {"env.NSA_DDP_BUCKET_MB": "100"}
    assert fast.launched("after") == [] and after["steps"]["after"] == first["steps"]["after"]
    assert after["resumes"][-1]["rerun"] == ["sw"]


def test_a_step_skipped_for_want_of_a_choice_runs_once_the_rerun_step_has_one(setup):
    """The sweep ended without a choice (its record edited to that: the sweeps here always keep a point), so
    `after` was skipped "needs the winner of sw"; --rerun sw chooses 100: `after` runs with it."""
    rb, run_dir, fast = setup
    Runner(rb, run_dir, RunOptions(cwd=run_dir.parent)).run()
    results = read_results(run_dir)
    results["steps"]["sw"].update(status="failed", reason="every launch failed", choice=None, winner=None)
    results["steps"]["after"].update(status="skipped", reason=no_winner_reason("sw", "failed"), env={},
                                     command=None, metrics={})
    write_results(run_dir, results)
    fast.trainer.launched.clear()
    after = _resume(rb, run_dir, "sw")
    (launch,) = fast.launched("after")
    assert launch.env["NSA_DDP_BUCKET_MB"] == "100"
    assert after["steps"]["after"]["status"] == "passed" and after["verdict"] == "GO"


def test_superseded_settings_reads_the_recorded_env_the_command_and_the_choices_before(setup, tmp_path):
    rb, run_dir, _ = setup
    text = RUNBOOK.replace("{name: after, kind: train, env:", "{name: after, kind: train, "
                           "args: {steps: \"${sw.winner.env.NSA_DDP_BUCKET_MB}\"}, env:")
    path = tmp_path / "args.yaml"
    path.write_text(text)
    step = load_runbook(path).step("after")
    superseded_settings = runner.superseded_settings
    ran = StepRecord(status="passed", env={"NSA_DDP_BUCKET_MB": "100"},
                     command=["python", "-m", "nsa.training", "--config", "c.yaml", "--steps", "100",
                              "--out-dir", "x"])
    now = {"sw": {"env.NSA_DDP_BUCKET_MB": "25"}}
    assert superseded_settings(step, ran, now, tmp_path) == [
        "env.NSA_DDP_BUCKET_MB: 100 when it ran, 25 now (the choice of sw)",
        "argv --steps: 100 when it ran, 25 now (the choice of sw)"]
    # OTHER_MB is not recorded (not a prefixed variable): judged by the choice the run held before
    assert superseded_settings(step, ran, now, tmp_path, {"sw": {"env.NSA_DDP_BUCKET_MB": "100"}})[1] == \
        "env.OTHER_MB: 100 when it ran, 25 now (the choice of sw)"
    same = {"sw": {"env.NSA_DDP_BUCKET_MB": "100"}}
    assert superseded_settings(step, ran, same, tmp_path, same) == []
    assert superseded_settings(step, ran, {}, tmp_path) == ["the choice of sw it used: none now"]


def test_a_kept_step_of_another_definition_is_named_in_the_verdict_with_the_command(setup):
    """--resume --set steps.after.args.steps=31 --rerun sw (the same choice again): `after` is kept as measured
    with 30 steps; the verdict's reason says so and gives the command that measures it again with this --set."""
    rb, run_dir, fast = setup
    Runner(rb, run_dir, RunOptions(cwd=run_dir.parent)).run()
    fast.trainer.launched.clear()
    after = _resume(rb, run_dir, "sw", overrides=("steps.after.args.steps=31",))
    assert fast.launched("after") == []
    assert list(after["resumes"][-1]["kept_changed"]) == ["after"]
    reason = after["verdict_reason"]
    assert after["verdict"] == "GO" and "kept from an earlier attempt as measured under other settings" in reason
    assert "after (launches[0].argv[6]: \"31\" here, \"30\" there)" in reason
    assert reason.endswith(f"--resume {run_dir} --rerun after --set steps.after.args.steps=31")


def test_the_dry_run_says_a_kept_step_runs_again_if_the_choice_it_uses_changes(setup):
    rb, run_dir, _ = setup
    Runner(rb, run_dir, RunOptions(cwd=run_dir.parent)).run()
    said = not_run(prepare(RunRequest(runbook=Path(rb.path), resume=run_dir, rerun=("sw",), cwd=REPO)))
    assert said["after"].endswith("it runs again if the choice of sw, which this run decides again, gives it other "
                                  "settings than it ran with")
    said = not_run(prepare(RunRequest(runbook=Path(rb.path), resume=run_dir, rerun=("after",), cwd=REPO)))
    assert "sw" in said and "after" not in said


def test_a_resume_of_a_finished_run_refused_names_the_steps_whose_settings_changed(setup):
    """Nothing to resume (every step has its result), but `after` would run with other settings now: the refusal
    names it and the --rerun that measures it again, instead of only saying every step has its result."""
    rb, run_dir, _ = setup
    Runner(rb, run_dir, RunOptions(cwd=run_dir.parent)).run()
    with pytest.raises(runner.ResumeError) as caught:
        runner.check_resume(load_runbook(rb.path, ["steps.after.args.steps=31"]), read_results(run_dir), run_dir)
    assert "nothing to resume" in str(caught.value)
    assert 'after (launches[0].argv[6]: "31" here, "30" there) (--rerun after measures them again)' in str(caught.value)


def test_a_step_using_a_changed_choice_that_cannot_run_again_keeps_its_result_and_is_named(setup):
    """--rerun sw --only sweep: sw chooses 25 now, but `after` (phase later) is left out: it keeps what it measured
    with 100, and the resume's kept_changed and the verdict's reason name it with the command that runs it again."""
    rb, run_dir, fast = setup
    first = Runner(rb, run_dir, RunOptions(cwd=run_dir.parent)).run()
    fast.fast = "25"
    fast.trainer.launched.clear()
    after = _resume(rb, run_dir, "sw", only=("sweep",))
    assert after["steps"]["sw"]["choice"]["params"] == {"env.NSA_DDP_BUCKET_MB": "25"}
    assert fast.launched("after") == [] and after["steps"]["after"] == first["steps"]["after"]
    entry = after["resumes"][-1]
    assert entry["kept_changed"] == {"after": "env.NSA_DDP_BUCKET_MB: 100 when it ran, 25 now (the choice of sw) "
                                              "(and 1 more)"}
    assert entry["not_rerun"]["after"] == "phase later not selected (--only sweep)"
    assert "after (env.NSA_DDP_BUCKET_MB: 100 when it ran, 25 now" in after["verdict_reason"]
    assert after["verdict_reason"].endswith(f"--resume {run_dir} --rerun after")
