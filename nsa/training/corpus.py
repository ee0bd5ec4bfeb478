"""Local text corpora: the byte tokenizer, the file formats it reads, and windows of the token stream.

Byte tokenizer: a document is its UTF-8 bytes (token id = byte value, `BYTE_VOCAB` = 256 ids, so vocab_size
must be >= 256), and every document is followed by `DOC_SEPARATOR` (token 0, the NUL byte, which does not occur
in ordinary text). Empty documents are skipped. File formats:
  .txt      the whole file is one document (must be UTF-8 without NUL bytes: a NUL marks binary or UTF-16 data)
  .jsonl    one JSON object per line (blank lines skipped); the document is the `text_key` field (a NUL in it,
            JSON's \\u0000, is refused as in a .txt file, here and in parquet text)
  .json     JSON lines as above, or, when the file starts with '[', one JSON array of such objects
  .parquet  the `text_key` column (needs pyarrow; string, large_string, string_view or a dictionary of them);
            every row is a document

Windows (local files): the token stream of N tokens is cut into W = (N - 1) // seq_len windows, window w being
tokens [w*seq_len, w*seq_len + seq_len + 1) (stride seq_len, so one token overlaps). Window w belongs to rank
w % world_size; each rank keeps W // world_size windows (the last W % world_size windows are dropped so every
rank has the same number per epoch and epochs stay aligned across ranks), reads them in order and starts a new
epoch from its first window when done.

A data position (`WindowSource.state_dict()`) records the world size it was saved by (a position of another world
size is refused: DataError), the stream's length (`tokens`) and a fingerprint of its content (`fingerprint`, see
`stream_fingerprint`). A resume on a corpus whose length or fingerprint differs (files
added, removed or edited since the checkpoint) logs a warning naming both: the position now points at other text,
so the resumed run trains on other data than the earlier one (another run). A position beyond the changed corpus is
refused (DataError) as before, the message saying that the corpus changed. A position without them (an older
checkpoint) is taken as of this corpus.
"""

from __future__ import annotations

import glob as _glob
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Iterator

import torch

from nsa.training.config import DataError
from nsa.training.source import check_state

log = logging.getLogger(__name__)

BYTE_VOCAB = 256
DOC_SEPARATOR = 0  # token appended after every document by the byte tokenizer (the NUL byte)

TEXT_EXTENSIONS = (".txt", ".jsonl", ".json", ".parquet")
PARQUET_EXTENSIONS = (".parquet",)

# the stretches of a token stream `stream_fingerprint` hashes: 1,024 of 64 tokens (64 KiB), evenly spaced
FINGERPRINT_STRETCHES = 1024
FINGERPRINT_STRETCH = 64


def check_byte_vocab(dataset: str, vocab_size: int) -> None:
    if vocab_size < BYTE_VOCAB:
        raise DataError(f"data: dataset {dataset!r} uses the byte tokenizer ({BYTE_VOCAB} ids) but "
                        f"vocab_size={vocab_size}; expected vocab_size >= {BYTE_VOCAB}")


def encode_bytes(text: str) -> list[int]:
    """The byte tokenizer: the UTF-8 bytes of `text` as token ids in [0, 256)."""
    return list(text.encode("utf-8"))


def decode_bytes(ids) -> str:
    """Inverse of `encode_bytes` (ids as a list or tensor); invalid UTF-8 becomes U+FFFD."""
    if isinstance(ids, torch.Tensor):
        ids = ids.tolist()
    return bytes(ids).decode("utf-8", errors="replace")


def _collect_files(path: str, extensions: tuple[str, ...], what: str) -> list[Path]:
    kinds = ", ".join("*" + e for e in extensions)
    expanded = os.path.expanduser(path)
    if not os.path.exists(expanded) and any(ch in expanded for ch in "*?["):  # an existing path is taken as named
        matches = sorted(Path(m) for m in _glob.glob(expanded, recursive=True)
                         if os.path.isfile(m) and Path(m).suffix.lower() in extensions)
        # a glob can name one file more than once ("d/**/**/*.txt" matches d/x.txt twice, "d/*/../*.txt" matches it
        # once through every subdirectory of d): each file is read once, else its documents are trained on twice an
        # epoch
        files, seen = [], set()
        for f in matches:
            real = os.path.realpath(f)
            if real not in seen:
                seen.add(real)
                files.append(f)
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
    try:
        if suffix == ".txt":
            yield _read_txt(file)
        elif suffix in (".jsonl", ".json"):
            yield from _iter_json(file, text_key)
        elif suffix == ".parquet":
            yield from _iter_parquet(file, text_key)
        else:  # _collect_files only returns supported suffixes
            raise DataError(f"{file}: unsupported file type (expected {', '.join(TEXT_EXTENSIONS)})")
    except OSError as e:  # unreadable (permissions), vanished or failing while read
        raise DataError(f"{file}: cannot be read ({e.strerror or type(e).__name__}); expected a readable "
                        "file") from None


def _read_txt(file: Path) -> bytes:
    data = file.read_bytes()
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{file}: not UTF-8 text (bad byte at offset {e.start}); "
                        "expected a UTF-8 .txt file") from None
    nul = data.find(bytes([DOC_SEPARATOR]))
    if nul >= 0:  # valid UTF-8 all the same: zeros, or UTF-16 text of ASCII characters
        raise DataError(f"{file}: holds a NUL byte at offset {nul}, so it is binary data (or UTF-16 text), not "
                        "text; expected a UTF-8 .txt file (NUL is the byte tokenizer's document separator)")
    return data


def doc_text(obj, text_key: str, where: str) -> str:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object with a {text_key!r} field, got {type(obj).__name__}")
    if text_key not in obj:
        raise DataError(f"{where}: no {text_key!r} field (text_key); fields present: {sorted(obj)[:10]}")
    text = obj[text_key]
    if not isinstance(text, str):
        raise DataError(f"{where}: field {text_key!r} must be a string, got {type(text).__name__}")
    return text


def doc_bytes(obj, text_key: str, where: str) -> bytes:
    """The UTF-8 bytes of a record's `text_key` field (see `doc_text`). JSON can escape a lone UTF-16 surrogate
    ("\\ud800", from text cut inside a surrogate pair), which has no UTF-8 form: DataError naming where it is."""
    text = doc_text(obj, text_key, where)
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise DataError(f"{where}: field {text_key!r} holds a lone UTF-16 surrogate U+{ord(text[e.start]):04X} at "
                        f"character {e.start}, which has no UTF-8 bytes; expected text (repair or drop the "
                        "document)") from None


def _without_nul(doc: bytes, where: str, text_key: str) -> bytes:
    """A local file's document as it is, or DataError where its text holds a NUL (JSON's \\u0000, a parquet
    string's): NUL is the byte tokenizer's document separator, so the document would be cut in two unsaid; a .txt
    file with one is refused too."""
    nul = doc.find(bytes([DOC_SEPARATOR]))
    if nul >= 0:
        raise DataError(f"{where}: field {text_key!r} holds a NUL character at byte {nul}, the byte tokenizer's "
                        "document separator (it would cut the document in two); expected text (repair or drop the "
                        "document)")
    return doc


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
                    yield _without_nul(doc_bytes(obj, text_key, f"{file}: item {i}"), f"{file}: item {i}", text_key)
                return
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{file}:{lineno}: not valid JSON ({e.msg}); "
                                    "expected one JSON object per line") from None
                yield _without_nul(doc_bytes(obj, text_key, f"{file}:{lineno}"), f"{file}:{lineno}", text_key)
    except UnicodeDecodeError as e:
        raise DataError(f"{file}: not UTF-8 (bad byte at offset {_utf8_error_offset(file, e)}); expected UTF-8 JSON "
                        "lines") from None


def _utf8_error_offset(file: Path, error: UnicodeDecodeError) -> int:
    """The byte offset in `file` of its first byte that is not UTF-8: a text-mode read decodes the file in chunks,
    so the offset its UnicodeDecodeError names counts from the start of the chunk, not of the file."""
    try:
        file.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        return e.start
    except OSError:
        pass
    return error.start  # the file changed since (or vanished): the chunk's offset is all there is


def _import_pyarrow(file: Path):
    try:
        import pyarrow.parquet  # optional dependency: only parquet files need it (this binds pyarrow too)
    except ImportError:
        raise DataError(f"{file}: reading parquet files needs pyarrow: pip install pyarrow") from None
    return pyarrow, pyarrow.parquet


def _is_string_type(pa, col_type) -> bool:
    """An arrow string column: string, large_string or string_view, or a dictionary of them (a categorical column,
    as pandas writes one)."""
    if pa.types.is_dictionary(col_type):
        col_type = col_type.value_type
    is_view = getattr(pa.types, "is_string_view", None)  # pyarrow >= 16
    return (pa.types.is_string(col_type) or pa.types.is_large_string(col_type)
            or (is_view is not None and is_view(col_type)))


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
    if not _is_string_type(pa, col_type):
        raise DataError(f"{file}: column {text_key!r} must hold strings, got {col_type}")
    row = 0
    batches = pf.iter_batches(columns=[text_key])
    while True:
        try:  # a damaged page, or text that is not UTF-8 (a writer other than Arrow's), found while reading it
            batch = next(batches, None)
            texts = [] if batch is None else batch.column(0).to_pylist()
        except (UnicodeDecodeError, pa.ArrowException, OSError) as e:
            detail = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise DataError(f"{file}: damaged parquet data after row {row} of column {text_key!r} "
                            f"({type(e).__name__}: {detail}); expected a readable parquet file of UTF-8 text") from None
        if batch is None:
            return
        for text in texts:
            if text is None:
                raise DataError(f"{file}: row {row} of column {text_key!r} is null; expected a string")
            yield _without_nul(text.encode("utf-8"), f"{file}: row {row}", text_key)
            row += 1


def read_corpus(path: str, *, text_key: str = "text", extensions: tuple[str, ...] = TEXT_EXTENSIONS,
                what: str = "text") -> torch.Tensor:
    """The byte-token stream of every document under `path`: one uint8 tensor, each document + DOC_SEPARATOR.

    `path` is a file, a directory (searched recursively) or a glob (a path that exists is taken as named, even with
    glob characters such as '[' in it); files are read in sorted path order.
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


def stream_fingerprint(tokens: torch.Tensor) -> str:
    """A fingerprint of a token stream, cheap at any size: the sha256 (first 16 hex digits) of its length, its dtype
    and `FINGERPRINT_STRETCHES` stretches of `FINGERPRINT_STRETCH` tokens at evenly spaced offsets, the first and
    the last stretch included (a stream no longer than all the stretches together is hashed whole). Equal streams
    give equal fingerprints; a stream of another length always gives another, and one of the same length whenever
    a change touches a stretch (any change at all in a stream of up to 65,536 tokens)."""
    flat = tokens.reshape(-1)
    n = flat.numel()
    digest = hashlib.sha256(f"{n}:{flat.dtype}:".encode())
    span = FINGERPRINT_STRETCHES * FINGERPRINT_STRETCH
    if n > span:  # integer offsets: the same on every machine
        starts = torch.arange(FINGERPRINT_STRETCHES, dtype=torch.int64) * (n - FINGERPRINT_STRETCH) \
            // (FINGERPRINT_STRETCHES - 1)
        flat = flat[starts[:, None] + torch.arange(FINGERPRINT_STRETCH)]
    digest.update(flat.contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


class WindowSource:
    """Consecutive seq_len+1 windows of an in-memory token stream, sharded round-robin over ranks."""

    def __init__(self, tokens: torch.Tensor, *, kind: str, seq_len: int, batch_size: int, rank: int,
                 world_size: int, origin: str | None = None) -> None:
        n_tokens = tokens.numel()
        n_windows = max(0, (n_tokens - 1) // seq_len)
        if n_windows < world_size:
            need = world_size * seq_len + 1
            corpus = "the corpus" if origin is None else f"the corpus {origin}"
            empty = ", no text at all: every file and document in it is empty," if n_tokens == 0 else ""
            raise DataError(f"{kind}: {corpus} has {n_tokens} tokens (bytes incl. separators){empty} but seq_len="
                            f"{seq_len} and world_size={world_size} need at least {need} (one window of "
                            "seq_len+1 tokens per rank); add text or lower seq_len")
        self.tokens, self.kind = tokens, kind
        self.seq_len, self.batch_size, self.rank, self.world_size = seq_len, batch_size, rank, world_size
        self.windows_per_epoch = n_windows // world_size  # per rank
        self.next_window = 0  # index into this rank's windows
        self.epoch = 0
        self.origin = origin
        self.fingerprint = stream_fingerprint(tokens)
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
        return {"kind": self.kind, "next_window": self.next_window, "epoch": self.epoch, "seq_len": self.seq_len,
                "world_size": self.world_size, "tokens": self.tokens.numel(), "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict) -> str | None:
        """Continue where `state` stopped; returns the warning when the corpus changed since (TokenSource), else None. A state of another seq_len (a resume that changed it) continues at the same
        place in the token stream: the first window of this seq_len at or after the first token not yet read (less
        than one window skipped, none read twice; past the epoch's last window, the next epoch's first), where the
        window index alone would jump elsewhere in the corpus. A state without seq_len (an older checkpoint) is taken
        as of this seq_len. A state of another world_size is refused (DataError): the windows are dealt over the
        ranks anew, so its position would repeat or skip windows; a state without world_size (an older checkpoint)
        is taken as of this world_size.

        A state of a corpus with another length or fingerprint (it changed since the checkpoint) is continued with
        a warning naming both, or refused where its position lies beyond this corpus; a state without them (an
        older checkpoint) is taken as of this corpus."""
        state = check_state(state, self.kind, ("next_window", "epoch"))
        then = state.get("seq_len", self.seq_len)
        if isinstance(then, bool) or not isinstance(then, int) or then < 1:
            raise DataError(f"data state {self.kind!r}: seq_len must be an integer >= 1, got {then!r}")
        ranks_then = state.get("world_size", self.world_size)
        if isinstance(ranks_then, bool) or not isinstance(ranks_then, int) or ranks_then < 1:
            raise DataError(f"data state {self.kind!r}: world_size must be an integer >= 1, got {ranks_then!r}")
        if ranks_then != self.world_size:
            raise DataError(f"data state {self.kind!r}: saved by a run of world_size={ranks_then} but this run has "
                            f"world_size={self.world_size}; windows are dealt round-robin over the ranks, so its "
                            "position would read windows already read again or skip unread ones; resume with "
                            f"{ranks_then} rank(s)")
        changed = self._corpus_change(state)
        corpus_changed = f"the corpus changed since the checkpoint ({changed})" if changed else None
        if then != self.seq_len:
            then_per_epoch = max(0, (self.tokens.numel() - 1) // then) // self.world_size
            if state["next_window"] >= max(then_per_epoch, 1):
                raise DataError(f"data state {self.kind!r}: next_window={state['next_window']} at seq_len={then} but "
                                f"this corpus gives rank {self.rank} only {then_per_epoch} windows of seq_len={then} "
                                f"per epoch; {corpus_changed or 'the data or world_size changed since the checkpoint'}")
            at = -(-state["next_window"] * then // self.seq_len)  # ceil: windows of this seq_len before that token
            past = at >= self.windows_per_epoch  # only the epoch's dropped tail was left: the next epoch
            state = {**state, "next_window": 0 if past else at, "epoch": state["epoch"] + past}
        if state["next_window"] >= self.windows_per_epoch:
            raise DataError(f"data state {self.kind!r}: next_window={state['next_window']} but this corpus gives "
                            f"rank {self.rank} only {self.windows_per_epoch} windows per epoch; "
                            f"{corpus_changed or 'the data or seq_len/world_size changed since the checkpoint'}")
        note = None
        if changed:
            note = (f"{self.kind}: rank {self.rank} resumes on a corpus that changed since the checkpoint "
                    f"({changed}): its position (window {state['next_window']} of epoch {state['epoch']}) now "
                    "points at other text, so this run trains on other data than the run it continues")
            log.warning(note)
        self.next_window, self.epoch = state["next_window"], state["epoch"]
        return note

    def _corpus_change(self, state: dict) -> str | None:
        """How the corpus differs from the one `state` was saved on (its length, else its fingerprint; `origin`
        named), or None where it does not or the state records neither (an older checkpoint)."""
        tokens, fingerprint = state.get("tokens"), state.get("fingerprint")
        if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0):
            raise DataError(f"data state {self.kind!r}: tokens must be an integer >= 0, got {tokens!r}")
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise DataError(f"data state {self.kind!r}: fingerprint must be a string, got {fingerprint!r}")
        where = "" if self.origin is None else f"{self.origin}: "
        n_tokens = self.tokens.numel()
        if tokens is not None and tokens != n_tokens:
            return f"{where}{tokens:,} tokens then, {n_tokens:,} now"
        if fingerprint is not None and fingerprint != self.fingerprint:
            return f"{where}the same {n_tokens:,} tokens, other content: fingerprint {fingerprint} then, " \
                   f"{self.fingerprint} now"
        return None

    def close(self) -> None:
        pass
