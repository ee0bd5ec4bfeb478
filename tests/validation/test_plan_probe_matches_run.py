"""`nsa-validate plan` (and `run --dry-run`) shows what `nsa-validate run` launches: for every launch the runner hands
to the launcher, the plan has one with the same directory, command line (the launcher's own argv: the port and run
directory filled in), environment, limits, ranks and nodes; a value the plan cannot know before the run (a sweep's
winner) is shown as its reference and named, never invented. The runs go through the real runner and launcher
(validation.launch.attempt.launch); only the process start (launch.local.Run) is a stand-in that writes what a
trainer leaves behind."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validation.cli import app
from validation.launch import attempt, environment
from validation.run import RunRequest, not_run, prepare, run_runbook
from validation.runbook.loader import load_runbook
from validation.runbook.plan import describe, planned, text_lines

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decision_support import FAKE_ENV, FakeTrainer  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PORT = 45678  # the free port the launcher picks in these runs

RUNBOOK = """\
name: plan_vs_run
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  env: {NSA_TB_DISABLE: "1", FOO_SPACE: "a b; c", FOO_QUOTE: "it's \\"q\\"", FOO_DOLLAR: "$HOME `x`",
        FOO_LINES: "l1\\nl2"}
  args: {dataset: synthetic, ddp: 0, steps: 12}
  nproc_per_node: 1
  timeout_s: 300
  stall_timeout_s: 60
  window: 10
  warmup_steps: 2
phases:
  - name: a
    steps:
      - {name: one, kind: train}
      - {name: two, kind: train, nproc_per_node: 2, args: {ddp: 1}, master_port: 29517, timeout_s: 120}
  - name: b
    steps:
      - name: sw
        kind: sweep
        matrix: {env.FOO_S: ["a b", "it's"]}
        repeats: 2
      - {name: after, kind: train, env: {FOO_S: "${sw.winner.env.FOO_S}"}}
"""
SETS = ("defaults.env.FOO_YES=yes", "defaults.env.FOO_OCT=010", "steps.one.env.FOO_OFF=off")


class StandInRun:
    """launch.local.Run that starts nothing: records the launch (its spec as handed over, the argv the launcher
    built) and writes a trainer's files (FakeTrainer)."""

    started: list = []
    trainer = FakeTrainer(lambda spec: 3000.0 if spec.params.get("env.FOO_S") == "a b" else 1000.0, cv=0.01)

    def __init__(self, spec, argv, log_path, started, deadline):
        self.spec, self.argv, self.log_path, self.started = spec, list(argv), log_path, started
        self.status, self.returncode, self.how_ended, self.last_step, self.error = "ok", 0, "", None, ""
        self.stack_dumps, self.pid, self.launch_id = [], None, "stand-in"

    def execute(self) -> None:
        StandInRun.started.append((self.spec, self.argv))
        if self.spec.trainer_out_dir is not None:
            self.trainer(self.spec)


def _stand_ins(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(attempt, "Run", StandInRun)
    mp.setattr(attempt, "free_port", lambda: PORT)
    mp.setattr(environment, "probe", lambda cwd=None: dict(FAKE_ENV))
    mp.setattr(StandInRun, "started", [])
    mp.delenv("OMP_NUM_THREADS", raising=False)  # the runner sets it for a trainer launch here


@pytest.fixture
def runs(monkeypatch, tmp_path):
    _stand_ins(monkeypatch)
    path = tmp_path / "plan_vs_run.yaml"
    path.write_text(RUNBOOK)
    return path


def _request(path, **kw) -> RunRequest:
    return RunRequest(runbook=path, overrides=SETS, cwd=REPO, no_report=True, **kw)


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    """One run of RUNBOOK with SETS: (its planned launches as `run --dry-run` shows them, by (step, dir); what the
    launcher was handed and ran, by (step, dir); the run directory; results.json)."""
    root = tmp_path_factory.mktemp("plan_vs_run")
    with pytest.MonkeyPatch.context() as mp:
        _stand_ins(mp)
        path = root / "plan_vs_run.yaml"
        path.write_text(RUNBOOK)
        run_dir = root / "run"
        request = _request(path, out=run_dir)
        shown = _shown(prepare(request))
        results = run_runbook(request).results
        return shown, _ran(StandInRun.started), run_dir, results


def _shown(prepared) -> dict:
    """The launches `run --dry-run` shows as running, by (step, dir)."""
    rows = describe(prepared.runbook, not_run(prepared))
    return {(r["step"], launch["dir"]): launch for r in rows if not r["skip"] for launch in r["launches"]}


def _ran(started) -> dict:
    return {(spec.step, spec.dir): (spec, argv) for spec, argv in started}


def _same_commands(shown, ran, run_dir) -> None:
    assert sorted(ran) == sorted(shown)
    for key, (spec, argv) in ran.items():
        command = [a.replace("<free>", str(PORT)).replace("RUN_DIR", str(run_dir)) for a in shown[key]["commands"][0]]
        assert command == argv, key


def _same_env(shown, ran, results) -> None:
    for key, (spec, argv) in ran.items():
        plan = shown[key]
        assert set(plan["env"]) == set(spec.env), key
        for name, value in spec.env.items():  # a winner's value: its reference in the plan, which names the step
            if "${" in plan["env"][name]:
                assert plan["env"][name] == "${sw.winner.env.FOO_S}" and plan["waits_for"] == ["sw"]
                assert value == results["steps"]["sw"]["choice"]["params"]["env.FOO_S"]
            else:
                assert plan["env"][name] == value, (key, name)


def _same_limits(shown, ran) -> None:
    for key, (spec, argv) in ran.items():
        plan = shown[key]
        assert (plan["timeout_s"], plan["stall_timeout_s"], plan["nproc_per_node"], plan["nnodes"]) == (
            spec.timeout_s, spec.stall_timeout_s, spec.nproc_per_node, spec.nnodes), key


def test_the_plan_shows_the_commands_the_launcher_runs(first_run):
    """The launcher's own argv of every launch (a sweep's repeats, a step using the sweep's winner), the port and
    the run directory filled in; a runbook's master_port is the port the first attempt uses (the plan showed
    <free>)."""
    shown, ran, run_dir, _ = first_run
    assert len(ran) == 2 + 4 + 1
    _same_commands(shown, ran, run_dir)
    _same_limits(shown, ran)
    assert "--master-port=29517" in ran[("two", "two")][1]


def test_the_plan_shows_the_environment_the_launch_starts_with(first_run):
    """Every variable the runner hands the launcher, as written ("010", "yes", off; spaces, quotes, $ and newlines),
    and the OMP_NUM_THREADS it gives a trainer launch on this machine (the plan did not show it); a winner's value
    as its reference, the step named."""
    shown, ran, _, results = first_run
    _same_env(shown, ran, results)
    one = ran[("one", "one")][0].env
    assert (one["FOO_OCT"], one["FOO_YES"], one["FOO_OFF"]) == ("010", "yes", "off")
    assert "OMP_NUM_THREADS" in one and "OMP_NUM_THREADS" in ran[("two", "two")][0].env


def test_the_dry_run_of_a_resume_shows_the_launches_it_makes(runs, tmp_path):
    """--resume with --rerun and --only: the steps the dry run shows as running are those launched, alike."""
    run_dir = tmp_path / "run"
    run_runbook(_request(runs, out=run_dir, only=("b",)))
    StandInRun.started.clear()
    request = _request(runs, resume=run_dir, rerun=("sw",), only=("b",))
    shown = _shown(prepare(request))
    results = run_runbook(request).results
    ran = _ran(StandInRun.started)
    assert sorted({step for step, _ in ran}) == ["sw"] and len(ran) == 4
    _same_commands(shown, ran, run_dir)
    _same_env(shown, ran, results)
    _same_limits(shown, ran)


def test_each_plan_line_splits_into_its_label_env_and_argv(runs):
    """Every command line `plan` prints, read by a shell (shlex.split), is `[label]` (one word), NAME=value for each
    variable and the argv: a sweep label holding a quote made the line unreadable (No closing quotation), one with
    a space split into two words."""
    rb = load_runbook(runs, list(SETS))
    steps = planned(rb)
    expected = []
    for step in steps:
        for launch in step.launches:
            label = [f"[{launch.label}]"] if launch.label else []
            env = [f"{k}={v}" for k, v in launch.env.items()]
            expected += [label + env + [str(a) for a in argv] for argv in launch.commands]
    lines = [line for line, _ in text_lines(rb, steps) if "nsa.training" in line]
    assert len(lines) == len(expected) == 2 + 4 + 1
    assert [shlex.split(line) for line in lines] == expected
    assert any(words[0] == "[FOO_S=it's]" for words in expected)


def test_plan_json_printed_by_the_cli_decodes_to_the_plan(runs):
    rb = load_runbook(runs, list(SETS))
    args = ["plan", str(runs), "--json"] + [w for s in SETS for w in ("--set", s)]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == json.loads(json.dumps(describe(rb)))


def test_the_plan_says_a_disturbed_repeat_is_run_again(runs, monkeypatch, tmp_path):
    """A sweep (ab, triage) runs a repeat again when other work used the machine while it measured: launches no
    plan can list beforehand, in <dir>_retry1. The plan says so under the step (it said nothing), and does not
    for a step that never runs a repeat again."""
    disturbed = "sw/FOO_S_a_b_r1"
    monkeypatch.setattr(StandInRun, "trainer", FakeTrainer(
        lambda spec: 3000.0 if spec.params.get("env.FOO_S") == "a b" else 1000.0, cv=0.01,
        busy=lambda spec: spec.dir == disturbed))
    run_dir = tmp_path / "run"
    request = _request(runs, out=run_dir, only=("b",))
    shown = _shown(prepare(request))
    run_runbook(request)
    ran = _ran(StandInRun.started)
    repeat = {d for step, d in shown if step == "sw" and d.endswith("_r1")}
    assert disturbed in repeat and {d for _, d in set(ran) - set(shown)} == {d + "_retry1" for d in repeat}

    def said(sets) -> dict:
        rb = load_runbook(runs, list(SETS) + sets)
        lines, step = {}, None
        for line, _ in text_lines(rb, planned(rb)):
            step = line.split(" / ")[1].split(" (")[0] if " / " in line and not line.startswith(" ") else step
            if "run again" in line:
                lines[step] = line
        return lines

    lines = said([])
    assert set(lines) == {"sw"} and "up to 1 time(s)" in lines["sw"] and "<dir>_retry<attempt>" in lines["sw"]
    assert "up to 2 time(s)" in said(["steps.sw.retry_disturbed=2"])["sw"]
    assert said(["steps.sw.retry_disturbed=0"]) == {}
