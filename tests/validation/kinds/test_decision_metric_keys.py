"""The metric a sweep selects on (`select: {metric}`) and the one an A/B compares (`metric`) are checked when the
runbook is loaded: a name that measures nothing (a typo) would leave every run without a value, and the step
would pass having compared nothing; an A/B metric without a better direction (grad_norm, lr) would be taken as
"higher is better" and could recommend a setting for a larger gradient norm. Both are exit 2 naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from validation.runbook.loader import RunbookError, load_runbook

REPO = Path(__file__).resolve().parents[3]
HEAD = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5}, nproc_per_node: 1}
phases:
  - name: p
    steps:
"""
SWEEP = HEAD + """\
      - {name: sw, kind: sweep, matrix: {env.NSA_DDP_BUCKET_MB: [25, 50]}, select: {metric: %s, goal: max}}
"""
AB = HEAD + """\
      - name: pick
        kind: ab
        baseline: {env: {NSA_PREFILL_BATCHED: "0"}}
        variants: {batched: {env: {NSA_PREFILL_BATCHED: "1"}}}
        metric: %s
"""


def _load(tmp_path: Path, text: str):
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    return load_runbook(path, cwd=str(REPO))


@pytest.mark.parametrize("metric", ["toks_per_sec", "grad_norm", "lr"])
def test_an_ab_metric_without_a_better_direction_is_refused(tmp_path, metric):
    with pytest.raises(RunbookError) as err:
        _load(tmp_path, AB % metric)
    text = str(err.value)
    assert "metric" in text and repr(metric) in text and "toks_per_s" in text


@pytest.mark.parametrize("metric", ["toks_per_s", "step_time_s", "loss", "mem_peak_gb"])
def test_an_ab_metric_with_a_direction_loads(tmp_path, metric):
    step = _load(tmp_path, AB % metric).steps()[0]
    assert step.options.metric == metric


def test_a_sweep_metric_that_measures_nothing_is_refused(tmp_path):
    with pytest.raises(RunbookError) as err:
        _load(tmp_path, SWEEP % "toks_per_sec")
    assert "select" in str(err.value) and "'toks_per_sec'" in str(err.value)


@pytest.mark.parametrize("metric", ["toks_per_s", "step_time_s", "loss", "grad_norm", "toks_per_s_per_gpu"])
def test_a_sweep_metric_that_is_measured_loads(tmp_path, metric):
    step = _load(tmp_path, SWEEP % metric).steps()[0]
    assert step.options.select_metric == metric
