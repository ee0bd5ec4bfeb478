"""The parallelism kind's Result (validation.kinds.parallelism.records): every committed parallelism step record
decodes strictly into it and encodes back unchanged (the whole step entry: its frame, metrics, runs and run order,
keys in the same order, numbers of the same JSON type); a pair not compared keeps the note it was written as."""

from __future__ import annotations

import json

from validation.kinds import get
from validation.kinds.parallelism.records import Compared, Metrics, NotCompared, Result
from validation.results.codec import decode, encode
from results_records import committed_steps


def test_every_committed_parallelism_step_decodes_strictly_and_encodes_back_unchanged():
    seen = 0
    for where, step in committed_steps("parallelism"):
        result = decode(Result, step, where)
        assert json.dumps(encode(result)) == json.dumps(step), where
        assert all(isinstance(c, Compared) for c in result.metrics.comparisons.values()), where
        assert get("parallelism").read(step) == result
        seen += 1
    assert seen >= 1


def test_a_pair_not_compared_is_written_as_its_note():
    note = {"text": "not compared: a run without a measurement", "significant": False}
    m = decode(Metrics, {"comparisons": {"fsdp:ddp": note, "fsdp_no_reshard:ddp": {"baseline": "ddp", "rel": 0.1}}})
    assert isinstance(m.comparisons["fsdp:ddp"], NotCompared) and m.comparisons["fsdp:ddp"].text == note["text"]
    assert isinstance(m.comparisons["fsdp_no_reshard:ddp"], Compared) and m.comparisons["fsdp_no_reshard:ddp"].rel == 0.1
    assert encode(m)["comparisons"]["fsdp:ddp"] == note
