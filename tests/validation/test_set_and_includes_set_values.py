"""`--set KEY=VALUE` values: YAML's reading (README: `30` a number, `'"30"'` a string), but where YAML would
read something else than the text typed, an environment value and a trainer flag of free text (a path) get the
text as typed; any other key that refuses YAML's reading says so, naming the --set (quote it)."""

from __future__ import annotations

import re

import pytest

from validation.runbook.loader import RunbookError, load_runbook

RUNBOOK = """\
name: base
description: the file's
defaults:
  env: {NCCL_ALGO: Ring}
  args: {steps: 10, dataset: synthetic}
  timeout_s: 100
phases:
  - name: p1
    steps:
      - {name: a, kind: train, title: A}
      - {name: b, kind: train}
"""


@pytest.fixture()
def runbook(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text(RUNBOOK)
    return path


def test_a_trainer_flag_of_free_text_set_unquoted_is_the_text(runbook):
    # --data-path takes a path: 010 is the file 010, not "8"; on is the file on, not "True"
    for typed in ("010", "0x1F", "on", "1_000"):
        rb = load_runbook(runbook, [f"steps.a.args.data_path={typed}"])
        assert rb.step("a").launch.args["data_path"] == typed


@pytest.mark.parametrize("typed", ["on", "0x10", "1e3", "no", "~", "2026-11-30", "010", "8.90"])
def test_an_environment_value_is_the_text_as_typed(runbook, typed):
    rb = load_runbook(runbook, [f"steps.a.env.NCCL_X={typed}", f"defaults.env.NCCL_Y={typed}"])
    assert (rb.step("a").launch.env["NCCL_X"], rb.step("b").launch.env["NCCL_Y"]) == (typed, typed)


def test_a_key_that_refuses_yamls_reading_says_so_naming_the_set(runbook):
    for item, message in (("name=2026-11-30", "name: must be a string, got datetime.date(2026, 11, 30)"),
                          ("defaults.timeout_s=on", "defaults.timeout_s: must be a number, got True")):
        with pytest.raises(RunbookError, match=re.escape(f"--set {item} ({runbook}): {message}")):
            load_runbook(runbook, [item])


def test_a_quoted_or_tagged_value_keeps_the_type_it_says(runbook):
    with pytest.raises(RunbookError, match=re.escape("defaults.timeout_s: must be a number, got '1e3'")):
        load_runbook(runbook, ["defaults.timeout_s='1e3'"])  # quoted: text, said so
    with pytest.raises(RunbookError, match=re.escape("phases[0].steps[0].title: must be a string, got 5")):
        load_runbook(runbook, ["steps.a.title=!!int 5"])  # tagged: a number, said so
    assert load_runbook(runbook, ['steps.a.title="on"']).step("a").title == "on"
