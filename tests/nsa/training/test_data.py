"""nsa.training.data and its sources (synthetic, corpus, fineweb): synthetic, local-text and FineWeb-Edu tokens."""

import json
import math
import pickle
import sys
import threading
import types
from pathlib import Path

import pytest
import torch

from nsa.training.config import DATASETS, DataConfig, DataError
from nsa.training.corpus import BYTE_VOCAB, DOC_SEPARATOR, decode_bytes, encode_bytes, read_corpus
from nsa.training.data import TokenSource, build_eval_source, build_source


def _source(cfg=None, *, vocab_size=256, seq_len=16, batch_size=2, rank=0, world_size=1, seed=0):
    return build_source(cfg or DataConfig(), vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size,
                        rank=rank, world_size=world_size, seed=seed)


def _check_batch(inputs, targets, batch_size, seq_len, vocab_size):
    assert inputs.shape == targets.shape == (batch_size, seq_len)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(targets[:, :-1], inputs[:, 1:])
    for t in (inputs, targets):
        assert int(t.min()) >= 0 and int(t.max()) < vocab_size


def _stream_bytes(docs):
    out = []
    for d in docs:
        if d:
            out += encode_bytes(d) + [DOC_SEPARATOR]
    return out


def _write_parquet(path, texts, column="text"):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pq.write_table(pa.table({column: texts}), path)


# ------------------------------------------------------------------------------------------ DataConfig


def test_config_defaults():
    cfg = DataConfig()
    assert (cfg.dataset, cfg.path, cfg.loader_timeout_s, cfg.text_key) == ("synthetic", None, 120.0, "text")
    assert DATASETS == ("synthetic", "text", "fineweb_edu")
    assert DataConfig(dataset="text", path=Path("/x")).path == "/x"  # PathLike normalized to str
    assert issubclass(DataError, ValueError)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(dataset="wikitext"), "dataset"),
        (dict(loader_timeout_s=0), "loader_timeout_s"),
        (dict(loader_timeout_s=-1.0), "loader_timeout_s"),
        (dict(loader_timeout_s=float("nan")), "loader_timeout_s"),
        (dict(loader_timeout_s=True), "loader_timeout_s"),
        (dict(loader_timeout_s="10"), "loader_timeout_s"),
        (dict(dataset="text"), "path"),
        (dict(dataset="text", path=""), "path"),
        (dict(text_key=""), "text_key"),
    ],
)
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=rf"DataConfig\.{field}\b") as err:
        DataConfig(**kwargs)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kwargs, name",
    [(dict(rank=2, world_size=2), "rank"), (dict(batch_size=0), "batch_size"), (dict(seq_len=0), "seq_len"),
     (dict(world_size=0), "world_size"), (dict(vocab_size=8), "vocab_size")],
)
def test_build_source_argument_errors(kwargs, name):
    with pytest.raises(DataError, match=name):
        _source(**kwargs)


# ------------------------------------------------------------------------------------------ synthetic


def _batches(src, n):
    return [src.next_batch() for _ in range(n)]


def test_synthetic_shapes_range_and_shift():
    for vocab in (16, 100, 50257):
        src = _source(vocab_size=vocab, seq_len=300, batch_size=3)
        assert isinstance(src, TokenSource)
        for inputs, targets in _batches(src, 2):
            _check_batch(inputs, targets, 3, 300, vocab)
        src.close()


def test_synthetic_deterministic_per_seed_and_rank():
    kw = dict(vocab_size=512, seq_len=256, batch_size=2, world_size=2)
    a = _batches(_source(rank=0, seed=7, **kw), 3)
    b = _batches(_source(rank=0, seed=7, **kw), 3)
    other_rank = _batches(_source(rank=1, seed=7, **kw), 3)
    other_seed = _batches(_source(rank=0, seed=8, **kw), 3)
    for (x, y), (x2, y2), (xr, _), (xs, _) in zip(a, b, other_rank, other_seed):
        assert torch.equal(x, x2) and torch.equal(y, y2)
        assert not torch.equal(x, xr)
        assert not torch.equal(x, xs)
    # successive batches differ (the index advances)
    assert not torch.equal(a[0][0], a[1][0])


def test_synthetic_process_is_shared_by_ranks():
    s0 = _source(vocab_size=300, rank=0, world_size=4, seed=3)
    s3 = _source(vocab_size=300, rank=3, world_size=4, seed=3)
    assert torch.equal(s0.perm, s3.perm) and torch.equal(s0.offsets, s3.offsets)
    assert not torch.equal(s0.perm, _source(vocab_size=300, seed=4).perm)


def test_synthetic_resume_exact_continuation():
    src = _source(vocab_size=1000, seq_len=128, batch_size=2, seed=11)
    _batches(src, 3)
    state = src.state_dict()
    assert state == {"kind": "synthetic", "next_index": 6}
    assert pickle.loads(pickle.dumps(state)) == state
    expected = _batches(src, 2)
    resumed = _source(vocab_size=1000, seq_len=128, batch_size=2, seed=11)
    assert not torch.equal(resumed.next_batch()[0], expected[0][0])  # a fresh source starts elsewhere
    resumed.load_state_dict(state)
    for (x, y), (x2, y2) in zip(expected, _batches(resumed, 2)):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_synthetic_state_errors():
    src = _source()
    with pytest.raises(DataError, match="'text'.*'synthetic'"):
        src.load_state_dict({"kind": "text", "next_window": 0, "epoch": 0})
    with pytest.raises(DataError, match="next_index"):
        src.load_state_dict({"kind": "synthetic", "next_index": -1})


def _conditional_entropy(tokens: torch.Tensor, vocab: int) -> float:
    """Plug-in estimate of H(next | current) in nats from bigram counts over rows of `tokens`."""
    a, b = tokens[:, :-1].reshape(-1), tokens[:, 1:].reshape(-1)
    joint = torch.bincount(a * vocab + b, minlength=vocab * vocab).double().view(vocab, vocab)
    p = joint / joint.sum()
    cond = p / p.sum(1, keepdim=True).clamp_min(1e-300)
    mask = p > 0
    return float(-(p[mask] * cond[mask].log()).sum())


def test_synthetic_is_learnable_bigram_entropy():
    vocab = 64
    src = _source(vocab_size=vocab, seq_len=2048, batch_size=4, seed=5)
    tokens = torch.cat([src.next_batch()[0] for _ in range(5)])  # 40k tokens, ~640 per context
    h = _conditional_entropy(tokens, vocab)
    assert h < 0.6 * math.log(vocab)
    assert abs(h - src.markov_entropy) < 0.3  # close to the documented Markov entropy
    assert src.entropy_floor < src.markov_entropy < 0.5 * math.log(vocab)
    # control: the same tokens in random order have (nearly) no next-token structure
    shuffled = tokens.reshape(-1)[torch.randperm(tokens.numel())].view_as(tokens)
    assert _conditional_entropy(shuffled, vocab) > 0.9 * math.log(vocab)


def _repeated_ngrams(row: list[int], n: int) -> int:
    seen, repeats = set(), 0
    for i in range(len(row) - n + 1):
        gram = tuple(row[i:i + n])
        if gram in seen:
            repeats += 1
        seen.add(gram)
    return repeats


def test_synthetic_has_long_range_copies():
    # With V=1024 a 16-token span recurring by chance is vanishingly rare (< 1e-3 per sequence), so repeats
    # come from the copy segments (8..48 tokens each, one per ~124 tokens).
    src = _source(vocab_size=1024, seq_len=1024, batch_size=4, seed=2)
    inputs, _ = src.next_batch()
    for row in inputs.tolist():
        assert _repeated_ngrams(row, 16) >= 20
    # control: the same process with copies switched off (copy length 0) has no repeated 16-grams
    plain = _source(vocab_size=1024, seq_len=1024, batch_size=4, seed=2)
    plain.COPY_LEN = (0, 0)
    for row in plain.next_batch()[0].tolist():
        assert _repeated_ngrams(row, 16) <= 1


def test_synthetic_small_vocab_error():
    with pytest.raises(DataError, match="vocab_size"):
        _source(vocab_size=8)


# ------------------------------------------------------------------------------------------ tokenizer


def test_byte_round_trip_unicode():
    text = "héllo, wörld ✓ 𝄞 日本語"
    ids = encode_bytes(text)
    assert ids == list(text.encode("utf-8")) and len(ids) > len(text)
    assert all(0 <= i < BYTE_VOCAB for i in ids)
    assert decode_bytes(ids) == text
    assert decode_bytes(torch.tensor(ids)) == text


# ------------------------------------------------------------------------------------------ text


def _text_cfg(path, **kw):
    return DataConfig(dataset="text", path=str(path), **kw)


def test_text_reads_txt_jsonl_json_parquet(tmp_path):
    (tmp_path / "a.txt").write_text("plain text ✓\nsecond line", encoding="utf-8")
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "jsonl one"}) + "\n\n"
                                      + json.dumps({"text": "jsonl two", "id": 2}) + "\n", encoding="utf-8")
    (tmp_path / "c.json").write_text(json.dumps([{"text": "array doc"}]), encoding="utf-8")
    (tmp_path / "sub").mkdir()
    _write_parquet(tmp_path / "sub" / "d.parquet", ["parquet row 0", "", "parquet row 2"])
    (tmp_path / "README.md").write_text("not data")
    docs = ["plain text ✓\nsecond line", "jsonl one", "jsonl two", "array doc", "parquet row 0", "parquet row 2"]
    expected = _stream_bytes(docs)
    assert read_corpus(str(tmp_path)).tolist() == expected

    seq_len = 5
    src = _source(_text_cfg(tmp_path), seq_len=seq_len, batch_size=3)
    n_windows = (len(expected) - 1) // seq_len
    assert src.windows_per_epoch == n_windows
    stream = []
    for _ in range(n_windows // 3):
        inputs, targets = src.next_batch()
        _check_batch(inputs, targets, 3, seq_len, 256)
        for row in inputs.tolist():
            stream += row
    assert stream == expected[: len(stream)]
    assert len(stream) >= len(expected) - 3 * seq_len - 1

    # a single file and a glob select the same way
    assert read_corpus(str(tmp_path / "a.txt")).tolist() == _stream_bytes(docs[:1])
    assert read_corpus(str(tmp_path / "**" / "*.parquet")).tolist() == _stream_bytes(docs[4:])


def test_text_ranks_disjoint_and_cover(tmp_path):
    letters = torch.randint(0, 26, (400,), generator=torch.Generator().manual_seed(0)).tolist()
    text = "".join(chr(ord("a") + i) for i in letters)  # aperiodic, so equal windows mean the same window
    (tmp_path / "c.txt").write_text(text)
    seq_len, world = 8, 2
    tokens = read_corpus(str(tmp_path))
    n_windows = (tokens.numel() - 1) // seq_len  # 401 tokens -> 50 windows, 25 per rank
    per_rank = n_windows // world
    rows = {}
    for rank in range(world):
        src = _source(_text_cfg(tmp_path), seq_len=seq_len, batch_size=5, rank=rank, world_size=world)
        assert src.windows_per_epoch == per_rank
        windows = []
        for _ in range(per_rank // 5):
            inputs, targets = src.next_batch()
            windows += torch.cat([inputs, targets[:, -1:]], 1).tolist()
        rows[rank] = windows
        assert src.state_dict().items() >= {"kind": "text", "next_window": 0, "epoch": 1, "seq_len": seq_len}.items()
    # window w is rank w % 2's (w // 2)-th window; interleaved they tile the stream with stride seq_len
    interleaved = [rows[w % world][w // world] for w in range(world * per_rank)]
    rebuilt = [t for w in interleaved for t in w[:seq_len]] + [interleaved[-1][-1]]
    assert rebuilt == tokens[: world * per_rank * seq_len + 1].tolist()
    assert len({tuple(w) for w in rows[0] + rows[1]}) == world * per_rank  # disjoint


def test_text_wraps_to_next_epoch_and_resumes(tmp_path):
    (tmp_path / "c.txt").write_text("the quick brown fox jumps over the lazy dog " * 3)
    src = _source(_text_cfg(tmp_path), seq_len=10, batch_size=4)
    per_epoch = src.windows_per_epoch  # 13 windows: batches straddle the epoch boundary
    assert per_epoch % 4
    first = src.next_batch()
    seen = 4
    while seen < per_epoch:
        src.next_batch()
        seen += 4
    state = src.state_dict()
    assert state.items() >= {"kind": "text", "next_window": seen - per_epoch, "epoch": 1, "seq_len": 10}.items()
    expected = [src.next_batch() for _ in range(3)]
    # the windows of epoch 1 repeat epoch 0: the batch after the boundary continues with window 0's successors
    fresh = _source(_text_cfg(tmp_path), seq_len=10, batch_size=per_epoch)
    epoch0 = fresh.next_batch()[0]
    k = seen - per_epoch
    assert torch.equal(expected[0][0], epoch0[k:k + 4])
    assert torch.equal(first[0], epoch0[:4])

    resumed = _source(_text_cfg(tmp_path), seq_len=10, batch_size=4)
    resumed.load_state_dict(state)
    for (x, y), (x2, y2) in zip(expected, [resumed.next_batch() for _ in range(3)]):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    with pytest.raises(DataError, match="next_window=99"):
        resumed.load_state_dict({"kind": "text", "next_window": 99, "epoch": 0})
    with pytest.raises(DataError, match="'synthetic'"):
        resumed.load_state_dict({"kind": "synthetic", "next_index": 0})


def test_text_unicode_stream(tmp_path):
    text = "naïve café ✓ 𝄞"
    (tmp_path / "u.jsonl").write_text(json.dumps({"body": text}, ensure_ascii=False) + "\n", encoding="utf-8")
    tokens = read_corpus(str(tmp_path / "u.jsonl"), text_key="body")
    assert tokens.dtype == torch.uint8
    assert decode_bytes(tokens[:-1]) == text and int(tokens[-1]) == DOC_SEPARATOR


def test_text_error_missing_path(tmp_path):
    missing = tmp_path / "nope"
    with pytest.raises(DataError, match=rf"{missing}.*does not exist"):
        _source(_text_cfg(missing))


def test_text_error_empty_dir(tmp_path):
    (tmp_path / "notes.md").write_text("ignored")
    with pytest.raises(DataError, match=rf"directory {tmp_path} holds no .*\*\.txt"):
        _source(_text_cfg(tmp_path))
    with pytest.raises(DataError, match="no files match"):
        _source(_text_cfg(tmp_path / "*.txt"))
    with pytest.raises(DataError, match="not a supported file"):
        _source(_text_cfg(tmp_path / "notes.md"))


def test_text_error_bad_json_line(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"text": "ok"}\n{"text": "fine"}\n{"text": broken\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{f}:3: not valid JSON") as err:
        _source(_text_cfg(f))
    assert "\n" not in str(err.value)


def test_text_error_missing_key(tmp_path):
    f = tmp_path / "k.jsonl"
    f.write_text('{"text": "ok"}\n{"content": "x"}\n', encoding="utf-8")
    with pytest.raises(DataError, match=rf"{f}:2: no 'text' field.*content"):
        _source(_text_cfg(f))
    with pytest.raises(DataError, match=rf"{f}:1: no 'body' field"):
        _source(_text_cfg(f, text_key="body"))
    g = tmp_path / "n.jsonl"
    g.write_text('{"text": 3}\n')
    with pytest.raises(DataError, match=rf"{g}:1: field 'text' must be a string"):
        _source(_text_cfg(g))
    p = tmp_path / "p.parquet"
    _write_parquet(p, ["a", "b"], column="content")
    with pytest.raises(DataError, match=rf"{p}: no column 'text'.*content"):
        _source(_text_cfg(p))


def test_text_error_small_vocab(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 100)
    with pytest.raises(DataError, match="vocab_size=255.*>= 256"):
        _source(_text_cfg(tmp_path), vocab_size=255)


def test_text_error_corpus_too_small(tmp_path):
    (tmp_path / "a.txt").write_text("x" * 20)  # 21 tokens: 2 windows of 10 + 1
    _source(_text_cfg(tmp_path), seq_len=10, world_size=2, rank=1)
    with pytest.raises(DataError, match=r"21 tokens.*at least 31"):
        _source(_text_cfg(tmp_path), seq_len=10, world_size=3, rank=0)


def test_text_error_not_utf8(tmp_path):
    (tmp_path / "a.txt").write_bytes(b"ok \xff\xfe bad")
    with pytest.raises(DataError, match=r"a\.txt: not UTF-8.*offset 3"):
        _source(_text_cfg(tmp_path))


def test_parquet_text_that_is_not_utf8_is_an_error_naming_the_file(tmp_path):
    """A string column whose bytes are not UTF-8 (a writer other than Arrow's can write one; Arrow reads it back
    only when asked for Python strings) is a DataError naming the file and the row before it, not a bare
    UnicodeDecodeError from inside pyarrow."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    offsets = pa.array([0, 2, 6], type=pa.int32()).buffers()[1]
    texts = pa.Array.from_buffers(pa.string(), 2, [None, offsets, pa.py_buffer(b"okbad\xff")])
    pq.write_table(pa.table({"text": texts}), tmp_path / "d.parquet")
    with pytest.raises(DataError, match=r"d\.parquet: damaged parquet data after row 0 of column 'text' "
                                        r"\(UnicodeDecodeError: .*byte 0xff"):
        _source(_text_cfg(tmp_path))


def test_parquet_without_pyarrow(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(DataError, match=r"d\.parquet.*pip install pyarrow"):
        _source(_text_cfg(tmp_path))


# ------------------------------------------------------------------------------------------ fineweb_edu


@pytest.mark.parametrize("world", [1, 2])
@pytest.mark.parametrize("then,now", [(8, 12), (12, 8), (8, 8)])
def test_a_resume_with_another_seq_len_continues_at_the_same_place_in_the_stream(tmp_path, world, then, now):
    """A data position saved at one seq_len and loaded at another continues where the run stopped in the token
    stream: every rank's next window starts at or after the first token no rank has read yet, and no more than one
    window (of all ranks) later; the window index alone would jump backwards (re-reading) or forwards (skipping)."""
    (tmp_path / "c.txt").write_text("".join(chr(97 + i % 26) for i in range(1200)))
    stream = read_corpus(str(tmp_path)).tolist()
    for rank in range(world):
        src = _source(_text_cfg(tmp_path), seq_len=then, batch_size=3, rank=rank, world_size=world)
        for _ in range(4):
            src.next_batch()
        state = src.state_dict()
        read_up_to = state["next_window"] * world * then  # every rank read its windows below this token, in lockstep
        resumed = _source(_text_cfg(tmp_path), seq_len=now, batch_size=1, rank=rank, world_size=world)
        resumed.load_state_dict(state)
        start = resumed.window_start(resumed.next_window)
        assert read_up_to + rank * now <= start < read_up_to + (rank + world) * now, (state, resumed.state_dict())
        inputs, targets = resumed.next_batch()
        assert inputs[0].tolist() == stream[start:start + now] and resumed.epoch == state["epoch"]


def test_a_resume_with_a_longer_seq_len_past_the_last_window_goes_on_with_the_next_epoch(tmp_path):
    (tmp_path / "c.txt").write_text("x" * 100)  # 101 tokens: 12 windows of 8, 6 of 16
    src = _source(_text_cfg(tmp_path), seq_len=8, batch_size=1)
    src.load_state_dict({"kind": "text", "next_window": 11, "epoch": 2, "seq_len": 8})  # tokens 88.. left
    resumed = _source(_text_cfg(tmp_path), seq_len=16, batch_size=1)
    resumed.load_state_dict(src.state_dict())
    assert resumed.state_dict().items() >= {"kind": "text", "next_window": 0, "epoch": 3, "seq_len": 16}.items()
    with pytest.raises(DataError, match="seq_len must be an integer >= 1, got 0"):
        resumed.load_state_dict({"kind": "text", "next_window": 1, "epoch": 0, "seq_len": 0})


def test_fineweb_local_parquet(tmp_path):
    docs = [f"document {i}: " + "edu " * (i + 3) for i in range(20)]
    _write_parquet(tmp_path / "000.parquet", docs[:10])
    _write_parquet(tmp_path / "001.parquet", docs[10:])
    (tmp_path / "notes.txt").write_text("not parquet: ignored by fineweb_edu")
    cfg = DataConfig(dataset="fineweb_edu", path=str(tmp_path))
    src = _source(cfg, seq_len=32, batch_size=2, world_size=2, rank=1)
    inputs, targets = src.next_batch()
    _check_batch(inputs, targets, 2, 32, 256)
    stream = _stream_bytes(docs)
    assert torch.cat([inputs[0], targets[0, -1:]]).tolist() == stream[32:65]  # rank 1's first window is window 1
    assert src.state_dict().items() >= {"kind": "fineweb_edu", "next_window": 2, "epoch": 0, "seq_len": 32}.items()
    only_txt = tmp_path / "only_txt"
    only_txt.mkdir()
    (only_txt / "x.txt").write_text("txt is not read by fineweb_edu")
    with pytest.raises(DataError, match=r"fineweb_edu: directory .*only_txt holds no \*\.parquet files"):
        _source(DataConfig(dataset="fineweb_edu", path=str(only_txt)))


def test_fineweb_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(DataError, match=r"pip install datasets.*--data-path") as err:
        _source(DataConfig(dataset="fineweb_edu"))
    assert "\n" not in str(err.value)


class _FakeStream:
    """An iterable of {"text": ...} records standing in for a streaming datasets.IterableDataset."""

    def __init__(self, docs, fail=None, gate=None):
        self.docs, self.fail, self.gate = docs, fail, gate

    def __iter__(self):
        if self.gate is not None:
            self.gate.wait()
        if self.fail is not None:
            raise self.fail
        for d in self.docs:
            yield {"text": d, "id": "x"}


def _fake_datasets(monkeypatch, *, docs=(), load_error=None, fail=None, gate=None):
    calls = {}

    def load_dataset(repo, name=None, split=None, streaming=False):
        calls["load"] = (repo, name, split, streaming)
        if load_error is not None:
            raise load_error
        return _FakeStream(list(docs), fail=fail, gate=gate)

    def split_dataset_by_node(ds, rank, world_size):
        calls["split"] = (rank, world_size)
        return _FakeStream(ds.docs[rank::world_size], fail=ds.fail, gate=ds.gate)

    mod = types.ModuleType("datasets")
    dist = types.ModuleType("datasets.distributed")
    mod.load_dataset, dist.split_dataset_by_node, mod.distributed = load_dataset, split_dataset_by_node, dist
    monkeypatch.setitem(sys.modules, "datasets", mod)
    monkeypatch.setitem(sys.modules, "datasets.distributed", dist)
    return calls


def test_fineweb_hub_unreachable(monkeypatch):
    _fake_datasets(monkeypatch, load_error=ConnectionError("Couldn't reach 'HuggingFaceFW/fineweb-edu'"))
    with pytest.raises(DataError, match=r"unreachable.*ConnectionError.*--data-path"):
        _source(DataConfig(dataset="fineweb_edu"))


def test_fineweb_first_fetch_fails(monkeypatch):
    _fake_datasets(monkeypatch, docs=["a"], fail=OSError("network down"))
    src = _source(DataConfig(dataset="fineweb_edu", loader_timeout_s=5))
    for _ in range(2):  # the error sticks
        with pytest.raises(DataError, match=r"unreachable.*network down.*--data-path"):
            src.next_batch()
    src.close()


def test_fineweb_stream_timeout(monkeypatch):
    gate = threading.Event()
    _fake_datasets(monkeypatch, docs=["a" * 100], gate=gate)
    src = _source(DataConfig(dataset="fineweb_edu", loader_timeout_s=0.2))
    try:
        with pytest.raises(DataError, match=r"no batch within 0\.2 s \(loader_timeout_s / --loader-timeout\)"):
            src.next_batch()
    finally:
        gate.set()
        src.close()


def test_fineweb_stream_packs_shards_and_resumes(monkeypatch):
    docs = [f"doc {i} " + "x" * (i % 7) for i in range(200)]
    calls = _fake_datasets(monkeypatch, docs=docs)
    kw = dict(seq_len=16, batch_size=2, rank=1, world_size=2)
    src = _source(DataConfig(dataset="fineweb_edu", loader_timeout_s=5), **kw)
    assert calls["load"] == ("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", True)
    assert calls["split"] == (1, 2)
    stream = _stream_bytes(docs[1::2])  # this rank's shard, packed
    got = []
    for _ in range(3):
        inputs, targets = src.next_batch()
        _check_batch(inputs, targets, 2, 16, 256)
        got += torch.cat([inputs, targets[:, -1:]], 1).tolist()
    for k, window in enumerate(got):
        assert window == stream[16 * k:16 * k + 17]
    state = src.state_dict()
    assert state["kind"] == "fineweb_edu_stream" and 0 < state["docs_consumed"] < 100
    src.close()

    resumed = _source(DataConfig(dataset="fineweb_edu", loader_timeout_s=5), **kw)
    resumed.load_state_dict(state)
    inputs, _ = resumed.next_batch()
    assert inputs[0].tolist() == stream[16 * 6:16 * 6 + 16]  # the 7th window: 6 were read before the resume
    resumed.close()


# ------------------------------------------------------------------------------------------ evaluation


def test_eval_source_synthetic_is_fixed_and_held_out():
    kw = dict(vocab_size=500, seq_len=64, batch_size=2, rank=0, world_size=1, seed=1)
    ev = build_eval_source(DataConfig(), **kw)
    first = [ev.next_batch() for _ in range(3)]
    for inputs, targets in first:
        _check_batch(inputs, targets, 2, 64, 500)
    ev.reset()
    for (x, y), (x2, y2) in zip(first, [ev.next_batch() for _ in range(3)]):
        assert torch.equal(x, x2) and torch.equal(y, y2)
    train = {tuple(r) for _ in range(20) for r in _source(**kw).next_batch()[0].tolist()}
    assert not train & {tuple(r) for x, _ in first for r in x.tolist()}
    ev.close()


def test_eval_source_text_replays_first_batches(tmp_path):
    (tmp_path / "a.txt").write_text("evaluation text " * 20)
    cfg = _text_cfg(tmp_path)
    ev = build_eval_source(cfg, vocab_size=256, seq_len=8, batch_size=2, rank=0, world_size=1, seed=0)
    a, b = ev.next_batch(), ev.next_batch()
    ev.reset()
    assert torch.equal(ev.next_batch()[0], a[0]) and torch.equal(ev.next_batch()[0], b[0])
    assert torch.equal(a[0], _source(cfg, seq_len=8).next_batch()[0])
