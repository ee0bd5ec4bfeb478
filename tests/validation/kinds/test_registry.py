"""The step-kind registry: a kind defined right here, in the test module, goes through the runbook schema, the plan,
the run, acceptance and the report (its blocks, key figure and plot) without any change to validation/ itself;
and the built-in kinds are what the registry and the README say."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from validation import kinds
from validation.runbook.plan import describe, step_launches
from validation.report import render, write_reports
from validation.runbook.loader import RunbookError, load_runbook
from validation.execution.runner import RunOptions, Runner
from validation.runbook.schema import typed
from validation.kinds.blocks import Paragraph, code
from validation.kinds.base import KeyFigure, StepKind, command_launch, run_path, undeclared_metrics
from validation.results.run import Step as StepRecord

REPO = Path(__file__).resolve().parents[3]

WRITER = "import pathlib, sys; pathlib.Path(sys.argv[1]).write_text(sys.argv[2] * int(sys.argv[3]))"


@dataclasses.dataclass(frozen=True)
class EchoOptions:
    message: str
    times: int


@dataclasses.dataclass(frozen=True)
class EchoMetrics:
    said: str | None = None
    length: int | None = None


@dataclasses.dataclass(frozen=True)
class EchoResult(StepRecord):
    metrics: EchoMetrics = dataclasses.field(default_factory=EchoMetrics)


class Echo(StepKind):
    """A child process writes `message` `times` times into RUN_DIR/<step>/said.txt; the step passes when it did."""

    name = "echo"
    summary = "a child writes a message into a file; metrics: what it said and its length"
    keys = ("message", "times")
    launch_keys = ("env", "timeout_s")
    result_type = EchoResult

    def parse(self, raw, path, ctx):
        return EchoOptions(message=typed(raw.get("message", "hello"), str, path + ("message",), ctx),
                           times=typed(raw.get("times", 1), int, path + ("times",), ctx, minimum=1))

    def launches(self, step, winners, run_dir):
        argv = [sys.executable, "-c", WRITER, run_path(run_dir, f"{step.name}/said.txt"), step.message,
                str(step.times)]
        return [command_launch(step, argv, run_dir)]

    def run(self, options, ctx):
        spec = ctx.launches[0]
        lr = ctx.launch(spec, 0, 1)
        said_path = ctx.run_dir / spec.dir / "said.txt"
        said = said_path.read_text() if said_path.is_file() else None
        ok = lr.status == "ok" and said == options.message * options.times
        return EchoResult(status="passed" if ok else "failed", reason=None if ok else f"said {said!r} ({lr.reason})",
                          metrics=EchoMetrics(said=said, length=len(said or "")), artifacts=[ctx.rel(said_path)])

    def summary_line(self, result):
        return f" (said {result.metrics.length} characters)"

    def blocks(self, result):
        return [Paragraph(f"Echo said: {code(result.metrics.said)} ({result.metrics.length} characters)")]

    def view(self, result, view):
        return {"echo": {"said": str(result.metrics.said), "length": result.metrics.length}}

    def key_figures(self, in_order):
        return [KeyFigure("echo", "Echo", str(s.metrics.said), f"step `{s.name}`", order=40)
                for s in in_order if isinstance(s, EchoResult)]

    def plots(self, name, result, plotter):
        fig, ax = plotter.figure(f"Echo: {name}", "step", ylabel="characters")
        ax.bar([0], [result.metrics.length or 0])
        plotter.save(fig, f"echo_{name}.png", f"Echo: {name}")


RUNBOOK = """\
name: echoes
requirements: {gpus: 0}
phases:
  - name: talk
    title: Talk
    steps:
      - {name: greet, kind: echo, message: "hi ", times: 3, env: {NSA_TB_DISABLE: "1"}}
      - {name: check, kind: bench, command: [-c, "import json, sys; json.dump({'x': 1}, open(sys.argv[2], 'w'))"]}
acceptance:
  - {name: said it three times, expr: "greet.length == 9 and greet.said == 'hi hi hi '", target: "9 characters"}
"""


@pytest.fixture
def echo_kind():
    kind = kinds.register(Echo())
    yield kind
    kinds.unregister("echo")


def test_a_kind_from_a_test_module_goes_through_plan_run_and_report(echo_kind, tmp_path):
    path = tmp_path / "echoes.yaml"
    path.write_text(RUNBOOK)
    rb = load_runbook(path)
    greet = rb.step("greet")
    assert greet.kind_impl is echo_kind and greet.message == "hi " and greet.times == 3 and not greet.is_training

    # plan: the kind's own launch, its directory and environment
    (spec,) = step_launches(greet)
    assert spec.argv[-3:] == ["RUN_DIR/greet/said.txt", "hi ", "3"] and spec.dir == "greet"
    rows = describe(rb)
    assert rows[0]["kind"] == "echo" and rows[0]["launches"][0]["env"] == {"NSA_TB_DISABLE": "1"}

    # run: results.json, acceptance and the verdict
    run_dir = tmp_path / "run"
    results = Runner(rb, run_dir, RunOptions(cwd=REPO)).run()
    step = results["steps"]["greet"]
    assert step["status"] == "passed", step["reason"]
    assert step["metrics"] == {"said": "hi hi hi ", "length": 9} and step["env"] == {"NSA_TB_DISABLE": "1"}
    assert "greet/said.txt" in step["artifacts"] and "greet/stdout.log" in step["artifacts"]
    assert [c["status"] for c in results["acceptance"]] == ["pass"] and results["verdict"] == "GO"
    assert json.loads((run_dir / "results.json").read_text())["steps"]["greet"]["metrics"]["length"] == 9
    assert echo_kind.summary_line(echo_kind.read(step)) == " (said 9 characters)"

    # report: the kind's blocks, key figure and plot
    written = write_reports(run_dir, results)
    assert run_dir / "plots" / "echo_greet.png" in written
    md = (run_dir / "report.md").read_text()
    assert "Echo said: `hi hi hi ` (9 characters)" in md
    assert "- **Echo**: hi hi hi  — step `greet`" in md
    assert "![Echo: greet](plots/echo_greet.png)" in md
    html = (run_dir / "report.html").read_text()
    assert "<p>Echo said: <code>hi hi hi</code> (9 characters)</p>" in html
    assert "| `x` | 1 |" in md  # the built-in bench kind beside it, unchanged

    # the table of kinds lists it; `kind:` errors name it
    assert "| `echo` | a child writes a message into a file" in kinds.table_markdown()
    bad = tmp_path / "bad.yaml"
    bad.write_text(RUNBOOK.replace("kind: echo", "kind: ech0"))
    with pytest.raises(RunbookError, match=r"'ech0' is not one of snapshot, .*, longrun, (.*, )?echo\b"):
        load_runbook(bad)


def test_a_kind_checks_its_own_keys(echo_kind, tmp_path):
    path = tmp_path / "echoes.yaml"
    for old, new, needle in [("times: 3", "times: 0", "phases[0].steps[0].times: must be >= 1, got 0"),
                             ("times: 3", "times: 3, loud: true", "phases[0].steps[0].loud: unknown key"),
                             ("env: {NSA_TB_DISABLE: \"1\"}", "nproc_per_node: 2", "phases[0].steps[0].nproc_per_node: "
                                                                            "unknown key")]:
        path.write_text(RUNBOOK.replace(old, new))
        with pytest.raises(RunbookError) as info:
            load_runbook(path)
        assert needle in str(info.value) and str(info.value).startswith(f"{path}:7: ")


def test_results_of_a_kind_this_process_does_not_know_still_render(tmp_path):
    results = {"schema_version": 1, "runbook": {"name": "r"}, "verdict": "GO",
               "phases": [{"name": "p", "title": "P", "steps": ["x"]}],
               "steps": {"x": {"name": "x", "kind": "from_the_future", "status": "passed",
                               "metrics": {"csv": None}}}}
    md = render(results, "md")
    assert "#### 1.1 x — PASSED" in md and "(from_the_future)" in md
    assert "<h4>1.1 x" in render(results, "html")


def test_built_in_kinds_and_the_readme_table():
    first = ("snapshot", "train", "sweep", "ab", "pytest", "bench", "profile", "longrun")  # the order a validation goes
    assert kinds.names()[:len(first)] == first
    assert all(kinds.get(n).listing is not None for n in first)
    assert all(kinds.get(n).listing is None for n in kinds.names()[len(first):])
    for name in kinds.names():
        kind = kinds.get(name)
        assert kind.name == name and kind.summary
        assert type(kind).blocks is not StepKind.blocks, f"{name} shows nothing of its own in the report"
    assert [k for k in first if kinds.get(k).trainer] == ["train", "sweep", "ab", "profile", "longrun"]
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert kinds.table_markdown() in readme, "README.md's table of step kinds is `nsa-validate kinds --markdown`"
    with pytest.raises(ValueError, match="already registered"):
        kinds.register(type("Twin", (StepKind,), {"name": "train"})())


def test_the_registry_knows_its_kinds_from_its_modules():
    """Every public package of validation/kinds that registers a kind makes it one of the package's own kinds (listed,
    protected from unregister), whether or not it has a `listing` place; a kind from elsewhere is not."""
    import pkgutil

    modules = {type(kinds.get(n)).__module__ for n in kinds.names() if kinds.built_in(n)}
    public = {f"validation.kinds.{m.name}" for m in pkgutil.iter_modules(kinds.__path__) if not m.name.startswith("_")}
    assert modules <= public and len(modules) >= 13
    listed = [n for n in kinds.names() if kinds.get(n).listing is not None]
    assert listed == sorted(listed, key=lambda n: kinds.get(n).listing)
    outside = [n for n in kinds.names() if kinds.built_in(n) and kinds.get(n).listing is None]
    assert outside == sorted(outside, key=lambda n: type(kinds.get(n)).__module__)
    assert "comm" in outside and "triage" in outside
    for name in outside:
        with pytest.raises(ValueError, match="built-in"):
            kinds.unregister(name)
    guest = kinds.register(type("Guest", (StepKind,), {"name": "guest_kind"})())
    try:
        assert not kinds.built_in("guest_kind") and kinds.names()[-1] == "guest_kind"
    finally:
        kinds.unregister(guest.name)
    assert "guest_kind" not in kinds.names()


class Declared(Echo):
    """Echo with its metrics declared, all but one: `length`."""

    name = "echo_declared"
    metrics = ("said",)


def test_metrics_a_kind_does_not_declare_are_kept_and_named_in_a_note(tmp_path):
    kind = kinds.register(Declared())
    try:
        path = tmp_path / "declared.yaml"
        path.write_text(RUNBOOK.replace("kind: echo", "kind: echo_declared").replace(
            "expr: \"greet.length == 9 and ", "expr: \""))
        results = Runner(load_runbook(path), tmp_path / "run", RunOptions(cwd=REPO)).run()
        step = results["steps"]["greet"]
        assert step["status"] == "passed" and step["metrics"]["length"] == 9  # kept
        assert step["notes"] == ["metrics the echo_declared kind does not declare: length (its `metrics` should "
                                 "name them)"]
        assert results["steps"]["check"].get("notes") is None  # the bench kind declares what it records
        write_reports(tmp_path / "run", results)
        assert "metrics the echo_declared kind does not declare: length" in (tmp_path / "run" / "report.md").read_text()
    finally:
        kinds.unregister(kind.name)
    assert undeclared_metrics(Echo(), None, {"anything": 1}) == []  # a kind that declares nothing: not checked
    assert undeclared_metrics(Declared(), None, {"said": "x", "n": {"a": 1, "b": [1, 2]}}) == ["n.a", "n.b"]


@pytest.mark.parametrize("path", sorted(str(p.relative_to(REPO)) for p in (REPO / "reports").rglob("results.json")))
def test_every_committed_run_records_only_declared_metrics(path):
    """The example and GPU runs under reports/: every metric of every step is one its kind declares."""
    results = json.loads((REPO / path).read_text())
    for name, step in results["steps"].items():
        assert undeclared_metrics(kinds.get(step["kind"]), None, step.get("metrics") or {}) == [], name


# Damaged steps every kind's hooks must read (results may be damaged, and a report still renders): keys of the wrong
# type, records where lists are, lists where records are, for the metrics of each kind (a kind ignores the others).
DAMAGED = ({}, {"metrics": None}, {"metrics": [1]}, {"status": 3, "runs": "x"},
           {"metrics": {"toks_per_s": "fast", "window": 2, "summary": [],
                        "profile": {"top_ops": [None, {"name": 1, "total_ms": "x"}]},
                        "strong": {"rows": [None, {"world_size": "two"}]}}},
           {"metrics": {"strategies": [1, 2]}},
           {"metrics": {"strategies": {"ddp": None}, "comparisons": "x", "batch_search": {"ddp": 3}}},
           {"metrics": {"points": [1, None], "exponent_ci": "x", "bisection": 3}},
           {"metrics": {"suspects": {"a": None}, "ranking": ["a", 2], "culprit": 5}},
           # figures that may be null where the schema allows it: half an interval, a statistic without its max
           {"metrics": {"exponent": 1.2, "exponent_ci": [1.0, None], "toks_per_s": {"mean": 5.0, "max": None},
                        "cpu_util": {"mean": 50.0, "max": None}, "telemetry": {"samples": 3, "period": "x"}}})


@pytest.mark.parametrize("kind", kinds.names())
def test_every_hook_of_every_kind_reads_a_damaged_step(kind):
    """Each damaged step decoded as the report decodes it (StepKind.read: leniently, into the kind's Result) goes
    through every report hook and both renderings without an error."""
    from validation.report.renderer import blocks_html, blocks_markdown

    impl = kinds.get(kind)
    for damaged in DAMAGED:
        step = impl.read({"name": "s", "kind": kind, **damaged})
        assert isinstance(step, impl.result_type), damaged
        blocks_markdown(impl.blocks(step)), blocks_html(impl.blocks(step))
        impl.view(step, {"name": "s"}), impl.summary_line(step), impl.trainer_launches(step), impl.comparisons(step)
        impl.key_figures(kinds.read_steps([{"name": "s", "kind": kind, **damaged}])), impl.key_figure_steps([step])
