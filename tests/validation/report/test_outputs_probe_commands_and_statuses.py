"""Commands a run's outputs print re-parse to the argv meant, and JUnit never passes a criterion not known to hold.

- The open problems' "run it again" of a disturbed step (and a criterion's "run again") keep every word as
  run_command quoted it: a run directory, a runbook path or a --set value holding two spaces or a tab reads back
  as itself (shlex, as a POSIX shell splits it), not as another directory or value; a multi-line reason is still
  one line.
- The report's validated command, run by bash, hands the trainer the recorded argv and environment whatever the
  values hold (quotes, $, backticks, a newline, non-ASCII, a leading dash, an empty value).
- A criterion with no status, or one no evaluation gives, is a skipped JUnit testcase (as an unknown step is),
  never a passing one; the suite's counts are those of its testcases.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import stat
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from validation.report import render
from validation.report.command import validated_command
from validation.report.problems import open_problems

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "reports/examples/cpu_smoke/results.json"


@pytest.fixture()
def results() -> dict:
    return copy.deepcopy(json.loads(EXAMPLE.read_text(encoding="utf-8")))


def _command_after(text: str, marker: str) -> list[str]:
    assert marker in text, text
    return shlex.split(text.split(marker, 1)[1])


# --------------------------------------------------------------------------------------------------------------
# Open problems

def test_a_disturbed_steps_rerun_command_keeps_two_spaces_and_a_tab_inside_its_words(results):
    results["run_dir"] = "runs/my  run"
    results["runbook"]["path"] = "runbooks/cpu\tsmoke.yaml"
    results["options"]["set"] = ["defaults.args.note=x  y"]
    results["evidence"]["disturbed"] = [{"step": "baseline", "text": "another process used 2 cores"}]
    [item] = [p for p in open_problems(results) if p["severity"] == "DISTURBED"]
    assert item["where"] == "step baseline"
    assert _command_after(item["what"], "run it again: ") == [
        "nsa-validate", "run", "runbooks/cpu\tsmoke.yaml", "--resume", "runs/my  run", "--rerun", "baseline",
        # and `single`, whose scaling efficiency divides baseline's tokens/s (its scaling_baseline)
        "--rerun", "single", "--set", "defaults.args.note=x  y"]


def test_a_criterions_run_again_command_keeps_its_words_and_a_multi_line_reason_is_one_line(results):
    crit = results["acceptance"][0]
    crit.update(status="inconclusive", detail="it held, but on disturbed evidence: step baseline was disturbed;"
                " run again: nsa-validate run runbooks/cpu_smoke.yaml --resume 'runs/a  b' --rerun baseline")
    results["steps"]["longrun"].update(status="failed", reason="Traceback:\n  File x.py\r\n\tValueError: bad  \n")
    problems = open_problems(results)
    [inconclusive] = [p for p in problems if p["where"] == f"criterion {crit['name']}"]
    assert _command_after(inconclusive["what"], "run again: ") == [
        "nsa-validate", "run", "runbooks/cpu_smoke.yaml", "--resume", "runs/a  b", "--rerun", "baseline"]
    [failed] = [p for p in problems if p["where"] == "step longrun"]
    assert failed["what"] == "Traceback: File x.py ValueError: bad"
    assert [p["what"] for p in problems].count(failed["what"]) == 1


# --------------------------------------------------------------------------------------------------------------
# The validated command

def test_the_validated_command_hands_the_trainer_its_argv_and_environment_through_bash(results, tmp_path):
    values = ["a  b", "it's", '"q"', "$HOME", "`id`", "x\ny", "ünï 名前", "-1", "", "a\\b", "*", "#c"]
    stub = tmp_path / "python"
    stub.write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                    "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
                    "if k.startswith('ZZ_')}}))\n", encoding="utf-8")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    args = [w for i, v in enumerate(values) for w in (f"--opt{i}", v)] + values
    step = results["steps"]["baseline"]
    step["command"] = ["/usr/bin/python3", "-m", "nsa.training", *args, "--out-dir", "runs/x/baseline/out"]
    step["env"] = {f"ZZ_{i}": v for i, v in enumerate(values)}
    step["metrics"]["world_size"] = 1
    text = validated_command(results)["text"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZZ_")}
    env["PATH"] = f"{tmp_path}:{env['PATH']}"
    out = subprocess.run(["bash", "-c", text], capture_output=True, text=True, env=env, timeout=30)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["argv"] == ["-m", "nsa.training", *args]  # --out-dir left out: a user's run chooses it
    assert got["env"] == step["env"]


# --------------------------------------------------------------------------------------------------------------
# JUnit

@pytest.mark.parametrize("status", [None, "odd"])
def test_a_criterion_of_no_or_an_unknown_status_is_a_skipped_testcase(results, status):
    crit = results["acceptance"][0]
    crit["status"] = status
    root = ET.fromstring(render(results, "junit").encode("utf-8"))
    suite = next(s for s in root.findall("testsuite") if s.get("name") == "acceptance")
    case = next(c for c in suite.findall("testcase") if c.get("name") == crit["name"])
    skipped = case.find("skipped")
    assert skipped is not None, ET.tostring(case, encoding="unicode")
    assert skipped.get("message").startswith(f"{status or 'unknown'}: target ")
    assert case.find("system-out") is None  # not a passing criterion's summary
    n = len(results["acceptance"])  # the example: every other criterion passes
    assert {k: int(suite.get(k)) for k in ("tests", "failures", "errors", "skipped")} == \
        {"tests": n, "failures": 0, "errors": 0, "skipped": 1}
    assert int(root.get("skipped")) == 1
    # the report's open problems list it too: neither format counts it as held
    assert any(p["where"] == f"criterion {crit['name']}" for p in open_problems(results))
