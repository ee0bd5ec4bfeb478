"""Nothing a runbook says can make nsa-validate write outside RUN_DIR: step names are identifiers (no `..`, no
`/`), the trainer's --out-dir/--resume cannot be set (args, a sweep matrix, --set), pytest_args cannot redirect
pytest's output files, every derived output path is checked, and an existing symlink that leads outside RUN_DIR
(e.g. RUN_DIR/<step> replaced by a link before a --resume) stops the run before anything is written through it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from validation.plan import step_launches
from validation.results import RESULTS_JSON, RunDirError, read_results, write_results
from validation.runbook import RunbookError, load_runbook
from validation.runner import inside_run_dir

REPO = Path(__file__).resolve().parents[2]

BASE = {
    "name": "paths",
    "defaults": {"config": "configs/tiny_cpu.yaml", "args": {"steps": 3}},
    "phases": [{"name": "p", "steps": [
        {"name": "train1", "kind": "train"},
        {"name": "sweep1", "kind": "sweep", "matrix": {"env.NSA_DDP_BUCKET_MB": [25, 50]}},
        {"name": "tests1", "kind": "pytest", "tests": ["tests/validation/test_stats.py"]},
    ]}],
}


def load_edited(tmp_path: Path, edit) -> str:
    raw = json.loads(json.dumps(BASE))
    edit(raw)
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(RunbookError) as info:
        load_runbook(path)
    message = str(info.value)
    assert message.startswith(f"{path}:") and message.split(":")[1].isdigit(), message  # file and line
    return message


def step(raw, i):
    return raw["phases"][0]["steps"][i]


@pytest.mark.parametrize("edit, needle", [
    (lambda r: step(r, 0).update(name="../escape"), "phases[0].steps[0].name: '../escape': step names are identifiers"),
    (lambda r: step(r, 0).update(name="/tmp/abs"), "phases[0].steps[0].name: '/tmp/abs': step names are identifiers"),
    (lambda r: step(r, 0).update(name="a/b"), "step names are identifiers"),
    (lambda r: step(r, 0).update(name=".."), "step names are identifiers"),
    (lambda r: r["phases"][0].update(name="../p"), "phases[0].name: '../p': phase names are identifiers"),
    (lambda r: step(r, 1)["matrix"].update({"args.out-dir": ["/tmp/x"]}),
     "phases[0].steps[1].matrix.args.out-dir: set by nsa-validate itself"),
    (lambda r: step(r, 1)["matrix"].update({"args.out_dir": ["../x"]}), "matrix.args.out_dir: set by nsa-validate"),
    (lambda r: step(r, 1)["matrix"].update({"args.resume": [True]}), "matrix.args.resume: set by nsa-validate"),
    (lambda r: step(r, 0).update(args={"out-dir": "/etc"}), "phases[0].steps[0].args.out-dir: set by nsa-validate"),
    (lambda r: step(r, 2).update(pytest_args=["--junitxml=/tmp/elsewhere.xml"]),
     "phases[0].steps[2].pytest_args[0]: '--junitxml=/tmp/elsewhere.xml': pytest options that choose output"),
    (lambda r: step(r, 2).update(pytest_args=["-q", "--basetemp", "/"]), "pytest_args[1]: '--basetemp'"),
    (lambda r: step(r, 2).update(pytest_args=["--junit-xml", "../x.xml"]), "pytest_args[0]: '--junit-xml'"),
])
def test_runbook_values_cannot_name_an_output_path(tmp_path, edit, needle):
    message = load_edited(tmp_path, edit)
    assert needle in message, message


def test_set_cannot_rename_a_step_out_of_the_run_dir(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False))
    with pytest.raises(RunbookError, match="step names are identifiers"):
        load_runbook(path, ["phases.p.steps.train1.name=../../etc"])
    with pytest.raises(RunbookError, match="set by nsa-validate itself"):
        load_runbook(path, ["defaults.args.out-dir=/tmp"])


def test_every_planned_path_is_inside_the_run_dir(tmp_path):
    """What the planner derives from the shipped runbooks (sweep labels included) stays under RUN_DIR."""
    for runbook in sorted((REPO / "runbooks").glob("*.yaml")):
        for s in load_runbook(runbook).steps():
            for pl in step_launches(s, None, tmp_path):
                for rel in (pl.dir, pl.out_dir):
                    if rel:
                        assert inside_run_dir(tmp_path, rel) == tmp_path / rel
                        assert not Path(rel).is_absolute() and ".." not in Path(rel).parts, (runbook.name, rel)


# ---------------------------------------------------------------------- the runner's check
@pytest.mark.parametrize("rel", ["..", "../x", "a/../../x", "/etc", "/tmp/x", ""])
def test_relative_paths_only(tmp_path, rel):
    with pytest.raises(RunDirError, match="must be relative to the run directory"):
        inside_run_dir(tmp_path / "run", rel)


def test_symlinks_leading_outside_are_refused_inside_ones_allowed(tmp_path):
    run_dir, elsewhere = tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    (run_dir / "out_link").symlink_to(elsewhere)
    with pytest.raises(RunDirError, match=r"out_link is a symlink to .*elsewhere, outside the run directory"):
        inside_run_dir(run_dir, "out_link/sub")
    (run_dir / "real").mkdir()
    (run_dir / "in_link").symlink_to(run_dir / "real")
    assert inside_run_dir(run_dir, "in_link/sub") == run_dir / "in_link" / "sub"
    # deep inside an existing step directory: a file link, a dangling link, a loop
    deep = run_dir / "step" / "out"
    deep.mkdir(parents=True)
    (deep / "training.csv").symlink_to(elsewhere / "victim.csv")  # dangling: writing would create it there
    with pytest.raises(RunDirError, match="training.csv is a symlink"):
        inside_run_dir(run_dir, "step")
    (deep / "training.csv").unlink()
    (deep / "loop").symlink_to(deep / "loop")
    with pytest.raises(RunDirError, match="loop is a symlink"):
        inside_run_dir(run_dir, "step")
    (deep / "loop").unlink()
    (deep / "ok").symlink_to(run_dir / "real")
    assert inside_run_dir(run_dir, "step") == run_dir / "step"
    # a run directory reached through a link of its own is fine: it is where the user pointed
    (tmp_path / "run_link").symlink_to(run_dir)
    assert inside_run_dir(tmp_path / "run_link", "step") == tmp_path / "run_link" / "step"


# ---------------------------------------------------------------------- end to end


def bench_runbook(tmp_path: Path) -> Path:
    code = "import json, sys; open(sys.argv[2], 'w').write(json.dumps({'x': 1}))"
    path = tmp_path / "rb.yaml"
    path.write_text("name: links\nphases:\n  - name: p\n    steps:\n"
                    + "".join(f"      - {{name: {n}, kind: bench, command: [-c, {json.dumps(code)}]}}\n"
                              for n in ("one", "two")))
    return path


@pytest.mark.reliability
def test_resume_refuses_a_step_directory_linked_outside(cli, tmp_path, reliability):
    path, run_dir, elsewhere = bench_runbook(tmp_path), tmp_path / "run", tmp_path / "elsewhere"
    assert cli("run", path, "--out", run_dir, "--no-report").returncode == 0
    results = read_results(run_dir)
    results["steps"]["two"].update(status="running")  # the run stopped during step two
    write_results(run_dir, results)
    before = (run_dir / RESULTS_JSON).read_bytes()
    elsewhere.mkdir()
    (run_dir / "two").rename(tmp_path / "two.orig")
    (run_dir / "two").symlink_to(elsewhere)
    proc = cli("run", path, "--resume", run_dir)
    expected = (f"nsa-validate: error: {run_dir / 'two'} is a symlink to {elsewhere}, outside the run directory "
                f"{run_dir}: refusing to write through it")
    reliability.record_fault("step directory linked outside RUN_DIR", f"exit 2: {expected}",
                             f"exit {proc.returncode}: {proc.stderr.strip()}")
    assert proc.returncode == 2 and proc.stderr.strip() == expected, proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(elsewhere.iterdir())  # nothing written through the link
    intact = (run_dir / RESULTS_JSON).read_bytes() == before
    reliability.record_results(lost=0 if intact else 1, checked=1)
    assert intact and not (run_dir / "report.md").exists()


def test_a_fresh_run_refuses_a_plots_directory_linked_outside(cli, tmp_path):
    path, run_dir, elsewhere = bench_runbook(tmp_path), tmp_path / "run", tmp_path / "elsewhere"
    run_dir.mkdir()
    elsewhere.mkdir()
    (run_dir / "plots").symlink_to(elsewhere)
    proc = cli("run", path, "--out", run_dir)
    assert proc.returncode == 2 and "plots is a symlink to" in proc.stderr, proc.stderr
    assert not (run_dir / RESULTS_JSON).exists() and not (run_dir / "one").exists()
