"""LaunchSpec validation: a spec that cannot be launched is refused before anything is written or started (no
command.json, no child), and the machine requirements against hand-written environment records."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

from validation.launch import LaunchSpec, launch
from validation.launch.environment import unmet
from validation.runbook.model import Requirements


def _spec(tmp_path: Path, **kw) -> LaunchSpec:
    marker = tmp_path / "child_ran"
    argv = [sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"]
    return LaunchSpec(argv=argv, env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, cwd=tmp_path,
                      step_dir=tmp_path / "step", timeout_s=30.0, poll_s=0.05, **kw)


def _nothing_happened(tmp_path: Path) -> None:
    assert not (tmp_path / "step" / "command.json").exists()
    assert not (tmp_path / "child_ran").exists()


def test_a_nan_telemetry_interval_is_refused_before_the_child_starts(tmp_path):
    # NaN is not > 0: refused as 0 or -1 is, not found out by the sampler once the child is running
    with pytest.raises(ValueError, match="telemetry_s"):
        launch(_spec(tmp_path, telemetry_s=math.nan))
    _nothing_happened(tmp_path)


@pytest.mark.parametrize("wrapper", ["nsys", ["nsys", 1], ("nsys", None)])
def test_a_wrapper_that_is_not_a_list_of_str_is_refused_before_command_json(tmp_path, wrapper):
    # a string would run as its letters ("n", "s", ...), a number fails in Popen after command.json was written
    with pytest.raises(TypeError, match="wrapper"):
        launch(_spec(tmp_path, wrapper=wrapper))
    _nothing_happened(tmp_path)


def test_a_list_wrapper_still_runs_the_command_under_it(tmp_path):
    result = launch(_spec(tmp_path, wrapper=["env"]))
    assert result.status == "ok" and result.argv[0] == "env", result
    assert (tmp_path / "child_ran").exists()


# ---------------------------------------------------------------------------------------------- requirements
def _gpu(capability: float, memory_gb: float) -> dict:
    return {"name": "GPU", "capability": capability, "memory_gb": memory_gb}


NO_GPU = {"gpu_count": 0, "gpus": [], "nccl": None}
MIXED = {"gpu_count": 2, "gpus": [_gpu(9.0, 79.18), _gpu(7.0, 15.77)], "nccl": "2.21.5"}


@pytest.mark.parametrize("req, nproc, env, reason", [
    (Requirements(gpus=1), 1, NO_GPU, "needs 1 GPU(s), found 0"),
    (Requirements(backend="nccl"), 2, NO_GPU, "needs 2 GPU(s), found 0"),  # NCCL: a GPU per rank
    (Requirements(min_cuda_capability=8.0), 1, NO_GPU, "needs CUDA capability >= 8, found no GPU"),
    (Requirements(min_gpu_memory_gb=40), 1, NO_GPU, "needs GPUs with >= 40 GiB, found no GPU"),
    # the first device is the one a one-GPU step uses: 9.0 and 79.18 GiB meet both
    (Requirements(gpus=1, min_cuda_capability=8.0, min_gpu_memory_gb=40), 1, MIXED, None),
    # two GPUs: the weaker second one decides
    (Requirements(gpus=2, min_cuda_capability=8.0), 1, MIXED, "needs CUDA capability >= 8, found 7"),
    (Requirements(gpus=2, min_gpu_memory_gb=40), 1, MIXED, "needs GPUs with >= 40 GiB, found 15.77 GiB"),
    (Requirements(backend="nccl"), 2, {**MIXED, "nccl": None}, "needs the NCCL backend"),
    (Requirements(backend="nccl"), 3, MIXED, "needs 3 GPU(s), found 2"),
    (Requirements(backend="gloo"), 4, NO_GPU, None),  # gloo runs on CPU ranks
])
def test_requirements_against_hand_written_machine_records(req, nproc, env, reason):
    got = unmet(req, env, nproc)
    assert (got is None) if reason is None else (got is not None and got.startswith(reason)), got


def test_a_cpu_step_does_not_probe_the_machine():
    def probe():
        raise AssertionError("probed")

    assert unmet(Requirements(backend="gloo"), probe, 2) is None


def test_a_comm_step_and_a_scaling_step_need_a_gpu_for_each_of_their_ranks(tmp_path):
    """ddp_2xa100's comm step runs nproc_per_node NCCL ranks, and a scaling step its largest world size, on this
    machine; the check counted one GPU for any step that is not a trainer, so on a machine of one GPU the comm step
    ran and failed instead of being skipped (the parallelism step beside it was skipped)."""
    from validation.launch.environment import unmet_for
    from validation.runbook.loader import load_runbook

    text = (Path(__file__).resolve().parents[3] / "runbooks" / "ddp_2xa100.yaml").read_text()
    path = tmp_path / "ddp_2xa100.yaml"
    path.write_text(text.replace("  gpus: 2\n", "  gpus: 1\n", 1))
    rb = load_runbook(path, cwd=Path(__file__).resolve().parents[3])
    one = {"gpu_count": 1, "gpus": [_gpu(8.0, 79.15)], "nccl": "2.21.5"}
    assert unmet_for(rb.step("comm"), one) == "needs 2 GPU(s), found 1"
    assert unmet_for(rb.step("parallelism"), one) == "needs 2 GPU(s), found 1"
    two = {**one, "gpu_count": 2, "gpus": [_gpu(8.0, 79.15)] * 2}
    assert unmet_for(rb.step("comm"), two) is None
