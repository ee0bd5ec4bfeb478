"""`ab`: a baseline and variants of the trainer (env/args), optionally repeated, compared with statistics that
hold for autocorrelated, drifting throughput (validation.analysis.significance):

- every repeat runs the baseline and each variant once, in a random order drawn per repeat (the seed comes from the
  run directory and is recorded);
- with repeats >= 2, each variant against the baseline is paired by repeat (log-ratios of run means: the machine's
  drift cancels); with one run each, on block means of the runs' windows, each run's noise held to at least the
  run-to-run variation measured in this validation run's earlier repeats (e.g. a sweep's) and to one launch's share
  of the runbook's declared launch noise (`compare: {launch_sd, pairs}`); Holm's correction over the variants when
  there are several. Block means of one window never see how far the next launch's level lies, so with one run each
  and neither noise no difference is significant and none shown the same (its comparison "inconclusive" whatever
  its interval, its text saying why) and the decision keeps the baseline, its reason naming the fix (`repeats: 2` or
  more, or a declared `compare`; _decision_view.without_run_noise, as a sweep's);
- with `recommend`, the decision of significance.decide: a variant is kept only when it beats the baseline (and
  every other variant) significantly and beyond the noise floor, else the baseline is kept ("no significant
  difference", a passed decision); never a variant whose settings the trainer reported as ignored (e.g.
  NSA_DDP_COMPRESS without DDP: status.json notes), nor one whose throughput was not stable.

Own keys: `baseline: {env, args}`, `variants: {label: {env, args}}` (each label an identifier, none of
RESERVED_LABELS), `repeats` (default 1), `metric` (default toks_per_s; one of
validation.analysis.stats.METRIC_DIRECTIONS, whose better direction decides), `recommend` (default false).
Result: "runs" (a trainer launch's record each, with "repeat"), "comparison": [significance.Comparison.as_dict()
of each variant against the baseline ("baseline", "variant", "metric", "method", "mean_a", "mean_b", "rel",
"ci_low", "ci_high", "p_value", "p_adjusted", "noise_floor", "significant", "verdict", "text", ...; mean_a and mean_b
by the metric's rule, a rate's work over its time: each window's figure, the harmonic mean of the repeats' run
figures) plus "delta" (mean_b - mean_a), "rel_delta" (rel, the test's estimate: paired, from the geometric mean of
the repeats' ratios), "test"], "order_seed", "order"; with recommend: "decision" (Decision.as_dict() plus
"order_seed", "order", "excluded_ignored"), "choice" {label, params, explanation, significant, kept_default}
(params: the settings the chosen side ran with beyond the step's, the baseline's own when it is kept) and "winner"
(the choice when significant, else null); "metrics": {"compared", "baseline": summary, "<variant>": summary
(pooled_summary: of the runs measured undisturbed, where any was),
"variants": {variant: comparison}, "decided" (a variant chosen by comparing measured ones: false when nothing was
compared, e.g. every run disturbed, though the baseline is still kept), "significant", "choice", "kept_default"}.

Options: the keys above (the baseline and each variant a Variant). Result: the step record (validation.results.run.Step:
its runs a LaunchRun each, its decision a DecisionRecord, its choice and winner a Choice, the run order, the notes),
its metrics a Metrics and its comparisons a Comparison each; run() builds it, the report hooks read it (decoded
leniently).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, Mapping

from validation import contracts
from validation.analysis import stats
from validation.analysis.metrics import window_mean
from validation import kinds
from validation.analysis.interference import decision_record, disturbed_flags, measured_disturbed
from validation.formatting import (file_name, finite, fmt_num, fmt_p, fmt_pct, fmt_tflops, mean_pm, mfu_text,
                                      params_text, shared_context_text)
from validation.runbook.schema import REPEATS_MAX, NAME_RE, env_vars, mapping, trainer_flags, typed
from validation.analysis.significance import StatsError, adjust_family, compare_paired, decide
from validation.analysis.significance.windows import compare_windows, measured_run_noise
from validation.kinds import train_report
from validation.kinds.blocks import Block, Column, Paragraph, Table
from validation.kinds.base import DECIDING_LAUNCH_KEYS, Effect, Settings, effect_of, run_side, with_labels
from validation.kinds._decision_view import (NOT_SAME, block_means_alone, decision_blocks, decision_mark,
                                             held_to_no_run_noise, kept_text, no_run_noise, no_single_winner,
                                             status_badge, without_run_noise)
from validation.kinds.trainer import (RUN_METRICS, RUN_PERFORMANCE, TRAINER_METRICS, TRAINER_PERFORMANCE,
                                      TrainerKind, declared_pair_noise, order_seed, run_all, run_order, run_values,
                                      trainer_launch)
from validation.kinds._plot_helpers import bar_points
from validation.results.codec import absent, decode, encode, given, written
from validation.results.decision import Choice, ComparisonRecord, DecisionRecord
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import LaunchRun, Num, Stat, as_launch


@dataclasses.dataclass(frozen=True)
class Variant(Settings):
    """The baseline or a variant: its env and args, and its own throughput window (None: the step's)."""
    window: int | None = None


@dataclasses.dataclass(frozen=True)
class Options:
    baseline: Variant
    variants: Mapping[str, Variant]
    repeats: int = 1
    metric: str = "toks_per_s"
    recommend: bool = False


def _computed() -> Any:
    """A key of the comparison that results written before it had a method may lack: written whenever the method
    is (significance.Comparison always has one)."""
    return absent(beside="method")


@dataclasses.dataclass(frozen=True)
class Comparison(ComparisonRecord):
    """A variant against the baseline: significance.Comparison's record (the metrics' "variants"), and in the step's
    "comparison" the difference of the means, the relative difference and the test in words after it. Results
    written before the comparison had a method lack it and the keys that came with it (_computed)."""
    baseline: str | None = _computed()
    variant: str | None = _computed()
    metric: str | None = _computed()
    method: str | None = absent()
    rel: Num | None = _computed()
    ci_low: Num | None = _computed()
    ci_high: Num | None = _computed()
    df: Num | None = _computed()
    ess_a: Num | None = _computed()
    ess_b: Num | None = _computed()
    noise_floor: Num | None = _computed()
    floor_source: str | None = _computed()
    alpha: Num | None = _computed()
    higher_is_better: bool | None = _computed()
    p_adjusted: Num | None = _computed()
    family_size: int | None = _computed()
    run_to_run: Num | None = _computed()
    run_to_run_df: Num | None = _computed()
    confidence: Num | None = _computed()
    text: str | None = _computed()
    delta: Num | None = absent(beside="test")
    rel_delta: Num | None = absent(beside="test")
    test: str | None = absent()


@dataclasses.dataclass(frozen=True)
class Metrics:
    """The step's own metrics: the metric compared and each variant's comparison with the baseline; the pooled
    summary of the baseline's runs, then (in `extra`) each variant's under its label and, with recommend, "decided",
    "significant", "choice" and "kept_default"."""
    compared: str | None = None
    variants: dict[str, Comparison] = dataclasses.field(default_factory=dict)
    baseline: Any = None  # pooled_summary: a run's metrics, or the repeats' work over their time
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """An A/B step's record: its runs, run order, notes and (with recommend) decision, choice and winner (the step
    record's), its metrics and its comparisons with the baseline."""
    metrics: Metrics = dataclasses.field(default_factory=Metrics)
    comparison: list[Comparison] = dataclasses.field(default_factory=list)


BASELINE = "baseline"  # the baseline's label: its runs', its launches' directory and the decision's default
# what a variant cannot be labelled: the baseline's label (the variant would take the baseline's place: its settings
# never run, the variant compared with itself) and the keys of the step's metrics beside the variants' summaries
# (Metrics' fields and what _decide adds), which would overwrite or drop the variant's summary
RESERVED_LABELS = (BASELINE, "compared", "variants", "extra", "decided", "significant", "choice", "kept_default")

# the test each method is, as the comparison table names it; a paired row's Delta % (rel) is the geometric mean of
# its repeats' ratios, while its Mean A / Mean B are the runs' work over their time (significance.shown_mean), so
# the row says which
_TESTS = {"paired": "paired t on log-ratios of interleaved repeats (Delta %: from their geometric mean ratio, not "
                    "Mean B / Mean A)", "blocks": "Welch t on block means",
          "runs": "Welch t on run means"}


def _compare(base: list, variant: list, label: str, metric: str, higher: bool, rn, pair_noise=None):
    """The variant against the baseline: paired by repeat (2+ repeats with both runs), else block means of the
    single runs' windows with the run-to-run variation `rn` (at least one launch's share of the declared launch noise
    `pair_noise`). StatsError when there is not enough data."""
    def mean(v):
        if v is None:
            return None
        return float(v) if isinstance(v, (int, float)) else window_mean(v, metric)

    if len(base) >= 2:
        return compare_paired([mean(v) for v in base], [mean(v) for v in variant], higher_is_better=higher,
                              baseline=BASELINE, variant=label, metric=metric, pair_noise=pair_noise)
    if pair_noise is not None:  # one run each: held to one launch's share of the declared launch noise, as decide()
        rn = pair_noise.hold(rn)
    a, b = base[0], variant[0]
    if not isinstance(a, list) or not isinstance(b, list):
        raise StatsError("a run without its per-step values" if a is not None and b is not None else
                         "a run without a measurement")
    return compare_windows(a, b, higher_is_better=higher, baseline=BASELINE, variant=label, metric=metric,
                           run_noise=rn)


def _without_run_noise(c):
    """A comparison of one run each with no run-to-run noise (block_means_alone): block means of one window never see
    how far the next launch's level lies, so a difference they find is not significant, nor does an interval of
    theirs inside the noise floor show the variants the same: "inconclusive" whatever its interval
    (_decision_view.held_to_no_run_noise); any other comparison as it is."""
    return held_to_no_run_noise(c) if block_means_alone(c) else c


def _record(c, **extra: Any) -> Comparison:
    """A comparison's record, its text saying why one run each with no run-to-run noise decides nothing."""
    record = decode(Comparison, c.as_dict(), "comparison")
    text = f"{record.text}; {no_run_noise('variant')}{NOT_SAME}" if block_means_alone(c) else record.text
    return dataclasses.replace(record, text=text, **extra)


class AB(TrainerKind):
    name = "ab"
    listing = 40
    summary = ("baseline vs variants, optionally repeated in a random order per repeat; paired by repeat or on block "
               "means; with recommend, a variant is kept only when significantly better (ahead in every repeat; one "
               "run each: also stable), else the baseline (never a setting the trainer reports as ignored)")
    keys = ("baseline", "variants", "repeats", "metric", "recommend")
    launch_keys = DECIDING_LAUNCH_KEYS  # retry_disturbed too: it decides from repeats
    metrics = (("compared", "variants.<variant>.*", "decided", "significant", "choice", "kept_default")
               + tuple(f"<variant>.{m}" for m in TRAINER_METRICS + ("repeats",)) + RUN_METRICS)
    performance = (("variants", "decided", "significant", "choice", "kept_default")
                   + tuple(f"<variant>.{m}" for m in TRAINER_PERFORMANCE) + RUN_PERFORMANCE)
    decides = True
    result_type = Result

    def metric_names(self, step):  # <variant>, runs.<label>: the baseline and the variants, by their labels
        if step is None:
            return self.metrics
        labels = (BASELINE, *step.variants)
        return with_labels(with_labels(self.metrics, "<variant>", labels), "<label>", labels)
    plan_note = ("runs in a random order within each repeat, drawn for each run directory (the seed is recorded in "
                 "results.json), so the order shown here is an example")

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        def variant(value, vpath):
            v = mapping(value, vpath, ctx, ("env", "args", "window"))
            return Variant(env_vars(v.get("env"), vpath + ("env",), ctx),
                           trainer_flags(v.get("args"), vpath + ("args",), ctx),
                           typed(v["window"], int, vpath + ("window",), ctx, minimum=1) if "window" in v else None)

        variants_raw = raw.get("variants")
        if not isinstance(variants_raw, dict) or not variants_raw:
            raise ctx.error(path + ("variants",), "an ab step needs variants: {label: {env: ..., args: ...}}")
        for label in variants_raw:
            if not isinstance(label, str) or not NAME_RE.fullmatch(label):
                raise ctx.error(path + ("variants", label), "variant labels are identifiers")
            if label in RESERVED_LABELS:
                raise ctx.error(path + ("variants", label),
                                f"{label!r} cannot label a variant: "
                                + ("it is the baseline's label" if label == BASELINE else
                                   "the step's metrics use that name beside the variants'")
                                + f" (reserved: {', '.join(RESERVED_LABELS)})")
        return Options(baseline=variant(raw.get("baseline"), path + ("baseline",)),
                       variants={k: variant(v, path + ("variants", k)) for k, v in variants_raw.items()},
                       repeats=typed(raw.get("repeats", 1), int, path + ("repeats",), ctx, minimum=1,
                                      maximum=REPEATS_MAX),
                       # a metric with a better direction (a typo would compare nothing and still pass; a
                       # metric without one, e.g. grad_norm, would be taken as higher is better)
                       metric=typed(raw.get("metric", "toks_per_s"), str, path + ("metric",), ctx,
                                    choices=tuple(stats.METRIC_DIRECTIONS)),
                       recommend=typed(raw.get("recommend", False), bool, path + ("recommend",), ctx))

    def launches(self, step, winners, run_dir):
        variants = {BASELINE: step.baseline, **step.variants}
        out = []
        for repeat, label in run_order(list(variants), step.repeats, order_seed(step, run_dir)):
            variant = variants[label]
            suffix = f"_r{repeat + 1}" if step.repeats > 1 else ""
            out.append(trainer_launch(step, step.launch, label, f"{step.name}/{label}{suffix}", winners, run_dir,
                                      extra_args=variant.args, extra_env=variant.env, params=variant.params(),
                                      repeat=repeat, window=variant.window))
        return out

    def run(self, options: Options, ctx) -> Result:
        """Every variant in every repeat (a disturbed repeat run again), each variant compared with the baseline and,
        with recommend, the decision."""
        step = ctx.step
        done = run_all(ctx, retry_disturbed=True)
        runs = done.runs
        as_written = [encode(r) for r in runs]
        labels = [BASELINE, *options.variants]
        data: dict[str, list] = {label: [None] * options.repeats for label in labels}
        for r, raw in zip(runs, as_written):
            data[r.label][r.repeat] = run_values(ctx.run_dir, step, raw, options.metric)
        shaken = disturbed_flags(as_written, labels, options.repeats)
        # the comparisons leave out a run measured under interference, as they would a failed one
        clean = {k: [None if shaken[k][i] else v for i, v in enumerate(vals)] for k, vals in data.items()}
        higher = stats.higher_is_better(options.metric)
        rn = None if options.repeats > 1 else measured_run_noise(ctx.results, ctx.run_dir, options.metric)
        comps, notes = [], []
        for label in options.variants:
            try:
                comps.append(_compare(clean[BASELINE], clean[label], label, options.metric, higher, rn,
                                      declared_pair_noise(ctx)))
            except StatsError as exc:
                left_out = any(shaken[BASELINE]) or any(shaken[label])
                notes.append(f"{label}: not compared with the baseline ("
                             + ("its disturbed runs were left out and too few remain" if left_out else str(exc)) + ")")
        if len(comps) > 1:
            comps = list(adjust_family(comps).comparisons)
        # one run each and no run-to-run noise measured or declared: block means alone decide nothing
        comps = [_without_run_noise(c) for c in comps]
        comparison = [_record(c, delta=c.mean_b - c.mean_a, rel_delta=c.rel,
                              test=_TESTS[c.method] + (", Holm over the variants" if len(comps) > 1 else ""))
                      for c in comps]
        ignored = {label: _ignored_settings(ctx, options, runs, label) for label in options.variants}
        for label, names in ignored.items():
            if names:
                notes.append(f"{label}: the trainer ignored {', '.join(names)} on this machine, so this A/B compares "
                             "equal settings and the variant is not recommended")
        notes = [*(done.notes or []), *notes]
        order = DecisionRecord(order_seed=order_seed(step, ctx.run_dir), order=[spec.label for spec in ctx.launches])
        summaries = {label: pooled_summary(runs, label) for label in options.variants}
        decided = Decision()
        if options.recommend:
            decided = self._decide(options, runs, data, shaken, ignored, higher, rn, order, declared_pair_noise(ctx))
        metrics = Metrics(compared=options.metric,
                          variants={c.variant: _record(c) for c in comps},
                          baseline=pooled_summary(runs, BASELINE), extra={**summaries, **decided.metrics})
        return Result(status="failed" if done.problems else "passed",
                      reason="; ".join(done.problems) or "; ".join(notes) or None, metrics=metrics, runs=runs,
                      superseded=done.superseded, notes=notes or None, comparison=comparison,
                      order_seed=order.order_seed, order=order.order, decision=decided.decision,
                      choice=decided.choice, winner=decided.choice if decided.significant else None,
                      interference=decision_record(encode(StepRecord(runs=runs)), decided.conclusive))

    def _decide(self, options: Options, runs: list[LaunchRun], data: dict[str, list], shaken: dict[str, list],
                ignored: dict[str, list[str]], higher: bool, rn, order: DecisionRecord, pair_noise=None) -> Decision:
        """The recommendation: significance.decide over the baseline and the variants the trainer honoured, the
        baseline kept without a significant difference (with one run each and no run-to-run noise measured or
        declared, whatever block means alone show: without_run_noise); a significant winner that was not stable is
        not kept.
        `shaken`: the runs measured under interference, per label (disturbed_flags); `order`: the run order (its seed
        and labels), which the decision records."""
        candidates = {label: values for label, values in data.items() if label == BASELINE or not ignored[label]}
        # what each side ran with beyond the step's own settings, the baseline's included (a baseline pinning
        # NSA_PREFILL_BATCHED "0"): the chosen side's params are its choice's and winner's
        params = {BASELINE: options.baseline.params(),
                  **{label: variant.params() for label, variant in options.variants.items()}}
        excluded = [label for label in data if label not in candidates]
        ours = dataclasses.replace(order, excluded_ignored=excluded)
        try:
            d = decide(candidates, default=BASELINE, higher_is_better=higher, metric=options.metric, run_noise=rn,
                       disturbed={k: v for k, v in shaken.items() if k in candidates}, pair_noise=pair_noise)
        except StatsError as exc:
            return Decision(dataclasses.replace(ours, reason=f"no decision: {exc}", significant=False, choice=None),
                            metrics=dict(decided=False, significant=False, choice=None, kept_default=False))
        if d.method == "blocks" and rn is None and pair_noise is None:
            # one run each: block means see only the noise within each run, never how far the next launch's level
            # lies, and nothing bounds it: no variant is significant, the baseline is kept
            d = without_run_noise(d, BASELINE, unit="variant")
        choice, explanation, significant = d.choice, d.reason, d.significant
        overridden: dict[str, Any] = {}
        unbeaten = False  # the baseline left out of the comparison: whatever the variants showed, nothing beat it
        if significant and choice not in (None, BASELINE) and BASELINE not in dict(d.ranking):
            # the baseline was not measured (its runs failed, were disturbed or too short): a variant ahead of the
            # others has not beaten it, and an A/B keeps a variant only when it beats the baseline
            why = next((w for k, w in d.excluded if k == BASELINE), "no usable run")
            explanation = (f"{choice} is ahead of the other variants ({d.reason}) but the baseline was not measured "
                           f"({why}), so no variant beat it and the baseline is kept")
            choice, significant, unbeaten = BASELINE, False, True
            overridden = dict(choice=BASELINE, winner=None, significant=False, kept_default=True, recommendable=False,
                              recommendation=f"nothing is recommended: {explanation}")
        # one run per variant: block means assume a steady run, so a winner whose per-step throughput varied by
        # more than 15% is not kept. Interleaved repeats test the run means, and a winner ahead in every repeat is
        # its own evidence of stability: the per-step spread of a 20 ms step (timer and scheduler jitter) is not.
        elif significant and choice not in (None, BASELINE) and d.method != "paired" and not as_launch(
                pooled_summary(runs, choice)).throughput_stable:
            explanation = (f"{choice} is faster ({d.reason}) but its throughput was not stable, so the baseline is "
                           "kept")
            choice, significant = BASELINE, False
            # the decision's record names what the step keeps, as its reason does (the statistics' winner stays
            # in its comparison and ranking, and in the reason)
            overridden = dict(choice=BASELINE, winner=None, significant=False, kept_default=True, recommendable=False,
                              recommendation=f"nothing is recommended: {explanation}")
        if excluded:
            explanation += f"; not considered: {', '.join(excluded)} (settings the trainer ignored)"
        decision = dataclasses.replace(decode(DecisionRecord, d.as_dict(), "decision"), order_seed=ours.order_seed,
                                       order=ours.order, excluded_ignored=excluded, reason=explanation, **overridden)
        chosen = None
        if choice is not None:
            chosen = Choice(choice, params.get(choice, {}), explanation, significant=significant,
                            kept_default=choice == BASELINE and not significant)
        return Decision(decision, chosen, significant, d.significant and not unbeaten,
                        dict(decided=chosen is not None and bool(d.comparisons), significant=significant,
                             choice=chosen.label if chosen else None, kept_default=bool(chosen and chosen.kept_default)))

    def view(self, result: Result, view: dict) -> dict:
        return {"command": ""}  # each run has its own

    def blocks(self, result: Result) -> list[Block]:
        """One row per run, the comparisons with the baseline, the decision, and each run's summary."""
        r = self.read(result)
        metrics = [written(run.metrics) for run in r.runs]
        label_counts = Counter(str(run.label) for run in r.runs)
        rows = []
        for i, run in enumerate(r.runs):
            toks = run.metrics.toks_per_s or Stat()
            label = fmt_num(run.label)
            if label_counts[str(run.label)] > 1 and run.repeat is not None:
                label = f"{label} (repeat {run.repeat + 1})"
            rows.append((label, params_text(run.params), mean_pm({"mean": toks.mean, "stdev": toks.stdev}),
                         fmt_pct(toks.cv), fmt_num(toks.n), fmt_tflops(run.metrics.tflops_per_s),
                         mfu_text(metrics[i], why=False), status_badge(run.status, run.reason)))
        out: list[Block] = [Table(
            (Column("Variant"), Column("Params"), *(Column(c, numeric=True) for c in (
                "Tokens/s, window mean ± stdev (all ranks)", "CV", "n", "TFLOP/s", "MFU")), Column("Status")), rows)]
        context = shared_context_text(metrics)
        if context:
            out.append(Paragraph(f"Context of the tokens/s: {context}", style="context"))
        comparisons = []
        for comp in r.comparison:
            ci = (f"{fmt_pct(comp.ci_low, signed=True)} .. {fmt_pct(comp.ci_high, signed=True)}"
                  if finite(comp.ci_low) is not None else "—")
            p = fmt_p(comp.p_value)
            if finite(comp.p_adjusted) is not None:
                p += f" (Holm {fmt_p(comp.p_adjusted)})"
            comparisons.append((fmt_num(comp.baseline), fmt_num(comp.variant), fmt_num(comp.metric),
                                fmt_num(comp.mean_a), fmt_num(comp.mean_b), fmt_pct(comp.rel_delta, signed=True), ci,
                                f"{fmt_num(comp.n_a)} / {fmt_num(comp.n_b)}", fmt_num(comp.test), p,
                                fmt_pct(comp.noise_floor), fmt_num(comp.verdict)))
        if comparisons:
            out.append(Table((Column("Baseline"), Column("Variant"), Column("Metric"),
                              *(Column(c, numeric=True) for c in ("Mean A", "Mean B", "Delta %", "95% CI", "n (A / B)")),
                              Column("Test"), Column("p-value", numeric=True), Column("Noise floor", numeric=True),
                              Column("Verdict")), comparisons))
        else:
            out.append(Paragraph("No comparison available."))
        decision = given(r.decision)
        chosen = given(r.choice) or given(r.winner)
        if decision:
            out += decision_blocks(decision, given(r.choice))
        elif chosen:
            params = params_text(chosen.params)
            out.append(Paragraph(f"**Keep**: {fmt_num(chosen.label)}" + (f" ({params})" if params != "—" else "")
                                 + f" — {fmt_num(chosen.explanation)}"))
        return out + train_report.runs_blocks(r.runs)

    def comparisons(self, result: Result) -> list[Effect]:
        """Each variant against the baseline; a variant whose settings the trainer ignored is an A/A check."""
        r = self.read(result)
        ignored = {str(x) for x in (r.decision.excluded_ignored or [] if r.decision else [])}
        ignored |= {str(n).split(":", 1)[0] for n in r.notes or [] if "ignored" in str(n)}
        out = []
        for comp in r.comparison:
            variant = comp.variant
            effect = effect_of(comp, run_side(r, comp.baseline or BASELINE), run_side(r, variant),
                               ignored=str(variant) in ignored, rel_delta=comp.rel_delta)
            if effect:
                out.append(effect)
        return out

    def summary_line(self, result: Result) -> str:
        r = self.read(result)
        chosen = given(r.choice)
        if not chosen:
            return super().summary_line(r)
        if chosen.significant:
            return f" keep: {chosen.label} (significant" + (
                " against the baseline; no single winner)" if no_single_winner(given(r.decision), chosen) else ")")
        return f" {kept_text(r, str(chosen.label))}"

    def plots(self, name: str, result: Result, plotter) -> None:
        r = self.read(result)
        plotter.bars(bar_points(r.runs), title=f"A/B: {r.title or name}", xlabel="variant",
                     filename=f"ab_{file_name(name)}.png",
                     colors=lambda i, label: "tab:blue" if label == BASELINE else "tab:orange", mark=decision_mark(r))


@dataclasses.dataclass(frozen=True)
class Decision:
    """What _decide concluded (with recommend): the decision's record, the variant kept (None: no decision),
    whether that choice is significant, whether the decision is (conclusive: significant before the stability rule,
    and never with the baseline left out),
    and the step's metrics it adds ("decided", "significant", "choice", "kept_default"; none without recommend)."""
    decision: DecisionRecord | None = None
    choice: Choice | None = None
    significant: bool = False
    conclusive: bool = False
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)


def _ignored_settings(ctx, options: Options, runs: list[LaunchRun], label: str) -> list[str]:
    """Variables of a variant that its trainer runs reported as ignored (e.g. NSA_DDP_COMPRESS without DDP)."""
    names = set()
    for r in runs:
        if r.label == label:
            status = contracts.read_status_json(ctx.run_dir / str(r.dir) / "out")
            names.update(contracts.ignored_settings(status, list(options.variants[label].env)))
    return sorted(names)


def pooled_summary(runs: list[LaunchRun] | list[dict], label: str) -> dict[str, Any]:
    """The repeats' tokens/s, their work over their time (the harmonic mean of the per-run window figures), or the
    single run's summary, as written; of the label's passed runs measured undisturbed where any was (as the
    comparisons and the decision leave a run measured while other work used the machine out: a repeat slowed by it
    is no measurement of the variant); runs as written are read leniently."""
    records = [r if isinstance(r, LaunchRun) else decode(LaunchRun, r, "run", lenient=True) for r in runs]
    passed = [r.metrics for r in records if r.label == label and r.status == "passed"]
    mine = [m for m in passed if not measured_disturbed(written(m))] or passed
    if not mine:
        return {}
    if len(mine) == 1:
        return written(mine[0])  # the run's own metrics, as written
    means = [m.toks_per_s.mean for m in mine if m.toks_per_s is not None and finite(m.toks_per_s.mean) is not None]
    # the repeats' work over their time (each run's window the same work): the harmonic mean of their figures
    # (metrics.window_mean, a window's own rule), not the plain mean, which counts a slow repeat as much as a fast one
    return {**({"toks_per_s": {"mean": window_mean(means, "toks_per_s"), "n": len(means)}} if means else {}),
            "throughput_stable": all(m.throughput_stable for m in mine), "repeats": len(mine)}


kinds.register(AB())
