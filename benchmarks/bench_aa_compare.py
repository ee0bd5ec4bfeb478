"""False alarms and power of nsa-validate's decisions, measured on real runs: pairs of runs of one small runbook
(runbooks/aa_cpu.yaml, in which nothing changes anything that matters), run one after the other, and per pair:

- compare's false regressions: `nsa-validate compare A B` exits 1 on an A/A pair (goal: at most 1 in 20);
- the `ab` step's false winners: its two arms run the same kernels, so a decision with a winner is false (and
  one that is `recommendable` would be told to a user); counted per run (each run decides once);
- the `triage` step's false culprits: its only suspect changes nothing, so a culprit is false; per run;
- the share of inconclusive verdicts: runs that ended INCOMPLETE, and compare rows whose verdict is "inconclusive"
  (of them, those measured while other work used the machine: "disturbed");
- the detection of a real 20% slowdown: pairs whose B runs with NSA_FAULT=slow_step@0.25 (every step sleeps 25%
  of its own time: tokens/s -20%), B run first in a random half of them; detected when compare exits 1 with a
  regression (goal: at least 80%); also over the pairs in which compare could test a row at all (a pair whose every
  launch was disturbed is inconclusive by design).

Each rate comes with its 95% Wilson interval. Two conditions (--load): "none", the machine as found (its own load,
recorded: the load average before and after each run, and the interference every step recorded, from results.json's
"evidence" and each step's "interference"), and "busy", with a bounded load this benchmark adds itself: one busy
process (--busy-procs), in its own session, for a random half of each run (a start drawn within the run's expected
duration, taken from the previous run; 120 s before the first), always killed afterwards (also on Ctrl-C or an
error).

    python benchmarks/bench_aa_compare.py [--pairs 20] [--slow-pairs 20] [--load none|busy|both] [--out DIR]
                                          [--json out.json] [--runbook PATH] [--seed 0] [--continue]
    python benchmarks/bench_aa_compare.py --simulate [--pairs 200] [--load both] [--seed 0]

Time: a run of runbooks/aa_cpu.yaml is 13 single-process launches (most of each is importing torch): 70 to 160 s
on a 2-core machine loaded 6 to 9 (measured), so a pair 2.5 to 5 minutes; `--pairs 20 --load both` (20 A/A and 20
slowdown pairs in each condition: 80 pairs, 160 runs) takes 4 to 7 hours. Every run directory is kept under --out
(a pair's record in its pair.json); Ctrl-C ends the run in progress and the busy load, prints the figures of the
finished pairs and exits 130; `--continue` keeps the finished pairs of an earlier invocation into the same --out and
runs the rest; `--recompare` runs nothing: the finished pairs under --out are compared again, and their A/B and
triage steps decided again, by the current code (with the runbook's current `compare` declaration where a run
predates it). --simulate replaces the runs by synthetic run directories
of the same shape (AR(1) throughput with a run-level variation, validation.analysis.significance.simulate's model; the A/B
and the triage decided by the very functions the steps use, on the simulated runs; under "busy" a quarter of the
launches marked disturbed) and runs compare in-process: a check of the counting without the machine, never a
measurement of the machine.

Prints one line per pair, then a table per condition, and the command that reproduces the figures; --json writes
every figure, the per-pair records and that command. Exits 1 when a condition has no pair compared (every pair's
runs or compare failed: nothing was measured; named in the output, and in the JSON's "not_compared"), 130 when
interrupted, 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GOAL = 0.05  # a false-alarm rate should stay at or below 1 in 20
DETECT_GOAL = 0.80  # a real 20% slowdown should be found at least this often
SLOW_FAULT = "slow_step@0.25"  # every step 25% longer: tokens/s -20%
RUNBOOK = REPO / "runbooks" / "aa_cpu.yaml"
CONDITIONS = {"none": "as found", "busy": "added load"}
KINDS = {"aa": "A/A", "slow": "slowdown"}
METRIC = "toks_per_s"
RUN_TIMEOUT_S = 1800
FIRST_RUN_GUESS_S = 120.0  # the expected duration of a run before any was measured (a run of aa_cpu.yaml)
SIM_DISTURBED_SHARE = 0.25  # --simulate, "busy": the share of launches marked disturbed


# ---------------------------------------------------------------------------------------------------- rates
def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """The Wilson score interval of a proportion k/n (95% by default); (0, 1) when n == 0."""
    if n <= 0:
        return 0.0, 1.0
    if not 0 <= k <= n:
        raise ValueError(f"k must be in 0..n, got k={k}, n={n}")
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def rate(k: int, n: int, goal: float | None = None, at_least: bool = False) -> dict[str, Any]:
    """{"k", "n", "share" (None when n == 0), "ci_low", "ci_high", "goal", "goal_kind" ("at most" | "at least"),
    "result"}: against a goal, "met" when the whole 95% interval is on the goal's side, "missed" when the whole
    interval is on the other side, else "not shown" (more pairs would tell); None without a goal or a count."""
    low, high = wilson(k, n)
    result = None
    if goal is not None and n > 0:
        if at_least:
            result = "met" if low >= goal else "missed" if high < goal else "not shown"
        else:
            result = "met" if high <= goal else "missed" if low > goal else "not shown"
    return {"k": k, "n": n, "share": k / n if n else None, "ci_low": low, "ci_high": high, "goal": goal,
            "goal_kind": None if goal is None else "at least" if at_least else "at most", "result": result}


def summarize(exit_codes: Sequence[int]) -> dict:
    """compare's exit codes of A/A pairs: {"pairs", "flagged" (exit 1), "errors" (any other non-zero exit: not
    counted as pairs), "share", "ci_low", "ci_high", "goal", "within_goal" (the interval's upper end at most the
    goal: False when unsure), "result"}."""
    flagged = sum(1 for c in exit_codes if c == 1)
    errors = sum(1 for c in exit_codes if c not in (0, 1))
    pairs = len(exit_codes) - errors
    r = rate(flagged, pairs, GOAL)
    return {"pairs": pairs, "flagged": flagged, "errors": errors, "share": r["share"], "ci_low": r["ci_low"],
            "ci_high": r["ci_high"], "goal": GOAL, "within_goal": r["result"] == "met", "result": r["result"]}


_RESULT_WORDS = {"met": "met (the whole interval is on its side)",
                 "not shown": "not shown (the interval reaches across it)",
                 "missed": "missed (the whole interval is on the wrong side)"}


def report_lines(summary: dict, command: str) -> list[str]:
    """summarize()'s figures in words, then the command."""
    share = summary["share"]
    lines = [f"A/A pairs: {summary['pairs']}, flagged by compare (exit 1): {summary['flagged']}"
             + (f", errors (not counted): {summary['errors']}" if summary["errors"] else "")]
    if share is not None:
        lines.append(f"share flagged: {share:.1%} (95% Wilson CI {summary['ci_low']:.1%} .. {summary['ci_high']:.1%}); "
                     f"goal <= {summary['goal']:.0%}: {_RESULT_WORDS[summary['result']]}")
    lines.append(f"command: {command}")
    return lines


# ---------------------------------------------------------------------------------------------------- records
def _load_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def _d(x: Any) -> dict:
    return x if isinstance(x, dict) else {}


def run_summary(run_dir: Path) -> dict[str, Any]:
    """What one run's results.json says that the figures need: {"verdict", "steps": {name: {"kind", "status",
    "disturbed", "text", "launches", "disturbed_launches"}}, "disturbed_steps" (evidence), "ab": [{"step",
    "decided" (its arms were compared), "winner", "recommendable", "significant", "choice", "reason", "left_out"
    (runs left out as disturbed)}], "triage": [{"step", "ranked", "culprit", "reason"}], "error"}: every field read
    defensively (a run that crashed may leave little)."""
    from validation.analysis.interference import step_interference

    res = _load_json(Path(run_dir) / "results.json")
    if not isinstance(res, dict):
        return {"verdict": None, "steps": {}, "disturbed_steps": [], "ab": [], "triage": [],
                "error": f"no readable results.json in {run_dir}"}
    steps: dict[str, dict] = {}
    ab, triage = [], []
    for name, step in _d(res.get("steps")).items():
        step = _d(step)
        rec = _d(step_interference(step))
        launches = [_d(x) for x in rec.get("launches") or []]
        steps[name] = {"kind": step.get("kind"), "status": step.get("status"), "disturbed": bool(rec.get("disturbed")),
                       "text": rec.get("text"), "launches": len(launches),
                       "disturbed_launches": sum(1 for x in launches if x.get("disturbed"))}
        if step.get("kind") == "ab":
            decision = _d(step.get("decision"))
            winner = _d(step.get("winner")).get("label") if step.get("winner") else None
            # decided: the arms were compared (a decision kept by default with no measured run is no decision)
            ab.append({"step": name, "decided": bool(decision.get("comparison")), "winner": winner,
                       "recommendable": bool(decision.get("recommendable")),
                       "significant": bool(decision.get("significant")), "choice": decision.get("choice"),
                       "reason": decision.get("reason"), "left_out": len(decision.get("disturbed_runs") or [])})
        elif step.get("kind") == "triage":
            m = _d(step.get("metrics"))
            triage.append({"step": name, "ranked": "statement" in m, "culprit": m.get("culprit"),
                           "reason": m.get("reason")})
    evidence = _d(res.get("evidence"))
    return {"verdict": res.get("verdict"), "steps": steps,
            "disturbed_steps": [str(_d(x).get("step")) for x in evidence.get("disturbed") or []],
            "ab": ab, "triage": triage, "error": None}


def compare_summary(out: dict | None, exit_code: int, error: str | None = None) -> dict[str, Any]:
    """compare_runs()'s output (compare --json) reduced: {"exit", "flagged" (the regressions' rows), "rows" (the
    throughput rows), "tested" (of them, those tested: measured undisturbed on both sides), "inconclusive",
    "disturbed", "common" (the row of the change common to every step, or None), "gate", "error"}."""
    out = _d(out)
    rows = [_d(r) for r in out.get("rows") or [] if _d(r).get("metric") == METRIC]
    common = next((r for r in rows if r.get("step") == "all steps (common change)"), None)
    return {"exit": exit_code, "flagged": [str(_d(r).get("step")) for r in out.get("regressions") or []],
            "rows": len(rows), "tested": sum(1 for r in rows if r.get("tested")),
            "inconclusive": sum(1 for r in rows if r.get("verdict") == "inconclusive"),
            "disturbed": sum(1 for r in rows if r.get("disturbed")),
            "common": None if common is None else {k: common.get(k) for k in ("rel", "ci_low", "ci_high", "p_adjusted",
                                                                              "significant", "verdict")},
            "gate": out.get("gate"), "error": error}


def _finished(run: dict) -> bool:
    return run.get("exit") in (0, 1, 3) and run.get("verdict") is not None


def _detected(p: dict) -> bool:
    return p["compare"]["exit"] == 1 and bool(p["compare"]["flagged"])


def condition_figures(pairs: Sequence[dict]) -> dict[str, Any]:
    """Every figure of one condition's pair records (see the module docstring)."""
    aa = [p for p in pairs if p["kind"] == "aa"]
    slow = [p for p in pairs if p["kind"] == "slow"]
    runs = [r for p in pairs for r in p["runs"].values()]
    done = [r for r in runs if _finished(r)]
    compared = [p for p in pairs if p["compare"]["exit"] in (0, 1)
                and all(_finished(r) for r in p["runs"].values())]
    cmp_aa = [p for p in compared if p["kind"] == "aa"]
    cmp_slow = [p for p in compared if p["kind"] == "slow"]
    ab = [d for r in done for d in r.get("ab") or []]
    decided = [d for d in ab if d["decided"]]
    tri = [t for r in done for t in r.get("triage") or []]
    ranked = [t for t in tri if t["ranked"]]
    rows = sum(p["compare"]["rows"] for p in compared)
    launches = sum(s["launches"] for r in done for s in r["steps"].values())
    seconds = [r["seconds"] for r in runs if isinstance(r.get("seconds"), (int, float))]
    pair_seconds = [p["seconds"] for p in pairs if isinstance(p.get("seconds"), (int, float))]
    loads = [r["load_before"][0] for r in runs if r.get("load_before")]
    return {
        "pairs": {"aa": len(aa), "slow": len(slow), "compared_aa": len(cmp_aa), "compared_slow": len(cmp_slow),
                  "errors": len(pairs) - len(compared)},
        "false_regression": rate(sum(p["compare"]["exit"] == 1 for p in cmp_aa), len(cmp_aa), GOAL),
        "false_winner": rate(sum(d["winner"] is not None for d in decided), len(decided), GOAL),
        "false_recommendable": rate(sum(d["recommendable"] for d in decided), len(decided), GOAL),
        "ab_undecided": len(ab) - len(decided),
        "false_culprit": rate(sum(t["culprit"] is not None for t in ranked), len(ranked), GOAL),
        "triage_unranked": len(tri) - len(ranked),
        "incomplete_runs": rate(sum(r["verdict"] == "INCOMPLETE" for r in done), len(done)),
        "verdicts": {v: sum(r["verdict"] == v for r in done) for v in sorted({str(r["verdict"]) for r in done})},
        "inconclusive_rows": rate(sum(p["compare"]["inconclusive"] for p in compared), rows),
        "disturbed_rows": rate(sum(p["compare"]["disturbed"] for p in compared), rows),
        "detected": rate(sum(_detected(p) for p in cmp_slow), len(cmp_slow), DETECT_GOAL, at_least=True),
        # the same over the slowdown pairs in which compare could test anything (a row measured undisturbed in both
        # runs): a pair whose every launch was disturbed is inconclusive by design, not a miss of the test
        "detected_when_tested": rate(sum(_detected(p) for p in cmp_slow if p["compare"].get("tested")),
                                     sum(1 for p in cmp_slow if p["compare"].get("tested")), DETECT_GOAL,
                                     at_least=True),
        "disturbed_runs": rate(sum(bool(r["disturbed_steps"]) for r in done), len(done)),
        "disturbed_launches": rate(sum(s["disturbed_launches"] for r in done for s in r["steps"].values()), launches),
        "runs": len(runs), "runs_failed": len(runs) - len(done),
        "run_seconds_median": statistics.median(seconds) if seconds else None,
        "pair_seconds_median": statistics.median(pair_seconds) if pair_seconds else None,
        "load_before_mean": sum(loads) / len(loads) if loads else None,
    }


_TABLE = (("false_regression", "false regression (compare exit 1, A/A pairs)"),
          ("false_winner", "false winner (ab, per run)"),
          ("false_recommendable", "  of them recommendable"),
          ("false_culprit", "false culprit (triage, per run)"),
          ("detected", f"slowdown detected ({SLOW_FAULT}: -20%)"),
          ("detected_when_tested", "  of pairs with a tested row"),
          ("incomplete_runs", "runs ended INCOMPLETE"),
          ("inconclusive_rows", "compare rows inconclusive"),
          ("disturbed_rows", "  of them measured disturbed"),
          ("disturbed_runs", "runs with a disturbed step"),
          ("disturbed_launches", "launches disturbed"))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def table_lines(condition: str, fig: dict[str, Any]) -> list[str]:
    """One condition's figures as a plain-text table."""
    secs = fig["run_seconds_median"]
    pair_secs = fig["pair_seconds_median"]
    load = fig["load_before_mean"]
    head = (f"{CONDITIONS.get(condition, condition)} ({condition}): {fig['pairs']['aa']} A/A and "
            f"{fig['pairs']['slow']} slowdown pair(s), {fig['runs']} run(s)"
            + (f", {fig['runs_failed']} failed" if fig["runs_failed"] else "")
            + (f", {fig['pairs']['errors']} pair(s) not compared" if fig["pairs"]["errors"] else "")
            + (f"; median run {secs:.0f} s" if secs is not None else "")
            + (f", pair {pair_secs:.0f} s" if pair_secs is not None else "")
            + (f"; mean 1-min load average before a run {load:.2f}" if load is not None else ""))
    table = [("figure", "count", "share", "95% Wilson CI", "goal", "result")]
    for key, label in _TABLE:
        r = fig[key]
        goal = "" if r["goal"] is None else f"{'<=' if r['goal_kind'] == 'at most' else '>='} {r['goal']:.0%}"
        ci = "-" if not r["n"] else f"{r['ci_low']:.1%} .. {r['ci_high']:.1%}"
        table.append((label, f"{r['k']} / {r['n']}", _pct(r["share"]), ci, goal, r["result"] or ""))
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = [head]
    for row in table:
        lines.append("  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) if i < 5 else c
                                      for i, (c, w) in enumerate(zip(row, widths))).rstrip())
    extra = [f"verdicts {fig['verdicts']}"]
    if fig["ab_undecided"]:
        extra.append(f"{fig['ab_undecided']} A/B step(s) whose arms were not compared (their runs disturbed or "
                     "failed; not counted)")
    if fig["triage_unranked"]:
        extra.append(f"{fig['triage_unranked']} triage step(s) without a ranking (their runs disturbed or failed; "
                     "not counted)")
    lines.append("  " + "; ".join(extra))
    return lines


def pair_line(p: dict, total: int) -> str:
    """One pair's progress line."""
    def side(name: str) -> str:
        r = p["runs"][name]
        shaken = ", ".join(r["disturbed_steps"]) or "none"
        busy = r.get("busy") or {}
        load = " busy %.0f-%.0f s" % (busy["started_s"], busy["stopped_s"]) if busy.get("started_s") is not None \
            else ""
        lb, la = r.get("load_before"), r.get("load_after")
        loads = f", load {lb[0]:.1f}->{la[0]:.1f}" if lb and la else ""
        secs = f" {r['seconds']:.0f} s" if isinstance(r.get("seconds"), (int, float)) else ""
        return (f"{name.upper()} {r.get('verdict') or 'exit %s' % r.get('exit')}{secs}"
                f"{' ' + r['fault'] if r.get('fault') else ''}{load}{loads} (disturbed: {shaken})")

    c = p["compare"]
    if c["exit"] == 1:
        gate = f"compare exit 1, flagged: {', '.join(c['flagged'])}"
    elif c["exit"] == 0:
        gate = "compare exit 0"
    else:
        gate = f"compare exit {c['exit']}" + (f" ({c['error']})" if c.get("error") else "")
    common = c.get("common") or {}
    if isinstance(common.get("rel"), (int, float)):
        gate += f"; common change {common['rel']:+.1%}"
    winners = "/".join(str(d["winner"] or "none") for r in p["runs"].values() for d in r.get("ab") or [])
    culprits = "/".join(str(t["culprit"] or "none") for r in p["runs"].values() for t in r.get("triage") or [])
    return (f"[{CONDITIONS.get(p['condition'], p['condition'])}] {KINDS[p['kind']]} {p['index'] + 1}/{total}: "
            f"{side('a')}; {side('b')}; {gate}; of {c['rows']} rows {c.get('tested', 0)} tested, "
            f"{c['inconclusive']} inconclusive; "
            f"ab winner {winners or '-'}; triage culprit {culprits or '-'}"
            + (f"; {p['seconds']:.0f} s" if isinstance(p.get("seconds"), (int, float)) else ""))


# ---------------------------------------------------------------------------------------------------- real runs
def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NSA_")}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def _cli(args: list[str], timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "validation.cli", *args], cwd=REPO, env=_env(), capture_output=True,
                          text=True, timeout=timeout)


class BusyLoad:
    """`n` busy processes (`python -c "while True: pass"`), each in its own session, started and ended by this
    benchmark: stop() kills each one's whole process group and reaps it; safe to call twice."""

    def __init__(self, n: int = 1):
        self.n, self.procs = n, []

    def start(self) -> "BusyLoad":
        for _ in range(self.n):
            self.procs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True,
                                               stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        return self

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session: the group is just the busy process
            except ProcessLookupError:
                pass
            proc.wait()
        self.procs = []


def busy_window(rng: random.Random, expected_s: float) -> tuple[float, float]:
    """A random half of a run expected to take `expected_s`: (start, stop) in seconds from the run's start."""
    half = expected_s / 2.0
    start = rng.uniform(0.0, half)
    return start, start + half


def _wait(proc: subprocess.Popen, until: float) -> bool:
    """Wait for `proc` until the monotonic time `until`; whether it has ended."""
    try:
        proc.wait(timeout=max(0.0, until - time.monotonic()))
        return True
    except subprocess.TimeoutExpired:
        return False


def _end(proc: subprocess.Popen) -> None:
    """End a run still going (an error or Ctrl-C here): SIGINT (nsa-validate ends its launches and keeps what it
    finished), then SIGKILL after 60 s."""
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def supervise(argv: list[str], log_path: Path, window: tuple[float, float] | None = None,
              busy_procs: int = 1, timeout_s: float = RUN_TIMEOUT_S) -> tuple[int, float, dict | None]:
    """Run `argv` (output to log_path), with `busy_procs` busy processes over `window` (seconds from its start)
    when given: (exit code, seconds, {"planned", "started_s", "stopped_s", "procs"} or None). The busy processes
    are killed and the command ended whatever happens here (its end, an error, Ctrl-C)."""
    busy_rec = None if window is None else {"planned": [round(window[0], 1), round(window[1], 1)],
                                            "started_s": None, "stopped_s": None, "procs": busy_procs}
    t0 = time.monotonic()
    busy = None
    with open(log_path, "w") as log:
        # SIGINT as Python's default for the child, whatever this process inherited (a shell's background job starts
        # with SIGINT ignored, and a child still starting up would keep ignoring the SIGINT that _end sends)
        proc = subprocess.Popen(argv, cwd=REPO, env=_env(), stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        try:
            if window is not None and not _wait(proc, t0 + window[0]):
                busy = BusyLoad(busy_procs).start()
                busy_rec["started_s"] = round(time.monotonic() - t0, 1)
                _wait(proc, t0 + window[1])
                busy.stop()
                busy_rec["stopped_s"] = round(time.monotonic() - t0, 1)
            if not _wait(proc, t0 + timeout_s):
                raise TimeoutError(f"{' '.join(map(shlex.quote, argv))} still running after {timeout_s:g} s")
        finally:
            if busy is not None:
                busy.stop()
                if busy_rec["stopped_s"] is None:
                    busy_rec["stopped_s"] = round(time.monotonic() - t0, 1)
            _end(proc)
    return proc.returncode, round(time.monotonic() - t0, 1), busy_rec


def real_run(runbook: Path, run_dir: Path, fault: str | None = None, window: tuple[float, float] | None = None,
             busy_procs: int = 1) -> dict[str, Any]:
    """`nsa-validate run RUNBOOK --out run_dir` (with NSA_FAULT=fault for every step) under supervise(); its
    record: {"dir", "exit", "seconds", "load_before", "load_after" (os.getloadavg()), "fault", "busy", and
    run_summary()'s fields}."""
    argv = [sys.executable, "-m", "validation.cli", "run", str(runbook), "--out", str(run_dir)]
    if fault:
        argv += ["--set", f"defaults.env.NSA_FAULT={fault}"]
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log_path = run_dir.parent / f"{run_dir.name}.log"
    load_before = list(os.getloadavg())
    code, seconds, busy_rec = supervise(argv, log_path, window, busy_procs)
    rec = {"dir": str(run_dir), "exit": code, "seconds": seconds, "load_before": load_before,
           "load_after": list(os.getloadavg()), "fault": fault, "busy": busy_rec, **run_summary(run_dir)}
    if code not in (0, 1, 3):
        tail = log_path.read_text(errors="replace").strip()[-300:] if log_path.exists() else ""
        rec["error"] = f"nsa-validate run exited {code}: {tail}"
    return rec


def real_compare(dir_a: Path, dir_b: Path) -> dict[str, Any]:
    """`nsa-validate compare A B --json`, reduced by compare_summary()."""
    proc = _cli(["compare", str(dir_a), str(dir_b), "--json"], timeout=600)
    try:
        out = json.loads(proc.stdout)
    except ValueError:
        return compare_summary(None, proc.returncode, proc.stderr.strip()[-300:] or "no JSON from compare")
    return compare_summary(out, proc.returncode, None if proc.returncode in (0, 1) else proc.stderr.strip()[-300:])


class RealPairs:
    """Pairs of real runs; the expected duration of a run (for the busy window) is the previous run's."""

    def __init__(self, runbook: Path, out: Path, rng: random.Random, busy_procs: int = 1,
                 fault: str = SLOW_FAULT):
        self.runbook, self.out, self.rng, self.busy_procs, self.fault = runbook, out, rng, busy_procs, fault
        self.last_seconds: float | None = None

    def __call__(self, condition: str, kind: str, index: int) -> dict[str, Any]:
        pair_dir = self.out / condition / f"{kind}{index:02d}"
        t0 = time.monotonic()
        order = ["a", "b"] if kind == "aa" or self.rng.random() < 0.5 else ["b", "a"]  # a slowdown's B first or not
        runs = {}
        for side in order:
            window = None
            if condition == "busy":
                window = busy_window(self.rng, self.last_seconds or FIRST_RUN_GUESS_S)
            fault = self.fault if kind == "slow" and side == "b" else None
            runs[side] = real_run(self.runbook, pair_dir / side, fault, window, self.busy_procs)
            if _finished(runs[side]):
                self.last_seconds = runs[side]["seconds"]
        if all(_finished(r) for r in runs.values()):
            cmp = real_compare(pair_dir / "a", pair_dir / "b")
        else:
            cmp = compare_summary(None, -1, "; ".join(r["error"] or "no verdict" for r in runs.values()
                                                      if not _finished(r)))
        return {"condition": condition, "kind": kind, "index": index, "dir": str(pair_dir), "order": order,
                "fault": self.fault if kind == "slow" else None, "runs": {"a": runs["a"], "b": runs["b"]},
                "compare": cmp, "seconds": round(time.monotonic() - t0, 1)}


# ---------------------------------------------------------------------------------------------------- simulation
def simulated_run(run_dir: Path, rng, slow: bool = False, disturbed_share: float = 0.0,
                  run_cv: float = 0.03) -> dict:
    """A synthetic run directory shaped like a run of runbooks/aa_cpu.yaml (a train step, a 2-point sweep, an A/B
    and a triage of identical arms, two repeats each), its throughput an AR(1) series (12 steps, phi 0.7, CV 9%)
    around a level varying by run_cv per launch (x 0.8 with `slow`), each launch marked disturbed with probability
    `disturbed_share`. The A/B is decided by significance.decide and the triage ranked by triage.rank_suspects, as
    the steps do, on the undisturbed runs; the verdict is INCOMPLETE when a step's evidence is disturbed (the train
    step or the sweep with a disturbed launch; the A/B or triage with one and no significant decision without it),
    a simplified stand-in for validation.execution.evidence. Returns the results dict (also written to results.json)."""
    from validation.analysis.significance import StatsError, decide
    from validation.analysis.significance.simulate import ar1
    from validation.analysis.triage import rank_suspects

    factor = 0.8 if slow else 1.0

    def launch(rel: str) -> tuple[dict, list[float], bool]:
        level = 1e4 * factor * (1 + run_cv * rng.standard_normal())
        series = [float(v) for v in level * (1 + ar1(rng, (1, 12), 0.7, 0.09)[0])]
        path = run_dir / rel / "out" / "training.csv"
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = ["step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"]
        rows += [f"{i + 1},4.0,0.001,{v:.3f},{4096 / v:.6f},1.0,1.0,1.5" for i, v in enumerate(series)]
        path.write_text("\n".join(rows) + "\n")
        shaken = bool(rng.random() < disturbed_share)
        metrics = {"csv": f"{rel}/out/training.csv", "window": {"last": 12, "warmup": 0},
                   METRIC: {"mean": sum(series) / len(series), "n": len(series)},
                   "interference": {"disturbed": shaken, "text": "other processes used the cores (simulated)"
                                    if shaken else "no interference (simulated)"}}
        return metrics, series, shaken

    def repeated(step: str, labels: Sequence[str]) -> tuple[list[dict], dict, dict]:
        runs, series, shaken = [], {lb: [None, None] for lb in labels}, {lb: [False, False] for lb in labels}
        for r in range(2):
            for label in labels:
                m, s, d = launch(f"{step}/{label}_r{r + 1}")
                runs.append({"label": label, "repeat": r, "status": "passed", "params": {}, "metrics": m})
                series[label][r], shaken[label][r] = s, d
        return runs, series, shaken

    steps, disturbed_steps = {}, []
    m, _, shaken = launch("baseline")
    steps["baseline"] = {"name": "baseline", "kind": "train", "status": "passed", "runs": [], "metrics": m}
    if shaken:
        disturbed_steps.append("baseline")
    runs, _, shaken = repeated("batch", ["batch_size=2", "batch_size=4"])
    steps["batch"] = {"name": "batch", "kind": "sweep", "status": "passed", "runs": runs, "metrics": {}}
    if any(any(v) for v in shaken.values()):
        disturbed_steps.append("batch")
    runs, series, shaken = repeated("aa_ab", ["baseline", "torch"])
    try:
        d = decide(series, default="baseline", metric=METRIC, disturbed=shaken)
        # as the ab step: the choice is the winner when significant, the baseline too (between identical arms,
        # either is a false winner)
        decision, winner = d.as_dict(), ({"label": d.choice} if d.significant and d.choice else None)
        decided = d.choice is not None
    except StatsError as exc:
        decision, winner, decided = {"reason": f"no decision: {exc}", "significant": False, "choice": None}, None, False
    steps["aa_ab"] = {"name": "aa_ab", "kind": "ab", "status": "passed", "runs": runs, "decision": decision,
                      "winner": winner,
                      "metrics": {"decided": decided, "significant": bool(decision.get("significant"))}}
    if any(any(v) for v in shaken.values()) and not decision.get("significant"):
        disturbed_steps.append("aa_ab")
    runs, series, shaken = repeated("aa_triage", ["config", "kernel_torch"])
    medians = {lb: [None if shaken[lb][i] else statistics.median(s) for i, s in enumerate(v)]
               for lb, v in series.items()}
    try:
        ranking = rank_suspects(medians["config"], {"kernel_torch": medians["kernel_torch"]})
        tm = {"culprit": ranking.culprit, "reason": ranking.reason, "statement": ranking.statement}
    except StatsError as exc:
        tm = {"culprit": None, "reason": f"no ranking: {exc}"}
    steps["aa_triage"] = {"name": "aa_triage", "kind": "triage", "status": "passed", "runs": runs, "metrics": tm}
    if any(any(v) for v in shaken.values()) and not tm.get("culprit"):
        disturbed_steps.append("aa_triage")
    results = {"schema_version": 1, "runbook": {"name": "aa_cpu (simulated)"}, "environment": {}, "steps": steps,
               "verdict": "INCOMPLETE" if disturbed_steps else "GO",
               "evidence": {"disturbed": [{"step": s, "text": "simulated"} for s in disturbed_steps]}}
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "results.json").write_text(json.dumps(results))
    return results


class SimulatedPairs:
    """Pairs of simulated runs (simulated_run), compared in-process with compare_runs."""

    def __init__(self, out: Path, rng):
        self.out, self.rng = out, rng

    def __call__(self, condition: str, kind: str, index: int) -> dict[str, Any]:
        from validation.report.compare import compare_runs

        pair_dir = self.out / condition / f"{kind}{index:03d}"
        share = SIM_DISTURBED_SHARE if condition == "busy" else 0.0
        runs, results = {}, {}
        for side in ("a", "b"):
            slow = kind == "slow" and side == "b"
            results[side] = simulated_run(pair_dir / side, self.rng, slow=slow, disturbed_share=share)
            runs[side] = {"dir": str(pair_dir / side), "exit": {"GO": 0, "INCOMPLETE": 3}[results[side]["verdict"]],
                          "seconds": None, "load_before": None, "load_after": None,
                          "fault": SLOW_FAULT if slow else None, "busy": None, **run_summary(pair_dir / side)}
        out = compare_runs(results["a"], results["b"], pair_dir / "a", pair_dir / "b")
        return {"condition": condition, "kind": kind, "index": index, "dir": str(pair_dir), "order": ["a", "b"],
                "fault": SLOW_FAULT if kind == "slow" else None, "runs": runs,
                "compare": compare_summary(out, out["exit_code"]), "seconds": None}


# ---------------------------------------------------------------------------------------------------- schedule
def schedule(conditions: Sequence[str], pairs: int, slow_pairs: int) -> list[tuple[str, str, int]]:
    """(condition, kind, index) in the order they run: pair i of every condition and kind before pair i + 1, so
    that a drift of the machine over the hours spreads over all of them alike."""
    out = []
    for i in range(max(pairs, slow_pairs)):
        for condition in conditions:
            if i < pairs:
                out.append((condition, "aa", i))
            if i < slow_pairs:
                out.append((condition, "slow", i))
    return out


def run_all(plan: Iterable[tuple[str, str, int]], pair: Callable[[str, str, int], dict], totals: dict[str, int],
            log: Callable[[str], None] = print, done: dict | None = None,
            record: Callable[[dict], None] | None = None, records: list | None = None) -> list[dict]:
    """Every pair of `plan` (those in `done`, keyed (condition, kind, index), kept as they are), one line each;
    appended to `records` (a new list by default) as each ends, so that an interruption keeps the finished ones."""
    records = [] if records is None else records
    for condition, kind, index in plan:
        p = (done or {}).get((condition, kind, index))
        if p is None:
            p = pair(condition, kind, index)
            if record is not None:
                record(p)
        records.append(p)
        log(pair_line(p, totals[kind]))
    return records


def _earlier_pairs(out: Path, runbook: Path) -> dict:
    """The finished pairs of an earlier invocation into `out` (their pair.json), keyed (condition, kind, index); a
    pair directory without one is moved aside (never deleted) so that it runs again."""
    done = {}
    for condition in CONDITIONS:
        for pair_dir in sorted((out / condition).glob("*")) if (out / condition).is_dir() else []:
            if not pair_dir.is_dir() or ".partial-" in pair_dir.name:
                continue
            rec = _load_json(pair_dir / "pair.json")
            if isinstance(rec, dict) and rec.get("runbook") == str(runbook):
                done[(rec["condition"], rec["kind"], rec["index"])] = rec
            else:
                pair_dir.rename(pair_dir.with_name(f"{pair_dir.name}.partial-{int(time.time())}"))
    return done


def redecide(results: dict, run_dir: Path, rb) -> dict[str, dict]:
    """The runbook `rb`'s `ab` and `triage` steps decided again from one recorded run (results.json and its launches'
    training.csv), by the functions the steps use, with the run's declared launch noise (results["runbook"]
    ["compare"]): step name -> {"winner", "decided", "recommendable", "significant", "choice", "reason"} (ab) or
    {"culprit", "ranked", "reason"} (triage). As the step does, a winner of one run per variant whose throughput was
    not stable is not kept (the baseline is), while a winner of interleaved repeats is (the paired test is on run
    means, the per-step spread does not enter it); a step that cannot be decided again (its runs missing) is left
    out."""
    from validation.analysis.interference import disturbed_flags
    from validation.analysis.significance import StatsError, decide, pair_noise_from
    from validation.kinds.ab import pooled_summary
    from validation.kinds.trainer import run_values
    from validation.analysis.triage import rank_suspects

    noise = pair_noise_from(_d(results.get("runbook")).get("compare"))
    out: dict[str, dict] = {}
    for step in rb.steps():
        rec = _d(_d(results.get("steps")).get(step.name))
        if step.kind not in ("ab", "triage") or not rec.get("runs"):
            continue
        runs = [_d(r) for r in rec["runs"]]
        labels = (["baseline", *step.variants] if step.kind == "ab" else ["config", *step.suspects])
        shaken = disturbed_flags(runs, labels, step.repeats)
        data: dict[str, list] = {label: [None] * step.repeats for label in labels}
        for r in runs:
            label, rep = str(r.get("label")), r.get("repeat")
            if label in data and isinstance(rep, int) and 0 <= rep < step.repeats and not shaken[label][rep]:
                values = run_values(run_dir, step, r, "toks_per_s")
                if step.kind == "triage" and isinstance(values, list):  # the triage step ranks window medians
                    values = statistics.median(values) if values else None
                data[label][rep] = values
        try:
            if step.kind == "ab":
                d = decide(data, default="baseline", metric="toks_per_s", pair_noise=noise)
                winner, choice = d.winner, d.choice
                if (winner not in (None, "baseline") and d.method != "paired"
                        and not pooled_summary(runs, winner).get("throughput_stable")):
                    winner, choice = None, "baseline"
                out[step.name] = {"winner": winner, "decided": d.comparison is not None,
                                  "recommendable": d.recommendable and bool(winner),
                                  "significant": winner is not None, "choice": choice, "reason": d.reason}
            else:
                ranking = rank_suspects(data["config"], {k: data[k] for k in step.suspects}, pair_noise=noise)
                out[step.name] = {"culprit": ranking.culprit, "ranked": True, "reason": ranking.reason}
        except StatsError:
            continue
    return out


def recompare(out: Path, runbook: Path, conditions: Sequence[str]) -> list[dict]:
    """The finished pairs under `out` (their pair.json, whatever runbook path they name; nothing is moved or
    rewritten), each compared again in-process by the current `compare` (compare_runs), and each run's `ab` and
    `triage` steps decided again by the current decisions (redecide). A run recorded before its runbook declared its
    A/A noise gets the runbook's current `compare` declaration, in memory only: the figures of the same runs under
    today's compare, decisions and declaration. Verdicts and disturbances are as recorded."""
    from validation.report.compare import compare_runs
    from validation.runbook.loader import load_runbook

    rb = load_runbook(runbook)
    declared = rb.compare_noise
    records = []
    for condition in conditions:
        for pair_dir in sorted((out / condition).glob("*")) if (out / condition).is_dir() else []:
            rec = _load_json(pair_dir / "pair.json")
            if not pair_dir.is_dir() or ".partial-" in pair_dir.name or not isinstance(rec, dict):
                continue
            if all(_finished(_d(r)) for r in _d(rec.get("runs")).values()):
                results = [_load_json(pair_dir / side / "results.json") for side in ("a", "b")]
                if all(isinstance(r, dict) for r in results):
                    for r in results:
                        ref = r.setdefault("runbook", {})
                        if "compare" not in ref and declared is not None:
                            ref["compare"] = declared
                    for side, r in zip(("a", "b"), results):
                        again = redecide(r, pair_dir / side, rb)
                        summary = _d(rec["runs"].get(side))
                        for key in ("ab", "triage"):
                            summary[key] = [{**d, **again.get(d.get("step"), {})} for d in summary.get(key) or []]
                    try:
                        cmp = compare_runs(results[0], results[1], pair_dir / "a", pair_dir / "b")
                        rec["compare"] = compare_summary(cmp, cmp["exit_code"])
                    except Exception as exc:  # a damaged run directory: an error, not a pair
                        rec["compare"] = compare_summary(None, -1, f"{type(exc).__name__}: {exc}")
            records.append(rec)
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=20, help="A/A pairs per condition (at least 20 for the figures)")
    ap.add_argument("--slow-pairs", type=int, default=None,
                    help=f"slowdown pairs per condition (B with NSA_FAULT={SLOW_FAULT}; default: --pairs)")
    ap.add_argument("--load", choices=("none", "busy", "both"), default="none",
                    help="none: the machine as found; busy: a busy process over a random half of each run; both")
    ap.add_argument("--busy-procs", type=int, default=1, help="busy processes under --load busy (default 1)")
    ap.add_argument("--runbook", type=Path, default=RUNBOOK, help="the runbook each run runs (runbooks/aa_cpu.yaml)")
    ap.add_argument("--out", type=Path, help="where the run directories go (default: artifacts/bench_aa_compare)")
    ap.add_argument("--continue", dest="resume", action="store_true",
                    help="keep the finished pairs already in --out and run the rest")
    ap.add_argument("--recompare", action="store_true",
                    help="run nothing: compare the finished pairs under --out again, and decide their A/B and "
                         "triage steps again, with the current code and the runbook's current `compare` "
                         "declaration, and print their figures")
    ap.add_argument("--simulate", action="store_true", help="synthetic run directories instead of real runs")
    ap.add_argument("--seed", type=int, default=0, help="the seed of the busy windows, the slowdown pairs' run "
                                                        "order and --simulate")
    ap.add_argument("--json", type=Path, help="also write every figure and the per-pair records as JSON here")
    args = ap.parse_args(argv)
    slow_pairs = args.pairs if args.slow_pairs is None else args.slow_pairs
    if args.pairs < 0 or slow_pairs < 0 or args.pairs + slow_pairs < 1:
        ap.error("--pairs and --slow-pairs must not be negative, and at least one pair must run")
    if args.busy_procs < 1:
        ap.error("--busy-procs must be at least 1")
    if args.recompare and args.simulate:
        ap.error("--recompare reads real pairs: leave out --simulate")
    if not args.simulate:  # every real run (and --recompare's decisions) reads it: refused before the first run
        from validation.runbook.loader import load_runbook
        from validation.runbook.schema import RunbookError

        try:
            load_runbook(args.runbook.resolve())
        except RunbookError as exc:
            ap.error(f"--runbook: {exc}")
    command = "python benchmarks/bench_aa_compare.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    command = command.strip()
    out = args.out or REPO / "artifacts" / ("bench_aa_compare_sim" if args.simulate else "bench_aa_compare")
    out.mkdir(parents=True, exist_ok=True)
    conditions = ["none", "busy"] if args.load == "both" else [args.load]
    plan = schedule(conditions, args.pairs, slow_pairs)
    totals = {"aa": args.pairs, "slow": slow_pairs}
    started = time.time()
    records: list[dict] = []
    interrupted = False
    if args.recompare:
        records = recompare(out, args.runbook.resolve(), conditions)
        if not records:
            print(f"no finished pairs under {out / conditions[0]}" + (" or " + str(out / conditions[1])
                                                                       if len(conditions) > 1 else ""))
            return 2
        totals = {k: sum(1 for p in records if p.get("kind") == k) for k in ("aa", "slow")}
        for p in records:
            print(pair_line(p, totals[p["kind"]]))
    elif args.simulate:
        import numpy as np

        pair = SimulatedPairs(out, np.random.default_rng(args.seed))
        run_all(plan, pair, totals, records=records)
    else:
        runbook = args.runbook.resolve()
        done = _earlier_pairs(out, runbook) if args.resume else {}
        pair = RealPairs(runbook, out, random.Random(args.seed), args.busy_procs)

        def keep(p: dict) -> None:
            p["runbook"] = str(runbook)
            Path(p["dir"]).mkdir(parents=True, exist_ok=True)
            (Path(p["dir"]) / "pair.json").write_text(json.dumps(p, indent=1))

        try:
            run_all(plan, pair, totals, done=done, record=keep, records=records)
        except KeyboardInterrupt:  # the busy load is already killed and the run ended (supervise)
            interrupted = True
            print(f"\ninterrupted: {len(records)} of {len(plan)} pair(s) finished (kept under {out}; the same command "
                  "with --continue runs the rest)")
    figures = {c: condition_figures([p for p in records if p["condition"] == c]) for c in conditions}
    print()
    if args.recompare:
        print(f"(the stored runs under {out}, compared and their A/B and triage steps decided again by this checkout; "
              "verdicts and disturbances as recorded)")
    for c in conditions:
        for line in table_lines(c, figures[c]):
            print(line)
        print()
    print(f"command: {command}")
    # a condition none of whose pairs was compared (every pair's runs or compare failed) measured nothing: its
    # figures are 0 / 0, and the benchmark must not end as if it had measured them
    uncompared = [c for c in conditions
                  if not figures[c]["pairs"]["compared_aa"] + figures[c]["pairs"]["compared_slow"]]
    for c in uncompared:
        n = figures[c]["pairs"]["aa"] + figures[c]["pairs"]["slow"]
        print(f"FAILED: no pair of condition {c!r} was compared ("
              + (f"{n} pair(s), each with a run or its compare failed" if n else "no pair of it") + "): nothing was "
              "measured")
    if args.json:
        doc = {"command": command, "simulated": args.simulate, "interrupted": interrupted,
               "runbook": None if args.simulate else str(args.runbook), "fault": SLOW_FAULT,
               "recompared": args.recompare,
               "goals": {"false_alarm_at_most": GOAL, "detection_at_least": DETECT_GOAL},
               "load": args.load, "busy_procs": args.busy_procs, "seed": args.seed, "started": started,
               "finished": time.time(), "conditions": figures, "not_compared": uncompared, "pairs": records}
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(doc, indent=1))
    return 130 if interrupted else 1 if uncompared else 0


if __name__ == "__main__":
    sys.exit(main())
