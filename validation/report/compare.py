"""Compare two validation runs: every trainer launch both ran (per step, sweep point and repeat), B against A,
with statistics that hold for autocorrelated, drifting throughput (validation.analysis.significance), usable as a CI gate.

Per row (a trainer launch of A and the launch of B with the same step and label; where one run ran a label once
and the other repeatedly, its one launch and the other run's repeat 1, a launch-to-launch comparison held to the
run-to-run variation the repeated side measures, the row named after that repeat):
- toks_per_s: the block means of each run's window (significance.block_units: a block length from the series'
  autocorrelation, so that steps are never taken as independent samples) for the standard error, and the mean of the
  whole window (window_units: the very figure the report shows for that launch) for the difference, each side's
  noise held to at least the run-to-run variation of THAT step (measured_run_noise_by_step: the spread of the
  step's own repeats in the two run directories; steps differ: one thread per process varies more than two ranks
  sharing the cores), and to at least the spread of every step's change between the two runs (step_spread: the
  robust sd of the steps' log-ratios; two validation runs differ step by step by more than the repeats inside each
  show), giving the relative difference B / A - 1 with its confidence interval and p-value. A step that ran no
  repeats has no run-to-run variation of its own: its rows resolve only a change beyond UNREPEATED_MIN_FLOOR
  (UNKNOWN_RUN_NOISE). A launch measured while other work used the machine (its telemetry's
  "interference", on either side) is shown as "inconclusive", never gating and left out of everything else; so is
  a launch with a figure outside its physical range on either side (validation.analysis.plausibility: the earlier
  run of `--against` is judged as this one is), and its final_loss and mem_peak_gb are not shown.
- "all steps (common change)": one log-ratio per step and label (repeats averaged) of every launch measured
  undisturbed in both runs, a one-sample t over them (significance.compare_shift), its noise floor at least
  COMMON_MIN_SHIFT: a change of the code that slows every step (a fault that sleeps in each step) is found here
  even where no single step resolves it, while the whole-machine difference between two quiet runs is not.
- the runbook's declared noise (its `compare` mapping, declared_noise): two runs differ as a whole, and each step
  by more than its repeats inside one run show (the machine between the runs), by amounts one pair cannot measure;
  A/A pairs on the runbook's machine can (benchmarks/bench_aa_compare.py). Every launch's noise is held to at least
  its launch_sd and the common change's standard error to at least its run_sd.
- final_loss and mem_peak_gb: one value per run, so no test: shown with their relative difference, marked
  "tested": false, never gating.
Holm's step-down correction runs over every tested row (significance.adjust_family): the chance that any row of
two identical runs is called significant is at most alpha (5%) where the runs are exchangeable (undisturbed: the
disturbed ones are left out). A row is significant when its Holm-adjusted p is below alpha and its difference
exceeds the noise floor: `noise` (the user's --noise) when given, else the floor measured from the data (the
relative half-width of each side's interval, at least COMMON_MIN_SHIFT). A significant row whose verdict is "worse"
is a regression; `compare` exits 1 when there is one (exit_code), else 0. A row that is not significant is "same"
only when its whole interval lies inside its noise floor, else "inconclusive (noise floor X%)"; a toks_per_s row
that could not be tested (a window too short for block means, a mean of zero) has no interval: "inconclusive",
whatever its change. What compare cannot pair is warned, never dropped unsaid (launch_differences: a step or
launch in one run only, a step whose kind changed, a label run a different number of times in each; a summary metric
one run lacks).

compare_runs() returns (JSON-ready; `nsa-validate compare --json` prints it):
    {"run_a", "run_b": the run directories,
     "runbooks": {"A", "B"}, "verdicts": {"A", "B"},
     "alpha": 0.05, "noise": the user's threshold or null, "noise_source": "user" | "measured",
     "run_noise": {step: RunNoise.as_dict() ({"between", "total", "within", "df", "runs", "groups", "source",
                   "text"})} of the steps that ran repeats, or null,
     "step_spread": RunNoise.as_dict() of the spread of the steps' changes (step_spread), or null,
     "declared_noise": DeclaredNoise.as_dict() (the runbooks' `compare` noise) or null,
     "family": {"correction": "holm", "alpha", "family_size", "statement", "significant", "regressions"},
     "rows": [row, ...], "regressions": [{"step", "metric", "rel", "text"}], "improvements": int,
     "exit_code": 0 | 1, "gate": one sentence, "warnings": [sentences],
     "same_run": true when A and B are one run directory (same_run_dirs: the same path, or two paths to it): every
                 change is 0 by construction and table_lines says so}
    row: {"step": "bucket_sweep[NSA_DDP_BUCKET_MB=25, repeat 2]" (never shortened), "metric", "tested": bool,
          "mean_a", "mean_b", "delta", "rel_delta", "higher_is_better", "significant", "verdict": "better" |
          "worse" | "same" | "inconclusive", "disturbed" (true for a launch measured under interference), "note":
          why a row is not tested (or null), and for tested rows every field of
          significance.Comparison.as_dict(): "method", "rel", "ci_low", "ci_high", "confidence", "p_value",
          "p_adjusted", "family_size", "t", "df", "n_a", "n_b", "ess_a", "ess_b", "noise_floor", "floor_source",
          "run_to_run", "run_to_run_df", "alpha", "text" (one line: difference, CI, p, noise floor, method)}

performance_analysis() is the same comparison of a run against an earlier one (`nsa-validate run/report
--against RUN_DIR`), stored in the run's results.json as "performance_analysis" (see its docstring).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validation.analysis import metrics, plausibility, stats
from validation.analysis.plausibility import implausible
from validation.formatting import finite, fmt_num, fmt_pct, plural
from validation import kinds as step_kinds
from validation.analysis.significance import ALPHA, StatsError, adjust_family
from validation.analysis.significance.comparison import (MAX_USEFUL_FLOOR, PairNoise, RunNoise,
                                                         compare_shift, pair_noise_from)
from validation.analysis.significance.windows import (METRIC, compare_windows, launch_series as _series,  # noqa: F401
                                             measured_run_noise, measured_run_noise_by_step, window_figure,
                                             window_units)
from validation.kinds.base import StepKind
from validation.results.codec import decode
from validation.results.reuse import definition_differences
from validation.results.run import AnalysisRow, Noise, PerformanceAnalysis, Run, Step, read_run
from validation.results.trainer_launch import LaunchMetrics

ENV_KEYS = ("host", "gpu_count", "torch", "cuda", "nccl", "python", "git_sha")
# summary metrics shown besides the windowed throughput (one value per run: no test, never gating)
SUMMARY_METRICS = ("final_loss", "mem_peak_gb")
SUMMARY_NOISE = 0.02  # their "same" band when no --noise is given


def environment_differences(a: Run | dict, b: Run | dict) -> list[str]:
    ea, eb = read_run(a).environment, read_run(b).environment
    pairs = {"host": (ea.host, eb.host), "gpu_count": (ea.gpu_count, eb.gpu_count), "torch": (ea.torch, eb.torch),
             "cuda": (ea.cuda, eb.cuda), "nccl": (ea.nccl, eb.nccl), "python": (ea.python, eb.python),
             "git_sha": (ea.git_sha, eb.git_sha)}
    out = [f"{k} differs: A {_recorded(pairs[k][0])}, B {_recorded(pairs[k][1])}"
           for k in ENV_KEYS if pairs[k][0] != pairs[k][1]]
    names_a = [g.name for g in ea.gpus or []]
    names_b = [g.name for g in eb.gpus or []]
    if names_a != names_b:
        out.append(f"GPUs differ: A {_gpu_names(names_a)}, B {_gpu_names(names_b)}")
    return out


def _recorded(value: Any) -> str:
    """A recorded value in a warning's words: "not recorded" for none, "yes"/"no" for a flag, else its text."""
    if value is None or value == "":
        return "not recorded"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _gpu_names(names: list[Any]) -> str:
    return ", ".join(_recorded(n) for n in names) if names else "none"


def setting_differences(a: Run | dict, b: Run | dict) -> list[str]:
    """What the two runs ran differently beyond the machine (environment_differences): the runbook file of the same
    name (its sha256 covers the file, its includes and the --set), the --set each step ran with, each common step's
    recorded definition (validation.runbook.plan.step_definition: its launches' argv, environment, limits), and the
    source when the git sha alone does not tell (a dirty tree, the source digest). A row of such a step compares two
    configurations, not two runs of one."""
    run_a, run_b = read_run(a), read_run(b)
    out = []
    ea, eb = run_a.environment, run_b.environment
    if ea.source_digest and eb.source_digest and ea.source_digest != eb.source_digest and ea.git_sha == eb.git_sha:
        out.append(f"the source differs at the same git sha (uncommitted changes: A {_recorded(ea.git_dirty)}, "
                   f"B {_recorded(eb.git_dirty)}; source digest {ea.source_digest[:12]} vs {eb.source_digest[:12]})")
    elif ea.git_dirty != eb.git_dirty and (ea.git_dirty or eb.git_dirty):
        out.append(f"git_dirty differs: A {_recorded(ea.git_dirty)}, B {_recorded(eb.git_dirty)} (uncommitted "
                   "changes ran)")
    if (run_a.runbook.name == run_b.runbook.name and run_a.runbook.sha256 and run_b.runbook.sha256
            and run_a.runbook.sha256 != run_b.runbook.sha256):
        out.append(f"runbook {run_a.runbook.name} differs between the runs (sha256 {run_a.runbook.sha256[:12]} vs "
                   f"{run_b.runbook.sha256[:12]}: its file, its includes or its --set)")
    sets_a, sets_b = run_a.overrides(), run_b.overrides()
    if sorted(sets_a) != sorted(sets_b):
        out.append(f"different --set: A {' '.join(sets_a) or 'none'}; B {' '.join(sets_b) or 'none'}")
    for name, step_a in run_a.steps.items():
        step_b = run_b.steps.get(name)
        if step_a is None or step_b is None or not step_a.definition or not step_b.definition:
            continue
        differ, _ = definition_differences(step_b.definition, step_a.definition, {}, names=("in B", "in A"))
        if differ:
            more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
            out.append(f"step {name} ran other settings: {differ[0]}{more}; its rows compare two configurations")
    return out


def launch_differences(a: dict, b: dict) -> list[str]:
    """What compare cannot put side by side, in words: a step whose trainer launches are in one run only (added,
    removed or renamed between the runs), a step of the same name whose kind changed, a step with launches in one
    run and none or only some of the same labels in the other (a step that failed, was skipped or did not finish
    in it: its status is named), a label run a different number of times in each (repeats 1 vs 2: "step sw ran 1
    repeat in A and 2 in B", with what is compared and the launches that are not), so that no launch leaves the
    comparison unsaid."""
    steps_a, steps_b = _raw_steps(a), _raw_steps(b)
    launches = {side: {name: [label for label, _, _ in _train_runs(step)] for name, step in steps.items()
                       if isinstance(step, dict)} for side, steps in (("A", steps_a), ("B", steps_b))}
    out = []
    only = [(side, [n for n, labels in launches[side].items() if labels and n not in launches[other]])
            for side, other in (("A", "B"), ("B", "A"))]
    if any(names for _, names in only):
        out.append("steps with trainer launches in one run only, not compared: "
                   + "; ".join(f"{side} only: {_few(names)}" for side, names in only if names)
                   + " (a step added, removed or renamed between the runs)")
    for name, labels_a in launches["A"].items():
        labels_b = launches["B"].get(name)
        if labels_b is None or not (labels_a or labels_b):
            continue
        step_a, step_b = (decode(Step, steps[name], "step", lenient=True) for steps in (steps_a, steps_b))
        kind_a, kind_b = step_a.kind, step_b.kind
        pairs = _launch_pairs(labels_a, labels_b)
        if kind_a != kind_b:
            out.append(f"step {name} is a {_recorded(kind_a)} step in A and a {_recorded(kind_b)} step in B"
                       + (": its rows compare two kinds of step" if pairs else ""))
        counts = [{g: sum(1 for x in labels if _group(x) == g) for g in map(_group, labels)}
                  for labels in (labels_a, labels_b)]
        # labels that ran in both runs, a different number of times: (repeats in A, repeats in B) -> their labels
        uneven: dict[tuple[int, int], list[str]] = {}
        for g, n_a in counts[0].items():
            n_b = counts[1].get(g, 0)
            if n_b and n_b != n_a:
                uneven.setdefault((n_a, n_b), []).append(g)
        whys = {}  # side -> how its step ended when it did not pass, said of the launches the other run has more of
        for side, step in (("A", step_a), ("B", step_b)):
            status = step.status
            whys[side] = (f"; {side}'s step {status}" + (f" ({step.reason})" if step.reason else "")
                          if status and status != "passed" else "")
        for (n_a, n_b), groups in uneven.items():
            many, few = ("B", "A") if n_b > n_a else ("A", "B")
            n_paired = sum(1 for x in pairs if _group(x) in groups)
            how = (f"{few}'s one launch compared with {many}'s repeat 1 (launch against launch, held to the "
                   f"run-to-run variation {many}'s repeats measure)" if min(n_a, n_b) == 1 and n_paired else
                   f"the {plural(n_paired, 'repeat')} both ran compared launch by launch" if n_paired else
                   "no launch of one paired with a launch of the other")
            left = {side: [x for x in labels if x not in paired and _group(x) in groups]
                    for side, labels, paired in (("A", labels_a, set(pairs)), ("B", labels_b, set(pairs.values())))}
            out.append(f"step {name} ran {plural(n_a, 'repeat')} in A and {n_b} in B ({_few(groups)}): {how}; "
                       + "; ".join(f"{plural(len(left[side]), 'trainer launch', 'trainer launches')} of {side} not "
                                   f"compared ({_few(left[side])})" for side in ("A", "B") if left[side])
                       + whys[few])
        for side, mine, paired, other in (("A", labels_a, set(pairs), "B"), ("B", labels_b, set(pairs.values()), "A")):
            missing = [label for label in mine if label not in paired
                       and not any(_group(label) in groups for groups in uneven.values())]
            if not missing:
                continue
            out.append(f"step {name}: {plural(len(missing), 'trainer launch', 'trainer launches')} of {side} with "
                       f"none of the same label in {other}, not compared ({_few(missing)}){whys[other]}")
    return out


def _launch_pairs(labels_a: list[str], labels_b: list[str]) -> dict[str, str]:
    """A's label -> the label of B's launch compared with it: the same label, or, for a label that ran once in one
    run and repeatedly in the other ("sw[X=25]" in A, "sw[X=25, repeat 1]" and "sw[X=25, repeat 2]" in B), its one
    launch with the other run's repeat 1 (a launch-to-launch comparison, held to the run-to-run variation the
    repeated side measures); the other repeats have none."""
    in_a, in_b = set(labels_a), set(labels_b)
    out = {}
    for label in labels_a:
        first = f"{label[:-1]}, repeat 1]" if label.endswith("]") and not _REPEAT_RE.search(label) else None
        if label in in_b:
            out[label] = label
        elif first is not None and first in in_b and first not in in_a:
            out[label] = first
        elif label.endswith(", repeat 1]") and _group(label) in in_b and _group(label) not in in_a:
            out[label] = _group(label)
    return out


def _row_label(label_a: str, label_b: str) -> str:
    """The row of a pair of launches: their label, or, where one run ran the label once and the other repeatedly,
    the repeated side's label ("sw[X=25, repeat 1]": the launch of it compared)."""
    return label_b if _REPEAT_RE.search(label_b) else label_a


def _few(names: list[str], shown: int = 3) -> str:
    """Names joined, the first `shown` of them, with how many more."""
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _train_runs(step: dict) -> list[tuple[str, dict, str | None]]:
    """(label, metrics, status) of every trainer launch of a step, as its kind lists them
    (StepKind.trainer_launches)."""
    kind = step_kinds.find(step.get("kind")) or StepKind()
    return kind.trainer_launches(kind.read(step))


def _untested(step: str, metric: str, x: Any, y: Any, threshold: float, note: str) -> dict[str, Any]:
    """A row shown, not tested. Its relative difference is None from a zero baseline (no percentage of 0), where
    the verdict follows the sign of the difference itself (memory 0 -> 0.4 GB is worse, not "same")."""
    raw = y - x if isinstance(x, (int, float)) and isinstance(y, (int, float)) else None
    delta = finite(raw)  # 1e308 against -1e308: no number (JSON has no inf), though its sign still decides below
    if raw is None or not x:
        rel = 0.0 if raw == 0 else None
    else:  # y / |x| - sign(x) where the difference itself overflows
        rel = finite(raw / abs(x) if math.isfinite(raw) else y / abs(x) - math.copysign(1.0, x))
    higher = stats.METRIC_DIRECTIONS.get(metric, "higher") == "higher"
    change = rel if rel is not None else raw  # from a zero baseline any change is beyond a relative threshold
    if change is None or change == 0 or (rel is not None and abs(rel) <= threshold):
        verdict = "same"
    else:
        verdict = "better" if (change > 0) == higher else "worse"
    return {"step": step, "metric": metric, "tested": False, "mean_a": x, "mean_b": y, "delta": delta,
            "rel_delta": rel, "higher_is_better": higher, "p_value": None, "p_adjusted": None, "significant": None,
            "verdict": verdict, "note": note}


def _unread_side(side: str, m: dict) -> str:
    """The side of a launch with no per-step values, with what its run recorded of its training.csv when that
    was already unusable then (the launch wrote none: it failed, or was skipped), not lost since."""
    read = decode(LaunchMetrics, m if isinstance(m, dict) else {}, "metrics", lenient=True)
    if isinstance(read.status, str) and read.status not in metrics.USABLE_STATUSES:
        # its reason ("missing: PATH", "empty: ...") names the status itself
        return f"{side}: {read.reason} when it ran" if read.reason else f"{side}: {read.status} when it ran"
    return side


def _disturbance(m: dict) -> str | None:
    """What disturbed one launch (its metrics' "interference"), or None."""
    rec = m.get("interference") if isinstance(m, dict) else None
    return str(rec.get("text") or "disturbed") if isinstance(rec, dict) and rec.get("disturbed") else None


def _group(label: str) -> str:
    """A row's label without its repeat: "sweep[x=1, repeat 2]" -> "sweep[x=1]" (the unit of the common change)."""
    return _REPEAT_RE.sub("]", label)


def compare_runs(a: dict, b: dict, dir_a: Path | str, dir_b: Path | str, noise: float | None = None,
                 alpha: float = ALPHA) -> dict[str, Any]:
    """B against A (see the module docstring for the statistics and the returned dict). `noise`: a relative
    threshold replacing the measured noise floor (0.02 = 2%), or None."""
    run_a, run_b = read_run(a), read_run(b)
    same = same_run_dirs(dir_a, dir_b)
    warnings = environment_differences(run_a, run_b)
    name_a, name_b = run_a.runbook.name, run_b.runbook.name
    if name_a != name_b:
        warnings.append(f"different runbooks: {name_a} vs {name_b}")
    warnings += setting_differences(run_a, run_b)
    warnings += launch_differences(a, b)
    noise_by_step = measured_run_noise_by_step(a, dir_a, extra=[(b, dir_b)], names=("A", "B"))
    declared = declared_noise(run_a, run_b)
    rows: list[dict[str, Any]] = []
    tested: list[tuple[int, Any]] = []
    units: dict[str, list[tuple[float, float]]] = {}  # group -> (mean A, mean B) of each undisturbed launch
    pending: list[tuple] = []  # the undisturbed launches' rows, tested once every step's change is known
    disturbed_rows = implausible_rows = 0
    ended: list[str] = []  # launches that did not pass in either run: "label (B: timeout)"
    unread: list[str] = []  # launches of both runs with no per-step values on a side: "label (A)"
    one_sided: dict[str, list[str]] = {}  # summary metric -> the launches that recorded it in one run only
    repeated = False  # a step ran repeats (disturbed or not): what the warning on unmeasured variation says
    steps_a, steps_b = _raw_steps(a), _raw_steps(b)  # what the kinds read
    for name, step_a in steps_a.items():
        step_b = steps_b.get(name)
        if step_b is None:
            continue
        launches_a, launches_b = _train_runs(step_a), _train_runs(step_b)
        runs_b = {label: (m, status) for label, m, status in launches_b}
        pairs = _launch_pairs([x for x, _, _ in launches_a], list(runs_b))
        rn = noise_by_step.get(name)
        for label_a, ma, status_a in launches_a:
            label = _row_label(label_a, pairs.get(label_a, label_a))
            repeated = repeated or bool(_REPEAT_RE.search(label))
            mb, status_b = runs_b.get(pairs.get(label_a)) or (None, None)
            if not mb:
                continue
            va, vb = _series(Path(dir_a), ma), _series(Path(dir_b), mb)
            # each side's window figure, as its report shows it: what every row of the launch states
            fig_a, fig_b = ((window_figure(va, ma.get(METRIC)), window_figure(vb, mb.get(METRIC))) if va and vb
                            else (None, None))
            # a launch that failed, timed out or hung: what it wrote is no measurement of the configuration
            failed = [f"{side}: {st}" for side, st in (("A", status_a), ("B", status_b)) if st not in (None, "passed")]
            if va and vb and failed:
                ended.append(f"{label} ({', '.join(failed)})")
                rows.append({**_untested(label, METRIC, fig_a, fig_b, 0.0,
                                         f"the launch did not pass ({', '.join(failed)}): its figures decide "
                                         "nothing, never gating"), "verdict": "inconclusive"})
                continue
            if not (va and vb):
                sides = [_unread_side(side, m) for side, v, m in (("A", va, ma), ("B", vb, mb)) if not v]
                unread.append(f"{label} ({' and '.join(sides)})")
            shaken = [f"{side}: {why}" for side, why in (("A", _disturbance(ma)), ("B", _disturbance(mb))) if why]
            bad = [f"{side}: {plausibility.text(b)}" for side, m in (("A", ma), ("B", mb)) for b in implausible(m)]
            if va and vb and bad:  # a figure no machine can measure: its launch's figures are no result, either side
                implausible_rows += 1
                note = ("a figure of the launch is outside its physical range (" + "; ".join(bad) + "): a bug in "
                        "the measurement, not a result; decides nothing, never gating")
                rows.append({**_untested(label, METRIC, fig_a, fig_b, 0.0, note), "verdict": "inconclusive"})
                continue
            if va and vb and shaken:
                disturbed_rows += 1
                row = _untested(label, METRIC, fig_a, fig_b, 0.0,
                                "measured while other work used the machine (" + "; ".join(shaken) + "): decides "
                                "nothing, never gating")
                rows.append({**row, "verdict": "inconclusive", "disturbed": True})
            elif va and vb:
                if fig_a > 0 and fig_b > 0:
                    units.setdefault(_group(label), []).append((fig_a, fig_b))
                pending.append((len(rows), label, va, vb, ma, mb, rn))
                rows.append({"step": label, "metric": METRIC, "tested": True,
                             "note_after": None if rn is not None else UNKNOWN_RUN_NOISE})
            for metric in SUMMARY_METRICS:
                x, y = ma.get(metric), mb.get(metric)
                if isinstance(x, (int, float)) and isinstance(y, (int, float)):
                    # --noise sets their "same" band too, at most MAX_USEFUL_FLOOR: a row whose change is beyond
                    # it is not "same" whatever --noise says (--noise 0.9 called -88% "same")
                    band = min(noise, MAX_USEFUL_FLOOR) if noise is not None else SUMMARY_NOISE
                    rows.append(_untested(label, metric, x, y, band,
                                          "one value per run: shown, not tested, never gating"))
                elif isinstance(x, (int, float)) or isinstance(y, (int, float)):
                    one_sided.setdefault(metric, []).append(
                        f"{label} ({'A' if isinstance(x, (int, float)) else 'B'} only)")
    common = None
    ratios = [math.log(sum(mb for _, mb in pairs) / sum(ma for ma, _ in pairs)) for pairs in units.values()]
    spread = step_spread(ratios)
    untestable: list[int] = []
    for i, label, va, vb, ma, mb, rn in pending:
        # each row held to the larger of its step's own run-to-run variation and the spread of every step's change
        held = max((x for x in (rn, spread, declared.launch) if x is not None), key=lambda x: x.total, default=None)
        try:  # a step without repeats: its run-to-run variation unknown, only a large change resolves on its own
            c = compare_windows(va, vb, stored_a=ma.get(METRIC), stored_b=mb.get(METRIC), higher_is_better=True,
                                alpha=alpha, noise=noise, baseline="A", variant="B", metric=METRIC, run_noise=held,
                                min_floor=COMMON_MIN_SHIFT if rn is not None else UNREPEATED_MIN_FLOOR)
        except StatsError as exc:  # no interval: neither "same" nor a direction, whatever the change shown
            rows[i] = {**_untested(label, METRIC, metrics.window_mean(va, METRIC), metrics.window_mean(vb, METRIC), 0.0,
                                   f"not tested: {exc}"),
                       "verdict": "inconclusive"}
            untestable.append(i)
        else:
            tested.append((i, c))
    if len(ratios) >= COMMON_SHIFT_MIN_ROWS:
        c = compare_shift(ratios, min_shift=COMMON_MIN_SHIFT, alpha=alpha, noise=noise, baseline="A", variant="B",
                          min_se=declared.run_sd, min_se_df=declared.df,
                          metric=METRIC)
        tested.append((len(rows), c))
        rows.append({"step": COMMON_ROW, "metric": METRIC, "tested": True})
        common = len(rows) - 1
    family = None
    tested.sort(key=lambda item: item[0])
    if tested:
        family = adjust_family([c for _, c in tested], alpha)
        for (i, _), c in zip(tested, family.comparisons):
            rows[i].update(c.as_dict())
            rows[i].update(mean_a=c.mean_a, mean_b=c.mean_b, delta=finite(c.mean_b - c.mean_a), rel_delta=c.rel,
                           note=rows[i].pop("note_after", None))
            if rows[i]["note"] == UNKNOWN_RUN_NOISE and rows[i]["verdict"] == "same":
                rows[i]["verdict"] = "inconclusive"  # its interval leaves out the unknown run-to-run variation
    if common is not None:
        rows[common].update(mean_a=None, mean_b=None, delta=None, note=(
            f"the mean change over {len(ratios)} steps' launches measured undisturbed in both runs (each step's "
            f"repeats averaged); its noise floor is at least {fmt_pct(COMMON_MIN_SHIFT)}, what two undisturbed runs "
            "of one configuration on one machine can differ by as a whole"
            + (f"; its standard error at least the runbook's run_sd {fmt_pct(declared.run_sd)} ({declared.source})"
               if declared.run_sd else "")))
    if disturbed_rows:
        warnings.append(f"{plural(disturbed_rows, 'launch', 'launches')} measured while other work used the machine "
                        "(telemetry): shown, never gating; run them again on a quiet machine")
    if implausible_rows:
        warnings.append(f"{plural(implausible_rows, 'launch', 'launches')} with a figure outside its physical range "
                        "in either run (the earlier run's too): shown, not compared, never gating")
    if ended:
        warnings.append(f"{plural(len(ended), 'launch', 'launches')} that did not pass in either run, shown, not "
                        f"compared, never gating: {_few(ended)}")
    if unread:
        more = ", ..." if len(unread) > 3 else ""
        warnings.append(f"{plural(len(unread), 'launch', 'launches')} not compared on {METRIC}, with no per-step "
                        f"values to read on the side named ({', '.join(unread[:3])}{more}): compare reads each "
                        "launch's training.csv from its run directory, and there it is missing, unreadable or empty "
                        "(a launch that wrote none, as its run recorded, or a run directory copied with results.json "
                        "alone)")
    for metric, launches in one_sided.items():
        warnings.append(f"{metric} recorded in one run only for {plural(len(launches), 'launch', 'launches')}, not "
                        f"shown: {_few(launches)}")
    if not noise_by_step and tested:
        why = ("their repeats were measured while other work used the machine" if repeated and disturbed_rows else
               "no repeat passed undisturbed" if repeated else "no step ran repeats")
        warnings.append(f"run-to-run variation not measured for any step ({why}): only the change common to every "
                        "step is tested")
    records = [decode(AnalysisRow, r, f"rows[{i}]") for i, r in enumerate(rows)]
    regressions = [r for r in records if r.tested and r.significant and r.verdict == "worse"]
    improvements = sum(1 for r in records if r.tested and r.significant and r.verdict == "better")
    exit_code = 1 if regressions else 0
    if regressions:
        gate = (f"{plural(len(regressions), 'regression')} beyond the noise floor, significant after Holm's correction: "
                + "; ".join(f"{r.step} {r.metric} {fmt_pct(r.rel, signed=True)}" for r in regressions))
    elif tested:
        gate = "no significant regression"
    else:
        gate = "no row could be tested: nothing to gate on"
    return {"run_a": str(dir_a), "run_b": str(dir_b), "runbooks": {"A": name_a, "B": name_b},
            "verdicts": {"A": run_a.verdict, "B": run_b.verdict},
            "alpha": alpha, "noise": noise, "noise_source": "user" if noise is not None else "measured",
            "run_noise": {k: v.as_dict() for k, v in noise_by_step.items()} or None,
            "step_spread": spread.as_dict() if spread is not None else None,
            "declared_noise": declared.as_dict(),
            "family": ({k: v for k, v in family.as_dict().items() if k != "comparisons"} if family else
                       {"correction": "holm", "alpha": alpha, "family_size": 0,
                        "statement": "no tested rows: nothing was corrected", "significant": 0, "regressions": 0}),
            "rows": rows,
            "regressions": [{"step": r.step, "metric": r.metric, "rel": r.rel, "text": r.text} for r in regressions],
            "improvements": improvements, "exit_code": exit_code, "gate": gate, "warnings": warnings,
            "same_run": same}


def same_run_dirs(dir_a: Path | str, dir_b: Path | str) -> bool:
    """Whether two run directories are one: the same path, or two paths to one directory (a symlink, `./`, `..`)."""
    try:
        return Path(dir_a).resolve() == Path(dir_b).resolve() or Path(dir_a).samefile(dir_b)
    except (OSError, RuntimeError):  # a path that is not there (resolve does not need it): only the names compare
        return Path(dir_a) == Path(dir_b)


def same_run_text(dir_a: Path | str) -> str:
    """The one sentence that says a comparison's two sides are one run (compare_runs' "same_run")."""
    return (f"A and B are the same run ({dir_a}): every change is 0 by construction, so no row can be better or "
            "worse; this compares nothing")


@dataclass(frozen=True)
class DeclaredNoise:
    """How two runs of the runbook differ when nothing changed, as its `compare` mapping declares (measured with
    benchmarks/bench_aa_compare.py on its machine): run_sd, the sd of the change common to every step (log B/A);
    launch (a RunNoise: one run's share of launch_sd, the sd of one launch's log B/A, so launch_sd / sqrt 2),
    df (pairs - 1), source (words). The larger of A's and B's; everything None/0 when neither declares one."""
    run_sd: float | None = None
    launch: RunNoise | None = None
    df: float | None = None
    source: str = ""

    def as_dict(self) -> dict[str, Any] | None:
        if self.run_sd is None and self.launch is None:
            return None
        return {"run_sd": self.run_sd, "launch_sd": None if self.launch is None else self.launch.total * math.sqrt(2),
                "df": self.df, "source": self.source}


def _raw_steps(results: dict) -> dict:
    """A run's step records as results.json holds them (what each step's kind reads)."""
    return results.get("steps") or {}


def declared_noise(a: Run | dict, b: Run | dict) -> DeclaredNoise:
    """The runbooks' declared run-to-run noise (results.json's runbook record, key "compare"; see DeclaredNoise).
    Two runs also differ as a whole, and each step by more than its repeats inside one run show (the machine
    between the runs, step after step): one pair cannot measure that, A/A pairs can. compare holds the change
    common to every step to a standard error of at least run_sd, and every launch's noise to at least launch_sd."""
    found = [(run.runbook.compare or {}, run.runbook.name) for run in (read_run(a), read_run(b))]
    found = [(d, name) for d, name in found if isinstance(d, dict) and d]
    if not found:
        return DeclaredNoise()

    def largest(key: str) -> float | None:
        vals = [float(d[key]) for d, _ in found if isinstance(d.get(key), (int, float)) and d[key] >= 0]
        return max(vals) if vals else None

    run_sd = largest("run_sd")
    sides = [pair_noise_from(d) for d, _ in found]  # the one reader of a declared launch noise
    launch_sd = max((x.sd for x in sides if x is not None), default=None)
    pairs = min(float(d["pairs"]) for d, _ in found if isinstance(d.get("pairs"), (int, float))) \
        if any(isinstance(d.get("pairs"), (int, float)) for d, _ in found) else 2.0
    df = max(pairs - 1.0, 1.0)
    names = sorted({str(n) for _, n in found})
    source = f"declared by runbook {', '.join(names)} from {pairs:g} A/A pairs"
    launch = None if not launch_sd else PairNoise(
        sd=launch_sd, source=f"launch_sd {fmt_pct(launch_sd)} {source}", pairs=pairs).launch_noise()
    return DeclaredNoise(run_sd=run_sd or None, launch=launch, df=df, source=source)


def step_spread(ratios: list[float]) -> RunNoise | None:
    """How much one step's figure moves between the two runs when nothing changed it: the robust spread (1.4826 x
    the median absolute deviation, so that one step that did change does not widen it) of every step's log-ratio,
    as the run-to-run variation of one run's mean (sd / sqrt 2: each row's two sides); None with fewer than
    COMMON_SHIFT_MIN_ROWS steps. Two validation runs differ by more than the repeats inside each show (the machine
    between them, step by step: one quiet A/A pair had a sweep step +11% against a 2.3% run-to-run variation)."""
    if len(ratios) < COMMON_SHIFT_MIN_ROWS:
        return None
    d = sorted(ratios)
    med = d[len(d) // 2] if len(d) % 2 else (d[len(d) // 2 - 1] + d[len(d) // 2]) / 2
    dev = sorted(abs(x - med) for x in d)
    mad = dev[len(dev) // 2] if len(dev) % 2 else (dev[len(dev) // 2 - 1] + dev[len(dev) // 2]) / 2
    total = 1.4826 * mad / math.sqrt(2.0)
    return RunNoise(between=total, total=total, within=0.0, df=float(len(d) - 1), runs=2 * len(d), groups=len(d),
                    source=f"the spread of {len(d)} steps' changes between the two runs")


COMMON_SHIFT_MIN_ROWS = 3  # the change common to every step is tested from this many steps' launches
COMMON_ROW = "all steps (common change)"
# Two undisturbed runs of one configuration on one machine differ as a whole by a few percent (CPU frequency,
# memory placement, the page cache); a change common to every step smaller than this is not told apart from that
# (benchmarks/bench_aa_compare.py measures the false alarms this leaves)
COMMON_MIN_SHIFT = 0.05
# A step that ran no repeats: its run-to-run variation is unknown, and single runs of one configuration on a quiet
# machine have differed by up to 37% (one thread per process); only a change beyond this resolves on its own row
UNREPEATED_MIN_FLOOR = 0.5
UNKNOWN_RUN_NOISE = (f"one run of this step on each side: its run-to-run variation is unknown (the step ran no "
                     f"repeats), so this row resolves only a change beyond {UNREPEATED_MIN_FLOOR:.0%}; smaller ones "
                     "count in the change common to all steps")
_REPEAT_RE = re.compile(r", repeat \d+\]$")


def performance_analysis(current: dict, earlier: dict, current_dir: Path | str, earlier_dir: Path | str,
                         noise: float | None = None, alpha: float = ALPHA) -> dict[str, Any]:
    """This run against an earlier one (`--against RUN_DIR`): compare_runs(earlier, current) (A = the earlier
    run, B = this one) plus what the report's "Performance analysis" section and executive summary show.

    Returns (stored as results.json "performance_analysis"):
        {"against": {"run_dir", "runbook", "started", "verdict", "git_sha"},   # the earlier run
         ...every key of compare_runs() (rows: mean_a = the earlier run's value, mean_b = this run's),
         "key_finding": {"text": one sentence, "step", "metric", "rel", "verdict", "row": the row} -- the largest
                        significant change; with none: {"text": "none: ...", "step": None, "metric": None,
                        "rel": None, "verdict": None, "row": None}}
    """
    out = compare_runs(earlier, current, earlier_dir, current_dir, noise=noise, alpha=alpha)
    before = read_run(earlier)
    out["against"] = {"run_dir": str(earlier_dir), "runbook": before.runbook.name, "started": before.started,
                      "verdict": before.verdict, "git_sha": before.environment.git_sha}
    out["key_finding"] = key_finding(out)
    return out


def key_finding(out: dict[str, Any]) -> dict[str, Any]:
    """The largest significant change of a comparison (by |relative difference|), or "none"; its "row" is the row of
    `out` itself."""
    compared = decode(PerformanceAnalysis, out, "compare")
    significant = [(i, r) for i, r in enumerate(compared.rows) if r.tested and r.significant]
    if not significant:
        n, shown = compared.family.family_size, len(compared.rows)
        # rows shown but none tested (one value per run): compared, not testable; "could not be compared" would
        # contradict the rows the section shows
        return {"text": (f"none: no metric changed significantly ({plural(n, 'comparison')}, Holm-corrected)" if n else
                         f"none: no metric could be tested ({plural(shown, 'metric')} compared, none with the "
                         "values a test needs)" if shown else "none: no metric could be compared"),
                "step": None, "metric": None, "rel": None, "verdict": None, "row": None}
    i, row = max(significant, key=lambda item: abs(item[1].rel))
    return {"text": f"{row.step} {row.metric} {row.verdict}: {row.text}", "step": row.step, "metric": row.metric,
            "rel": row.rel, "verdict": row.verdict, "row": out["rows"][i]}


def table_lines(out: dict[str, Any]) -> list[str]:
    """compare_runs() as plain text lines for a console or a log: a table whose columns are as wide as their
    widest cell (step and metric names are never shortened, whatever the terminal's width), then the correction,
    the run-to-run variation and the gate's result."""
    compared = decode(PerformanceAnalysis, out, "compare")
    head = ("step", "metric", "A", "B", "change", "95% CI", "p", "Holm p", "noise floor", "verdict")
    table = [head]
    for r in compared.rows:
        tested = bool(r.tested)
        ci = f"{fmt_pct(r.ci_low, signed=True)} .. {fmt_pct(r.ci_high, signed=True)}" if tested else "-"
        verdict = str(r.verdict)
        if tested and r.significant:
            verdict += " (significant)"
        elif not tested:
            verdict += " (not tested)"
        table.append((str(r.step), str(r.metric), _num(r.mean_a), _num(r.mean_b), fmt_pct(r.rel_delta, signed=True),
                      ci, _p(r.p_value), _p(r.p_adjusted), fmt_pct(r.noise_floor) if tested else "-", verdict))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [f"B = {compared.run_b}{_run_words(compared, 'B')} against A = {compared.run_a}"
             f"{_run_words(compared, 'A')}"]
    if compared.same_run is True:
        lines.append(same_run_text(compared.run_a) + ".")
    for row in table:
        lines.append("  ".join(cell.ljust(w) if i < 2 or i == len(head) - 1 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row, widths))).rstrip())
    lines.append(compared.family.statement)
    for step, rn in sorted((compared.run_noise or {}).items()):  # {step: RunNoise.as_dict()}
        lines.append(f"{step}: each run's noise is held to at least its {decode(Noise, rn, 'run_noise').text}.")
    sp = compared.step_spread
    if sp:
        lines.append(f"Every row's noise is held to at least {fmt_pct(sp.total)} a side: {sp.source} "
                     f"(robust sd {fmt_pct(sp.total * math.sqrt(2))}, {sp.df:g} df).")
    lines.append(f"Rows marked 'not tested' are shown, never gating: {', '.join(SUMMARY_METRICS)} have one value "
                 "per run" + (f"; a {METRIC} row says below why it was not tested." if any(
                     not r.tested and r.metric == METRIC for r in compared.rows) else "."))
    for r in compared.rows:
        if not r.tested and r.metric == METRIC:
            lines.append(f"  {r.step}: {r.note or 'not tested'}")
    lines.append(f"Result: {compared.gate} (exit {compared.exit_code}).")
    return lines


def _run_words(compared: PerformanceAnalysis, side: str) -> str:
    """What run `side` ("A" or "B") ran and how it ended, as results.json records it: " (runbook cpu_smoke,
    NO-GO)", or "" when neither is recorded."""
    runbooks = compared.runbooks if isinstance(compared.runbooks, dict) else {}
    verdicts = compared.verdicts if isinstance(compared.verdicts, dict) else {}
    words = ([f"runbook {runbooks[side]}"] if runbooks.get(side) else []) + \
        ([str(verdicts[side])] if verdicts.get(side) else [])
    return f" ({', '.join(words)})" if words else ""


def _num(v: Any) -> str:
    """A mean as the report prints it (validation.formatting.fmt_num: 19,214.5, never 1.921e+04)."""
    return fmt_num(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else "n/a"


def _p(v: Any) -> str:
    if not isinstance(v, (int, float)) or not math.isfinite(v):
        return "-"
    return f"{v:.2g}" if v >= 1e-4 else f"{v:.1e}"
