"""summary.json and timeline.json figures against hand-computed values (SUMMARY_FIELDS / TIMELINE_FIELDS)."""

from __future__ import annotations

import pytest

from nsa.training import comm_count, outputs, timeline
from nsa.training.summary import SummaryAccumulator


def _acc(**kw) -> SummaryAccumulator:
    args = dict(parallel="none", world_size=1, device_type="cpu", tokens_per_step=8, samples_per_step=2,
                steps_planned=10)
    return SummaryAccumulator(**{**args, **kw})


def test_figures_of_a_resumed_run_are_its_own_steps_by_hand(tmp_path):
    """Steps 4, 5, 6 of a run resumed at 3: times 2.0, 0.5, 1.5 s; losses 3, 2, 1; RSS 1, 2, 3 GiB."""
    acc = _acc()
    for step, dt, loss, mem in ((4, 2.0, 3.0, 1.0), (5, 0.5, 2.0, 2.0), (6, 1.5, 1.0, 3.0)):
        acc.add(step, dt, 8 / dt, loss, mem, None)
    acc.set_peaks(3.5, None)
    s = acc.build("completed", None, None, None, None)
    assert (s["steps"], s["first_step"], s["last_step"], s["steps_planned"]) == (3, 4, 6, 10)
    assert s["avg_step_time_s"] == pytest.approx(4.0 / 3)
    assert (s["min_step_time_s"], s["max_step_time_s"]) == (0.5, 2.0)
    assert s["avg_step_time_excl_first_s"] == pytest.approx(1.0)  # (0.5 + 1.5) / 2
    assert s["tokens_per_s"] == pytest.approx(24 / 4.0)  # 3 steps x 8 tokens over 4 s
    assert s["samples_per_s"] == pytest.approx(6 / 4.0)
    assert s["mean_step_toks_per_s"] == pytest.approx((4 + 16 + 8 / 1.5) / 3)
    assert (s["avg_loss"], s["final_loss"]) == (2.0, 1.0)
    assert (s["avg_mem_alloc_gb"], s["peak_mem_alloc_gb"]) == (2.0, 3.5)
    assert s["peak_mem_reserved_gb"] is None and s["avg_mem_reserved_gb"] is None  # nothing reserved on CPU
    outputs.write_json(tmp_path / outputs.SUMMARY_JSON, s)
    assert outputs.read_summary(tmp_path)["steps"] == 3


def test_one_step_zero_steps_and_the_comm_share_by_hand(tmp_path):
    one = _acc(device_type="cuda")
    one.add(1, 0.25, 32.0, 4.0, 1.0, 2.0)
    one.set_peaks(1.5, 2.5)
    s = one.build("completed", None, None, None, None)
    assert s["avg_step_time_excl_first_s"] is None and s["avg_step_time_s"] == 0.25 and s["tokens_per_s"] == 32.0
    assert (s["avg_mem_reserved_gb"], s["peak_mem_reserved_gb"], s["memory_kind"]) == (2.0, 2.5, "cuda")

    none = _acc(parallel="ddp", world_size=2).build("crashed", comm_count.CommCounter(measure_time=True),
                                                     "ddp_comm_hook", None, None)
    assert none["steps"] == 0 and none["tokens_per_s"] is None and none["comm_share"] is None
    outputs.write_json(tmp_path / outputs.SUMMARY_JSON, none)
    assert outputs.read_summary(tmp_path)["status"] == "crashed"

    counter = comm_count.CommCounter(measure_time=True)
    acc = _acc(parallel="ddp", world_size=2)
    for step, dt in ((1, 0.75), (2, 0.25)):
        counter.begin_step()
        counter.issue("all_reduce", 64)
        counter.end_step()
        acc.add(step, dt, 8 / dt, 1.0, 1.0, None)
    counter.time_total_s = 0.25  # the collectives' time, set: the share is that over the 1.0 s of steps
    s = acc.build("completed", counter, "ddp_comm_hook", None, None)
    assert s["comm_time_s"] == 0.25 and s["comm_share"] == pytest.approx(0.25)
    assert s["comm"]["total"] == [{"kind": "all_reduce", "calls": 2, "bytes": 128}]


def test_timeline_document_orders_milestones_and_names_the_slowest_rank(tmp_path):
    tl = timeline.Timeline()
    tl.marks = {"setup_done": 3.0, "imports_done": 1.0, "model_built": 2.0}  # marked out of order
    rank1 = {"imports_done": 1.5, "model_built": 1.8, "setup_done": 3.5}
    doc = timeline.document(tl, [dict(tl.marks), rank1], 2)
    assert list(doc["milestones"]) == ["process_start", "imports_done", "model_built", "setup_done"]
    assert doc["slowest"]["imports_done"] == {"rank": 1, "s": 1.5}
    assert doc["slowest"]["model_built"] == {"rank": 0, "s": 2.0}
    assert doc["time_to_first_step_s"] is None  # no step: the run stopped before
    outputs.write_json(tmp_path / outputs.TIMELINE_JSON, doc)
    read = outputs.read_timeline(tmp_path)
    assert read["missing_milestones"] == ["process_group_ready", "model_on_device", "model_wrapped",
                                          "first_forward", "first_optimizer_step", "first_logged_step"]
    first = tl.mark("imports_done")  # a later mark of a milestone is ignored
    assert first == 1.0
