"""validation.analysis.attribution against its definition: shares of step time sum to 1, nested ranges are not
counted twice, and a GPU trace's device-side copies of the ranges are not steps."""

import pytest

from validation.analysis.attribution import attribute_events


def ev(name, ts, dur, tid=1, pid=1, cat="user_annotation"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "cat": cat}


def host_steps():
    """Two steps of 100 us: attention 40 (importance 10 nested in selection, an mm nested in it), GEMM 20, idle 40."""
    out = []
    for t0 in (0, 200):
        out += [ev("nsa.step", t0, 100), ev("nsa.sel", t0 + 10, 40), ev("nsa.sel.importance", t0 + 12, 10),
                ev("aten::mm", t0 + 14, 4, cat="cpu_op"), ev("aten::addmm", t0 + 60, 20, cat="cpu_op")]
    return out


def test_shares_sum_to_one_and_nested_ranges_are_not_counted_twice():
    out = attribute_events(host_steps())
    c = out["categories"]
    assert out["steps"] == 2 and out["step_time_ms"] == pytest.approx(0.1)
    assert sum(c.values()) == pytest.approx(1.0)
    assert c["importance and top-k"] == pytest.approx(0.1) and c["attention branches"] == pytest.approx(0.3)
    assert c["MLP/GEMM"] == pytest.approx(0.2) and c["idle"] == pytest.approx(0.4)


def test_a_gpu_traces_device_copies_of_the_ranges_are_not_steps():
    """On a GPU, Kineto writes every record_function range (nsa.step, nsa.sel, ...) again as a gpu_user_annotation
    over its kernels: they were counted as more steps and their kernels' time as host step time."""
    gpu = []
    for t0 in (0, 200):
        gpu += [ev("nsa.step", t0 + 5, 150, tid=7, pid=0, cat="gpu_user_annotation"),
                ev("nsa.sel", t0 + 20, 60, tid=7, pid=0, cat="gpu_user_annotation"),
                ev("void flash_kernel", t0 + 20, 60, tid=7, pid=0, cat="kernel")]
    assert attribute_events(host_steps() + gpu) == attribute_events(host_steps())
