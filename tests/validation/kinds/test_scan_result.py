"""The scan kind's Result (validation.kinds.scan): every committed scan step record decodes strictly into it and
encodes back unchanged (the whole step entry: its frame, metrics, runs and run order, keys in the same order, numbers
of the same JSON type); the metrics are typed (a Point per value, the fit, the pairs, the bisection)."""

from __future__ import annotations

import json

from validation.kinds import get
from validation.kinds.scan import ExponentFit, Metrics, PairRecord, Point, Result
from validation.results.codec import decode, encode
from results_records import committed_steps


def test_every_committed_scan_step_decodes_strictly_and_encodes_back_unchanged():
    seen = 0
    for where, step in committed_steps("scan"):
        result = decode(Result, step, where)
        assert json.dumps(encode(result)) == json.dumps(step), where
        m = result.metrics
        assert isinstance(m, Metrics) and m.points and all(isinstance(p, Point) for p in m.points), where
        assert isinstance(m.exponent_fit, ExponentFit) and all(isinstance(p, PairRecord) for p in m.pairs), where
        assert {r.source for r in result.runs} <= {"scan", "bisect"}, where
        assert get("scan").read(step) == result
        seen += 1
    assert seen >= 1


def test_a_scan_that_found_no_exponent_writes_its_reason_where_the_dict_writer_did():
    m = Metrics(setting="args.seq_len", values=[64, 128], repeats=1, expected_exponent=1.5, cliff=False,
                cliff_localised=False, exponent_reason="no exponent: too few runs",
                cliff_reason="no cliff detection: too few runs", runs=2, passed=0)
    assert list(encode(m)) == ["setting", "values", "repeats", "expected_exponent", "exponent", "exponent_ci",
                               "exponent_fit", "cliff", "cliff_pair", "cliff_interval", "cliff_localised",
                               "bisection", "pairs", "exponent_reason", "cliff_reason", "points", "runs", "passed"]
