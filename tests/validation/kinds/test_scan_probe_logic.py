"""The scan step's logic end to end over fake trainer launches with a known step time per value (a cost law
c * value^1.5 with a 3x jump at 512): the figure it takes of each run (the median of the window, warm-up steps
excluded), the fit over every run, the bisection with one run per point (block-mean noise), the short-window note,
values launched as given, the plot's cliff and the runbook check of too few runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from decision_support import HEADER, FakeTrainer, run_runbook

RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 30}, nproc_per_node: 1, window: %(window)d, warmup_steps: 5}
phases:
  - name: p
    steps:
      - name: sc
        kind: scan
        values: {args.seq_len: %(values)s}
        repeats: %(repeats)d
%(extra)s"""

# Symmetric offsets in a fixed shuffled order: the window's median and mean are exactly the level, its spread 0.6%
OFFSETS = np.random.default_rng(5).permutation(np.r_[np.arange(1, 11), -np.arange(1, 11)] * 1e-3)


def true_time(value: float) -> float:
    """The cost law: 1 ms at 64, growing as value^1.5, three times slower from 512 on."""
    return 1e-3 * (value / 64.0) ** 1.5 * (3.0 if value >= 512 else 1.0)


class LawTrainer(FakeTrainer):
    """A FakeTrainer whose training.csv has step time true_time(value) over the window (steps 11-30 of 30: the
    last 20 after 5 warm-up steps) and 50 times that on steps 1-10; `failed(spec)`: the launch ends crashed."""

    def __init__(self, failed=None):
        super().__init__(lambda spec: 1000.0)
        self.failed = failed

    def __call__(self, spec):
        result = super().__call__(spec)
        t = true_time(float(next(iter(spec.params.values()))))
        times = [50 * t] * 10 + [t * (1 + o) for o in OFFSETS]
        rows = [HEADER] + [f"{i + 1},{5 - i * 0.01:.4f},0.001,{4096 / x:.6f},{x:.9f},1.0,1.0,1.5"
                           for i, x in enumerate(times)]
        out = Path(spec.trainer_out_dir)
        (out / "training.csv").write_text("\n".join(rows) + "\n")
        if self.failed is not None and self.failed(spec):
            (out / "status.json").write_text(json.dumps({"status": "crashed", "reason": "CUDA out of memory",
                                                         "step": 3}))
        return result


def scan(monkeypatch, tmp_path, values, repeats, window=20, extra="", failed=None):
    trainer = LawTrainer(failed)
    results = run_runbook(monkeypatch, tmp_path, RB % dict(values=values, repeats=repeats, window=window,
                                                           extra=extra), trainer)
    return results["steps"]["sc"], trainer


def test_each_run_is_its_window_median_and_the_exponent_fits_every_run(monkeypatch, tmp_path):
    step, _ = scan(monkeypatch, tmp_path, "[256, 64, 512]", 2)
    m = step["metrics"]
    assert step["status"] == "passed" and m["values"] == [64, 256, 512]
    for p in m["points"]:  # the warm-up and steps 6-10 (50x slower) are outside the window
        assert len(p["run_step_times_s"]) == 2
        assert all(math.isclose(t, true_time(p["value"]), rel_tol=1e-6) for t in p["run_step_times_s"])
    # least squares of log time on log value over the 6 runs (numpy's polyfit, not the analysis code)
    x = np.log([64, 64, 256, 256, 512, 512])
    slope = np.polyfit(x, np.log([true_time(v) for v in (64, 64, 256, 256, 512, 512)]), 1)[0]
    assert math.isclose(m["exponent"], slope, rel_tol=1e-6) and m["exponent_fit"]["n"] == 6
    # 256 -> 512: 2^1.5 * 3, a local exponent of 1.5 + log2(3) = 3.585
    assert m["cliff"] and (m["cliff_pair"]["a"], m["cliff_pair"]["b"]) == (256, 512)
    assert math.isclose(m["cliff_pair"]["exponent"], 1.5 + math.log2(3), rel_tol=1e-6)
    assert m["cliff_interval"] == [256, 512] and m["bisection"] is None and not m["cliff_localised"]


def test_one_run_per_point_bisects_on_the_block_means_of_each_window(monkeypatch, tmp_path):
    """With repeats 1 a point's noise is its window's block means (20 steps), held to the runbook's declared launch
    noise (without one, block means alone establish no cliff); a bisection point has one run too, so it is
    classified from its own window: 384 and 448 follow the law (exponent 1.5 from the last good point), the
    interval ends at [448, 512], 64 wide."""
    step, trainer = scan(monkeypatch, tmp_path, "[128, 256, 512]", 1,
                         extra="        bisect: {steps: 3, resolution: 64, multiple_of: 32}\n"
                               "compare: {launch_sd: 0.02, pairs: 30}\n")
    m = step["metrics"]
    assert step["status"] == "passed" and m["run_to_run"] == "declared" and m["cliff_pair"]["a"] == 256
    assert m["bisection"]["points"] == [[384, "good"], [448, "good"]]
    assert m["cliff_interval"] == [448, 512] and m["cliff_localised"] is True
    assert [s.dir for s in trainer.launched][-2:] == ["sc/bisect_384", "sc/bisect_448"]


def test_the_short_window_note_is_only_for_points_left_without_noise(monkeypatch, tmp_path):
    """Repeats 2 and a 10-step window: the points' noise is the pooled spread of their runs. A value left with one
    run (the other crashed) is still tested on that pooled noise, so no note says it calls no cliff."""
    step, _ = scan(monkeypatch, tmp_path, "[64, 256, 512]", 2, window=10,
                   failed=lambda spec: spec.label == "512" and spec.repeat == 0)
    m = step["metrics"]
    assert step["status"] == "failed" and "512: trainer ended crashed: CUDA out of memory" in step["reason"]
    assert m["noise_source"] == "repeats" and m["cliff"] and m["cliff_pair"]["b"] == 512
    assert not any("shorter than 20 steps" in n for n in step.get("notes") or [])


def test_a_value_is_launched_as_the_runbook_gives_it(tmp_path):
    from validation.runbook.loader import load_runbook
    from validation.runbook.plan import step_launches

    path = tmp_path / "rb.yaml"
    path.write_text((RB % dict(values="[1, 2]", repeats=2, window=20, extra="")).replace(
        "args.seq_len: [1, 2]", "args.lr: [0.00012341, 0.00012344, 0.00049382]"))
    step = load_runbook(path, cwd=str(Path(__file__).resolve().parents[3])).steps()[0]
    specs = step_launches(step, {}, tmp_path)
    given = {0.00012341, 0.00012344, 0.00049382}
    assert {float(s.argv[s.argv.index("--lr") + 1]) for s in specs} == given
    assert {next(iter(s.params.values())) for s in specs} == given and len({s.dir for s in specs}) == 6


def test_the_plot_shades_the_cliff_pair_across_a_value_none_of_whose_runs_passed(monkeypatch):
    """512 failed in every run: the pair tested is 256 -> 1024, and that is the interval the plot shades."""
    from validation.kinds import scan as scan_mod

    seen = []
    monkeypatch.setattr(scan_mod, "scan_loglog", lambda plotter, scanned, bisected, fit, cliffs, **kw:
                        seen.append(cliffs))
    point = {"source": "scan", "runs": 2, "cliff_to_next": False}
    result = {"metrics": {
        "setting": "args.seq_len", "cliff": True, "exponent_fit": {"slope": 2.0, "intercept": -10.0},
        "pairs": [{"a": 64, "b": 256, "exponent": 1.5, "cliff": False},
                  {"a": 256, "b": 1024, "exponent": 2.3, "cliff": True}],
        "points": [{**point, "value": 64, "passed": 2, "run_step_times_s": [0.001, 0.001]},
                   {**point, "value": 256, "passed": 2, "run_step_times_s": [0.008, 0.008], "cliff_to_next": True},
                   {**point, "value": 512, "passed": 0, "run_step_times_s": []},
                   {**point, "value": 1024, "passed": 2, "run_step_times_s": [0.19, 0.19]}]}}
    scan_mod.Scan().plots("sc", result, plotter=None)
    assert seen == [[(256.0, 1024.0)]]


@pytest.mark.parametrize("values,repeats,ok", [("[64, 128]", 1, False), ("[64, 128]", 2, True),
                                                ("[64, 128, 256]", 1, True)])
def test_a_scan_of_fewer_than_three_runs_is_a_runbook_error(tmp_path, values, repeats, ok):
    """The cost exponent's fit needs 3 runs: two values run once can never give it, so the runbook says so."""
    from validation.runbook.loader import RunbookError, load_runbook

    path = tmp_path / "rb.yaml"
    path.write_text(RB % dict(values=values, repeats=repeats, window=20, extra=""))
    cwd = str(Path(__file__).resolve().parents[3])
    if ok:
        load_runbook(path, cwd=cwd)
        return
    with pytest.raises(RunbookError) as info:
        load_runbook(path, cwd=cwd)
    assert "steps[0].repeats: 2 values x 1 repeat(s) give 2 runs" in str(info.value)
    assert "at least 3" in str(info.value)
