"""The trainer's data pipeline against hand-computed expectations: synthetic samples per rank and batch size,
text windows and their targets, shards, epochs, bounds on a batch, bad corpus files, the hub stream offline."""

import json
import pathlib
import sys
import threading
import types

import pytest
import torch

from nsa.training import data as data_mod
from nsa.training.config import DataConfig, DataError
from nsa.training.data import build_eval_source, build_source


def _synthetic(**kw):
    args = dict(vocab_size=256, seq_len=32, batch_size=2, rank=0, world_size=1, seed=5)
    args.update(kw)
    return build_source(DataConfig(), **args)


def _text(path, **kw):
    args = dict(vocab_size=256, seq_len=4, batch_size=1, rank=0, world_size=1, seed=0)
    args.update(kw)
    cfg = DataConfig(dataset="text", path=str(path), text_key=args.pop("text_key", "text"))
    return build_source(cfg, **args)


def _window(src) -> bytes:
    """The next batch's single window: inputs plus the last target (seq_len + 1 tokens) as bytes."""
    inputs, targets = src.next_batch()
    assert torch.equal(inputs[0, 1:], targets[0, :-1])
    return bytes(inputs[0].tolist() + targets[0, -1:].tolist())


# ------------------------------------------------------------------------------------------ synthetic


def test_synthetic_stream_does_not_depend_on_how_it_is_cut_into_batches():
    # 6 samples as 1 x 6, 2 x 3 and 3 x 2: the same samples in the same order (accumulation splits a step this way)
    whole = _synthetic(batch_size=6).next_batch()[0]
    for batch in (3, 2):
        src = _synthetic(batch_size=batch)
        parts = torch.cat([src.next_batch()[0] for _ in range(6 // batch)])
        assert torch.equal(parts, whole)


def test_synthetic_ranks_see_disjoint_samples_and_eval_is_held_out():
    batches = {r: _synthetic(rank=r, world_size=3, batch_size=4).next_batch()[0] for r in range(3)}
    rows = [tuple(row) for b in batches.values() for row in b.tolist()]
    assert len(set(rows)) == 12  # no sample shared between or within ranks
    held_out = build_eval_source(DataConfig(), vocab_size=256, seq_len=32, batch_size=4, rank=0, world_size=3,
                                 seed=5).next_batch()[0]
    assert not set(map(tuple, held_out.tolist())) & set(rows)


def test_a_micro_batch_beyond_memory_is_refused_at_once(monkeypatch):
    with pytest.raises(DataError, match=r"batch_size=100000000000000000000 .*GiB.*--batch-size"):
        _synthetic(batch_size=10 ** 20)
    # 1 MiB of memory: 24 bytes per token (int64 window, inputs, targets) holds 43,690 tokens
    monkeypatch.setattr(data_mod, "host_memory_bytes", lambda: 1 << 20)
    assert _synthetic(batch_size=1285, seq_len=33).batch_size == 1285  # 1285 * 34 = 43,690 tokens
    with pytest.raises(DataError, match=r"43,724 tokens per micro-batch"):
        _synthetic(batch_size=1286, seq_len=33)
    with pytest.raises(DataError, match=r"seq_len\+1=100001"):
        _synthetic(batch_size=1, seq_len=100_000)


# ------------------------------------------------------------------------------------------ text corpus


@pytest.fixture
def corpus(tmp_path):
    """a.txt then b.jsonl (sorted): "abcdefghij" + NUL, "XYZ" + NUL, (an empty document: skipped), "q" + NUL."""
    (tmp_path / "a.txt").write_text("abcdefghij")
    (tmp_path / "b.jsonl").write_text("\n".join(json.dumps({"text": t}) for t in ("XYZ", "", "q")) + "\n\n")
    return tmp_path


def test_text_windows_by_hand(corpus):
    # 17 tokens, seq_len 4: (17 - 1) // 4 = 4 windows, starting every 4 tokens and 5 tokens long
    expected = [b"abcde", b"efghi", b"ij\0XY", b"YZ\0q\0"]
    src = _text(corpus)
    assert [_window(src) for _ in range(5)] == expected + expected[:1]  # then the next epoch
    assert src.state_dict().items() >= {"kind": "text", "next_window": 1, "epoch": 1, "seq_len": 4}.items()


def test_text_shards_by_hand(corpus):
    two = [_text(corpus, rank=r, world_size=2) for r in range(2)]
    assert [_window(two[0]) for _ in range(3)] == [b"abcde", b"ij\0XY", b"abcde"]
    assert [_window(two[1]) for _ in range(3)] == [b"efghi", b"YZ\0q\0", b"efghi"]
    # three ranks: one window each, the fourth dropped so that every rank's epoch has the same length
    assert [_window(_text(corpus, rank=r, world_size=3)) for r in range(3)] == [b"abcde", b"efghi", b"ij\0XY"]


def test_text_paths_with_glob_characters_that_exist_are_read_as_named(tmp_path):
    # a directory named with brackets (a glob character class) holds the corpus; "c?.txt" beside it is a real glob
    folder = tmp_path / "corpus [v2]"
    folder.mkdir()
    (folder / "a.txt").write_text("abcdefghij")
    (tmp_path / "c1.txt").write_text("XYZ")
    for path in (folder, folder / "a.txt"):
        assert _window(_text(path)) == b"abcde"
    assert _window(_text(tmp_path / "c?.txt", seq_len=2)) == b"XYZ"
    with pytest.raises(DataError, match=r"no files match .*corpus \[v3\]"):
        _text(tmp_path / "corpus [v3]")


def test_text_a_position_beyond_the_corpus_is_refused_also_when_seq_len_changed(corpus):
    # 17 tokens: 4 windows of seq_len 4 (rank 0 of 1), 2 of seq_len 8; a position past them is from other data
    src = _text(corpus, seq_len=8)
    for then, windows in ((4, 4), (8, 2)):
        with pytest.raises(DataError, match=rf"next_window=4 .*only {windows} windows"):
            src.load_state_dict({"kind": "text", "next_window": 4, "epoch": 0, "seq_len": then})
    src.load_state_dict({"kind": "text", "next_window": 3, "epoch": 0, "seq_len": 4})  # tokens 12.. left: epoch 1
    assert src.state_dict().items() >= {"kind": "text", "next_window": 0, "epoch": 1, "seq_len": 8}.items()


@pytest.mark.parametrize("content, what", [
    (b"", r"empty\.txt has 0 tokens .*no text at all"),
    (b"ab", r"short\.txt has 3 tokens .*need at least 5"),
], ids=["empty", "short"])
def test_text_too_little_text_names_the_corpus(tmp_path, content, what):
    name = "empty.txt" if not content else "short.txt"
    (tmp_path / name).write_bytes(content)
    with pytest.raises(DataError, match=what) as err:
        _text(tmp_path / name)
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("content, offset", [
    (bytes(64), 0),  # zeros (a sparse or truncated download): valid UTF-8
    ("plain ASCII text".encode("utf-16-le"), 1),  # UTF-16 without a byte-order mark: valid UTF-8 as well
], ids=["zeros", "utf16"])
def test_text_nul_bytes_are_refused_as_binary(tmp_path, content, offset):
    (tmp_path / "x.txt").write_bytes(content)
    with pytest.raises(DataError, match=rf"x\.txt: holds a NUL byte at offset {offset}, so it is binary"):
        _text(tmp_path / "x.txt")


def test_text_unreadable_files_are_named(tmp_path, monkeypatch):
    (tmp_path / "a.txt").write_text("some text, long enough")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "more text"}) + "\n")

    def denied(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(pathlib.Path, "read_bytes", denied)
    with pytest.raises(DataError, match=r"a\.txt: cannot be read \(Permission denied\)"):
        _text(tmp_path / "a.txt")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda file, *a, **kw: denied() if str(file).endswith(".jsonl")
                        else real_open(file, *a, **kw))
    with pytest.raises(DataError, match=r"b\.jsonl: cannot be read \(Permission denied\)"):
        _text(tmp_path / "b.jsonl")


def test_text_missing_key_names_file_line_and_key(tmp_path):
    (tmp_path / "d.jsonl").write_text(json.dumps({"text": "fine"}) + "\n" + json.dumps({"body": "x"}) + "\n")
    with pytest.raises(DataError, match=r"d\.jsonl:2: no 'text' field \(text_key\); fields present: \['body'\]"):
        _text(tmp_path / "d.jsonl")


def test_text_a_lone_surrogate_is_named_not_a_traceback(tmp_path):
    # "\ud800" is valid JSON (an escaped UTF-16 code unit, as text cut inside a surrogate pair leaves) with no UTF-8
    (tmp_path / "d.jsonl").write_text('{"text": "fine"}\n{"text": "abc\\ud800"}\n')
    with pytest.raises(DataError, match=r"d\.jsonl:2: field 'text' holds a lone UTF-16 surrogate U\+D800 at "
                                        r"character 3, .*expected text") as err:
        _text(tmp_path / "d.jsonl")
    assert "\n" not in str(err.value)
    (tmp_path / "e.json").write_text('[{"text": "fine"}, {"text": "\\udfff!"}]')
    with pytest.raises(DataError, match=r"e\.json: item 1: field 'text' holds a lone UTF-16 surrogate U\+DFFF at "
                                        r"character 0"):
        _text(tmp_path / "e.json")


# ------------------------------------------------------------------------------------------ hub stream


def _fake_hub(monkeypatch, load_dataset):
    """`datasets` standing in for the library: load_dataset as given, one shard holding everything."""
    mod, dist = types.ModuleType("datasets"), types.ModuleType("datasets.distributed")
    mod.load_dataset, dist.split_dataset_by_node, mod.distributed = load_dataset, lambda ds, **kw: ds, dist
    monkeypatch.setitem(sys.modules, "datasets", mod)
    monkeypatch.setitem(sys.modules, "datasets.distributed", dist)


def test_fineweb_opening_a_silent_hub_times_out(monkeypatch):
    gate = threading.Event()

    def load_dataset(*args, **kwargs):  # a network that drops packets: no answer, no error
        gate.wait(30)
        raise ConnectionError("late")

    _fake_hub(monkeypatch, load_dataset)
    try:
        with pytest.raises(DataError, match=r"did not answer within 0\.2 s \(loader_timeout_s.*--data-path"):
            build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=0.2), vocab_size=256, seq_len=8,
                         batch_size=1, rank=0, world_size=1, seed=0)
    finally:
        gate.set()


class _SkippableStream:
    """A shard of documents with `skip(n)`, as datasets' IterableDataset has: the first n documents left out."""

    def __init__(self, docs):
        self.docs = list(docs)

    def skip(self, n):
        return _SkippableStream(self.docs[n:])

    def __iter__(self):
        return iter({"text": d} for d in self.docs)


def test_fineweb_resume_after_the_stream_started_over(monkeypatch):
    # 3 documents of 4 bytes + NUL; seq_len 4: windows start every 4 bytes of "aaaa\0bbbb\0cccc\0aaaa\0..."
    docs = ["aaaa", "bbbb", "cccc"]
    _fake_hub(monkeypatch, lambda *a, **kw: _SkippableStream(docs))
    src = build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=5), vocab_size=256, seq_len=4,
                       batch_size=1, rank=0, world_size=1, seed=0)
    try:
        src.load_state_dict({"kind": "fineweb_edu_stream", "docs_consumed": 4})  # one pass (3) and one document
        assert _window(src) == b"bbbb\0"  # the shard's second document: 4 = 3 + 1 documents skipped
    finally:
        src.close()


def test_fineweb_empty_shard_with_skip_is_an_error_not_a_loop(monkeypatch):
    _fake_hub(monkeypatch, lambda *a, **kw: _SkippableStream([]))
    src = build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=5), vocab_size=256, seq_len=4,
                       batch_size=1, rank=0, world_size=1, seed=0)
    try:
        src.load_state_dict({"kind": "fineweb_edu_stream", "docs_consumed": 2})
        with pytest.raises(DataError, match="yielded no documents for rank 0 of 1"):
            src.next_batch()
    finally:
        src.close()


# ------------------------------------------------------------------------------------------ resume, every rank


@pytest.mark.parametrize("dataset", ["synthetic", "text"])
def test_every_rank_resumes_with_the_batches_of_the_uninterrupted_run(tmp_path, dataset):
    # 3 ranks, batches of 2: 7 batches straight through against 3 batches, a new source, its position, 4 more
    # (the text corpus of 200 tokens gives each rank 6 windows of 10: the resume is at epoch 1's start, and the
    # batches after it run on into epoch 2)
    (tmp_path / "c.txt").write_text("".join(chr(97 + (i * 7) % 26) for i in range(199)))
    cfg = DataConfig() if dataset == "synthetic" else DataConfig(dataset="text", path=str(tmp_path))
    kw = dict(vocab_size=256, seq_len=10, batch_size=2, world_size=3, seed=1)
    for rank in range(3):
        straight = build_source(cfg, rank=rank, **kw)
        expected = [straight.next_batch() for _ in range(7)]
        first = build_source(cfg, rank=rank, **kw)
        for _ in range(3):
            first.next_batch()
        resumed = build_source(cfg, rank=rank, **kw)
        resumed.load_state_dict(first.state_dict())
        for (x, y), (x2, y2) in zip(expected[3:], [resumed.next_batch() for _ in range(4)]):
            assert torch.equal(x, x2) and torch.equal(y, y2)


def test_fineweb_a_lone_surrogate_in_the_stream_names_the_document(monkeypatch):
    _fake_hub(monkeypatch, lambda *a, **kw: _SkippableStream(["fine", "x\ud800"]))
    src = build_source(DataConfig(dataset="fineweb_edu", loader_timeout_s=5), vocab_size=256, seq_len=4,
                       batch_size=1, rank=0, world_size=1, seed=0)
    try:
        assert _window(src) == b"fine\0"
        with pytest.raises(DataError, match=r"fineweb_edu stream document 1: field 'text' holds a lone UTF-16 "
                                            r"surrogate U\+D800 at character 1"):
            src.next_batch()
    finally:
        src.close()
