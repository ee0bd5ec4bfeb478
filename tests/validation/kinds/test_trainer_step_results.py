"""The train, longrun, profile and scaling kinds' step records (each kind's Result, validation.results.codec): every
step of each in the committed runs (reports/**/results.json) decodes strictly into its Result and encodes back to
the same JSON, numbers of the same JSON type; the hand-made example (tests/validation/fixtures/results_example.json,
older than some keys a trainer launch's metrics always hold now) decodes strictly and encodes back every key it has
unchanged. A damaged step reads leniently and still renders."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation import kinds
from validation.results.codec import decode, encode
from results_records import COMMITTED_RUNS, FIXTURE_RUNS, committed_steps

REPO = Path(__file__).resolve().parents[3]
KINDS = ("train", "longrun", "profile", "scaling")


@pytest.mark.parametrize("kind", KINDS)
def test_every_committed_step_of_the_kind_decodes_strictly_into_its_result_and_encodes_back_unchanged(kind):
    impl = kinds.get(kind)
    seen = 0
    for where, step in committed_steps(kind, COMMITTED_RUNS):
        result = decode(impl.result_type, step, where)
        assert json.dumps(encode(result)) == json.dumps(step), where
        assert impl.read(step) == result, where  # the report's lenient reading of a sound record: the same record
        seen += 1
    assert seen >= 1


def _holds(encoded, written, where: str) -> None:
    """Every key of `written` is in `encoded` with the same value (lists item by item)."""
    if isinstance(written, dict):
        assert isinstance(encoded, dict), where
        for key, value in written.items():
            assert key in encoded, f"{where}.{key}"
            _holds(encoded[key], value, f"{where}.{key}")
    elif isinstance(written, list):
        assert isinstance(encoded, list) and len(encoded) == len(written), where
        for i, (a, b) in enumerate(zip(encoded, written)):
            _holds(a, b, f"{where}[{i}]")
    else:
        assert json.dumps(encoded) == json.dumps(written), where


def test_every_step_of_the_kinds_in_the_fixtures_decodes_strictly_and_keeps_its_keys():
    seen = set()
    for kind in KINDS:
        impl = kinds.get(kind)
        for where, step in committed_steps(kind, FIXTURE_RUNS):
            _holds(encode(decode(impl.result_type, step, where)), step, where)
            seen.add(kind)
    assert seen >= {"train", "longrun", "profile"}


SCALING_RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5, batch_size: 4}, nproc_per_node: 2}
phases:
  - name: p
    steps:
      - {name: sc, kind: scaling, world_sizes: [1, 2], modes: [weak, strong], repeats: 2}
"""


def test_a_scaling_step_builds_its_tables_from_its_runs(tmp_path, monkeypatch):
    """run() as the runner calls it (a stand-in context; the launches' runs given): the metrics a table per mode
    (strong before weak), each row's per-rank batch and, where the runs know the device peak, their mean MFU; the
    runs, the run order and its seed; a run that failed is left out of its point and named in the reason."""
    from validation.kinds import scaling
    from validation.kinds.trainer import Runs
    from validation.runbook.loader import load_runbook
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun, RunContext, Stat

    path = tmp_path / "rb.yaml"
    path.write_text(SCALING_RB)
    step = load_runbook(path, cwd=str(REPO)).step("sc")
    kind = kinds.get("scaling")
    specs = kind.launches(step, {}, tmp_path / "run")
    toks = {"weak_n1": 1000.0, "weak_n2": 1800.0, "strong_n1": 1000.0, "strong_n2": 1500.0}
    runs = [LaunchRun(label=s.label, params=dict(s.params), status="failed" if (s.label, s.repeat) == ("strong_n2", 1)
                      else "passed", reason=None, dir=s.dir, command=["torchrun"], repeat=s.repeat,
                      metrics=LaunchMetrics(toks_per_s=Stat(mean=toks[s.label] + 100.0 * s.repeat),
                                            mfu=Stat(mean=0.25) if s.label == "weak_n2" else None,
                                            context=RunContext(device="cuda:0"))) for s in specs]
    monkeypatch.setattr(scaling, "run_all", lambda ctx: Runs(runs, problems=["strong_n2: lost"]))
    ctx = SimpleNamespace(step=step, launches=specs, run_dir=tmp_path / "run", save=lambda partial=None: None)
    result = kind.run(step.options, ctx)
    assert isinstance(result, scaling.Result) and (result.status, result.reason) == ("failed", "strong_n2: lost")
    out = encode(result)
    assert out["runs"] == [encode(r) for r in runs] and out["order"] == [s.label for s in specs]
    assert out["order_seed"] == scaling.order_seed(step, tmp_path / "run")
    # a point's tokens/s over its repeats is their work over their time: the harmonic mean of equal-work windows
    n1, weak2 = 2 / (1 / 1000 + 1 / 1100), 2 / (1 / 1800 + 1 / 1900)
    # each efficiency's 95% interval from the repeats' spread of log tokens/s, pooled over the three points with two
    # passed runs (a pair's squared deviations: log-ratio^2 / 2; 3 df, t(0.975, 3) = 3.182446); strong's 2 ranks have
    # one run: the standard error of its log efficiency is s sqrt(1/2 + 1/1), weak's s sqrt(1/2 + 1/2)
    s = math.sqrt((2 * math.log(1.1) ** 2 / 2 + math.log(1900 / 1800) ** 2 / 2) / 3)
    e_strong, e_weak = 1500.0 / (2 * n1), weak2 / (2 * n1)
    lo_s, hi_s = (e_strong * math.exp(k * 3.182446305 * s * math.sqrt(1.5)) for k in (-1, 1))
    lo_w, hi_w = (e_weak * math.exp(k * 3.182446305 * s) for k in (-1, 1))
    assert out["metrics"] == {
        "world_sizes": [1, 2], "runs": 8, "passed": 7, "repeats": 2, "device": "cuda",
        "strong": {"mode": "strong", "base": 1, "rows": [
            {"world_size": 1, "toks_per_s": pytest.approx(n1), "speedup": 1.0, "efficiency": 1.0, "batch_per_rank": 8},
            {"world_size": 2, "toks_per_s": 1500.0, "speedup": pytest.approx(1500.0 / n1),
             "efficiency": pytest.approx(1500.0 / (2 * n1)), "batch_per_rank": 4,
             "efficiency_low": pytest.approx(lo_s), "efficiency_high": pytest.approx(hi_s)}],
                   "efficiency": {"min": pytest.approx(1500.0 / (2 * n1)), "last": pytest.approx(1500.0 / (2 * n1)),
                                  "min_low": pytest.approx(lo_s), "min_high": pytest.approx(hi_s),
                                  "last_low": pytest.approx(lo_s), "last_high": pytest.approx(hi_s)},
                   "global_batch": 8},
        "weak": {"mode": "weak", "base": 1, "rows": [
            {"world_size": 1, "toks_per_s": pytest.approx(n1), "speedup": 1.0, "efficiency": 1.0, "batch_per_rank": 4},
            {"world_size": 2, "toks_per_s": pytest.approx(weak2), "speedup": pytest.approx(weak2 / n1),
             "efficiency": pytest.approx(weak2 / (2 * n1)), "batch_per_rank": 4, "mfu": 0.25,
             "efficiency_low": pytest.approx(lo_w), "efficiency_high": pytest.approx(hi_w)}],
                 "efficiency": {"min": pytest.approx(weak2 / (2 * n1)), "last": pytest.approx(weak2 / (2 * n1)),
                                "min_low": pytest.approx(lo_w), "min_high": pytest.approx(hi_w),
                                "last_low": pytest.approx(lo_w), "last_high": pytest.approx(hi_w)}},
        "noise": {"source": "repeats", "sd": pytest.approx(s), "df": 3.0, "detail": out["metrics"]["noise"]["detail"]}}
    assert list(out["metrics"]) == ["world_sizes", "runs", "passed", "repeats", "device", "strong", "weak", "noise"]
    assert kind.summary_line(result) == (f" (strong efficiency min 0.7159 (95% CI {lo_s:.4g}..{hi_s:.4g}); weak "
                                         f"efficiency min 0.8823 (95% CI {lo_w:.4g}..{hi_w:.4g}))")
