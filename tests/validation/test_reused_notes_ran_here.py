"""The report's "Not run here" notes (validation.results.store.reused_notes) say of a phase that nothing of it
ran here: never of a phase whose steps hold results of their own, as after a run started with --reuse PHASE was
interrupted before the phase and resumed without --reuse (its steps then ran here), or skipped by a failed step
with on_failure: stop."""

from __future__ import annotations

import pytest

from validation.results.store import reused_notes

TAKEN = {"phase": "kernels", "from": "reports/gpu/earlier/results.json", "runbook": "gpu_kernels",
         "finished": "2026-11-30T10:00:00+0000", "device": "no GPU", "source_digest": "0123456789abcdef"}


def _results(kbench: dict) -> dict:
    return {"reused": [TAKEN],
            "phases": [{"name": "setup", "steps": ["gate"]}, {"name": "kernels", "steps": ["kbench"]}],
            "steps": {"gate": {"name": "gate", "phase": "setup", "status": "passed"},
                      "kbench": {"name": "kbench", "phase": "kernels", **kbench}}}


@pytest.mark.parametrize("kbench, named", [
    ({"status": "passed", "reused": TAKEN}, True),  # taken from the earlier run
    ({"status": "pending"}, True),  # not reached yet: it will be taken
    ({"status": "passed"}, False),  # ran here: resumed without --reuse
    ({"status": "failed"}, False),
    ({"status": "skipped", "reason": "not run: step gate failed and on_failure is stop"}, False),
], ids=["reused", "pending", "ran-here", "failed-here", "skipped-here"])
def test_a_phase_is_said_to_be_taken_from_an_earlier_run_only_while_none_of_its_steps_ran_here(kbench, named):
    notes = reused_notes(_results(kbench))
    if named:
        assert len(notes) == 1 and notes[0].startswith("phase kernels: its results are those of "
                                                       "reports/gpu/earlier/results.json")
        assert notes[0].endswith("nothing of it ran here")
    else:
        assert notes == []
