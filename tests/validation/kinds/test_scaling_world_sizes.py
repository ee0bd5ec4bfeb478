"""The scaling kind's world sizes: an efficiency is a world size's throughput against the smallest's, so one world
size alone measures no scaling: a runbook error at load (one message naming the key), not a step that runs every
launch and leaves `scaling.weak.efficiency.min` null for a criterion to stumble on after the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from validation.runbook.loader import RunbookError, load_runbook

REPO = Path(__file__).resolve().parents[3]
RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5, batch_size: 4}, nproc_per_node: 1}
phases:
  - name: p
    steps:
      - {name: sc, kind: scaling, world_sizes: %s, modes: [weak]}
acceptance:
  - {name: weak, expr: "sc.weak.efficiency.min >= 0.8", target: ">= 0.8"}
"""


def _load(tmp_path, sizes: str):
    path = tmp_path / "rb.yaml"
    path.write_text(RB % sizes)
    return load_runbook(path, cwd=str(REPO))


@pytest.mark.parametrize("sizes", ["[1]", "[8]"])
def test_one_world_size_is_a_runbook_error(tmp_path, sizes):
    with pytest.raises(RunbookError) as info:
        _load(tmp_path, sizes)
    assert "world_sizes" in str(info.value) and "at least two world sizes" in str(info.value)


def test_two_world_sizes_load(tmp_path):
    assert _load(tmp_path, "[2, 1]").step("sc").world_sizes == [1, 2]
