"""Load figures of the validation pipeline.

    python benchmarks/bench_validation.py [--rows 1000000] [--repeats 3] [--json out.json]
    python benchmarks/bench_validation.py --longrun [--out RUN_DIR] [--steps N] [--repeats 3] [--json out.json]

Default: a synthetic 1,000,000-row training.csv and a 1,000,000-line heartbeat file. Each stage runs in its own
subprocess so its peak memory (peak RSS after its first run, torch/pandas imports included) is its own; inside it
the stage's work runs --repeats times, its time given as min / median / max (the first run, which also pays the
libraries' first-call costs, is usually the max):
- csv: read_training_csv + summarize (the step's window) of an N-row training.csv;
- report: make_plots + render (md, html, junit) of a results.json whose long-run step points at that csv;
- heartbeat: latest_heartbeats (tail read) vs read_heartbeats (whole file) on an N-line heartbeat file.

--longrun: a real run of runbooks/load_cpu.yaml (a 10,000-step long-run step, 2 gloo ranks, every step logged)
through `nsa-validate run`, in a subprocess that is the orchestrator (validation.cli.main, nothing else) with
two probes: the files nsa.training.heartbeat opens are wrapped to count the bytes read from heartbeat files (and the file
size at each read: what re-reading whole files on every poll would have cost), and a thread samples the
process's CPU time and RSS twice a second. Reported: wall time; the orchestrator's own CPU time and peak RSS
(getrusage SELF) vs. its children's (torchrun and the ranks: getrusage CHILDREN, peak = the largest one); its CPU
share and RSS growth while the trainer ran; heartbeat bytes read vs. the files' final size; then the metrics
(read + summarize) and report (plots + md/html/junit) stages on that run's training.csv, each in its own
process, and the wall time of a whole `nsa-validate report --write` re-render.
--steps N shortens the run for a quick check (its "10,000 steps logged" criterion then fails: NO-GO).

Times are wall seconds on this machine; compare them with each other, not with another machine. The command that
reproduces the figures is printed last (without --out: the directory now holds a run, and a run into it is
refused); a stage that fails ends the benchmark with exit code 1 and its error.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_csv(path: Path, rows: int) -> None:
    import numpy as np
    import pandas as pd

    steps = np.arange(1, rows + 1)
    rng = np.random.default_rng(0)
    pd.DataFrame({"step": steps, "loss": 5 - np.log1p(steps) / 20, "lr": 1e-3,
                  "toks_per_s": 30000 + rng.standard_normal(rows) * 100, "step_time_s": 0.03, "grad_norm": 1.0,
                  "mem_alloc_gb": 0.3, "mem_reserved_gb": 0.35}).to_csv(path, index=False)


def make_heartbeats(path: Path, lines: int) -> None:
    with open(path, "w") as f:
        for i in range(lines):
            f.write(json.dumps({"ts": 1.7e9 + i, "rank": 0, "pid": 1, "host": "h", "step": i, "msg": "step",
                                "loss": 2.0, "toks_per_s": 30000.0}) + "\n")


def stage(name: str, work: Path, run_dir: Path, repeats: int = 1) -> dict:
    """One stage, its work run `repeats` times and timed without its imports (torch, pandas, matplotlib load once
    per process): "seconds" {min, median, max} and "runs" (each time; the first also pays the libraries' first-call
    costs, their lazy imports), "peak_rss_mb" after the first run, "peak_rss_mb_all_runs" after the last. csv and
    report read run_dir/results.json; its step "longrun" names the training.csv and the window."""
    from nsa.training.heartbeat import latest_heartbeats, read_heartbeats
    from validation.analysis import metrics
    from validation.report import make_plots, render

    results = json.loads((run_dir / "results.json").read_text())
    longrun = results["steps"]["longrun"]["metrics"]
    times = []
    for _ in range(max(repeats, 1)):
        t0 = time.perf_counter()
        if name == "csv":
            read = metrics.read_training_csv(run_dir / longrun["csv"])
            summary = metrics.summarize(read, metrics.Window(longrun["window"]["last"], longrun["window"]["warmup"]))
            out = {"rows": summary["steps"], "rows_used": summary["window"]["n"], "status": summary["status"]}
        elif name == "report":
            plots = make_plots(results, run_dir)
            sizes = {fmt: len(render(results, fmt, plots=plots)) for fmt in ("md", "html", "junit")}
            out = {"plots": len(plots), "chars": sizes}
        elif name == "heartbeat_tail":
            out = {"last_step": latest_heartbeats(work)[0]["step"]}
        elif name == "heartbeat_full":
            out = {"records": len(read_heartbeats(work)[0])}
        else:
            raise SystemExit(f"unknown stage {name}")
        times.append(time.perf_counter() - t0)
        if len(times) == 1:  # one run's peak (a repeat may keep some of the last run's memory: plots, caches)
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out["runs"] = times
    out["seconds"] = spread(times)
    out["peak_rss_mb"] = peak
    out["peak_rss_mb_all_runs"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def spread(values: list[float]) -> dict:
    """{"min", "median", "max"} of `values`."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def _seconds(s: dict) -> str:
    return " / ".join(f"{s[k]:.3f}" for k in ("min", "median", "max")) + " s"


# ---------------------------------------------------------------------------------------------- --longrun
class _CountingFile:
    """A heartbeat file opened by nsa.training.heartbeat: every read's bytes are added to the probe."""

    def __init__(self, f, probe: "_HeartbeatProbe"):
        self._f, self._probe = f, probe

    def read(self, *args):
        data = self._f.read(*args)
        self._probe.bytes_read += len(data)
        return data

    def __iter__(self):
        for line in self._f:
            self._probe.bytes_read += len(line)
            yield line

    def __getattr__(self, name):
        return getattr(self._f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._f.close()


class _HeartbeatProbe:
    """Replaces `open` inside nsa.training.heartbeat (the module every heartbeat reader goes through: the launcher's
    watchdog.check -> latest_heartbeats / first_heartbeat, read_heartbeats). Counts opens of heartbeat files, the
    bytes read from them, and the sum of their sizes at each open: what reading whole files would have cost."""

    def __init__(self):
        self.opens = self.bytes_read = self.size_at_open_sum = 0

    def open(self, path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        if not Path(os.fspath(path)).name.startswith("heartbeat_rank"):
            return f
        self.opens += 1
        self.size_at_open_sum += os.fstat(f.fileno()).st_size
        return _CountingFile(f, self)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def orchestrate(figures_path: Path, cli_args: list[str]) -> int:
    """This process is `nsa-validate CLI_ARGS` (validation.cli.main), probed; figures go to figures_path."""
    import threading

    import nsa.training.heartbeat as heartbeat

    probe = _HeartbeatProbe()
    heartbeat.open = probe.open  # module global: shadows the builtin for nsa.training.heartbeat's functions only
    from validation import cli

    samples, stop = [], threading.Event()
    t0 = time.monotonic()

    def sampler():
        while not stop.wait(0.5):
            samples.append((time.monotonic() - t0, time.process_time(), _rss_mb(), probe.opens, probe.bytes_read))

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    sys.argv = ["nsa-validate", *cli_args]
    code = 0
    try:
        cli.main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    finally:
        stop.set()
        thread.join()
        wall = time.monotonic() - t0
        me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        figures = {"exit_code": code, "wall_s": wall,
                   "self_cpu_s": me.ru_utime + me.ru_stime, "self_peak_rss_mb": me.ru_maxrss / 1024,
                   "children_cpu_s": kids.ru_utime + kids.ru_stime, "children_peak_rss_mb": kids.ru_maxrss / 1024,
                   "heartbeat_opens": probe.opens, "heartbeat_bytes_read": probe.bytes_read,
                   "heartbeat_full_reread_bytes": probe.size_at_open_sum, "samples": samples}
        figures_path.write_text(json.dumps(figures))
    return code


def _polling_phase(samples: list) -> dict:
    """CPU share and RSS of the orchestrator while it polled heartbeats (first to last sample with new opens)."""
    active = [i for i in range(1, len(samples)) if samples[i][3] > samples[i - 1][3]]
    if len(active) < 2:
        return {}
    a, b = samples[active[0] - 1], samples[active[-1]]
    rss = [s[2] for s in samples[active[0] - 1:active[-1] + 1]]
    return {"seconds": b[0] - a[0], "cpu_share": (b[1] - a[1]) / (b[0] - a[0]), "rss_start_mb": rss[0],
            "rss_end_mb": rss[-1], "rss_max_mb": max(rss)}


def _subprocess_json(argv: list[str], what: str) -> dict:
    proc = subprocess.run([sys.executable, __file__, *argv], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if proc.returncode:
        raise SystemExit(f"{what} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def longrun(args) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = (args.out or Path(tmp) / "run").resolve()
        if (run_dir / "results.json").exists():
            raise SystemExit(f"{run_dir} already holds a run: pass another --out")
        cli_args = ["run", str(args.runbook), "--out", str(run_dir)]
        if args.steps:
            cli_args += ["--set", f"phases.longrun.steps.longrun.args.steps={args.steps}"]
        fig_path = Path(tmp) / "orchestrator.json"
        print(f"nsa-validate {' '.join(cli_args)}", flush=True)
        proc = subprocess.run([sys.executable, __file__, "--orchestrate", str(fig_path), "--", *cli_args], cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
        if proc.returncode not in (0, 1) or not fig_path.exists():  # 0 GO, 1 NO-GO: both are measurements
            raise SystemExit(f"nsa-validate run ended with exit code {proc.returncode}")
        orch = json.loads(fig_path.read_text())
        results = json.loads((run_dir / "results.json").read_text())
        step = results["steps"]["longrun"]
        m = step["metrics"]
        heartbeat_files = sorted(run_dir.rglob("heartbeat_rank*.jsonl"))
        hb_size = sum(p.stat().st_size for p in heartbeat_files)
        csv = run_dir / m["csv"]
        fig = {"runbook": str(args.runbook), "verdict": results["verdict"], "step_status": step["status"],
               "steps_logged": m.get("steps"), "last_step": m.get("last_step"),
               "toks_per_s_mean": (m.get("toks_per_s") or {}).get("mean"),
               "training_csv_bytes": csv.stat().st_size if csv.exists() else None,
               "heartbeat_files": len(heartbeat_files), "heartbeat_bytes": hb_size,
               "stdout_log_bytes": sum(p.stat().st_size for p in run_dir.rglob("stdout.log")),
               "polling": _polling_phase(orch.pop("samples")), **orch}
        fig["metrics_stage"] = _subprocess_json(["--stage", "csv", "--work", tmp, "--run-dir", str(run_dir),
                                                 "--repeats", str(args.repeats)], "metrics stage")
        fig["report_stage"] = _subprocess_json(["--stage", "report", "--work", tmp, "--run-dir", str(run_dir),
                                                "--repeats", str(args.repeats)], "report stage")
        t0 = time.perf_counter()
        rerender = subprocess.run([sys.executable, "-m", "validation.cli", "report", str(run_dir), "--write"],
                                  cwd=ROOT, capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
        fig["report_cli_wall_s"] = time.perf_counter() - t0
        if rerender.returncode:
            raise SystemExit(f"nsa-validate report --write failed:\n{rerender.stderr[-3000:]}")
    _print_longrun(fig)
    return fig


def _print_longrun(f: dict) -> None:
    mb = 2**20
    print(f"\nverdict {f['verdict']}, long-run step {f['step_status']}: {f['steps_logged']:,} steps logged "
          f"(last {f['last_step']:,}), {f['toks_per_s_mean'] or 0:,.0f} tokens/s mean")
    print(f"files: training.csv {f['training_csv_bytes'] / mb:.1f} MB, {f['heartbeat_files']} heartbeat files "
          f"{f['heartbeat_bytes'] / mb:.1f} MB, stdout.log {f['stdout_log_bytes'] / mb:.1f} MB")
    print(f"wall {f['wall_s']:.0f} s; orchestrator CPU {f['self_cpu_s']:.1f} s, peak RSS {f['self_peak_rss_mb']:.0f} MB;"
          f" children (torchrun + ranks) CPU {f['children_cpu_s']:.0f} s, largest peak RSS "
          f"{f['children_peak_rss_mb']:.0f} MB")
    p = f["polling"]
    if p:
        print(f"while the trainer ran ({p['seconds']:.0f} s): orchestrator CPU {100 * p['cpu_share']:.1f}% of one core, "
              f"RSS {p['rss_start_mb']:.0f} -> {p['rss_end_mb']:.0f} MB (max {p['rss_max_mb']:.0f})")
    print(f"heartbeat reads: {f['heartbeat_opens']:,} file opens, {f['heartbeat_bytes_read'] / mb:.2f} MB read "
          f"({f['heartbeat_bytes_read'] / max(f['heartbeat_opens'], 1):,.0f} B per open) for "
          f"{f['heartbeat_bytes'] / mb:.2f} MB of heartbeats; whole-file re-reads at the same polls: "
          f"{f['heartbeat_full_reread_bytes'] / mb:,.2f} MB")
    ms, rs = f["metrics_stage"], f["report_stage"]
    print(f"metrics (read + summarize {ms['rows']:,} rows, min / median / max of {len(ms['runs'])}): "
          f"{_seconds(ms['seconds'])}, peak RSS {ms['peak_rss_mb']:.0f} MB; report (plots + md/html/junit): "
          f"{_seconds(rs['seconds'])}, peak RSS {rs['peak_rss_mb']:.0f} MB; "
          f"`nsa-validate report --write` (whole process, once): {f['report_cli_wall_s']:.1f} s")


def synthetic(rows: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "run" / "longrun").mkdir(parents=True)
        t0 = time.perf_counter()
        make_csv(work / "run" / "longrun" / "training.csv", rows)
        make_heartbeats(work / "heartbeat_rank0.jsonl", rows)
        results = {"schema_version": 1, "runbook": {"name": "load"}, "verdict": "GO", "verdict_reason": "load",
                   "environment": {}, "phases": [{"name": "p", "title": "p", "steps": ["longrun"]}],
                   "steps": {"longrun": {"name": "longrun", "phase": "p", "kind": "longrun", "status": "passed",
                                         "metrics": {"csv": "longrun/training.csv",
                                                     "window": {"last": 50, "warmup": 5}}, "runs": []}},
                   "acceptance": [], "recommendations": {"env": {}, "notes": []}, "plots": []}
        (work / "run" / "results.json").write_text(json.dumps(results))
        print(f"inputs: {rows:,} csv rows and heartbeat lines ({time.perf_counter() - t0:.1f} s to write)")
        figures = {}
        for name in ("csv", "report", "heartbeat_tail", "heartbeat_full"):
            figures[name] = _subprocess_json(["--stage", name, "--work", str(work), "--run-dir", str(work / "run"),
                                              "--repeats", str(repeats)], f"stage {name}")
            print(f"{name:15s} {_seconds(figures[name]['seconds'])} (min / median / max of {repeats})   peak RSS "
                  f"{figures[name]['peak_rss_mb']:7.0f} MB")
        tail, full = figures["heartbeat_tail"]["seconds"]["median"], figures["heartbeat_full"]["seconds"]["median"]
        print(f"heartbeat tail read is {full / max(tail, 1e-9):.0f}x faster than reading the whole file (medians)")
    return {"rows": rows, "repeats": repeats, "figures": figures}


def _without_out(argv: list[str]) -> list[str]:
    """`argv` less --out and its directory: the same figures from a new run (a directory that holds a run is
    refused), the run kept where --out named it."""
    def is_out(word: str) -> bool:  # --out, or a prefix argparse takes for it (--ou)
        return len(word) > 2 and "--out".startswith(word)

    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif is_out(a):
            skip = True
        elif not is_out(a.split("=", 1)[0]):
            out.append(a)
    return out


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--orchestrate"]:  # internal: the probed nsa-validate process of --longrun
        return orchestrate(Path(argv[1]), argv[3:] if argv[2:3] == ["--"] else argv[2:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="synthetic csv rows and heartbeat lines")
    ap.add_argument("--longrun", action="store_true", help="measure a real long run of --runbook instead")
    ap.add_argument("--runbook", type=Path, default=ROOT / "runbooks" / "load_cpu.yaml")
    ap.add_argument("--steps", type=int, help="--longrun: override the long-run step's trainer steps (quick check)")
    ap.add_argument("--out", type=Path, help="--longrun: keep the run directory here (default: a temporary one)")
    ap.add_argument("--repeats", type=int, default=3, help="times each stage's work runs (min / median / max)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    ap.add_argument("--work", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.rows < 1:
        ap.error(f"--repeats and --rows must be >= 1, got {args.repeats} and {args.rows}")
    if args.steps is not None and args.steps < 1:  # 0 would run the runbook's own 10,000 steps
        ap.error(f"--steps must be >= 1, got {args.steps}")
    if args.stage:
        print(json.dumps(stage(args.stage, args.work, args.run_dir, args.repeats)))
        return 0
    out = {"longrun": longrun(args)} if args.longrun else synthetic(args.rows, args.repeats)
    print("reproduce: python benchmarks/bench_validation.py " + shlex.join(_without_out(argv)))
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
