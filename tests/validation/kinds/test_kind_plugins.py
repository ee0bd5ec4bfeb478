"""Step kinds found by entry point (validation.kinds.ENTRY_POINT_GROUP, "nsa_validate.kinds"): a distribution that
is not the project adds a kind without touching a file of it. The distribution here is a temporary package and its
`*.dist-info` (METADATA, entry_points.txt) put on PYTHONPATH, no pip: its kind is listed by `kinds`, shown by
`plan`, runs in `run`, renders in `report`, and `compare` reads its runs. A plugin that fails to import is named
by `kinds` and by the runbook error of a step that uses it, and takes nothing else down. The project's own kinds
are declared in the same group (pyproject.toml), exactly the built-in ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from validation import kinds

REPO = Path(__file__).resolve().parents[3]

PLUGIN = '''
import dataclasses
import sys
from validation.runbook.schema import typed
from validation.kinds.base import StepKind, command_launch, run_path
from validation.kinds.blocks import Paragraph
from validation.results.run import Step


@dataclasses.dataclass(frozen=True)
class Options:
    words: str


@dataclasses.dataclass(frozen=True)
class Metrics:
    shouted: str = ""
    length: int = 0


@dataclasses.dataclass(frozen=True)
class Result(Step):
    metrics: Metrics = dataclasses.field(default_factory=Metrics)

WRITER = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2].upper())"


class Shout(StepKind):
    """A child process writes `words` in capitals into RUN_DIR/<step>/shout.txt."""

    name = "shout"
    summary = "a child shouts its words into a file (a kind from an installed plugin)"
    keys = ("words",)
    launch_keys = ("env", "timeout_s")
    metrics = ("shouted", "length")
    result_type = Result

    def parse(self, raw, path, ctx):
        return Options(words=typed(raw.get("words", "hello"), str, path + ("words",), ctx))

    def launches(self, step, winners, run_dir):
        return [command_launch(step, [sys.executable, "-c", WRITER, run_path(run_dir, f"{step.name}/shout.txt"),
                                      step.words], run_dir)]

    def run(self, options, ctx):
        spec = ctx.launches[0]
        lr = ctx.launch(spec, 0, 1)
        path = ctx.run_dir / spec.dir / "shout.txt"
        said = path.read_text() if path.is_file() else ""
        ok = lr.status == "ok" and said == options.words.upper()
        return Result(status="passed" if ok else "failed", reason=None if ok else f"shouted {said!r}",
                      metrics=Metrics(shouted=said, length=len(said)))

    def blocks(self, result):
        return [Paragraph(f"Shouted: {result.metrics.shouted}")]
'''

RUNBOOK = """\
name: plugin_kinds
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  env: {NSA_TB_DISABLE: "1"}
  args: {steps: 6, save_every: 1000}
  nproc_per_node: 1
  timeout_s: 120
  window: 3
  warmup_steps: 1
phases:
  - name: talk
    steps:
      - {name: loud, kind: shout, words: "from outside"}
      - {name: tiny, kind: train}
acceptance:
  - {name: shouted_all, expr: "loud.length == 12", severity: fail}
"""


def _dist(root: Path, name: str, module: str, body: str, entry: str) -> None:
    (root / module).mkdir(parents=True)
    (root / module / "__init__.py").write_text(body)
    info = root / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[nsa_validate.kinds]\n{entry}\n")


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugins")
    _dist(root, "nsav_shout", "nsav_shout", PLUGIN, "shout = nsav_shout:Shout")
    _dist(root, "nsav_broken", "nsav_broken", "raise ImportError('this plugin needs a library that is missing')",
          "broken = nsav_broken:Broken")
    runbook = root / "plugin_kinds.yaml"
    runbook.write_text(RUNBOOK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env.update(PYTHONPATH=os.pathsep.join([str(root), str(REPO)]), COLUMNS="200")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "validation.cli", *map(str, args)], cwd=REPO, env=env,
                              capture_output=True, text=True, timeout=600)

    return root, runbook, cli


def test_a_kind_from_an_installed_distribution_goes_through_every_command(plugin, tmp_path):
    root, runbook, cli = plugin
    listed = cli("kinds")
    assert listed.returncode == 0 and "shout" in listed.stdout and "nsav_shout" in listed.stdout, listed.stdout
    shown = cli("plan", runbook)
    assert shown.returncode == 0 and "talk / loud (shout)" in shown.stdout and "from outside" in shown.stdout, \
        shown.stdout + shown.stderr
    run = tmp_path / "a"
    proc = cli("run", runbook, "--out", run)
    assert proc.returncode in (0, 3), proc.stdout[-3000:] + proc.stderr[-3000:]  # 3: disturbed (verdicts.py)
    results = json.loads((run / "results.json").read_text())
    assert results["steps"]["loud"]["metrics"] == {"shouted": "FROM OUTSIDE", "length": 12}
    assert {c["name"]: c["status"] for c in results["acceptance"]}["shouted_all"] == "pass"
    report = cli("report", run)
    assert report.returncode == 0 and "Shouted: FROM OUTSIDE" in report.stdout, report.stderr[-2000:]
    compared = cli("compare", run, run, "--json")  # the run against itself: which steps compare reads
    assert compared.returncode in (0, 1), compared.stderr[-2000:]
    steps_compared = {r["step"] for r in json.loads(compared.stdout)["rows"]}
    assert "tiny" in steps_compared and not any(s.startswith("loud") for s in steps_compared), steps_compared


def test_a_plugin_that_does_not_load_is_named_and_takes_nothing_down(plugin, tmp_path):
    root, _, cli = plugin
    listed = cli("kinds")
    assert listed.returncode == 0 and "shout" in listed.stdout
    assert "entry point broken = nsav_broken:Broken" in listed.stderr and "library that is missing" in listed.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nrequirements: {gpus: 0}\nphases:\n  - name: p\n    steps:\n"
                   "      - {name: x, kind: broken}\n")
    proc = cli("plan", bad)
    assert proc.returncode == 2 and "'broken' is not one of" in proc.stderr
    assert "a kind of that name did not load: entry point broken" in proc.stderr, proc.stderr


def test_the_projects_own_entry_points_are_exactly_its_built_in_kinds():
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"][kinds.ENTRY_POINT_GROUP]
    built_in = {name: f"{type(kinds.get(name)).__module__}:{type(kinds.get(name)).__name__}"
                for name in kinds.names() if kinds.built_in(name)}
    assert declared == built_in
