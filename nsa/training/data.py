"""Training data sources: what the trainer calls `next_batch()` on.

`build_source(DataConfig(...), vocab_size=, seq_len=, batch_size=, rank=, world_size=, seed=)` returns a
`TokenSource`. Every source hands out `(inputs, targets)`, both int64 `[batch_size, seq_len]` with ids in
`[0, vocab_size)`, cut from one window of `seq_len + 1` tokens so that `targets[:, :-1] == inputs[:, 1:]`
(next-token prediction). `state_dict()` is this rank's data position (plain ints and strings);
`load_state_dict()` resumes exactly there (best effort for the hub stream).

Datasets (`DataConfig.dataset`), each in its own module:

  synthetic    a seeded, learnable token process (a sparse Markov chain plus verbatim copies of earlier spans),
               generated on the fly; no files (nsa.training.synthetic).
  text         local files: `path` is a file, a directory (every *.txt, *.jsonl, *.json, *.parquet under it,
               recursive, sorted by path) or a glob; byte tokenizer (nsa.training.corpus).
  fineweb_edu  HuggingFace FineWeb-Edu. With `path`: local parquet file(s), read exactly like "text".
               Without: streamed from the hub with the `datasets` library (sample-10BT, sharded per rank) by a
               background thread; `next_batch` waits at most `loader_timeout_s` (nsa.training.fineweb).

Errors a user can cause (missing path, bad file, bad config value, unreachable hub) raise `DataError`, a
`ValueError` whose message is one line naming the file/key/value and what was expected.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from nsa.training.config import DATASETS, DataConfig, DataError


@runtime_checkable
class TokenSource(Protocol):
    """What `build_source` returns."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both int64 [batch_size, seq_len]; targets are inputs shifted by one token."""
        ...

    def state_dict(self) -> dict:
        """This rank's data position: small and picklable (plain ints and strings)."""
        ...

    def load_state_dict(self, state: dict) -> None:
        """Continue from a position returned by `state_dict()`."""
        ...

    def close(self) -> None:
        """Stop any background thread (idempotent)."""
        ...


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

    if cfg.dataset == "synthetic":
        from nsa.training.synthetic import SyntheticSource

        return SyntheticSource(vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size,
                               rank=rank, world_size=world_size, seed=seed)
    from nsa.training.corpus import PARQUET_EXTENSIONS, WindowSource, check_byte_vocab, read_corpus

    check_byte_vocab(cfg.dataset, vocab_size)

    if cfg.dataset == "text":
        tokens = read_corpus(cfg.path, text_key=cfg.text_key, what="text")
        return WindowSource(tokens, kind="text", seq_len=seq_len, batch_size=batch_size,
                             rank=rank, world_size=world_size)
    if cfg.dataset == "fineweb_edu":
        if cfg.path is not None:
            tokens = read_corpus(cfg.path, text_key=cfg.text_key, extensions=PARQUET_EXTENSIONS,
                                 what="fineweb_edu")
            return WindowSource(tokens, kind="fineweb_edu", seq_len=seq_len, batch_size=batch_size,
                                 rank=rank, world_size=world_size)
        from nsa.training.fineweb import FineWebStream

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
        from nsa.training.synthetic import TAG_EVAL

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


def check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"data: {name} must be an integer >= {minimum}, got {value!r}")


def check_state(state, kind: str, keys: tuple[str, ...]) -> dict:
    if not isinstance(state, dict):
        raise DataError(f"data state must be a dict from state_dict(), got {type(state).__name__}")
    if state.get("kind") != kind:
        raise DataError(f"data state is for source {state.get('kind')!r} but this run's source is {kind!r}; "
                        "resume with the same dataset")
    for key in keys:
        value = state.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise DataError(f"data state {kind!r}: {key} must be an integer >= 0, got {value!r}")
    return state
