"""Start-up time of the nsa-validate command line: `--help`, `list`, `kinds`, `plan` of the CPU runbook, and
`import validation.cli` alone, each run N times in a fresh process (wall time: median and best; CPU time of the
child: median). Target: `--help` and `list` under 1 s. Prints which heavy modules each command loaded (none of
torch, pandas and matplotlib is expected).

    python benchmarks/bench_startup.py [--repeats 7] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 1.0
HEAVY = ("torch", "pandas", "matplotlib", "numpy", "jinja2")
AUDIT = ("import atexit, sys\n"
         "atexit.register(lambda: print('LOADED ' + ','.join(m for m in {heavy!r} if m in sys.modules), "
         "file=sys.stderr))\n"
         "sys.argv = ['nsa-validate', *{argv!r}]\n"
         "from validation.cli import main\n"
         "main()\n")


def command(argv: list[str]) -> list[str]:
    """The console script when it is installed, else `python -m validation.cli`."""
    script = shutil.which("nsa-validate")
    return [script, *argv] if script else [sys.executable, "-m", "validation.cli", *argv]


def run_once(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, "COLUMNS": "200"})
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def loaded(argv: list[str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", AUDIT.format(heavy=HEAVY, argv=argv)], cwd=REPO,
                          capture_output=True, text=True)
    line = next((x for x in proc.stderr.splitlines() if x.startswith("LOADED ")), "LOADED ?")
    return [m for m in line[len("LOADED "):].split(",") if m]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args()
    cases = [("nsa-validate --help", ["--help"]), ("nsa-validate list", ["list"]), ("nsa-validate kinds", ["kinds"]),
             ("nsa-validate plan runbooks/cpu_smoke.yaml", ["plan", "runbooks/cpu_smoke.yaml"])]
    rows = []
    for label, argv in cases:
        cmd = command(argv)
        run_once(cmd)  # warm the file cache
        samples = [run_once(cmd) for _ in range(args.repeats)]
        walls, cpus = [w for w, _ in samples], [c for _, c in samples]
        rows.append({"command": label, "median_s": statistics.median(walls), "best_s": min(walls),
                     "cpu_median_s": statistics.median(cpus), "heavy_modules": loaded(argv)})
    imports = [run_once([sys.executable, "-c", "import validation.cli"]) for _ in range(args.repeats)]
    rows.append({"command": "python -c 'import validation.cli'", "median_s": statistics.median(w for w, _ in imports),
                 "best_s": min(w for w, _ in imports), "cpu_median_s": statistics.median(c for _, c in imports),
                 "heavy_modules": []})
    baseline = [run_once([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    python_s = statistics.median(w for w, _ in baseline)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"nsa-validate start-up, {args.repeats} runs each ({os.cpu_count()} cores, load average {load:.1f}; "
          f"a bare `python -c pass` takes {python_s:.3f} s here)")
    print(f"{'command':46} {'median':>8} {'best':>8} {'CPU':>8}  heavy modules loaded")
    for r in rows:
        print(f"{r['command']:46} {r['median_s']:7.3f}s {r['best_s']:7.3f}s {r['cpu_median_s']:7.3f}s  "
              f"{', '.join(r['heavy_modules']) or 'none'}")
    slow = [r["command"] for r in rows[:2] if r["median_s"] >= TARGET_S]
    print(f"target: --help and list under {TARGET_S:g} s: " + ("met" if not slow else f"NOT met by {', '.join(slow)}"))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "python_s": python_s, "load": load}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
