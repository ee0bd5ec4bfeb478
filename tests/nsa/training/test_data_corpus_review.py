"""Local text corpora against a plain re-packing of the same bytes: the stream of a directory of .txt, .jsonl and
.json files, each rank's windows over world sizes 1..4 and batch sizes 1..3 across epochs, a resume after every
batch; a glob that names one file twice reads it once; a position saved by another world size is refused; the
offset named for a JSON file that is not UTF-8 is the byte's offset in the file."""

import itertools
import json

import pytest
import torch

from nsa.training.config import DataConfig, DataError
from nsa.training.corpus import WindowSource, read_corpus
from nsa.training.data import build_source

DOCS = ["first doc\nline two", "", "é€ 😀 mixed", "x", "a longer document " * 3, "tail"]


def _text(path, **kw):
    args = dict(vocab_size=256, seq_len=4, batch_size=1, rank=0, world_size=1, seed=0)
    args.update(kw)
    return build_source(DataConfig(dataset="text", path=str(path)), **args)


def _write_corpus(root):
    """DOCS over three files; returns the byte stream a plain reading gives: the files in path order, every
    non-empty document's UTF-8 bytes followed by a NUL."""
    (root / "b.txt").write_text(DOCS[0], encoding="utf-8")
    (root / "a.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in DOCS[1:4]), encoding="utf-8")
    (root / "c.json").write_text(json.dumps([{"text": t} for t in DOCS[4:]]), encoding="utf-8")
    in_order = DOCS[1:4] + DOCS[0:1] + DOCS[4:]  # a.jsonl, b.txt, c.json
    return b"".join(t.encode("utf-8") + b"\0" for t in in_order if t)


def _rows(src, batches):
    out = []
    for _ in range(batches):
        inputs, targets = src.next_batch()
        assert inputs.dtype == targets.dtype == torch.int64
        assert torch.equal(inputs[:, 1:], targets[:, :-1])
        out += [bytes(inputs[r].tolist()) + bytes([int(targets[r, -1])]) for r in range(inputs.shape[0])]
    return out


def test_windows_shards_and_resumes_are_those_of_a_plain_repacking(tmp_path):
    stream = _write_corpus(tmp_path)
    tokens = read_corpus(str(tmp_path))
    assert bytes(tokens.tolist()) == stream
    n = len(stream)
    for seq_len, world in itertools.product((3, 7), (1, 2, 3, 4)):
        windows = (n - 1) // seq_len
        per_rank = windows // world
        dealt = []
        for rank in range(world):
            mine = [stream[w * seq_len: w * seq_len + seq_len + 1] for w in range(rank, per_rank * world, world)]
            assert all(len(w) == seq_len + 1 for w in mine)
            dealt += mine
            for batch in (1, 3):
                batches = -(-2 * per_rank // batch) + 1  # past two epochs
                expected = list(itertools.islice(itertools.cycle(mine), (batches + 2) * batch))
                assert _rows(_text(tmp_path, seq_len=seq_len, batch_size=batch, rank=rank, world_size=world),
                             batches) == expected[:batches * batch], (seq_len, world, rank, batch)
                shape = dict(kind="text", seq_len=seq_len, batch_size=batch, rank=rank, world_size=world)
                for k in range(batches):  # the state after k batches, k = 0 included, resumes with batch k + 1
                    run = WindowSource(tokens, **shape)
                    _rows(run, k)
                    resumed = WindowSource(tokens, **shape)
                    assert resumed.load_state_dict(run.state_dict()) is None
                    assert _rows(resumed, 2) == expected[k * batch:(k + 2) * batch], (seq_len, world, rank, k)
        # every window of the epoch went to exactly one rank, only the last windows % world left out
        assert sorted(dealt) == sorted(stream[w * seq_len: w * seq_len + seq_len + 1]
                                       for w in range(per_rank * world))
        assert len(dealt) == windows - windows % world


def test_a_glob_that_names_a_file_more_than_once_reads_it_once(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (tmp_path / "one" / "x.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "top.txt").write_text("world", encoding="utf-8")
    # "**/**" matches one/x.txt twice (Python's glob), "*/../" matches top.txt once through each subdirectory
    assert bytes(read_corpus(str(tmp_path / "**" / "**" / "*.txt")).tolist()) == b"hello\0world\0"
    assert bytes(read_corpus(str(tmp_path / "*" / ".." / "*.txt")).tolist()) == b"world\0"


@pytest.mark.parametrize("name, head", [("big.jsonl", ""), ("big.json", "[")])
def test_a_json_file_that_is_not_utf8_names_the_bad_byte_s_offset_in_the_file(tmp_path, name, head):
    record = json.dumps({"text": "x" * 100})
    sep = "," if head else ""
    body = head + (sep + "\n").join([record] * 200) + sep + "\n"
    data = body.encode("utf-8") + b'{"text": "ab\xffc"}' + (b"]" if head else b"\n")
    (tmp_path / name).write_bytes(data)
    offset = data.index(b"\xff")
    assert offset > 20_000  # well past the first chunk a text-mode read decodes
    with pytest.raises(DataError, match=rf"not UTF-8 \(bad byte at offset {offset}\)"):
        read_corpus(str(tmp_path / name))


def test_a_position_saved_by_another_world_size_is_refused(tmp_path):
    _write_corpus(tmp_path)
    four = _text(tmp_path, seq_len=3, batch_size=1, rank=0, world_size=4)
    _rows(four, 3)  # windows 0, 4 and 8 of the stream read by rank 0, 1..3 and 5..11 by the others
    state = four.state_dict()
    two = _text(tmp_path, seq_len=3, batch_size=1, rank=0, world_size=2)
    # taken as it is, rank 0 of 2 would go on at window 6, which rank 2 of 4 has read
    with pytest.raises(DataError, match=r"world_size=4 .* this run has world_size=2"):
        two.load_state_dict(state)
    # the same world size resumes; a position without world_size (an older checkpoint) is taken as of this one
    same = _text(tmp_path, seq_len=3, batch_size=1, rank=0, world_size=4)
    assert same.load_state_dict(state) is None and _rows(same, 1) == _rows(four, 1)
    older = {k: v for k, v in two.state_dict().items() if k != "world_size"}
    assert _text(tmp_path, seq_len=3, batch_size=1, rank=0, world_size=2).load_state_dict(older) is None
    with pytest.raises(DataError, match="world_size must be an integer >= 1, got 0"):
        two.load_state_dict({**state, "world_size": 0})


def test_a_corpus_with_fewer_windows_than_ranks_is_refused(tmp_path):
    (tmp_path / "a.txt").write_text("abcdefgh", encoding="utf-8")  # 9 tokens: 2 windows of seq_len 4
    for rank in range(2):
        assert len(_rows(_text(tmp_path, rank=rank, world_size=2), 1)) == 1
    with pytest.raises(DataError, match=r"has 9 tokens .* seq_len=4 and world_size=3 need at least 13"):
        _text(tmp_path, rank=0, world_size=3)
