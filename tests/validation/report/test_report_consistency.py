"""The report never contradicts itself or `compare`: one statistic behind every figure (a real tiny run: compare of the
run against itself shows the report's means, in plain notation), the sweep plot marks the point its decision text
names, an A/B whose variant the trainer ignored states no empty decision under its table, and the happy path is
quiet (cpu_smoke's windows fit its steps, while a user's too-short window still is an open problem)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest

from validation.report.compare import compare_runs, table_lines, window_units
from validation.report import render
from validation.formatting import fmt_num, fmt_rate
from validation.report.plots import make_plots
from validation.report.problems import open_problems
from validation.analysis.significance import block_units

REPO = Path(__file__).resolve().parents[3]
FIXTURES = Path(__file__).parents[1] / "fixtures"

TINY = """\
name: tiny_consistency
requirements: {gpus: 0, backend: gloo}
defaults:
  config: configs/tiny_cpu.yaml
  env: {NSA_TB_DISABLE: "1"}
  args: {dataset: synthetic, ddp: 0, steps: 15, seq_len: 64, batch_size: 2, save_every: 1000}
  nproc_per_node: 1
  timeout_s: 180
  stall_timeout_s: 60
  window: 11
  warmup_steps: 2
phases:
  - name: measure
    steps:
      - {name: single, kind: train, title: "One process"}
"""


@pytest.fixture(scope="module")
def tiny_run(cli, tmp_path_factory):
    root = tmp_path_factory.mktemp("consistency")
    runbook = root / "tiny.yaml"
    runbook.write_text(TINY)
    run_dir = root / "run"
    proc = cli("run", runbook, "--out", run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir


def test_compare_of_a_run_with_itself_shows_the_reports_figures(cli, tiny_run):
    """A real run: every tokens/s row of `compare RUN RUN` (tested, or shown only because a launch was measured
    under interference) has the mean the report prints for that launch (the same window mean, not the mean of the
    steps that fill whole blocks), in the console table and in the JSON, and no figure is in scientific notation."""
    results = json.loads((tiny_run / "results.json").read_text())
    report = (tiny_run / "report.md").read_text()
    proc = cli("compare", tiny_run, tiny_run, "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    tested = [r for r in out["rows"] if r["metric"] == "toks_per_s" and r["step"] in results["steps"]]
    assert tested
    for row in tested:
        stored = results["steps"][row["step"]]["metrics"]["toks_per_s"]["mean"]
        assert row["mean_a"] == stored and row["mean_b"] == stored
        assert fmt_rate(stored) in report  # the report's table shows this very figure
    text = cli("compare", tiny_run, tiny_run)
    assert text.returncode == 0, text.stderr
    line = next(ln for ln in text.stdout.splitlines() if ln.startswith("single "))
    assert fmt_num(float(tested[0]["mean_a"])) in line
    assert not re.search(r"\d[eE][+-]\d", text.stdout), text.stdout


def test_window_units_keep_the_whole_windows_mean():
    """block_units leaves the earliest steps out to fill whole blocks; the mean compare reports is the window's."""
    rng = np.random.default_rng(3)
    x = 1e4 * (1 + 0.05 * np.cumsum(rng.standard_normal(23)) / 5)  # drifting: blocks of several steps
    blocks = block_units(x)
    assert blocks.dropped > 0 and blocks.mean != pytest.approx(float(x.mean()), rel=1e-9)
    units = window_units(list(x))
    whole = len(x) / float(np.sum(1.0 / x))  # a rate's window figure: its tokens over its time (harmonic mean)
    assert units.mean == pytest.approx(whole, rel=1e-12) and units.se == blocks.se and units.df == blocks.df
    assert window_units(list(x), {"mean": 12345.0, "n": len(x)}).mean == 12345.0
    assert window_units(list(x), {"mean": 12345.0, "n": len(x) - 1}).mean == pytest.approx(whole, rel=1e-12)
    assert window_units(list(x), metric="loss").mean == pytest.approx(float(x.mean()), rel=1e-12)  # not a rate


def _csv(path: Path, values) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"]
    rows += [f"{i + 1},4.0,0.001,{v:.3f},{4096 / v:.6f},1.0,1.0,1.5" for i, v in enumerate(values)]
    path.write_text("\n".join(rows) + "\n")


def test_compare_table_prints_means_as_the_report_does(tmp_path):
    a = {"runbook": {"name": "rb"}, "environment": {}, "steps": {"s": {"name": "s", "kind": "train", "runs": [],
         "metrics": {"csv": "s/training.csv", "window": {"last": 20, "warmup": 0}}}}}
    _csv(tmp_path / "s/training.csv", 19214.5 + 100 * np.sin(np.arange(20)))
    out = compare_runs(a, a, tmp_path, tmp_path)
    line = next(ln for ln in table_lines(out) if ln.startswith("s "))
    assert fmt_num(out["rows"][0]["mean_a"]) in line and "e+" not in line


def _sweep_results(significant: bool) -> dict:
    results = json.loads((FIXTURES / "results_example.json").read_text())
    step = results["steps"]["bucket_sweep"]
    labels = [str(r["label"]) for r in step["runs"]]
    means = {label: 10_000.0 + 500 * i for i, label in enumerate(dict.fromkeys(labels))}
    for run in step["runs"]:
        run["status"] = "passed"
        run.setdefault("metrics", {})["toks_per_s"] = {"mean": means[str(run["label"])], "stdev": 50.0, "n": 15}
    best = max(means, key=means.get)
    kept = next(iter(means)) if not significant else best
    step["choice"] = {"label": kept, "params": next(r["params"] for r in step["runs"] if r["label"] == kept),
                      "explanation": "x", "significant": significant, "kept_default": not significant}
    step["winner"] = step["choice"] if significant else None
    step["decision"] = {"significant": significant, "choice": kept, "winner": kept if significant else None,
                        "reason": "the decision in words", "method": "paired", "repeats": 2, "noise_floor": 0.05,
                        "recommended_repeats": 3, "comparison": {"text": "t"}, "comparisons": []}
    results["plots"] = []
    return results, kept


@pytest.mark.parametrize("significant", [True, False])
def test_the_sweep_plot_marks_the_point_the_decision_names(tmp_path, significant):
    """The rendered report's decision names a point (the winner, or the point kept); the sweep plot's marked bar
    is that point, with the decision's word, in the Markdown and in the HTML."""
    results, kept = _sweep_results(significant)
    plots = make_plots(results, tmp_path)
    sweep_plot = next(p for p in plots if p["path"].startswith("plots/sweep_"))
    assert sweep_plot["step"] == "bucket_sweep"
    md = render(results, "md", run_dir=tmp_path, plots=plots)
    decision = re.search(r"\*\*Decision\*\*: (.*)", md).group(1)
    named = re.search(r"(NSA_DDP_BUCKET_MB=\d+)", decision).group(1)
    marked = re.search(r"marked bar: (\S+) \((\w+)\)", md)
    assert marked, md
    assert marked.group(1) == named == kept
    assert marked.group(2) == ("winner" if significant else "kept")
    assert ("(significant)" in decision) == significant and ("kept" in decision) != significant
    # beside its table: the figure comes after the sweep's table and before the next step's heading
    sweep_at = md.index("**Decision**")
    fig_at = md.index(f"({sweep_plot['path']})")
    next_step = md.index("#### ", sweep_at)
    assert sweep_at < fig_at < next_step
    html = render(results, "html", run_dir=tmp_path, plots=plots)
    assert f"marked bar: {kept} ({'winner' if significant else 'kept'})" in html


def test_plots_carry_their_context_and_one_legend_entry_per_label(tmp_path):
    results, _ = _sweep_results(False)
    step = results["steps"]["bucket_sweep"]
    ctx = {"seq_len": 256, "micro_batch": 4, "world_size": 2, "precision": "fp32", "device": "cpu"}
    step["runs"] += [{**copy.deepcopy(r), "repeat": 1} for r in step["runs"]]  # two repeats of each point
    for i, run in enumerate(step["runs"]):
        run["metrics"].update(context=ctx, csv=f"sw/{i}/training.csv", window={"first_step": 6, "last_step": 20})
        _csv(tmp_path / f"sw/{i}/training.csv", [1e4 + j for j in range(20)])
    plots = make_plots(results, tmp_path)
    for p in (p for p in plots if p["step"] == "bucket_sweep"):
        assert p["context"] == "seq_len 256 · micro-batch 4 · fp32 · world size 2 · device cpu"
        assert p["context"] in p["caption"]
    from validation.report.plots import Plotter

    plotter = Plotter(tmp_path)
    plotter.for_step("bucket_sweep", step)
    captured = {}
    original = plotter.save

    def keep(fig, filename, title):
        captured["labels"] = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        captured["title"] = fig.axes[0].get_title()
        original(fig, filename, title)

    plotter.save = keep
    plotter.tokens_per_step("bucket_sweep", step)
    labels = [label for label in captured["labels"] if label != "statistics window"]
    assert len(labels) == len(set(labels)) == len({r["label"] for r in step["runs"]})
    assert all("(2 runs)" in label for label in labels)
    assert "seq_len 256" in captured["title"] and "device cpu" in captured["title"]


def test_an_ab_whose_variant_was_ignored_states_no_empty_decision(tmp_path):
    """fused_adamw on CPU: the comparison table is shown; the decision says the variant was not considered and
    why, never "only baseline was measured" nor "0 run(s) per variant"."""
    results = json.loads((FIXTURES / "results_example.json").read_text())
    step = results["steps"]["fused_adamw"]
    step["decision"] = {"significant": False, "choice": "baseline", "winner": None, "comparison": None,
                        "comparisons": [], "method": None, "repeats": 0, "noise_floor": None,
                        "recommended_repeats": None, "excluded_ignored": ["fused"],
                        "reason": "only baseline was measured: nothing to compare.; not considered: fused"}
    step["choice"] = {"label": "baseline", "params": {}, "significant": False, "kept_default": True,
                      "explanation": "x"}
    step["comparison"] = [{"baseline": "baseline", "variant": "fused", "metric": "toks_per_s", "mean_a": 100.0,
                           "mean_b": 101.0, "rel": 0.01, "rel_delta": 0.01, "ci_low": -0.05, "ci_high": 0.07,
                           "p_value": 0.5, "significant": False, "verdict": "same", "noise_floor": 0.05}]
    for fmt in ("md", "html"):
        text = render(results, fmt)
        section = text[text.index("Fused AdamW"):]
        assert "only baseline was measured" not in section and "0 run(s) per variant" not in section
        assert "not considered" in section and "ignored" in section


def test_cpu_smokes_windows_fit_its_steps_and_a_short_window_is_still_a_problem(tmp_path):
    """cpu_smoke's own settings cause no "window has N of the M steps asked": every trainer step runs at least
    warmup + window steps. A user's runbook whose window is longer than its steps still gets the open problem."""
    from validation.runbook.loader import load_runbook

    rb = load_runbook(REPO / "runbooks" / "cpu_smoke.yaml")
    for phase in rb.phases:
        for step in phase.steps:
            launch = getattr(step, "launch", None)
            steps = launch.args.get("steps") if launch is not None else None
            if steps is not None:
                assert int(steps) >= launch.warmup_steps + launch.window, step.name
            for label, variant in (getattr(step, "variants", None) or {}).items():  # an A/B variant's own window
                if variant.window is not None:
                    assert int(variant.args.get("steps", steps)) >= launch.warmup_steps + variant.window, label
    from validation.analysis import metrics

    results = json.loads((FIXTURES / "results_example.json").read_text())
    path = tmp_path / "training.csv"
    _csv(path, [1e4 + i for i in range(10)])  # a user's runbook: 10 steps, window 20 after 5 warm-up steps
    summary = metrics.summarize(metrics.read_training_csv(path), metrics.Window(last=20, warmup=5))
    assert summary["status"] == "short"
    results["steps"]["single"]["metrics"].update(status=summary["status"], note=summary["note"])
    problems = open_problems(results)
    assert any(p["where"] == "step single" and "5 of the 20 steps asked" in p["what"] for p in problems)
