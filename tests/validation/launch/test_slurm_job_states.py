"""The Slurm launcher against a fake Slurm (no cluster needed; seconds): how each ending of a job is handled (a
job left running by any exception, a job that never leaves PENDING, the stack-dump srun of a stall), and the
batch script's #SBATCH lines as sbatch reads them (quoting, %-patterns, abbreviated options, srun's CPUs); plus,
on the test cluster, a job whose paths and environment values hold spaces, quotes, $ and %."""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from validation.launch import LaunchSpec, launch, slurm
from validation.launch.sbatch import SlurmOptions, batch_script, validate_sbatch_line

ROOT = Path(__file__).resolve().parents[3]
JOB = "99999999"  # above Slurm's largest job id: a real srun/scancel reached by mistake finds no such job


class FakeSlurm:
    """sbatch / squeue / scontrol / scancel as validation.launch.slurm calls them: one job, RUNNING (or the state
    given) until scancel, then CANCELLED; every call is recorded in `calls`."""

    def __init__(self, monkeypatch, state: str = "RUNNING", reason: str = "None", job_id: str = JOB,
                 on_submit=None):
        self.state, self.reason, self.job_id, self.on_submit = state, reason, job_id, on_submit
        self.calls: list[str] = []
        self.cancelled = False
        monkeypatch.setattr(slurm, "submit", self.submit)
        monkeypatch.setattr(slurm, "queue_state", self.queue_state)
        monkeypatch.setattr(slurm, "job_info", self.job_info)
        monkeypatch.setattr(slurm, "cancel", self.cancel)

    def submit(self, script, env, cwd):
        self.calls.append("sbatch")
        if self.on_submit is not None:
            self.on_submit()
        return self.job_id

    def queue_state(self, job_id):
        self.calls.append("squeue")
        return None if self.cancelled else self.state

    def job_info(self, job_id):
        self.calls.append("scontrol")
        state = "CANCELLED" if self.cancelled else self.state
        return slurm.JobInfo(job_id=job_id, state=state, exit_code=0, signal=15 if self.cancelled else 0,
                             reason=self.reason, nodes=["nodeA"])

    def cancel(self, job_id, signal_name=None):
        self.calls.append("scancel")
        self.cancelled = True


def _spec(tmp_path, **kw) -> LaunchSpec:
    args = dict(argv=[sys.executable, "-c", "pass"], env=dict(os.environ), cwd=ROOT, step_dir=tmp_path,
                launcher="slurm", poll_s=0.05, term_grace_s=0.1, timeout_s=60)
    args.update(kw)
    return LaunchSpec(**args)


# ------------------------------------------------------------------------------------------ endings


def test_an_exception_in_the_progress_callback_cancels_the_job(tmp_path, monkeypatch):
    """Not only Ctrl-C: any exception while the job is followed (a failing callback, a full disk) cancels the job
    before it propagates, so no job outlives its launch."""
    fake = FakeSlurm(monkeypatch)

    def progress(p):
        raise RuntimeError("a bug in the progress display")

    with pytest.raises(RuntimeError, match="progress display"):
        launch(_spec(tmp_path, on_progress=progress))
    assert fake.calls.count("scancel") == 1 and fake.cancelled
    log = (tmp_path / "stdout.log").read_text()
    assert f"cancelling Slurm job {JOB}" in log and "RuntimeError" in log


def test_ctrl_c_still_cancels_and_says_interrupted(tmp_path, monkeypatch):
    fake = FakeSlurm(monkeypatch)

    def progress(p):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        launch(_spec(tmp_path, on_progress=progress))
    assert fake.calls.count("scancel") == 1
    assert f"interrupted (Ctrl-C to the launcher): cancelling Slurm job {JOB}" in (tmp_path / "stdout.log").read_text()


def test_a_job_pending_until_the_timeout_is_a_timeout_naming_slurms_reason(tmp_path, monkeypatch):
    fake = FakeSlurm(monkeypatch, state="PENDING", reason="QOSMaxJobsPerUserLimit")
    result = launch(_spec(tmp_path, timeout_s=0.3))
    assert result.status == "timeout" and fake.calls.count("scancel") == 1
    assert "PENDING" in result.reason and "QOSMaxJobsPerUserLimit" in result.reason, result.reason
    assert "never started" in result.reason and JOB in result.reason


def test_a_running_job_past_the_timeout_is_not_called_pending(tmp_path, monkeypatch):
    fake = FakeSlurm(monkeypatch, state="RUNNING")
    result = launch(_spec(tmp_path, timeout_s=0.3))
    assert result.status == "timeout" and fake.calls.count("scancel") == 1
    assert "PENDING" not in result.reason and "timed out after 0.3s" in result.reason


@pytest.mark.parametrize("state, status, words", [
    ("OUT_OF_MEMORY", "failed", "out of memory"),
    ("PREEMPTED", "failed", "preempted"),
    ("NODE_FAIL", "failed", "NODE_FAIL"),
    ("TIMEOUT", "timeout", "Slurm time limit"),
    ("CANCELLED", "failed", "cancelled outside nsa-validate"),
])
def test_a_job_that_ends_by_itself_takes_its_states_verdict(tmp_path, monkeypatch, state, status, words):
    """The job leaves the queue on its own; the final state comes from scontrol; nsa-validate cancels nothing."""
    fake = FakeSlurm(monkeypatch, state=state)
    fake.queue_state = lambda job_id: None
    monkeypatch.setattr(slurm, "queue_state", fake.queue_state)
    result = launch(_spec(tmp_path))
    assert result.status == status and words in result.reason, result.reason
    assert "scancel" not in fake.calls
    assert json.loads((tmp_path / "slurm_job.json").read_text())["state"] == state


# ------------------------------------------------------------------------------------------ a stall's stack dumps


def _fake_srun(bindir: Path, record: Path, out_dir: Path) -> None:
    """An `srun` that records its environment and writes rank 0's stack dump, as the watchdog would."""
    bindir.mkdir()
    srun = bindir / "srun"
    srun.write_text("#!/bin/sh\n"
                    f"env > {shlex.quote(str(record))}\n"
                    f"echo 'Current thread 0x1 (most recent call first):' > {shlex.quote(str(out_dir))}/stackdump_rank0.txt\n"
                    "exit 1\n")
    srun.chmod(srun.stat().st_mode | stat.S_IXUSR)


def test_the_stack_dump_srun_runs_with_the_launchs_whole_environment(tmp_path, monkeypatch):
    """A planned launch carries only the step's own variables (inherit_env): the `srun --overlap` that asks a
    stalled job's ranks for stack dumps must still run with this process's environment (PATH, where Slurm's
    commands are; SLURM_CONF ...), as the job itself does."""
    out_dir = tmp_path / "out"
    record = tmp_path / "srun.env"

    def stall():  # the trainer's rank 0 wrote one heartbeat, then nothing
        out_dir.mkdir(exist_ok=True)
        (out_dir / "heartbeat_rank0.jsonl").write_text(json.dumps(
            {"ts": time.time(), "rank": 0, "step": 1, "msg": "step", "pid": 1 << 30, "host": socket.gethostname()})
            + "\n")

    fake = FakeSlurm(monkeypatch, on_submit=stall)
    _fake_srun(tmp_path / "bin", record, out_dir)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NSAV_TEST_SITE_VARIABLE", "kept")
    for key, value in {"SLURM_JOB_ID": "424242", "SLURM_MEM_PER_CPU": "100", "SLURM_CONF": "/etc/slurm/slurm.conf"
                       }.items():  # run inside an allocation (salloc): its variables are not the job's
        monkeypatch.setenv(key, value)
    spec = _spec(tmp_path, env={"NSA_TB_DISABLE": "1"}, inherit_env=True, trainer_out_dir=out_dir,
                 stall_timeout_s=0.2, remote_dumps=True, expected_ranks=1)
    result = launch(spec)
    assert result.status == "hang" and fake.calls.count("scancel") == 1, result.reason
    assert record.exists(), "the fake srun on PATH was not the one run"
    env = dict(line.split("=", 1) for line in record.read_text().splitlines() if "=" in line)
    assert env.get("NSAV_TEST_SITE_VARIABLE") == "kept" and env.get("NSA_TB_DISABLE") == "1"
    assert "SLURM_MEM_PER_CPU" not in env and env.get("SLURM_JOB_ID") != "424242"
    assert env.get("SLURM_CONF") == "/etc/slurm/slurm.conf"  # a client setting, kept
    assert [p.name for p in result.stack_dumps] == ["stackdump_rank0.txt"]


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def test_ctrl_c_while_a_stale_job_is_cancelled_still_cancels_it(tmp_path):
    """A Ctrl-C in the terminal reaches the whole foreground process group: also the scancel of the job an earlier
    (killed) nsa-validate left running, which must still reach the controller. Slurm's commands run in sessions of
    their own, and nsa-validate's interrupt waits until the command has answered."""
    state = tmp_path / "state"
    state.mkdir()
    old = "99999997"
    _executable(tmp_path / "bin" / "squeue", f"#!/bin/bash\ncase \"$*\" in *'-j {old}'*)\n"
                f"  [ -e {state}/cancelled ] || echo RUNNING;;\nesac\n")
    _executable(tmp_path / "bin" / "scancel", f"#!/bin/bash\ntouch {state}/asked\nsleep 1\n"
                f"echo \"${{@: -1}}\" > {state}/cancelled\n")
    _executable(tmp_path / "bin" / "sbatch", "#!/bin/bash\necho no >&2\nexit 1\n")
    step = tmp_path / "step"
    step.mkdir()
    (step / "slurm_job.json").write_text(json.dumps({"job_id": old, "state": "SUBMITTED"}))
    code = ("import os, sys\nfrom pathlib import Path\nfrom validation.launch import LaunchSpec, launch\n"
            f"spec = LaunchSpec(argv=[sys.executable, '-c', 'pass'], env=dict(os.environ), cwd=Path({str(ROOT)!r}), "
            f"step_dir=Path({str(step)!r}), launcher='slurm', poll_s=0.05, term_grace_s=0.1, timeout_s=30)\n"
            "try:\n    launch(spec)\nexcept KeyboardInterrupt:\n    sys.exit(130)\n")
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))}
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 20
        while not (state / "asked").exists() and proc.poll() is None and time.monotonic() < end:
            time.sleep(0.02)
        assert (state / "asked").exists(), "the stale job's scancel never ran"
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C in the terminal: the foreground process group
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr[-2000:]
    assert (state / "cancelled").exists() and (state / "cancelled").read_text().strip() == old


# ------------------------------------------------------------------------------------------ the batch script


def _sbatch_value(line: str) -> str:
    """An #SBATCH option's value as sbatch's directive parser reads it (quotes removed, as in a shell word)."""
    return shlex.split(line.split("=", 1)[1])[0]


def _slurm_path(pattern: str) -> str:
    """What Slurm makes of an --output value: %% is a literal %, and %j (and the other letters) are replaced."""
    out, i = [], 0
    while i < len(pattern):
        if pattern[i] == "%" and i + 1 < len(pattern):
            out.append("%" if pattern[i + 1] == "%" else f"<{pattern[i + 1]}>")
            i += 2
        else:
            out.append(pattern[i])
            i += 1
    return "".join(out)


def _script(tmp: Path, **kw) -> str:
    args = dict(job_name="nsav-t", nnodes=2, nproc_per_node=2, argv=[sys.executable, "-m", "nsa.training"],
                env={}, cwd=tmp, log_path=tmp / "s" / "stdout.log", ranks_dir=tmp / "s" / "ranks",
                options=SlurmOptions(), python=sys.executable)
    args.update(kw)
    return batch_script(**args)


@pytest.mark.parametrize("name", ["100%", "run_%j_%N", "a b 'c' $d #e"])
def test_the_output_path_is_the_step_log_as_slurm_reads_it(tmp_path, name):
    log_path = tmp_path / name / "stdout.log"
    text = _script(tmp_path, log_path=log_path)
    line = next(s for s in text.splitlines() if s.startswith("#SBATCH --output="))
    assert _slurm_path(_sbatch_value(line)) == str(log_path)


def _agent_command(text: str) -> list[str]:
    """The command every node's task runs (after `bash -c '...' nsav-task`), as bash splits it."""
    tail = text.split("nsav-task", 1)[1].replace("\\\n", " ")
    return shlex.split(tail)


@pytest.mark.parametrize("argv, script", [
    ([sys.executable, "-m", "nsa.training", "--steps", "3"], "nsa.training"),
    ([sys.executable, "train.py", "--steps", "3"], "train.py"),
    ([sys.executable, "-c", "print(1)"], sys.executable),
    ([sys.executable, "-u", "train.py"], sys.executable),
    (["nsys", "profile", sys.executable, "-m", "nsa.training"], "nsys"),
])
def test_every_nodes_agent_command_is_one_torchrun_accepts(tmp_path, argv, script):
    """torchrun's own argument parser reads each node's command as the step's command under torchrun: a module, a
    script, or (`python -c`, `python -u`, a wrapper) a program run with --no-python, as a local launch runs it."""
    from torch.distributed.run import get_args_parser

    command = _agent_command(_script(tmp_path, argv=argv))
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    args = get_args_parser().parse_args(command[3:])  # exits (SystemExit) on an option torchrun does not know
    assert args.training_script == script and args.nnodes == "2" and args.nproc_per_node == "2"
    ran = ([sys.executable, "-m", args.training_script] if args.module else
           [args.training_script] if args.no_python else [sys.executable, args.training_script])
    assert ran + args.training_script_args == argv


@pytest.mark.parametrize("bad", ["line\nbreak", "back\\slash"])
def test_a_path_slurm_cannot_take_is_refused_in_words(tmp_path, bad):
    with pytest.raises(ValueError, match="newline|backslash"):
        _script(tmp_path, log_path=tmp_path / bad / "stdout.log")
    with pytest.raises(ValueError, match="working directory"):
        _script(tmp_path, cwd=tmp_path / bad)


def test_a_launch_into_such_a_directory_is_an_error_result_not_a_job(tmp_path, monkeypatch):
    fake = FakeSlurm(monkeypatch)
    step_dir = tmp_path / "line\nbreak"
    result = launch(_spec(step_dir))
    assert result.status == "error" and "newline" in result.reason and "sbatch" not in fake.calls


@pytest.mark.parametrize("line", ["--outp=/tmp/x", "--open=truncate", "--requ", "--job=x", "--ntasks=8", "--chd=/"])
def test_abbreviations_of_the_launchers_own_options_are_refused(tmp_path, line):
    """sbatch takes any unambiguous prefix of a long option: `--outp=/x` would move the job's output away."""
    assert validate_sbatch_line(line) is not None
    with pytest.raises(ValueError, match="sbatch line"):
        _script(tmp_path, options=SlurmOptions(sbatch=(line,)))


@pytest.mark.parametrize("line", ["--array=0-3", "--arr=1", "--array 0-1"])
def test_an_array_job_is_refused(line):
    """An array job would run the whole step once per index, into the same directory."""
    assert "array job" in (validate_sbatch_line(line) or "")


@pytest.mark.parametrize("line", ["--exclusive", "--qos=high", "--partition=gpu", "--part=gpu", "--mem=0",
                                  "--constraint=h100", "--reservation=r", "--time-min=10"])
def test_other_sbatch_options_pass(line):
    assert validate_sbatch_line(line) is None


@pytest.mark.parametrize("torchrun", [True, False])
def test_srun_asks_for_the_jobs_cpus_per_task(tmp_path, torchrun):
    """Since Slurm 22.05 srun does not take --cpus-per-task from the job: it must say it again."""
    text = _script(tmp_path, options=SlurmOptions(cpus_per_task=16), torchrun=torchrun)
    srun = [s for s in text.splitlines() if s.startswith("srun ")]
    assert len(srun) == 1 and "--cpus-per-task=16" in srun[0].split(), srun
    assert "#SBATCH --cpus-per-task=16" in text.splitlines()
    plain = _script(tmp_path, torchrun=torchrun)
    assert "cpus-per-task" not in plain


# ------------------------------------------------------------------------------------------ on the test cluster


@pytest.fixture()
def cluster():
    from tests.validation.launch.test_slurm import require_cluster

    require_cluster()


def test_a_job_with_awkward_paths_and_values_runs_and_logs_where_expected(cluster, tmp_path):
    """A step directory with a space, quotes, $ and a Slurm %-pattern, and an environment value with quotes, $,
    backquotes and a newline: the job writes its output to the step's stdout.log and sees the value verbatim."""
    step_dir = tmp_path / "run 'a' \"b\" $HOME %j"
    value = "x 'q' \"d\" $HOME `id` %j\nsecond line"
    spec = LaunchSpec(argv=[sys.executable, "-c", "import os; print('VALUE=' + repr(os.environ['NSAV_TEST_AWKWARD']))"],
                      env={"NSAV_TEST_AWKWARD": value}, inherit_env=True, cwd=ROOT, step_dir=step_dir,
                      launcher="slurm", job_name="nsav-awkward", timeout_s=120, poll_s=0.5)
    result = launch(spec)
    assert result.status == "ok", result.reason
    log = (step_dir / "stdout.log").read_text()
    assert f"VALUE={value!r}" in log
    assert slurm.queue_state(result.job_id) is None


def test_heartbeats_of_the_job_a_resume_cancels_are_not_taken_for_the_new_jobs(tmp_path, monkeypatch):
    """--resume: slurm_job.json names a job an earlier (killed) nsa-validate left running; it is cancelled before
    the new job is submitted, but its ranks wrote heartbeats meanwhile. Those records are not the new job's: read as
    its own, they age while the new job waits in the queue and make it a HANG the moment it starts."""
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    old, new = "99999998", JOB
    (tmp_path / "slurm_job.json").write_text(json.dumps({"job_id": old, "state": "SUBMITTED"}))
    live = {old: "RUNNING"}
    polls = {"new": 0}

    cancelled = []

    def queue_state(job_id):
        if job_id == new and new not in cancelled:
            polls["new"] += 1
            return "PENDING" if polls["new"] < 5 else ("RUNNING" if polls["new"] < 10 else None)
        return live.get(job_id)

    def cancel(job_id, signal_name=None):
        cancelled.append(job_id)
        if job_id == old:  # the old job's last record, as it goes
            (out_dir / "heartbeat_rank0.jsonl").write_text(json.dumps(
                {"ts": time.time(), "rank": 0, "step": 7, "msg": "step", "pid": 1 << 30,
                 "host": socket.gethostname()}) + "\n")
        live.pop(job_id, None)

    monkeypatch.setattr(slurm, "submit", lambda script, env, cwd: (time.sleep(0.3), new)[1])  # a slow sbatch
    monkeypatch.setattr(slurm, "queue_state", queue_state)
    monkeypatch.setattr(slurm, "cancel", cancel)
    monkeypatch.setattr(slurm, "job_info", lambda job_id: slurm.JobInfo(job_id=job_id, state="COMPLETED",
                                                                        exit_code=0, signal=0, nodes=["nodeA"]))
    result = launch(_spec(tmp_path, trainer_out_dir=out_dir, stall_timeout_s=0.2, expected_ranks=1, poll_s=0.1))
    assert "cancelling Slurm job 99999998" in (tmp_path / "stdout.log").read_text()
    assert result.status == "ok", result.reason
    assert cancelled == [old]
