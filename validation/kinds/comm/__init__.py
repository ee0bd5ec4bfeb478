"""`comm`: collective bandwidth over the run's ranks (issue 16): all-reduce, all-gather, reduce-scatter and
broadcast over doubling message sizes, with nccl-tests' algbw/busbw conventions (validation.analysis.collectives).

Own keys:
    kinds: [all_reduce, all_gather, reduce_scatter, broadcast]      (default: all four)
    sizes: [bytes, ...]  or  min_bytes / max_bytes                  (default 8 KiB .. 1 GiB with NCCL, 4 KiB .. 4 MiB
                                                                      with gloo; doubling)
    iters: 20, warmup: 5                                             (timed and untimed calls per size)
    compute_ms: 0                                                    (> 0: each timed call follows this much
                                                                      computation and a barrier, as a training
                                                                      step issues it; 0: back to back, nccl-tests)
    backend: auto | nccl | gloo                                      (auto: NCCL where CUDA is, else gloo)
    source: torch | nccl-tests | auto                                (auto: nccl-tests when every `<kind>_perf` is
                                                                      on PATH, nvidia-smi is there, the backend is
                                                                      not gloo and the step runs on one node)
Launch keys: env, nproc_per_node, nnodes, launcher (torchrun or Slurm, as the trainer kinds), master_port,
port_retries, timeout_s.

source torch: one launch of `python -m validation.analysis.comm_bench` under torchrun over nproc_per_node x nnodes ranks
(also one rank, and under Slurm in every node's task), which writes RUN_DIR/<step>/comm.json. source nccl-tests:
one single-process `<kind>_perf -g nproc_per_node` launch per collective (validation.analysis.nccl_tests), its table parsed.
Every launch is sampled like a trainer's (telemetry.csv in its directory): what else used the machine while it measured
is judged over the whole launch, and the step records it (results.json step "interference": with nccl-tests one entry
per collective's launch, labelled with the collective), so that a criterion on its bandwidths, latencies or tables
(`performance`), or on a figure computed from them (parallelism's predicted collective time), is inconclusive when a
launch was disturbed (validation.execution.evidence), and the key figure's step counts as measured evidence.

Metrics (a fixed interface, used by criteria and by the parallelism step):
    {"world_size": n, "backend": "gloo"|"nccl", "source": "torch"|"nccl-tests",
     "<kind>": {"table": [bandwidth_row rows sorted by bytes], "busbw_gbps": {"max", "median"},
                "algbw_gbps": {"max", "median"}, "latency_us": <time of the smallest size>, "sizes": <count>}, ...}
plus "note" at one rank (nothing moves: busbw 0, not meaningful) and "iters", "warmup", "threads", "device" and
"device_name" (the GPU's name: the bandwidths' ceiling is its link's, validation.analysis.plausibility).
Criteria: `comm.all_reduce.busbw_gbps.max >= 20`. Tables of a comm step:
{k: v["table"] for k, v in metrics.items() if isinstance(v, dict) and "table" in v}.
Report: a table per collective and a bandwidth-vs-size plot; key figure: peak all-reduce busbw, of the comm step
with the most ranks.
Options: the keys above. Result: the step record, its metrics these as a typed record (Metrics: a Collective per
collective measured, a Row per size; the collectives written in the order of KINDS), decoded leniently by the report
parts; the benchmark's comm.json is read as a BenchFile, nccl-tests' table as a ParsedTable (the records:
validation.kinds.comm.result).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
from typing import Any

from validation import contracts
from validation.analysis import nccl_tests
from validation.analysis.interference import launch_record, step_interference
from validation.analysis.collectives import size_range
from validation import kinds as registry
from validation.formatting import NA, as_list, file_name, finite, fmt_num
from validation.launch import telemetry
from validation.launch.telemetry import INTERVAL_S as TELEMETRY_INTERVAL_S
from validation.kinds.comm.result import (KINDS, BenchFile, Collective, Metrics, ParsedTable, Result,  # noqa: F401
                                          Row, Spread, measured, summarize, tables)  # the kind's records, re-exported
from validation.results.codec import decode, encode, given
from validation.results.run import Step as StepRecord
from validation.launch.spec import LaunchSpec
from validation.runbook.schema import typed
from validation.kinds.blocks import Block, Column, Paragraph, Table, code
from validation.kinds.base import KeyFigure, StepKind, launch_identity, run_path, step_dir
from validation.kinds._plot_helpers import loglog_lines
from validation.kinds.trainer import launch_started, written_before


@dataclasses.dataclass(frozen=True)
class Options:
    kinds: list[str]  # the collectives
    sizes: list[int] | None = None  # message sizes in bytes; else min_bytes..max_bytes doubling
    min_bytes: int | None = None
    max_bytes: int | None = None
    iters: int = 20
    warmup: int = 5
    compute_ms: float = 0.0  # computation before each timed call (as in training)
    backend: str = "auto"
    source: str = "torch"  # or "nccl-tests", "auto"


SOURCES = ("torch", "nccl-tests", "auto")
BACKENDS = ("auto", "nccl", "gloo")
OUTPUT = "comm.json"  # validation.analysis.comm_bench.OUTPUT (not imported: that module is the launched program's)
WORLD_ONE_NOTE = ("one rank: the collectives move nothing between ranks; times are the calls' own overhead, "
                  "busbw is 0 and not meaningful")


class Comm(StepKind):
    name = "comm"
    summary = ("collective bandwidth over the run's ranks (all-reduce, all-gather, reduce-scatter, broadcast; "
               "torch or nccl-tests): algbw/busbw per size, latency")
    keys = ("kinds", "sizes", "min_bytes", "max_bytes", "iters", "warmup", "compute_ms", "backend", "source")
    metrics = ("world_size", "backend", "source", "device", "device_name", "iters", "warmup", "compute_ms", "threads",
               "note",
               *(f"{k}.{m}" for k in KINDS for m in ("table.<i>.*", "busbw_gbps.max", "busbw_gbps.median",
                                                           "algbw_gbps.max", "algbw_gbps.median", "latency_us",
                                                           "sizes", "avg_busbw_gbps_reported")))
    performance = tuple(f"{k}.{m}" for k in KINDS for m in ("table", "busbw_gbps", "algbw_gbps", "latency_us",
                                                             "avg_busbw_gbps_reported"))
    launch_keys = ("env", "nproc_per_node", "nnodes", "launcher", "master_port", "port_retries", "timeout_s")

    result_type = Result

    # ------------------------------------------------------------------ schema
    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        kinds = raw.get("kinds", list(KINDS))
        if not isinstance(kinds, list) or not kinds:
            raise ctx.error(path + ("kinds",), f"expected a non-empty list of {', '.join(KINDS)}")
        for i, k in enumerate(kinds):
            typed(k, str, path + ("kinds", i), ctx, choices=KINDS)
        if len(set(kinds)) != len(kinds):
            raise ctx.error(path + ("kinds",), "a collective is listed twice")
        sizes = raw.get("sizes")
        if sizes is not None:
            if "min_bytes" in raw or "max_bytes" in raw:
                raise ctx.error(path + ("sizes",), "give either sizes or min_bytes/max_bytes, not both")
            if not isinstance(sizes, list) or not sizes:
                raise ctx.error(path + ("sizes",), "expected a non-empty list of message sizes in bytes")
            sizes = sorted({typed(s, int, path + ("sizes", i), ctx, minimum=4) for i, s in enumerate(sizes)})
        lo = typed(raw.get("min_bytes"), int, path + ("min_bytes",), ctx, minimum=4, optional=True)
        hi = typed(raw.get("max_bytes"), int, path + ("max_bytes",), ctx, minimum=4, optional=True)
        if lo is not None and hi is not None and hi < lo:
            raise ctx.error(path + ("max_bytes",), f"must be >= min_bytes ({lo}), got {hi}")
        options = Options(
            kinds=list(kinds), sizes=sizes, min_bytes=lo, max_bytes=hi,
            iters=typed(raw.get("iters", 20), int, path + ("iters",), ctx, minimum=1),
            warmup=typed(raw.get("warmup", 5), int, path + ("warmup",), ctx, minimum=0),
            compute_ms=typed(raw.get("compute_ms", 0), float, path + ("compute_ms",), ctx, minimum=0),
            backend=typed(raw.get("backend", "auto"), str, path + ("backend",), ctx, choices=BACKENDS),
            source=typed(raw.get("source", "torch"), str, path + ("source",), ctx, choices=SOURCES))
        if options.source == "nccl-tests":
            if options.backend == "gloo":
                raise ctx.error(path + ("source",), "nccl-tests measures NCCL; backend gloo needs source torch")
            if options.compute_ms:
                raise ctx.error(path + ("compute_ms",), "nccl-tests times its calls back to back: source torch")
            if sizes is not None:
                raise ctx.error(path + ("sizes",), "nccl-tests takes min_bytes/max_bytes (doubling), not sizes")
        return options

    def check(self, step, order, error) -> None:
        if step.source == "nccl-tests" and (step.launch.nnodes > 1 or step.launch.launcher.type == "slurm"):
            raise error("source nccl-tests runs one process driving nproc_per_node GPUs on this node; several "
                        "nodes or Slurm need an MPI build of nccl-tests under mpirun/srun: use source torch")

    # ------------------------------------------------------------------ plan
    def resolved_source(self, step) -> str:
        """torch or nccl-tests: `auto` picks nccl-tests when it can run here (see the module doc)."""
        if step.source != "auto":
            return step.source
        path = step.launch.env.get("PATH")
        usable = (step.backend != "gloo" and step.launch.nnodes == 1 and step.launch.launcher.type != "slurm"
                  and shutil.which("nvidia-smi", path=path) is not None
                  and not nccl_tests.missing_binaries(step.kinds, path))
        return "nccl-tests" if usable else "torch"

    def launches(self, step, winners, run_dir):
        launch = step.launch
        # sampled like a trainer launch: what else used the machine while the collectives were timed
        common = dict(env=dict(launch.env), inherit_env=True, run_dir=run_dir, timeout_s=launch.timeout_s,
                      telemetry_s=TELEMETRY_INTERVAL_S)
        if self.resolved_source(step) == "nccl-tests":
            lo, hi = size_range(step.min_bytes, step.max_bytes, "nccl")  # nccl-tests refuses -b > -e
            return [LaunchSpec(argv=nccl_tests.command(kind, lo, hi, launch.nproc_per_node, step.iters,
                                                       step.warmup),
                               step_dir=step_dir(run_dir, f"{step.name}/{kind}"), **common,
                               **launch_identity(step, kind))
                    for kind in step.kinds]
        argv = [sys.executable, "-m", "validation.analysis.comm_bench", "--out", run_path(run_dir, step.name),
                "--kinds", ",".join(step.kinds), "--iters", str(step.iters), "--warmup", str(step.warmup),
                "--backend", step.backend]
        if step.compute_ms:
            argv += ["--compute-ms", str(step.compute_ms)]
        if step.sizes:
            argv += ["--sizes", ",".join(map(str, step.sizes))]
        if step.min_bytes:
            argv += ["--min-bytes", str(step.min_bytes)]
        if step.max_bytes:
            argv += ["--max-bytes", str(step.max_bytes)]
        return [LaunchSpec(argv=argv, step_dir=step_dir(run_dir, step.name), nproc_per_node=launch.nproc_per_node,
                           nnodes=launch.nnodes, torchrun=True, port_retries=launch.port_retries,
                           master_port=None if launch.master_port == "auto" else int(launch.master_port),
                           **common, **launch_identity(step))]

    def skip_reason(self, step) -> str | None:
        if step.source == "nccl-tests":
            missing = nccl_tests.missing_binaries(step.kinds, step.launch.env.get("PATH"))
            if missing:
                return f"source nccl-tests, but {', '.join(missing)} not on PATH"
        return None

    # ------------------------------------------------------------------ run
    def run(self, options: Options, ctx) -> Result:
        if ctx.launches and ctx.launches[0].argv[0] in nccl_tests.BINARIES.values():
            return self._run_nccl_tests(options, ctx)
        spec = ctx.launches[0]
        lr = ctx.launch(spec, 0, 1)
        interference = launch_record(_launch_interference(ctx, spec))
        path = ctx.run_dir / spec.dir / OUTPUT
        try:
            # an earlier launch's file is none (a --rerun whose benchmark died before writing its own)
            data = None if written_before(path, launch_started(lr)) else json.loads(path.read_text())
        except (OSError, ValueError):
            data = None
        bench = decode(BenchFile, data, OUTPUT, lenient=True) if isinstance(data, dict) else None
        if bench is None or bench.kinds is None:
            metrics = Metrics(world_size=spec.world_size, backend=None, source="torch")
            if lr.status != "ok":
                return Result(status=lr.status, reason=lr.reason, metrics=metrics, interference=interference)
            return Result(status="failed", reason=f"the benchmark wrote no {OUTPUT}", metrics=metrics,
                          interference=interference)
        measured = {kind: summarize(kind, rows) for kind in options.kinds
                    if (rows := [r for r in as_list(bench.kinds.get(kind)) if isinstance(r, dict)])}
        metrics = Metrics(world_size=bench.world_size, backend=bench.backend, source="torch", device=bench.device,
                          device_name=bench.device_name if isinstance(bench.device_name, str) else None,
                          iters=bench.iters, warmup=bench.warmup, compute_ms=bench.compute_ms, threads=bench.threads,
                          **measured)
        return dataclasses.replace(self._finish(options, metrics, lr.status, lr.reason),
                                   artifacts=[ctx.rel(path)], interference=interference)

    def _run_nccl_tests(self, options: Options, ctx) -> Result:
        world = ctx.step.launch.nproc_per_node
        measured: dict[str, Collective] = {}
        names: set[str] = set()
        status, reason = "ok", None
        shaken = []  # each collective's launch, as a run of the step: what else used the machine while it ran
        for i, (kind, spec) in enumerate(zip(options.kinds, ctx.launches)):
            lr = ctx.launch(spec, i, len(ctx.launches))
            rec = _launch_interference(ctx, spec)
            if rec is not None:
                shaken.append({"label": kind, "metrics": {"interference": encode(rec)}})
            try:
                parsed = decode(ParsedTable, nccl_tests.parse(lr.log_path.read_text(errors="replace"), kind,
                                                              world_size=world), kind)
                measured[kind] = dataclasses.replace(summarize(kind, parsed.rows),
                                                     avg_busbw_gbps_reported=parsed.avg_busbw_gbps)
                names.update(str(d) for d in parsed.devices)
            except (OSError, nccl_tests.NcclTestsError) as e:
                # wrong results are the reason even where the program's exit status also says it failed
                if status == "ok" and (lr.status == "ok" or isinstance(e, nccl_tests.WrongResults)):
                    status, reason = "failed", f"{nccl_tests.BINARIES[kind]}: {e}"
            if lr.status != "ok" and status == "ok":
                status, reason = lr.status, f"{nccl_tests.BINARIES[kind]}: {lr.reason}"
        # one name when every rank named the same GPU (else none: the ceiling is then the fastest link's)
        metrics = Metrics(world_size=world, backend="nccl", source="nccl-tests",
                          device_name=names.pop() if len(names) == 1 else None, iters=options.iters,
                          warmup=options.warmup, **measured)
        interference = step_interference({"runs": shaken}) if shaken else None
        if interference is not None:
            interference["period"] = "the whole of each launch"
        return dataclasses.replace(self._finish(options, metrics, status, reason), interference=interference)

    def _finish(self, options: Options, m: Metrics, status: str, reason: str | None) -> Result:
        if m.world_size == 1:
            m = dataclasses.replace(m, note=WORLD_ONE_NOTE)
        missing = [k for k in options.kinds if k not in m.collectives()]
        if status != "ok":
            return Result(status=status, reason=reason, metrics=m)
        if missing:
            return Result(status="failed", reason=f"no measurement of {', '.join(missing)}", metrics=m)
        return Result(status="passed", reason=None, metrics=m)

    def summary_line(self, result: Result) -> str:
        m, kinds = measured(self.read(result).metrics)
        if not kinds:
            return ""
        sizes = max(len(c.table) for c in kinds.values())
        head = (f"all_reduce peak busbw {fmt_num(m.all_reduce.busbw_gbps.max)} GB/s, "
                if given(m.all_reduce) and m.world_size != 1 else "")
        return (f" ({head}{len(kinds)} collectives x {sizes} sizes, {m.backend}, {m.world_size} "
                f"rank{'s' if m.world_size != 1 else ''}, {m.source})")

    # ------------------------------------------------------------------ report
    def blocks(self, result: Result) -> list[Block]:
        """How the collectives were measured, then per collective its peak bus bandwidth and a table over sizes."""
        m, kinds = measured(self.read(result).metrics)
        if m == Metrics():
            return []
        out: list[Block] = [Paragraph(
            f"Collectives over {fmt_num(m.world_size)} rank(s), backend {m.backend or NA}, measured with "
            f"{m.source or NA}: {protocol_text(m)} (message sizes and bus bandwidth in the nccl-tests "
            "conventions; GB/s = 10^9 bytes/s).")]
        if m.note:
            out.append(Paragraph(f"Note: {m.note}.", style="muted"))
        for kind, stats in kinds.items():
            out += [Paragraph(f"{code(kind)}: peak busbw {fmt_num(stats.busbw_gbps.max)} GB/s, "
                              f"latency {fmt_num(stats.latency_us)} us (smallest size)."),
                    Table(tuple(Column(c, numeric=True) for c in ("size", "time (us)", "algbw (GB/s)", "busbw (GB/s)")),
                          [(size_text(r.bytes), fmt_num(_us(r.time_s)), fmt_num(r.algbw_gbps),
                            fmt_num(r.busbw_gbps)) for r in stats.table])]
        return out

    def key_figure_steps(self, in_order: list[StepRecord]) -> list[str]:
        """The step whose peak all-reduce bus bandwidth the key figure shows (its evidence: measured while other
        work used the machine, the report names it among the open problems); none of one rank (the figure is
        n/a: nothing moves between ranks)."""
        ranks = {str(s.name): s.metrics.world_size for s in in_order if isinstance(s, Result)}
        return [str(name) for fig in self.key_figures(in_order) for name in fig.steps if ranks.get(str(name)) != 1]

    def key_figures(self, in_order: list[StepRecord]) -> list[KeyFigure]:
        """The peak all-reduce bus bandwidth of the comm step with the most ranks (the first of those with as many;
        a step whose world size is unknown counts below every multi-rank one): a one-rank step measures only the
        calls' overhead (nothing moves between ranks), so its figure is n/a and shown only where no step measured
        more ranks."""
        measured = [s for s in in_order
                    if isinstance(s, Result) and finite(s.metrics.all_reduce.busbw_gbps.max) is not None]
        if not measured:
            return []

        def ranks(s: Result) -> tuple[bool, float]:
            n = finite(s.metrics.world_size)
            return n != 1, n if n is not None else 0.0

        s = max(measured, key=ranks)  # max keeps the first of equals
        m = s.metrics
        peak = finite(m.all_reduce.busbw_gbps.max)
        note = f"step `{s.name}`, {m.backend}, {fmt_num(m.world_size)} ranks"
        one = finite(m.world_size) == 1
        return [KeyFigure("peak_all_reduce_busbw", "Peak all-reduce bus bandwidth",
                          "n/a (one rank)" if one else f"{fmt_num(peak)} GB/s",
                          note + "; nothing moves between ranks" if one else note, order=25, steps=(str(s.name),))]

    def plots(self, name: str, result: Result, plotter) -> None:
        step = self.read(result)
        m, kinds = measured(step.metrics)
        bus = m.world_size != 1
        series = {}
        for kind, stats in kinds.items():
            points = [(finite(r.bytes), finite(r.busbw_gbps if bus else r.algbw_gbps)) for r in stats.table]
            points = [(x, y) for x, y in points if x and y and x > 0 and y > 0]
            if points:
                series[kind] = points
        title = f"{'Bus' if bus else 'Algorithm'} bandwidth vs message size: {step.title or name}"
        loglog_lines(plotter, series, title=title, xlabel="message size (bytes)",
                     ylabel=f"{'busbw' if bus else 'algbw'} (GB/s)", filename=f"comm_{file_name(name)}.png")


def _launch_interference(ctx, spec: LaunchSpec):
    """What else used the machine over the whole of one launch, from the telemetry in its directory
    (validation.launch.telemetry.interference); None without samples."""
    return telemetry.interference(contracts.read_telemetry(ctx.run_dir / spec.dir))


def protocol_text(m: Metrics) -> str:
    """How the calls were timed, in words."""
    if m.source == "nccl-tests":
        return f"nccl-tests' {fmt_num(m.iters)} calls back to back per size"
    compute = finite(m.compute_ms)
    if compute:
        return (f"each of {fmt_num(m.iters)} calls per size timed alone, after {fmt_num(compute)} ms of "
                f"computation and a barrier")
    return f"{fmt_num(m.iters)} calls back to back per size after a barrier"


def size_text(nbytes: Any) -> str:
    """4096 -> "4 KiB", 1048576 -> "1 MiB", 1500 -> "1500 B"."""
    n = finite(nbytes)
    if n is None:
        return NA
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{int(n // scale)} {unit}"
    return f"{int(n)} B"


def _us(seconds: Any) -> float | None:
    s = finite(seconds)
    return None if s is None else s * 1e6


registry.register(Comm())
