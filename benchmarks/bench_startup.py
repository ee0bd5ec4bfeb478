"""Start-up time of the command lines: nsa-validate `--help`, `list`, `kinds`, `plan` of the CPU runbook, and
`import validation.cli` alone; nsa-train `--help` and `watchdog --help`. Each runs N times in a fresh process (wall
time: min, median and max; CPU time of the child: median). Target: `nsa-validate --help`, `list` and
`nsa-train --help` under 1 s. Prints which heavy modules each command loaded (none of torch, pandas and matplotlib
is expected), then the command that reproduces the figures. A command that fails ends the benchmark with exit code 1
and its error.

    python benchmarks/bench_startup.py [--repeats 7] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 1.0
TARGETS = ("nsa-validate --help", "nsa-validate list", "nsa-train --help")  # the commands held to TARGET_S
HEAVY = ("torch", "pandas", "matplotlib", "numpy", "jinja2")
# console script -> (its module for `python -m`, its entry point: pyproject.toml [project.scripts])
TOOLS = {"nsa-validate": ("validation.cli", "validation.cli:main"),
         "nsa-train": ("nsa.training", "nsa.training.cli:console_main")}
AUDIT = ("import atexit, importlib, sys\n"
         "atexit.register(lambda: print('LOADED ' + ','.join(m for m in {heavy!r} if m in sys.modules), "
         "file=sys.stderr))\n"
         "sys.argv = [{tool!r}, *{argv!r}]\n"
         "module, name = {entry!r}.split(':')\n"
         "getattr(importlib.import_module(module), name)()\n")


def command(tool: str, argv: list[str]) -> list[str]:
    """The console script `tool` when it is installed, else `python -m` its module."""
    script = shutil.which(tool)
    return [script, *argv] if script else [sys.executable, "-m", TOOLS[tool][0], *argv]


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


def loaded(tool: str, argv: list[str]) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", AUDIT.format(heavy=HEAVY, tool=tool, argv=argv,
                                                               entry=TOOLS[tool][1])],
                          cwd=REPO, capture_output=True, text=True)
    line = next((x for x in proc.stderr.splitlines() if x.startswith("LOADED ")), "LOADED ?")
    return [m for m in line[len("LOADED "):].split(",") if m]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    cases = [("nsa-validate", ["--help"]), ("nsa-validate", ["list"]), ("nsa-validate", ["kinds"]),
             ("nsa-validate", ["plan", "runbooks/cpu_smoke.yaml"]), ("nsa-train", ["--help"]),
             ("nsa-train", ["watchdog", "--help"])]

    def row(label: str, cmd: list[str], heavy: list[str]) -> dict:
        run_once(cmd)  # warm the file cache
        samples = [run_once(cmd) for _ in range(args.repeats)]
        walls, cpus = [w for w, _ in samples], [c for _, c in samples]
        return {"command": label, "min_s": min(walls), "median_s": statistics.median(walls), "max_s": max(walls),
                "cpu_median_s": statistics.median(cpus), "heavy_modules": heavy}

    rows = [row(" ".join([tool, *argv]), command(tool, argv), loaded(tool, argv)) for tool, argv in cases]
    rows.append(row("python -c 'import validation.cli'", [sys.executable, "-c", "import validation.cli"], []))
    baseline = [run_once([sys.executable, "-c", "pass"]) for _ in range(args.repeats)]
    python_s = statistics.median(w for w, _ in baseline)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"nsa-validate and nsa-train start-up, {args.repeats} runs each ({os.cpu_count()} cores, load average "
          f"{load:.1f}; a bare `python -c pass` takes {python_s:.3f} s here)")
    print(f"{'command':46} {'min':>8} {'median':>8} {'max':>8} {'CPU':>8}  heavy modules loaded")
    for r in rows:
        print(f"{r['command']:46} {r['min_s']:7.3f}s {r['median_s']:7.3f}s {r['max_s']:7.3f}s "
              f"{r['cpu_median_s']:7.3f}s  {', '.join(r['heavy_modules']) or 'none'}")
    slow = [r["command"] for r in rows if r["command"] in TARGETS and r["median_s"] >= TARGET_S]
    print(f"target: {', '.join(TARGETS)} under {TARGET_S:g} s: "
          + ("met" if not slow else f"NOT met by {', '.join(slow)}"))
    print("reproduce: python benchmarks/bench_startup.py " + shlex.join(sys.argv[1:] if argv is None else argv))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "python_s": python_s, "load": load}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
