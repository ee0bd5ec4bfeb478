"""The comm kind's Result (validation.kinds.comm): every committed comm step record decodes strictly into it and
encodes back unchanged (the whole step entry: its frame, metrics and artifacts, keys in the same order, numbers of
the same JSON type); the metrics are typed (a Collective per collective, a Row per size)."""

from __future__ import annotations

import json

from validation.kinds import get
from validation.kinds.comm import Collective, Metrics, Result, Row, WORLD_ONE_NOTE, summarize
from validation.results.codec import decode, encode
from results_records import committed_steps


def test_every_committed_comm_step_decodes_strictly_and_encodes_back_unchanged():
    seen = 0
    for where, step in committed_steps("comm"):
        result = decode(Result, step, where)
        assert json.dumps(encode(result)) == json.dumps(step), where
        assert isinstance(result.metrics, Metrics) and result.metrics.collectives(), where
        assert all(isinstance(c, Collective) and all(isinstance(r, Row) for r in c.table)
                   for c in result.metrics.collectives().values()), where
        assert get("comm").read(step) == result
        seen += 1
    assert seen >= 1


def test_a_result_encodes_its_metrics_as_the_dict_writer_did():
    """What run() returns for a one-rank torch run and a run without comm.json: the keys the dict writer wrote, in
    its order (a step that never ran reads as blank metrics and writes none)."""
    row = {"bytes": 4096, "time_s": 0.001, "algbw_gbps": 0.004, "busbw_gbps": 0.0}
    m = Metrics(world_size=1, backend="gloo", source="torch", device="cpu", iters=2, warmup=1, compute_ms=0.0,
                threads=2, all_reduce=summarize("all_reduce", [row]), note=WORLD_ONE_NOTE)
    assert list(encode(m)) == ["world_size", "backend", "source", "device", "iters", "warmup", "compute_ms",
                               "threads", "all_reduce", "note"]
    assert encode(m)["all_reduce"] == {"table": [row], "busbw_gbps": {"max": 0.0, "median": 0.0},
                                       "algbw_gbps": {"max": 0.004, "median": 0.004}, "latency_us": 1000.0,
                                       "sizes": 1}
    assert encode(Metrics(world_size=2, backend=None, source="torch")) == {"world_size": 2, "backend": None,
                                                                           "source": "torch"}
    assert encode(Metrics()) == {} and encode(Result())["metrics"] == {}
