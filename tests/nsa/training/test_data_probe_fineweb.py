"""FineWeb-Edu against hand-built inputs: the hub stream offline (a stand-in `datasets` module) packed byte by byte,
a shard of empty documents, local parquet shards in an unexpected order."""

import sys
import types

import pytest
import torch

from nsa.training.config import DataConfig, DataError
from nsa.training.data import build_source


class _Shard:
    """A rank's shard of the hub stream: {"text": ...} records, with `skip(n)` as datasets' IterableDataset has."""

    def __init__(self, docs):
        self.docs = list(docs)

    def skip(self, n):
        return _Shard(self.docs[n:])

    def __iter__(self):
        return iter({"text": d} for d in self.docs)


def _hub(monkeypatch, docs):
    mod, dist = types.ModuleType("datasets"), types.ModuleType("datasets.distributed")
    mod.load_dataset = lambda *args, **kwargs: _Shard(docs)
    dist.split_dataset_by_node = lambda ds, rank, world_size: _Shard(ds.docs[rank::world_size])
    mod.distributed = dist
    monkeypatch.setitem(sys.modules, "datasets", mod)
    monkeypatch.setitem(sys.modules, "datasets.distributed", dist)


def _stream(**kw):
    args = dict(vocab_size=256, seq_len=8, batch_size=3, rank=0, world_size=1, seed=0)
    args.update(kw)
    return build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=10), **args)


def _windows(src, batches):
    out = []
    for _ in range(batches):
        inputs, targets = src.next_batch()
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        out += [bytes(inputs[r].tolist() + [int(targets[r, -1])]) for r in range(inputs.shape[0])]
    return out


def test_the_hub_stream_packs_long_unicode_and_empty_documents_byte_by_byte(monkeypatch):
    # rank 1 of 2 takes documents 1, 3, 5: "é" * 30 (60 bytes, longer than several windows), "" (skipped), "𝄞x"
    docs = ["skip", "\u00e9" * 30, "skip", "", "skip", "\U0001d11ex"]
    _hub(monkeypatch, docs)
    src = _stream(rank=1, world_size=2)
    one_pass = ("\u00e9" * 30).encode() + b"\0" + "\U0001d11ex".encode() + b"\0"  # 61 + 6 = 67 bytes
    by_hand = one_pass * 3
    got = _windows(src, 4)  # 12 windows of 9 bytes, stride 8: bytes 0..96, into the second pass
    assert got == [by_hand[8 * k:8 * k + 9] for k in range(12)]
    # the position counts the shard's documents packed so far (empty ones too), across passes: 3 in the first
    # pass, and the second pass's "é" * 30 began in the last batch
    assert src.state_dict() == {"kind": "fineweb_edu_stream", "docs_consumed": 4, "tail_bytes": 32}
    src.close()


def test_a_shard_of_empty_documents_is_an_error_not_a_wait(monkeypatch):
    _hub(monkeypatch, ["", ""])
    src = _stream()
    try:
        for _ in range(2):  # the error sticks
            with pytest.raises(DataError, match=r"2 document\(s\) for rank 0 of 1 are all empty \(field 'text'\)"):
                src.next_batch()
    finally:
        src.close()


def test_a_resume_that_skips_to_a_run_of_empty_documents_goes_on_to_the_next_pass(monkeypatch):
    _hub(monkeypatch, ["abcd", "", ""])
    src = _stream(seq_len=4, batch_size=1)
    try:
        src.load_state_dict({"kind": "fineweb_edu_stream", "docs_consumed": 1})  # the rest of the pass is empty
        assert _windows(src, 2) == [b"abcd\0", b"\0abcd"]
    finally:
        src.close()


def test_local_parquet_shards_are_read_in_sorted_path_order_whatever_their_names(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    shards = {"train-10.parquet": ["ten"], "train-2.parquet": ["two"], "train-1.parquet": [],  # an empty shard
              "a/x.parquet": ["sub"]}
    for name in reversed(list(shards)):  # written in yet another order
        (tmp_path / name).parent.mkdir(exist_ok=True)
        pq.write_table(pa.table({"text": pa.array(shards[name], pa.string())}), tmp_path / name)
    # sorted by path: a/x, train-1 (empty), train-10, train-2 ("10" before "2": names, not numbers)
    expected = b"sub\0ten\0two\0"
    for path in (tmp_path, tmp_path / "**" / "*.parquet"):
        src = build_source(DataConfig(dataset="fineweb_edu", path=str(path)), vocab_size=256,
                           seq_len=len(expected) - 1, batch_size=1, rank=0, world_size=1, seed=0)
        assert _windows(src, 1) == [expected]
    with pytest.raises(DataError, match=r"fineweb_edu: path .*train-3\.parquet does not exist"):
        build_source(DataConfig(dataset="fineweb_edu", path=str(tmp_path / "train-3.parquet")), vocab_size=256,
                     seq_len=4, batch_size=1, rank=0, world_size=1, seed=0)
