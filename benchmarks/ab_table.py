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
skipped for time leaves no file): nothing is decided from one round. The verdict compares the same mode in every
round (forward + backward, or the forward where a round has no backward); a median that is not a positive finite
time is no figure ("-"), never a ratio.

Each folder's log.txt (or the one beside it, next_run.sh's $OUT/log.txt) gives the steps' exits: every step that
did not exit 0, and every step skipped for time, is listed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

NAME = re.compile(r"^(?P<label>.+)_(?P<arm>[^_]+)_r(?P<round>\d+)_(?P<case>[^_]+)\.json$")
MODES = ("fwd", "bwd", "fwdbwd")
STEP_EXIT = re.compile(r"^\[\d+s\] (?P<step>\S+) exit (?P<code>\d+)")
STEP_SKIPPED = re.compile(r"^\[\d+s\] SKIPPED (?P<step>\S+): (?P<why>.*)$")


def medians(path: Path) -> dict | None:
    """{mode: median ms} of a bench_attention JSON's one timed case (None for a median that is not a positive
    finite time), or None when it holds no timed case (a case that failed, or a file that is not one)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    cases = [c for c in data.get("results", []) if isinstance(c, dict) and "times_s" in c] \
        if isinstance(data, dict) else []
    if len(cases) != 1:
        return None
    out = {}
    for mode, stats in cases[0]["times_s"].items():
        if mode in MODES:  # a median outside its physical range is kept as None: no figure, never a ratio
            value = stats.get("median") if isinstance(stats, dict) else None
            out[mode] = value * 1e3 if _is_time(value) else None
    return out


def _is_time(value) -> bool:
    """A median in seconds within its physical range: a finite number above 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf")


def comparisons(folder: Path, baselines: tuple[str, ...]) -> list[dict]:
    """One record per (label, case, arm other than the baseline) of the folder's A/B files."""
    groups: dict[tuple[str, str], dict[str, dict[int, dict | None]]] = {}
    for path in sorted(folder.glob("*.json")):
        m = NAME.match(path.name)
        if m:
            arms = groups.setdefault((m["label"], m["case"]), {})
            arms.setdefault(m["arm"], {})[int(m["round"])] = medians(path)
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
            # one mode in every round: forward + backward where any file of the comparison times a backward,
            # else (forward-only paths) the forward
            timed = [ms for p in per_round for ms in (p["baseline_ms"], p["choice_ms"]) if ms]
            mode = "fwdbwd" if any("fwdbwd" in ms for ms in timed) else "fwd"
            ratios = [p["ratio"].get(mode) for p in per_round]
            if len(per_round) < 2 or any(x is None for x in ratios):
                verdict = "incomplete"  # a round missing or failed, or one round only: nothing decided
            elif all(x < 1 for x in ratios):
                verdict = "faster in every round"
            elif all(x > 1 for x in ratios):
                verdict = "slower in every round"
            else:
                verdict = "mixed"
            records.append({"folder": str(folder), "label": label, "case": case, "baseline": base, "choice": arm,
                            "rounds": per_round, "verdict": verdict})
    return records


def step_problems(folder: Path) -> list[str]:
    """The steps of the folder's log.txt (or its parent's) that did not exit 0 or were skipped, one line each."""
    log = next((p for p in (folder / "log.txt", folder.parent / "log.txt") if p.is_file()), None)
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


def table(records: list[dict]) -> str:
    """Markdown: one row per comparison and round, the verdict on its last round's row."""
    rows = ["| label | case | choice vs baseline | round | fwd+bwd ms (baseline, choice) | ratio fwd+bwd | ratio fwd | "
            "verdict |", "|---|---|---|---:|---|---:|---:|---|"]
    for rec in records:
        for i, r in enumerate(rec["rounds"]):
            verdict = f"**{rec['verdict']}**" if i == len(rec["rounds"]) - 1 else ""
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
    print(table(records) if records else "no A/B files (<label>_<arm>_r<round>_<case>.json with a baseline arm)")
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
