"""The alternated A/B cases of a GPU run as one table: each choice against its baseline, round by round, and
whether it was faster in every round; then the run's steps that failed or were skipped.

    python benchmarks/ab_table.py /tmp/nsa_gpu/choices                 # PART=choices' C3 cases
    python benchmarks/ab_table.py kernels selection --baseline shipped,sort --json ab.json

reports/gpu/next_run.sh writes one bench_attention.py JSON per arm, round and case, named
<label>_<arm>_r<round>_<case>.json: `layer_shipped_r1_65536.json` against `layer_auto_r1_65536.json` (K1),
`layer_sort_r2_65536.json` against `layer_topk_r2_65536.json` (S3), `query-choice_bn32_shipped_r1_2048b8.json`
against `query-choice_bn32_new_r1_2048b8.json` (C3). Files of each (folder, label, case) are one comparison: the
arm named in --baseline (the first of its names present) against each other arm, per round, on the medians of
forward, backward and forward + backward. A choice is "faster in every round" when its forward + backward median is
below the baseline's in each round it ran (the rule next_run.sh states for making it the default; the numerics and
memcheck steps are the other half of that rule: their exits are listed below the table). A round with an arm
missing or failed makes the comparison "incomplete", and so does a comparison of fewer than two rounds (a round
skipped for time leaves no file): nothing is decided from one round; such a round says why ("not measured (no
file)", a file with no timed case). The verdict compares the same mode in every round (forward + backward, or the
forward where a round has no backward); a median that is not a positive finite time is no figure ("-"), never a
ratio, and no ratio that is not a positive finite number decides anything. A JSON file that does not parse (cut
mid-write by its step's time limit) is one row, "not measured", with its step's exit.

The other A/Bs of a run, each file read by its contents:
- timed by alternated calls in one process, each call pair a round: bench_selection.py --topk-ab's JSON (S3's
  topk_ab.json: topk against sort, per S, for the tiled selection and for choose_blocks alone) and bench_loss.py's
  (T0's loss.json: each implementation against the reference). "Faster in every round" when the largest of the
  rounds' choice / baseline time ratios (their *ratio_max) is below 1, "slower in every round" when the smallest is
  above 1; fewer than two calls decide nothing. The row shows the medians of one call.
- bench_train.py --variant's runs (T1's <name>.runs.json, one row per run): per model, mode and context, each
  variant against the baseline variant (the first of --baseline run, "old" in next_run.sh), its repeats the rounds.
  Its figure is a throughput: the round's ratio is the baseline's tokens/s over the choice's, a time ratio like
  every other ratio here (below 1: the choice is faster). A run that failed has no row: its round is "not
  measured", and a variant none of whose runs ran (its errors in the runs' summaries, <name>.json) is listed so.
- bench_choices.py's JSON (K3, C3: every launch choice against the shipped one in one process, each round a block
  of the baseline and a block of the choice adjacent in time): one comparison per arm, read as the files above;
  an arm that finished counts even when its step failed later (another arm's crash), one that failed does not.
  The baseline's outputs are checked here as bench_choices checks them at the end of a run (each baseline block's
  loss and input-gradient norm within 2% of the first's): a run cut before that check left a change unsaid, and
  every arm of a file whose baseline changed is "incomplete".
tune_kernels.py's rows (C4) keep only each side's min / median / max, no round's ratio: not in the table.

Each folder's log.txt (or the one beside it, next_run.sh's $OUT/log.txt) gives the steps' exits: every step that
did not exit 0, and every step skipped for time, is listed. A file whose step (next_run.sh's <part letter><n>_<file
name>) last exited non-zero or was skipped is no figure of this run, though it may hold times: a step cut by its
time limit (exit 124 or 137), or skipped, leaves the file an earlier call on the same machine wrote; its rounds are
"failed". The exception is bench_train, which writes its runs and then exits 1 when one of them failed: its file
counts unless the step was cut or skipped.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

NAME = re.compile(r"^(?P<label>.+)_(?P<arm>[^_]+)_r(?P<round>\d+)_(?P<case>[^_]+)\.json$")
MODES = ("fwd", "bwd", "fwdbwd")
STEP_EXIT = re.compile(r"^\[\d+s\] (?P<step>\S+) exit (?P<code>\d+)")
STEP_SKIPPED = re.compile(r"^\[\d+s\] SKIPPED (?P<step>\S+): (?P<why>.*)$")
STEP_OF_FILE = re.compile(r"^[A-Z]\d+_(?P<stem>.+)$")  # next_run.sh's step name for the file <stem>.json
CUT = ("exit 124", "exit 137", "skipped")  # timeout's exits at the step's limit (TERM, then KILL), or not run


def medians(path: Path) -> dict | None:
    """{mode: median ms} of a bench_attention JSON's one timed case (None for a median that is not a positive
    finite time), or None when it holds no timed case (a case that failed, or a file that is not one)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    results = data.get("results") if isinstance(data, dict) else None
    cases = [c for c in results if isinstance(c, dict) and isinstance(c.get("times_s"), dict)] \
        if isinstance(results, list) else []
    if len(cases) != 1:
        return None
    out = {}
    for mode, stats in cases[0]["times_s"].items():
        if mode in MODES:  # a median outside its physical range is kept as None: no figure, never a ratio
            value = stats.get("median") if isinstance(stats, dict) else None
            out[mode] = value * 1e3 if is_time(value) else None
    return out


def is_time(value) -> bool:
    """A median in seconds within its physical range: a finite number above 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def round_verdict(ratios: list) -> str:
    """A comparison's verdict from its rounds' ratios (choice over baseline, time: below 1 is faster): "incomplete"
    with one round only or a round missing or failed (nothing decided), or a ratio that is not a positive finite
    number (a zero, negative or NaN time on a side: no measurement), else faster or slower in every round, or mixed
    (a tie in any round is neither)."""
    if len(ratios) < 2 or not all(is_time(x) for x in ratios):
        return "incomplete"
    if all(x < 1 for x in ratios):
        return "faster in every round"
    if all(x > 1 for x in ratios):
        return "slower in every round"
    return "mixed"


def comparisons(folder: Path, baselines: tuple[str, ...]) -> list[dict]:
    """One record per (label, case, arm other than the baseline) of the folder's A/B files, then the comparisons of
    its bench_selection --topk-ab, bench_loss and bench_train --variant runs files (module docstring)."""
    groups: dict[tuple[str, str], dict[str, dict[int, dict | None]]] = {}
    failed = failed_files(folder)
    notes: dict[tuple[str, str, str, int], str] = {}  # (label, case, arm, round): why its file is no figure
    others = []
    for path in sorted(folder.glob("*.json")):
        m = NAME.match(path.name)
        if m:
            arms = groups.setdefault((m["label"], m["case"]), {})
            arms.setdefault(m["arm"], {})[int(m["round"])] = None if path.stem in failed else medians(path)
            if path.stem in failed:
                notes[(m["label"], m["case"], m["arm"], int(m["round"]))] = failed[path.stem]
        else:
            why = failed.get(path.name.split(".")[0])
            if _read(path) is None:  # cut mid-write (its step's time limit) or not JSON: said, not left out
                others.append(unreadable_record(folder, path, why))
                continue
            cut = why if why and why.endswith(CUT) else None  # bench_train writes, then exits 1 if a run failed
            others += calls_records(folder, path, why) + train_records(folder, path, baselines, cut)
            others += choices_records(folder, path)  # the file says which arms finished, whatever its step's exit
    records = []
    for (label, case), arms in groups.items():
        base = next((b for b in baselines if b in arms), None)
        if base is None:
            continue  # no baseline arm: not an A/B of this table
        for arm in sorted(a for a in arms if a != base):
            rounds = sorted(set(arms[arm]) | set(arms[base]))
            per_round = []
            for r in rounds:
                a, b = arms[arm].get(r), arms[base].get(r)
                ratio = {m: a[m] / b[m] for m in MODES if a and b and a.get(m) and b.get(m)}
                per_round.append({"round": r, "baseline_ms": b, "choice_ms": a, "ratio": ratio})
                why = [notes[k] for k in ((label, case, base, r), (label, case, arm, r)) if k in notes]
                if why:
                    per_round[-1]["failed"] = "; ".join(why)
            # one mode in every round: forward + backward where any file of the comparison times a backward,
            # else (forward-only paths) the forward
            timed = [ms for p in per_round for ms in (p["baseline_ms"], p["choice_ms"]) if ms]
            mode = "fwdbwd" if any("fwdbwd" in ms for ms in timed) else "fwd"
            for p in per_round:  # a round without its figure says why: no file, no timed case, no time
                if "failed" in p:
                    continue
                why = [f"{side} {_missing(arms[who], p['round'], mode)}" for side, who in (("baseline", base),
                                                                                          ("choice", arm))
                       if _missing(arms[who], p["round"], mode)]
                if why:
                    p["failed"] = "; ".join(why)
            ratios = [p["ratio"].get(mode) for p in per_round]
            verdict = round_verdict(ratios)
            records.append({"folder": str(folder), "label": label, "case": case, "baseline": base, "choice": arm,
                            "rounds": per_round, "verdict": verdict})
    return records + others


def _missing(files: dict, rnd: int, mode: str) -> str | None:
    """Why one arm's round has no figure in `mode`, or None: no file (never measured), a file with no timed case
    (the case failed, or the file is not readable: cut mid-write), no median in `mode`. A median that is not a
    positive finite time is shown as "-" (no figure, never a ratio) without more words."""
    if rnd not in files:
        return "not measured (no file)"
    ms = files[rnd]
    if ms is None:
        return "not measured (no timed case in its file: failed, or not readable)"
    return f"{mode} not measured" if mode not in ms else None


def unreadable_record(folder: Path, path: Path, failed: str | None = None) -> dict:
    """A JSON file of the folder that does not parse (a benchmark killed while writing it): one row saying that what
    it held was not measured, with its step's exit where the log has one."""
    why = "not readable as JSON (cut mid-write?)" + (f"; {failed}" if failed else "")
    return {"folder": str(folder), "label": path.stem, "case": "-", "baseline": "-", "choice": "-",
            "rounds": [{"round": "-", "baseline_ms": None, "choice_ms": None, "ratio": {}, "failed": why}],
            "verdict": "not measured"}


def _read(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _calls_record(folder: Path, label: str, case, baseline: str, choice: str, fig: dict, calls,
                  failed: str | None) -> dict:
    """One comparison timed in one process by alternated calls (bench_selection --topk-ab, bench_loss): fig holds
    the medians of a call ("base_ms", "choice_ms"), their ratio choice / baseline ("ratio") and the smallest and
    largest of the rounds' ratios ("ratio_min", "ratio_max"); every round faster is ratio_max below 1."""
    fig = {k: None if failed or not is_time(v) else v for k, v in fig.items()}  # failed: not read
    if not (isinstance(calls, int) and not isinstance(calls, bool) and calls >= 2) or None in fig.values():
        verdict = "incomplete"  # one call, or a figure missing: nothing decided
    else:  # every round's ratio lies between the smallest and the largest
        verdict = round_verdict([fig["ratio_min"], fig["ratio_max"]])
    rnd = {"round": f"1-{calls}" if isinstance(calls, int) else "?", "calls": calls,
           "baseline_ms": {"call": fig["base_ms"]}, "choice_ms": {"call": fig["choice_ms"]},
           "ratio": {"call": fig["ratio"]} if fig["ratio"] is not None else {},
           "ratio_min": fig["ratio_min"], "ratio_max": fig["ratio_max"]}
    if failed:
        rnd["failed"] = failed
    return {"folder": str(folder), "label": label, "case": str(case), "baseline": baseline, "choice": choice,
            "mode": "call", "rounds": [rnd], "verdict": verdict}


def calls_records(folder: Path, path: Path, failed: str | None = None) -> list[dict]:
    """The comparisons of a JSON timed by alternated calls in one process (module docstring): bench_selection
    --topk-ab's (topk against sort, per S, the tiled selection and choose_blocks) and bench_loss's (each
    implementation against the reference); [] for a file of another kind. failed: why the file's step is no figure
    of this run."""
    data = _read(path)
    if not isinstance(data, dict):
        return []
    rows, impls = data.get("by_seq_len"), data.get("by_impl")
    records = []
    if isinstance(rows, list) and rows and all(isinstance(r, dict) and "tiled_ratio" in r for r in rows):
        for row in rows:
            for what, label in (("tiled", "tiled selection"), ("choose", "choose_blocks")):
                fig = {"base_ms": row.get(f"{what}_sort_ms"), "choice_ms": row.get(f"{what}_topk_ms"),
                       "ratio": row.get(f"{what}_ratio"), "ratio_min": row.get(f"{what}_ratio_min"),
                       "ratio_max": row.get(f"{what}_ratio_max")}
                records.append(_calls_record(folder, f"{path.stem} {label}", row.get("seq_len"), "sort", "topk", fig,
                                             data.get("repeats"), failed))
    elif isinstance(impls, dict) and isinstance(impls.get("reference"), dict):
        ref = impls["reference"]
        for impl, row in impls.items():
            if impl == "reference" or not isinstance(row, dict):
                continue
            fig = {"base_ms": ref.get("ms_median"), "choice_ms": row.get("ms_median"),
                   "ratio": row.get("ratio_median"), "ratio_min": row.get("ratio_min"),
                   "ratio_max": row.get("ratio_max")}
            records.append(_calls_record(folder, path.stem, f"{data.get('tokens')} x {data.get('vocab')}",
                                         "reference", impl, fig, data.get("repeats"), failed))
    return records


def choices_records(folder: Path, path: Path) -> list[dict]:
    """bench_choices.py's JSON (every arm against the baseline arm in one process, round by round, each round a
    baseline block and an arm block adjacent in time): one comparison per arm, its rounds' medians and ratios as the
    one-file-per-round A/Bs have them, the verdict by round_verdict on forward + backward. The JSON is written after
    every block and says itself which arms finished, so an arm that finished is a figure whatever its step's exit
    (a crash in another arm, a later call that skipped or cut the step: the file is this machine's, in this
    session's $W); an arm that failed, was being measured when the process ended, was cut by its step's time limit
    and not measured again, or was never reached (an arm of its --arm list with no record) is "incomplete" with why,
    and every arm is when the baseline's own outputs changed during the run (memory overwritten). [] for another
    kind of file."""
    data = _read(path)
    if not (isinstance(data, dict) and data.get("bench") == "choices" and isinstance(data.get("arms"), dict)):
        return []
    case = f"{data.get('seq_len')}b{data.get('batch')}"
    drift = data.get("baseline_outputs_changed") or _baseline_drift(data["arms"])
    failed = f"the baseline's outputs changed: {drift}" if drift else None
    arms = dict(data["arms"])
    settings = data.get("arm_settings") if isinstance(data.get("arm_settings"), dict) else {}
    for arm in settings:
        if arm != data.get("baseline") and arm not in arms:
            arms[arm] = {"error": "not measured"}
    records = []
    for arm, rec in arms.items():
        if not isinstance(rec, dict):
            continue
        per_round = []
        for rnd in _rounds(rec):
            ms = {}
            for side in ("baseline", "arm"):
                block = rnd.get(side)
                times = block.get("times_s") if isinstance(block, dict) else None
                ms[side] = {m: t["median"] * 1e3 if isinstance(t, dict) and is_time(t.get("median")) else None
                            for m, t in (times.items() if isinstance(times, dict) else ()) if m in MODES}
            ratio = {m: ms["arm"][m] / ms["baseline"][m] for m in MODES
                     if ms["arm"].get(m) and ms["baseline"].get(m)}
            per_round.append({"round": rnd.get("round"), "baseline_ms": ms["baseline"], "choice_ms": ms["arm"],
                              "ratio": ratio})
            missing = [f"{side} fwdbwd not measured" for side, key in (("baseline", "baseline"), ("choice", "arm"))
                       if "fwdbwd" not in ms[key]]
            if missing:  # a block without its time (a median outside its range is "-": no figure, never a ratio)
                per_round[-1]["failed"] = "; ".join(missing)
        why = failed or rec.get("error") or ("in progress when the process ended" if data.get("in_progress") == arm
                                            else None) or \
            ("cut by its step's time limit, not measured again" if rec.get("cuts") and "verdict" not in rec else None)
        if why:
            per_round = [{**p, "ratio": {}} for p in per_round] if failed else per_round
            per_round.append({"round": len(per_round) + 1, "baseline_ms": None, "choice_ms": None, "ratio": {},
                              "failed": why})
        verdict = round_verdict([p["ratio"].get("fwdbwd") for p in per_round])
        records.append({"folder": str(folder), "label": path.stem, "case": case, "baseline": data.get("baseline"),
                        "choice": arm, "rounds": per_round, "verdict": verdict,
                        **({"note": rec["note"]} if rec.get("note") else {})})
    return records


def _rounds(rec: dict) -> list[dict]:
    """An arm's rounds as bench_choices writes them (a list of dicts); anything else in their place is none."""
    rounds = rec.get("rounds")
    return [r for r in rounds if isinstance(r, dict)] if isinstance(rounds, list) else []


OUTPUT_RTOL = 0.02  # bench_choices.OUTPUT_RTOL: the baseline's loss and input-gradient norm, block against block


def _baseline_drift(arms: dict) -> str | None:
    """Why the baseline's outputs (its blocks' loss and grad_norm) changed during a bench_choices run, or None: its
    blocks in the file's order against the first, as bench_choices checks at the end of a run; a run cut before that
    check (its step's time limit, a lost CUDA context) left the change unsaid in the file."""
    blocks = [rnd["baseline"] for rec in arms.values() if isinstance(rec, dict) for rnd in _rounds(rec)
              if isinstance(rnd.get("baseline"), dict)]
    for block in blocks[1:]:
        for key in ("loss", "grad_norm"):
            a, b = block.get(key), blocks[0].get(key)
            if not (isinstance(a, (int, float)) and isinstance(b, (int, float))):
                continue
            if not (math.isfinite(a) and math.isfinite(b)) or abs(a - b) > OUTPUT_RTOL * max(abs(b), 1e-12):
                return f"{key} {a:.6g} against the baseline's {b:.6g}"
    return None


def qualifying_choices(paths) -> list[str]:
    """next_run.sh's rule for the choices that go on to their numerics and memcheck (K5), from bench_choices' JSON
    of each shape: "faster in every round" at one shape and "slower in every round" at none, and failed at none (an
    arm whose outputs were not the baseline's, that crashed or ran out of memory at a shape is no candidate for the
    default, whatever its time at the other). A/A arms (the baseline's choices in effect) are never candidates, and a
    file whose baseline's outputs changed during the run (said by bench_choices, or found here as choices_records
    finds it: a run cut before its own check) decides nothing, nor does one whose A/A arm (the noise floor) came out
    faster or slower in every round. An arm not measured at a shape (skipped for time, in progress when its step was
    cut) is not slower there. Sorted names."""
    faster, excluded = set(), set()
    for path in paths:
        data = _read(Path(path))
        if not (isinstance(data, dict) and data.get("bench") == "choices" and isinstance(data.get("arms"), dict)):
            continue
        if data.get("baseline_outputs_changed") or _baseline_drift(data["arms"]):
            continue  # memory was overwritten during the run: none of its figures holds
        if any(isinstance(rec, dict) and rec.get("note") and str(rec.get("verdict", "")).endswith("in every round")
               for rec in data["arms"].values()):
            continue  # the A/A arm (the shipped kernels against themselves) came out one way in every round: the
            # shape's rounds favour a side by their order or the device's state, so no verdict of it holds
        for arm, rec in data["arms"].items():
            if not isinstance(rec, dict) or rec.get("note"):
                continue
            if rec.get("error") or rec.get("verdict") == "slower in every round":
                excluded.add(arm)
            elif rec.get("verdict") == "faster in every round":
                faster.add(arm)
    return sorted(faster - excluded)


def train_records(folder: Path, path: Path, baselines: tuple[str, ...], failed: str | None = None) -> list[dict]:
    """bench_train --variant's runs (<name>.runs.json: one row per run, its repeat the round, its tokens/s the
    figure) as one comparison per (model, mode, context) and variant other than the baseline (the first of
    `baselines` run): per round the baseline's tokens/s over the choice's, a time ratio (below 1: faster) like every
    other ratio of the table; a run that failed has no row, so its round is missing ("not measured"), a round in
    which both sides' runs failed is one too where their summaries (<name>.json) say its repeat (never dropped,
    which would let the rounds left decide), and a variant none of whose runs ran (listed with its error in the
    runs' summaries) has every round so. [] for another kind of file."""
    data = _read(path) if path.name.endswith(".runs.json") else None  # <name>.json holds the runs' summaries
    if not (isinstance(data, list) and all(isinstance(r, dict) and "toks_per_s" in r and "repeat" in r
                                           for r in data)):
        return []
    summaries = _read(path.with_name(path.name[:-len(".runs.json")] + ".json"))
    errors = [r for r in summaries if isinstance(r, dict) and "error" in r and r.get("ranks", 1) == 1] \
        if isinstance(summaries, list) else []
    groups: dict[tuple, dict[str, dict[int, float | None]]] = {}
    for r in data:
        if r.get("ranks", 1) != 1 or not isinstance(r["repeat"], int) or isinstance(r["repeat"], bool):
            continue  # another rank count, or no repeat to pair it by
        key = (r.get("model", "nsa"), r.get("mode", "eager"), r.get("seq_len"), r.get("batch"))
        value = r["toks_per_s"] if is_time(r["toks_per_s"]) and not failed else None
        groups.setdefault(key, {}).setdefault(r.get("variant") or "", {})[r["repeat"]] = value
    lost: dict[tuple, dict[str, set[int]]] = {}  # (group, variant): the repeats whose run failed, where said
    for r in errors:  # a failed run's summary has no batch before 2026-12-01: the group of its other keys
        model, mode, seq_len = r.get("model", "nsa"), r.get("mode", "eager"), r.get("seq_len")
        key = next((k for k in groups if k[:3] == (model, mode, seq_len) and ("batch" not in r or
                                                                            k[3] == r["batch"])),
                   (model, mode, seq_len, r.get("batch")))
        groups.setdefault(key, {}).setdefault(r.get("variant") or "", {})
        rep = r.get("repeat")  # said since 2026-12-01: a round whose runs all failed is a round, not measured
        if isinstance(rep, int) and not isinstance(rep, bool) and rep >= 0:
            lost.setdefault(key, {}).setdefault(r.get("variant") or "", set()).add(rep)
    records = []
    for (model, mode, seq_len, batch), arms in groups.items():
        base = next((b for b in baselines if b in arms), None)
        if base is None:
            continue
        failed_reps = lost.get((model, mode, seq_len, batch), {})
        for arm in sorted(a for a in arms if a != base):
            per_round = []
            for rep in sorted(set(arms[arm]) | set(arms[base]) | failed_reps.get(arm, set())
                              | failed_reps.get(base, set())) or [0]:
                a, b = arms[arm].get(rep), arms[base].get(rep)
                per_round.append({"round": rep + 1, "baseline_tok_s": b, "choice_tok_s": a,
                                  "ratio": {"time": b / a} if a and b else {}})
                if failed:
                    per_round[-1]["failed"] = failed
                elif not (a and b):
                    per_round[-1]["failed"] = "; ".join(
                        f"{side} " + ("tokens/s not a positive finite figure" if rep in arms[who] else
                                      "not measured (its run failed)")
                        for side, who, x in (("baseline", base, b), ("choice", arm, a)) if not x)
            ratios = [p["ratio"].get("time") for p in per_round]
            verdict = round_verdict(ratios)
            case = f"{model} {mode}" + (f" S {seq_len} B {batch}" if seq_len else "")
            records.append({"folder": str(folder), "label": path.name.split(".")[0], "case": case, "baseline": base,
                            "choice": arm, "mode": "tok/s", "rounds": per_round, "verdict": verdict})
    return records


def _log(folder: Path) -> Path | None:
    """The folder's log.txt, or the one beside it."""
    return next((p for p in (folder / "log.txt", folder.parent / "log.txt") if p.is_file()), None)


def failed_files(folder: Path) -> dict[str, str]:
    """{file stem: why} of the folder's files whose step's last line in the log is not "exit 0": it exited non-zero
    or was skipped (a file left by an earlier call is no figure of this one)."""
    log = _log(folder)
    if log is None:
        return {}
    last: dict[str, str] = {}
    for line in log.read_text(errors="replace").splitlines():
        if m := STEP_EXIT.match(line):
            last[m["step"]] = f"exit {m['code']}"
        elif m := STEP_SKIPPED.match(line):
            last[m["step"]] = "skipped"
    return {m["stem"]: f"step {step}: {why}" for step, why in last.items()
            if why != "exit 0" and (m := STEP_OF_FILE.match(step))}


def step_problems(folder: Path) -> list[str]:
    """The steps of the folder's log.txt (or its parent's) that did not exit 0 or were skipped, one line each."""
    log = _log(folder)
    if log is None:
        return []
    problems = []
    for line in log.read_text(errors="replace").splitlines():
        if (m := STEP_EXIT.match(line)) and m["code"] != "0":
            problems.append(f"{m['step']}: exit {m['code']}")
        elif m := STEP_SKIPPED.match(line):
            problems.append(f"{m['step']}: skipped ({m['why']})")
    return problems


def _ms(ms: dict | None, mode: str) -> str:
    return f"{ms[mode]:.3f}" if ms and ms.get(mode) is not None else "-"


def _ratio(ratio: dict, mode: str) -> str:
    return f"{ratio[mode]:.3f}" if mode in ratio else "-"


def by_chance(rec: dict) -> str:
    """How often a verdict of "faster" (or "slower") in every round happens with no effect at all: each of n rounds
    independently either way, 2^-n (one-sided sign test), n the rounds with a ratio (a comparison timed by calls:
    its calls). Two rounds, next_run.sh's rule until 2026-11-30, are 1 in 4; its 9 of bench_choices, 1 in 512."""
    if not rec["verdict"].endswith("in every round"):
        return ""
    if rec.get("mode") == "call":
        n = rec["rounds"][0].get("calls") if rec["rounds"] else None
    else:
        n = sum(1 for r in rec["rounds"] if r.get("ratio"))
    return f" (by chance 1 in {2 ** n:,}: {n} rounds)" if isinstance(n, int) and n > 0 else ""


def table(records: list[dict]) -> str:
    """Markdown: one row per comparison and round, the verdict on its last round's row; a comparison timed by
    alternated calls has one row for its calls (the medians of one call, their ratio and the range of the rounds'
    ratios); a bench_train round shows each side's tokens/s and the time ratio (baseline's tokens/s over the
    choice's)."""
    rows = ["| label | case | choice vs baseline | round | fwd+bwd ms, or as labelled (baseline, choice) | "
            "ratio fwd+bwd, or as labelled | ratio fwd | verdict |", "|---|---|---|---:|---|---:|---:|---|"]
    for rec in records:
        for i, r in enumerate(rec["rounds"]):
            verdict = f"**{rec['verdict']}**{by_chance(rec)}" if i == len(rec["rounds"]) - 1 else ""
            if verdict and rec.get("note"):  # bench_choices: an arm with the baseline's choices in effect
                verdict += f" ({rec['note']})"
            if r.get("failed"):
                verdict = f"{r['failed']} {verdict}".strip()
            if rec.get("mode") == "tok/s":
                tps = [f"{x:,.0f}" if x else "-" for x in (r["baseline_tok_s"], r["choice_tok_s"])]
                rows.append(f"| {rec['label']} | {rec['case']} | {rec['choice']} vs {rec['baseline']} | {r['round']} | "
                            f"tok/s {tps[0]}, {tps[1]} | {_ratio(r['ratio'], 'time')} (time) | - | {verdict} |")
                continue
            if rec.get("mode") == "call":
                spread = (f" (rounds {r['ratio_min']:.3f}-{r['ratio_max']:.3f})"
                          if r.get("ratio_min") is not None and r.get("ratio_max") is not None else "")
                rows.append(f"| {rec['label']} | {rec['case']} | {rec['choice']} vs {rec['baseline']} | "
                            f"{r['round']} calls | per call {_ms(r['baseline_ms'], 'call')}, "
                            f"{_ms(r['choice_ms'], 'call')} | {_ratio(r['ratio'], 'call')}{spread} | - | {verdict} |")
                continue
            rows.append(f"| {rec['label']} | {rec['case']} | {rec['choice']} vs {rec['baseline']} | {r['round']} | "
                        f"{_ms(r['baseline_ms'], 'fwdbwd')}, {_ms(r['choice_ms'], 'fwdbwd')} | "
                        f"{_ratio(r['ratio'], 'fwdbwd')} | {_ratio(r['ratio'], 'fwd')} | {verdict} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", type=Path, help="folders of a GPU run's outputs (next_run.sh's $W/<part>)")
    ap.add_argument("--baseline", default="shipped,sort,old",
                    help="comma-separated arm names taken as the baseline, the first present (default "
                         "shipped,sort,old)")
    ap.add_argument("--json", type=Path, help="also write the records and the step problems here")
    args = ap.parse_args(argv)
    baselines = tuple(b.strip() for b in args.baseline.split(",") if b.strip())
    missing = [str(f) for f in args.folders if not f.is_dir()]
    if missing or not baselines:
        ap.error(f"no such folder: {', '.join(missing)}" if missing else "--baseline names no arm")
    records = [rec for folder in args.folders for rec in comparisons(folder, baselines)]
    problems = {str(f): step_problems(f) for f in args.folders}
    print(table(records) if records else "no A/B files (<label>_<arm>_r<round>_<case>.json with a baseline arm, "
          "bench_choices, bench_selection --topk-ab, bench_loss or bench_train --variant runs)")
    for folder, lines in problems.items():
        for line in lines:
            print(f"{folder}: {line}")
    print("reproduce: python benchmarks/ab_table.py " + " ".join(sys.argv[1:] if argv is None else argv))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"comparisons": records, "step_problems": problems}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
