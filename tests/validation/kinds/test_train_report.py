"""What a trainer step's report section shows beyond its training.csv (validation.kinds.train_report): the Training
Summary, the time to first step with the "init grows faster than the model" rule, the telemetry figures, the
low-utilisation diagnosis and the telemetry plot, from results.json (the fixture) and files written here."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

import pytest

from validation.launch import telemetry
from validation.report import render
from validation.report.plots import make_plots
from validation.kinds import train_report
from validation.results.trainer_launch import Window

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_init_growth_rule():
    small = {"init_s": 4.0, "n_params": 1e6}
    # 10x the model, 2.5x the init: grows slower than the model, not flagged
    g = train_report.init_growth({"init_s": 10.0, "n_params": 1e7}, [("small", small)])
    assert g["flagged"] is False and g["reference"] == "small" and g["model_ratio"] == pytest.approx(10)
    # the same model, init 4 s -> 20 s: 5x, more than twice the model's growth (1x) and 16 s longer
    g = train_report.init_growth({"init_s": 20.0, "n_params": 1e6}, [("small", small)])
    assert g["flagged"] is True and "Init grows faster than the model" in g["text"]
    # 2x the model, 4.5x the init but only 14 s longer than... above the 5 s floor: flagged; under it: not
    assert train_report.init_growth({"init_s": 18.0, "n_params": 2e6}, [("small", small)])["flagged"] is True
    assert train_report.init_growth({"init_s": 0.9, "n_params": 1e6},
                                    [("tiny", {"init_s": 0.2, "n_params": 1e6})])["flagged"] is False
    # the reference is the smallest model (of equal ones the fastest init); nothing to compare with: None
    g = train_report.init_growth({"init_s": 9.0, "n_params": 4e6},
                                 [("big", {"init_s": 1.0, "n_params": 8e6}), ("a", {"init_s": 5.0, "n_params": 1e6}),
                                  ("b", {"init_s": 3.0, "n_params": 1e6})])
    assert g["reference"] == "b" and g["flagged"] is False  # 3x init for 4x the model
    assert train_report.init_growth({"init_s": 9.0, "n_params": 1e6}, []) is None
    assert train_report.init_growth({"init_s": None, "n_params": 1e6}, [("a", small)]) is None


def test_startup_metrics_split_imports_init_and_first_step():
    timeline = {"milestones": {"process_start": 0.0, "imports_done": 6.0, "setup_done": 6.5, "first_logged_step": 8.0},
                "time_to_first_step_s": 8.0, "process_start_unix": 1000.0, "slowest": None, "missing_milestones": []}
    st = train_report.startup_metrics(timeline, 1e6)
    assert (st["imports_s"], st["init_s"], st["first_step_s"], st["time_to_first_step_s"]) == (6.0, 0.5, 1.5, 8.0)
    assert train_report.startup_metrics({}) == {}
    assert train_report.startup_metrics({"problem": "bad"}) == {"problem": "bad"}


def test_training_window_in_time_from_the_timeline_and_step_times():
    startup = {"process_start_unix": 1000.0, "time_to_first_step_s": 5.0}
    steps, times = [1, 2, 3, 4, 5], [2.0, 0.5, 0.5, 0.5, 0.5]
    # step 1 logged at 1005; each later step ends its step time after the one before
    assert train_report.training_period(startup, steps, times, 3, 5) == (1005.5, 1007.0)
    assert train_report.training_period(startup, steps, times, 1, 2) == (1003.0, 1005.5)
    assert train_report.training_period({}, steps, times, 3, 5) is None
    assert train_report.training_period(startup, steps, times, 3, 9) is None


def _summary(**over):
    s = {"steps": 60, "avg_step_time_s": 0.25, "min_step_time_s": 0.2, "max_step_time_s": 0.9, "samples_per_s": 32.0,
         "tokens_per_s": 8192.0, "avg_loss": 5.1, "final_loss": 4.25, "memory_kind": "cuda",
         "peak_mem_alloc_gb": 12.45, "avg_mem_alloc_gb": 12.32, "peak_mem_reserved_gb": 14.0,
         "avg_mem_reserved_gb": 13.5, "comm_time_s": None, "comm_share": None,
         "comm_time_method": "not measured on CUDA (use the profiler)", "parallel": "ddp", "world_size": 2,
         "status": "completed"}
    return {**s, **over}


@pytest.fixture
def results_with_telemetry(tmp_path):
    """The fixture run with its baseline step given a Training Summary, a timeline and a GPU telemetry file whose
    utilisation is low (35%) with little memory used."""
    results = json.loads((FIXTURES / "results_example.json").read_text(encoding="utf-8"))
    step_dir = tmp_path / "baseline"
    step_dir.mkdir()
    with open(step_dir / "telemetry.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(telemetry.COLUMNS))
        w.writeheader()
        for i in range(12):
            w.writerow({"time": 1000 + i, "elapsed_s": i, "node": "gpu-node", "sample": i, "gpu": 0, "ours": 1,
                        "gpu_util_pct": 0 if i < 4 else 35, "mem_used_gb": 9.0, "mem_total_gb": 80.0,
                        "power_w": 120, "sm_clock_mhz": 1410, "temp_c": 50, "throttle": "none", "pcie_gen": 4,
                        "pcie_gen_max": 4, "pcie_width": 16, "pcie_width_max": 16, "cpu_util_pct": 60 + i,
                        "rss_gb": 4.0, "procs": 3, "sampler_cpu_ms": 1.2})
    m = results["steps"]["baseline"]["metrics"]
    startup = {"milestones": {"process_start": 0.0, "imports_done": 2.0, "setup_done": 3.5, "first_logged_step": 4.0},
               "imports_s": 2.0, "init_s": 1.5, "first_step_s": 0.5, "time_to_first_step_s": 4.0, "n_params": 1e8,
               "process_start_unix": 1000.0,
               "init_growth": train_report.init_growth({"init_s": 30.0, "n_params": 1e8},
                                                       [("single", {"init_s": 3.0, "n_params": 1e8})])}
    m.update(summary=train_report.summary_metrics(_summary()), startup=startup, time_to_first_step_s=4.0)
    m.update(train_report.telemetry_metrics(step_dir, {}, None, Window(), m.get("context") or {}))
    return results, tmp_path


def test_metrics_of_a_launch_with_low_gpu_utilisation(results_with_telemetry):
    results, _ = results_with_telemetry
    m = results["steps"]["baseline"]["metrics"]
    assert m["gpu_util"]["mean"] == pytest.approx((8 * 35) / 12, abs=1e-3) and m["throttled"] is False
    assert m["pcie_gen_min"] == 4 and m["cpu_util"]["max"] == 71 and m["rss_gb"]["max"] == 4.0
    assert m["telemetry"]["period"].startswith("the whole launch") and m["telemetry"]["sampler_cpu_ms"] == 1.2
    assert m["gpu_diagnosis"]["causes"][0]["cause"] == "batch too small"


def test_report_section_shows_summary_time_to_first_step_telemetry_and_its_plot(results_with_telemetry):
    results, run_dir = results_with_telemetry
    results["plots"] = make_plots(results, run_dir)
    assert any(p["title"] == "Telemetry: " + results["steps"]["baseline"]["title"] and p["step"] == "baseline"
               and p["path"] == "plots/telemetry_baseline.png" for p in results["plots"])
    assert (run_dir / "plots" / "telemetry_baseline.png").stat().st_size > 1000
    md = render(results, "md", run_dir=run_dir)
    section = md[md.index("baseline"):]
    assert "**Training Summary**" in section
    assert "| Step time avg / min / max | 250.0 ms / 200.0 ms / 900.0 ms |" in section
    assert "| Tokens/s over the whole run (all ranks, all steps: tokens / step time) | 8,192.0 |" in section and "| Samples/s | 32.0 |" in section
    assert "| Loss avg / final | 5.100 / 4.250 |" in section
    assert "| Memory allocated peak / avg | 12.45 GiB / 12.32 GiB |" in section
    assert "| Memory reserved peak / avg | 14.00 GiB / 13.50 GiB |" in section
    assert "| Communication share | n/a (not measured on CUDA (use the profiler)) |" in section
    assert "**Time to first step**: 4.0 s (imports 2.0 s, init 1.5 s, first step 0.5 s)" in section
    assert "**Flag**: Init grows faster than the model" in section
    assert "Low GPU utilisation: 23% on average" in section and "batch too small" in section
    assert "plots/telemetry_baseline.png" in md
    html = render(results, "html", run_dir=run_dir)
    assert "<h5>Training Summary</h5>" in html and "Time to first step</strong>: 4.0 s" in html
    assert "Low GPU utilisation" in html and 'alt="Telemetry: ' in html


def test_steps_without_the_new_files_render_as_before(results_with_telemetry):
    results, run_dir = results_with_telemetry
    bare = copy.deepcopy(results)
    for key in ("summary", "startup", "time_to_first_step_s", "telemetry", "gpu_util", "gpu_diagnosis"):
        bare["steps"]["baseline"]["metrics"].pop(key, None)
    md = render(bare, "md")
    assert "Training Summary" not in md and "Time to first step" not in md and "Telemetry (" not in md
    damaged = copy.deepcopy(results)
    damaged["steps"]["baseline"]["metrics"]["summary"] = {"problem": "out/summary.json: missing field(s) steps"}
    assert "**Training Summary**: out/summary.json: missing field(s) steps" in render(damaged, "md")


def _without(value, key: str, drop: bool):
    """`value` (parsed JSON) with `key` of every statistic in it (a mapping with a "mean" and a "max" or "min") set
    to null, or left out when `drop`."""
    if isinstance(value, list):
        return [_without(v, key, drop) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _without(v, key, drop) for k, v in value.items()}
    if "mean" in out and ("max" in out or "min" in out) and key in out:
        if drop:
            del out[key]
        else:
            out[key] = None
    return out


@pytest.mark.parametrize("key", ["mean", "max", "min"])
def test_a_statistic_without_one_of_its_figures_renders_n_a_not_a_traceback(results_with_telemetry, key):
    """results.json may hold a statistic (cpu_util, gpu_util, power_w, toks_per_s, ...) whose mean, max or min is
    null or missing (the schema allows it): each figure renders n/a on its own and the rest still shows. The whole
    cpu_smoke example (every trainer kind) too."""
    results, _ = results_with_telemetry
    example = json.loads((Path(__file__).parents[3] / "reports" / "examples" / "cpu_smoke" / "results.json")
                         .read_text(encoding="utf-8"))
    for drop in (False, True):
        damaged = _without(results, key, drop)
        md = render(damaged, "md")
        render(damaged, "html")
        if key == "max":
            assert "CPU of the launch's processes 66% mean, n/a max, RSS n/a max" in md
            assert "utilisation 23% mean, n/a max" in md
        if key == "mean":
            assert "CPU of the launch's processes n/a mean, 71% max" in md
    for drop in (False, True):
        render(_without(example, key, drop), "md")
    render(_without(example, key, False), "html")


def test_init_is_unknown_without_the_imports_mark():
    """init_s is setup_done - imports_done; a timeline without imports_done has no init figure (setup_done alone
    counts the imports)."""
    startup = train_report.startup_metrics({"milestones": {"process_start": 0.0, "setup_done": 6.5,
                                                           "first_logged_step": 8.0}, "time_to_first_step_s": 8.0})
    assert startup["init_s"] is None and startup["imports_s"] is None
    assert startup["first_step_s"] == pytest.approx(1.5) and startup["time_to_first_step_s"] == pytest.approx(8.0)
