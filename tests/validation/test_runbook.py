"""Runbook schema: the shipped runbooks load; every kind of mistake is one error naming file, line and key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from validation.runbook.plan import describe, step_launches
from validation.kinds.sweep import sweep_points
from validation.kinds.trainer import trainer_args
from validation.runbook.loader import RunbookError, load_runbook, resolve_references

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((REPO / "runbooks").glob("*.yaml"))

MINIMAL = """\
name: t
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 5}
phases:
  - name: p1
    steps:
      - name: s1
        kind: train
        env: {NSA_DDP_BUCKET_MB: "25"}
      - name: sw
        kind: sweep
        matrix: {env.NSA_DDP_BUCKET_MB: [25, 50]}
  - name: p2
    steps:
      - name: after
        kind: train
        env: {NSA_DDP_BUCKET_MB: "${sw.winner.env.NSA_DDP_BUCKET_MB}"}
acceptance:
  - {name: c1, expr: "s1.toks_per_s.mean >= 1"}
"""


def write(tmp_path, text: str) -> Path:
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    return path


def error_of(tmp_path, text: str) -> str:
    with pytest.raises(RunbookError) as info:
        load_runbook(write(tmp_path, text))
    return str(info.value)


@pytest.mark.parametrize("path", RUNBOOKS, ids=[p.stem for p in RUNBOOKS])
def test_shipped_runbooks_load(path):
    rb = load_runbook(path)
    assert rb.name == path.stem and rb.steps() and rb.acceptance
    for step in rb.steps():
        if step.is_training and step.launch.config:
            assert (REPO / step.launch.config).is_file(), step.launch.config
        for test in (step.tests if step.kind == "pytest" else []):  # a pytest step's own key
            if not test.startswith("-"):
                assert (REPO / test.split("::")[0]).exists(), test


def test_seed_runbook_phases_are_all_there():
    rb = load_runbook(REPO / "runbooks" / "ddp_2xa100.yaml")
    kinds = {s.name: s.kind for s in rb.steps()}
    assert kinds["snapshot"] == "snapshot" and kinds["bucket_sweep"] == "sweep" and kinds["longrun"] == "longrun"
    assert kinds["fused_adamw"] == "ab" and kinds["profiling"] == "profile" and kinds["sel_parity"] == "pytest"
    sweep = rb.step("bucket_sweep")
    assert [label for label, _ in sweep_points(sweep)] == [f"NSA_DDP_BUCKET_MB={v}" for v in (25, 50, 100)]
    baseline = rb.step("baseline")
    assert baseline.launch.env["NSA_DDP_COMPRESS"] == "bf16" and baseline.launch.args["steps"] == 300
    assert baseline.launch.nproc_per_node == 2 and rb.requirements.gpus == 2
    assert rb.step("longrun").launch.args["steps"] == 1200
    assert any(c.expr.text == "baseline.toks_per_s.mean >= 39" for c in rb.acceptance)


def test_defaults_merge_and_step_overrides(tmp_path):
    rb = load_runbook(write(tmp_path, MINIMAL))
    s1 = rb.step("s1")
    assert s1.launch.config == "configs/tiny_cpu.yaml" and s1.launch.args == {"steps": 5}
    assert s1.launch.env == {"NSA_DDP_BUCKET_MB": "25"}
    (pl,) = step_launches(s1, winners={}, run_dir=tmp_path)
    assert pl.argv[1:] == ["-m", "nsa.training", "--config", "configs/tiny_cpu.yaml", "--steps", "5", "--out-dir",
                           str(tmp_path / "s1" / "out")]


def test_sweep_points_and_winner_references(tmp_path):
    rb = load_runbook(write(tmp_path, MINIMAL))
    launches = step_launches(rb.step("sw"), winners={}, run_dir=tmp_path)
    assert sorted(pl.env["NSA_DDP_BUCKET_MB"] for pl in launches) == ["25", "50"]  # in a random order
    assert len({pl.dir for pl in launches}) == 2
    planned = step_launches(rb.step("after"))  # plan mode: the reference stays visible
    assert planned[0].unresolved == ["sw"] and "${sw.winner" in planned[0].env["NSA_DDP_BUCKET_MB"]
    resolved = step_launches(rb.step("after"), winners={"sw": {"env.NSA_DDP_BUCKET_MB": "50"}}, run_dir=tmp_path)
    assert resolved[0].env["NSA_DDP_BUCKET_MB"] == "50"
    with pytest.raises(LookupError):
        resolve_references("${sw.winner.env.NSA_DDP_BUCKET_MB}", {})
    rows = describe(rb, {"s1": "needs 2 GPU(s), found 0"})
    assert rows[0]["skip"] == "needs 2 GPU(s), found 0" and rows[2]["launches"][0]["waits_for"] == ["sw"]


def test_trainer_args_flags():
    assert trainer_args({"steps": 3, "ddp": 1, "fsdp": True, "compile": False, "loader_timeout": 9}) == [
        "--steps", "3", "--ddp", "1", "--fsdp", "--loader-timeout", "9"]


@pytest.mark.parametrize("edit, needle, line", [
    (lambda r: r["phases"][0]["steps"][0].update(kind="trian"), "phases[0].steps[0].kind: 'trian' is not one of", 10),
    (lambda r: r["phases"][0]["steps"][0].update(stepz=3), "phases[0].steps[0].stepz: unknown key", None),
    (lambda r: r.update(phasez=[]), "phasez: unknown key", None),
    (lambda r: r["defaults"].update(timeout_s="soon"), "defaults.timeout_s: must be a number", None),
    (lambda r: r["defaults"].update(nproc_per_node=0), "defaults.nproc_per_node: must be >= 1", None),
    (lambda r: r["acceptance"][0].update(expr="s1.toks_per_s.mean >="), "acceptance[0].expr", None),
    (lambda r: r["acceptance"][0].update(expr="__import__('os').system('x')"), "acceptance[0].expr", None),
    (lambda r: r["acceptance"][0].update(expr="nosuchstep.x > 1"), "unknown step(s) nosuchstep", None),
    (lambda r: r["acceptance"][0].update(severity="fatal"), "acceptance[0].severity: 'fatal' is not one of", None),
    (lambda r: r["phases"][1]["steps"][0].update(name="s1"), "duplicate step name 's1'", None),
    (lambda r: r["phases"][1]["steps"][0]["env"].update(NSA_DDP_BUCKET_MB="${s1.winner.env.NSA_DDP_BUCKET_MB}"),
     "must name a sweep step", None),
    (lambda r: r["phases"][0]["steps"][1].update(matrix={"NSA_DDP_BUCKET_MB": [1]}), "env.VARIABLE or args.flag",
     None),
    (lambda r: r["phases"][0]["steps"][0].update(env=["A=1"]), "phases[0].steps[0].env: expected a mapping", None),
    (lambda r: r.update(requirements={"backend": "mpi"}), "requirements.backend: 'mpi' is not one of", None),
    (lambda r: r["phases"][0]["steps"][0].update(name="bad-name"), "step names are identifiers", None),
    (lambda r: r["phases"][0]["steps"][0].update(args={"out_dir": "/etc"}), "set by nsa-validate itself", None),
    (lambda r: r["defaults"]["args"].update({"out-dir": "../x"}), "defaults.args.out-dir: set by nsa-validate", None),
    (lambda r: r["defaults"].update(timeout_s=float("inf")), "defaults.timeout_s: must be a finite number", None),
    (lambda r: r["phases"][0]["steps"][0].update(name="s1\n"), "step names are identifiers", None),
    (lambda r: r.update(compare={"run_sd": 0.06}), "compare: missing required key 'pairs'", None),
    (lambda r: r.update(compare={"pairs": 30}), "compare: expected run_sd, launch_sd or both", None),
    (lambda r: r.update(compare={"run_sd": -0.1, "pairs": 30}), "compare.run_sd: must be >= 0.0", None),
    (lambda r: r.update(compare={"launch_sd": 1.5, "pairs": 30}), "compare.launch_sd: must be below 1", None),
    (lambda r: r.update(compare={"launch_sd": "12%", "pairs": 30}), "compare.launch_sd: must be a number", None),
    (lambda r: r.update(compare={"run_sd": 0.06, "pairs": 1}), "compare.pairs: must be >= 2", None),
    (lambda r: r.update(compare={"floor": 0.15, "pairs": 30}), "compare.floor: unknown key", None),
])
def test_schema_errors_name_file_key_and_line(tmp_path, edit, needle, line):
    raw = yaml.safe_load(MINIMAL)
    edit(raw)
    message = error_of(tmp_path, yaml.safe_dump(raw, sort_keys=False))
    assert needle in message, message
    assert message.startswith(str(tmp_path / "rb.yaml") + ":")
    reported = message.split(":")[1]
    assert reported.isdigit(), message  # a line number, always
    if line is not None:
        assert int(reported) == line


def test_declared_compare_noise_is_loaded_and_stored_as_given(tmp_path):
    raw = yaml.safe_load(MINIMAL)
    raw["compare"] = {"run_sd": 0.061, "launch_sd": 0.12, "pairs": 30}
    rb = load_runbook(write(tmp_path, yaml.safe_dump(raw, sort_keys=False)))
    assert rb.compare_noise == {"run_sd": 0.061, "launch_sd": 0.12, "pairs": 30.0}
    assert load_runbook(write(tmp_path, MINIMAL)).compare_noise is None


def test_error_line_points_at_the_offending_key(tmp_path):
    text = MINIMAL.replace("        env: {NSA_DDP_BUCKET_MB: \"25\"}\n", "        env: {NSA_DDP_BUCKET_MB: \"25\"}\n"
                                                                        "        timeout_s: [1]\n")
    message = error_of(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'rb.yaml'}:11: phases[0].steps[0].timeout_s: must be a number"), message


def test_invalid_yaml_and_missing_file(tmp_path):
    assert "not valid YAML" in error_of(tmp_path, "name: [unclosed\n")
    with pytest.raises(RunbookError, match="runbook file not found"):
        load_runbook(tmp_path / "nope.yaml")


def test_set_overrides(tmp_path):
    path = write(tmp_path, MINIMAL)
    rb = load_runbook(path, ["defaults.args.steps=7"])
    assert rb.step("s1").launch.args["steps"] == 7
    with pytest.raises(RunbookError, match="phases\\[0\\].s1: unknown key"):
        load_runbook(path, ["phases.p1.s1.env.NSA_DDP_BUCKET_MB=100"])
    rb2 = load_runbook(path, ["phases.p1.steps.s1.env.NSA_DDP_BUCKET_MB=100"])
    assert rb2.step("s1").launch.env["NSA_DDP_BUCKET_MB"] == "100"
    assert rb2.sha256 != load_runbook(path).sha256
    with pytest.raises(RunbookError, match="expected KEY=VALUE"):
        load_runbook(path, ["defaults.args.steps"])
    with pytest.raises(RunbookError, match="no item named 'zz'"):
        load_runbook(path, ["phases.zz.steps.s1.env.X=1"])


def test_profile_steps_run_under_nsys_when_it_is_on_path(tmp_path, monkeypatch):
    rb = load_runbook(REPO / "runbooks" / "cpu_smoke.yaml")
    step = rb.step("profiling")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys here
    (pl,) = step_launches(step, winners={}, run_dir=tmp_path)
    assert pl.wrapper == [] and pl.env["NSA_NVTX"] == "1" and "--profile-steps" in pl.argv
    fake = tmp_path / "nsys"
    fake.write_text("#!/bin/sh\nexit 0\n")
    fake.chmod(0o755)
    (pl,) = step_launches(step, winners={}, run_dir=tmp_path)
    assert pl.wrapper[:2] == ["nsys", "profile"] and str(tmp_path / "profiling" / "nsys_profile") in pl.wrapper
