"""Plots of hostile results: texts that matplotlib would read as mathtext or cannot render, labels it would leave out
of a legend, figures near a float's range, damaged spreads and scan values. Each gives a plot whose texts and data
are the results' own (read back through matplotlib's objects), or a note in its place; never a traceback that stops
the report. And the view names a plot or artifact path no file can have instead of failing on it."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

from validation.kinds._plot_helpers import bar_points, scan_loglog
from validation.report import plots as plots_module
from validation.report.plots import Plotter, make_plots
from validation.report.view import build_view

HEADER = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[3]


def _drawn(plotter: Plotter) -> list:
    """Keep each figure the plotter saves."""
    figures = []
    original = plotter.save

    def keep(fig, filename, title):
        original(fig, filename, title)
        figures.append(fig)

    plotter.save = keep
    return figures


def _shown(text) -> tuple[str, bool]:
    """(what matplotlib draws of a Text, whether as mathtext): its own reading of the text's dollars."""
    return text._preprocess_math(text.get_text())


def _csv(run_dir: Path, rel: str, rows: list[tuple[int, str]]) -> None:
    path = run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(HEADER + "".join(f"{step},2,0.1,{toks},0.1,1,1,1\n" for step, toks in rows))


def _tokens_plot(tmp_path: Path, step: dict):
    _csv(tmp_path, "s/training.csv", [(1, "100"), (2, "110")])
    plotter = Plotter(tmp_path)
    figures = _drawn(plotter)
    plotter.for_step("s")
    plotter.tokens_per_step("s", step)
    (fig,) = figures
    assert (tmp_path / plotter.written[0]["path"]).read_bytes()[:8] == PNG_SIGNATURE
    return fig.axes[0]


def test_dollars_that_matplotlib_cannot_parse_are_drawn_as_written(tmp_path):
    ax = _tokens_plot(tmp_path, {"title": r"x $\frac$ y", "metrics": {"csv": "s/training.csv"},
                                 "runs": [{"label": "$x^$", "metrics": {"csv": "s/training.csv"}}]})
    assert _shown(ax.title) == (r"Tokens/s per step: x $\frac$ y", False)
    assert [_shown(t) for t in ax.get_legend().get_texts()] == [("s", False), ("$x^$", False)]


def test_a_title_with_two_dollars_is_not_drawn_as_mathtext(tmp_path):
    ax = _tokens_plot(tmp_path, {"title": "Cost: $5 per hour against ${baseline.cost}",
                                 "metrics": {"csv": "s/training.csv"}})
    assert _shown(ax.title) == ("Tokens/s per step: Cost: $5 per hour against ${baseline.cost}", False)


def test_a_lone_surrogate_in_a_title_is_drawn_as_the_report_shows_it(tmp_path):
    ax = _tokens_plot(tmp_path, {"title": "bytes \udcff from a command line", "metrics": {"csv": "s/training.csv"}})
    assert _shown(ax.title) == ("Tokens/s per step: bytes \ufffd from a command line", False)


def test_a_run_label_starting_with_an_underscore_keeps_its_legend_entry(tmp_path):
    ax = _tokens_plot(tmp_path, {"title": "A/B", "runs": [
        {"label": "_base", "metrics": {"csv": "s/training.csv", "window": {"first_step": 1, "last_step": 2}}},
        {"label": "fast", "metrics": {"csv": "s/training.csv"}}]})
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["_base", "fast", "statistics window"]
    handles = ax.get_legend().legend_handles
    assert [h.get_color() for h in handles[:2]] == ["C0", "C1"]  # each entry the colour of its own line
    assert [line.get_color() for line in ax.get_lines()] == ["C0", "C1"]


def _sweep(runs: list[dict]) -> dict:
    return {"steps": {"s": {"kind": "sweep", "status": "passed", "title": "sweep", "runs": runs}},
            "phases": [{"name": "p", "steps": ["s"]}]}


def test_sweep_tick_labels_with_dollars_are_drawn_as_written(tmp_path, monkeypatch):
    figures = []
    original = getattr(plots_module, "_png", None)
    monkeypatch.setattr(plots_module, "_png", lambda fig: (figures.append(fig), original(fig))[1], raising=False)
    results = _sweep([{"label": f"p{i}", "params": {"env.X": value}, "status": "passed",
                       "metrics": {"toks_per_s": {"mean": 100.0 + i, "stdev": 1.0}}}
                      for i, value in enumerate(["$x^$", "$5"])])
    assert [p["path"] for p in make_plots(results, tmp_path)] == ["plots/sweep_s.png"]
    (fig,) = figures
    ax = fig.axes[0]
    assert [_shown(t) for t in ax.get_xticklabels()] == [("$x^$", False), ("$5", False)]


def test_a_negative_stdev_draws_no_error_bar(tmp_path):
    runs = [{"label": "a", "status": "passed", "metrics": {"toks_per_s": {"mean": 100.0, "stdev": -3.0}}},
            {"label": "b", "status": "passed", "metrics": {"toks_per_s": {"mean": 120.0, "stdev": 2.0}}}]
    assert bar_points(runs) == [("a", 100.0, 0.0, "a"), ("b", 120.0, 2.0, "b")]
    assert [p["path"] for p in make_plots(_sweep(runs), tmp_path)] == ["plots/sweep_s.png"]


def test_pooled_means_near_a_float_s_range():
    runs = [{"label": "a", "status": "passed", "metrics": {"toks_per_s": {"mean": m, "stdev": 1.0}}}
            for m in (1e308, 1e200)]
    ((tick, mean, err, label),) = bar_points(runs)
    # exact rationals: the repeats' work over their time (the harmonic mean, as the tables pool them) and the
    # population stdev of the means
    exact_mean = 2 / (1 / Fraction(1e308) + 1 / Fraction(1e200))
    exact_err = abs(Fraction(1e308) - Fraction(1e200)) / 2
    assert (tick, label) == ("a (x2)", "a")
    assert math.isclose(mean, float(exact_mean), rel_tol=1e-12)
    assert math.isclose(err, float(exact_err), rel_tol=1e-12)


def test_a_bar_near_a_float_s_maximum_gives_a_plot_not_a_traceback(tmp_path):
    plotter = Plotter(tmp_path)
    figures = _drawn(plotter)
    plotter.bars([("a", 1.6e308, 0.0, "a"), ("b", 1e308, 0.0, "b")], title="t", xlabel="x", filename="b.png",
                 colors=lambda i, label: "tab:blue")
    (fig,) = figures
    assert [r.get_height() for r in fig.axes[0].patches] == [1.6e308, 1e308]
    assert [w["path"] for w in plotter.written] == ["plots/b.png"]
    assert (tmp_path / "plots/b.png").read_bytes()[:8] == PNG_SIGNATURE


def test_a_figure_matplotlib_cannot_lay_out_is_saved_as_a_note(tmp_path, monkeypatch):
    figures = []
    original = getattr(plots_module, "_png", None)
    monkeypatch.setattr(plots_module, "_png", lambda fig: (figures.append(fig), original(fig))[1], raising=False)
    _csv(tmp_path, "s/training.csv", [(1, "1e308"), (2, "1e308")])
    plotter = Plotter(tmp_path)
    plotter.for_step("s")
    plotter.tokens_per_step("s", {"title": "huge", "metrics": {"csv": "s/training.csv"}})
    assert [w["path"] for w in plotter.written] == ["plots/toks_per_s_s.png"]
    assert (tmp_path / "plots/toks_per_s_s.png").read_bytes()[:8] == PNG_SIGNATURE
    note = figures[-1].axes[0]
    assert note.get_title().startswith("Tokens/s per step: huge")
    assert any(t.get_text().startswith("Not drawn: its figures are outside the range") for t in note.texts)


def test_a_scan_with_a_damaged_value_draws_the_fit_over_the_positive_values(tmp_path):
    plotter = Plotter(tmp_path)
    figures = _drawn(plotter)
    scanned = [(-2.0, 0.05), (2.0, 0.1), (8.0, 0.4)]
    scan_loglog(plotter, scanned, [], (1.5, -2.0), [], title="scan", xlabel="seq_len", filename="scan.png")
    (fig,) = figures
    fit = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("fit")]
    (line,) = fit
    assert list(line.get_xdata()) == [2.0, 8.0]
    assert list(line.get_ydata()) == [math.exp(-2.0) * 2.0 ** 1.5, math.exp(-2.0) * 8.0 ** 1.5]


def _train_steps(names: list[str]) -> dict:
    return {"steps": {n: {"kind": "train", "status": "passed", "title": f"step {n}",
                          "metrics": {"csv": f"{n}/training.csv"}} for n in names},
            "phases": [{"name": "p", "steps": names}]}


def test_steps_whose_names_make_one_file_name_keep_their_own_plots(tmp_path):
    both, alone = tmp_path / "both", tmp_path / "alone"
    for run_dir in (both, alone):
        _csv(run_dir, "x/training.csv", [(1, "100"), (2, "110")])
    _csv(both, "_x/training.csv", [(1, "500"), (2, "510")])
    written = make_plots(_train_steps(["x", "_x"]), both)
    assert [(p["step"], p["path"]) for p in written] == [("x", "plots/toks_per_s_x.png"),
                                                         ("_x", "plots/toks_per_s_x-2.png")]
    (reference,) = make_plots(_train_steps(["x"]), alone)  # step x drawn in a run of its own
    assert (both / written[0]["path"]).read_bytes() == (alone / reference["path"]).read_bytes()
    assert (both / written[1]["path"]).read_bytes() != (alone / reference["path"]).read_bytes()


def _results() -> dict:
    return json.loads((REPO / "tests/validation/fixtures/results_example.json").read_text(encoding="utf-8"))


def test_a_plot_path_holding_a_nul_is_named_not_shown(tmp_path):
    results = _results()
    results["plots"] = [{"title": "t", "path": "plots/a\x00.png"}]
    for inline in (False, True):
        view = build_view(results, run_dir=tmp_path, inline_plots=inline)
        assert view["plots"] == []
        assert view["plots_not_shown"] == [{"path": "plots/a\x00.png",
                                            "why": "unreadable (a NUL character in its path)"}]


def test_an_artifact_path_too_long_for_a_file_name_is_missing(tmp_path):
    results = _results()
    name = next(iter(results["steps"]))
    long = "a" * 300 + "/x.txt"
    results["steps"][name]["artifacts"] = [long]
    view = build_view(results, run_dir=tmp_path)
    (files,) = [a["files"] for a in view["artifacts"] if a["step"] == name]
    assert {"path": long, "what": "artifact", "missing": True} in files


def test_the_same_results_give_the_same_png_in_another_process_and_settings(tmp_path):
    """A second process with another locale, time zone, backend and a matplotlibrc changing sizes, fonts, colours
    and the saved dpi writes the same bytes as this one, hostile texts included."""
    import os
    import subprocess
    import sys

    results = {"steps": {"s": {"kind": "train", "status": "passed", "title": "x $5 and $6 \u00e9",
                               "metrics": {"csv": "s/training.csv"},
                               "runs": [{"label": "_base", "metrics": {"csv": "s/training.csv"}}]}},
               "phases": [{"name": "p", "steps": ["s"]}]}
    rc = tmp_path / "rc"
    rc.mkdir()
    (rc / "matplotlibrc").write_text("lines.linewidth: 5\nfont.size: 22\nfont.family: serif\nsavefig.dpi: 300\n"
                                     "figure.dpi: 50\naxes.prop_cycle: cycler('color', ['red', 'green'])\n"
                                     "savefig.bbox: tight\naxes.formatter.use_locale: True\n")
    here, there = tmp_path / "here", tmp_path / "there"
    for run_dir in (here, there):
        _csv(run_dir, "s/training.csv", [(1, "100"), (2, "110"), (3, "90")])
    (there / "results.json").write_text(json.dumps(results), encoding="utf-8")
    assert [p["path"] for p in make_plots(results, here)] == ["plots/toks_per_s_s.png"]
    script = ("import json, sys; from pathlib import Path; from validation.report.plots import make_plots\n"
              "run = Path(sys.argv[1]); make_plots(json.loads((run / 'results.json').read_text()), run)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "LC_ALL": "C", "TZ": "Asia/Kolkata", "MPLBACKEND": "pdf",
           "MPLCONFIGDIR": str(rc)}
    subprocess.run([sys.executable, "-c", script, str(there)], env=env, check=True, cwd=REPO)
    assert (there / "plots/toks_per_s_s.png").read_bytes() == (here / "plots/toks_per_s_s.png").read_bytes()
