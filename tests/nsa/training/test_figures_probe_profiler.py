"""The profiler's trace files (nsa.training.metrics.profiler) are named by the training step they end at: a resumed
process (continuing from a checkpoint's step) names its trace by its own steps, so the earlier process's trace in
the same out_dir is kept, not replaced."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch
from torch.profiler import record_function

from nsa.training.metrics import profiler

CPU = torch.device("cpu")


def _train(out, steps: int, first_step: int, profile_start: int = 2, profile_steps: int = 2) -> None:
    """`steps` stand-in training steps of a process continuing from `first_step`, each under a range named by its
    training step, stepping the profiler after each as the trainer's loop does."""
    tc = SimpleNamespace(profile_steps=profile_steps, profile_start=profile_start)
    prof = profiler(tc, CPU, out, rank=0, first_step=first_step)
    x = torch.ones(8, 8)
    with prof:
        for step in range(first_step + 1, first_step + steps + 1):
            with record_function(f"train_step_{step}"):
                x = x @ x / 8
            prof.step()


def _steps_in(trace) -> set[int]:
    names = {e.get("name", "") for e in json.loads(trace.read_text())["traceEvents"]}
    return {int(n.rsplit("_", 1)[1]) for n in names if n.startswith("train_step_")}


def test_a_resumed_process_names_its_trace_by_the_training_step_it_ends_at(tmp_path):
    # continuing from step 10: steps 11, 12 wait and warm up (profile_start 2), 13 and 14 are traced
    _train(tmp_path, steps=5, first_step=10)
    traces = sorted(p.name for p in (tmp_path / "profile").iterdir())
    assert traces == ["trace_rank0_step14.json"]
    assert _steps_in(tmp_path / "profile" / "trace_rank0_step14.json") == {13, 14}


def test_the_earlier_processs_trace_survives_a_resume_in_the_same_out_dir(tmp_path):
    _train(tmp_path, steps=4, first_step=0)  # a fresh run: steps 3 and 4 traced
    _train(tmp_path, steps=4, first_step=4)  # resumed from step 4: steps 7 and 8 traced
    profile_dir = tmp_path / "profile"
    assert sorted(p.name for p in profile_dir.iterdir()) == ["trace_rank0_step4.json", "trace_rank0_step8.json"]
    assert _steps_in(profile_dir / "trace_rank0_step4.json") == {3, 4}
    assert _steps_in(profile_dir / "trace_rank0_step8.json") == {7, 8}
