"""The FineWeb-Edu hub stream offline (a stand-in `datasets` module): a loader timeout beyond what a thread wait
takes, and the packing and position of a rank's shard against an independent byte-level model of the stream."""

import random
import sys
import threading
import types

import torch

from nsa.training.config import DataConfig
from nsa.training.data import build_source


class _Shard:
    """A rank's shard of the hub stream: {"text": ...} records, re-iterable; `skip(n)` only where `skippable`;
    each pass starts once `gate` (an Event) is set."""

    def __init__(self, docs, skippable=True, gate=None):
        self.docs, self.skippable, self.gate = list(docs), skippable, gate

    def __getattr__(self, name):
        if name == "skip" and self.__dict__.get("skippable"):
            return lambda n: _Shard(self.docs[n:], True)
        raise AttributeError(name)

    def __iter__(self):
        if self.gate is not None:
            self.gate.wait(30)
        return iter({"text": d} for d in self.docs)


def _hub(monkeypatch, docs, skippable=True, gate=None):
    mod, dist = types.ModuleType("datasets"), types.ModuleType("datasets.distributed")
    mod.load_dataset = lambda *args, **kwargs: _Shard(docs, skippable, gate)
    dist.split_dataset_by_node = lambda ds, rank, world_size: _Shard(ds.docs[rank::world_size], skippable, ds.gate)
    mod.distributed = dist
    monkeypatch.setitem(sys.modules, "datasets", mod)
    monkeypatch.setitem(sys.modules, "datasets.distributed", dist)


def _windows(src):
    inputs, targets = src.next_batch()
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    return [bytes(inputs[r].tolist() + [int(targets[r, -1])]) for r in range(inputs.shape[0])]


def test_a_loader_timeout_longer_than_a_thread_wait_takes_still_streams(monkeypatch):
    # loader_timeout_s accepts any finite number of seconds; 1e10 s is past threading.TIMEOUT_MAX (about 9.2e9 s),
    # where opening the stream (a thread join) and each batch (a queue wait) raised OverflowError
    for timeout in (1e10, 1e300):
        gate = threading.Event()  # the first batch comes late: next_batch has to wait for it
        _hub(monkeypatch, ["abcdefg", "hij"], gate=gate)
        src = build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=timeout), vocab_size=256, seq_len=4,
                           batch_size=2, rank=0, world_size=1, seed=0)
        timer = threading.Timer(0.05, gate.set)
        timer.start()
        try:
            # "abcdefg\0hij\0" then the next pass: windows of 5 bytes every 4
            assert _windows(src) == [b"abcde", b"efg\0h"]
            assert _windows(src) == [b"hij\0a", b"abcde"]
        finally:
            timer.cancel()
            gate.set()
            src.close()


def _expected(shard, skip, seq_len, batch_size, batches):
    """The batches and positions the stream should give, computed byte by byte: the rank's shard repeated pass
    after pass from document `skip` (counted across passes), every non-empty document's UTF-8 bytes followed by a
    NUL, windows of seq_len + 1 bytes every seq_len bytes; the position after a batch counts the documents up to
    and including the one its last window ends in (empty ones included)."""
    stream, ends, i = bytearray(), [], skip
    while len(stream) < batches * batch_size * seq_len + 1:
        doc = shard[i % len(shard)].encode()
        if doc:
            stream += doc + b"\0"
            ends.append((len(stream), i))
        i += 1
    out = []
    for b in range(batches):
        ks = range(b * batch_size, (b + 1) * batch_size)
        last_end = ks[-1] * seq_len + seq_len + 1
        end, j = next((end, j) for end, j in ends if end >= last_end)
        out.append(([bytes(stream[k * seq_len:k * seq_len + seq_len + 1]) for k in ks], j + 1,
                    end - (ks[-1] + 1) * seq_len))
    return out


def test_every_rank_packs_and_resumes_its_shard_as_the_byte_model_says(monkeypatch):
    rng = random.Random(7)
    pieces = ["", "a", "bc", "defgh", "\u00e9\u00e9", "ijklmnopqrstuvw", "\U0001d11e"]
    checked = 0
    while checked < 24:
        world = rng.choice([1, 2, 3])
        rank = rng.randrange(world)
        docs = [rng.choice(pieces) for _ in range(rng.randint(world, 10))]
        shard = docs[rank::world]
        if not any(shard):
            continue
        seq_len, batch_size = rng.randint(1, 9), rng.randint(1, 3)
        skip = rng.choice([0, rng.randint(1, 3 * len(shard))])  # a resume: mid-pass, at a wrap or passes later
        skippable = rng.random() < 0.5
        _hub(monkeypatch, docs, skippable)
        src = build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=10), vocab_size=256, seq_len=seq_len,
                           batch_size=batch_size, rank=rank, world_size=world, seed=0)
        try:
            if skip:
                src.load_state_dict({"kind": "fineweb_edu_stream", "docs_consumed": skip})
            for windows, docs_consumed, tail in _expected(shard, skip, seq_len, batch_size, 5):
                assert _windows(src) == windows, (docs, rank, world, seq_len, batch_size, skip, skippable)
                assert src.state_dict() == {"kind": "fineweb_edu_stream", "docs_consumed": docs_consumed,
                                            "tail_bytes": tail}
        finally:
            src.close()
        checked += 1


class _FileShardedStream:
    """datasets' streaming IterableDataset of one document per file, as its source (datasets.iterable_dataset) has
    it: `split_dataset_by_node(ds, rank, world_size)` keeps files rank, rank + world_size, ... where the file count is
    a multiple of world_size, else every world_size-th document from the rank-th; `skip(n)` after that split builds
    a SkipExamplesIterable with split_when_sharding=False, which leaves out the first n documents of the whole stream
    and whose shard_data_sources returns itself (the rank's file selection is dropped)."""

    def __init__(self, docs, rank=0, world_size=1, skipped=0):
        self.docs, self.rank, self.world_size, self.skipped = list(docs), rank, world_size, skipped

    def skip(self, n):
        return _FileShardedStream(self.docs, self.rank, self.world_size, self.skipped + n)

    def __iter__(self):
        whole = self.docs[self.skipped:]
        if self.skipped and len(self.docs) % self.world_size == 0:
            return iter({"text": d} for d in whole)
        return iter({"text": d} for d in whole[self.rank::self.world_size])


def test_a_resume_skips_documents_of_the_ranks_own_shard(monkeypatch):
    for n_files in (8, 7):  # a multiple of the 2 ranks (sharded by files) and not (every other document)
        docs = [f"doc{i}" for i in range(n_files)]
        mod, dist = types.ModuleType("datasets"), types.ModuleType("datasets.distributed")
        mod.load_dataset = lambda *args, **kwargs: _FileShardedStream(docs)
        dist.split_dataset_by_node = lambda ds, rank, world_size: _FileShardedStream(ds.docs, rank, world_size)
        mod.distributed = dist
        monkeypatch.setitem(sys.modules, "datasets", mod)
        monkeypatch.setitem(sys.modules, "datasets.distributed", dist)
        for rank in (0, 1):
            shard = docs[rank::2]  # this rank's documents: doc0, doc2, ... on rank 0
            src = build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=10), vocab_size=256, seq_len=4,
                               batch_size=1, rank=rank, world_size=2, seed=0)
            try:
                assert _windows(src) == [shard[0].encode() + b"\0"]
                # resumed past two of its documents, the rank goes on with its third, doc4 or doc5 (not the whole
                # stream's third, doc2, which rank 0 read before and which both ranks would read now)
                src.load_state_dict({"kind": "fineweb_edu_stream", "docs_consumed": 2})
                assert _windows(src) == [shard[2].encode() + b"\0"], (n_files, rank)
                assert src.state_dict() == {"kind": "fineweb_edu_stream", "docs_consumed": 3, "tail_bytes": 1}
            finally:
                src.close()
