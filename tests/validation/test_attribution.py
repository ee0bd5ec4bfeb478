"""validation.analysis.attribution on a synthetic trace with known shares."""

from validation.analysis.attribution import attribute_events


def ev(name, ts, dur, tid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def test_shares_of_step_time_by_category_and_range():
    events = [ev("nsa.step", 0, 100),
              ev("nsa.sel", 10, 30), ev("nsa.sel.importance", 12, 10), ev("aten::mm", 14, 4),  # mm inside importance
              ev("aten::addmm", 50, 20), ev("Optimizer.step#AdamW.step", 80, 10), ev("aten::add", 95, 5),
              ev("aten::mm", 0, 100, tid=2)]  # another thread: not the step's
    out = attribute_events(events)
    c = out["categories"]
    assert out["steps"] == 1 and out["step_time_ms"] == 0.1
    assert c["importance and top-k"] == 0.10 and c["attention branches"] == 0.20
    assert c["MLP/GEMM"] == 0.20 and c["optimizer"] == 0.10 and c["other"] == 0.05
    assert abs(c["idle"] - 0.35) < 1e-12 and abs(sum(c.values()) - 1.0) < 1e-12
    assert out["ranges"] == {"nsa.sel": 0.30, "nsa.sel.importance": 0.10}


def test_no_step_ranges_gives_an_empty_attribution():
    assert attribute_events([ev("aten::mm", 0, 5)])["steps"] == 0


def test_the_optimizer_range_after_a_step_counts_as_step_time_and_optimizer():
    events = [ev("nsa.step", 0, 80), ev("aten::addmm", 10, 40), ev("nsa.optim", 90, 20),
              ev("aten::add_", 95, 5)]  # an operator of the optimizer step: still the optimizer's time
    out = attribute_events(events)
    assert out["steps"] == 1 and out["step_time_ms"] == 0.1  # 80 + 20 us; the gap between the two is not counted
    c = out["categories"]
    assert c["optimizer"] == 0.2 and c["MLP/GEMM"] == 0.4 and abs(c["idle"] - 0.4) < 1e-12
    assert out["ranges"] == {}


def test_tensor_ops_named_like_a_collective_are_no_communication():
    """aten::broadcast_tensors and aten::broadcast_to are tensor operations (shapes), not collectives: a step of one
    process spending 40 us of 100 in them has no communication; c10d's broadcast and gloo's all-reduce are."""
    events = [ev("nsa.step", 0, 100), ev("aten::broadcast_tensors", 10, 30), ev("aten::broadcast_to", 40, 10),
              ev("c10d::broadcast_", 60, 10), ev("gloo:all_reduce", 80, 10)]
    c = attribute_events(events)["categories"]
    assert c["other"] == 0.4 and c["communication"] == 0.2 and abs(c["idle"] - 0.4) < 1e-12


def test_events_with_a_negative_or_non_finite_duration_are_no_time():
    """A damaged trace's event (dur -200, or NaN) inside a real 600 us aten::mm takes nothing off it, and a
    negative nsa.* range is no range share."""
    events = [ev("nsa.step", 0, 1000), ev("aten::mm", 100, 600), ev("aten::mm", 300, -200),
              ev("nsa.sel", 800, -100), ev("aten::addmm", 900, float("nan"))]
    out = attribute_events(events)
    assert out["categories"]["MLP/GEMM"] == 0.6 and abs(out["categories"]["idle"] - 0.4) < 1e-12
    assert out["ranges"] == {}


def test_a_start_or_duration_past_a_floats_range_is_no_time():
    """An integer a trace's JSON holds past a float's range is no time (formatting.finite: None, not OverflowError),
    in the attribution as in the operator table."""
    from validation.formatting import finite
    from validation.kinds.profile import profile_summary

    assert finite(10 ** 400) is None and finite(10 ** 300) == 1e300
    events = [ev("nsa.step", 0, 1000), ev("aten::mm", 100, 600), ev("aten::mm", 10 ** 400, 5),
              ev("aten::addmm", 200, 10 ** 400)]
    assert attribute_events(events)["categories"]["MLP/GEMM"] == 0.6
    ops = [{**e, "cat": "cpu_op"} for e in events[1:]]
    assert profile_summary(None, events=ops)["top_ops"] == [{"name": "aten::mm", "total_ms": 0.6, "calls": 1}]
