"""decide() when the default has no usable run (every run failed or was measured disturbed) and no other variant
wins: the default is kept, never beaten, and the reason says it was not measured (a StopIteration looking for the
comparison against it ended the whole validation run before)."""

from __future__ import annotations

import numpy as np
import pytest

from validation.analysis.significance.decision import decide


def _means(mean: float, n: int, seed: int) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(mean * (1 + rng.normal(0, 0.003))) for _ in range(n)]


@pytest.mark.parametrize("how", ["failed", "disturbed"])
def test_a_default_never_measured_is_kept_when_no_variant_wins(how):
    a, b = _means(100.0, 3, 1), _means(100.0, 3, 2)  # two variants of the same true throughput
    if how == "failed":
        d = decide({"base": [None, None, None], "a": a, "b": b}, default="base")
    else:
        d = decide({"base": _means(100.0, 3, 3), "a": a, "b": b}, default="base",
                   disturbed={"base": [True, True, True]})
    assert d.choice == "base" and d.winner is None and not d.significant
    assert "the default base is kept: it was not measured" in d.reason
    assert dict(d.excluded).get("base")  # the reason it was left out is recorded
