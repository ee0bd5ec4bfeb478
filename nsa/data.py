"""Training data sources: what the trainer calls `next_batch()` on.

`build_source(DataConfig(...), vocab_size=, seq_len=, batch_size=, rank=, world_size=, seed=)` returns a
`TokenSource`. Every source hands out `(inputs, targets)`, both int64 `[batch_size, seq_len]` with ids in
`[0, vocab_size)`, cut from one window of `seq_len + 1` tokens so that `targets[:, :-1] == inputs[:, 1:]`
(next-token prediction). `state_dict()` is this rank's data position (plain ints and strings);
`load_state_dict()` resumes exactly there (best effort for the hub stream).

Datasets (`DataConfig.dataset`):

  synthetic    a seeded, learnable token process (a sparse Markov chain plus verbatim copies of earlier spans),
               generated on the fly; no files. See `SyntheticSource` for the process and its loss floor.
  text         local files: `path` is a file, a directory (every *.txt, *.jsonl, *.json, *.parquet under it,
               recursive, sorted by path) or a glob. Byte tokenizer (see below).
  fineweb_edu  HuggingFace FineWeb-Edu. With `path`: local parquet file(s), read exactly like "text".
               Without: streamed from the hub with the `datasets` library (sample-10BT, sharded per rank) by a
               background thread; `next_batch` waits at most `loader_timeout_s`.

Byte tokenizer: a document is its UTF-8 bytes (token id = byte value, `BYTE_VOCAB` = 256 ids, so vocab_size
must be >= 256), and every document is followed by `DOC_SEPARATOR` (token 0, the NUL byte, which does not occur
in ordinary text). Empty documents are skipped. File formats:
  .txt      the whole file is one document (must be UTF-8)
  .jsonl    one JSON object per line (blank lines skipped); the document is the `text_key` field
  .json     JSON lines as above, or, when the file starts with '[', one JSON array of such objects
  .parquet  the `text_key` column (needs pyarrow); every row is a document

Windows (local files): the token stream of N tokens is cut into W = (N - 1) // seq_len windows, window w being
tokens [w*seq_len, w*seq_len + seq_len + 1) (stride seq_len, so one token overlaps). Window w belongs to rank
w % world_size; each rank keeps W // world_size windows (the last W % world_size windows are dropped so every
rank has the same number per epoch and epochs stay aligned across ranks), reads them in order and starts a new
epoch from its first window when done.

Errors a user can cause (missing path, bad file, bad config value, unreachable hub) raise `DataError`, a
`ValueError` whose message is one line naming the file/key/value and what was expected.
"""

from __future__ import annotations

import glob as _glob
import importlib
import json
import math
import os
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

import torch

__all__ = [
    "BYTE_VOCAB",
    "DATASETS",
    "DOC_SEPARATOR",
    "DataConfig",
    "DataError",
    "FixedBatches",
    "SyntheticSource",
    "TokenSource",
    "build_eval_source",
    "build_source",
    "decode_bytes",
    "encode_bytes",
    "read_corpus",
]

DATASETS = ("synthetic", "text", "fineweb_edu")

BYTE_VOCAB = 256
DOC_SEPARATOR = 0  # token appended after every document by the byte tokenizer (the NUL byte)

TEXT_EXTENSIONS = (".txt", ".jsonl", ".json", ".parquet")
PARQUET_EXTENSIONS = (".parquet",)

FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_NAME = "sample-10BT"


class DataError(ValueError):
    """A data problem the user caused (path, file contents, config value, hub access); one-line message."""


# ----------------------------------------------------------------------------------------------- config


@dataclass(frozen=True)
class DataConfig:
    """Where training tokens come from.

    dataset           one of DATASETS: "synthetic" | "text" | "fineweb_edu"
    path              "text": a file, directory or glob (required); "fineweb_edu": local parquet file, directory
                      or glob for offline use (None: stream from the hub); ignored by "synthetic"
    loader_timeout_s  longest wait, in seconds, for one batch from a streaming source (--loader-timeout)
    text_key          JSONL field / parquet column holding the document text
    """

    dataset: str = "synthetic"
    path: str | None = None
    loader_timeout_s: float = 120.0
    text_key: str = "text"

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise DataError(f"DataConfig.dataset must be one of {' | '.join(DATASETS)}, got {self.dataset!r}")
        if self.path is not None:
            if isinstance(self.path, os.PathLike):
                object.__setattr__(self, "path", os.fspath(self.path))
            if not isinstance(self.path, str) or not self.path.strip():
                raise DataError(f"DataConfig.path must be a non-empty path string or None, got {self.path!r}")
        if self.dataset == "text" and self.path is None:
            raise DataError("DataConfig.path is required for dataset 'text' (a file, directory or glob; --data-path)")
        t = self.loader_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise DataError(f"DataConfig.loader_timeout_s must be a positive number of seconds, got {t!r}")
        if not isinstance(self.text_key, str) or not self.text_key:
            raise DataError(f"DataConfig.text_key must be a non-empty string, got {self.text_key!r}")


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


# ------------------------------------------------------------------------------------------ tokenizer


def encode_bytes(text: str) -> list[int]:
    """The byte tokenizer: the UTF-8 bytes of `text` as token ids in [0, 256)."""
    return list(text.encode("utf-8"))


def decode_bytes(ids) -> str:
    """Inverse of `encode_bytes` (ids as a list or tensor); invalid UTF-8 becomes U+FFFD."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    return bytes(ids).decode("utf-8", errors="replace")


# ------------------------------------------------------------------------------------------ build


def build_source(cfg: DataConfig, *, vocab_size: int, seq_len: int, batch_size: int,
                 rank: int, world_size: int, seed: int) -> TokenSource:
    """The token source `cfg` describes, for data-parallel rank `rank` of `world_size`."""
    _check_int("vocab_size", vocab_size, 1)
    _check_int("seq_len", seq_len, 1)
    _check_int("batch_size", batch_size, 1)
    _check_int("world_size", world_size, 1)
    _check_int("rank", rank, 0)
    if rank >= world_size:
        raise DataError(f"data: rank must be in [0, world_size={world_size}), got {rank}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise DataError(f"data: seed must be an integer, got {seed!r}")

    if cfg.dataset == "synthetic":
        return SyntheticSource(vocab_size=vocab_size, seq_len=seq_len, batch_size=batch_size,
                               rank=rank, world_size=world_size, seed=seed)
    _check_byte_vocab(cfg.dataset, vocab_size)
    if cfg.dataset == "text":
        tokens = read_corpus(cfg.path, text_key=cfg.text_key, what="text")
        return _WindowSource(tokens, kind="text", seq_len=seq_len, batch_size=batch_size,
                             rank=rank, world_size=world_size)
    if cfg.dataset == "fineweb_edu":
        if cfg.path is not None:
            tokens = read_corpus(cfg.path, text_key=cfg.text_key, extensions=PARQUET_EXTENSIONS,
                                 what="fineweb_edu")
            return _WindowSource(tokens, kind="fineweb_edu", seq_len=seq_len, batch_size=batch_size,
                                 rank=rank, world_size=world_size)
        return _FineWebStream(text_key=cfg.text_key, timeout_s=float(cfg.loader_timeout_s), seq_len=seq_len,
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
    if isinstance(source, SyntheticSource):
        source.sample_tag = _TAG_EVAL
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


def _check_int(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(f"data: {name} must be an integer >= {minimum}, got {value!r}")


def _check_byte_vocab(dataset: str, vocab_size: int) -> None:
    if vocab_size < BYTE_VOCAB:
        raise DataError(f"data: dataset {dataset!r} uses the byte tokenizer ({BYTE_VOCAB} ids) but "
                        f"vocab_size={vocab_size}; expected vocab_size >= {BYTE_VOCAB}")


def _check_state(state, kind: str, keys: tuple[str, ...]) -> dict:
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


# ------------------------------------------------------------------------------------------ synthetic

_MASK64 = (1 << 64) - 1
_TAG_PROCESS = 0x70726F63  # "proc"
_TAG_SAMPLE = 0x73616D70  # "samp"
_TAG_EVAL = 0x6576616C  # "eval"


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _mix_seed(*parts: int) -> int:
    """A 63-bit generator seed from integers (splitmix64 chain): nearby inputs give unrelated seeds."""
    h = 0
    for p in parts:
        h = _splitmix64(h ^ (p & _MASK64))
    return h & ((1 << 63) - 1)


class SyntheticSource:
    """A seeded, learnable token process: a sparse Markov chain with verbatim copies of earlier spans.

    The process (the same on every rank; depends only on `seed` and `vocab_size` V):
      * a random permutation `perm` of the V ids and K = 4 distinct random offsets o_1..o_4 in [1, V).
        In latent space a token z is followed by z + o_c (mod V) with probability PROBS[c] = .50/.25/.15/.10,
        except that with probability NOISE = 0.05 the next token is uniform over all V ids. The emitted id
        is perm[z], so in id space every token has 4 likely successors from an arbitrary-looking sparse table.
      * each sequence alternates Markov segments (length uniform in [32, 160]) with copy segments
        (length uniform in [8, 48]) that repeat, verbatim, a span starting at a uniformly random earlier
        position; the chain then continues from the last copied token. About 23% of tokens are copies
        (sequences of at most 33 tokens are a pure Markov chain: the first segment is at least 32 long).
    Samples: sample i of rank r is drawn from its own torch.Generator seeded from (seed, r, i), so ranks see
    different samples, any sample is reproducible, and `state_dict()` is just {"kind", "next_index"}.

    What loss it allows (nats per token, V = vocab_size):
      * Markov tokens: conditional entropy H_m = `markov_entropy` (exact) ~ 0.95*1.21 + h(0.05) + 0.05*ln V,
        i.e. 1.53 (V=64), 1.62 (V=256), 1.87 (V=32000), against ln V = 4.16, 5.55, 10.37.
      * copied tokens: ~0 once a model finds the source (attention/induction); the first token of each copy
        costs up to ln V. A bigram model (no attention) stays near H_m on all tokens.
      * floor ~ 0.77*H_m + ln V/124 = `entropy_floor` (an estimate): 1.22 (V=64), 1.30 (V=256), 1.53 (V=32000).
    Generation is vectorized per segment (cumulative sums in latent space, no per-token Python loop).
    """

    K = 4
    PROBS = (0.50, 0.25, 0.15, 0.10)
    NOISE = 0.05
    MARKOV_LEN = (32, 160)
    COPY_LEN = (8, 48)
    MIN_VOCAB = 16

    def __init__(self, *, vocab_size: int, seq_len: int, batch_size: int, rank: int, world_size: int,
                 seed: int) -> None:
        if vocab_size < self.MIN_VOCAB:
            raise DataError(f"data: dataset 'synthetic' needs vocab_size >= {self.MIN_VOCAB}, got {vocab_size}")
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.next_index = 0
        self.sample_tag = _TAG_SAMPLE  # build_eval_source switches to a disjoint stream of samples
        g = torch.Generator().manual_seed(_mix_seed(seed, _TAG_PROCESS, vocab_size))
        self.perm = torch.randperm(vocab_size, generator=g)
        self.offsets = torch.randperm(vocab_size - 1, generator=g)[: self.K] + 1  # distinct, nonzero
        self._cum = torch.tensor(self.PROBS, dtype=torch.float64).cumsum(0)

    # -- what the process allows
    @property
    def markov_entropy(self) -> float:
        """Exact conditional entropy (nats) of a Markov token given the previous one."""
        v, eps = self.vocab_size, self.NOISE
        q = [(1 - eps) * p + eps / v for p in self.PROBS]
        return -sum(x * math.log(x) for x in q) - (v - self.K) * (eps / v) * math.log(eps / v)

    @property
    def entropy_floor(self) -> float:
        """Estimated best achievable loss (nats/token): Markov tokens at `markov_entropy`, copies ~free."""
        markov = sum(self.MARKOV_LEN) / 2
        copy = sum(self.COPY_LEN) / 2
        return (markov * self.markov_entropy + math.log(self.vocab_size)) / (markov + copy)

    # -- one sample
    def sample(self, index: int) -> torch.Tensor:
        """Sample `index` of this rank: int64 [seq_len + 1]."""
        v, n = self.vocab_size, self.seq_len + 1
        g = torch.Generator().manual_seed(_mix_seed(self.seed, self.sample_tag, self.rank, index))
        choice = torch.searchsorted(self._cum, torch.rand(n, generator=g, dtype=torch.float64), right=True)
        inc = self.offsets[choice.clamp_max(self.K - 1)]
        reset = torch.rand(n, generator=g) < self.NOISE
        reset[0] = True
        noise_tok = torch.randint(0, v, (n,), generator=g)
        n_seg = n // self.MARKOV_LEN[0] + 1
        m_lens = torch.randint(self.MARKOV_LEN[0], self.MARKOV_LEN[1] + 1, (n_seg,), generator=g).tolist()
        c_lens = torch.randint(self.COPY_LEN[0], self.COPY_LEN[1] + 1, (n_seg,), generator=g).tolist()
        src_u = torch.rand(n_seg, generator=g, dtype=torch.float64).tolist()

        z = torch.empty(n, dtype=torch.int64)
        pos, s = 0, 0
        while pos < n:
            end = min(pos + m_lens[s], n)
            z_prev = int(z[pos - 1]) if pos else 0
            z[pos:end] = self._markov(inc[pos:end], reset[pos:end], noise_tok[pos:end], z_prev)
            pos = end
            if pos >= n:
                break
            length = min(c_lens[s], n - pos, pos)
            src = int(src_u[s] * (pos - length + 1))
            z[pos:pos + length] = z[src:src + length]
            pos += length
            s += 1
        return self.perm[z]

    def _markov(self, inc: torch.Tensor, reset: torch.Tensor, noise_tok: torch.Tensor, z_prev: int) -> torch.Tensor:
        # z_i = u_r + sum_{r < j <= i} inc_j where r is the last reset <= i (u_r its uniform token),
        # or z_prev + sum_{j <= i} inc_j when there is none: one cumsum and one cummax.
        csum = inc.cumsum(0)
        idx = torch.arange(inc.numel())
        last = torch.where(reset, idx, torch.full_like(idx, -1)).cummax(0).values
        base = torch.where(last >= 0, (noise_tok - csum)[last.clamp_min(0)], torch.full_like(idx, z_prev))
        return (base + csum) % self.vocab_size

    # -- TokenSource
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.next_index
        windows = torch.stack([self.sample(start + i) for i in range(self.batch_size)])
        self.next_index = start + self.batch_size
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {"kind": "synthetic", "next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        self.next_index = _check_state(state, "synthetic", ("next_index",))["next_index"]

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------ local files


def _collect_files(path: str, extensions: tuple[str, ...], what: str) -> list[Path]:
    kinds = ", ".join("*" + e for e in extensions)
    expanded = os.path.expanduser(path)
    if any(ch in expanded for ch in "*?["):
        files = sorted(Path(m) for m in _glob.glob(expanded, recursive=True)
                       if os.path.isfile(m) and Path(m).suffix.lower() in extensions)
        if not files:
            raise DataError(f"{what}: no files match {path!r} (expected {kinds} files)")
        return files
    p = Path(expanded)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in extensions)
        if not files:
            raise DataError(f"{what}: directory {path} holds no {kinds} files")
        return files
    if p.is_file():
        if p.suffix.lower() not in extensions:
            raise DataError(f"{what}: {path} is not a supported file (expected {kinds})")
        return [p]
    raise DataError(f"{what}: path {path} does not exist (expected a file, a directory or a glob of {kinds} files)")


def _iter_documents(file: Path, text_key: str) -> Iterator[bytes]:
    """UTF-8 bytes of each document in `file`."""
    suffix = file.suffix.lower()
    if suffix == ".txt":
        data = file.read_bytes()
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError(f"{file}: not UTF-8 text (bad byte at offset {e.start}); "
                            "expected a UTF-8 .txt file") from None
        yield data
    elif suffix in (".jsonl", ".json"):
        yield from _iter_json(file, text_key)
    elif suffix == ".parquet":
        yield from _iter_parquet(file, text_key)
    else:  # _collect_files only returns supported suffixes
        raise DataError(f"{file}: unsupported file type (expected {', '.join(TEXT_EXTENSIONS)})")


def _doc_text(obj, text_key: str, where: str) -> str:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with a {text_key!r} field, got {type(obj).__name__}")
    if text_key not in obj:
        raise DataError(f"{where}: no {text_key!r} field (text_key); fields present: {sorted(obj)[:10]}")
    text = obj[text_key]
    if not isinstance(text, str):
        raise DataError(f"{where}: field {text_key!r} must be a string, got {type(text).__name__}")
    return text


def _iter_json(file: Path, text_key: str) -> Iterator[bytes]:
    try:
        with open(file, encoding="utf-8") as f:
            head = f.read(4096).lstrip()
            f.seek(0)
            if head.startswith("["):
                try:
                    records = json.load(f)
                except json.JSONDecodeError as e:
                    raise DataError(f"{file}:{e.lineno}: not valid JSON ({e.msg}); expected a JSON array of "
                                    "objects or one JSON object per line") from None
                for i, obj in enumerate(records):
                    yield _doc_text(obj, text_key, f"{file}: item {i}").encode("utf-8")
                return
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{file}:{lineno}: not valid JSON ({e.msg}); "
                                    "expected one JSON object per line") from None
                yield _doc_text(obj, text_key, f"{file}:{lineno}").encode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{file}: not UTF-8 (bad byte at offset {e.start}); expected UTF-8 JSON lines") from None


def _import_pyarrow(file: Path):
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{file}: reading parquet files needs pyarrow: pip install pyarrow") from None
    return pa, pq


def _iter_parquet(file: Path, text_key: str) -> Iterator[bytes]:
    pa, pq = _import_pyarrow(file)
    try:
        pf = pq.ParquetFile(file)
    except Exception as e:  # pyarrow raises ArrowInvalid / OSError for a damaged or non-parquet file
        detail = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DataError(f"{file}: not a readable parquet file ({detail})") from None
    names = pf.schema_arrow.names
    if text_key not in names:
        raise DataError(f"{file}: no column {text_key!r} (text_key); columns present: {names[:10]}")
    col_type = pf.schema_arrow.field(text_key).type
    if not (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)):
        raise DataError(f"{file}: column {text_key!r} must hold strings, got {col_type}")
    row = 0
    for batch in pf.iter_batches(columns=[text_key]):
        for text in batch.column(0).to_pylist():
            if text is None:
                raise DataError(f"{file}: row {row} of column {text_key!r} is null; expected a string")
            yield text.encode("utf-8")
            row += 1


def read_corpus(path: str, *, text_key: str = "text", extensions: tuple[str, ...] = TEXT_EXTENSIONS,
                what: str = "text") -> torch.Tensor:
    """The byte-token stream of every document under `path`: one uint8 tensor, each document + DOC_SEPARATOR.

    `path` is a file, a directory (searched recursively) or a glob; files are read in sorted path order.
    `what` names the dataset in error messages.
    """
    sep = bytes([DOC_SEPARATOR])
    stream = bytearray()
    for file in _collect_files(path, extensions, what):
        for doc in _iter_documents(file, text_key):
            if doc:
                stream += doc
                stream += sep
    if not stream:
        return torch.empty(0, dtype=torch.uint8)
    return torch.frombuffer(stream, dtype=torch.uint8)


class _WindowSource:
    """Consecutive seq_len+1 windows of an in-memory token stream, sharded round-robin over ranks."""

    def __init__(self, tokens: torch.Tensor, *, kind: str, seq_len: int, batch_size: int, rank: int,
                 world_size: int) -> None:
        n_tokens = tokens.numel()
        n_windows = max(0, (n_tokens - 1) // seq_len)
        if n_windows < world_size:
            need = world_size * seq_len + 1
            raise DataError(f"{kind}: the corpus has {n_tokens} tokens (bytes incl. separators) but seq_len="
                            f"{seq_len} and world_size={world_size} need at least {need} (one window of "
                            "seq_len+1 tokens per rank); add text or lower seq_len")
        self.tokens, self.kind = tokens, kind
        self.seq_len, self.batch_size, self.rank, self.world_size = seq_len, batch_size, rank, world_size
        self.windows_per_epoch = n_windows // world_size  # per rank
        self.next_window = 0  # index into this rank's windows
        self.epoch = 0
        self._offsets = torch.arange(seq_len + 1)

    def window_start(self, k: int) -> int:
        """Token offset of this rank's k-th window."""
        return (self.rank + k * self.world_size) * self.seq_len

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = []
        for _ in range(self.batch_size):
            starts.append(self.window_start(self.next_window))
            self.next_window += 1
            if self.next_window == self.windows_per_epoch:
                self.next_window, self.epoch = 0, self.epoch + 1
        idx = torch.tensor(starts)[:, None] + self._offsets
        windows = self.tokens[idx].long()
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {"kind": self.kind, "next_window": self.next_window, "epoch": self.epoch}

    def load_state_dict(self, state: dict) -> None:
        state = _check_state(state, self.kind, ("next_window", "epoch"))
        if state["next_window"] >= self.windows_per_epoch:
            raise DataError(f"data state {self.kind!r}: next_window={state['next_window']} but this corpus gives "
                            f"rank {self.rank} only {self.windows_per_epoch} windows per epoch; the data or "
                            "seq_len/world_size changed since the checkpoint")
        self.next_window, self.epoch = state["next_window"], state["epoch"]

    def close(self) -> None:
        pass


# ------------------------------------------------------------------------------------------ hub stream

_QUEUE_BATCHES = 4


class _FineWebStream:
    """FineWeb-Edu streamed from the HuggingFace hub by a background daemon thread.

    Documents of this rank's shard (`datasets.distributed.split_dataset_by_node`) are byte-tokenized, packed
    into seq_len+1 windows (stride seq_len) and grouped into batches in a queue of at most 4 batches. The thread
    starts at the first `next_batch`, so `load_state_dict` before it costs nothing. The state is the number of
    documents fully packed into the batches handed out so far; resuming skips that many documents (best effort:
    the unused tail of the last packed documents is not replayed). When the stream ends it starts over.
    """

    def __init__(self, *, text_key: str, timeout_s: float, seq_len: int, batch_size: int, rank: int,
                 world_size: int) -> None:
        try:
            datasets = importlib.import_module("datasets")
            distributed = importlib.import_module("datasets.distributed")
        except ImportError:
            raise DataError("fineweb_edu: streaming from the hub needs the `datasets` library: pip install datasets, "
                            "or pass --data-path to local FineWeb-Edu parquet files") from None
        try:
            ds = datasets.load_dataset(FINEWEB_REPO, name=FINEWEB_NAME, split="train", streaming=True)
            ds = distributed.split_dataset_by_node(ds, rank=rank, world_size=world_size)
        except Exception as e:
            raise DataError(_unreachable(e)) from None
        self.dataset = ds
        self.text_key, self.timeout_s = text_key, timeout_s
        self.seq_len, self.batch_size, self.rank, self.world_size = seq_len, batch_size, rank, world_size
        self.docs_consumed = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=_QUEUE_BATCHES)

    # -- background thread
    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=_QUEUE_BATCHES)
        self._thread = threading.Thread(target=self._produce, args=(self._stop, self._queue, self.docs_consumed),
                                        name=f"fineweb_edu-loader-rank{self.rank}", daemon=True)
        self._thread.start()

    def _put(self, stop: threading.Event, q: queue.Queue, item) -> bool:
        while not stop.is_set():
            try:
                q.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self, stop: threading.Event, q: queue.Queue, skip: int) -> None:
        n = self.seq_len + 1
        buf = bytearray()
        windows: list[torch.Tensor] = []
        docs = skip
        got_first = False
        try:
            while not stop.is_set():
                ds = self.dataset
                if skip and hasattr(ds, "skip"):
                    ds, skip = ds.skip(skip), 0
                seen_this_pass = 0
                for record in ds:
                    if stop.is_set():
                        return
                    got_first = True
                    seen_this_pass += 1
                    if skip:
                        skip -= 1
                        continue
                    text = _doc_text(record, self.text_key, f"fineweb_edu stream document {docs}")
                    docs += 1
                    if not text:
                        continue
                    buf += text.encode("utf-8")
                    buf.append(DOC_SEPARATOR)
                    while len(buf) >= n:
                        windows.append(torch.frombuffer(bytearray(buf[:n]), dtype=torch.uint8))
                        del buf[: self.seq_len]
                        if len(windows) == self.batch_size:
                            batch = torch.stack(windows).long()
                            windows = []
                            if not self._put(stop, q, ("batch", batch, docs)):
                                return
                if seen_this_pass == 0:
                    raise DataError("fineweb_edu: the hub stream yielded no documents for rank "
                                    f"{self.rank} of {self.world_size}")
        except DataError as e:
            self._put(stop, q, ("error", str(e)))
        except Exception as e:
            msg = _unreachable(e) if not got_first else \
                f"fineweb_edu: the hub stream failed after {docs} documents ({type(e).__name__}: {e}); " \
                "pass --data-path to local parquet files for offline use"
            self._put(stop, q, ("error", msg.replace("\n", " ")))

    # -- TokenSource
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self._thread is None:
            self._start()
        try:
            item = self._queue.get(timeout=self.timeout_s)
        except queue.Empty:
            raise DataError(f"fineweb_edu: no batch within {self.timeout_s:g} s (loader_timeout_s / "
                            "--loader-timeout); the hub stream is slow or stalled: raise the timeout or pass "
                            "--data-path to local parquet files") from None
        if item[0] == "error":
            try:
                self._queue.put_nowait(item)  # every later call fails the same way
            except queue.Full:
                pass
            raise DataError(item[1])
        _, windows, docs = item
        self.docs_consumed = docs
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {"kind": "fineweb_edu_stream", "docs_consumed": self.docs_consumed}

    def load_state_dict(self, state: dict) -> None:
        docs = _check_state(state, "fineweb_edu_stream", ("docs_consumed",))["docs_consumed"]
        self.close()
        self.docs_consumed = docs
        self._thread = None  # restarted, skipping `docs` documents, at the next next_batch

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)


def _unreachable(e: Exception) -> str:
    detail = str(e).splitlines()[0] if str(e) else ""
    return (f"fineweb_edu: the HuggingFace hub is unreachable ({type(e).__name__}{': ' + detail if detail else ''}); "
            "pass --data-path to local FineWeb-Edu parquet files for offline use")
