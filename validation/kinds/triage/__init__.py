"""`triage`: a slow configuration (the step's config/env/args) run as it is and with each suspect changed alone
(selection v1/v2, batched/sequential prefill, accumulation, checkpointing, compression, fused AdamW, compile, the
attention kernel, ...), all in interleaved repeats in a random order per repeat; the suspects ranked by their
effect on tokens/s with 95% confidence intervals, paired over the repeats, Holm over the suspects
(validation.analysis.triage.rank_suspects); the culprit is named only when significant and ahead of every other
suspect, paired over the same repeats (seed 000: "toggle optimizations one at a time").

Own keys:
  suspects  {name: {env: {...}, args: {...}}}: what each suspect changes against the configuration (names are
            identifiers, not "config"); NSA_FAULT is never a suspect (an injected fault is part of the
            configuration under test, not a cause to find)
  repeats   runs of the configuration and of every suspect, interleaved (default 3; at least 2)
A run's tokens/s is the median of its window (one unit per run, robust to a step another process slowed); the
tokens/s shown for the configuration and each suspect is their repeats' work over their time (equal work a run: the
harmonic mean of the runs' figures, validation.analysis.metrics.window_mean), the disturbed runs left out.
Metrics: "culprit" (a suspect's name; null when the suspects were ranked and none is named; absent when nothing was
compared, e.g. every run disturbed), "tied" (only where the suspect that would be the culprit cannot be told apart
from others: it and those, in ranking order; the culprit null), "reason" (it also names a suspect left unranked:
fewer than 2 repeats with both runs measured), "statement" (Holm), "ranking" (names, largest improvement first),
"suspects" {name: {effect (relative change of tokens/s), ci [low, high], p, p_adjusted, significant, verdict,
toks_per_s, changes}},
"config_toks_per_s", "repeats", "runs", "passed".
Options: the keys above (each suspect's change a Settings). Result: the step record (validation.results.run.Step: its
runs a LaunchRun each, the run order, superseded runs and notes), its metrics a Metrics (a Suspect per suspect); run()
builds it, the report hooks read it (decoded leniently).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from validation import kinds
from validation.analysis.interference import decision_record, disturbed_flags
from validation.analysis.metrics import window_mean
from validation.formatting import env_text, finite, fmt_num, fmt_pct, fmt_rate, params_text
from validation.runbook.schema import REPEATS_MAX, env_vars, mapping, trainer_flags, typed
from validation.analysis.significance import StatsError
from validation.kinds.blocks import Block, Column, Paragraph, Table, strong
from validation.kinds.trainer import (RUN_METRICS, RUN_PERFORMANCE, TrainerKind, declared_pair_noise, order_seed,
                                      run_all, run_order, run_values, trainer_launch)
from validation.kinds.base import DECIDING_LAUNCH_KEYS, Effect, KeyFigure, Settings, effect_of, with_labels
from validation.analysis.triage import rank_suspects
from validation.results.codec import absent, decode, encode
from validation.results.decision import ComparisonRecord
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import LaunchRun, Num


@dataclasses.dataclass(frozen=True)
class Options:
    suspects: Mapping[str, Settings]  # each suspect's change to the configuration, by name
    repeats: int = 3


@dataclasses.dataclass(frozen=True)
class Suspect:
    """One suspect changed alone against the configuration (a significance.Comparison of its runs' tokens/s with
    the configuration's, paired over the repeats): the relative effect, its 95% interval, p and Holm-adjusted p,
    whether it is significant, the verdict, the noise floor, the suspect's mean tokens/s, its change in words and
    the comparison in words."""
    effect: Num | None = None
    ci: list[Num | None] = dataclasses.field(default_factory=list)
    p: Num | None = None
    p_adjusted: Num | None = None
    significant: bool | None = None
    verdict: str | None = None
    noise_floor: Num | None = absent()
    toks_per_s: Num | None = None
    changes: Any = None  # "NSA_X=1; --flag v" (a mapping in older records)
    text: str | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


UNRANKED = ""  # Metrics.culprit of a step without a verdict (never got as far, or compared nothing): the key absent


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's metrics (the module docstring), in the order run() writes them: the culprit (null where the
    suspects were ranked and none is named; UNRANKED, the key absent, where there is no verdict: the run never got as
    far, or too few runs were left to compare anything, so that a criterion such as `triage.culprit is None` cannot
    hold on it), the statement only where the suspects were ranked."""
    culprit: str | None = absent(UNRANKED)
    repeats: int | None = None
    runs: int | None = None
    passed: int | None = None
    config_toks_per_s: Num | None = None
    suspects: dict[str, Suspect] = dataclasses.field(default_factory=dict)
    ranking: list[str] = dataclasses.field(default_factory=list)
    reason: str | None = None
    statement: str | None = absent()
    tied: list[str] = absent([])  # no single culprit: the suspects the data cannot tell apart (ranking order)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A triage step's record: its runs and run order (the step record's) and its metrics."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)


def ranked(step: Any) -> Metrics | None:
    """A triage step's metrics where they hold its verdict (a culprit, named or null), else None (the step never got
    as far as ranking). `step`: its Result, or its entry as results.json holds it (read leniently)."""
    r = step if isinstance(step, Result) else decode(Result, step, "step", lenient=True)
    return r.metrics if r.metrics.culprit != UNRANKED else None


CONFIG = "config"
FORBIDDEN_ENV = ("NSA_FAULT",)


class Triage(TrainerKind):
    name = "triage"
    summary = ("a slow configuration with each suspect (`suspects: {sel_v2: {env: {NSA_SEL_RANGES_V2: '1'}}}`) "
               "changed alone, interleaved repeats; suspects ranked by their effect on tokens/s with 95% CIs "
               "(paired, Holm over suspects); `triage.culprit` names one only when significant")
    keys = ("suspects", "repeats")
    launch_keys = DECIDING_LAUNCH_KEYS  # retry_disturbed too: it decides from repeats
    metrics = ("culprit", "tied.<i>", "reason", "statement", "ranking.<i>", "config_toks_per_s", "repeats", "runs",
               "passed",
               *(f"suspects.<suspect>.{k}" for k in ("effect", "ci.<i>", "p", "p_adjusted", "significant", "verdict",
                                                      "toks_per_s", "changes.*", "noise_floor", "text"))) + RUN_METRICS
    performance = ("culprit", "tied", "reason", "statement", "ranking", "config_toks_per_s",
                   "suspects") + RUN_PERFORMANCE
    decides = True
    result_type = Result

    def metric_names(self, step):  # runs.<label>: the configuration and the suspects, by their names
        return self.metrics if step is None else with_labels(self.metrics, "<label>", [CONFIG, *step.suspects])
    plan_note = ("runs in a random order within each repeat, drawn for each run directory (the seed is recorded in "
                 "results.json)")

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        value = raw.get("suspects")
        if not isinstance(value, dict) or not value:
            raise ctx.error(path + ("suspects",), "expected a mapping {name: {env: {...}, args: {...}}} of at least "
                                                  "one suspect")
        suspects = {}
        for name, spec in value.items():
            spath = path + ("suspects", name)
            if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name == CONFIG:
                raise ctx.error(spath, f"suspect names are identifiers other than {CONFIG!r}")
            spec = mapping(spec, spath, ctx, ("env", "args"))
            env = env_vars(spec.get("env"), spath + ("env",), ctx)
            for key in env:
                if key in FORBIDDEN_ENV:
                    raise ctx.error(spath + ("env", key), f"{key} is never a suspect: an injected fault is part "
                                                          "of the configuration under test (set it in the step's env)")
            args = trainer_flags(spec.get("args"), spath + ("args",), ctx)
            if not env and not args:
                raise ctx.error(spath, "a suspect changes at least one env variable or trainer arg")
            suspects[name] = Settings(env, args)
        repeats = typed(raw.get("repeats", 3), int, path + ("repeats",), ctx, minimum=2, maximum=REPEATS_MAX)
        return Options(suspects=suspects, repeats=repeats)

    def launches(self, step, winners, run_dir):
        out = []
        for repeat, label in run_order([CONFIG, *step.suspects], step.repeats, order_seed(step, run_dir)):
            spec = step.suspects.get(label, Settings())
            out.append(trainer_launch(step, step.launch, label, f"{step.name}/{label}_r{repeat + 1}", winners,
                                      run_dir, extra_args=spec.args, extra_env=spec.env, params=spec.params(),
                                      repeat=repeat))
        return out

    def run(self, options: Options, ctx) -> Result:
        """The configuration and every suspect in every repeat (a disturbed repeat run again), then the suspects
        ranked against the configuration, the disturbed runs left out."""
        step = ctx.step
        done = run_all(ctx, retry_disturbed=True)
        runs = done.runs
        data: dict[str, list] = {label: [None] * options.repeats for label in [CONFIG, *options.suspects]}
        shaken = disturbed_flags([encode(r) for r in runs], data, options.repeats)
        for r in runs:  # a run measured under interference is left out, as a failed one would be
            data[r.label][r.repeat] = None if shaken[r.label][r.repeat] else run_toks(ctx, step, r)
        counted = Metrics(culprit=None, repeats=options.repeats, runs=len(runs),
                          passed=sum(r.status == "passed" for r in runs),
                          config_toks_per_s=window_mean(data[CONFIG], "toks_per_s"))
        try:
            ranking = rank_suspects(data[CONFIG], {k: data[k] for k in options.suspects},
                                    pair_noise=declared_pair_noise(ctx))
        except StatsError as exc:  # nothing compared: no verdict, so no culprit key (not "none named")
            culprit, reason, ranked_ = None, f"no ranking: {exc}", False
            metrics = dataclasses.replace(counted, culprit=UNRANKED)
        else:
            culprit, reason, ranked_ = ranking.culprit, ranking.reason, True
            suspects = {c.variant: Suspect(
                effect=c.rel, ci=[c.ci_low, c.ci_high], p=c.p_value, p_adjusted=c.p_adjusted, significant=c.significant,
                verdict=c.verdict, noise_floor=c.noise_floor, toks_per_s=window_mean(data[c.variant], "toks_per_s"),
                changes=_changes(options.suspects[c.variant]), text=c.describe()) for c in ranking.comparisons}
            metrics = dataclasses.replace(counted, culprit=culprit, suspects=suspects,
                                          ranking=[c.variant for c in ranking.comparisons], statement=ranking.statement,
                                          tied=list(ranking.tied))
        left_out = [f"{k} (repeat {i + 1})" for k, flags in shaken.items() for i, f in enumerate(flags) if f]
        if left_out and reason:
            reason += "; left out because other work used the machine while they ran: " + ", ".join(left_out)
        metrics = dataclasses.replace(metrics, reason=reason)
        if done.problems:
            status, why = "failed", "; ".join(done.problems)
        elif not ranked_ and not left_out:
            status, why = "failed", reason
        elif not ranked_:  # the disturbed runs left too few: nothing failed, the evidence is missing
            status, why = "passed", f"{reason}: inconclusive, run it again on a quiet machine"
        else:
            status, why = "passed", None
        return Result(status=status, reason=why, metrics=metrics, runs=runs, superseded=done.superseded,
                      notes=done.notes, order_seed=order_seed(step, ctx.run_dir),
                      order=[spec.label for spec in ctx.launches],
                      interference=decision_record(encode(StepRecord(runs=runs)), conclusive=bool(culprit)))

    def summary_line(self, result: Result) -> str:
        r = self.read(result)
        m = r.metrics
        if m.culprit:
            s = m.suspects.get(m.culprit) or Suspect()
            return f" culprit: {m.culprit} ({fmt_pct(finite(s.effect), signed=True)} tokens/s)"
        if compared_nothing(m):
            return " no culprit named, nothing compared" if m.reason else ""
        if m.tied:
            return f" no single culprit: {', '.join(str(t) for t in m.tied)} cannot be told apart"
        missing = uncompared(r)
        if missing:  # a suspect whose runs failed or were left out is no suspect without effect
            return f" no culprit among the suspects compared (not compared: {', '.join(missing)})"
        return " no culprit (no suspect improves it significantly)"  # one may make it significantly worse

    def blocks(self, result: Result) -> list[Block]:
        """The configuration's tokens/s, one row per suspect in ranking order (the culprit marked), then one per
        suspect that could not be compared ("not compared": its runs failed or were left out), the culprit."""
        r = self.read(result)
        m = r.metrics
        ranking = [str(n) for n in m.ranking]
        rows = []
        for name in ranking:
            s = m.suspects.get(name) or Suspect()
            ci = (list(s.ci) + [None, None])[:2]
            rows.append((strong(f"{name} CULPRIT") if name == m.culprit else name, str(s.changes or "—"),
                         fmt_rate(s.toks_per_s), fmt_pct(finite(s.effect), signed=True),
                         f"{fmt_pct(finite(ci[0]), signed=True)} .. {fmt_pct(finite(ci[1]), signed=True)}",
                         _p(s.p_adjusted), "yes" if s.significant else "no"))
        rows += [(name, "—", "—", "not compared", "—", "—", "—") for name in uncompared(r)]
        out: list[Block] = [
            Paragraph(f"The configuration as it is: {fmt_rate(m.config_toks_per_s)} tokens/s; each suspect "
                      f"changed alone, {fmt_num(m.repeats)} interleaved repeats, ranked by effect."),
            Table((Column("Suspect"), Column("Change"), *(Column(c, numeric=True) for c in (
                "Tokens/s over repeats (work over time) of each run's window median", "Effect on tokens/s", "95% CI",
                "p (Holm)")), Column("Significant")), rows,
                marked={i for i, name in enumerate(ranking) if name == m.culprit}),
            Paragraph(f"{strong('Culprit')}: "
                      f"{m.culprit or ('none, nothing compared' if compared_nothing(m) else _none_named(r, 'none'))}"
                      f" — {m.reason or ''}")]
        if m.statement:
            out.append(Paragraph(str(m.statement), style="muted"))
        return out

    def comparisons(self, result: Result) -> list[Effect]:
        """Each suspect changed alone against the configuration as given."""
        metrics = self.read(result).metrics
        out = []
        for suspect, s in sorted(metrics.suspects.items(), key=lambda kv: str(kv[0])):
            ci = s.ci
            changes = s.changes
            with_ = (f"{changes} ({suspect})" if isinstance(changes, str) and changes else
                     f"{params_text(changes)} ({suspect})" if isinstance(changes, dict) and changes else str(suspect))
            effect = effect_of(ComparisonRecord(rel=s.effect, ci_low=ci[0] if len(ci) == 2 else None,
                                                ci_high=ci[1] if len(ci) == 2 else None, p_adjusted=s.p_adjusted,
                                                p_value=s.p, significant=s.significant, verdict=s.verdict,
                                                mean_a=metrics.config_toks_per_s, mean_b=s.toks_per_s),
                               "the configuration as given", with_)
            if effect:
                out.append(effect)
        return out

    def key_figures(self, in_order: list[StepRecord]) -> list[KeyFigure]:
        """Each triage's culprit (or "none named", or "none, nothing compared") and why."""
        out = []
        for r in in_order:
            m = r.metrics if isinstance(r, Result) else None
            if m is not None and m.reason:
                value = m.culprit or ("none, nothing compared" if compared_nothing(m) else _none_named(r, "none named"))
                out.append(KeyFigure("culprit", "Culprit", str(value), f"step `{r.name}`: {m.reason}", order=26,
                                     steps=(str(r.name),)))
        return out


def compared_nothing(m: Metrics) -> bool:
    """Whether a triage's metrics hold no comparison (no suspect ranked, none named): its culprit key is absent, or
    null in results written before that, and its sentences say "nothing compared", never "no culprit" alone."""
    return not m.culprit and not m.ranking


def uncompared(r: Result) -> list[str]:
    """The suspects of a triage that ranked others but could not compare these (fewer than 2 repeats with both runs
    measured: their runs failed or were left out as disturbed), in run order: no verdict holds for them."""
    ranking = {str(n) for n in r.metrics.ranking}
    if not ranking:
        return []
    return list(dict.fromkeys(str(run.label) for run in r.runs
                              if run.label is not None and str(run.label) not in ranking and run.label != CONFIG))


def _none_named(r: Result, text: str) -> str:
    """`text` for a ranked triage that named no culprit: with the tied suspects where there is no single one, else
    with the suspects not compared, of which it says nothing."""
    m = r.metrics
    if m.tied:
        return f"{text} ({', '.join(str(t) for t in m.tied)} tied)"
    missing = uncompared(r)
    return f"{text} among the suspects compared ({', '.join(missing)} not compared)" if missing else text


def run_toks(ctx, step, run: LaunchRun) -> float | None:
    """A run's tokens/s: the median of its window's per-step values (None for a failed run)."""
    values = run_values(ctx.run_dir, step, encode(run), "toks_per_s")
    if isinstance(values, list):
        if not values:
            return None
        xs = sorted(values)
        n = len(xs)
        return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0
    return finite(values)


def _changes(spec: Settings) -> str:
    parts = [env_text(spec.env)] if spec.env else []
    parts += [f"--{k.replace('_', '-')} {v}" for k, v in spec.args.items()]
    return "; ".join(p for p in parts if p) or "—"


def _p(value) -> str:
    v = finite(value)
    return "—" if v is None else f"{v:.2g}" if v >= 1e-4 else "< 0.0001"


kinds.register(Triage())
