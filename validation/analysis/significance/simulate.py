"""Synthetic per-step throughput for the simulation proofs (tests/validation/test_significance.py) and
benchmarks/bench_significance.py: autocorrelated steps plus a slow drift of the machine, vectorized over replicates.

Model of one step's throughput, on a sweep clock that runs through every run in execution order:
    level * (1 + effect_variant) * (1 + drift(clock) + noise(step))
  noise: AR(1) within a run, lag-1 correlation `phi`, marginal CV `cv` (started stationary in every run);
  drift: drift_amp * sin(2 pi clock / P + theta), P uniform in drift_period and theta uniform, drawn per replicate:
         the machine's load coming and going, slowly against a step, fast against a sweep;
  each run takes `steps` clock steps plus `gap` for its start-up; statistics use its last `window` steps.

CPU_SMOKE is calibrated to `nsa-validate run runbooks/cpu_smoke.yaml --only bucket_sweep` on the project's 2-core
CI machine (shared with other jobs), three runs of 40 steps, per-step toks_per_s after the 5 warm-up steps:
  run (NSA_DDP_BUCKET_MB)        100     25      50
  mean toks/s                    8614    9191    9030
  CV of the steps                15.7%   8.1%    10.0%   (8.9%, 6.9%, 9.3% around a linear trend)
  lag-1 autocorrelation          0.83    0.36    0.71    (0.57, 0.15, 0.68 around the trend)
  linear trend per step          -1.27%  +0.43%  -0.36%
  mean of the last 20 steps      7791    9452    8874    (CV 9.6% across the three runs, run back to back)
A grid search over (phi, cv, drift) matching these statistics in simulation gave phi = 0.7, cv = 9%, and a drift of
15% amplitude with a period of 150-600 steps; the model then shows lag-1 0.60 (0.52 around the trend), CV 8.6%
(7.7%), |trend| 0.31%/step and a median CV of 8.7% across three back-to-back window means.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from validation.analysis.stats import StatsError

ORDERS = ("random", "fixed", "rotate", "serpentine")


@dataclass(frozen=True)
class NoiseModel:
    phi: float = 0.7
    cv: float = 0.09
    drift_amp: float = 0.15
    drift_period: tuple[float, float] = (150.0, 600.0)
    steps: int = 40
    gap: int = 10
    window: int = 20
    level: float = 1e4


CPU_SMOKE = NoiseModel()
NO_DRIFT = NoiseModel(drift_amp=0.0)


def ar1(rng: np.random.Generator, shape: tuple[int, ...], phi: float, cv: float) -> np.ndarray:
    """Stationary AR(1) series along the last axis: lag-1 correlation phi, marginal sd cv, mean 0."""
    e = rng.standard_normal(shape) * (cv * math.sqrt(1.0 - phi * phi))
    x = np.empty(shape)
    x[..., 0] = rng.standard_normal(shape[:-1]) * cv
    for t in range(1, shape[-1]):
        x[..., t] = phi * x[..., t - 1] + e[..., t]
    return x


def run_positions(rng: np.random.Generator, reps: int, repeats: int, k: int, order: str) -> np.ndarray:
    """pos[rep, r, v]: the position of variant v within repeat r (0 .. k-1)."""
    if order == "random":
        return np.argsort(rng.random((reps, repeats, k)), axis=-1).argsort(axis=-1)
    r = np.arange(repeats)[:, None]
    v = np.arange(k)[None, :]
    if order == "fixed":
        pos = np.broadcast_to(v, (repeats, k))
    elif order == "rotate":  # repeat r runs labels[(r + i) % k] at position i
        pos = (v - r) % k
    elif order == "serpentine":
        pos = np.where(r % 2 == 0, v, k - 1 - v)
    else:
        raise StatsError(f"order: expected one of {', '.join(ORDERS)}, got {order!r}")
    return np.broadcast_to(pos, (reps, repeats, k)).copy()


def sweep(rng: np.random.Generator, reps: int, effects: Sequence[float], repeats: int = 1,
          model: NoiseModel = CPU_SMOKE, order: str = "random") -> np.ndarray:
    """Window values of `reps` simulated sweeps: array (reps, repeats, k, window) for k = len(effects) variants
    whose true throughputs are level * (1 + effects[v]), run `repeats` times each in the given order."""
    k = len(effects)
    pos = run_positions(rng, reps, repeats, k, order)
    slot = np.arange(repeats)[None, :, None] * k + pos                    # execution index of each run
    clock = slot[..., None] * (model.steps + model.gap) + np.arange(model.steps)
    period = rng.uniform(*model.drift_period, size=(reps, 1, 1, 1))
    theta = rng.uniform(0.0, 2.0 * math.pi, size=(reps, 1, 1, 1))
    drift = model.drift_amp * np.sin(2.0 * math.pi * clock / period + theta)
    noise = ar1(rng, (reps, repeats, k, model.steps), model.phi, model.cv)
    eff = np.asarray(effects, dtype="float64")[None, None, :, None]
    y = model.level * (1.0 + eff) * (1.0 + drift + noise)
    return y[..., -model.window:]
