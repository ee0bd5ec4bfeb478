"""validation.analysis.triage on constructed inputs whose answer is known: bisection of a step cliff at a known
point (ends of the range, the documented number of probes), cliffs in noisy scans, and suspects whose effect is
known (one fixes a 5x slowdown; none matters; one makes it worse)."""

import math
import random

import pytest

from validation.analysis.triage import bisect, find_cliffs, point_noise, rank_suspects


@pytest.mark.parametrize("cliff", [64.5, 65, 90, 100, 127, 127.5])
def test_bisection_finds_a_step_cliff_in_log2_width_over_resolution_probes(cliff):
    b = bisect(lambda v: v > cliff, 64, 128, resolution=1, steps=20)
    assert b.good <= cliff < b.bad and b.width == 1 and b.localised  # classify: past the cliff is bad
    assert len(b.points) == math.ceil(math.log2(64 / 1))  # 6 probes for a width of 64 at resolution 1


def test_bisection_on_multiples_stops_at_the_resolution_or_the_steps():
    b = bisect(lambda v: v > 300, 256, 512, resolution=32, steps=3, multiple_of=32)
    assert (b.good, b.bad, [v for v, _ in b.points]) == (288, 320, [384, 320, 288])
    b = bisect(lambda v: v > 300, 256, 512, resolution=32, steps=2, multiple_of=32)
    assert (b.good, b.bad) == (256, 320) and not b.localised and "2 bisection steps spent" in b.stopped


def scan(cliff_after, jump=5.0, noise=0.03, values=(64, 128, 256, 512, 1024), seed=3):
    rng = random.Random(seed)
    return {float(v): [v * 1e-4 * (jump if v > cliff_after else 1.0) * rng.lognormvariate(0, noise)
                       for _ in range(2)] for v in values}


@pytest.mark.parametrize("cliff_after, pair", [(100, (64, 128)), (300, (256, 512)), (700, (512, 1024)),
                                               (5000, None), (10, None)])
def test_a_5x_step_is_found_between_the_right_neighbours_even_at_the_ends(cliff_after, pair):
    found = find_cliffs(point_noise(scan(cliff_after)))
    assert (found.cliff.a, found.cliff.b) == pair if pair else found.cliff is None


def repeats(level, n=3, seed=0):
    rng = random.Random(seed)
    return [level * rng.lognormvariate(0, 0.02) for _ in range(n)]


def test_the_suspect_that_removes_a_5x_slowdown_is_the_culprit_and_none_when_nothing_matters():
    base = repeats(100, seed=1)
    r = rank_suspects(base, {"a": repeats(500, seed=2), "b": repeats(100, seed=3), "c": repeats(101, seed=4)})
    assert r.culprit == "a" and r.as_dict()["ranking"][0] == "a"
    r = rank_suspects(base, {"b": repeats(100, seed=3), "c": repeats(101, seed=4)})
    assert r.culprit is None
    # step time (lower is better): the suspect that cuts it 5x
    r = rank_suspects([1 / x for x in base], {"a": [1 / x for x in repeats(500, seed=2)]}, higher_is_better=False)
    assert r.culprit == "a"


def test_a_suspect_that_makes_things_significantly_worse_is_not_called_insignificant():
    """A suspect that cuts tokens/s by 80% (Holm-adjusted p ~ 1e-5) was reported as "no suspect changes toks_per_s
    significantly beyond the noise floor"."""
    r = rank_suspects(repeats(100, seed=1), {"a": repeats(20, seed=2)})
    assert r.culprit is None and r.comparisons[0].significant
    assert "no suspect changes" not in r.reason and "significantly worse: a -79.8%" in r.reason
