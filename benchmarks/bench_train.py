"""Training throughput of the real trainer: tokens/s, achieved FLOP/s, MFU and peak memory, single process vs DDP.

    python benchmarks/bench_train.py                  # CPU: tiny config and m7c_125m at seq 2048, single vs DDP x2
    python benchmarks/bench_train.py --quick          # CPU: tiny config only
    python benchmarks/bench_train.py --quick --models nsa,dense --modes eager,compile   # CPU: both models, two modes
    python benchmarks/bench_train.py --device cuda    # GPU: m7c_125m at seq 2048, bf16, NSA beside its dense twin,
                                                      # each eager, --compile and --cuda-graphs
    python benchmarks/bench_train.py --device cuda --repeats 3   # interleaved repeats: min / median / max of runs
    python benchmarks/bench_train.py --device cuda --modes eager,graphs --dry-run   # print the cases only
    python benchmarks/bench_train.py --device cuda --modes graphs --repeats 2 \
        --variant base:NSA_OPT_FUSED=0 --variant fused:NSA_OPT_FUSED=1          # an A/B, alternated A B B A
    python benchmarks/bench_train.py --device cuda --modes graphs --contexts 16384,32768   # long context, B 1

Each case launches `python -m nsa.training` (or torchrun with 2 ranks) in its own out_dir under artifacts/bench_train/
and reads its training.csv: throughput is the tokens of the steps after the warm-up steps over their time (the
step stdev that of their toks_per_s; a run with no step after its warm-up fails); memory is the largest
mem_reserved_gb (peak RSS on CPU, peak reserved CUDA memory on GPU, rank 0).
toks_per_s is global, so DDP / single is the speed-up from the second rank (on a 2-core CPU each rank gets one
core, so ~1.0 is the expected, honest answer there; on GPUs it should approach the number of GPUs).
MFU needs a device peak: known GPUs are looked up (nsa.training.metrics); on CPU pass --peak-tflops to get one.
On CUDA the NSA model (the Triton kernels: NSA_KERNEL=auto) runs beside its dense twin (`--attention dense`: the
same model with causal SDPA), and the NSA / dense tokens/s ratio is printed (target >= 0.55, >= 150,000 tok/s on
one H100; issue 32's: the dense twin >= 400,000 tok/s, ~32% MFU, NSA >= 300,000 and >= 0.75x the dense twin's fastest
mode, and at 32,768 tokens, B 1, NSA's step >= 2x faster than the dense twin's: its tokens/s ratio >= 2). Each
model runs in every mode of --modes: eager, `--compile` (torch.compile), `--cuda-graphs` (the whole train step
captured in CUDA graphs, nsa.training.graphs) and compile+graphs (the compiled model captured);
the table reports all of them, then, per model, the fastest mode, and the NSA / dense ratio of the fastest of each
(and of each mode side by side). --contexts adds long-context cases (the same model at B 1 x S). --variant runs
every case once per set of environment variables (e.g. a toggle off and on); the A/B lines give each variant's
tokens/s over the first's, as the ratio of the medians and per repeat (the runs of one repeat ran side by side). With
--repeats N the cases run N times, interleaved, every other repeat in the reverse order (A B C, C B A, A B C ...: a
drift of the device over the run then favours neither side of a pair in every repeat), and the table gives the min /
median / max of the runs' tokens/s: per-step values are autocorrelated, runs are the independent units.
--json is written before the first case (no file of an earlier call stands for this one's) and after each run, each
file replaced whole; SIGTERM (the `timeout` of a step) ends the case running, its whole process group, and the cases
measured so far are printed and kept, the case cut and the rest of its repeat listed as not measured (exit 143).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "artifacts" / "bench_train"
sys.path.insert(0, str(ROOT))

from bench_attention import repeated  # noqa: E402  (same directory, torch-free at import)
from nsa import toggles  # noqa: E402  (torch-free: the table of NSA_* variables a --variant may set)

CPU_CASES = [
    # name, config, trainer flags, steps, warm-up steps excluded from the mean
    ("tiny", "configs/tiny_cpu.yaml", ["--precision", "fp32"], 40, 5),
    ("m7c_125m_s2048", "configs/m7c_125m_2xa100_production.yaml",
     ["--batch-size", "1", "--accum", "1", "--precision", "fp32", "--device", "cpu"], 3, 1),
]
GPU_BASE = ("m7c_125m_s2048_bf16", "configs/m7c_125m_1xh100.yaml", ["--precision", "bf16", "--device", "cuda"], 60, 10)
GPU_LONG_STEPS = (30, 10)  # steps and warm-up of a long-context case (B 1 x S tokens per step)
MODES = {"eager": [], "compile": ["--compile"], "graphs": ["--cuda-graphs"],  # trainer flags of each mode
         "compile+graphs": ["--compile", "--cuda-graphs"]}
MODELS = {"nsa": [], "dense": ["--attention", "dense"]}


def parse_variant(text: str) -> tuple[str, dict[str, str]]:
    """`LABEL` or `LABEL:VAR=VALUE,VAR=VALUE`: a label and the environment its cases run with (e.g.
    `fused:NSA_OPT_FUSED=1`); a bare label runs with the environment as it is."""
    label, _, assignments = text.partition(":")
    label = label.strip()
    if not label or not label.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"--variant {text!r}: the label must be letters, digits, '-' or '_'")
    env = {}
    for item in filter(None, (a.strip() for a in assignments.split(","))):
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"--variant {text!r}: {item!r} is not VAR=VALUE")
        env[name.strip()] = value.strip()
        problem = toggles.check(name.strip(), value.strip())
        if problem:  # refused here, before any case runs, not by the trainer of every case
            raise ValueError(f"--variant {text!r}: {problem}")
    return label, env


def gpu_cases(modes: list[str], models: list[str] | None = None, contexts: list[int] | None = None,
              variants: list[tuple[str, dict[str, str]]] | None = None) -> list[dict]:
    """The GPU cases: each model (NSA, its dense twin) in each mode at each context length, once per variant.
    At 2,048 tokens the config's batch (B 8); longer contexts run B 1 x S (the same 125M model). The eager cases of
    the default run keep their earlier names (m7c_125m_s2048_bf16, ..._dense); other modes add +MODE, other
    contexts _sN and variants @LABEL. The two models of one mode and context run one after the other (NSA, dense,
    NSA, dense ... across the modes, never every NSA case before the first dense one), and the variants of one
    (model, mode, context) are adjacent, so that repeats alternate them (A B, then B A: main)."""
    name, config, flags, steps, warmup = GPU_BASE
    variants = variants or [("", {})]
    cases = []
    for ctx in contexts or [2048]:
        if ctx < 1:
            raise ValueError(f"context length must be >= 1, got {ctx}")
        base = name if ctx == 2048 else name.replace("s2048", f"s{ctx}")
        ctx_flags = [] if ctx == 2048 else ["--batch-size", "1", "--accum", "1", "--seq-len", str(ctx)]
        ctx_steps = (steps, warmup) if ctx == 2048 else GPU_LONG_STEPS
        for mode in modes:
            for model in models or list(MODELS):
                for label, env in variants:
                    case = (base + ("_dense" if model == "dense" else "") + ("" if mode == "eager" else f"+{mode}")
                            + (f"@{label}" if label else ""))
                    cases.append({"name": case, "config": config, "flags": [*flags, *MODELS[model], *MODES[mode],
                                                                            *ctx_flags],
                                  "steps": ctx_steps[0], "warmup": ctx_steps[1], "model": model, "mode": mode,
                                  "variant": label, "env": env, "seq_len": ctx, "batch": 8 if ctx == 2048 else 1})
    return cases


def cpu_cases(modes: list[str], models: list[str], quick: bool = False,
              variants: list[tuple[str, dict[str, str]]] | None = None) -> list[dict]:
    """The CPU cases: each config of CPU_CASES (the tiny one alone with quick), each model in each mode, once per
    variant, in gpu_cases' order. Modes that need CUDA (graphs) are refused: never measured as another mode. The
    default CPU run (NSA, eager) keeps its case names; the dense twin adds _dense, other modes +MODE."""
    cuda_only = [m for m in modes if "graphs" in m]
    if cuda_only:
        raise ValueError(f"--modes {','.join(cuda_only)}: CUDA graphs need --device cuda")
    cases = []
    for name, config, flags, steps, warmup in CPU_CASES[:1] if quick else CPU_CASES:
        for mode in modes:
            for model in models:
                for label, env in variants or [("", {})]:
                    cases.append({"name": name + ("_dense" if model == "dense" else "")
                                  + ("" if mode == "eager" else f"+{mode}") + (f"@{label}" if label else ""),
                                  "config": config, "flags": [*flags, *MODELS[model], *MODES[mode]], "steps": steps,
                                  "warmup": warmup, "model": model, "mode": mode, "variant": label, "env": env,
                                  "seq_len": None, "batch": None})
    return cases


def run_in_session(cmd: list[str], *, cwd, env: dict[str, str], timeout: float,
                   grace_s: float = 10.0) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output=True, text=True) in a session of its own: at `timeout` its whole process
    group is ended (SIGTERM, then SIGKILL after `grace_s`), torchrun's workers and any child holding the output
    pipes included (subprocess.run's timeout kills the direct child only, and its wait for the pipes could then
    block on a surviving worker); subprocess.TimeoutExpired is raised as subprocess.run raises it."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc, grace_s)
        raise subprocess.TimeoutExpired(cmd, timeout) from None
    except BaseException:
        # this process is being stopped (Stopped: SIGTERM, e.g. the `timeout` of a step; KeyboardInterrupt): the
        # case's session is its own, so no signal sent to this process group reaches it, and it would go on training
        # on the device under the next step's measurements
        _end_group(proc, STOP_GRACE_S)
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


STOP_GRACE_S = 2.0  # a stopped run's case: SIGTERM, then SIGKILL (timeout -k 10 kills this process 10 s after TERM)


class Stopped(Exception):
    """SIGTERM received (the `timeout` of a next_run.sh step, a scheduler): the runs measured so far are kept."""


def _end_group(proc: subprocess.Popen, grace_s: float) -> None:
    """End proc's process group: SIGTERM, then SIGKILL where it is still running after grace_s."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.communicate(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue


def run_case(name: str, config: str, flags: list[str], steps: int, warmup: int, nproc: int, peak: float | None,
             timeout: float, case_env: dict[str, str] | None = None) -> dict:
    out_dir = OUT / f"{name}_x{nproc}"
    argv = ["-m", "nsa.training", "--config", config, "--out-dir", str(out_dir), "--steps", str(steps),
            "--save-every", str(10 ** 9), "--log-every", str(max(1, steps // 4)), *flags]
    if nproc > 1:
        argv = ["-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "-m", "nsa.training", *argv[2:],
                "--ddp", "1"]
    env = {**os.environ, "NSA_TB_DISABLE": "1", "PYTHONPATH": str(ROOT), **(case_env or {})}
    if out_dir.exists():
        for stale in out_dir.glob("*.csv"):
            stale.unlink()
    t0 = time.time()
    proc = run_in_session([sys.executable, *argv], cwd=ROOT, env=env, timeout=timeout)
    wall = time.time() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{name} x{nproc} failed ({proc.returncode}):\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    with open(out_dir / "training.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    steady = rows[warmup:]
    if not steady:  # never the warm-up steps' figure under the name of the steady state
        raise ValueError(f"{name} x{nproc}: {len(rows)} training.csv rows, none after the {warmup} warm-up steps")
    tps = [float(r["toks_per_s"]) for r in steady]
    env_json = json.loads((out_dir / "env.json").read_text())
    fpt = env_json["flops_per_token"]
    mean = steady_tokens_per_s(steady)
    device_peak = env_json.get("peak_flops") or (peak * 1e12 if peak else None)
    return {
        "case": name, "ranks": nproc, "device": env_json.get("device_name"), "steps": len(rows),
        "steady_steps": len(steady), "toks_per_s": mean, "toks_per_s_stdev": statistics.pstdev(tps),
        "toks_per_s_per_rank": mean / nproc, "achieved_tflops": fpt * mean / 1e12,
        "mfu": fpt * mean / (device_peak * nproc) if device_peak else None,
        "peak_mem_gb": max(float(r["mem_reserved_gb"]) for r in rows), "params_m": env_json["n_params"] / 1e6,
        "flops_per_token_g": fpt / 1e9, "final_loss": float(rows[-1]["loss"]), "wall_s": wall,
        "csv": str((out_dir / "training.csv").relative_to(ROOT)), "attention_kernel": env_json.get("attention_kernel"),
    }


def steady_tokens_per_s(rows: list[dict]) -> float:
    """The run's throughput: the tokens of its timed steps over their time (each row's toks_per_s * step_time_s is
    its step's tokens), not the mean of the per-step rates, which a few fast steps inflate."""
    seconds = sum(float(r["step_time_s"]) for r in rows)
    if not seconds > 0:
        raise ValueError(f"timed steps of {seconds} s in all: no throughput")
    return sum(float(r["toks_per_s"]) * float(r["step_time_s"]) for r in rows) / seconds


def fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def summarize(runs: list[dict]) -> dict:
    """One row from the repeats of a case: min / median / max of the runs' tokens/s; the figures derived from
    tokens/s (per rank, TFLOP/s, MFU) from that median, so that a row's figures agree (with an even number of runs
    the median is between two runs, and no run's own figures are the median's); the peak memory the largest of the
    runs', the step stdev the median of the runs'; the rest (loss, wall time, csv) the middle run's."""
    runs = sorted(runs, key=lambda r: r["toks_per_s"])
    mid = runs[len(runs) // 2]
    tps = [r["toks_per_s"] for r in runs]
    median = statistics.median(tps)
    scale = median / mid["toks_per_s"] if mid["toks_per_s"] else 0.0
    return {**mid, "runs": len(runs), "toks_per_s": median, "toks_per_s_min": min(tps), "toks_per_s_max": max(tps),
            "toks_per_s_per_rank": median / mid["ranks"], "achieved_tflops": mid["achieved_tflops"] * scale,
            "mfu": None if mid.get("mfu") is None else mid["mfu"] * scale,
            "peak_mem_gb": max(r["peak_mem_gb"] for r in runs),
            "toks_per_s_stdev": statistics.median(r["toks_per_s_stdev"] for r in runs)}


def table(results: list[dict]) -> str:
    lines = ["| case | model | mode | kernel | ranks | runs | tokens/s (global) min / median / max | per rank | "
             "step stdev | TFLOP/s | MFU | peak mem GB | params | csv |",
             "|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r['case']} | {r.get('model', 'nsa')} | {r.get('mode', 'eager')} | "
                     f"{r.get('attention_kernel')} | {r['ranks']} | {r['runs']} | "
                     f"{r['toks_per_s_min']:,.0f} / {r['toks_per_s']:,.0f} / {r['toks_per_s_max']:,.0f} | "
                     f"{r['toks_per_s_per_rank']:,.0f} | {r['toks_per_s_stdev']:,.0f} | {r['achieved_tflops']:.4f} | "
                     f"{fmt(r['mfu'] and r['mfu'] * 100, '.1f')}{'%' if r['mfu'] else ''} | "
                     f"{r['peak_mem_gb']:.2f} | {r['params_m']:.1f}M | {r['csv']} |")
    return "\n".join(lines)


def _paired_ratios(a: list[dict], b: list[dict]) -> list[float]:
    """b / a tokens/s of the runs of one repeat (run i of each: measured side by side)."""
    by_rep = {r.get("repeat"): r["toks_per_s"] for r in a if _measured(r)}
    return [r["toks_per_s"] / by_rep[r.get("repeat")] for r in b if r.get("repeat") in by_rep and _measured(r)]


def _measured(row: dict) -> bool:
    """Whether a summary's tokens/s is a figure: a positive finite number (a NaN would win or lose every max())."""
    tps = row.get("toks_per_s")
    return isinstance(tps, (int, float)) and 0 < tps < float("inf")


def comparisons(results: list[dict], runs: dict | None = None, failed: list[dict] | None = None,
                variants: list[str] | None = None) -> list[str]:
    """Single-process lines, per variant and context length: NSA / dense per mode, each model's fastest mode, and
    NSA / dense of the fastest; then each variant against the first one, per model, mode and context (the ratio
    of the medians, and min / median / max of the ratios of the runs of each repeat). A mode none of whose runs
    gave a figure (its cases in `failed`, or a tokens/s that is not a positive finite number) is "not measured":
    listed beside the measured ones, never credited as the fastest, and a fastest-of-each ratio that could not see
    every mode says which were not measured; so is an A/B line whose variant or baseline has no figure. variants:
    the --variant labels in order (the first is the baseline even where all of its cases failed)."""
    single = [r for r in results if r["ranks"] == 1]
    lines = []
    groups: dict[tuple, list[dict]] = {}
    for r in single:  # one config's cases (the CPU run has two: never compared as modes of one model)
        groups.setdefault((r.get("variant", ""), r.get("seq_len", 2048), r.get("config")), []).append(r)
    lost: dict[tuple, dict[str, list[str]]] = {}  # group: {model: modes not measured}
    for f in failed or []:
        if f.get("ranks", 1) == 1:
            key = (f.get("variant", ""), f.get("seq_len", 2048), f.get("config"))
            groups.setdefault(key, [])
            lost.setdefault(key, {}).setdefault(f.get("model", "nsa"), []).append(f.get("mode", "eager"))
    configs = {config for _, _, config in groups}
    for (variant, ctx, config), all_rows in groups.items():
        rows = [r for r in all_rows if _measured(r)]
        not_measured = {model: list(dict.fromkeys(
            [r.get("mode", "eager") for r in all_rows if r.get("model", "nsa") == model and not _measured(r)]
            + [m for m in lost.get((variant, ctx, config), {}).get(model, [])
               if not any(r.get("model", "nsa") == model and r.get("mode", "eager") == m for r in rows)]))
            for model in MODELS}
        batch = next((r.get("batch") for r in all_rows), None)
        where = ("" if ctx is None or (ctx == 2048 and len(groups) == 1) else f"S {ctx:,} B {batch}") \
            + (f" {config}" if len(configs) > 1 else "") + (f" @{variant}" if variant else "")
        prefix = f"[{where.strip()}] " if where.strip() else ""
        by = {(r.get("model", "nsa"), r.get("mode", "eager")): r for r in rows}
        for mode in MODES:
            nsa, dense = by.get(("nsa", mode)), by.get(("dense", mode))
            if nsa and dense:
                lines.append(f"{prefix}{mode}: NSA / dense twin tokens/s = "
                             f"{nsa['toks_per_s'] / dense['toks_per_s']:.3f} (medians of {nsa['runs']} and "
                             f"{dense['runs']} runs; NSA kernel {nsa.get('attention_kernel')})")
            elif (nsa or dense) and mode in not_measured["dense" if nsa else "nsa"]:
                lines.append(f"{prefix}{mode}: NSA / dense twin tokens/s not measured "
                             f"({'dense' if nsa else 'nsa'} {mode} not measured)")
        best = {}
        for model in MODELS:
            mine = [r for r in rows if r.get("model", "nsa") == model]
            missing = ", ".join(f"{m} not measured" for m in not_measured[model])
            if mine:
                best[model] = max(mine, key=lambda r: r["toks_per_s"])
                modes = ", ".join([f"{r.get('mode', 'eager')} {r['toks_per_s']:,.0f}" for r in mine]
                                  + ([missing] if missing else []))
                lines.append(f"{prefix}{model}: fastest {best[model].get('mode', 'eager')} "
                             + ("of the measured modes " if missing else "")
                             + f"({best[model]['toks_per_s']:,.0f} tokens/s; {modes})")
            elif missing:
                lines.append(f"{prefix}{model}: no mode measured ({missing})")
        if len(best) == 2 and len({r.get("mode") for r in rows} | {m for ms in not_measured.values() for m in ms}) > 1:
            unseen = "; ".join(f"{model} {', '.join(ms)}" for model, ms in not_measured.items() if ms)
            lines.append(f"{prefix}fastest NSA / fastest dense twin = "
                         f"{best['nsa']['toks_per_s'] / best['dense']['toks_per_s']:.3f}"
                         f" ({best['nsa'].get('mode')} / {best['dense'].get('mode')})"
                         + (f", of the measured modes only (not measured: {unseen})" if unseen else ""))
    variants = variants or list(dict.fromkeys(r.get("variant", "") for r in single))
    if len(variants) > 1:
        first = variants[0]
        done = set()
        for r in single + [f for f in failed or [] if f.get("ranks", 1) == 1]:
            key = (r.get("model"), r.get("mode"), r.get("seq_len", 2048), r.get("config"))
            if r.get("variant", "") == first or (r.get("variant", ""), key) in done:
                continue
            done.add((r.get("variant", ""), key))
            row = next((x for x in single if x.get("variant", "") == r.get("variant", "")
                        and (x.get("model"), x.get("mode"), x.get("seq_len", 2048), x.get("config")) == key), None)
            base = next((b for b in single if b.get("variant", "") == first
                         and (b.get("model"), b.get("mode"), b.get("seq_len", 2048), b.get("config")) == key), None)
            at = (f" S {key[2]:,}" if key[2] else "") + (f" {key[3]}" if len(configs) > 1 else "")
            head = f"A/B {r.get('model')} {r.get('mode')}{at}: @{r.get('variant', '')} / @{first or 'base'} tokens/s"
            unseen = [f"@{v or 'base'}" for v, x in ((r.get("variant", ""), row), (first, base))
                      if x is None or not _measured(x)]
            if unseen:
                lines.append(f"{head} not measured ({', '.join(unseen)} not measured)")
                continue
            paired = _paired_ratios((runs or {}).get(base["case"], []), (runs or {}).get(row["case"], []))
            spread = (f"; per repeat min / median / max {min(paired):.3f} / {statistics.median(paired):.3f} / "
                      f"{max(paired):.3f} over {len(paired)}") if paired else ""
            lines.append(f"{head} = {row['toks_per_s'] / base['toks_per_s']:.3f}{spread}")
    return lines


def reproduce_command(argv: list[str], environ) -> str:
    """The shell command that runs these cases again: the project's variables set here (the cases inherit them)
    and the arguments, each quoted for the shell."""
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(environ.items()) if k.startswith(toggles.PREFIX)]
    return " ".join([*env, shlex.join(["python", "benchmarks/bench_train.py", *argv])])


def no_cuda_here() -> str | None:
    """Why --device cuda cannot run on this machine, or None: asked once before the cases, which would all fail."""
    import torch  # seconds: only a real run on CUDA asks; --help and --dry-run stay torch-free
    return None if torch.cuda.is_available() else f"no CUDA device here (torch {torch.__version__})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--quick", action="store_true", help="CPU: the tiny config only")
    ap.add_argument("--no-ddp", action="store_true", help="single-process cases only")
    ap.add_argument("--peak-tflops", type=float, help="device peak for MFU where it is not known (e.g. a CPU)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per case")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per case, interleaved across cases (every other repeat in the reverse order)")
    ap.add_argument("--modes", help=f"comma-separated modes of each model, of {', '.join(MODES)} (default: all on "
                                    "CUDA, eager on CPU, where the graphs modes are refused)")
    ap.add_argument("--models", help="comma-separated models (nsa, dense; default both on CUDA, nsa on CPU)")
    ap.add_argument("--contexts",
                    help="GPU: comma-separated context lengths (default 2048); 2,048 runs the config's B 8, longer "
                         "ones B 1 x S "
                         f"({GPU_LONG_STEPS[0]} steps, the first {GPU_LONG_STEPS[1]} excluded); e.g. 2048,16384,32768")
    ap.add_argument("--variant", action="append", default=[], metavar="LABEL[:VAR=VALUE,...]",
                    help="GPU: run every case once per variant, with these environment variables (repeatable; the "
                         "first is the baseline of the A/B lines), e.g. --variant base --variant fused:NSA_OPT_FUSED=1")
    ap.add_argument("--dry-run", action="store_true", help="print the cases and their trainer flags, run nothing")
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    cuda = args.device == "cuda"
    if not cuda and args.contexts is not None:  # the CPU cases' lengths are their configs'
        ap.error("--contexts needs --device cuda")
    args.modes = args.modes if args.modes is not None else ",".join(MODES) if cuda else "eager"
    args.models = args.models if args.models is not None else ",".join(MODELS) if cuda else "nsa"
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown or not modes:
        ap.error(f"--modes: {', '.join(unknown) or 'none given'}: expected some of {', '.join(MODES)}")

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or any(m not in MODELS for m in models):
        ap.error(f"--models {args.models!r}: expected some of {', '.join(MODELS)}")
    try:
        contexts = [int(c) for c in (args.contexts or "2048").split(",") if c.strip()]
        variants = [parse_variant(v) for v in args.variant]
    except ValueError as e:
        ap.error(str(e) if "variant" in str(e) else f"--contexts {args.contexts!r}: expected integers, e.g. 2048,32768")
    # a value given twice makes two cases of one name: their runs would merge under that name (one out_dir, two runs
    # of each repeat, one of them lost where runs are keyed by repeat); --repeats runs a case more than once
    for option, values in (("--modes", modes), ("--models", models), ("--contexts", contexts)):
        if twice := repeated(values):
            ap.error(f"{option}: {', '.join(map(str, twice))} given more than once (each case runs once a repeat; "
                     "--repeats runs it again)")
    if twice := repeated([label for label, _ in variants]):
        ap.error(f"--variant: label {', '.join(twice)} given more than once (each label once)")
    if args.device == "cuda":
        try:
            cases = gpu_cases(modes, models, contexts, variants)
        except ValueError as e:
            ap.error(str(e))
    else:
        try:
            cases = cpu_cases(modes, models, args.quick, variants)
        except ValueError as e:
            ap.error(str(e))
    if args.device == "cuda" and not args.dry_run and (why := no_cuda_here()):
        ap.error(f"--device cuda: {why}")
    ranks = (1,) if args.no_ddp or args.device == "cuda" else (1, 2)
    print("reproduce: " + reproduce_command(argv if argv is not None else sys.argv[1:], os.environ))
    if args.dry_run:
        for c in cases:
            env = " ".join(f"{k}={v}" for k, v in c["env"].items())
            print(f"{c['name']}: model {c['model']}, mode {c['mode']}: {env + ' ' if env else ''}"
                  f"--config {c['config']} "
                  f"--steps {c['steps']} {' '.join(c['flags'])} (first {c['warmup']} steps excluded)")
        return 0
    runs: dict[tuple[str, int], list[dict]] = {}
    failed: list[dict] = []

    def write_json() -> None:
        """The runs so far (each file replaced whole: a process killed while writing leaves the previous one); written
        before the first case too, so that no file of an earlier call stands for this one's."""
        if args.json:
            for path, rows in ((args.json, [summarize(r) for r in runs.values()] + failed),
                               (args.json.with_suffix(".runs.json"), [r for rs in runs.values() for r in rs])):
                part = path.with_name(f".{path.name}.part")
                part.write_text(json.dumps(rows, indent=2) + "\n")
                part.replace(path)

    def stop(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # `timeout` sends TERM twice (to this process and its group)
        raise Stopped(f"stopped by signal {signum}")

    write_json()
    previous = signal.signal(signal.SIGTERM, stop)
    stopped = None
    try:
        for rep in range(args.repeats):
            # every other repeat runs the cases in the reverse order (A B C, C B A, ...): a drift over the run (the
            # device's clocks, its temperature) then shifts a pair's ratio one way in one repeat and the other way in
            # the next, where A B A B would favour the first of each pair in every repeat
            order = cases if rep % 2 == 0 else cases[::-1]
            for i, c in enumerate(order):
                name, model, mode = c["name"], c["model"], c["mode"]
                for nproc in ranks:
                    print(f"running {name} x{nproc} ({c['steps']} steps, run {rep + 1}/{args.repeats}) ...",
                          file=sys.stderr, flush=True)
                    record = {"case": name, "ranks": nproc, "model": model, "mode": mode, "variant": c["variant"],
                              "seq_len": c["seq_len"], "batch": c["batch"], "config": c["config"], "repeat": rep}
                    try:
                        run = run_case(name, c["config"], c["flags"], c["steps"], c["warmup"], nproc,
                                       args.peak_tflops, args.timeout, c["env"])
                    except (SystemExit, subprocess.TimeoutExpired, OSError, KeyError, ValueError, TypeError) as e:
                        # one case that fails (a crash, its timeout, a training.csv row cut short) is reported; the
                        # other cases still run
                        text = str(e) if not isinstance(e, subprocess.TimeoutExpired) else \
                            f"{name} x{nproc} timed out after {args.timeout:g} s"
                        failed.append({**record, "error": text})
                        print(f"FAILED {name} x{nproc}: {text.strip()[-2000:]}", file=sys.stderr, flush=True)
                        write_json()
                        continue
                    except (Stopped, KeyboardInterrupt) as e:
                        # the case cut and the cases of this repeat not run are not measured; what ran is kept
                        stopped = str(e) or type(e).__name__
                        failed.extend({**record, "case": x["name"], "model": x["model"], "mode": x["mode"],
                                       "variant": x["variant"], "seq_len": x["seq_len"], "batch": x["batch"],
                                       "config": x["config"],
                                       "error": f"{x['name']} x{nproc} not measured: {stopped}"}
                                      for x in order[i:])
                        raise
                    runs.setdefault((name, nproc), []).append(
                        {**run, "config": c["config"], "model": model, "mode": mode, "variant": c["variant"],
                         "env": c["env"], "seq_len": c["seq_len"], "batch": c["batch"], "repeat": rep})
                    write_json()
                    print(f"  {name} x{nproc}: {run['toks_per_s']:,.0f} tokens/s, peak {run['peak_mem_gb']:.2f} GB, "
                          f"wall {run['wall_s']:.0f} s", file=sys.stderr, flush=True)
    except (Stopped, KeyboardInterrupt) as e:  # raised in a case (above) or between two
        stopped = stopped or str(e) or type(e).__name__
        write_json()  # first: `timeout -k 10` kills this process 10 s after its TERM
        print(f"STOPPED ({stopped}): the runs measured so far follow", file=sys.stderr, flush=True)
    finally:
        signal.signal(signal.SIGTERM, previous)
    write_json()
    results = [summarize(r) for r in runs.values()]
    print(table(results))
    for f in failed:
        first_line = (f["error"].strip().splitlines() or ["?"])[0]
        print(f"FAILED {f['case']} x{f['ranks']} ({f['model']}, {f['mode']}): {first_line}")
    for line in comparisons(results, {name: r for (name, nproc), r in runs.items() if nproc == 1}, failed,
                            [label for label, _ in variants]):
        print(line)
    for name in (c["name"] for c in cases):
        single = next((r for r in results if r["case"] == name and r["ranks"] == 1), None)
        ddp = next((r for r in results if r["case"] == name and r["ranks"] == 2), None)
        if single and ddp:
            print(f"{name}: DDP x2 / single tokens/s = {ddp['toks_per_s'] / single['toks_per_s']:.2f}")
    if stopped:
        return 128 + signal.SIGTERM if "signal" in stopped else 130
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
