"""The parallelism step's memory table marks the model's activations and total as estimates ("~", with the
trainer's note) where summary.json says they are (off CPU: nsa.training.comm_model.activations_basis), and shows
them plainly where they are the exact CPU count."""

from __future__ import annotations

import copy
import json
from pathlib import Path

from nsa.training.comm_model import activations_basis
from validation.kinds.parallelism.records import Result
from validation.kinds.parallelism.view import parallelism_blocks
from validation.kinds.blocks import Paragraph, Table
from validation.results.codec import decode

REPO = Path(__file__).resolve().parents[3]
RESULTS = REPO / "reports/examples/parallelism_cpu/results.json"


def _step() -> dict:
    steps = json.loads(RESULTS.read_text())["steps"]
    return next(s for s in steps.values() if s.get("kind") == "parallelism")


def _memory_rows_and_notes(step: dict) -> tuple[list[tuple], list[str]]:
    blocks = parallelism_blocks(decode(Result, step, "parallelism"))
    tables = [b for b in blocks if isinstance(b, Table)]
    memory = next(t for t in tables if any(c.label == "activations" for c in t.columns))
    notes = [b.text for b in blocks if isinstance(b, Paragraph) and b.text.startswith("~ ")]
    return list(memory.rows), notes


def test_activations_off_cpu_are_marked_as_an_estimate():
    step = copy.deepcopy(_step())
    basis = activations_basis("cuda", "triton")
    for s in step["metrics"]["strategies"].values():
        s["memory_model"]["activations_basis"] = basis
    rows, notes = _memory_rows_and_notes(step)
    assert rows and all(r[6].startswith("~") and r[7].startswith("~") for r in rows)
    assert all(not r[3].startswith("~") for r in rows)  # params are counted, not estimated
    assert notes == [f"~ activations and total: {basis}."]


def test_the_cpu_count_is_shown_plainly():
    step = copy.deepcopy(_step())
    for s in step["metrics"]["strategies"].values():
        s["memory_model"]["activations_basis"] = activations_basis("cpu", "torch")
    rows, notes = _memory_rows_and_notes(step)
    assert rows and not any(str(c).startswith("~") for r in rows for c in r)
    assert notes == []
