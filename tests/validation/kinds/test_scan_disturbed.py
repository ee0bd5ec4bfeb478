"""A scan's cliffs and cost exponent stand only on runs measured undisturbed: a run that other work on the machine
slowed (its metrics' interference disturbed) is no measurement of its value. Simulated scans over fake launches
(no training): a linear cost law, two runs a point, the largest value's runs slowed 4x by interference."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from validation.kinds import scan as scan_mod
from validation.kinds.trainer import Runs
from validation.analysis.interference import disturbed
from validation.results.codec import decode, encode
from validation.results.trainer_launch import LaunchMetrics, LaunchRun
from validation.runbook.loader import load_runbook
from validation.runbook.plan import step_launches

REPO = Path(__file__).resolve().parents[3]
RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 30}, nproc_per_node: 1, window: 20, warmup_steps: 5}
phases:
  - name: p
    steps:
      - {name: sc, kind: scan, values: {args.seq_len: [1024, 2048, 4096]}, repeats: 2}
"""
SLOWED = 4.0


def _scan(monkeypatch, tmp_path, shaken_value: float | None, shaken_repeats: tuple[int, ...] = (0, 1)):
    """Scan.run with step time 1 ms x value/1024 (+-1% between the two repeats); the runs at `shaken_value` (those
    of `shaken_repeats`) are recorded as disturbed and SLOWED times slower."""
    path = tmp_path / "rb.yaml"
    path.write_text(RB)
    step = load_runbook(path, cwd=str(REPO)).steps()[0]
    launches = step_launches(step, {}, tmp_path)

    def is_shaken(value: float, repeat) -> bool:
        return value == shaken_value and int(repeat or 0) in shaken_repeats

    def metrics(value: float, repeat) -> LaunchMetrics:
        shaken = is_shaken(value, repeat)
        return decode(LaunchMetrics, {"toks_per_s": {"mean": 1000.0 / (SLOWED if shaken else 1.0)},
                                      "interference": {"disturbed": shaken, "share": 1.0 if shaken else 0.0,
                                                       "text": "other processes used 6 cores" if shaken else ""}})

    def fake_run_all(ctx, retry_disturbed=False, launches=None, on_progress=None):
        return Runs([LaunchRun(label=s.label, params=dict(s.params), status="passed", dir=s.dir,
                               command=list(s.argv), repeat=s.repeat,
                               metrics=metrics(float(next(iter(s.params.values()))), s.repeat))
                     for s in (ctx.launches if launches is None else launches)])

    def fake_values(run_dir, step, run, metric):
        v = float(next(iter(run["params"].values())))
        level = 1e-3 * v / 1024.0 * (1.0 + 0.01 * (int(run.get("repeat") or 0) - 0.5))
        level *= SLOWED if is_shaken(v, run.get("repeat")) else 1.0
        return [level * (1.0 + 0.001 * ((i % 3) - 1)) for i in range(20)]

    monkeypatch.setattr(scan_mod, "run_all", fake_run_all)
    monkeypatch.setattr(scan_mod, "run_values", fake_values)
    ctx = SimpleNamespace(run_dir=tmp_path, step=step, launches=launches, winners=dict,
                          save=lambda partial=None: None, results={})
    return scan_mod.Scan().run(step.options, ctx)


def test_no_cliff_is_called_from_disturbed_runs(monkeypatch, tmp_path):
    clean = _scan(monkeypatch, tmp_path, None).metrics
    assert clean.cliff is False and abs(clean.exponent - 1.0) < 0.05  # the law itself: linear
    result = _scan(monkeypatch, tmp_path, 4096.0)
    m = result.metrics
    assert m.cliff is False  # 4x slower at 2x the value is a cliff only of the interference
    assert abs(m.exponent - 1.0) < 0.05  # the fit over the undisturbed points: the law's exponent
    top = [p for p in m.points if p.value == 4096][0]
    assert top.disturbed == 2 and top.step_time_s is None and top.toks_per_s is None
    assert any("interference" in n for n in result.notes or [])


def test_the_key_figure_gives_the_exponent_with_its_interval(monkeypatch, tmp_path):
    result = _scan(monkeypatch, tmp_path, None)
    m = result.metrics
    figure = scan_mod.Scan().key_figures([result])[0]
    assert f"{m.exponent_ci[0]:.2f} .. {m.exponent_ci[1]:.2f}" in figure.value


def test_a_point_that_keeps_an_undisturbed_run_leaves_the_step_undisturbed(monkeypatch, tmp_path):
    """The figures stand on the quiet runs: the step is not disturbed, and says which run it left out."""
    result = _scan(monkeypatch, tmp_path, 4096.0, shaken_repeats=(1,))
    top = [p for p in result.metrics.points if p.value == 4096][0]
    assert top.disturbed == 1 and top.passed == 2
    assert disturbed(encode(result)) is False
    assert result.interference["left_out"] == 1 and "left out" in result.interference["text"]


def test_a_point_with_only_disturbed_runs_leaves_the_step_disturbed(monkeypatch, tmp_path):
    """A point measured only under interference is missing from the exponent and the cliffs: what reads the scan's
    speed is inconclusive."""
    result = _scan(monkeypatch, tmp_path, 4096.0)
    assert disturbed(encode(result)) is True
    assert disturbed(encode(_scan(monkeypatch, tmp_path, None))) is False
