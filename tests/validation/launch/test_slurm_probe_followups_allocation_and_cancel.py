"""Two corners of the Slurm launch: an extra #SBATCH line that sets what a launcher key writes (--cpus-per-task,
--gpus-per-node: sbatch takes the last value, so the job's allocation and the srun / GPU check that read the key
disagree), checked against `sbatch --test-only` on the test cluster; and a scancel that fails (the controller does
not answer, or refuses) against a fake scancel on PATH: tried again a bounded number of times, each failure noted."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from validation.launch import LaunchSpec, launch, slurm
from validation.launch.sbatch import SlurmOptions, batch_script, validate_sbatch_line
from validation.runbook.loader import RunbookError, load_runbook

ROOT = Path(__file__).resolve().parents[3]
JOB = "99999999"  # above Slurm's largest job id: a real scancel reached by mistake finds no such job

# (line, the launcher key it must name): the options themselves, with the value in the next word, and sbatch's
# abbreviations of them (the shortest it takes: --cpus-per- and --gpus-per- are ambiguous)
KEYED = [("--cpus-per-task=2", "cpus_per_task"), ("--cpus-per-task 2", "cpus_per_task"),
         ("--cpus-per-t=2", "cpus_per_task"), ("--cpus-per-tas=2", "cpus_per_task"),
         ("--gpus-per-node=1", "gpus_per_node"), ("--gpus-per-node 1", "gpus_per_node"),
         ("--gpus-per-n=1", "gpus_per_node"), ("--gpus-per-no=1", "gpus_per_node")]
# options beside them that no launcher key writes (and that give the job no GPUs: --gpus, --gpus-per-task and
# --gpus-per-socket are refused beside gpus_per_node, test_sbatch_gpu_lines_refused.py)
UNKEYED = ["--cpus-per-gpu=1", "--mem-per-cpu=100M", "--cpu-freq=high", "--exclusive"]


def _script(tmp: Path, options: SlurmOptions) -> str:
    return batch_script(job_name="nsav-t", nnodes=1, nproc_per_node=1, argv=[sys.executable, "-c", "pass"], env={},
                        cwd=tmp, log_path=tmp / "stdout.log", ranks_dir=tmp / "ranks", options=options,
                        python=sys.executable, torchrun=False)


@pytest.mark.parametrize("line,key", KEYED)
def test_a_line_setting_what_a_launcher_key_writes_is_refused_naming_the_key(tmp_path, line, key):
    """Refused whether the key is set (two values in the script: sbatch takes the line's, srun the key's) or not
    (an allocation the launch does not know of: no srun --cpus-per-task, a GPU check reading 0)."""
    problem = validate_sbatch_line(line)
    assert problem is not None and key in problem, problem
    for options in (SlurmOptions(sbatch=(line,)), SlurmOptions(cpus_per_task=1, gpus_per_node=1, sbatch=(line,))):
        with pytest.raises(ValueError, match=key):
            _script(tmp_path, options)


@pytest.mark.parametrize("line", UNKEYED)
def test_the_options_beside_them_still_pass(line):
    assert validate_sbatch_line(line) is None


def test_the_runbook_refuses_the_line_at_its_path(tmp_path):
    path = tmp_path / "rb.yaml"
    path.write_text(textwrap.dedent("""\
        name: t
        defaults:
          config: configs/tiny_cpu.yaml
          launcher: {type: slurm, cpus_per_task: 1, sbatch: ["--exclusive", "--cpus-per-task=2"]}
        phases:
          - name: p
            steps:
              - {name: a, kind: train}
        """))
    with pytest.raises(RunbookError) as err:
        load_runbook(path)
    assert "sbatch" in str(err.value) and "cpus_per_task" in str(err.value) and "rb.yaml:" in str(err.value)


def _cluster():
    from tests.validation.launch.test_slurm import require_cluster

    require_cluster()


def _test_only(tmp: Path, lines: list[str], env: dict[str, str] | None = None) -> str:
    """What `sbatch --test-only` (no job is queued) says of a one-node, one-task script with these #SBATCH lines."""
    script = tmp / "t.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --job-name=nsav-test-only\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n"
                      "#SBATCH --output=/dev/null\n" + "".join(f"#SBATCH {line}\n" for line in lines) + "true\n")
    out = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=30,
                         env=env)
    return (out.stdout + out.stderr).strip()


def test_sbatch_reads_the_refused_lines_over_the_keys_own_line(tmp_path):
    """The reference: after the key's own line (--cpus-per-task=1), a refused CPU line gives the job both CPUs of a
    test node (srun would still ask for 1); a refused GPU line asks for GPUs (a GRES error on this GPU-less
    cluster), where the key's --gpus-per-node=0 alone does not."""
    _cluster()
    for line, _ in KEYED:
        if "cpus" in line:
            got = _test_only(tmp_path, ["--cpus-per-task=1", line])
            assert "using 2 processors" in got, (line, got)
        else:
            assert "using 1 processors" in _test_only(tmp_path, ["--gpus-per-node=0"])
            got = _test_only(tmp_path, ["--gpus-per-node=0", line])
            assert "generic resource" in got, (line, got)
    for line in ("--exclusive", "--mem-per-cpu=100M"):
        got = _test_only(tmp_path, ["--cpus-per-task=1", line])
        assert re.search(r"using \d+ processors", got), (line, got)


def test_a_users_sbatch_gpus_per_node_does_not_replace_the_runbooks(tmp_path, monkeypatch):
    """sbatch takes SBATCH_GPUS_PER_NODE over the script's #SBATCH --gpus-per-node (its documented order, and what
    the cluster test below shows): it is not handed to sbatch; the user's other defaults are."""
    seen = {}

    def fake_run(argv, env=None, cwd=None):
        seen.update(env or {})
        return f"{JOB}\n"

    monkeypatch.setattr(slurm, "_run", fake_run)
    env = {"PATH": "/usr/bin", "SBATCH_GPUS_PER_NODE": "1", "SBATCH_ACCOUNT": "myproj"}
    assert slurm.submit(tmp_path / "job.sbatch", env, tmp_path) == JOB
    assert "SBATCH_GPUS_PER_NODE" not in seen and seen["SBATCH_ACCOUNT"] == "myproj"


def test_sbatch_itself_takes_the_variable_over_the_scripts_line(tmp_path):
    _cluster()
    # the script asks for 1 GPU per node (refused on this GPU-less cluster): the variable's 0 replaces it
    assert "generic resource" in _test_only(tmp_path, ["--gpus-per-node=1"])
    assert "using 1 processors" in _test_only(tmp_path, ["--gpus-per-node=1"],
                                              env={**os.environ, "SBATCH_GPUS_PER_NODE": "0"})


# ------------------------------------------------------------------------------------------ scancel that fails


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _fake_slurm(tmp: Path, fails: int, how: str) -> Path:
    """sbatch, squeue, scontrol and scancel for jobs that run until cancelled; scancel fails its first `fails` calls
    (`how`: "error", the controller refuses; "silent", it never answers). Every scancel call appends its job id to
    state/scancel; a cancelled job has state/cancelled.<id>."""
    state = tmp / "state"
    state.mkdir()
    _executable(tmp / "bin" / "sbatch", f"#!/bin/bash\necho {JOB}\n")
    _executable(tmp / "bin" / "squeue", textwrap.dedent(f"""\
        #!/bin/bash
        while [ $# -gt 0 ]; do [ "$1" = -j ] && job=$2; shift; done
        [ -n "$job" ] && [ ! -e {state}/cancelled.$job ] && echo RUNNING
        exit 0
        """))
    _executable(tmp / "bin" / "scontrol", textwrap.dedent(f"""\
        #!/bin/bash
        job=${{@: -1}}
        if [ -e {state}/cancelled.$job ]; then s=CANCELLED; c=0:15; else s=RUNNING; c=0:0; fi
        echo "JobId=$job JobName=nsav-t UserId=u(1) JobState=$s Reason=None ExitCode=$c NodeList=(null)"
        """))
    failing = {"error": 'echo "scancel: error: Kill job error on job id $job: Socket timed out" >&2; exit 1',
               "silent": "exec sleep 30"}[how]
    _executable(tmp / "bin" / "scancel", textwrap.dedent(f"""\
        #!/bin/bash
        job=${{@: -1}}
        echo "$job" >> {state}/scancel
        if [ "$(wc -l < {state}/scancel)" -le {fails} ]; then {failing}; fi
        touch {state}/cancelled.$job
        """))
    return state


@pytest.fixture
def fast_slurm(monkeypatch):
    """Slurm commands that do not answer give up after 0.3 s, and cancel retries pause 0.05 s."""
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 0.3)
    monkeypatch.setattr(slurm, "CANCEL_PAUSE_S", 0.05, raising=False)


@pytest.mark.parametrize("how", ["error", "silent"])
def test_a_failed_scancel_on_timeout_is_tried_again_until_the_job_is_cancelled(tmp_path, monkeypatch, fast_slurm,
                                                                               how):
    state = _fake_slurm(tmp_path, fails=2, how=how)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    step = tmp_path / "step"
    result = launch(LaunchSpec(argv=[sys.executable, "-c", "pass"], env=dict(os.environ), cwd=ROOT, step_dir=step,
                               launcher="slurm", poll_s=0.05, term_grace_s=0.1, timeout_s=0.5))
    assert result.status == "timeout", result.reason
    assert (state / "scancel").read_text().split() == [JOB] * 3
    assert (state / f"cancelled.{JOB}").exists(), "the job was left running"
    log = (step / "stdout.log").read_text()
    assert f"scancel {JOB} (attempt 1 of 3)" in log and f"scancel {JOB} (attempt 2 of 3)" in log, log
    assert "done at attempt 3 of 3" in log, log


def test_a_stale_jobs_failed_scancel_is_tried_again(tmp_path, monkeypatch, fast_slurm):
    """The job an earlier (killed) run of the step left running: cancelled before the new one is submitted."""
    state = _fake_slurm(tmp_path, fails=1, how="error")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    old = "99999997"
    step = tmp_path / "step"
    step.mkdir()
    (step / "slurm_job.json").write_text(f'{{"job_id": "{old}", "state": "SUBMITTED"}}')
    result = launch(LaunchSpec(argv=[sys.executable, "-c", "pass"], env=dict(os.environ), cwd=ROOT, step_dir=step,
                               launcher="slurm", poll_s=0.05, term_grace_s=0.1, timeout_s=0.5))
    assert result.status == "timeout", result.reason
    assert (state / "scancel").read_text().split() == [old, old, JOB]
    assert (state / f"cancelled.{old}").exists(), "the earlier job was left running"


@pytest.mark.parametrize("how", ["error", "silent"])
def test_a_scancel_that_always_fails_is_given_up_after_a_bounded_number_of_tries(tmp_path, monkeypatch, fast_slurm,
                                                                                  how):
    state = _fake_slurm(tmp_path, fails=100, how=how)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    log_path = tmp_path / "stdout.log"
    assert slurm.cancel_retried(JOB, log_path) is False
    assert (state / "scancel").read_text().split() == [JOB] * slurm.CANCEL_ATTEMPTS
    log = log_path.read_text()
    assert [f"(attempt {i} of {slurm.CANCEL_ATTEMPTS})" in log for i in range(1, slurm.CANCEL_ATTEMPTS + 1)] \
        == [True] * slurm.CANCEL_ATTEMPTS, log
    assert f"could not cancel Slurm job {JOB}" in log and "may still be running" in log, log
