"""Console output when stdout is not a terminal (a pipe, a CI log): nothing wrapped at 80 columns, no value cut with
an ellipsis, one line per table row (validation.report.console), in the run summary and every table the CLI
prints."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

from rich.console import Console

from validation import cli
from validation import kinds as step_kinds
from validation.report.console import make_console, print_line, print_summary, print_table, table_lines
from validation.report.view import CONSOLE_ACCEPTANCE_COLUMNS, console_summary

REPO = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).parent / "fixtures" / "results_example.json"
LONG = "sel_perf.ranges_speedup_min / sel_perf.forward_speedup_min >= 1.0 and sel_perf.parity == True"


def _cli(*args: str) -> subprocess.CompletedProcess:
    """The CLI with stdout piped and an 80-column terminal size in the environment (what rich wrapped to)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env.update(COLUMNS="80", LINES="25")
    return subprocess.run([sys.executable, "-m", "validation.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_table_lines_keep_every_value_whole_on_one_line():
    rows = [("Selection v2 faster", LONG, "PASS"), ("x", "multi\nline value", None)]
    lines = table_lines(("criterion", "expression", "status"), rows, title="acceptance")
    assert lines[0] == "acceptance"
    assert lines[1].split() == ["criterion", "expression", "status"]
    assert lines[2] == f"Selection v2 faster  {LONG}  PASS"
    assert lines[3] == "x                    multi line value"  # padded to the widest cell; nothing trails
    assert len(lines) == 4


def test_escape_sequences_inside_values_never_reach_the_log():
    # a failure's reason can carry a coloured log line: in a CI log its escape sequences would recolour what follows
    reason = "exit 1: \x1b[1;31mRuntimeError\x1b[0m: boom\x1b]0;title\x07"
    out = io.StringIO()
    console = make_console()
    console.file = out
    assert not console.is_terminal
    print_line(console, reason)
    print_table(console, ("step", "reason"), [("train", reason)])
    assert out.getvalue().splitlines() == ["exit 1: RuntimeError: boom", "step   reason",
                                           "train  exit 1: RuntimeError: boom"]
    out = io.StringIO()
    terminal = Console(file=out, force_terminal=True, width=80, color_system=None)
    print_table(terminal, ("step", "reason"), [("train", reason)])
    print_line(terminal, reason, style="red")
    assert "\x1b" not in out.getvalue() and out.getvalue().count("exit 1: RuntimeError: boom") == 2


def test_print_table_on_a_terminal_folds_instead_of_cutting():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=60, color_system=None)
    print_table(console, ("criterion", "expression"), [("Selection v2 faster", LONG)])
    text = out.getvalue()
    assert "…" not in text
    column = [line.split("│")[2].strip() for line in text.splitlines() if line.count("│") == 3]
    assert "".join(column).replace(" ", "") == LONG.replace(" ", "")  # folded, every character kept


def test_run_summary_is_whole_when_not_a_terminal():
    results = json.loads(FIXTURE.read_text(encoding="utf-8"))
    results["acceptance"][6]["actual"] = LONG + " = False"
    results["steps"]["baseline"]["metrics"]["context"] = {"seq_len": 256, "micro_batch": 4, "accum": 1,
                                                         "world_size": 2, "global_batch_tokens": 2048,
                                                         "n_params": 186296, "precision": "fp32"}
    out = io.StringIO()
    console = make_console()
    console.file = out  # a pipe: not a terminal
    assert not console.is_terminal
    print_summary(console, CONSOLE_ACCEPTANCE_COLUMNS, *console_summary(results, Path("/tmp/run"), []),
                  title="acceptance")  # what `run` prints at its end
    lines = out.getvalue().splitlines()
    assert "…" not in out.getvalue()
    for crit in results["acceptance"]:  # one line per criterion, name, target and actual whole
        line = next(ln for ln in lines if ln.startswith(crit["name"] + "  "))
        assert crit["target"] in line and str(crit["actual"] or "") in line
    assert any(ln.startswith("Baseline throughput: 5,843.2 ± 112.4 tokens/s (window mean ± stdev, all ranks) — step "
                             "baseline") and
               ln.endswith("at seq_len 256, micro-batch 4, accum 1, world size 2, global batch 2,048 tokens, params "
                           "186.3K, precision fp32, TFLOP/s n/a, MFU n/a (device peak unknown)") for ln in lines)
    assert f"NO-GO: {results['verdict_reason']}" in lines


def test_cli_tables_are_whole_when_piped():
    kinds = _cli("kinds")
    assert kinds.returncode == 0, kinds.stderr
    assert "…" not in kinds.stdout
    for kind in step_kinds.kinds():  # every kind on one line with its whole summary
        line = next(ln for ln in kinds.stdout.splitlines() if ln.startswith(kind.name + " "))
        assert kind.summary.replace("`", "") in line and line.rstrip().endswith(type(kind).__module__)
    listing = _cli("list", "--runs", str(REPO / "reports" / "examples"))
    assert listing.returncode == 0, listing.stderr
    assert "…" not in listing.stdout
    from validation.runbook.loader import load_runbook

    cpu = load_runbook(REPO / "runbooks" / "cpu_smoke.yaml")
    line = next(ln for ln in listing.stdout.splitlines() if ln.startswith("runbooks/cpu_smoke.yaml"))
    assert line.endswith(cpu.description)  # whole, not cut at 90 characters
    assert any(ln.startswith(str(REPO / "reports" / "examples" / "cpu_smoke")) for ln in listing.stdout.splitlines())
    plan = _cli("plan", "runbooks/cpu_smoke.yaml")
    assert plan.returncode == 0, plan.stderr
    argv_lines = [ln for ln in plan.stdout.splitlines() if "-m nsa.training" in ln]
    assert argv_lines and all("--out-dir RUN_DIR/" in ln for ln in argv_lines)  # each launch on one line
    assert max(len(ln) for ln in plan.stdout.splitlines()) > 80


def test_a_run_interrupted_after_its_verdict_says_so_and_exits_by_its_signal(monkeypatch, tmp_path):
    """The CLI's message when the signal came after the verdict, while the reports were written (validation.run
    rewrote them from results.json): the verdict it had, where the reports are, and 128 + the signal as the exit
    code; with a report that could not be written, that error on its own line and exit 2."""
    import signal

    from typer.testing import CliRunner

    from validation.launch.interrupts import Interrupted
    from validation.run import RunOutcome

    results = json.loads(FIXTURE.read_text(encoding="utf-8"))
    results.update(verdict="GO", finished="2026-11-26T04:00:00+0000", interrupted_by=None)
    outcomes = [RunOutcome(runbook=None, run_dir=tmp_path, results=results, interrupted=Interrupted(signal.SIGTERM)),
                RunOutcome(runbook=None, run_dir=tmp_path, results=results, interrupted=Interrupted(signal.SIGHUP),
                           report_error=f"{tmp_path}/report.html: No space left on device")]
    assert all(o.interrupted_after_verdict and o.verdict is None for o in outcomes)
    monkeypatch.setattr(cli, "run_runbook", lambda request, display, warn, say=None: outcomes.pop(0))
    first = CliRunner().invoke(cli.app, ["run", "runbooks/cpu_smoke.yaml"])
    assert first.exit_code == 143, first.output
    assert (f"interrupted (SIGTERM) after the run reached its verdict (GO): the reports in {tmp_path} were written, "
            "whole, from its results.json") in " ".join(first.output.split())
    second = CliRunner().invoke(cli.app, ["run", "runbooks/cpu_smoke.yaml"])
    assert second.exit_code == 2 and "No space left on device" in second.output


QUIET_BENCH = """\
import json, sys, time
time.sleep(2.5)
with open(sys.argv[sys.argv.index("--json") + 1], "w") as f:
    json.dump({"slept_s": 2.5}, f)
"""
# `nsa-validate run` with the progress interval shortened (validation.report.progress.PLAIN_PROGRESS_S) and stdout
# a pipe, as in `nsa-validate run RUNBOOK | cat`
PIPED_RUN = ("import sys\nimport validation.report.progress as progress\nprogress.PLAIN_PROGRESS_S = 0.5\n"
             "sys.argv = ['nsa-validate', *sys.argv[1:]]\nfrom validation.cli import main\nmain()\n")


def test_a_piped_run_prints_a_line_while_a_quiet_step_runs(tmp_path):
    """A step whose launch reports nothing (a benchmark that sleeps) prints RUNNING lines with its elapsed time
    between STARTED and its status, no ANSI codes, nothing after the step's line but the run's summary."""
    script = tmp_path / "quiet_bench.py"
    script.write_text(QUIET_BENCH)
    runbook = tmp_path / "quiet.yaml"
    runbook.write_text(f"name: quiet\nrequirements: {{gpus: 0}}\nphases:\n  - name: p\n    steps:\n"
                       f"      - {{name: quiet, kind: bench, command: [{script}], timeout_s: 60}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSA_", "FORCE_COLOR", "TTY_"))}
    proc = subprocess.run([sys.executable, "-c", PIPED_RUN, "run", str(runbook), "--out", str(tmp_path / "run"),
                           "--no-report"], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    started = next(i for i, ln in enumerate(lines) if ln.startswith("  STARTED  p / quiet (bench)"))
    passed = next(i for i, ln in enumerate(lines) if ln.startswith("  PASSED   p / quiet in "))
    running = [ln for ln in lines if ln.startswith("  RUNNING ")]
    assert len(running) >= 2 and running == lines[started + 1:passed]
    assert all(ln.startswith("  RUNNING  p / quiet: ") and " s elapsed" in ln for ln in running)
    assert "\x1b" not in proc.stdout
