"""Checks of a trainer run's summary.json, timeline.json and communication counts, shared by the trainer tests."""

from __future__ import annotations

import pytest
import torch

from train_utils import read_csv

from nsa.config import ModelConfig
from nsa.model import NSAModel
from nsa.training import outputs
from nsa.training.comm_model import comm_model, param_specs
from nsa.training.distributed import first_use_order
from nsa.training.outputs import read_summary, read_timeline


def check_summary_against_csv(out_dir, world_size: int, batch: int, accum: int, seq_len: int) -> dict:
    """summary.json read by its reader and consistent with training.csv; shared with the 2-rank tests."""
    summary = read_summary(out_dir)
    rows = read_csv(out_dir / outputs.TRAINING_CSV)
    times = [float(r["step_time_s"]) for r in rows]
    assert summary["status"] == "completed" and summary["world_size"] == world_size
    assert summary["steps"] == len(rows) and summary["last_step"] == int(rows[-1]["step"])
    assert summary["tokens_per_step"] == world_size * batch * accum * seq_len
    assert summary["samples_per_step"] == world_size * batch * accum
    assert summary["final_loss"] == pytest.approx(float(rows[-1]["loss"]), rel=1e-5)
    assert summary["avg_loss"] == pytest.approx(sum(float(r["loss"]) for r in rows) / len(rows), rel=1e-5)
    assert summary["mean_step_toks_per_s"] == pytest.approx(
        sum(float(r["toks_per_s"]) for r in rows) / len(rows), rel=1e-4)
    assert summary["tokens_per_s"] == pytest.approx(len(rows) * summary["tokens_per_step"] / sum(times), rel=1e-4)
    assert summary["samples_per_s"] * seq_len == pytest.approx(summary["tokens_per_s"], rel=1e-9)
    assert summary["avg_step_time_s"] == pytest.approx(sum(times) / len(times), rel=1e-4)
    assert summary["min_step_time_s"] == pytest.approx(min(times), rel=1e-4)
    assert summary["max_step_time_s"] == pytest.approx(max(times), rel=1e-4)
    assert summary["memory_kind"] == "cpu_rss" and summary["peak_mem_reserved_gb"] is None
    assert 0 < summary["avg_mem_alloc_gb"] <= summary["peak_mem_alloc_gb"]
    model = summary["memory_model"]
    assert model["total"] == sum(model[k] for k in ("params", "grads", "optimizer_state", "buffers", "activations"))
    return summary


def check_timeline(out_dir, world_size: int) -> dict:
    timeline = read_timeline(out_dir)
    assert set(timeline) - {"missing_milestones"} == set(outputs.TIMELINE_FIELDS)
    assert timeline["missing_milestones"] == []
    assert timeline["process_start_source"] == "/proc/self/stat"
    marks = timeline["milestones"]
    required = [m for m in outputs.TIMELINE_MILESTONES if m not in outputs.TIMELINE_OPTIONAL]
    assert [m for m in marks if m in required] == required  # all there, in order
    values = list(marks.values())
    assert values == sorted(values) and values[0] == 0.0 < values[1]  # monotonic; imports take time
    assert timeline["time_to_first_step_s"] == marks["first_logged_step"]
    assert sorted(timeline["ranks"]) == [str(r) for r in range(world_size)]
    for rank, rank_marks in timeline["ranks"].items():
        assert list(rank_marks) == required, rank
    slowest = timeline["slowest"]["first_logged_step"]
    assert slowest["s"] == max(m["first_logged_step"] for m in timeline["ranks"].values())
    return timeline


def as_table(prediction_counts: dict) -> list[dict]:
    """A prediction's {kind: {calls, bytes, sizes}} in summary.json's list form."""
    order = outputs.COMM_KINDS
    return [{"kind": k, **prediction_counts[k]} for k in sorted(prediction_counts, key=order.index)]


def independent_prediction(raw: dict, strategy: str, world_size: int = 2, **settings):
    """The byte model computed here, from a freshly built model: not the trainer's own copy of it."""
    model = NSAModel(ModelConfig.from_flat(raw["model"]))
    probe = torch.zeros(1, min(raw["train"]["seq_len"], 512), dtype=torch.long)
    return comm_model(param_specs(model, first_use_order(model, probe)), strategy, world_size=world_size,
                      accum=raw["train"]["accum"], **settings)


def check_counts_equal_model(out_dir, raw: dict, strategy: str, **settings) -> dict:
    """Counted == the trainer's prediction == an independent prediction, exactly; training.csv's comm_bytes too."""
    summary = read_summary(out_dir)
    comm = summary["comm"]
    expected = independent_prediction(raw, strategy, **settings)
    assert summary["comm_model"]["per_step"] == expected.per_step
    assert comm["per_step"] == as_table(expected.per_step), (comm["per_step"], expected.per_step)
    assert comm["first_step"] == as_table(expected.first_step)
    assert summary["comm_model_matches"] is True and comm["constant"] is True
    steps = summary["steps"]
    first, per = expected.first_step, expected.per_step
    for kind in per:
        total = next(r for r in comm["total"] if r["kind"] == kind)
        assert total["bytes"] == first[kind]["bytes"] + (steps - 1) * per[kind]["bytes"]
    rows = read_csv(out_dir / outputs.TRAINING_CSV)
    assert [int(r["comm_bytes"]) for r in rows] == [sum(v["bytes"] for v in first.values())] + \
        [expected.bytes_per_step] * (steps - 1)
    assert all(float(r["comm_time_s"]) > 0 for r in rows)
    assert 0 < summary["comm_share"] < 1 and summary["comm_time_s"] > 0
    sync = comm["trainer"]["per_step"][-1]
    assert sync["kind"] == "all_reduce" and sync["sizes"][-1] == 5 * 8  # loss and four flags, float64
    return summary
