"""The Slurm batch script against what reads it: bash (every value reaches the commands byte for byte; a value can
not end an #SBATCH line) and sbatch's directive parser (an extra #SBATCH line is one option, named as sbatch reads
it: every word of the line is an argument, quotes and backslashes are removed first), checked on the test cluster
with `sbatch --test-only`, which prints the nodes the job would get; plus the exit code of a job killed by a
signal (Slurm's ExitCode N:S)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from validation.launch import LaunchSpec, launch, slurm
from validation.launch.sbatch import SlurmOptions, batch_script, validate_sbatch_line

ROOT = Path(__file__).resolve().parents[3]
HOSTILE = ["sp ace", "q'uo\"te", "$(touch PWNED)", "`touch PWNED`", "new\nline", "#hash", "ünï€", "", "-dash",
           "--x=$HOME", "a\\b", "*", "~", "!x", "\t"]


def _script(tmp: Path, **kw) -> str:
    args = dict(job_name="nsav-t", nnodes=2, nproc_per_node=2, argv=[sys.executable, "-m", "nsa.training"], env={},
                cwd=tmp, log_path=tmp / "s" / "stdout.log", ranks_dir=tmp / "s" / "ranks", options=SlurmOptions(),
                python=sys.executable)
    args.update(kw)
    return batch_script(**args)


def _executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("torchrun", [True, False])
def test_every_value_reaches_the_command_byte_for_byte(tmp_path, torchrun):
    """The script run by bash with srun, scontrol and the interpreter replaced: the arguments, the environment values
    and the paths (python, ranks and telemetry directories) arrive as given, and nothing in them runs."""
    bindir = tmp_path / "bin"
    _executable(bindir / "scontrol", '#!/bin/bash\ncase "$2" in hostnames) echo nodeA;; '
                                     'node) echo "NodeName=nodeA NodeAddr=10.1.2.3 State=IDLE";; esac\n')
    _executable(bindir / "srun", '#!/bin/bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                                 'export SLURMD_NODENAME=nodeA\nexec "$@"\n')
    record = tmp_path / "calls"
    record.mkdir()
    # records its arguments and environment (the sampler's call apart); the agent waits for the sampler's record
    python = _executable(tmp_path / "py 'x' $(y) `z`" / "python3",
                         '#!/bin/bash\nf="$REC/call.$2"\nprintf "%s\\0" "$@" > "$f.tmp"\n'
                         'printf "%s\\0" "$NSAV_RANKS_DIR" ' + " ".join(f'"$NSA_E{i}"' for i in range(len(HOSTILE)))
                         + ' > "$f.env"\nmv "$f.tmp" "$f"\n'
                         'if [ "$2" = torch.distributed.run ]; then\n'
                         '  for _ in $(seq 200); do [ -e "$REC/call.validation.launch.telemetry" ] && break; sleep 0.02; '
                         'done\nfi\n')
    ranks_dir = tmp_path / "r $(touch PWNED) 'x'" / "ranks"
    text = _script(tmp_path, argv=[str(python), "-m", "nsa.training", *HOSTILE],
                   env={f"NSA_E{i}": v for i, v in enumerate(HOSTILE)}, ranks_dir=ranks_dir, python=str(python),
                   torchrun=torchrun, telemetry_s=0.5 if torchrun else None,
                   telemetry_dir=tmp_path / "t `touch PWNED` \"w\"", cores=2.0)
    (tmp_path / "job.sh").write_text(text)
    subprocess.run(["bash", "-n", str(tmp_path / "job.sh")], check=True)
    env = {"PATH": f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin", "REC": str(record), "SLURM_JOB_ID": "1234",
           "SLURM_JOB_NODELIST": "nodeA"}
    ran = subprocess.run(["bash", str(tmp_path / "job.sh")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=30)
    assert ran.returncode == 0, ran.stderr
    calls = {}
    for f in record.glob("call.*"):
        if not f.name.endswith((".env", ".tmp")):
            words = [w.decode() for w in f.read_bytes().split(b"\0")[:-1]]
            calls[words[1]] = (words, [w.decode() for w in Path(f"{f}.env").read_bytes().split(b"\0")[:-1]])
    words, seen = calls["torch.distributed.run" if torchrun else "nsa.training"]
    assert words[words.index("nsa.training") + 1:] == HOSTILE
    assert seen == [str(ranks_dir) if torchrun else "", *HOSTILE]
    if torchrun:  # the node's telemetry sampler, writing into the step's directory
        sampler, _ = calls["validation.launch.telemetry"]
        assert sampler[sampler.index("--out") + 1] == str(tmp_path / "t `touch PWNED` \"w\"" / "telemetry-nodeA.csv")
    assert not list(tmp_path.rglob("PWNED"))


@pytest.mark.parametrize("field", ["job_name", "partition", "account", "time_limit"])
@pytest.mark.parametrize("bad", ["x\ntouch {marker} #", "x\rtouch {marker} #", "a\\b"])
def test_a_value_an_sbatch_line_cannot_hold_is_refused(tmp_path, field, bad):
    """A newline in an #SBATCH value ends the line: what follows runs as bash (here it would touch the marker) and
    sbatch stops reading #SBATCH lines there (--nodes, --output, --no-requeue lost); sbatch drops a backslash."""
    value = bad.format(marker=tmp_path / "PWNED")
    kw = {"job_name": value} if field == "job_name" else {"options": SlurmOptions(**{field: value})}
    with pytest.raises(ValueError, match="newline or a backslash"):
        _script(tmp_path, **kw)


# lines sbatch reads as one of the launcher's own options (checked below with the real sbatch)
OVERRIDING = ["--exclusive --nodes=2", "--qos=normal --nodes=2", "--comment=x -N2", "--exclusive\t--nodes=2",
              "--exclusive\v--nodes=2", "--exclusive\f--nodes=2", '--no"des"=2', "--no'des=2'", "--no\\des=2",
              "--comment='x' --nodes=2", '--comment="a#b" --nodes=2', "--comment=a\\ --nodes=2", "--tasks-per-node=2",
              "--tasks=2"]
# lines that leave them alone
HARMLESS = ["--exclusive", "--qos normal", '--comment="a --nodes=2"', "--comment='x -N2'", "--exclusive # --nodes=2",
            "--exclusive#--nodes=2", "--ntasks-per-core=1", "--cluster-constraint=x"]


@pytest.mark.parametrize("line", OVERRIDING)
def test_a_line_that_sets_the_launchers_own_options_is_refused(tmp_path, line):
    assert validate_sbatch_line(line) is not None
    with pytest.raises(ValueError, match="sbatch line"):
        _script(tmp_path, options=SlurmOptions(sbatch=(line,)))


@pytest.mark.parametrize("line", HARMLESS)
def test_a_line_that_leaves_them_alone_passes(line):
    assert validate_sbatch_line(line) is None


@pytest.mark.parametrize("line", ["--clusters=other", "--cluster=other", "--clusters other", "-M other"])
def test_another_cluster_is_refused(line):
    """squeue, scontrol and scancel ask the local cluster (no -M): a job sbatch sent elsewhere ("<id>;<cluster>")
    would be taken as gone at the first poll, and neither followed nor cancelled."""
    assert validate_sbatch_line(line) is not None


@pytest.mark.parametrize("line", ['--comment="open', "--comment='open"])
def test_an_open_quote_is_refused(line):
    assert "quote" in validate_sbatch_line(line)


def _cluster():
    from tests.validation.launch.test_slurm import require_cluster

    require_cluster()


def test_sbatch_itself_reads_the_refused_lines_as_the_launchers_options_and_not_the_others(tmp_path):
    """The reference for the two lists above: `sbatch --test-only` (no job is queued) on a one-node script with the
    line appended names the nodes the job would get; `--tasks-per-node` (and its abbreviation) asks for two tasks on
    a node, which is either refused or takes both CPUs of a test node."""
    _cluster()

    def nodes(line: str) -> str:
        script = tmp_path / "t.sbatch"
        script.write_text(f"#!/bin/bash\n#SBATCH --job-name=nsav-test-only\n#SBATCH --nodes=1\n"
                          f"#SBATCH --ntasks-per-node=1\n#SBATCH --output=/dev/null\n#SBATCH {line}\ntrue\n")
        out = subprocess.run(["sbatch", "--test-only", str(script)], capture_output=True, text=True, timeout=30)
        text = out.stdout + out.stderr
        found = re.search(r"using (\d+) processors on nodes (\S+)", text)
        return f"{found.group(2)}/{found.group(1)}" if found else text.strip()

    for line in OVERRIDING:
        got = nodes(line)
        if "tasks" in line:
            assert "," not in got and (got.endswith("/2") or "configuration is not available" in got), (line, got)
        else:
            assert got.split("/")[0].count(",") == 1, (line, got)  # two nodes
    for line in HARMLESS:
        got = nodes(line)
        assert "/" in got and "," not in got.split("/")[0], (line, got)  # one node


def test_a_job_killed_by_a_signal_has_a_negative_return_code(tmp_path, monkeypatch):
    """Slurm's ExitCode N:S: a batch script killed by signal S reads 0:S (the state FAILED, OUT_OF_MEMORY, ...). The
    launch's returncode is -S then, as for a local child killed by S (LaunchResult: negative, killed by that
    signal), not 0."""
    monkeypatch.setattr(slurm, "submit", lambda script, env, cwd: "99999999")
    monkeypatch.setattr(slurm, "queue_state", lambda job_id: None)
    monkeypatch.setattr(slurm, "cancel", lambda job_id, signal_name=None: pytest.fail("nothing to cancel"))
    monkeypatch.setattr(slurm, "job_info", lambda job_id: slurm.JobInfo(job_id=job_id, state="OUT_OF_MEMORY",
                                                                        exit_code=0, signal=9, nodes=["nodeA"]))
    result = launch(LaunchSpec(argv=[sys.executable, "-c", "pass"], env=dict(os.environ), cwd=ROOT,
                               step_dir=tmp_path, launcher="slurm", poll_s=0.05, timeout_s=30))
    assert result.status == "failed" and "out of memory" in result.reason, result.reason
    assert result.returncode == -9


def test_slurms_exit_code_and_signal_of_a_killed_batch_script(tmp_path):
    """On the test cluster: a batch script that kills itself with SIGKILL ends FAILED with ExitCode 0:9; read so
    although its name and its directory hold words that read as scontrol fields."""
    _cluster()
    where = tmp_path / "w ExitCode=0:0 JobState=COMPLETED"
    where.mkdir()
    script = where / "k.sbatch"
    script.write_text("#!/bin/bash\n#SBATCH --job-name='nsav-test JobState=COMPLETED ExitCode=0:0'\n"
                      "#SBATCH --output=/dev/null\nkill -9 $$\n")
    job = slurm.submit(script, dict(os.environ), where)
    try:
        assert slurm.wait_gone(job, timeout_s=30, poll_s=0.2)
        info = slurm.job_info(job)
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
    assert (info.state, info.exit_code, info.signal) == ("FAILED", 0, 9)
    assert slurm.map_state(info) == ("failed", f"Slurm job {job}: the job failed (exit code 0, signal 9)")


def test_a_job_slurm_no_longer_knows(tmp_path):
    """A job finished longer ago than MinJobAge: squeue and scontrol answer "Invalid job id"; it is gone from the
    queue and its final state is unknown (a failure saying so), not an error."""
    _cluster()
    assert slurm.queue_state("99999999") is None
    info = slurm.job_info("99999999")
    assert info.state == "UNKNOWN" and "no longer knows" in info.reason
    assert slurm.map_state(info)[0] == "failed" and "final state unknown" in slurm.map_state(info)[1]


# scontrol show job -o of a failed job, as Slurm 22.05 prints it; its name and its directory hold words that read as
# fields
_SHOW_JOB = ("JobId=358 JobName=nsav x JobState=COMPLETED ExitCode=0:0 UserId=root(0) GroupId=root(0) MCS_label=N/A "
             "Priority=4294901474 Nice=0 Account=(null) QOS=(null) JobState=FAILED Reason=NonZeroExitCode "
             "Dependency=(null) Requeue=1 Restarts=0 BatchFlag=1 Reboot=0 ExitCode=3:0 RunTime=00:00:00 "
             "TimeLimit=UNLIMITED TimeMin=N/A Partition=debug ReqNodeList=(null) ExcNodeList=(null) NodeList=nodeA "
             "BatchHost=nodeA NumNodes=1 NumCPUs=1 NumTasks=1 Command=/runs/w ExitCode=0:0 JobState=COMPLETED "
             "NodeList=nodeZ/j.sh WorkDir=/runs/w ExitCode=0:0 JobState=COMPLETED NodeList=nodeZ "
             "StdErr=/dev/null StdIn=/dev/null StdOut=/dev/null Power= \n")


def test_a_failed_job_whose_name_and_paths_read_as_fields_is_still_failed(monkeypatch):
    asked = []

    def run(argv, env=None, cwd=None):
        asked.append(argv)
        return _SHOW_JOB if argv[:3] == ["scontrol", "show", "job"] else "\n".join(argv[3].split(",")) + "\n"

    monkeypatch.setattr(slurm, "_run", run)
    info = slurm.job_info("358")
    assert (info.state, info.exit_code, info.signal, info.reason) == ("FAILED", 3, 0, "NonZeroExitCode")
    assert info.nodes == ["nodeA"] and asked[-1] == ["scontrol", "show", "hostnames", "nodeA"]
    assert slurm.map_state(info) == ("failed", "Slurm job 358: the job failed (exit code 3)")



def test_sbatch_input_variables_that_override_the_scripts_own_lines_are_not_given_to_it(tmp_path, monkeypatch):
    """sbatch takes its input environment variables over the script's #SBATCH lines: a user's SBATCH_OUTPUT sent the
    job's output elsewhere (the launcher then read no stdout.log), SLURM_CLUSTERS sent the job where squeue and
    scancel do not look. The user's other defaults (SBATCH_ACCOUNT) still reach sbatch."""
    from validation.launch import slurm

    seen = {}

    def fake_run(argv, env=None, cwd=None):
        seen.update(env or {})
        return "4242\n"

    monkeypatch.setattr(slurm, "_run", fake_run)
    env = {"PATH": "/usr/bin", "SBATCH_OUTPUT": "/elsewhere.log", "SLURM_CLUSTERS": "other",
           "SBATCH_EXPORT": "NONE", "SBATCH_ACCOUNT": "myproj"}
    assert slurm.submit(tmp_path / "job.sbatch", env, tmp_path) == "4242"
    assert not set(seen) & {"SBATCH_OUTPUT", "SLURM_CLUSTERS", "SBATCH_EXPORT"}
    assert seen["SBATCH_ACCOUNT"] == "myproj" and seen["PATH"] == "/usr/bin"


def test_a_users_sbatch_output_does_not_take_the_jobs_log_away(tmp_path):
    """The same on the real sbatch: the job's output goes where the script's --output says."""
    _cluster()
    from validation.launch import slurm

    script, mine, theirs = tmp_path / "job.sbatch", tmp_path / "mine.log", tmp_path / "theirs.log"
    script.write_text(f"#!/bin/bash\n#SBATCH --job-name=nsav-env-test\n#SBATCH --nodes=1\n#SBATCH --output={mine}\n"
                      "echo done\n")
    job = slurm.submit(script, {**os.environ, "SBATCH_OUTPUT": str(theirs)}, tmp_path)
    try:
        deadline = time.time() + 60
        while slurm.queue_state(job) is not None and time.time() < deadline:
            time.sleep(0.2)
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)
    assert mine.read_text().strip() == "done" and not theirs.exists()
