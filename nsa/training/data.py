"""Training data sources: what the trainer calls `next_batch()` on.

`build_source(DataConfig(...), vocab_size=, seq_len=, batch_size=, rank=, world_size=, seed=)` returns a
`TokenSource`. Every source hands out `(inputs, targets)`, both int64 `[batch_size, seq_len]` with ids in
`[0, vocab_size)`, cut from one window of `seq_len + 1` tokens so that `targets[:, :-1] == inputs[:, 1:]`
(next-token prediction). `state_dict()` is this rank's data position (plain ints and strings);
`load_state_dict()` resumes exactly there, the hub stream included (a local corpus that changed since the position
was saved is continued with a warning, see nsa.training.corpus). A micro-batch whose token ids alone would not fit
in the machine's memory (batch_size * (seq_len + 1) int64 ids, three copies) is refused at once.

The interface every source implements, `TokenSource`, and the check of a resumed position, `check_state`, are in
nsa.training.source, below this module and the sources. Datasets (`DataConfig.dataset`), each in its own module:

  synthetic    a seeded, learnable token process (a sparse Markov chain plus verbatim copies of earlier spans),
               generated on the fly; no files (nsa.training.synthetic).
  text         local files: `path` is a file, a directory (every *.txt, *.jsonl, *.json, *.parquet under it,
               recursive, sorted by path) or a glob; byte tokenizer (nsa.training.corpus).
  fineweb_edu  HuggingFace FineWeb-Edu. With `path`: local parquet file(s), read exactly like "text".
               Without: streamed from the hub with the `datasets` library (sample-10BT, sharded per rank) by a
               background thread; opening the stream and each `next_batch` wait at most `loader_timeout_s`
               (nsa.training.fineweb).

Errors a user can cause (missing path, bad file, bad config value, unreachable hub) raise `DataError`, a
`ValueError` whose message is one line naming the file/key/value and what was expected.
"""

from __future__ import annotations

import os

import torch

from nsa.training.config import DATASETS, DataConfig, DataError
from nsa.training.corpus import PARQUET_EXTENSIONS, WindowSource, check_byte_vocab, read_corpus
from nsa.training.fineweb import FineWebStream
from nsa.training.source import TokenSource
from nsa.training.synthetic import TAG_EVAL, SyntheticSource

__all__ = ["FixedBatches", "TokenSource", "build_eval_source", "build_source"]


def build_source(cfg: DataConfig, *, vocab_size: int, seq_len: int, batch_size: int,
                 rank: int, world_size: int, seed: int) -> TokenSource:
    """The token source `cfg` describes, for data-parallel rank `rank` of `world_size`."""
    check_int("vocab_size", vocab_size, 1)
    check_int("seq_len", seq_len, 1)
    check_int("batch_size", batch_size, 1)
    check_int("world_size", world_size, 1)
    check_int("rank", rank, 0)
    if rank >= world_size:
        raise DataError(f"data: rank must be in [0, world_size={world_size}), got {rank}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"data: seed must be an integer, got {seed!r}")
    check_batch_memory(batch_size, seq_len)

    if cfg.dataset == "synthetic":
        return SyntheticSource(vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size,
                               rank=rank, world_size=world_size, seed=seed)
    check_byte_vocab(cfg.dataset, vocab_size)

    if cfg.dataset == "text":
        tokens = read_corpus(cfg.path, text_key=cfg.text_key, what="text")
        return WindowSource(tokens, kind="text", seq_len=seq_len, batch_size=batch_size,
                             rank=rank, world_size=world_size, origin=cfg.path)
    if cfg.dataset == "fineweb_edu":
        if cfg.path is not None:
            tokens = read_corpus(cfg.path, text_key=cfg.text_key, extensions=PARQUET_EXTENSIONS,
                                 what="fineweb_edu")
            return WindowSource(tokens, kind="fineweb_edu", seq_len=seq_len, batch_size=batch_size,
                                 rank=rank, world_size=world_size, origin=cfg.path)
        return FineWebStream(text_key=cfg.text_key, timeout_s=float(cfg.loader_timeout_s), seq_len=seq_len,
                              batch_size=batch_size, rank=rank, world_size=world_size)
    raise DataError(f"DataConfig.dataset must be one of {' | '.join(DATASETS)}, got {cfg.dataset!r}")


def build_eval_source(cfg: DataConfig, *, vocab_size: int, seq_len: int, batch_size: int,
                      rank: int, world_size: int, seed: int) -> "FixedBatches":
    """A fixed evaluation set for rank `rank`: the same batches again after every `reset()`.

    synthetic: samples of the same process from a separate sample stream (held out: no training sample).
    text / fineweb_edu: the first batches of this rank's shard, i.e. training data (no split is reserved);
    a stable number to compare steps by, not a generalization estimate.
    """
    source = build_source(cfg, vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size,
                          rank=rank, world_size=world_size, seed=seed)
    if cfg.dataset == "synthetic":
        source.sample_tag = TAG_EVAL
    return FixedBatches(source)


class FixedBatches:
    """The first batches of a source, fetched once and replayed from the start after `reset()`."""

    def __init__(self, source: TokenSource) -> None:
        self.source = source
        self._batches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._pos = 0

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._pos == len(self._batches):
            self._batches.append(self.source.next_batch())
        batch = self._batches[self._pos]
        self._pos += 1
        return batch

    def reset(self) -> None:
        self._pos = 0

    def close(self) -> None:
        self.source.close()


# bytes of host memory per token of a micro-batch: the int64 window (seq_len + 1 tokens) and the int64 inputs and
# targets cut from it
BATCH_BYTES_PER_TOKEN = 3 * 8


def host_memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def check_batch_memory(batch_size: int, seq_len: int) -> None:
    """DataError when one micro-batch's token ids alone could not fit in this machine's memory: such a batch would
    otherwise be built sample by sample for hours before running out of memory."""
    memory = host_memory_bytes()
    if memory is None or memory <= 0:
        return
    tokens = batch_size * (seq_len + 1)
    need = tokens * BATCH_BYTES_PER_TOKEN
    if need > memory:
        raise DataError(f"data: batch_size={batch_size} sequences of seq_len+1={seq_len + 1} tokens is {tokens:,} "
                        f"tokens per micro-batch, whose token ids alone need {need / 2**30:,.1f} GiB, more than this "
                        f"machine's {memory / 2**30:,.1f} GiB of memory; lower --batch-size (per rank and micro-batch; "
                        "--accum adds micro-batches) or --seq-len")


def check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"data: {name} must be an integer >= {minimum}, got {value!r}")
