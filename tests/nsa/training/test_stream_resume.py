"""The FineWeb-Edu hub stream (a stand-in `datasets` module, offline) resumed from a saved position hands out exactly
the batches an uninterrupted run hands out next: mid-document, deep (passes later, across the stream's wrap) and on
every rank of 1, 2 and 3, checked against an independent byte-level model of each rank's packed shard; and a
training run on the stream halted and resumed takes the steps of the run never stopped."""

import random
import sys
import types

import pytest
import yaml

from train_utils import TINY, heartbeats

from nsa.training import cli as train
from nsa.training import trainer as trainer_module
from nsa.training.checkpoint import latest_checkpoint
from nsa.training.config import DataConfig, DataError
from nsa.training.data import build_source


class _Shard:
    """A rank's shard of the hub stream: {"text": ...} records, the same order on every pass."""

    def __init__(self, docs):
        self.docs = list(docs)

    def __iter__(self):
        return iter({"text": d} for d in self.docs)


def _hub(monkeypatch, docs):
    mod, dist = types.ModuleType("datasets"), types.ModuleType("datasets.distributed")
    mod.load_dataset = lambda *args, **kwargs: _Shard(docs)
    dist.split_dataset_by_node = lambda ds, rank, world_size: _Shard(ds.docs[rank::world_size])
    mod.distributed = dist
    monkeypatch.setitem(sys.modules, "datasets", mod)
    monkeypatch.setitem(sys.modules, "datasets.distributed", dist)


def _stream(seq_len, batch_size, rank, world):
    return build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=10), vocab_size=256, seq_len=seq_len,
                        batch_size=batch_size, rank=rank, world_size=world, seed=0)


def _windows(src):
    inputs, targets = src.next_batch()
    return [bytes(inputs[r].tolist() + [int(targets[r, -1])]) for r in range(inputs.shape[0])]


def _model(shard, seq_len, batch_size, batches):
    """The rank's batches byte by byte: its shard pass after pass, each non-empty document's UTF-8 bytes and a NUL,
    windows of seq_len + 1 bytes every seq_len bytes, batch_size windows a batch."""
    stream, i = bytearray(), 0
    while len(stream) < batches * batch_size * seq_len + 1:
        doc = shard[i % len(shard)].encode()
        if doc:
            stream += doc + b"\0"
        i += 1
    return [[bytes(stream[k * seq_len:k * seq_len + seq_len + 1]) for k in range(b * batch_size, (b + 1) * batch_size)]
            for b in range(batches)]


def test_a_resumed_stream_hands_out_the_batches_of_an_uninterrupted_run(monkeypatch):
    rng = random.Random(11)
    pieces = ["", "a", "bc", "defgh", "\u00e9\u00e9", "ijklmnopqrstuvwxyz0123456789", "\U0001d11e"]
    for case in range(12):
        world = [1, 2, 3][case % 3]
        docs = [rng.choice(pieces[1:])] * world + [rng.choice(pieces) for _ in range(rng.randint(world, 12))]
        _hub(monkeypatch, docs)
        seq_len, batch_size = rng.randint(2, 9), rng.randint(1, 3)
        step = rng.choice([1, 2, 5, 17])  # 17 batches: several passes over a shard of a few documents
        for rank in range(world):
            expected = _model(docs[rank::world], seq_len, batch_size, step + 4)
            first = _stream(seq_len, batch_size, rank, world)
            try:
                for b in range(step):
                    assert _windows(first) == expected[b]
                state = first.state_dict()
            finally:
                first.close()
            resumed = _stream(seq_len, batch_size, rank, world)
            try:
                resumed.load_state_dict(state)
                for b in range(step, step + 4):
                    assert _windows(resumed) == expected[b], (docs, world, rank, seq_len, batch_size, step, state)
            finally:
                resumed.close()


def test_a_position_resumed_twice_goes_on_exactly(monkeypatch):
    # a resumed run that saves again and is resumed again (the position of a position)
    docs = ["one long document " * 3, "two", "", "three!"]
    _hub(monkeypatch, docs)
    expected = _model(docs, 7, 2, 9)
    src = _stream(7, 2, 0, 1)
    for b in range(3):
        assert _windows(src) == expected[b]
    for b in range(3, 9, 2):
        state = src.state_dict()
        src.close()
        src = _stream(7, 2, 0, 1)
        src.load_state_dict(state)
        assert _windows(src) == expected[b]
        assert _windows(src) == expected[b + 1]
    src.close()


@pytest.mark.parametrize("tail, match", [(-1, "tail_bytes must be an integer >= 0, got -1"),
                                         ("3", "tail_bytes must be an integer >= 0, got '3'"),
                                         (5, "tail_bytes=5 but docs_consumed=0")])
def test_a_damaged_stream_position_is_refused_naming_the_key(monkeypatch, tail, match):
    _hub(monkeypatch, ["abcdef"])
    src = _stream(4, 1, 0, 1)
    try:
        with pytest.raises(DataError, match=match):
            src.load_state_dict({"kind": "fineweb_edu_stream", "docs_consumed": 0, "tail_bytes": tail})
    finally:
        src.close()


def test_a_position_with_more_tail_than_its_documents_hold_is_an_error_not_other_data(monkeypatch):
    _hub(monkeypatch, ["abc", "defgh"])
    src = _stream(4, 1, 0, 1)
    try:
        src.load_state_dict({"kind": "fineweb_edu_stream", "docs_consumed": 1, "tail_bytes": 9})  # "abc\0" is 4
        with pytest.raises(DataError, match=r"tail_bytes=9 but the first 1 documents .* pack into only 4 bytes"):
            src.next_batch()
    finally:
        src.close()


def test_a_training_run_on_the_stream_halted_and_resumed_is_the_uninterrupted_run(tmp_path, monkeypatch):
    # the trainer end to end: its step losses after the resume are those of a run never stopped (the same tokens in
    # the same order), on a shard whose documents are longer than a window, so every checkpoint falls mid-document
    rng = random.Random(3)
    words = ["sparse", "native", "attention", "token", "block", "window", "select", "compress"]
    _hub(monkeypatch, [" ".join(rng.choice(words) for _ in range(rng.randint(5, 40))) for _ in range(30)])
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"steps": 6, "save_every": 2, "keep_checkpoints": 10, "accum": 1, "batch_size": 2,
                         "seq_len": 32, "eval_every": 0, "warmup_steps": 1, "log_every": 1})
    raw["data"] = {"dataset": "fineweb_edu", "loader_timeout_s": 30}
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert train.main(["--config", str(cfg), "--out-dir", str(full)]) == 0
    with monkeypatch.context() as mp:  # .HALT once step 2 is recorded, seen at step 3: its checkpoint, then exit
        record = trainer_module.Trainer._record

        def record_then_halt(self, step, *args, **kwargs):
            record(self, step, *args, **kwargs)
            if step == 2:
                (self.out / ".HALT").write_text("stop")
        mp.setattr(trainer_module.Trainer, "_record", record_then_halt)
        assert train.main(["--config", str(cfg), "--out-dir", str(cut)]) == 0
    assert latest_checkpoint(cut).name == "step_00000003"
    assert train.main(["--config", str(cfg), "--out-dir", str(cut), "--resume"]) == 0

    def losses(out):
        return {h["step"]: (h["loss"], h["grad_norm"]) for h in heartbeats(out, 0) if h["msg"] == "step"}
    got, want = losses(cut), losses(full)
    assert sorted(got) == list(range(1, 7))
    assert got == want
