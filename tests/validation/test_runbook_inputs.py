"""What a runbook and its --set overrides may say, checked before anything runs: trainer args against the trainer's
own parser, --set paths and values (errors name the --set), the precedence of --set / step / defaults and the
plan's notes about it, the files a runbook names (exit 2 with file, line and key), and which steps the runbook's
device requirements apply to. Library calls plus a few `nsa-validate plan` / `run` processes; no trainer runs."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nsa.training.flags import build_parser, check_flag, flag_specs
from validation.launch import environment
from validation.runbook.loader import RunbookError, load_runbook

REPO = Path(__file__).resolve().parents[2]

RUNBOOK = """\
name: t
requirements: {gpus: 2, backend: nccl}
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 5, ddp: 1}
  timeout_s: 100
phases:
  - name: pre
    steps:
      - {name: snap, kind: snapshot}
      - {name: tests, kind: pytest, tests: [tests/nsa/test_config.py]}
      - {name: gpu_tests, kind: pytest, tests: ["tests/nsa/attention/test_cuda.py::test_x"], requires: {gpus: 1}}
  - name: main
    steps:
      - {name: own, kind: train, args: {steps: 60}, timeout_s: 50}
      - {name: plain, kind: train}
      - {name: perf, kind: bench, command: [benchmarks/bench_selection.py, --repeats, "1"]}
acceptance:
  - {name: c, expr: "own.toks_per_s.mean >= 1"}
"""


def write(tmp_path, text: str = RUNBOOK) -> Path:
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    return path


def error_of(path: Path, overrides=(), cwd=None) -> str:
    with pytest.raises(RunbookError) as info:
        load_runbook(path, list(overrides), cwd=cwd)
    return str(info.value)


# ---------------------------------------------------------------------------------------------- trainer args
def test_the_flag_table_is_the_trainers_own_parser():
    specs = flag_specs()
    parser = build_parser()
    assert set(specs) == {a.option_strings[0][2:] for a in parser._actions if a.option_strings[0] != "-h"}
    assert specs["steps"].type is int and specs["fsdp"].switch and specs["ddp"].choices == (0, 1)
    for key, value in [("steps", 30), ("steps", "30"), ("save_every", 5), ("pg-timeout", 1.5), ("fsdp", True),
                       ("dataset", "synthetic"), ("steps", "${sw.winner.args.steps}")]:
        assert check_flag(key, value) is None, (key, value)
    # every value check_flag accepts, the trainer's parser accepts too (and what it refuses, the parser refuses)
    for key, value in [("steps", 30), ("lr", "1e-3"), ("ddp", 0), ("seq_len", "64")]:
        flag = "--" + key.replace("_", "-")
        parser.parse_args([flag, str(value)])
    for key, value, needle in [("steps", "abc", "takes an integer"), ("steps", 2.5, "takes an integer"),
                               ("steps", True, "takes an integer"), ("ddp", 2, "one of 0, 1"),
                               ("fsdp", 1, "is a switch"), ("stepz", 3, "no flag --stepz"),
                               ("dataset", "web", "one of synthetic")]:
        problem = check_flag(key, value)
        assert problem and needle in problem, (key, value, problem)
        if key in specs and not specs[key].switch:
            with pytest.raises(SystemExit):
                parser.parse_args([f"--{key}", str(value)])


# ---------------------------------------------------------------------------------------------- --set
@pytest.mark.parametrize("item, needle", [
    ("defaults.args.steps=abc", "--set defaults.args.steps=abc (RB): defaults.args.steps: the trainer's --steps "
                                "takes an integer, got 'abc'"),
    ("defaults.args.stepz=3", "--set defaults.args.stepz=3 (RB): defaults.args.stepz: the trainer has no flag "
                              "--stepz"),
    ("defaults.argz.steps=3", "--set defaults.argz.steps=3 (RB): defaults.argz: unknown key"),
    ("defaults.timeout_s=soon", "--set defaults.timeout_s=soon (RB): defaults.timeout_s: must be a number"),
    ("steps.own.args.ddp=2", "--set steps.own.args.ddp=2 (RB): phases[1].steps[0].args.ddp: the trainer's --ddp "
                             "takes one of 0, 1"),
    ("steps.own.nproc_per_node=two", "--set steps.own.nproc_per_node=two (RB): phases[1].steps[0].nproc_per_node: "
                                     "must be an integer"),
    ("steps.own.bogus=1", "--set steps.own.bogus=1 (RB): phases[1].steps[0].bogus: unknown key"),
    ("steps.nosuch.args.steps=3", "--set steps.nosuch.args.steps: no step named nosuch"),
    ("phases.nosuch.steps.own.args.steps=3", "no item named 'nosuch'"),
    ("defaults.args.fsdp=1", "the trainer's --fsdp is a switch"),
    # a misspelt path names the closest one
    ("defaults.timout_s=3", "--set defaults.timout_s=3 (RB): defaults.timout_s: unknown key (did you mean "
                            "timeout_s? expected one of: config, env, args,"),
    ("steps.onw.args.steps=3", "--set steps.onw.args.steps: no step named onw (did you mean own? steps: "),
    ("phases.mian.steps.own.args.steps=3", "no item named 'mian' under phases (did you mean main? items: "),
    # a name or kind set from the command line: refused naming the --set, not blamed on the file's lines
    ("steps.own.name=other", "--set steps.own.name: a step's name cannot be set from the command line (every "
                             "reference to it"),
    ("steps.own.kind=sweep", "--set steps.own.kind: a step's kind cannot be set from the command line (its other "
                             "keys are those of its kind)"),
    ("phases.main.name=other", "--set phases.main.name: a phase's name cannot be set"),
])
def test_a_bad_set_is_an_error_naming_the_set(tmp_path, item, needle):
    message = error_of(write(tmp_path), [item])
    assert needle.replace("RB", str(tmp_path / "rb.yaml")) in message, message
    assert not re.search(r"rb\.yaml:\d", message), message  # no line of the file: the file is not at fault


def test_precedence_is_set_of_the_step_then_the_step_then_set_defaults_then_defaults(tmp_path):
    path = write(tmp_path)
    rb = load_runbook(path)
    assert rb.step("own").launch.args["steps"] == 60 and rb.step("plain").launch.args["steps"] == 5
    rb = load_runbook(path, ["defaults.args.steps=30", "defaults.timeout_s=70"])
    assert rb.step("own").launch.args["steps"] == 60 and rb.step("plain").launch.args["steps"] == 30
    assert rb.step("own").launch.timeout_s == 50 and rb.step("plain").launch.timeout_s == 70
    assert rb.step_notes("own") == [
        "its own args.steps = 60 overrides --set defaults.args.steps=30 (a step's own value wins over defaults; "
        "change it with --set steps.own.args.steps=...)",
        "its own timeout_s = 50 overrides --set defaults.timeout_s=70 (a step's own value wins over defaults; "
        "change it with --set steps.own.timeout_s=...)"]
    assert rb.step_notes("plain") == []
    # the bench step takes no args: a --set default of args is nothing to it, and no note
    assert rb.step_notes("perf") == []
    assert rb.notes == [
        "--set defaults.args.steps=30 does not change step(s) own (args.steps = 60): a step's own value wins over "
        "defaults (change one with --set steps.STEP.args.steps=...)",
        "--set defaults.timeout_s=70 does not change step(s) own (timeout_s = 50): a step's own value wins over "
        "defaults (change one with --set steps.STEP.timeout_s=...)"]
    # a --set of the step's own key wins over its own value (both spellings), and the note goes
    for item in ("steps.own.args.steps=7", "phases.main.steps.own.args.steps=7"):
        rb = load_runbook(path, ["defaults.args.steps=30", item])
        assert rb.step("own").launch.args["steps"] == 7 and rb.step("plain").launch.args["steps"] == 30
        assert rb.step_notes("own") == []


def test_plan_says_when_a_steps_own_value_overrides_a_set_default(cli, tmp_path):
    path = write(tmp_path)
    proc = cli("plan", path, "--set", "defaults.args.steps=30", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = {r["step"]: r for r in json.loads(proc.stdout)}
    assert rows["own"]["notes"] and "overrides --set defaults.args.steps=30" in rows["own"]["notes"][0]
    assert rows["plain"]["notes"] == [] and "--steps 30" in " ".join(rows["plain"]["launches"][0]["argv"])
    text = cli("plan", path, "--set", "defaults.args.steps=30").stdout
    assert "  note: its own args.steps = 60 overrides --set defaults.args.steps=30" in text
    bad = cli("plan", path, "--set", "defaults.args.steps=abc")
    assert bad.returncode == 2 and f"--set defaults.args.steps=abc ({path}): defaults.args.steps" in bad.stderr
    assert "Traceback" not in bad.stderr


# ---------------------------------------------------------------------------------------------- trainer values
@pytest.mark.parametrize("item, needle", [
    ("defaults.args.steps=-5", "--set defaults.args.steps=-5 (RB): defaults.args.steps: nsa-train would refuse "
                               "this (with configs/tiny_cpu.yaml): section 'train': train.steps must be positive, "
                               "got -5"),
    ("steps.own.args.steps=0", "--set steps.own.args.steps=0 (RB): phases[1].steps[0].args.steps: nsa-train would "
                               "refuse this (with configs/tiny_cpu.yaml): section 'train': train.steps must be "
                               "positive, got 0"),
    ("defaults.args.lr=0", "defaults.args.lr: nsa-train would refuse this (with configs/tiny_cpu.yaml): section "
                           "'train': train.lr must be positive, got 0.0"),
    ("defaults.args.fsdp=true", "--set defaults.args.fsdp=true (RB): defaults.args.fsdp: nsa-train would refuse "
                                "this (with configs/tiny_cpu.yaml): --fsdp and --ddp 1 are exclusive"),
    # the statistics window: warmup_steps must leave a step to measure, naming both values
    ("steps.own.warmup_steps=60", "--set steps.own.warmup_steps=60 (RB): phases[1].steps[0].warmup_steps: "
                                  "warmup_steps 60 leaves no step to measure: the trainer runs 60 steps "
                                  "(phases[1].steps[0].args.steps: 60); warmup_steps must be below 60"),
    ("defaults.warmup_steps=5", "--set defaults.warmup_steps=5 (RB): defaults.warmup_steps: warmup_steps 5 leaves "
                                "no step to measure: the trainer runs 5 steps (defaults.args.steps: 5)"),
])
def test_a_value_the_trainer_would_refuse_is_an_error_naming_the_runbook_key(tmp_path, item, needle):
    """Values of the right type that nsa-train's own config validation refuses (nsa.training.config: TrainConfig),
    or a warm-up that leaves no step to measure, are errors before anything runs, not a launch that fails and a
    NO-GO that blames the node. Checked where the files are (plan, run: cwd), as the trainer resolves its config."""
    path = write(tmp_path)
    message = error_of(path, [item], cwd=REPO)
    assert needle.replace("RB", str(path)) in message, message
    load_runbook(path, [item])  # without a working directory (nsa-validate list): only the schema


def test_a_refused_value_in_a_sweep_point_or_a_variant_names_its_key(tmp_path):
    sweep = RUNBOOK.replace("{name: plain, kind: train}",
                            "{name: plain, kind: sweep, matrix: {args.batch_size: [2, 0]}}")
    message = error_of(write(tmp_path, sweep), cwd=REPO)
    assert "phases[1].steps[1].matrix.args.batch_size: launch batch_size=0: nsa-train would refuse this" in message
    assert "train.batch_size must be positive, got 0" in message
    ab = RUNBOOK.replace("{name: plain, kind: train}",
                         "{name: plain, kind: ab, baseline: {}, variants: {big: {args: {seq_len: -64}}}}")
    message = error_of(write(tmp_path, ab), cwd=REPO)
    assert "phases[1].steps[1].variants.big.args.seq_len: launch big: nsa-train would refuse this" in message
    # a window longer than the steps left after the warm-up is measured short (the report says so), not refused
    assert load_runbook(write(tmp_path), ["steps.own.warmup_steps=50", "steps.own.window=100"], cwd=REPO)


def test_plan_and_run_exit_2_on_a_value_the_trainer_would_refuse(cli, tmp_path):
    path = write(tmp_path)
    for command in (("plan", path), ("run", path, "--out", tmp_path / "run")):
        proc = cli(*command, "--set", "defaults.args.steps=-5")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert f"--set defaults.args.steps=-5 ({path}): defaults.args.steps: nsa-train would refuse" in proc.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- files named
@pytest.mark.parametrize("old, new, key, line", [
    ("config: configs/tiny_cpu.yaml", "config: configs/no_such.yaml", "defaults.config: config file "
     "configs/no_such.yaml not found", 4),
    ("tests: [tests/nsa/test_config.py]", "tests: [tests/nsa/test_nope.py]", "phases[0].steps[1].tests[0]: "
     "tests/nsa/test_nope.py: no such file", 11),
    ("test_cuda.py::test_x", "test_gone.py::test_x",
     "phases[0].steps[2].tests[0]: tests/nsa/attention/test_gone.py: no such", 12),
    ("[benchmarks/bench_selection.py,", "[benchmarks/bench_nope.py,", "phases[1].steps[2].command[0]: "
     "benchmarks/bench_nope.py: no such file", 17),
    ("{name: plain, kind: train}", "{name: plain, kind: train, config: configs/broken.yaml}",
     "phases[1].steps[1].config: config file configs/broken.yaml is invalid", 16),
])
def test_files_the_runbook_names_must_exist_before_anything_runs(tmp_path, old, new, key, line):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "broken.yaml").write_text("model: {d_model: -3}\n")
    for rel in ("configs/tiny_cpu.yaml", "tests/nsa/test_config.py", "tests/nsa/attention/test_cuda.py",
                "benchmarks/bench_selection.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text((REPO / rel).read_text())
    path = write(tmp_path, RUNBOOK.replace(old, new))
    load_runbook(path)  # without a working directory (nsa-validate list): only the schema
    message = error_of(path, cwd=tmp_path)
    assert message.startswith(f"{path}:{line}: {key}"), message
    assert load_runbook(write(tmp_path), cwd=tmp_path).name == "t"  # the unchanged runbook is fine there


def test_a_missing_config_is_exit_2_and_nothing_runs(cli, tmp_path):
    path = write(tmp_path, RUNBOOK.replace("configs/tiny_cpu.yaml", "configs/missing.yaml"))
    proc = cli("run", path, "--out", tmp_path / "run")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"{path}:4: defaults.config: config file configs/missing.yaml not found" in proc.stderr
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------------- requirements
def test_the_runbooks_device_requirements_apply_to_the_steps_that_use_devices(tmp_path):
    rb = load_runbook(write(tmp_path))
    no_gpu = {"gpu_count": 0, "gpus": [], "nccl": None}
    unmet = {s.name: environment.unmet_for(s, no_gpu) for s in rb.steps()}
    assert unmet["snap"] is None and unmet["tests"] is None  # host-only: they run without the GPUs
    assert unmet["gpu_tests"] == "needs 1 GPU(s), found 0"  # its own `requires` applies
    assert unmet["own"] == unmet["plain"] == unmet["perf"] == "needs 2 GPU(s), found 0"


def test_the_gpu_runbook_snapshots_and_tests_a_machine_without_gpus(cli):
    proc = cli("plan", "runbooks/ddp_2xa100.yaml", "--json")
    rows = {r["step"]: r for r in json.loads(proc.stdout)}
    if rows["baseline"]["skip"] is None:
        pytest.skip("this machine has the runbook's GPUs")
    assert rows["snapshot"]["skip"] is None and rows["sanity_tests"]["skip"] is None
    assert rows["baseline"]["skip"].startswith("needs 2 GPU(s)")


# ---------------------------------------------------------------------------------------------- INCOMPLETE
def test_a_criterion_on_a_step_left_out_by_only_is_incomplete_exit_3(cli, tmp_path):
    script = tmp_path / "bench.py"
    script.write_text("import json, sys\njson.dump({'x': 1}, open(sys.argv[sys.argv.index('--json') + 1], 'w'))\n")
    path = write(tmp_path, f"""\
name: inc
phases:
  - name: a
    steps:
      - {{name: quick, kind: bench, command: [{script}]}}
  - name: b
    steps:
      - {{name: train_step, kind: train, config: configs/tiny_cpu.yaml}}
acceptance:
  - {{name: quick works, expr: "quick.x == 1"}}
  - {{name: fast, expr: "train_step.toks_per_s.mean >= 1"}}
""")
    proc = cli("run", path, "--out", tmp_path / "run", "--only", "a", "--no-report")
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert proc.returncode == 3, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert results["verdict"] == "INCOMPLETE"
    assert results["verdict_reason"].startswith("1 required criterion not evaluated: fast; their steps did not run "
                                                "(train_step: phase b not selected (--only a))")
    assert "INCOMPLETE" in proc.stdout
    # and a failing criterion beside it is still NO-GO, exit 1
    proc = cli("run", path, "--out", tmp_path / "run2", "--only", "a", "--no-report", "--set",
               "acceptance=[{name: quick fails, expr: 'quick.x == 2'}, {name: fast, expr: "
               "'train_step.toks_per_s.mean >= 1'}]")
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert json.loads((tmp_path / "run2" / "results.json").read_text())["verdict"] == "NO-GO"


def test_cli_exit_codes_are_documented():
    out = subprocess.run([sys.executable, "-m", "validation.cli", "run", "--help"], cwd=REPO, capture_output=True,
                         text=True, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"}).stdout
    assert "3 INCOMPLETE" in " ".join(out.split()) and "143" in out
