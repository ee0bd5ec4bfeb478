"""Extra #SBATCH lines that would give a Slurm job GPUs beside the launcher key gpus_per_node (the job's own
--gpus-per-node line, and the only GPU count a step's GPU check reads): --gres with a GPU (or a share of one: mps,
shard), --gpus, --gpus-per-task / --gpus-per-socket (one task per node: per node), --ntasks-per-gpu, Slurm 23.11's
--tres-per-task, and a --gpu-bind that hides GPUs from the node's one task. Refused naming the line; the options
beside them that do not change the GPUs (a GRES of another name, --gres-flags, --gpu-freq, --mem-per-gpu, a binding
of none) still pass. The reference for what sbatch reads as a GPU request is sbatch itself: on the test cluster's
configuration (no GRES at all) it refuses every GPU request before it asks the controller."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from validation.launch import slurm
from validation.launch.sbatch import SlurmOptions, batch_script, validate_sbatch_line
from validation.runbook.loader import RunbookError, load_runbook

JOB = "99999999"
TEST_CLUSTER_CONF = Path("/etc/slurm/slurm.conf")
TEST_CLUSTER_MARKER = "# written by nsa-validate .ci/slurm-cluster"

# (line, what the refusal must name): GPUs beside gpus_per_node, with the value in the same word or the next, and
# the abbreviations sbatch takes (--gpus-per-t: --gpus-per- is ambiguous)
GPU_LINES = [("--gres=gpu:2", "gpus_per_node"), ("--gres gpu:2", "gpus_per_node"), ("--gres=gpu", "gpus_per_node"),
             ("--gres=gpu:a100:1", "gpus_per_node"), ("--gres=nvme:1,gpu:1", "gpus_per_node"),
             ("--gres=gres/gpu:1", "gpus_per_node"), ("--gres=mps:50", "gpus_per_node"),
             ("--gres=shard:2", "gpus_per_node"), ("--gpus=8", "gpus_per_node"), ("--gpus 8", "gpus_per_node"),
             ("--gpus-per-task=8", "gpus_per_node"), ("--gpus-per-t=8", "gpus_per_node"),
             ("--gpus-per-socket=4", "gpus_per_node"), ("--gpus-per-s=4", "gpus_per_node"),
             ("--ntasks-per-gpu=1", "one task per node"), ("--ntasks-per-g=1", "one task per node"),
             ("--ntasks-per-tres=1", "one task per node"),
             ("--tres-per-task=gres/gpu=1", "gpus_per_node"), ("--tres-per-task=cpu=4", "cpus_per_task"),
             ("--gpu-bind=closest", "hide GPUs"), ("--gpu-bind=map_gpu:0,1", "hide GPUs"),
             ("--gpu-b=single:1", "hide GPUs"), ("--gpu-bind verbose,closest", "hide GPUs"),
             ("--tres-bind=gres/gpu:closest", "hide GPUs"),
             ("--tres-bind=gres/nic:closest+gres/gpu:single:1", "hide GPUs")]
PASSING = ["--gres=nvme:1", "--gres-flags=enforce-binding", "--gpu-freq=high", "--mem-per-gpu=10G",
           "--gpu-bind=none", "--gpu-bind=verbose,none", "--tres-per-task=gres/nvme:1",
           "--tres-bind=gres/nic:closest", "--exclusive", "--qos=high"]


def _script(tmp: Path, options: SlurmOptions) -> str:
    return batch_script(job_name="nsav-t", nnodes=1, nproc_per_node=8, argv=[sys.executable, "-c", "pass"], env={},
                        cwd=tmp, log_path=tmp / "stdout.log", ranks_dir=tmp / "ranks", options=options,
                        python=sys.executable, torchrun=False)


@pytest.mark.parametrize("line,named", GPU_LINES)
def test_a_line_giving_the_job_gpus_beside_the_key_is_refused(tmp_path, line, named):
    problem = validate_sbatch_line(line)
    assert problem is not None and named in problem, problem
    for options in (SlurmOptions(sbatch=(line,)), SlurmOptions(gpus_per_node=8, cpus_per_task=4, sbatch=(line,))):
        with pytest.raises(ValueError, match="sbatch line") as err:
            _script(tmp_path, options)
        assert repr(line) in str(err.value) and named in str(err.value)


def test_the_short_option_g_is_refused_as_not_one_long_option():
    assert "one long option" in validate_sbatch_line("-G 8")


@pytest.mark.parametrize("line", PASSING)
def test_the_gpu_options_that_change_no_gpu_count_still_pass(tmp_path, line):
    assert validate_sbatch_line(line) is None
    assert f"#SBATCH {line}\n" in _script(tmp_path, SlurmOptions(gpus_per_node=8, sbatch=(line,)))


def test_the_runbook_refuses_a_gres_gpu_line_at_its_path(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent("""\
        name: t
        defaults:
          config: configs/tiny_cpu.yaml
          launcher: {type: slurm, gpus_per_node: 0, sbatch: ["--exclusive", "--gres=gpu:8"]}
        phases:
          - name: p
            steps:
              - {name: a, kind: train}
        """))
    with pytest.raises(RunbookError) as err:
        load_runbook(path)
    assert "gres=gpu:8" in str(err.value) and "gpus_per_node" in str(err.value) and "rb.yaml:" in str(err.value)


def test_sbatch_gets_no_input_variable_that_gives_the_job_gpus_beside_the_key(tmp_path, monkeypatch):
    """sbatch takes its input variables over the script's lines: those of the refused GPU options are not handed to
    it; a GRES default of another resource, a binding of none and the user's other defaults are."""
    seen = {}

    def fake_run(argv, env=None, cwd=None):
        seen.update(env or {})
        return f"{JOB}\n"

    monkeypatch.setattr(slurm, "_run", fake_run)
    dropped = {"SBATCH_GPUS": "8", "SBATCH_GPUS_PER_TASK": "8", "SBATCH_GPUS_PER_SOCKET": "4",
               "SBATCH_GRES": "nvme:1,gpu:8", "SBATCH_GPU_BIND": "closest"}
    assert slurm.submit(tmp_path / "job.sbatch", {"PATH": "/usr/bin", "SBATCH_ACCOUNT": "p", **dropped},
                        tmp_path) == JOB
    assert not set(dropped) & set(seen) and seen["SBATCH_ACCOUNT"] == "p"
    kept = {"SBATCH_GRES": "nvme:1", "SBATCH_GPU_BIND": "none"}
    seen.clear()
    slurm.submit(tmp_path / "job.sbatch", {"PATH": "/usr/bin", **kept}, tmp_path)
    assert {k: seen.get(k) for k in kept} == kept


def _sbatch_says(tmp: Path, args: list[str]) -> str:
    out = subprocess.run(["sbatch", "--test-only", *args, "--wrap", "true"], capture_output=True, text=True,
                         timeout=30, cwd=tmp)
    return (out.stdout + out.stderr).strip()


@pytest.mark.parametrize("line", [line for line, named in GPU_LINES if named != "hide GPUs" and "tres" not in line
                                  and "nvme" not in line])
def test_sbatch_itself_reads_the_refused_lines_as_gpu_requests(tmp_path, line):
    """The reference: the test cluster's configuration has no GRES, and sbatch refuses a GPU request there before it
    asks the controller (no job is queued). It reads each refused line (the abbreviations too) as one: none is an
    option sbatch does not know or finds ambiguous. (--tres-per-task and --tres-bind are Slurm 23.11's and later;
    the binding requests no GPUs.)"""
    if not slurm.available() or TEST_CLUSTER_MARKER not in (TEST_CLUSTER_CONF.read_text()
                                                            if TEST_CLUSTER_CONF.is_file() else ""):
        pytest.skip("needs sbatch with the test cluster's configuration (.ci/slurm-cluster)")
    got = _sbatch_says(tmp_path, line.split())
    assert "generic resource" in got or "GRES GPU" in got, (line, got)
