"""FineWeb-Edu streamed from the HuggingFace hub (dataset fineweb_edu without a local path)."""

from __future__ import annotations

import importlib
import queue
import sys
import threading

import torch

from nsa.training.config import DataError
from nsa.training.corpus import DOC_SEPARATOR, doc_bytes
from nsa.training.source import check_state

FINEWEB_REPO = "HuggingFaceFW/fineweb-edu"
FINEWEB_NAME = "sample-10BT"

_QUEUE_BATCHES = 4


class FineWebStream:
    """FineWeb-Edu streamed from the HuggingFace hub by a background daemon thread.

    Documents of this rank's shard (`datasets.distributed.split_dataset_by_node`) are byte-tokenized, packed
    into seq_len+1 windows (stride seq_len) and grouped into batches in a queue of at most 4 batches. The thread
    starts at the first `next_batch`, so `load_state_dict` before it costs nothing. The state is `docs_consumed`,
    the number of documents packed into the batches handed out so far (empty ones included; the last of them may
    be packed only in part), and `tail_bytes`, how many bytes at the end of those documents' packed stream
    (separators included) no window handed out has started at yet. Resuming reads the shard again, skips that many
    documents and packs the last `tail_bytes` bytes of them first, so the batches that follow are exactly those an
    uninterrupted run hands out next (a state without `tail_bytes`, from an older checkpoint, resumes at the next
    document). When the stream ends it starts over (and a resume counts the passes before: it skips that many
    documents across passes). A shard with no documents, or with only empty ones, is a DataError at the first
    `next_batch` (it would never fill a batch).
    """

    def __init__(self, *, text_key: str, timeout_s: float, seq_len: int, batch_size: int, rank: int,
                 world_size: int) -> None:
        try:
            # optional dependency: only streaming from the hub (importing the submodule binds the package too)
            distributed = importlib.import_module("datasets.distributed")
            datasets = sys.modules["datasets"]
        except ImportError:
            raise DataError("fineweb_edu: streaming from the hub needs the `datasets` library: pip install datasets, "
                            "or pass --data-path to local FineWeb-Edu parquet files") from None
        self.dataset = _open_stream(datasets, distributed, rank=rank, world_size=world_size, timeout_s=timeout_s)
        self.text_key, self.timeout_s = text_key, timeout_s
        self.seq_len, self.batch_size, self.rank, self.world_size = seq_len, batch_size, rank, world_size
        self.docs_consumed = 0
        self.tail_bytes = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=_QUEUE_BATCHES)

    # -- background thread
    def _start(self) -> None:
        self._stop = threading.Event()
        self._queue = queue.Queue(maxsize=_QUEUE_BATCHES)
        self._thread = threading.Thread(target=self._produce,
                                        args=(self._stop, self._queue, self.docs_consumed, self.tail_bytes),
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

    def _produce(self, stop: threading.Event, q: queue.Queue, skip: int, tail: int) -> None:
        n = self.seq_len + 1
        buf = bytearray()  # packed bytes no window has started at yet: the next window starts at buf[0]
        windows: list[torch.Tensor] = []
        docs = skip
        got_first = False
        try:
            while not stop.is_set():
                # a resume's documents are skipped here, one by one, never by the dataset's skip(n): after
                # split_dataset_by_node, datasets' IterableDataset.skip(n) leaves out the first n documents of the
                # whole stream, not of this rank's shard, and where the stream's file count is a multiple of
                # world_size it drops the rank's shard selection too (a SkipExamplesIterable built with
                # split_when_sharding=False shards as itself), so every rank then reads the same documents
                seen_this_pass = text_this_pass = skipped_this_pass = 0
                for record in self.dataset:
                    if stop.is_set():
                        return
                    got_first = True
                    seen_this_pass += 1
                    if skip:
                        skip -= 1
                        skipped_this_pass += 1
                        if tail:  # the skipped documents' last `tail` packed bytes start the resumed stream
                            doc = doc_bytes(record, self.text_key, f"fineweb_edu stream document {docs - skip - 1}")
                            if doc:
                                buf += doc
                                buf.append(DOC_SEPARATOR)
                                del buf[: max(0, len(buf) - tail)]
                            if not skip and len(buf) < tail:
                                raise DataError(f"data state 'fineweb_edu_stream': tail_bytes={tail} but the first "
                                                f"{docs} documents of rank {self.rank}'s shard pack into only "
                                                f"{len(buf)} bytes; the data or world_size changed since the "
                                                "checkpoint")
                        continue
                    doc = doc_bytes(record, self.text_key, f"fineweb_edu stream document {docs}")
                    docs += 1
                    if not doc:
                        continue
                    text_this_pass += 1
                    buf += doc
                    buf.append(DOC_SEPARATOR)
                    while len(buf) >= n:
                        windows.append(torch.frombuffer(bytearray(buf[:n]), dtype=torch.uint8))
                        del buf[: self.seq_len]
                        if len(windows) == self.batch_size:
                            batch = torch.stack(windows).long()
                            windows = []
                            if not self._put(stop, q, ("batch", batch, docs, len(buf))):
                                return
                if seen_this_pass == 0:
                    raise DataError("fineweb_edu: the hub stream yielded no documents for rank "
                                    f"{self.rank} of {self.world_size}")
                if text_this_pass == 0 and skipped_this_pass == 0:  # every pass alike: no batch, ever
                    raise DataError(f"fineweb_edu: the hub stream's {seen_this_pass} document(s) for rank {self.rank} "
                                    f"of {self.world_size} are all empty (field {self.text_key!r}); no text to "
                                    "train on")
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
            item = self._queue.get(timeout=_wait_s(self.timeout_s))
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
        _, windows, docs, tail = item
        self.docs_consumed, self.tail_bytes = docs, tail
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {"kind": "fineweb_edu_stream", "docs_consumed": self.docs_consumed, "tail_bytes": self.tail_bytes}

    def load_state_dict(self, state: dict) -> None:
        state = check_state(state, "fineweb_edu_stream", ("docs_consumed",))
        docs, tail = state["docs_consumed"], state.get("tail_bytes", 0)  # none in an older checkpoint's state
        if isinstance(tail, bool) or not isinstance(tail, int) or tail < 0:
            raise DataError(f"data state 'fineweb_edu_stream': tail_bytes must be an integer >= 0, got {tail!r}")
        if tail and not docs:
            raise DataError(f"data state 'fineweb_edu_stream': tail_bytes={tail} but docs_consumed=0 (no bytes "
                            "before it); expected a position from state_dict()")
        self.close()
        self.docs_consumed, self.tail_bytes = docs, tail
        self._thread = None  # restarted, skipping `docs` documents, at the next next_batch

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)


def _open_stream(datasets, distributed, *, rank: int, world_size: int, timeout_s: float):
    """This rank's shard of the hub stream, opened within `timeout_s` seconds (resolving the dataset asks the hub,
    which a network that drops packets leaves unanswered for minutes); DataError when it fails or takes longer."""
    opened: dict = {}

    def open_() -> None:
        try:
            ds = datasets.load_dataset(FINEWEB_REPO, name=FINEWEB_NAME, split="train", streaming=True)
            opened["dataset"] = distributed.split_dataset_by_node(ds, rank=rank, world_size=world_size)
        except Exception as e:
            opened["error"] = e

    thread = threading.Thread(target=open_, name=f"fineweb_edu-open-rank{rank}", daemon=True)
    thread.start()
    thread.join(_wait_s(timeout_s))
    if thread.is_alive():  # left behind: a daemon thread, it ends with the process
        raise DataError(f"fineweb_edu: the HuggingFace hub did not answer within {timeout_s:g} s "
                        f"(loader_timeout_s / --loader-timeout) while opening {FINEWEB_REPO} {FINEWEB_NAME}; "
                        "check the network or raise the timeout, or pass --data-path to local FineWeb-Edu parquet "
                        "files for offline use")
    if "error" in opened:
        raise DataError(_unreachable(opened["error"]))
    return opened["dataset"]


def _wait_s(timeout_s: float) -> float:
    """`timeout_s` as a thread or queue wait takes it: at most `threading.TIMEOUT_MAX` (about 292 years), beyond
    which such a wait raises OverflowError ("timestamp out of range") where loader_timeout_s allows any finite
    number of seconds."""
    return min(timeout_s, threading.TIMEOUT_MAX)


def _unreachable(e: Exception) -> str:
    detail = str(e).splitlines()[0] if str(e) else ""
    return (f"fineweb_edu: the HuggingFace hub is unreachable ({type(e).__name__}{': ' + detail if detail else ''}); "
            "pass --data-path to local FineWeb-Edu parquet files for offline use")
