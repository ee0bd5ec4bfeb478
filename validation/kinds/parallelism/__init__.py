"""`parallelism`: the same trainer config under DDP, FSDP2 full shard and FSDP2 no-reshard (seed 003), repeated in
a random order per repeat, side by side: step time, tokens/s, peak memory beside the memory model, the bytes
communicated (counted by the trainer) beside the byte model, the collectives' time measured and predicted from a
`comm` step's bandwidth tables, the exposed communication time from the profiler trace, a batch-size search per
strategy (GPU only), and the DDP-vs-FSDP recommendation of validation.analysis.parallelism.recommend.

Own keys:
  strategies    a list of ddp, fsdp, fsdp_no_reshard (default all three), or {label: {strategy, env, args}} for
                variants (e.g. ddp_accum4: {strategy: ddp, args: {accum: 4}}); labels are identifiers
  repeats       runs per strategy, interleaved (default 2: comparisons are paired over repeats, each repeat held to
                the runbook's declared launch noise, `compare: {launch_sd, pairs}`, as an ab step's; 1: block means
                of the one run each, held to that noise or to the run-to-run variation measured in this run's
                repeats, and "inconclusive" where neither is known; analysis.compare_strategies). A run measured
                under interference is left out of the comparisons
  comm          the name of an earlier `comm` step whose tables predict the collectives' time; without it the
                prediction is "not available" (said so in the metrics and the report)
  batch_search  {start: 1, max: 64, steps: 5}: on GPU, per strategy, double the micro-batch until a launch fails
                out of memory, then bisect; skipped on CPU (stated)
  headroom      the memory headroom DDP needs to count as fitting comfortably (default 0.2 = 20%)
  profile_steps profiler steps per run for the exposed communication time (default 2; 0: not measured). The
                trainer profiles from step 5 (train.profile_start): keep those steps out of the window
Metrics: {"strategies": {label: {strategy, runs, passed, step_time_s, toks_per_s, peak_alloc_gb, peak_reserved_gb,
memory_kind, memory_model, comm_bytes_counted, comm_bytes_model, comm_model_matches, comm_time_s, comm_predicted_s,
comm_prediction, exposed_comm_s, aligned_comm_s (collective time, ranks aligned), exposed_source, per_step (counts)}}, "all_ran", "comparisons" {"b:a": Comparison},
"recommendation", "recommendation_reason", "regime", "headroom", "capacity", "batch_search", "comm_step",
"repeats"}. All times per optimizer step; memory in GiB (as the trainer writes it). A strategy's toks_per_s
over its repeats is their work over their time: the harmonic mean of the runs' window figures, each window the same
work (validation.analysis.metrics.window_mean, the rule of a window's own figure), so that it agrees with the mean
step_time_s beside it; toks_per_s_runs keeps each run's.
Options: the keys above. Result (validation.kinds.parallelism.records): the step record with these metrics as typed
records (Metrics), a LaunchRun per run and the run order: what run() returns, decoded leniently where the report
reads it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping

from validation import kinds
from validation.analysis.parallelism import STRATEGIES
from validation.runbook.schema import REPEATS_MAX, env_vars, mapping, trainer_flags, typed
from validation.kinds.parallelism.analysis import analyse, decide_recommendation, search_batches
from validation.kinds.parallelism.launch import strategy_launch
from validation.kinds.parallelism.records import Result
from validation.kinds.parallelism.view import draw_plots, parallelism_blocks
from validation.kinds.blocks import Block
from validation.kinds.base import KeyFigure, Settings, earlier_step_of_kind
from validation.kinds.trainer import RUN_METRICS, RUN_PERFORMANCE, TrainerKind, order_seed, run_all, run_order
from validation.results.run import Step


@dataclasses.dataclass(frozen=True)
class Strategy(Settings):
    """A strategy to run (ddp, fsdp, ...) with its own env and args."""
    strategy: str = "ddp"


@dataclasses.dataclass(frozen=True)
class BatchSearch:
    start: int = 1
    max: int = 64
    steps: int = 5


@dataclasses.dataclass(frozen=True)
class Options:
    strategies: Mapping[str, Strategy]  # by label
    repeats: int = 2
    comm: str | None = None  # the comm step whose tables predict the collectives
    batch_search: BatchSearch | None = None
    headroom: float = 0.2
    profile_steps: int = 2


class Parallelism(TrainerKind):
    name = "parallelism"
    summary = ("the same config under DDP, FSDP2 full shard and FSDP2 no-reshard, interleaved repeats: step time, "
               "tokens/s, memory vs the memory model, counted vs modelled bytes, measured/predicted/exposed "
               "communication, a batch-size search (GPU) and the DDP-vs-FSDP recommendation with its reason")
    keys = ("strategies", "repeats", "comm", "batch_search", "headroom", "profile_steps")
    metrics = ("all_ran", "comparisons.<pair>.*", "recommendation", "recommendation_reason", "regime", "headroom",
               "capacity.*", "batch_search.*", "batch_needed", "comm_step", "comm_source", "repeats",
               "byte_model_matches", "oom_only", "recommendation_numbers.<strategy>.*",
               *(f"strategies.<strategy>.{k}" for k in (
                   "strategy", "runs", "passed", "oom", "step_time_s", "toks_per_s", "toks_per_s_runs.<i>",
                   "peak_alloc_gb", "peak_reserved_gb", "memory_kind", "memory_model.*", "comm_bytes_counted",
                   "comm_bytes_model", "comm_counted_by", "comm_model_matches", "comm_time_s", "comm_share",
                   "comm_predicted_s", "comm_predicted_by_kind.*", "comm_prediction", "exposed_comm_s",
                   "aligned_comm_s", "profiled_comm_s", "exposed_source", "per_step.*"))) + RUN_METRICS
    plan_note = ("runs in a random order within each repeat, drawn for each run directory (the seed is recorded in "
                 "results.json); on GPU a batch-size search per strategy follows (launches decided while it runs)")
    performance = ("comparisons", "recommendation", "recommendation_reason", "regime", "headroom", "batch_search",
                   "batch_needed", "recommendation_numbers", "strategies.<strategy>.step_time_s",
                   "strategies.<strategy>.toks_per_s", "strategies.<strategy>.toks_per_s_runs",
                   "strategies.<strategy>.comm_time_s", "strategies.<strategy>.comm_share") + RUN_PERFORMANCE
    decides = True
    result_type = Result

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        value = raw.get("strategies", list(STRATEGIES))
        chosen: dict[str, Strategy] = {}
        if isinstance(value, list) and value:
            for i, s in enumerate(value):
                if not isinstance(s, str) or s not in STRATEGIES:
                    raise ctx.error(path + ("strategies", i), f"expected one of {', '.join(STRATEGIES)}, got {s!r}")
                chosen[s] = Strategy(strategy=s)
            if len(chosen) != len(value):
                raise ctx.error(path + ("strategies",), "strategies must be distinct")
        elif isinstance(value, dict) and value:
            for label, v in value.items():
                vpath = path + ("strategies", label)
                if not isinstance(label, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", label):
                    raise ctx.error(vpath, "strategy labels are identifiers")
                v = mapping(v, vpath, ctx, ("strategy", "env", "args"), required=("strategy",))
                chosen[label] = Strategy(env=env_vars(v.get("env"), vpath + ("env",), ctx),
                                         args=trainer_flags(v.get("args"), vpath + ("args",), ctx),
                                         strategy=typed(v["strategy"], str, vpath + ("strategy",), ctx,
                                                        choices=tuple(STRATEGIES)))
        else:
            raise ctx.error(path + ("strategies",), f"expected a non-empty list of {', '.join(STRATEGIES)} or a "
                                                    "mapping {label: {strategy, env, args}}")
        search = raw.get("batch_search")
        if search is not None:
            s = mapping(search, path + ("batch_search",), ctx, ("start", "max", "steps"))
            search = BatchSearch(start=typed(s.get("start", 1), int, path + ("batch_search", "start"), ctx, minimum=1),
                                 max=typed(s.get("max", 64), int, path + ("batch_search", "max"), ctx, minimum=1),
                                 steps=typed(s.get("steps", 5), int, path + ("batch_search", "steps"), ctx, minimum=1))
            if search.max < search.start:
                raise ctx.error(path + ("batch_search", "max"), f"must be >= start ({search.start})")
        headroom = typed(raw.get("headroom", 0.2), float, path + ("headroom",), ctx, minimum=0)
        if headroom >= 1:
            raise ctx.error(path + ("headroom",), f"a fraction below 1 (0.2 = 20%), got {headroom}")
        return Options(strategies=chosen,
                       repeats=typed(raw.get("repeats", 2), int, path + ("repeats",), ctx, minimum=1,
                                      maximum=REPEATS_MAX),
                       comm=typed(raw.get("comm"), str, path + ("comm",), ctx, optional=True), batch_search=search,
                       headroom=headroom,
                       profile_steps=typed(raw.get("profile_steps", 2), int, path + ("profile_steps",), ctx, minimum=0))

    def check(self, step, order, error) -> None:
        if step.comm is None:
            return
        if not earlier_step_of_kind(order, step, step.comm, "comm"):
            raise error(f"comm {step.comm!r} must name an earlier step of kind comm")

    def launches(self, step, winners, run_dir):
        out = []
        for repeat, label in run_order(list(step.strategies), step.repeats, order_seed(step, run_dir)):
            out.append(strategy_launch(step, label, repeat, winners, run_dir))
        return out

    def run(self, options: Options, ctx) -> Result:
        step = ctx.step
        done = run_all(ctx)
        frame = Result(runs=done.runs, superseded=done.superseded, notes=done.notes,
                       order_seed=order_seed(step, ctx.run_dir), order=[s.label for s in ctx.launches])
        m = analyse(step, done.runs, ctx)
        # each strategy's search saved as it ends, the metrics without the search until it has ended
        search = search_batches(step, m, ctx, on_progress=lambda _: ctx.save(dataclasses.replace(frame, metrics=m)))
        m = decide_recommendation(step, dataclasses.replace(m, batch_search=search), done.runs)
        if done.problems and not m.oom_only:
            status, reason = "failed", "; ".join(done.problems)
        else:
            status, reason = "passed", "; ".join(done.problems) or None
        return dataclasses.replace(frame, status=status, reason=reason, metrics=m)

    def summary_line(self, result: Result) -> str:
        recommendation = self.read(result).metrics.recommendation
        return f" recommendation: {recommendation}" if recommendation else ""

    def view(self, result: Result, view: dict) -> dict:
        return {"command": ""}  # each run has its own

    def blocks(self, result: Result) -> list[Block]:
        return parallelism_blocks(self.read(result))

    def key_figures(self, in_order: list[Step]) -> list[KeyFigure]:
        out = []
        for s in in_order:
            if not isinstance(s, Result):
                continue
            m = s.metrics
            if m.recommendation:
                out.append(KeyFigure("parallelism", "Parallelism", str(m.recommendation),
                                     f"step `{s.name}`: {m.recommendation_reason}", order=30, steps=(str(s.name),)))
        return out

    def plots(self, name: str, result: Result, plotter) -> None:
        draw_plots(name, self.read(result), plotter)

    def derived_from(self, result: Result, path: tuple) -> list[str]:
        """The `comm` step, for a collectives' time its bandwidth tables predicted (strategies.<label>.
        comm_predicted_s, comm_predicted_by_kind) and the records that hold one (the step, its strategies, the
        strategy); none for every other figure (this step's own runs) and where no time was predicted."""
        m = self.read(result).metrics
        predicted = [label for label, f in m.strategies.items() if f.comm_predicted_s is not None]
        if not m.comm_step or not predicted:
            return []
        key = tuple(map(str, path))
        holds = (not key or key == ("strategies",)
                 or (key[0] == "strategies" and key[1] in predicted
                     and (len(key) == 2 or key[2] in ("comm_predicted_s", "comm_predicted_by_kind"))))
        return [str(m.comm_step)] if holds else []


kinds.register(Parallelism())
