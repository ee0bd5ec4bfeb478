"""The comm step's reduction against hand-computed bandwidths: nccl-tests' conventions (algbw = bytes / time in GB/s
of 1e9 bytes, busbw = algbw x 2(n-1)/n for all-reduce, (n-1)/n for all-gather and reduce-scatter, 1 for broadcast),
an nccl-tests table parsed, and the torch benchmark's comm.json read only when this launch wrote it."""

from __future__ import annotations

import json
import os
import time
from types import SimpleNamespace

import pytest

from validation import kinds
from validation.analysis import collectives, nccl_tests
from validation.kinds.comm import Options


@pytest.mark.parametrize("kind, n, factor", [("all_reduce", 8, 1.75), ("all_reduce", 2, 1.0), ("all_gather", 4, 0.75),
                                             ("reduce_scatter", 8, 0.875), ("broadcast", 8, 1.0),
                                             ("all_reduce", 1, 0.0)])
def test_bandwidth_row_by_hand(kind, n, factor):
    row = collectives.bandwidth_row(kind, n, 1 << 20, 100e-6)  # 1 MiB in 100 us: 10.48576 GB/s (not GiB/s)
    assert row["algbw_gbps"] == pytest.approx(10.48576)
    assert row["busbw_gbps"] == pytest.approx(10.48576 * factor)


NCCL_OUT = """\
# nThread 1 nGpus 8 minBytes 1048576 maxBytes 2097152 step: 2(factor) warmup iters: 5 iters: 20
#  Rank  0 Group  0 Pid  12345 on    host1 device  0 [0x18] NVIDIA H100 80GB HBM3
#  Rank  1 Group  0 Pid  12345 on    host1 device  1 [0x2a] NVIDIA H100 80GB HBM3
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
     2097152        524288     float     sum      -1    150.0   13.98   24.47      0    149.0   14.07   24.63      0
     1048576        262144     float     sum      -1    100.0   10.49   18.35      0    99.00   10.59   18.54      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 21.5
"""


def test_nccl_tests_out_of_place_rows_by_hand():
    """Rows sorted by size, the out-of-place time (not the in-place one), the world size the step gives."""
    parsed = nccl_tests.parse(NCCL_OUT, "all_reduce", world_size=8)
    rows = parsed["rows"]
    assert [r["bytes"] for r in rows] == [1048576, 2097152]
    assert [r["time_s"] for r in rows] == [pytest.approx(100e-6), pytest.approx(150e-6)]
    assert rows[0]["busbw_gbps"] == pytest.approx(1048576 / 100e-6 / 1e9 * 1.75)
    assert rows[1]["algbw_gbps"] == pytest.approx(2097152 / 150e-6 / 1e9)
    assert parsed["avg_busbw_gbps"] == 21.5


def _bench(world=2):
    return {"world_size": world, "backend": "gloo", "device": "cpu", "dtype": "float32", "iters": 5, "warmup": 1,
            "compute_ms": 0.0, "threads": 1,
            "kinds": {"all_reduce": [collectives.bandwidth_row("all_reduce", world, 4096, 1e-4),
                                     collectives.bandwidth_row("all_reduce", world, 8192, 1e-4)]}}


def _run(tmp_path, lr, age_s=0.0):
    step_dir = tmp_path / "comm"
    step_dir.mkdir()
    path = step_dir / "comm.json"
    path.write_text(json.dumps(_bench()))
    if age_s:
        then = time.time() - age_s
        os.utime(path, (then, then))
    spec = SimpleNamespace(argv=["python", "-m", "validation.analysis.comm_bench"], dir="comm", world_size=2)
    ctx = SimpleNamespace(launches=[spec], run_dir=tmp_path, launch=lambda spec, i, n: lr, rel=lambda p: str(p))
    return kinds.get("comm").run(Options(kinds=["all_reduce"]), ctx)


def test_the_benchmarks_own_table_by_hand(tmp_path):
    lr = SimpleNamespace(status="ok", reason=None, duration_s=20.0)
    result = _run(tmp_path, lr)
    c = result.metrics.all_reduce
    assert result.status == "passed"
    # 8192 B in 100 us: 0.08192 GB/s, x 2(2-1)/2 = 1 at two ranks; latency: the smallest size's time
    assert c.busbw_gbps.max == pytest.approx(0.08192) and c.latency_us == pytest.approx(100.0) and c.sizes == 2


def test_an_earlier_launchs_comm_json_is_not_this_launchs_measurement(tmp_path):
    """A --rerun whose benchmark died at once: the comm.json an earlier launch wrote an hour before is not read."""
    lr = SimpleNamespace(status="failed", reason="exited 1", duration_s=20.0)
    result = _run(tmp_path, lr, age_s=3600.0)
    assert (result.status, result.reason) == ("failed", "exited 1")
    assert result.metrics.collectives() == {} and result.metrics.backend is None
