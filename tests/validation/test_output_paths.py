"""Nothing a runbook says can make nsa-validate write outside RUN_DIR: the runbook's name (it names the run directory
under artifacts/validate) is one file name, step names are identifiers (no `..`, no `/`), matrix values and test
files become one safe file name each (safe_name), the trainer's --out-dir/--resume cannot be set (args, a sweep
matrix, --set), pytest_args cannot redirect pytest's output files, every derived output path is checked
(validation.results.store.inside_run_dir), and an existing symlink that leads outside RUN_DIR (e.g. RUN_DIR/<step>
replaced by a link before a --resume) stops the run before anything is written through it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from nsa.training.config import brief
from validation.cli import app
from validation.launch.spec import safe_name
from validation.runbook.plan import step_launches
from validation.report.plots import Plotter
from validation.results.store import RESULTS_JSON, RunDirError, inside_run_dir, read_results, write_results
from validation.run import RunError, default_run_dir
from validation.runbook.loader import RunbookError, load_runbook

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
    (lambda r: step(r, 0).update(name="x" * 101), "step names are identifiers (letters, digits, _) so acceptance "
     "expressions can use them, of at most 100 characters: a step's name names its directory in the run"),
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
    (lambda r: step(r, 2).update(tests=["tests/x.py", "--basetemp=/"]),  # a "-..." test entry goes to pytest as is
     "phases[0].steps[2].tests[1]: '--basetemp=/': pytest options that choose output"),
])
def test_runbook_values_cannot_name_an_output_path(tmp_path, edit, needle):
    message = load_edited(tmp_path, edit)
    assert needle in message, message


def test_set_cannot_rename_a_step_out_of_the_run_dir(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False))
    with pytest.raises(RunbookError, match="a step's name cannot be set from the command line"):
        load_runbook(path, ["phases.p.steps.train1.name=../../etc"])
    renamed = tmp_path / "renamed.yaml"  # the same name written in the file
    renamed.write_text(path.read_text().replace("name: train1", "name: ../../etc", 1))
    with pytest.raises(RunbookError, match="step names are identifiers"):
        load_runbook(renamed)
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


# ---------------------------------------------------------------------- the runbook's name: its run directory
def tree(root: Path) -> list[str]:
    """Every path under `root`, recursively (links not followed), relative to it."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


BAD_RUNBOOK_NAMES = ["../x", "../../escaped", "/tmp/x", "a/b", "a\\b", ".", "..", ".hidden", "", "a b", "a\nb",
                     "x\x00y", "caf\u00e9", "-rf", pytest.param("x" * 201, id="201-chars")]


@pytest.mark.parametrize("name", BAD_RUNBOOK_NAMES)
def test_a_runbook_name_is_one_file_name(tmp_path, name):
    message = load_edited(tmp_path, lambda r: r.update(name=name))
    assert f": name: {brief(name)}: runbook names are one file name (letters, digits, _, - and ., not starting with ." \
        in message and "\n" not in message, message


@pytest.mark.parametrize("name", ["paths", "ddp-2xa100", "v1.2", "_x", "9lives", "a.b-c_d",
                                  pytest.param("x" * 200, id="200-chars")])
def test_runbook_names_in_use_stay_valid(tmp_path, name):
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump({**BASE, "name": name}, sort_keys=False))
    assert load_runbook(path).name == name


def test_shipped_runbooks_and_examples_have_valid_names():
    names = [load_runbook(p).name for p in sorted((REPO / "runbooks").glob("*.yaml"))]
    names += [json.loads(p.read_text())["runbook"]["name"] for p in sorted((REPO / "reports").rglob("results.json"))]
    assert names and all(n and not n.startswith(".") and "/" not in n for n in names), names


def test_set_cannot_rename_the_runbook_out_of_the_runs_dir(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump(BASE, sort_keys=False))
    with pytest.raises(RunbookError, match=r"^--set name=\.\./\.\./escaped \(.*\): name: '\.\./\.\./escaped': "
                                           "runbook names are one file name"):
        load_runbook(path, ["name=../../escaped"])


@pytest.mark.parametrize("command", ["plan", "run"])
def test_plan_and_run_refuse_a_runbook_named_dotdot_before_anything_runs(tmp_path, monkeypatch, command):
    """A runbook named ../x once passed `plan`, and `run` wrote its run to artifacts/validate/../x-<time>."""
    work = tmp_path / "box" / "work"  # the working directory: artifacts/validate/ is made under it
    (work / "artifacts" / "validate").mkdir(parents=True)
    marker = tmp_path / "ran"
    code = f"import pathlib; pathlib.Path({str(marker)!r}).touch()"
    path = tmp_path / "rb.yaml"
    path.write_text(f"name: ../x\nphases:\n  - name: p\n    steps:\n"
                    f"      - {{name: one, kind: bench, command: [-c, {json.dumps(code)}]}}\n")
    before = tree(tmp_path)
    monkeypatch.chdir(work)
    result = CliRunner().invoke(app, [command, str(path)])
    output = result.output
    errors = [line for line in output.splitlines() if line.startswith("nsa-validate: error:")]
    assert result.exit_code == 2 and "Traceback" not in output, output
    assert len(errors) == 1 and errors[0].startswith(f"nsa-validate: error: {path}:1: name: '../x': runbook names "
                                                     "are one file name"), output
    assert tree(tmp_path) == before and not marker.exists()  # nothing created, nothing ran


def test_the_default_run_dir_is_one_directory_in_the_runs_dir(tmp_path):
    runs = tmp_path / "runs"
    run_dir = default_run_dir("cpu_smoke", runs)
    assert run_dir.parent == runs and run_dir.name.startswith("cpu_smoke-")
    for name in ("../x", "a/b", "/tmp/x"):  # the runbook refuses these first; this check stands behind it
        with pytest.raises(RunError, match=f"runbook name {re.escape(repr(name))}: "):
            default_run_dir(name, runs)
    assert tree(tmp_path) == []


# ---------------------------------------------------------------------- values that become file names
@pytest.mark.parametrize("text, expected", [
    ("..", "_."), (".", "_"), ("../../x", "_._.._x"), ("/etc/passwd", "_etc_passwd"), (".hidden", "_hidden"),
    ("a/../b", "a_.._b"), ("NSA_DDP_BUCKET_MB=25", "NSA_DDP_BUCKET_MB_25"), ("x\x00y", "x_y"), ("", ""),
])
def test_safe_name_is_one_file_name_inside_its_directory(text, expected):
    assert safe_name(text) == expected
    if expected:
        assert Path(expected).name == expected and expected not in (".", "..") and not expected.startswith(".")


def test_a_long_value_is_one_short_name_of_its_own(tmp_path):
    """A value longer than SAFE_NAME_MAX bytes (a matrix value, a test file) keeps its start and ends with 8 hex
    digits of its sha256: two such values stay two names, a file system takes it (255 bytes a name), and the
    longest step name with it and a repeat's suffix still fits. A hypothesis example found a 300-character name
    raising "File name too long" where RUN_DIR's paths are checked."""
    from validation.launch.spec import SAFE_NAME_MAX
    from validation.runbook.loader import STEP_NAME_MAX

    a, b, wide = safe_name("v" * 300 + "a"), safe_name("v" * 300 + "b"), safe_name("é" * 300)
    assert a != b and a.startswith("v" * 50) and re.fullmatch(r"v+_[0-9a-f]{8}", a)
    assert len(a.encode()) == SAFE_NAME_MAX and len(wide.encode()) <= SAFE_NAME_MAX and wide.startswith("é")
    assert safe_name("v" * SAFE_NAME_MAX) == "v" * SAFE_NAME_MAX and safe_name("v" * 300 + "a") == a
    for name in (a, wide, "s" * STEP_NAME_MAX + "_" + a + "_r10"):
        (tmp_path / name).mkdir()  # one name each, accepted by the file system
    with pytest.raises(RunDirError, match="File name too long"):  # behind them: a clear error, never an OSError
        inside_run_dir(tmp_path, "v" * 300)


def test_matrix_values_and_test_files_with_slashes_and_dotdot_land_inside_the_run_dir(tmp_path):
    """Sweep matrix values and pytest files (isolate: file) become directory names: /, .. and a leading . cannot
    lead out of RUN_DIR/<step>."""
    raw = json.loads(json.dumps(BASE))
    values = ["..", ".", "../../escaped", "/tmp/x", "a/../../b", ".hidden"]
    step(raw, 1)["matrix"] = {"env.SWEPT_VALUE": values}
    step(raw, 2).update(tests=["..::t", ".::t", "../../x.py", "/tmp/y.py::t"], isolate="file")
    path = tmp_path / "rb.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    run_dir = tmp_path / "box" / "run"
    run_dir.mkdir(parents=True)
    rb = load_runbook(path)
    seen = {}
    for s in rb.steps()[1:]:
        for spec in step_launches(s, None, run_dir):
            for where in (spec.step_dir, spec.trainer_out_dir):
                if where is None:
                    continue
                assert run_dir.resolve() / s.name in Path(where).resolve().parents, (spec.label, where)
            seen[spec.label] = spec.dir
    assert seen["SWEPT_VALUE=.."] == "sweep1/SWEPT_VALUE_.." and seen["SWEPT_VALUE=../../escaped"] == \
        "sweep1/SWEPT_VALUE_.._.._escaped"
    assert seen[".."] == "tests1/_." and seen["."] == "tests1/_" and seen["/tmp/y.py"] == "tests1/_tmp_y.py"
    assert all(len(Path(d).parts) == 2 for d in seen.values()), seen  # one directory each, in the step's


def test_a_plot_file_name_cannot_lead_out_of_the_run_dir(tmp_path):
    """Plot names come from results.json (a step's name, a kind's label): Plotter.save checks each one."""
    run_dir = tmp_path / "box" / "run"
    plotter = Plotter(run_dir)
    fig, _ = plotter.figure("t", "x")
    with pytest.raises(RunDirError, match="must be relative to the run directory"):
        plotter.save(fig, "../../escaped.png", "t")
    assert tree(tmp_path) == [] and plotter.written == []
    plotter.save(fig, "sub/ok.png", "t")
    assert (run_dir / "plots" / "sub" / "ok.png").is_file()

