"""Error rates of the significance rules on simulated throughput (validation.analysis.significance.simulate), side by side.

    python benchmarks/bench_significance.py [--reps 2000] [--seed 0] [--json out.json] [--only TABLE ...]

Printed: each table, then the command that reproduces them (one generator runs through the tables in the order run,
so a table's figures depend on the tables before it: --only and its order are part of the command).

Tables (rates are fractions of simulated sweeps or series; Monte-Carlo sd ~ sqrt(p (1 - p) / reps)):
- coverage: 95% interval of a run's mean from block_units vs. the per-step interval, AR(1) steps, by phi and length;
- orders: paired t-test of two variants of a 3-variant sweep, no true difference, under cpu_smoke's noise with a
  sinusoidal drift or a linear one (0.1%/step), by run order (interleaved_order is "random"): how often p < 0.05;
- null: no true difference between 3 variants: decide()'s false-winner rate and how often it leaves the default,
  beside per-step Welch (best vs runner-up), by model and repeats;
- power: one variant 5% faster: how often decide() names it, with the repeats recommended_repeats gives;
- gate: `compare` of two identical cpu_smoke-like runs (12 rows: a 3 x 2 sweep and 6 single runs of 15 AR(1)
  steps, phi 0.7, CV 9%, every run's level varying by run_cv): how often any row is significant after Holm, for
  block means alone, block means plus the between-run part of the repeats' variance, and block means held to the
  repeats' whole variance (what compare does);
- held: single runs (20 AR(1) steps, a linear drift within each run of sd 0.1%/step, a level shift between runs)
  compared with each side held to the run-to-run variation of G groups x R repeats (compare_units' run_noise), by
  layout and machine: "aa" how often an A/A pair is significant, "aa_own_df" the same with a side's own block df
  taken into the Satterthwaite sum (before the df were capped at the repeats'), "lo"/"hi" the Wilson 95% interval
  of "aa", and how often B 5%, 10%, 20% slower is found ("worse", significant).
- ab: an A/B of two arms, R interleaved repeats in random orders (interleaved_order), by machine (AB_MACHINES:
  cpu_smoke's model, a quieter one under the same kind of drift, no drift) and repeats: with no true difference
  (effect 0) how often decide() names a winner ("fp", with its Wilson 95% interval "lo".."hi"), beside the paired t
  and replication alone ("fp_t": decide() before rule 7, the sign-flip test over the repeats' random orders); with
  a true effect how often it names the faster arm ("found", and "found_t" without rule 7). Runs without a declared
  launch_sd (pair_noise).
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from validation.analysis.significance import (adjust_family, block_units, compare_series, compare_units,  # noqa: E402
                                     decide, holm, recommended_repeats, run_noise, t_ppf)
from validation.analysis.significance import simulate as sim  # noqa: E402
from validation.analysis.significance.decision import replicated_blocks  # noqa: E402
from validation.analysis.stats import t_sf2, welch_t_test  # noqa: E402

LABELS = ("25", "50", "100")
TABLES = ("coverage", "orders", "null", "power", "gate", "held", "ab")


def coverage(reps: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for n in (20, 50, 150):
        for phi in (0.0, 0.3, 0.5, 0.7, 0.85):
            x = sim.ar1(rng, (reps, n), phi, 1.0)
            units = [block_units(row) for row in x]
            hit95 = np.mean([abs(u.mean) <= t_ppf(0.975, u.df) * u.se for u in units])
            hit995 = np.mean([abs(u.mean) <= t_ppf(0.9975, u.df) * u.se for u in units])
            naive = np.mean(np.abs(x.mean(1)) <= t_ppf(0.975, n - 1) * x.std(1, ddof=1) / math.sqrt(n))
            rows.append({"n": n, "phi": phi, "blocks_95": float(hit95), "blocks_99.5": float(hit995),
                         "per_step_95": float(naive), "block_len": float(np.mean([u.block_len for u in units])),
                         "ess_per_step": float(np.mean([u.ess for u in units]) / n)})
    return rows


def orders(reps: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    drifts = {"sinusoid 15%": sim.CPU_SMOKE, "none": sim.NO_DRIFT}
    for drift_name, model in drifts.items():
        for order in sim.ORDERS:
            row = {"drift": drift_name, "order": order}
            for repeats in (3, 5, 10):
                m = sim.sweep(rng, reps, [0.0, 0.0, 0.0], repeats, model, order).mean(-1)
                d = np.log(m[:, :, 1] / m[:, :, 0])
                t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(repeats))
                row[f"R{repeats}"] = float(np.mean([t_sf2(float(v), repeats - 1) < 0.05 for v in t]))
            rows.append(row)
    # a steady linear drift of 0.1% per step: the level of run j is shifted by 0.1% x its clock position
    for order in sim.ORDERS:
        row = {"drift": "linear 0.1%/step", "order": order}
        for repeats in (3, 5, 10):
            k = 3
            pos = sim.run_positions(rng, reps, repeats, k, order)
            slot = np.arange(repeats)[None, :, None] * k + pos
            centre = slot * (sim.NO_DRIFT.steps + sim.NO_DRIFT.gap) + sim.NO_DRIFT.steps - sim.NO_DRIFT.window / 2
            m = sim.sweep(rng, reps, [0.0, 0.0, 0.0], repeats, sim.NO_DRIFT, order).mean(-1) * (1 + 0.001 * centre)
            d = np.log(m[:, :, 1] / m[:, :, 0])
            t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(repeats))
            row[f"R{repeats}"] = float(np.mean([t_sf2(float(v), repeats - 1) < 0.05 for v in t]))
        rows.append(row)
    return rows


def _decide_all(y: np.ndarray, default: str) -> tuple[list, list, float]:
    winners, choices, welch = [], [], 0
    means = y.mean(-1)
    for i in range(y.shape[0]):
        if y.shape[1] == 1:
            runs = {k: [y[i, 0, j]] for j, k in enumerate(LABELS)}
        else:
            runs = {k: [float(v) for v in means[i, :, j]] for j, k in enumerate(LABELS)}
        d = decide(runs, default=default)
        winners.append(d.winner)
        choices.append(d.choice)
        order = np.argsort(-means[i].mean(0))
        welch += welch_t_test(y[i, :, order[0]].ravel(), y[i, :, order[1]].ravel())[1] < 0.05
    return winners, choices, welch / y.shape[0]


def null(reps: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for name, model in (("cpu_smoke", sim.CPU_SMOKE), ("no drift", sim.NO_DRIFT)):
        for repeats in (1, 3, 10):
            y = sim.sweep(rng, reps, [0.0, 0.0, 0.0], repeats, model)
            winners, choices, welch = _decide_all(y, "50")
            rows.append({"model": name, "repeats": repeats,
                         "false_winner": float(np.mean([w is not None for w in winners])),
                         "default_left": float(np.mean([c != "50" for c in choices])), "per_step_welch": welch})
    return rows


def power(reps: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for name, model in (("cpu_smoke", sim.CPU_SMOKE), ("no drift", sim.NO_DRIFT)):
        logs = np.log(sim.sweep(rng, 20000, [0.0, 0.0, 0.0], 1, model).mean(-1)[:, 0])
        cv = float(np.concatenate([logs[:, 1] - logs[:, 0], logs[:, 2] - logs[:, 0], logs[:, 2] - logs[:, 1]]).std()
                   / math.sqrt(2))
        repeats = recommended_repeats(cv, 0.05, n_variants=3)
        chunks = [250] * (reps // 250) + [reps % 250] * (reps % 250 > 0)  # `reps` sweeps, 250 at a time
        y = np.concatenate([sim.sweep(rng, n, [0.0, 0.05, 0.0], repeats, model).mean(-1, keepdims=True)
                            for n in chunks])
        winners, _, _ = _decide_all(y, "25")
        rows.append({"model": name, "run_mean_cv": cv, "recommended_repeats": repeats,
                     "found": float(np.mean([w == "50" for w in winners])),
                     "wrong_winner": float(np.mean([w not in (None, "50") for w in winners]))})
    return rows


def _plus_between(ya: np.ndarray, yb: np.ndarray, rn) -> float:
    """p of b vs a with the between-run variance (rn.between^2) added to each side's block variance."""
    ua, ub = block_units(ya), block_units(yb)
    terms = [(ua.rel_se ** 2, ua.df), (ub.rel_se ** 2, ub.df), (2 * rn.between ** 2, rn.df)]
    var = sum(v for v, _ in terms)
    df = var * var / max(sum(v * v / d for v, d in terms), 1e-300)
    return t_sf2(math.log(ub.mean / ua.mean) / math.sqrt(var), df)


def gate(reps: int, rng: np.random.Generator) -> list[dict]:
    rows, n_rows = [], 12
    for run_cv in (0.0, 0.03, 0.08):
        hits = {"blocks": 0, "plus_between": 0, "held_to_repeats": 0}
        for _ in range(reps):
            level = 1e4 * (1 + run_cv * rng.standard_normal((2, n_rows)))
            y = level[..., None] * (1 + sim.ar1(rng, (2, n_rows, 15), 0.7, 0.09))
            groups = [[(y[s, 2 * g + r].mean(), block_units(y[s, 2 * g + r]).rel_se) for r in range(2)]
                      for s in range(2) for g in range(3)]
            rn = run_noise(groups)
            hits["blocks"] += bool(adjust_family([compare_series(y[0, j], y[1, j]) for j in range(n_rows)])
                                   .significant)
            hits["plus_between"] += any(holm([_plus_between(y[0, j], y[1, j], rn) for j in range(n_rows)]).rejected)
            hits["held_to_repeats"] += bool(adjust_family([compare_series(y[0, j], y[1, j], run_noise=rn)
                                                           for j in range(n_rows)]).significant)
        rows.append({"run_cv": run_cv, **{k: v / reps for k, v in hits.items()}})
    return rows


HELD_MACHINES = {"quiet": (0.5, 0.02, 0.02), "cpu_smoke": (0.7, 0.09, 0.05), "busy": (0.9, 0.05, 0.10),
                 "level-bound": (0.3, 0.02, 0.10)}  # phi, CV within a run, sd of the level shift between runs
HELD_LAYOUTS = ((1, 2), (2, 2), (1, 3), (3, 2), (5, 2))  # groups x repeats measuring the run-to-run variation


def _single_runs(rng: np.random.Generator, reps: int, runs: int, phi: float, cv: float, shift: float,
                 slope: float = 0.001, steps: int = 20) -> np.ndarray:
    """Single runs of one configuration: AR(1) steps, a linear drift within each run, a level shift between runs."""
    trend = slope * rng.standard_normal((reps, runs, 1)) * (np.arange(steps) - (steps - 1) / 2.0)
    level = 1.0 + shift * rng.standard_normal((reps, runs, 1))
    return 1e4 * level * (1.0 + trend + sim.ar1(rng, (reps, runs, steps), phi, cv))


def _own_df_p(ua, ub, rn) -> float:
    """p of b vs a with each side's variance the larger of its own and rn.total^2 and the Satterthwaite df of the
    terms taken, a side's own block df included (compare_units before its df were capped at rn.df)."""
    sides = [((u.se / u.mean) ** 2, u.df) for u in (ua, ub)]
    held = [v < rn.total ** 2 for v, _ in sides]
    sides = [(rn.total ** 2, rn.df) if h else side for side, h in zip(sides, held)]
    terms = [(2.0 * rn.total ** 2, rn.df)] if all(held) else sides
    var = sum(v for v, _ in sides)
    df = sum(v for v, _ in terms) ** 2 / sum(v * v / d for v, d in terms)
    return t_sf2(math.log(ub.mean / ua.mean) / math.sqrt(var), df)


def _wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    p = k / n
    mid, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (mid - half) / (1 + z * z / n), (mid + half) / (1 + z * z / n)


def held(reps: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for machine, (phi, cv, shift) in HELD_MACHINES.items():
        for g, r in HELD_LAYOUTS:
            row = {"machine": machine, "layout": f"{g} x {r}"}
            for effect in (0.0, -0.05, -0.10, -0.20):
                y = _single_runs(rng, reps, g * r + 2, phi, cv, shift)
                y[:, -1] *= 1.0 + effect
                hits = own = 0
                for runs in y:
                    rn = run_noise([[(float(m), None) for m in runs[i * r:(i + 1) * r].mean(-1)] for i in range(g)])
                    ua, ub = block_units(runs[-2]), block_units(runs[-1])
                    c = compare_units(ua, ub, run_noise=rn)
                    hits += c.significant and (effect == 0.0 or c.verdict == "worse")
                    own += effect == 0.0 and _own_df_p(ua, ub, rn) < 0.05 and abs(c.rel) > c.noise_floor
                if effect == 0.0:
                    lo, hi = _wilson(hits, reps)
                    row.update(aa=hits / reps, lo=lo, hi=hi, aa_own_df=own / reps)
                else:
                    row[f"found{effect:+.0%}"] = hits / reps
            rows.append(row)
    return rows


AB_MACHINES = {"cpu_smoke": sim.CPU_SMOKE, "quiet+drift": sim.NoiseModel(cv=0.01, drift_amp=0.05),
               "no drift": sim.NO_DRIFT}
AB_CELLS = ((0.0, (2, 3, 5, 6, 8, 10, 20)), (0.05, (6, 10, 20)), (0.02, (6, 10, 20)))  # effect, repeats


def ab_rates(rng: np.random.Generator, reps: int, model: sim.NoiseModel, repeats: int,
             effect: float) -> tuple[int, int]:
    """(decide()'s count, the paired t and replication's count) over `reps` simulated A/Bs: winners of either arm
    with no true difference (effect 0), else the faster arm named the winner."""
    y = sim.sweep(rng, reps, [0.0, effect], repeats, model, "random").mean(-1)
    new = old = 0
    for i in range(reps):
        d = decide({"a": [float(v) for v in y[i, :, 0]], "b": [float(v) for v in y[i, :, 1]]}, default="a")
        c = d.comparisons[0]
        best = d.ranking[0][0]
        lo, hi = (y[i, :, 0], y[i, :, 1]) if best == "b" else (y[i, :, 1], y[i, :, 0])
        t_winner = best if (c.significant and c.verdict == "better" and replicated_blocks(np.log(hi / lo))) else None
        new += d.winner is not None if effect == 0 else d.winner == "b"
        old += t_winner is not None if effect == 0 else t_winner == "b"
    return new, old


def ab(reps: int, rng: np.random.Generator) -> list[dict]:
    rows = []
    for machine, model in AB_MACHINES.items():
        for effect, repeat_list in AB_CELLS:
            if effect == 0.02 and machine != "quiet+drift" or effect == 0.05 and machine == "quiet+drift":
                continue
            for repeats in repeat_list:
                new, old = ab_rates(rng, reps, model, repeats, effect)
                row = {"machine": machine, "effect": effect, "repeats": repeats}
                if effect == 0:
                    lo, hi = _wilson(new, reps)
                    olo, ohi = _wilson(old, reps)
                    row.update(fp=new / reps, lo=lo, hi=hi, fp_t=old / reps, lo_t=olo, hi_t=ohi)
                else:
                    row.update(found=new / reps, found_t=old / reps)
                rows.append(row)
    return rows


def show(name: str, rows: list[dict]) -> None:
    print(f"\n== {name}")
    keys = list(rows[0])
    print("  ".join(f"{k:>14}" for k in keys))
    for r in rows:
        print("  ".join(f"{v:>14.3f}" if isinstance(v, float) else f"{v!s:>14}" for v in r.values()))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", action="append", choices=TABLES)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error(f"--reps must be >= 1, got {args.reps}")
    if args.seed < 0:
        ap.error(f"--seed must be >= 0, got {args.seed}")
    twice = sorted({t for t in args.only or () if args.only.count(t) > 1}, key=TABLES.index)
    if twice:  # the output is keyed by table: a table run twice would keep its second figures only
        ap.error(f"--only: {', '.join(twice)} given more than once (each table runs once)")
    rng = np.random.default_rng(args.seed)
    out = {}
    for name in args.only or TABLES:
        t0 = time.perf_counter()
        out[name] = globals()[name](args.reps, rng)
        show(f"{name} ({time.perf_counter() - t0:.1f} s)", out[name])
    # one generator runs through the tables in order: a table's figures depend on the tables before it
    print("\nreproduce: python benchmarks/bench_significance.py "
          + shlex.join(["--reps", str(args.reps), "--seed", str(args.seed),
                        *(x for t in args.only or () for x in ("--only", t))]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
