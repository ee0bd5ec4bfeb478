"""`ab`: a baseline and variants of the trainer (env/args), optionally repeated (interleaved: every variant once
per repeat), compared with a Welch t-test on their per-step values of `metric`; with `recommend`, a variant that is
stable and not slower than the baseline is kept (never one whose settings the trainer reported as ignored, e.g.
NSA_OPT_FUSED on a CPU: status.json notes).

Own keys: `baseline: {env, args}`, `variants: {label: {env, args}}`, `repeats` (default 1), `metric` (default
toks_per_s), `recommend` (default false).
Result: "runs" (a trainer launch's record each, with "repeat"), "comparison": [{"baseline", "variant", "metric",
"mean_a", "mean_b", "delta", "rel_delta", "p_value", "significant", "verdict", ...}], "winner" (with recommend),
"metrics": {"compared", "baseline": summary, "<variant>": summary, "variants": {variant: comparison}}.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from validation import contracts, steps
from validation.report.format import (as_dict, as_list, finite, fmt_num, fmt_p, fmt_pct, fmt_tflops, mean_pm,
                                      mfu_text, params_text, shared_context_text, stat_of, status_view)
from validation.schema import NAME_RE, env_vars, mapping, trainer_flags, typed
from validation.steps.trainer import TrainerKind, run_each, trainer_launch


class AB(TrainerKind):
    name = "ab"
    summary = ("baseline vs variants, optionally repeated; Welch t-test on per-step values; recommended if stable "
               "and not slower (never when the trainer reports the setting as ignored)")
    keys = ("baseline", "variants", "repeats", "metric", "recommend")

    def parse(self, raw: dict, path: tuple, ctx) -> dict[str, Any]:
        def variant(value, vpath):
            v = mapping(value, vpath, ctx, ("env", "args"))
            return {"env": env_vars(v.get("env"), vpath + ("env",), ctx),
                    "args": trainer_flags(v.get("args"), vpath + ("args",), ctx)}

        variants_raw = raw.get("variants")
        if not isinstance(variants_raw, dict) or not variants_raw:
            raise ctx.error(path + ("variants",), "an ab step needs variants: {label: {env: ..., args: ...}}")
        for label in variants_raw:
            if not isinstance(label, str) or not NAME_RE.fullmatch(label):
                raise ctx.error(path + ("variants", label), "variant labels are identifiers")
        return {"baseline": variant(raw.get("baseline"), path + ("baseline",)),
                "variants": {k: variant(v, path + ("variants", k)) for k, v in variants_raw.items()},
                "repeats": typed(raw.get("repeats", 1), int, path + ("repeats",), ctx, minimum=1),
                "metric": typed(raw.get("metric", "toks_per_s"), str, path + ("metric",), ctx),
                "recommend": typed(raw.get("recommend", False), bool, path + ("recommend",), ctx)}

    def launches(self, step, winners, run_dir):
        out = []
        for repeat in range(step.repeats):
            suffix = f"_r{repeat + 1}" if step.repeats > 1 else ""
            for label, variant in [("baseline", step.baseline), *step.variants.items()]:
                params = {**{f"env.{k}": v for k, v in variant["env"].items()},
                          **{f"args.{k}": v for k, v in variant["args"].items()}}
                out.append(trainer_launch(step, step.launch, label, f"{step.name}/{label}{suffix}", winners, run_dir,
                                          extra_args=variant["args"], extra_env=variant["env"], params=params,
                                          repeat=repeat))
        return out

    def run(self, step, launches, result, ctx) -> None:
        from validation import metrics, stats

        runs, problems = run_each(ctx, step, launches, result)
        samples = {label: [] for label in ["baseline", *step.variants]}
        for r in runs:
            if r["status"] == "passed":
                samples[r["label"]] += metrics.window_values(ctx.run_dir / r["metrics"]["csv"], step.metric,
                                                             metrics.Window(step.launch.window,
                                                                            step.launch.warmup_steps))
        higher = stats.METRIC_DIRECTIONS.get(step.metric, "higher") == "higher"
        comparison, by_label = [], {}
        for label in step.variants:
            if samples["baseline"] and samples[label]:
                c = stats.compare_samples(samples["baseline"], samples[label], higher_is_better=higher)
                comparison.append({"baseline": "baseline", "variant": label, "metric": step.metric, **c})
                by_label[label] = c
        result["comparison"] = comparison
        result["metrics"] = {"compared": step.metric, "variants": by_label,
                             "baseline": pooled_summary(runs, "baseline")}
        for label in step.variants:
            result["metrics"][label] = pooled_summary(runs, label)
        ignored = {label: _ignored_settings(ctx, step, runs, label) for label in step.variants}
        for label, names in ignored.items():
            if names:
                result.setdefault("notes", []).append(
                    f"{label}: the trainer ignored {', '.join(names)} on this machine, so this A/B compares equal "
                    "settings and the variant is not recommended")
        if step.recommend and comparison:
            # the seed runbook's rule: keep a variant if it is stable and at least as fast as the baseline
            best = [c for c in comparison if c["verdict"] != "worse" and not ignored[c["variant"]] and (
                c["mean_b"] >= c["mean_a"] if higher else c["mean_b"] <= c["mean_a"])
                and pooled_summary(runs, c["variant"]).get("throughput_stable")]
            if best:
                chosen = max(best, key=lambda c: c["mean_b"] if higher else -c["mean_b"])
                params = next(r["params"] for r in runs if r["label"] == chosen["variant"])
                result["winner"] = {"label": chosen["variant"], "params": params,
                                    "explanation": f"{chosen['variant']} is not worse than baseline "
                                                   f"({chosen['mean_b']:.1f} vs {chosen['mean_a']:.1f}) and stable"}
            else:
                result["winner"] = {"label": "baseline", "params": {}, "explanation":
                                    "no variant was both at least as fast as baseline and stable"}
        result.update(status="failed" if problems else "passed",
                      reason="; ".join(problems) or "; ".join(result.get("notes", [])) or None)

    def view(self, result: dict, view: dict) -> dict:
        runs = [as_dict(r) for r in as_list(result.get("runs"))]
        label_counts = Counter(str(r.get("label")) for r in runs)
        rows = []
        for run in runs:
            run_metrics = as_dict(run.get("metrics"))
            toks = stat_of(run_metrics, "toks_per_s")
            label = fmt_num(run.get("label"))
            if label_counts[str(run.get("label"))] > 1 and finite(run.get("repeat")) is not None:
                label = f"{label} (repeat {int(run['repeat']) + 1})"
            rows.append({"label": label, "params": params_text(run.get("params")),
                         "repeat": fmt_num(run.get("repeat")), "toks": mean_pm(toks),
                         "cv": fmt_pct(toks.get("cv")), "n": fmt_num(toks.get("n")),
                         "tflops": fmt_tflops(run_metrics.get("tflops_per_s")),
                         "mfu": mfu_text(run_metrics, why=False),
                         "status": status_view(run.get("status")), "reason": run.get("reason")})
        comparisons = []
        for comp in (as_dict(c) for c in as_list(result.get("comparison"))):
            comparisons.append({
                "baseline": fmt_num(comp.get("baseline")), "variant": fmt_num(comp.get("variant")),
                "metric": fmt_num(comp.get("metric")),
                "mean_a": fmt_num(comp.get("mean_a")), "mean_b": fmt_num(comp.get("mean_b")),
                "delta": fmt_num(comp.get("delta")), "rel_delta": fmt_pct(comp.get("rel_delta"), signed=True),
                "p_value": fmt_p(comp.get("p_value")), "significant": fmt_num(comp.get("significant")),
                "verdict": fmt_num(comp.get("verdict")), "test": fmt_num(comp.get("test")),
                "n": f"{fmt_num(comp.get('n_a'))} / {fmt_num(comp.get('n_b'))}",
            })
        winner = as_dict(result.get("winner"))
        chosen = None
        if winner:
            chosen = {"label": fmt_num(winner.get("label")), "params": params_text(winner.get("params")),
                      "explanation": fmt_num(winner.get("explanation"))}
        return {"command": "",  # each run has its own
                "ab": {"rows": rows, "comparisons": comparisons, "winner": chosen,
                       "context": shared_context_text(as_dict(r.get("metrics")) for r in runs)}}

    def plots(self, name: str, result: dict, plotter) -> None:
        from validation.report.format import file_name
        from validation.report.plots import bar_points

        runs = [as_dict(r) for r in as_list(result.get("runs"))]
        plotter.bars(bar_points(runs), title=f"A/B: {result.get('title') or name}", xlabel="variant",
                     filename=f"ab_{file_name(name)}.png",
                     colors=lambda i, label: "tab:blue" if i == 0 else "tab:orange")


def _ignored_settings(ctx, step, runs: list[dict], label: str) -> list[str]:
    """Variables of a variant that its trainer runs reported as ignored (e.g. NSA_OPT_FUSED on CPU)."""
    names = set()
    for r in runs:
        if r["label"] == label:
            status = contracts.read_status_json(ctx.run_dir / r["dir"] / "out")
            names.update(contracts.ignored_settings(status, list(step.variants[label]["env"])))
    return sorted(names)


def pooled_summary(runs: list[dict], label: str) -> dict:
    """Mean over repeats of the per-run summary means (or the single run's summary)."""
    mine = [r["metrics"] for r in runs if r["label"] == label and r["status"] == "passed"]
    if not mine:
        return {}
    if len(mine) == 1:
        return mine[0]
    means = [m["toks_per_s"]["mean"] for m in mine if m.get("toks_per_s")]
    return {"toks_per_s": {"mean": sum(means) / len(means), "n": len(means)},
            "throughput_stable": all(m.get("throughput_stable") for m in mine), "repeats": len(mine)}


steps.register(AB())
