"""Statistics for verdicts on autocorrelated, drifting throughput series (issue 15).

Per-step values of a training run are neither independent nor stationary, so comparisons are made on
independent units (units.py: block means with a block length from the autocorrelation, or the means of repeated
runs), as relative differences with confidence intervals (comparison.py: Welch on block/run means, or paired
log-ratios of interleaved repeats), with a noise floor, Holm's correction over a family of rows, a power
calculation for the number of repeats (power.py), and the decision rule of a sweep / A-B (decision.py).
Pure functions and frozen dataclasses with JSON-ready as_dict(); errors are validation.analysis.stats.StatsError.
"""

from validation.analysis.significance.comparison import (ALPHA, MIN_FLOOR, Comparison, Family, Holm, PairNoise, RunNoise,
                                                 adjust_family, compare_paired, compare_series, compare_units, holm,
                                                 noise_floor, pair_noise_from, paired_cv, run_noise)
from validation.analysis.significance.decision import Decision, decide, interleaved_order
from validation.analysis.significance.distributions import norm_cdf, norm_ppf, t_ppf
from validation.analysis.significance.power import (EFFECT, POWER, decision_power, detectable_effect, paired_power,
                                           recommended_repeats)
from validation.analysis.significance.units import (MIN_BLOCKS, Units, autocorrelation, block_units, inefficiency,
                                           lag1_corrected, run_units, sokal_inefficiency)
from validation.analysis.stats import StatsError

__all__ = [
    "ALPHA", "EFFECT", "MIN_BLOCKS", "MIN_FLOOR", "POWER", "Comparison", "Decision", "Family", "Holm", "PairNoise", "RunNoise",
    "StatsError",
    "Units", "adjust_family", "autocorrelation", "block_units", "compare_paired", "compare_series", "compare_units",
    "decide", "decision_power", "detectable_effect", "holm", "inefficiency", "interleaved_order", "lag1_corrected", "noise_floor",
    "norm_cdf", "norm_ppf", "pair_noise_from", "paired_cv", "paired_power", "recommended_repeats", "run_noise", "run_units",
    "sokal_inefficiency",
    "t_ppf",
]
