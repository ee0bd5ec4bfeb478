"""decide(): a stated preference that replaces the best when the default is beaten must itself be ahead of the
default in every replication block (rule 6): otherwise its recommendation ("significant and ahead in every one of
3 interleaved blocks") rested on the best variant's replication, not its own."""

from __future__ import annotations

import numpy as np

from validation.analysis.significance import compare_paired, decide
from validation.analysis.significance.decision import replicated_blocks


def test_an_unreplicated_preference_is_not_chosen_over_the_replicated_best():
    d_pref = np.array([0.30, 0.32, 0.28, 0.31, 0.29, 0.30, 0.05, 0.06, -0.13])  # last third behind on average
    d_best = np.array([0.20, 0.25, 0.22, 0.24, 0.21, 0.23, 0.22, 0.20, 0.24])
    default = [100.0] * 9
    pref, best = list(100.0 * np.exp(d_pref)), list(100.0 * np.exp(d_best))
    # the premises: P beats D significantly on average, but not in the last third; B and P cannot be separated
    against = compare_paired(default, pref)
    assert against.significant and against.verdict == "better"
    assert not replicated_blocks(d_pref)
    assert not compare_paired(pref, best).significant
    d = decide({"D": default, "B": best, "P": pref}, default="D", preference=["P"])
    assert d.significant and d.winner is None
    assert d.choice == "B"  # was "P", recommended as "ahead in every one of 3 interleaved blocks"
    assert d.recommendable and "B is recommended" in d.recommendation


def test_a_replicated_preference_is_still_chosen():
    d_pref = np.array([0.30, 0.32, 0.28, 0.31, 0.29, 0.30, 0.25, 0.26, 0.27])
    d_best = np.array([0.30, 0.33, 0.29, 0.31, 0.30, 0.31, 0.26, 0.27, 0.28])
    default = [100.0] * 9
    d = decide({"D": default, "B": list(100.0 * np.exp(d_best)), "P": list(100.0 * np.exp(d_pref))},
               default="D", preference=["P"])
    assert d.choice == "P" and d.recommendable
