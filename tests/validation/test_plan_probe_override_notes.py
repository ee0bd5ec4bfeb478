"""The notes `plan` prints under a step (and the warnings `run` prints) for a `--set defaults.KEY=...` that the step's
own KEY overrides are true of what the step launches: each note names a value the step runs with instead of the
--set's, and no step that runs with the --set's value gets one. The step's launch settings (its resolved env and
args) are the reference."""

from __future__ import annotations

import pytest

from validation.runbook.loader import load_runbook

RUNBOOK = """\
name: notes
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  env: {NSA_TB_DISABLE: "1"}
  args: {dataset: synthetic, ddp: 0, steps: 4}
phases:
  - name: p
    steps:
      - {name: one, kind: train, args: {steps: 40}, env: {NSA_TB_DISABLE: "0"}}
      - {name: two, kind: train}
"""


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "notes.yaml"
    p.write_text(RUNBOOK)
    return p


@pytest.mark.parametrize("sets, key, runs_with, noted", [
    # the step's own value wins: noted
    (["defaults.args.steps=5"], ("args", "steps"), 40, ["args.steps = 40"]),
    (["defaults.env.NSA_TB_DISABLE=1"], ("env", "NSA_TB_DISABLE"), "0", ["env.NSA_TB_DISABLE = '0'"]),
    # a --set of the step's own mapping decides: its value runs (7), or the --set default (5, "1") once the
    # step's own mapping is emptied; the note claimed the file's 40 / '0' won
    (["defaults.args.steps=5", "steps.one.args={steps: 7}"], ("args", "steps"), 7, []),
    (["defaults.args.steps=5", "steps.one.args={}"], ("args", "steps"), 5, []),
    (["defaults.env.NSA_TB_DISABLE=1", "steps.one.env={}"], ("env", "NSA_TB_DISABLE"), "1", []),
    # a mapping set whole on defaults merges key by key: only the keys the step sets itself are overridden
    (["defaults.env={FOO_X: '1'}"], ("env", "FOO_X"), "1", []),
    (["defaults.args={ddp: 1, dataset: synthetic}"], ("args", "ddp"), 1, []),
    (["defaults.args={steps: 5, dataset: synthetic}"], ("args", "steps"), 40, ["args.steps = 40"]),
])
def test_a_note_is_true_of_what_the_step_launches(path, sets, key, runs_with, noted):
    rb = load_runbook(path, sets)
    launch = rb.step("one").launch
    assert getattr(launch, key[0])[key[1]] == runs_with
    notes = rb.step_notes("one")
    assert [n.split(" overrides ")[0].removeprefix("its own ") for n in notes] == noted, notes
    assert len(rb.notes) == len(noted)
    assert rb.step_notes("two") == []
