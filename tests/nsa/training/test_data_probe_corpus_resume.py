"""Local corpora against hand-built references: every window of an epoch over 1..5 ranks, a resume on a corpus that
changed since the checkpoint (warned, or refused where the position no longer exists), parquet text columns of
every arrow string type."""

import logging

import pytest
import torch

from nsa.training.config import DataConfig, DataError
from nsa.training import corpus
from nsa.training.corpus import WindowSource, read_corpus
from nsa.training.data import build_source

CORPUS_LOG = "nsa.training.corpus"


def _text(path, **kw):
    args = dict(vocab_size=256, seq_len=4, batch_size=1, rank=0, world_size=1, seed=0)
    args.update(kw)
    return build_source(DataConfig(dataset="text", path=str(path)), **args)


def _windows(src, batches):
    """The windows (inputs plus the last target) of the next `batches` batches, checking the one-token shift."""
    out = []
    for _ in range(batches):
        inputs, targets = src.next_batch()
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        out += [inputs[r].tolist() + [int(targets[r, -1])] for r in range(inputs.shape[0])]
    return out


# ------------------------------------------------------------------------------------------ sharding


@pytest.mark.parametrize("n_tokens", [17, 40])
def test_every_window_of_an_epoch_is_read_once_over_one_to_five_ranks(n_tokens):
    # token i is i + 1 (no zero), so a window is known by its first token; W = (n - 1) // seq_len windows
    tokens = torch.arange(1, n_tokens + 1, dtype=torch.uint8)
    for seq_len in (1, 3, 4):
        n_windows = (n_tokens - 1) // seq_len
        by_hand = [list(range(w * seq_len + 1, w * seq_len + seq_len + 2)) for w in range(n_windows)]
        for world in range(1, 6):
            if n_windows < world:  # fewer windows than ranks: refused, not a rank without data
                with pytest.raises(DataError, match=rf"need at least {world * seq_len + 1} "):
                    WindowSource(tokens, kind="text", seq_len=seq_len, batch_size=1, rank=0, world_size=world)
                continue
            per_rank = n_windows // world  # the last n_windows % world windows are dropped
            for batch in (1, 2, 3):
                read = []
                for rank in range(world):
                    src = WindowSource(tokens, kind="text", seq_len=seq_len, batch_size=batch, rank=rank,
                                       world_size=world)
                    got = _windows(src, -(-2 * per_rank // batch))  # two epochs and a little more
                    mine = [by_hand[rank + k * world] for k in range(per_rank)]
                    assert got == (mine * 3)[:len(got)], (seq_len, world, batch, rank)
                    read += got[:per_rank]
                    steps = len(got)
                    assert src.state_dict()["epoch"] == steps // per_rank
                    assert src.state_dict()["next_window"] == steps % per_rank
                assert sorted(read) == by_hand[:per_rank * world]  # each kept window once across the ranks


# ------------------------------------------------------------------------------------------ a changed corpus


def _saved_position(path, **kw):
    src = _text(path, **kw)
    src.next_batch()
    src.next_batch()
    return src.state_dict()


def test_a_resume_on_the_same_corpus_warns_of_nothing(tmp_path, caplog):
    (tmp_path / "c.txt").write_text("abcdefghijklmnopqrstuvwxyz" * 3)
    state = _saved_position(tmp_path)
    resumed = _text(tmp_path)
    with caplog.at_level(logging.WARNING, logger=CORPUS_LOG):
        resumed.load_state_dict(state)
        resumed.load_state_dict({k: v for k, v in state.items() if k not in ("tokens", "fingerprint")})  # older
        _text(tmp_path, seq_len=8).load_state_dict(state)  # another seq_len: the same corpus all the same
    assert not caplog.records
    assert state["tokens"] == 79 and resumed.next_window == 2


def test_a_resume_on_a_corpus_edited_to_the_same_size_is_warned(tmp_path, caplog):
    (tmp_path / "c.txt").write_text("abcdefghijklmnopqrstuvwxyz" * 3)
    state = _saved_position(tmp_path)
    (tmp_path / "c.txt").write_text("abcdefghijklmnopqrstuvwxyZ" * 3)  # 78 bytes as before, other text
    resumed = _text(tmp_path)
    with caplog.at_level(logging.WARNING, logger=CORPUS_LOG):
        resumed.load_state_dict(state)
    (record,) = caplog.records
    message = record.getMessage()
    assert str(tmp_path) in message and "the same 79 tokens, other content" in message
    assert "other data than the run it continues" in message
    assert resumed.next_window == 2  # continued all the same: a change the user made


def test_a_resume_on_a_corpus_that_grew_is_warned_and_one_that_shrank_past_the_position_is_refused(tmp_path,
                                                                                                   caplog):
    (tmp_path / "c.txt").write_text("abcdefghijklmnopqrstuvwxyz" * 3)  # 79 tokens: 19 windows of 4
    state = _saved_position(tmp_path, batch_size=5)  # next_window 10
    (tmp_path / "d.txt").write_text("more text")  # a file added: 89 tokens
    with caplog.at_level(logging.WARNING, logger=CORPUS_LOG):
        _text(tmp_path).load_state_dict(state)
    (record,) = caplog.records
    assert "79 tokens then, 89 now" in record.getMessage()
    (tmp_path / "d.txt").unlink()
    (tmp_path / "c.txt").write_text("abcdefghijklmnopqrstuvwxyz")  # 27 tokens: 6 windows of 4
    for seq_len in (4, 8):  # the position is in windows of 4 tokens (6 of them now) whatever this run's seq_len
        with pytest.raises(DataError, match=r"next_window=10 .*only 6 windows (of seq_len=4 )?per epoch; the corpus "
                                            r"changed since the checkpoint \(.*79 tokens then, 27 now\)"):
            _text(tmp_path, seq_len=seq_len).load_state_dict(state)


def test_a_bad_corpus_record_in_a_position_is_refused(tmp_path):
    (tmp_path / "c.txt").write_text("abcdefghij" * 3)
    src = _text(tmp_path)
    state = src.state_dict()
    with pytest.raises(DataError, match=r"tokens must be an integer >= 0, got '31'"):
        src.load_state_dict({**state, "tokens": "31"})
    with pytest.raises(DataError, match=r"fingerprint must be a string, got 7"):
        src.load_state_dict({**state, "fingerprint": 7})


def test_the_fingerprint_of_a_long_stream_sees_its_ends_and_its_length():
    # 1,000,000 tokens: sampled, not hashed whole; the first and the last token lie in sampled stretches
    stream_fingerprint = corpus.stream_fingerprint
    base = torch.randint(1, 256, (1_000_000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(3))
    same = base.clone()
    assert stream_fingerprint(same) == stream_fingerprint(base)
    for at in (0, base.numel() - 1):
        other = base.clone()
        other[at] ^= 1
        assert stream_fingerprint(other) != stream_fingerprint(base)
    assert stream_fingerprint(base[:-1]) != stream_fingerprint(base)
    assert stream_fingerprint(torch.cat([base, base[:1]])) != stream_fingerprint(base)


# ------------------------------------------------------------------------------------------ parquet string types


def test_parquet_text_of_every_arrow_string_type_is_read(tmp_path):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    texts = ["caf\u00e9", "\U0001d11e", "caf\u00e9"]
    expected = "caf\u00e9\0\U0001d11e\0caf\u00e9\0".encode("utf-8")
    columns = {
        "large_string": pa.array(texts, pa.large_string()),
        "dictionary": pa.array(texts, pa.string()).dictionary_encode(),  # a categorical column (pandas)
    }
    if hasattr(pa, "string_view"):
        columns["string_view"] = pa.array(texts, pa.string_view())
    for name, column in columns.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"text": column}), path)
        assert bytes(read_corpus(str(path), extensions=(".parquet",)).tolist()) == expected, name
    pq.write_table(pa.table({"text": pa.array([1, 2], pa.int64())}), tmp_path / "ints.parquet")
    with pytest.raises(DataError, match=r"ints\.parquet: column 'text' must hold strings, got int64"):
        read_corpus(str(tmp_path / "ints.parquet"))


def test_a_nul_inside_a_json_or_parquet_document_is_refused_naming_where(tmp_path):
    """A NUL is the byte tokenizer's document separator: inside a JSON or parquet document it cut the document in two
    unsaid (a .txt file with one was already refused). Now a DataError names the file, the record and the byte."""
    (tmp_path / "a.jsonl").write_text('{"text": "fine"}\n{"text": "cut\\u0000here"}\n')
    with pytest.raises(DataError, match=r"a\.jsonl:2: field 'text' holds a NUL character at byte 3"):
        read_corpus(str(tmp_path / "a.jsonl"))
    (tmp_path / "b.json").write_text('[{"text": "x\\u0000"}]')
    with pytest.raises(DataError, match=r"b\.json: item 0: field 'text' holds a NUL character at byte 1"):
        read_corpus(str(tmp_path / "b.json"))
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"text": ["ok", "a\x00b"]}), tmp_path / "c.parquet")
    with pytest.raises(DataError, match=r"c\.parquet: row 1: field 'text' holds a NUL character at byte 1"):
        read_corpus(str(tmp_path / "c.parquet"))
    (tmp_path / "d.jsonl").write_text('{"text": "no separator inside"}\n')
    assert bytes(read_corpus(str(tmp_path / "d.jsonl")).tolist()) == b"no separator inside\x00"
