"""What every training data source implements: the `TokenSource` interface (nsa.training.data builds one per
dataset) and `check_state`, the check of a position handed back to `load_state_dict` when a run resumes.

The sources (nsa.training.synthetic, nsa.training.corpus, nsa.training.fineweb) and nsa.training.data import this
module; it imports none of them.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from nsa.training.config import DataError


@runtime_checkable
class TokenSource(Protocol):
    """What `build_source` returns."""

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets), both int64 [batch_size, seq_len]; targets are inputs shifted by one token."""
        ...

    def state_dict(self) -> dict:
        """This rank's data position: small and picklable (plain ints and strings)."""
        ...

    def load_state_dict(self, state: dict) -> str | None:
        """Continue from a position returned by `state_dict()`; a warning to record when the data changed since that
        position was saved (a local corpus edited, grown or shrunk: nsa.training.corpus), else None."""
        ...

    def close(self) -> None:
        """Stop any background thread (idempotent)."""
        ...


def check_state(state, kind: str, keys: tuple[str, ...]) -> dict:
    """`state` when it is a position of the source `kind` with every key in `keys` an integer >= 0; else DataError
    (one line naming the key and the value)."""
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
