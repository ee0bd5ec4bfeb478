"""What the commands of validation.cli call in the library instead of computing it themselves (the design's "parse,
call one function, print"): the table of step kinds (validation.kinds.table_rows), list's directories
(validation.run.listing_dirs), plan's rows (validation.run.plan_rows), `run --dry-run`'s lines
(validation.run.dry_run_lines) and the summary printing (validation.report.console.print_lines, print_summary);
each against its documented contract and hand-written figures, and through the command line where the CLI maps an
error to exit 2."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from typer.testing import CliRunner

from validation import kinds
from validation.cli import app
from validation.kinds.base import StepKind
from validation.report.console import make_console, print_lines, print_summary
from validation.results.store import DEFAULT_RUNS
from validation.run import RunError, RunRequest, dry_run_lines, listing_dirs, plan_rows

REPO = Path(__file__).resolve().parents[2]
CPU_SMOKE = REPO / "runbooks" / "cpu_smoke.yaml"


class Listed(StepKind):
    name = "listed_kind"
    summary = "writes `words` in capitals into `RUN_DIR`"
    keys = ("words", "loud")


class Bare(StepKind):
    name = "bare_kind"
    summary = "does nothing"
    keys = ()


@pytest.fixture
def two_kinds():
    registered = [kinds.register(Listed()), kinds.register(Bare())]
    try:
        yield registered
    finally:
        for kind in registered:
            kinds.unregister(kind.name)


def test_kind_table_rows_give_name_summary_without_backticks_keys_and_module(two_kinds):
    rows = kinds.table_rows()
    assert [row[0] for row in rows] == list(kinds.names())  # one row per kind, in the registry's order
    assert rows[-2:] == [("listed_kind", "writes words in capitals into RUN_DIR", "words, loud", __name__),
                         ("bare_kind", "does nothing", "-", __name__)]


def test_kinds_command_prints_the_rows_as_whole_lines(two_kinds):
    result = CliRunner().invoke(app, ["kinds"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "step kinds"
    assert lines[1].split() == ["kind", "what", "it", "does", "its", "own", "keys", "module"]
    bare = next(line for line in lines if line.startswith("bare_kind "))
    assert bare.split() == ["bare_kind", "does", "nothing", "-", __name__]


def test_listing_dirs_defaults_and_checks_the_given_ones(tmp_path):
    assert listing_dirs(None, None) == (Path("runbooks"), DEFAULT_RUNS)
    (tmp_path / "books").mkdir()
    (tmp_path / "runs").mkdir()
    assert listing_dirs(tmp_path / "books", tmp_path / "runs") == (tmp_path / "books", tmp_path / "runs")
    (tmp_path / "file").write_text("")
    with pytest.raises(RunError, match=r"^--runs .*file: not a directory$"):
        listing_dirs(None, tmp_path / "file")
    with pytest.raises(RunError, match=r"^--runbooks .*missing: no such directory$"):  # --runbooks named first
        listing_dirs(tmp_path / "missing", tmp_path / "file")


def test_list_with_a_missing_runs_dir_exits_2_naming_it(tmp_path):
    result = CliRunner().invoke(app, ["list", "--runs", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert f"nsa-validate: error: --runs {tmp_path / 'missing'}: no such directory" in result.stderr


def test_report_of_a_directory_without_results_exits_2(tmp_path):
    result = CliRunner().invoke(app, ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert result.stderr.startswith("nsa-validate: error: ")
    assert result.stdout == ""


def test_plan_rows_are_one_per_step_and_check_the_named_files_from_cwd(tmp_path):
    rb, rows = plan_rows(CPU_SMOKE, [], REPO)
    assert rb.name == "cpu_smoke"
    assert [row["step"] for row in rows] == [step.name for step in rb.steps()]
    with pytest.raises(RunError, match="no such file or directory"):  # the tests it names are not under tmp_path
        plan_rows(CPU_SMOKE, [], tmp_path)


def test_dry_run_lines_say_where_the_run_would_write_and_write_nothing(tmp_path):
    out = tmp_path / "new_run"
    lines, last = dry_run_lines(RunRequest(runbook=CPU_SMOKE, out=out, cwd=REPO))
    assert lines[0][0].startswith("cpu_smoke: ") and lines[0][1] == "bold"
    assert last == f"\ndry run: nothing launched, nothing written; the run would write {out}"
    assert not out.exists()
    with pytest.raises(RunError, match="no phase 'nowhere'"):
        dry_run_lines(RunRequest(runbook=CPU_SMOKE, out=out, only=("nowhere",), cwd=REPO))


def _piped():
    console = make_console()
    console.file = io.StringIO()  # not a terminal: whole plain lines
    assert not console.is_terminal
    return console


def test_print_summary_prints_the_table_then_the_lines():
    console = _piped()
    print_summary(console, ("criterion", "status"), [("loss", "PASS")], [("GO: all pass", "bold green")],
                  title="acceptance")
    assert console.file.getvalue() == "acceptance\ncriterion  status\nloss       PASS\nGO: all pass\n"


def test_print_summary_without_rows_prints_no_table():
    console = _piped()
    print_summary(console, ("criterion", "status"), [], [("NO-GO: no criteria", "bold red"),
                                                         ("results: r/results.json", None)], title="acceptance")
    assert console.file.getvalue() == "NO-GO: no criteria\nresults: r/results.json\n"


def test_print_lines_prints_each_text_as_it_is():
    console = _piped()
    print_lines(console, [("[red]not markup[/red] :x:", "bold"), ("", None), ("  indented", None)])
    assert console.file.getvalue() == "[red]not markup[/red] :x:\n\n  indented\n"
