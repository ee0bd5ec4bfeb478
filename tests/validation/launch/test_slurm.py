"""The Slurm launcher: batch scripts, job-state mapping, runbook schema (no cluster needed), and, on the two-node
test cluster (.ci/slurm-cluster start; CI sets NSAV_REQUIRE_SLURM=1 so these never skip there), real jobs: a
two-node training, failures mapped to verdicts, cancellation on timeout with no job left in squeue, a job
cancelled by someone else, resume after the orchestrator was killed, and the slurm_cpu runbook ending GO."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from validation.launch import LaunchSpec, launch, slurm
from validation.runbook.plan import step_launches
from validation.runbook.loader import RunbookError, load_runbook

ROOT = Path(__file__).resolve().parents[3]
TRAIN = [sys.executable, "-m", "nsa.training", "--config", "configs/tiny_cpu.yaml", "--ddp", "1", "--save-every",
         "100000"]


# ------------------------------------------------------------------------------------------ no cluster needed


@pytest.mark.parametrize("state, status, words", [
    ("COMPLETED", "ok", "COMPLETED"),
    ("FAILED", "failed", "the job failed"),
    ("TIMEOUT", "timeout", "time limit"),
    ("DEADLINE", "timeout", "deadline"),
    ("NODE_FAIL", "failed", "node of the job failed"),
    ("BOOT_FAIL", "failed", "failed to boot"),
    ("PREEMPTED", "failed", "preempted"),
    ("OUT_OF_MEMORY", "failed", "out of memory"),
    ("CANCELLED", "failed", "cancelled outside nsa-validate"),
    ("CANCELLED+", "failed", "cancelled outside"),
    ("UNKNOWN", "failed", "final state unknown"),
    ("WEIRD_STATE", "failed", "WEIRD_STATE"),
])
def test_job_states_map_to_verdicts(state, status, words):
    got, reason = slurm.map_state(slurm.JobInfo(job_id="42", state=state, exit_code=1 if state != "COMPLETED" else 0,
                                                signal=0))
    assert got == status
    assert words in reason and "42" in reason


def test_completed_with_a_nonzero_exit_code_is_not_ok():
    status, reason = slurm.map_state(slurm.JobInfo(job_id="7", state="COMPLETED", exit_code=3, signal=0))
    assert status == "failed" and "exit code 3" in reason


def _script(**kw):
    args = dict(job_name="nsav-t", nnodes=2, nproc_per_node=4, argv=[sys.executable, "-m", "nsa.training", "--steps", "5"],
                env={"NSA_X": "1"}, cwd=Path("/work dir"), log_path=Path("/run dir/s/stdout.log"),
                ranks_dir=Path("/run dir/s/ranks"), options=slurm.SlurmOptions(), python=sys.executable)
    args.update(kw)
    return slurm.batch_script(**args)


def test_batch_script_allocation_and_torchrun_line():
    text = _script(options=slurm.SlurmOptions(partition="gpu", account="proj", time_limit="01:00:00", gpus_per_node=8,
                                              cpus_per_task=16, sbatch=("--exclusive",)))
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8",
                 "#SBATCH --cpus-per-task=16", "#SBATCH --partition=gpu", "#SBATCH --account=proj",
                 "#SBATCH --time=01:00:00", "#SBATCH --exclusive", "#SBATCH --no-requeue",
                 "#SBATCH --output='/run dir/s/stdout.log'", "#SBATCH --open-mode=append"):
        assert line in text.splitlines(), line
    flat = " ".join(text.replace("\\\n", " ").split())  # continuation lines joined
    assert "--nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d" in flat
    assert "srun --kill-on-bad-exit=1" in flat and "-m nsa.training --steps 5" in flat
    assert 'PET_RDZV_ID="nsav-$SLURM_JOB_ID"' in text
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)  # valid bash


def test_batch_script_values_are_data_not_code(tmp_path):
    """A hostile environment value or argument is quoted: running the script's export lines sets it verbatim."""
    marker = tmp_path / "pwned"
    evil = f"$(touch {marker}); `touch {marker}`"
    text = _script(env={"NSA_EVIL": evil}, argv=[sys.executable, "-m", "nsa.training", f"--note={evil}"])
    exports = "\n".join(line for line in text.splitlines() if line.startswith("export NSA_EVIL="))
    out = subprocess.run(["bash", "-c", exports + '\nprintf %s "$NSA_EVIL"'], capture_output=True, text=True, check=True)
    assert out.stdout == evil and not marker.exists()
    with pytest.raises(ValueError, match="environment variable names"):
        _script(env={"BAD NAME": "x"})


@pytest.mark.parametrize("line, problem", [
    ("--output=/tmp/x", "set by nsa-validate"), ("--nodes=4", "set by nsa-validate"),
    ("--exclusive\n#SBATCH --output=/x", "no newline"), ("exclusive", "one long option"),
])
def test_extra_sbatch_lines_are_checked(line, problem):
    assert problem in slurm.validate_sbatch_line(line)
    with pytest.raises(ValueError, match="sbatch line"):
        _script(options=slurm.SlurmOptions(sbatch=(line,)))


def _runbook(tmp_path, defaults: str, steps: str) -> Path:
    path = tmp_path / "rb.yaml"
    path.write_text(f"name: t\ndefaults:\n{textwrap.indent(textwrap.dedent(defaults), '  ')}"
                    f"phases:\n  - name: p\n    steps:\n{textwrap.indent(textwrap.dedent(steps), '      ')}")
    return path


def test_runbook_launcher_block_is_inherited_and_overridden(tmp_path):
    rb = load_runbook(_runbook(tmp_path, """\
        config: configs/tiny_cpu.yaml
        launcher: {type: slurm, partition: debug, time_limit: "30", sbatch: ["--exclusive"]}
        nnodes: 2
        """, """\
        - {name: a, kind: train}
        - {name: b, kind: train, nnodes: 1, launcher: {account: proj}, scaling_baseline: a}
        - {name: c, kind: train, launcher: torchrun}
        - {name: t, kind: pytest, tests: [tests/nsa/attention/test_paths.py]}
        """))
    a, b, c, t = rb.steps()
    assert (a.launch.launcher.type, a.launch.launcher.partition, a.launch.nnodes) == ("slurm", "debug", 2)
    assert (b.launch.launcher.partition, b.launch.launcher.account, b.launch.nnodes) == ("debug", "proj", 1)
    assert b.scaling_baseline == "a"
    assert c.launch.launcher.type == "torchrun" and c.launch.launcher.partition == "debug"
    assert t.launch.launcher.type == "slurm"
    pa, = step_launches(a)
    assert pa.world_size == 2 and "#SBATCH --nodes=2" in pa.batch_script()
    pt, = step_launches(t)
    script = pt.batch_script()
    assert "torch.distributed.run" not in script and "-m pytest" in script and "#SBATCH --nodes=1" in script


@pytest.mark.parametrize("defaults, steps, needle", [
    ("launcher: {type: kubernetes}\n", "- {name: a, kind: train}\n", "launcher.type"),
    ("launcher: {type: slurm, partition: 'a b'}\n", "- {name: a, kind: train}\n", "launcher.partition"),
    ("launcher: {type: slurm, time_limit: soon}\n", "- {name: a, kind: train}\n", "launcher.time_limit"),
    ("launcher: {type: slurm, time_limit: 1:30:00}\n", "- {name: a, kind: train}\n", "quote it"),
    ("launcher: {type: slurm, sbatch: ['--output=/x']}\n", "- {name: a, kind: train}\n", "launcher.sbatch[0]"),
    ("launcher: {rdzv_endpoint: 'nohost'}\n", "- {name: a, kind: train}\n", "rdzv_endpoint"),
    ("launcher: {type: slurm, gpu: 8}\n", "- {name: a, kind: train}\n", "gpu"),
    ("nnodes: 0\n", "- {name: a, kind: train}\n", "nnodes"),
    ("{}\n", "- {name: a, kind: train, scaling_baseline: b}\n- {name: b, kind: train}\n", "scaling_baseline"),
])
def test_runbook_launcher_errors_name_the_key(tmp_path, defaults, steps, needle):
    with pytest.raises(RunbookError) as err:
        load_runbook(_runbook(tmp_path, defaults, steps))
    assert needle in str(err.value) and "rb.yaml:" in str(err.value)


def test_plan_prints_the_batch_scripts():
    out = subprocess.run([sys.executable, "-m", "validation.cli", "plan", "runbooks/slurm_cpu.yaml"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "#SBATCH --nodes=2" in out.stdout and "srun --kill-on-bad-exit=1" in out.stdout
    assert "--nnodes=2" in out.stdout  # the loopback torchrun step


# ------------------------------------------------------------------------------------------ on the test cluster


def _cluster_ready() -> str | None:
    if not slurm.available():
        return "Slurm commands not on PATH"
    try:
        states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo: {exc}"
    nodes = dict(line.split() for line in states.stdout.splitlines() if len(line.split()) == 2)
    if states.returncode != 0 or len(nodes) < 2 or not all(s.startswith(("idle", "mix", "alloc")) for s in nodes.values()):
        return f"no two-node cluster up (sinfo: {states.stdout.strip() or states.stderr.strip()})"
    return None


def require_cluster() -> None:
    """Skip the calling test without the two-node test cluster; fail it where NSAV_REQUIRE_SLURM=1 (.ci/run)."""
    why = _cluster_ready()
    if why:
        if os.environ.get("NSAV_REQUIRE_SLURM") == "1":
            pytest.fail(f"NSAV_REQUIRE_SLURM=1 but {why} (start it: .ci/slurm-cluster start)")
        pytest.skip(f"{why}; start the test cluster with .ci/slurm-cluster install && .ci/slurm-cluster start, "
                    "or run every test with .ci/run")


@pytest.fixture(scope="module")
def cluster():
    require_cluster()
    yield
    left = _our_jobs()
    for line in left:  # cancel them, so that one failure does not cascade, then fail
        subprocess.run(["scancel", line.split()[0]], timeout=10)
    assert left == [], "a test left a job in squeue"


def _our_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=10)
    return [line for line in out.stdout.splitlines() if "nsav" in line]


def _spec(tmp_path, nnodes=2, nproc=1, steps=6, extra_env=None, **kw) -> LaunchSpec:
    env = {**os.environ, "NSA_TB_DISABLE": "1", "OMP_NUM_THREADS": "1", **(extra_env or {})}
    return LaunchSpec(argv=TRAIN + ["--steps", str(steps), "--out-dir", str(tmp_path / "out")], env=env, cwd=ROOT,
                      step_dir=tmp_path, nproc_per_node=nproc, torchrun=True, launcher="slurm", nnodes=nnodes,
                      trainer_out_dir=tmp_path / "out", job_name="nsav-test", term_grace_s=5,
                      **{"timeout_s": 180, "stall_timeout_s": 120, "telemetry_s": 1.0, **kw})  # as every trainer launch


def test_two_node_job_trains_on_both_nodes(cluster, tmp_path):
    result = launch(_spec(tmp_path, telemetry_s=0.5))
    assert result.status == "ok", result.reason
    # one telemetry sampler per node, ended with the node's task; the trainer's processes were in its tree
    from validation import contracts

    assert contracts.telemetry_files(tmp_path) == [tmp_path / "telemetry-nodeA.csv", tmp_path / "telemetry-nodeB.csv"]
    rows = contracts.read_telemetry(tmp_path)
    assert {r["node"] for r in rows} == {"nodeA", "nodeB"}
    assert all(max(r["procs"] for r in rows if r["node"] == n) >= 2 for n in ("nodeA", "nodeB"))
    assert sorted(result.nodes) == ["nodeA", "nodeB"] and result.job_id
    env = json.loads((tmp_path / "out" / "env.json").read_text())
    assert sorted(n["node"] for n in env["nodes"]) == ["nodeA", "nodeB"] and env["world_size"] == 2
    assert sorted(r for n in env["nodes"] for r in n["ranks"]) == [0, 1]
    assert all(n["env"].get("SLURM_JOB_ID") == result.job_id for n in env["nodes"])
    job = json.loads((tmp_path / "slurm_job.json").read_text())
    assert job["state"] == "COMPLETED" and job["job_id"] == result.job_id
    assert "[launcher " in (tmp_path / "stdout.log").read_text()  # job output and launcher notes in one log
    assert _our_jobs() == []


@pytest.mark.reliability
def test_a_crashing_rank_fails_the_job_with_its_traceback(cluster, tmp_path, reliability):
    result = launch(_spec(tmp_path, extra_env={"NSA_FAULT": "crash@3:1"}))
    reliability.record_fault("Slurm job: NSA_FAULT crash", "failed", result.status)
    reliability.record_orphans(len(_our_jobs()), 1)
    assert result.status == "failed"
    assert result.reason.startswith(f"Slurm job {result.job_id}: the job failed")
    assert "NSA_FAULT injected crash at step 3 on rank 1" in (result.excerpt or "")
    assert _our_jobs() == []


@pytest.mark.reliability
def test_timeout_cancels_the_job_and_leaves_nothing_in_squeue(cluster, tmp_path, reliability):
    t0 = time.monotonic()
    result = launch(_spec(tmp_path, steps=1_000_000, timeout_s=20))
    reliability.record_fault("Slurm job: step timeout", "timeout", result.status)
    reliability.record_orphans(len(_our_jobs()), 1)
    assert result.status == "timeout", result.reason
    assert "scancel" in result.reason and time.monotonic() - t0 < 90
    assert _our_jobs() == [] and slurm.queue_state(result.job_id) is None
    assert slurm.job_info(result.job_id).state in ("CANCELLED", "UNKNOWN")


@pytest.mark.reliability
def test_a_hang_is_dumped_on_every_node_then_cancelled(cluster, tmp_path, reliability):
    """remote_dumps=True sends every stalled rank's SIGUSR1 through `srun --overlap python -m nsa.training.watchdog` on
    the job's nodes: the path ranks on other hosts take on a real cluster."""
    spec = _spec(tmp_path, steps=1000, extra_env={"NSA_FAULT": "hang@3:1"}, stall_timeout_s=6, remote_dumps=True)
    spec.argv += ["--pg-timeout", "600"]
    result = launch(spec)
    reliability.record_fault("Slurm job: NSA_FAULT hang", "hang", result.status)
    reliability.record_orphans(len(_our_jobs()), 1)
    assert result.status == "hang", result.reason
    names = {p.name.split(".")[0].split("_")[1] for p in result.stack_dumps}
    assert {"rank0", "rank1"} <= names, result.stack_dumps
    assert "asking rank(s)" in (tmp_path / "stdout.log").read_text()
    assert _our_jobs() == []


def _node_state(node: str) -> str:
    """scontrol's State of the node, e.g. IDLE, DOWN+NOT_RESPONDING (sinfo keeps showing "mixed" while a
    NODE_FAIL job's record stays, although the node takes new jobs)."""
    out = subprocess.run(["scontrol", "show", "node", node, "-o"], capture_output=True, text=True, timeout=10).stdout
    return next((f.split("=", 1)[1] for f in out.split() if f.startswith("State=")), "").lower()


@pytest.mark.reliability
def test_a_node_failure_is_a_failure_naming_node_fail(cluster, tmp_path, reliability):
    """A node of the job goes down mid-run (scontrol ... state=down, as when slurmctld loses a node); afterwards it
    is put back in service for the tests that follow."""
    spec = _spec(tmp_path, steps=1_000_000)
    downed = []

    def progress(p):
        if not downed and p.step is not None and p.step >= 2:
            downed.append(True)
            subprocess.run(["scontrol", "update", "nodename=nodeB", "state=down", "reason=nsav-test"], check=True,
                           timeout=10)

    spec.on_progress = progress
    try:
        result = launch(spec)
    finally:  # back to service: "resume" while the node is down; its killed job steps take a while to go
        end = time.monotonic() + 60
        while not _node_state("nodeB").startswith("idle") and time.monotonic() < end:
            if _node_state("nodeB").startswith(("down", "drain")):
                subprocess.run(["scontrol", "update", "nodename=nodeB", "state=resume"], capture_output=True,
                               timeout=10)
            time.sleep(1.0)
    reliability.record_fault("Slurm job: a node goes down", "failed (NODE_FAIL)",
                             f"{result.status} (NODE_FAIL)" if "NODE_FAIL" in result.reason else result.status)
    assert downed and result.status == "failed" and "NODE_FAIL" in result.reason, result.reason
    assert _node_state("nodeB").startswith(("idle", "mixed")), _node_state("nodeB")


@pytest.mark.slow  # a minute of Slurm's smallest limit; in CI: TIMEOUT -> timeout above, and the step's timeout below
@pytest.mark.reliability
def test_slurms_own_time_limit_is_a_timeout(cluster, tmp_path, reliability):
    """time_limit 1 (minute, Slurm's smallest): the job is ended by Slurm, not by the step's timeout."""
    result = launch(_spec(tmp_path, steps=1_000_000, timeout_s=240,
                          slurm=slurm.SlurmOptions(time_limit="1")))
    reliability.record_fault("Slurm job: Slurm's time limit", "timeout", result.status)
    assert result.status == "timeout" and "time limit (TIMEOUT)" in result.reason, result.reason
    assert _our_jobs() == []


@pytest.mark.reliability
def test_ctrl_c_cancels_the_job(cluster, tmp_path, reliability):
    spec = _spec(tmp_path, steps=1_000_000)

    def progress(p):
        if p.step is not None and p.step >= 2:
            raise KeyboardInterrupt

    spec.on_progress = progress
    with pytest.raises(KeyboardInterrupt):
        launch(spec)
    job_id = json.loads((tmp_path / "slurm_job.json").read_text())["job_id"]
    reliability.record_orphans(len(_our_jobs()), 1)
    assert slurm.queue_state(job_id) is None and _our_jobs() == []
    assert f"cancelling Slurm job {job_id}" in (tmp_path / "stdout.log").read_text()


def test_a_job_slurm_refuses_is_an_error_naming_sbatchs_reason(cluster, tmp_path):
    result = launch(_spec(tmp_path, slurm=slurm.SlurmOptions(partition="no_such_partition")))
    assert result.status == "error" and result.job_id is None
    assert "could not submit the Slurm job" in result.reason and "partition" in result.reason.lower()


@pytest.mark.reliability
def test_a_job_cancelled_by_someone_else_is_a_failure_saying_so(cluster, tmp_path, reliability):
    spec = _spec(tmp_path, steps=1_000_000)
    cancelled = []

    def progress(p):
        job = tmp_path / "slurm_job.json"
        if not cancelled and p.step is not None and p.step >= 2 and job.exists():
            cancelled.append(json.loads(job.read_text())["job_id"])
            subprocess.run(["scancel", cancelled[0]], check=True)

    spec.on_progress = progress
    result = launch(spec)
    reliability.record_fault("Slurm job: scancel by someone else", "failed",
                             result.status if "CANCELLED" in result.reason else f"{result.status} ({result.reason})")
    assert cancelled and result.status == "failed"
    assert "cancelled outside nsa-validate" in result.reason
    assert _our_jobs() == []


def _slurm_runbook(tmp_path, steps: int) -> Path:
    path = tmp_path / "slurm_rb.yaml"
    path.write_text(textwrap.dedent(f"""\
        name: slurm_resume
        defaults:
          config: {ROOT / 'configs/tiny_cpu.yaml'}
          env: {{NSA_TB_DISABLE: "1", OMP_NUM_THREADS: "1"}}  # both nodes share this machine's cores
          args: {{ddp: 1, steps: {steps}, save_every: 100000}}
          launcher: slurm
          nnodes: 2
          timeout_s: 300
          window: 5
        phases:
          - name: p
            steps:
              - {{name: first, kind: train, args: {{steps: 4}}}}
              - {{name: second, kind: train}}
        acceptance:
          - {{name: both nodes, expr: "len(second.nodes) == 2 and second.status == 'passed'"}}
        """))
    return path


# in CI the job left running (the resume cancels it first); a job that died, as a local run's SIGKILL then resume
# (test_faults.py), under -m slow
@pytest.mark.parametrize("job_dies", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["job-left-running", "job-died"])
@pytest.mark.reliability
def test_resume_after_the_orchestrator_was_killed_mid_job(cluster, tmp_path, job_dies, reliability):
    rb, out = _slurm_runbook(tmp_path, steps=100_000), tmp_path / "run"
    cmd = [sys.executable, "-m", "validation.cli", "run", str(rb), "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    job_file = out / "second" / "slurm_job.json"
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end:
            if job_file.exists() and (out / "second" / "out" / "training.csv").exists():
                break
            time.sleep(0.5)
        else:
            pytest.fail("the second step's job never started training")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    job_id = json.loads(job_file.read_text())["job_id"]
    assert slurm.queue_state(job_id) is not None  # SIGKILL cannot cancel the job: it runs on
    if job_dies:
        subprocess.run(["scancel", job_id], check=True)
        assert slurm.wait_gone(job_id)
    results = json.loads((out / "results.json").read_text())
    assert results["steps"]["first"]["status"] == "passed" and results["steps"]["second"]["status"] == "running"
    # resume finishes the run with a short second step; a job still running from before is cancelled first
    resumed = subprocess.run(cmd[:5] + ["--resume", str(out), "--set", "defaults.args.steps=6"], cwd=ROOT,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    final = json.loads((out / "results.json").read_text())
    reliability.record_fault(f"Slurm: nsa-validate SIGKILL mid-job ({'job died' if job_dies else 'job left running'})"
                             " + --resume", "GO", final["verdict"])
    reliability.record_results(int(final["steps"]["first"] != results["steps"]["first"]), 1)
    reliability.record_orphans(len(_our_jobs()), 1)
    assert final["verdict"] == "GO" and final["steps"]["second"]["status"] == "passed"
    assert final["steps"]["first"]["started"] == results["steps"]["first"]["started"]  # not rerun
    assert slurm.queue_state(job_id) is None and _our_jobs() == []
    log = (out / "second" / "stdout.log").read_text()
    assert (f"cancelling Slurm job {job_id}" in log) != job_dies


# SIGHUP takes the same path as SIGTERM here (and test_signals.py sends it to local runs at two stages): -m slow
@pytest.mark.parametrize("signame", ["SIGTERM", pytest.param("SIGHUP", marks=pytest.mark.slow)])
@pytest.mark.reliability
def test_a_signal_to_the_orchestrator_cancels_the_job(cluster, tmp_path, signame, reliability):
    rb, out = _slurm_runbook(tmp_path, steps=100_000), tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "validation.cli", "run", str(rb), "--out", str(out), "--no-report"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    job_file = out / "second" / "slurm_job.json"
    try:
        end = time.monotonic() + 180
        while time.monotonic() < end and not (job_file.exists() and (out / "second" / "out" / "training.csv").exists()):
            time.sleep(0.5)
        assert job_file.exists(), "the second step's job never started training"
        proc.send_signal(getattr(signal, signame))
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    job_id = json.loads(job_file.read_text())["job_id"]
    results = json.loads((out / "results.json").read_text())
    state = slurm.queue_state(job_id)
    reliability.record_fault(f"Slurm job: {signame} to nsa-validate", f"exit {128 + getattr(signal, signame)}, "
                             "job cancelled", f"exit {proc.returncode}, job {'cancelled' if state is None else state}")
    reliability.record_orphans(len(_our_jobs()), 1)
    assert proc.returncode == 128 + getattr(signal, signame), stderr[-2000:]
    assert state is None and _our_jobs() == []
    assert results["steps"]["first"]["status"] == "passed"
    assert results["steps"]["second"]["status"] == "interrupted" and signame in results["steps"]["second"]["reason"]
    assert f"interrupted ({signame} to the launcher): cancelling Slurm job {job_id}" in \
        (out / "second" / "stdout.log").read_text()


def test_slurm_cpu_runbook_is_go_with_two_node_names(cluster, tmp_path):
    out = tmp_path / "run"
    # the Slurm node runs a test file of a tenth of a second (the runbook's own, test_causality.py, takes ~15 s of a
    # core: CI runs it in its own worker already); what is tested here is the pytest step as a Slurm job
    proc = subprocess.run([sys.executable, "-m", "validation.cli", "run", "runbooks/slurm_cpu.yaml", "--out", str(out),
                           "--set", "defaults.args.steps=12", "--set", "defaults.window=6",
                           "--set", "defaults.warmup_steps=2",
                           "--set", "steps.sanity_tests.tests=[tests/nsa/attention/test_reference.py]"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    results = json.loads((out / "results.json").read_text())
    assert proc.returncode == 0 and results["verdict"] == "GO", proc.stdout[-4000:]
    assert sorted(results["steps"]["two_nodes"]["metrics"]["nodes"]) == ["nodeA", "nodeB"]
    one, two = results["steps"]["one_node"]["metrics"], results["steps"]["two_nodes"]["metrics"]
    assert one["world_size"] == two["world_size"] == 2  # same world size: efficiency is the plain throughput ratio
    assert two["scaling_efficiency"] == pytest.approx(two["toks_per_s"]["mean"] / one["toks_per_s"]["mean"])
    assert two["toks_per_s_per_node"] == pytest.approx(two["toks_per_s"]["mean"] / 2)
    assert {"nodeA", "nodeB", "node0", "node1"} <= set(results["environment"]["nodes"])
    assert results["steps"]["sanity_tests"]["metrics"]["passed"] >= 3  # test_reference.py ran on the node
    assert sorted(results["steps"]["snapshot"]["metrics"]["nodes"]) == ["nodeA", "nodeB"]  # a snapshot per node
    assert (out / "snapshot" / "nodes" / "nodeB" / "environment.json").is_file()
    report = (out / "report.md").read_text()
    assert "nodeA" in report and "nodeB" in report and "Scaling efficiency" in report
    assert _our_jobs() == []


def _small_job(tmp_path, nnodes=1, **kw) -> LaunchSpec:
    """A job of one short command per node (no torchrun): what is tested is the submission around it."""
    return LaunchSpec(argv=[sys.executable, "-c", "print('hello from the job')"], env=dict(os.environ), cwd=ROOT,
                      step_dir=tmp_path / "step", launcher="slurm", nnodes=nnodes, job_name="nsav-test", poll_s=0.2,
                      term_grace_s=2, timeout_s=120, **kw)


@pytest.mark.reliability
def test_a_job_queued_by_an_sbatch_that_timed_out_is_followed_not_orphaned(cluster, tmp_path, monkeypatch,
                                                                          reliability):
    """sbatch queues the job, then gives no answer within COMMAND_TIMEOUT_S (a slow controller or file system): the
    job runs although its id was never printed. It is found by the step's script and followed, not left behind."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f'#!/bin/bash\n{shutil.which("sbatch")} "$@" >/dev/null || exit $?\nexec sleep 30\n')
    (bin_dir / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 3.0)
    result = launch(_small_job(tmp_path))
    reliability.record_orphans(len(_our_jobs()), 1)
    log = (tmp_path / "step" / "stdout.log").read_text()
    assert result.status == "ok" and result.job_id, (result.reason, log)
    assert "no answer within 3s" in log and f"Slurm lists job {result.job_id}" in log
    assert "hello from the job" in log
    assert _our_jobs() == []


def test_an_enclosing_allocations_slurm_variables_stay_out_of_the_job(cluster, tmp_path, monkeypatch):
    """nsa-validate run inside `salloc --mem-per-cpu=...` (SLURM_JOB_ID, SLURM_MEM_PER_CPU, ... in its environment):
    sbatch exports them into the job, where srun reads them as its own options; beside the job's SLURM_MEM_PER_NODE
    (--mem) every srun stops with "mutually exclusive". The job gets its own allocation's variables only."""
    for key, value in {"SLURM_JOB_ID": "424242", "SLURM_JOBID": "424242", "SLURM_MEM_PER_CPU": "100",
                       "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_NODELIST": "nodeA",
                       "SLURM_TASKS_PER_NODE": "1"}.items():
        monkeypatch.setenv(key, value)
    result = launch(_small_job(tmp_path, slurm=slurm.SlurmOptions(sbatch=("--mem=200M",))))
    log = (tmp_path / "step" / "stdout.log").read_text()
    assert result.status == "ok", (result.reason, log[-2000:])
    assert "hello from the job" in log and "mutually exclusive" not in log
    assert result.job_id != "424242" and _our_jobs() == []


def test_a_job_whose_id_was_never_recorded_is_cancelled_before_the_step_runs_again(cluster, tmp_path):
    """nsa-validate was killed while sbatch ran (slurm_job.json still says SUBMITTING, with no job id), after the
    controller had queued the job: the next attempt of the step finds it by the step's script and cancels it, so
    that it does not run beside the new one."""
    step = tmp_path / "step"
    step.mkdir()
    (step / "job.sbatch").write_text("#!/bin/bash\n#SBATCH --job-name=nsav-test\n#SBATCH --output=/dev/null\n"
                                     "sleep 300\n")
    old = subprocess.run(["sbatch", "--parsable", str(step / "job.sbatch")], capture_output=True, text=True,
                         timeout=30, check=True).stdout.strip().split(";")[0]
    (step / "slurm_job.json").write_text(json.dumps({"job_id": None, "script": str(step / "job.sbatch"),
                                                     "state": "SUBMITTING"}))
    result = launch(_small_job(tmp_path))
    assert result.status == "ok" and result.job_id != old, result.reason
    assert f"cancelling Slurm job {old}, left running by an earlier run" in (step / "stdout.log").read_text()
    assert slurm.queue_state(old) is None and _our_jobs() == []
