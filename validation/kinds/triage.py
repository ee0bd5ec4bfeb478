"""`triage`: a slow configuration (the step's config/env/args) run as it is and with each suspect changed alone
(selection v1/v2, batched/sequential prefill, accumulation, checkpointing, compression, fused AdamW, compile, the
attention kernel, ...), all in interleaved repeats in a random order per repeat; the suspects ranked by their
effect on tokens/s with 95% confidence intervals, paired over the repeats, Holm over the suspects
(validation.analysis.triage.rank_suspects); the culprit is named only when significant (seed 000: "toggle optimizations
one at a time").

Own keys:
  suspects  {name: {env: {...}, args: {...}}}: what each suspect changes against the configuration (names are
            identifiers, not "config"); NSA_FAULT is never a suspect (an injected fault is part of the
            configuration under test, not a cause to find)
  repeats   runs of the configuration and of every suspect, interleaved (default 3; at least 2)
A run's tokens/s is the median of its window (one unit per run, robust to a step another process slowed).
Metrics: "culprit" (a suspect's name or null), "reason", "statement" (Holm), "ranking" (names, largest
improvement first), "suspects" {name: {effect (relative change of tokens/s), ci [low, high], p, p_adjusted,
significant, verdict, toks_per_s, changes}}, "config_toks_per_s", "repeats", "runs", "passed".
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping

from validation import kinds
from validation.analysis.interference import decision_record, disturbed_flags
from validation.formatting import as_dict, as_list, env_text, finite, fmt_num, fmt_pct, fmt_rate, params_text
from validation.runbook.schema import env_vars, mapping, trainer_flags, typed
from validation.analysis.significance import StatsError
from validation.kinds.blocks import Block, Column, Paragraph, Table, strong
from validation.kinds.trainer import RUN_METRICS, RUN_PERFORMANCE, TrainerKind, declared_pair_noise, order_seed, run_each, run_order, run_values, trainer_launch
from validation.kinds.base import DECIDING_LAUNCH_KEYS, Effect, KeyFigure, Settings, effect_of, with_labels
from validation.analysis.triage import rank_suspects


@dataclasses.dataclass(frozen=True)
class Options:
    suspects: Mapping[str, Settings]  # each suspect's change to the configuration, by name
    repeats: int = 3

CONFIG = "config"
FORBIDDEN_ENV = ("NSA_FAULT",)


class Triage(TrainerKind):
    name = "triage"
    summary = ("a slow configuration with each suspect (`suspects: {sel_v2: {env: {NSA_SEL_RANGES_V2: '1'}}}`) "
               "changed alone, interleaved repeats; suspects ranked by their effect on tokens/s with 95% CIs "
               "(paired, Holm over suspects); `triage.culprit` names one only when significant")
    keys = ("suspects", "repeats")
    launch_keys = DECIDING_LAUNCH_KEYS  # retry_disturbed too: it decides from repeats
    metrics = ("culprit", "reason", "statement", "ranking.<i>", "config_toks_per_s", "repeats", "runs", "passed",
               *(f"suspects.<suspect>.{k}" for k in ("effect", "ci.<i>", "p", "p_adjusted", "significant", "verdict",
                                                      "toks_per_s", "changes.*", "noise_floor", "text"))) + RUN_METRICS
    performance = ("culprit", "reason", "statement", "ranking", "config_toks_per_s", "suspects") + RUN_PERFORMANCE
    decides = True

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
        repeats = typed(raw.get("repeats", 3), int, path + ("repeats",), ctx, minimum=2)
        return Options(suspects=suspects, repeats=repeats)

    def launches(self, step, winners, run_dir):
        out = []
        for repeat, label in run_order([CONFIG, *step.suspects], step.repeats, order_seed(step, run_dir)):
            spec = step.suspects.get(label, Settings())
            out.append(trainer_launch(step, step.launch, label, f"{step.name}/{label}_r{repeat + 1}", winners,
                                      run_dir, extra_args=spec.args, extra_env=spec.env, params=spec.params(),
                                      repeat=repeat))
        return out

    def run(self, step, launches, result, ctx) -> None:
        runs, problems = run_each(ctx, step, launches, result, retry_disturbed=True)
        result["order_seed"], result["order"] = order_seed(step, ctx.run_dir), [s.label for s in launches]
        data: dict[str, list] = {label: [None] * step.repeats for label in [CONFIG, *step.suspects]}
        shaken = disturbed_flags(runs, data, step.repeats)
        for r in runs:  # a run measured under interference is left out, as a failed one would be
            data[r["label"]][r["repeat"]] = None if shaken[r["label"]][r["repeat"]] else run_toks(ctx, step, r)
        m: dict[str, Any] = {"culprit": None, "repeats": step.repeats, "runs": len(runs),
                             "passed": sum(r["status"] == "passed" for r in runs),
                             "config_toks_per_s": _mean(data[CONFIG]), "suspects": {}, "ranking": []}
        result["metrics"] = m
        try:
            ranking = rank_suspects(data[CONFIG], {k: data[k] for k in step.suspects},
                                    pair_noise=declared_pair_noise(ctx))
        except StatsError as exc:
            m["reason"] = f"no ranking: {exc}"
        else:
            m.update(culprit=ranking.culprit, reason=ranking.reason, statement=ranking.statement,
                     ranking=[c.variant for c in ranking.comparisons])
            for c in ranking.comparisons:
                m["suspects"][c.variant] = {
                    "effect": c.rel, "ci": [c.ci_low, c.ci_high], "p": c.p_value, "p_adjusted": c.p_adjusted,
                    "significant": c.significant, "verdict": c.verdict, "noise_floor": c.noise_floor,
                    "toks_per_s": _mean(data[c.variant]), "changes": _changes(step.suspects[c.variant]),
                    "text": c.describe()}
        left_out = [f"{k} (repeat {i + 1})" for k, flags in shaken.items() for i, f in enumerate(flags) if f]
        if left_out and m.get("reason"):
            m["reason"] += ("; left out because other work used the machine while they ran: " + ", ".join(left_out))
        record = decision_record(result, conclusive=bool(m.get("culprit")))
        if record is not None:
            result["interference"] = record
        ctx.save()
        if problems:
            result.update(status="failed", reason="; ".join(problems))
        elif "statement" not in m and not left_out:
            result.update(status="failed", reason=m["reason"])
        elif "statement" not in m:  # the disturbed runs left too few: nothing failed, the evidence is missing
            result.update(status="passed", reason=f"{m['reason']}: inconclusive, run it again on a quiet machine")
        else:
            result.update(status="passed", reason=None)

    def summary_line(self, result: dict) -> str:
        m = as_dict(result.get("metrics"))
        if "culprit" not in m:
            return ""
        if m.get("culprit"):
            s = as_dict(as_dict(m.get("suspects")).get(m["culprit"]))
            return f" culprit: {m['culprit']} ({fmt_pct(finite(s.get('effect')), signed=True)} tokens/s)"
        return " no culprit (no suspect significant)"

    def blocks(self, result: dict) -> list[Block]:
        """The configuration's tokens/s, one row per suspect in ranking order (the culprit marked), the culprit."""
        m = as_dict(result.get("metrics"))
        suspects = as_dict(m.get("suspects"))
        ranking = [str(n) for n in as_list(m.get("ranking"))]
        rows = []
        for name in ranking:
            s = as_dict(suspects.get(name))
            ci = (as_list(s.get("ci")) + [None, None])[:2]
            rows.append((strong(f"{name} CULPRIT") if name == m.get("culprit") else name, str(s.get("changes") or "—"),
                         fmt_rate(s.get("toks_per_s")), fmt_pct(finite(s.get("effect")), signed=True),
                         f"{fmt_pct(finite(ci[0]), signed=True)} .. {fmt_pct(finite(ci[1]), signed=True)}",
                         _p(s.get("p_adjusted")), "yes" if s.get("significant") else "no"))
        out: list[Block] = [
            Paragraph(f"The configuration as it is: {fmt_rate(m.get('config_toks_per_s'))} tokens/s; each suspect "
                      f"changed alone, {fmt_num(m.get('repeats'))} interleaved repeats, ranked by effect."),
            Table((Column("Suspect"), Column("Change"), *(Column(c, numeric=True) for c in (
                "Tokens/s, mean over repeats of each run's window median", "Effect on tokens/s", "95% CI",
                "p (Holm)")), Column("Significant")), rows,
                marked={i for i, name in enumerate(ranking) if name == m.get("culprit")}),
            Paragraph(f"{strong('Culprit')}: {m.get('culprit') or 'none'} — {m.get('reason') or ''}")]
        if m.get("statement"):
            out.append(Paragraph(str(m["statement"]), style="muted"))
        return out

    def comparisons(self, result: dict) -> list[Effect]:
        """Each suspect changed alone against the configuration as given."""
        metrics = as_dict(result.get("metrics"))
        out = []
        for suspect, s in sorted(as_dict(metrics.get("suspects")).items(), key=lambda kv: str(kv[0])):
            s = as_dict(s)
            ci = as_list(s.get("ci"))
            changes = s.get("changes")
            with_ = (f"{changes} ({suspect})" if isinstance(changes, str) and changes else
                     f"{params_text(changes)} ({suspect})" if isinstance(changes, dict) and changes else str(suspect))
            effect = effect_of({"rel": s.get("effect"), "ci_low": ci[0] if len(ci) == 2 else None,
                                "ci_high": ci[1] if len(ci) == 2 else None, "p_adjusted": s.get("p_adjusted"),
                                "p_value": s.get("p"), "significant": s.get("significant"),
                                "verdict": s.get("verdict"), "mean_a": metrics.get("config_toks_per_s"),
                                "mean_b": s.get("toks_per_s")}, "the configuration as given", with_)
            if effect:
                out.append(effect)
        return out

    def key_figures(self, in_order: list[dict]) -> list[KeyFigure]:
        out = []
        for s in in_order:
            m = as_dict(s.get("metrics")) if isinstance(s, dict) else {}
            if s.get("kind") == self.name and "culprit" in m and m.get("reason"):
                out.append(KeyFigure("culprit", "Culprit", str(m.get("culprit") or "none named"),
                                     f"step `{s.get('name')}`: {m.get('reason')}", order=26,
                                     steps=(str(s.get("name")),)))
        return out


def run_toks(ctx, step, run: dict) -> float | None:
    """A run's tokens/s: the median of its window's per-step values (None for a failed run)."""
    values = run_values(ctx.run_dir, step, run, "toks_per_s")
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


def _mean(values) -> float | None:
    xs = [float(v) for v in values if finite(v) is not None]
    return sum(xs) / len(xs) if xs else None


def _p(value) -> str:
    v = finite(value)
    return "—" if v is None else f"{v:.2g}" if v >= 1e-4 else "< 0.0001"


kinds.register(Triage())
