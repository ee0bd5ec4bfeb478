"""validation.launch on real subprocesses: plain Python children (fast) and the real trainer through torchrun.

Every test checks that nothing the launch started is alive afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest
from process_checks import group_members, pid_alive

from validation.launch import LaunchSpec, Progress, free_port, launch, torchrun_prefix
from validation.launch.diagnosis import torchrun_failures as _torchrun_failures
from validation.launch.diagnosis import tracebacks as _tracebacks
from validation.launch.processes import sigint_deferred as _sigint_deferred
from validation.launch.spec import EXCERPT_MAX_LINES
from validation.launch.torchrun import torchrun_argv as _torchrun_argv

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs" / "tiny_cpu.yaml"


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSA_", "CONFIG"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    env["NSA_TB_DISABLE"] = "1"
    env.update(extra)
    return env


def spec(tmp_path: Path, argv: list[str], **kw) -> LaunchSpec:
    kw.setdefault("env", child_env())
    kw.setdefault("timeout_s", 60.0)
    kw.setdefault("poll_s", 0.1)
    return LaunchSpec(argv=argv, cwd=REPO, step_dir=tmp_path / "step", **kw)


def py(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", code, *args]


def assert_group_gone(pgid: int) -> None:
    """No process of group `pgid` is alive. killpg(pgid, 0) also answers for zombies, which the launcher cannot
    reap once they were re-parented to init; give init a moment, then accept only zombies."""
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    assert not group_members(pgid), f"process group {pgid} still has live members: {group_members(pgid)}"


def assert_all_dead(pids) -> None:
    alive = [p for p in pids if pid_alive(p)]
    assert not alive, f"processes left behind: {alive}"


def heartbeat_pids(out_dir: Path) -> list[int]:
    pids = set()
    for path in out_dir.glob("heartbeat_rank*.jsonl"):
        pids.update(json.loads(line)["pid"] for line in path.read_text().splitlines() if line.strip())
    return sorted(pids)


def trainer_argv(out_dir: Path, *flags: str) -> list[str]:
    return [sys.executable, "-m", "nsa.training", "--config", str(TINY), "--out-dir", str(out_dir), *flags]


# A child that leaves processes behind the way torchrun does: one in its own process group (ignoring SIGTERM
# when asked to) and one in a session of its own (like a torchrun worker); it prints the three pids.
SPAWNER = r"""
import os, signal, subprocess, sys, time
stubborn = sys.argv[1] == "1"
if stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sleeper = "import signal, time\n" + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if stubborn else "") + \
          "time.sleep(1000)"
g1 = subprocess.Popen([sys.executable, "-c", sleeper])
g2 = subprocess.Popen([sys.executable, "-c", sleeper], start_new_session=True)
print("PIDS", os.getpid(), g1.pid, g2.pid, flush=True)
time.sleep(1000)
"""


def spawned_pids(log_path: Path) -> list[int]:
    for line in log_path.read_text().splitlines():
        if line.startswith("PIDS "):
            return [int(x) for x in line.split()[1:]]
    return []


# ----------------------------------------------------------------------------------------------- plain children


def test_ok_child_logs_and_command_json(tmp_path):
    code = ("import json, sys\n"
            "print('argv seen:', json.load(open(sys.argv[1]))['argv'][-1])\n"  # command.json exists before start
            "print('to stderr', file=sys.stderr)\n")
    env = child_env(LAUNCHER_TEST_VAR="x y", MY_API_TOKEN="s3cret")
    step_dir = tmp_path / "step"
    argv = py(code, str(step_dir / "command.json"))
    result = launch(spec(tmp_path, argv, env=env))
    assert result.status == "ok" and result.returncode == 0, result
    assert result.argv == argv and result.attempts == 1 and result.rank_logs == {} and result.excerpt is None
    assert result.log_path == step_dir / "stdout.log"
    text = result.log_path.read_text()
    assert f"argv seen: {step_dir / 'command.json'}" in text and "to stderr" in text
    cmd = json.loads((step_dir / "command.json").read_text())
    assert cmd["argv"] == argv and cmd["cwd"] == str(REPO) and cmd["timeout_s"] == 60.0
    assert cmd["env"]["LAUNCHER_TEST_VAR"] == "x y"
    assert cmd["env"]["OMP_NUM_THREADS"] == "1" and cmd["env"]["NSA_TB_DISABLE"] == "1"
    assert cmd["env"]["MY_API_TOKEN"] == "<redacted>" and "s3cret" not in (step_dir / "command.json").read_text()
    assert "PATH" in os.environ and "PATH" not in cmd["env"]  # unchanged variables are not repeated
    assert not list(step_dir.glob("*.tmp.*"))
    assert_group_gone(result.pid)


def test_a_second_launch_in_the_same_step_dir_keeps_the_first_log(tmp_path):
    first = launch(spec(tmp_path, py("print('first run')")))
    second = launch(spec(tmp_path, py("print('second run')")))
    assert first.status == second.status == "ok"
    assert "second run" in second.log_path.read_text() and "first run" not in second.log_path.read_text()
    assert "first run" in (tmp_path / "step" / "stdout.prev1.log").read_text()


def test_exit_1_with_a_traceback_is_failed_with_the_exception_line(tmp_path):
    code = ("import sys\n"
            "print('working...')\n"
            "def inner():\n"
            "    raise ValueError('bad thing 42')\n"
            "inner()\n")
    result = launch(spec(tmp_path, py(code)))
    assert result.status == "failed" and result.returncode == 1
    assert result.reason.startswith("exit code 1") and "ValueError: bad thing 42" in result.reason
    lines = result.excerpt.splitlines()
    assert lines[0] == "Traceback (most recent call last):" and lines[-1] == "ValueError: bad thing 42"
    assert "in inner" in result.excerpt and "working..." not in result.excerpt
    assert_group_gone(result.pid)


def test_the_excerpt_is_the_last_traceback_and_at_most_40_lines(tmp_path):
    code = ("def deep(n):\n"
            "    if n == 0:\n"
            "        raise KeyError('the first one')\n"
            "    deep(n - 1)\n"
            "try:\n"
            "    deep(50)\n"
            "except KeyError as exc:\n"
            "    raise RuntimeError('the one that counts') from exc\n")
    result = launch(spec(tmp_path, py(code)))
    assert result.status == "failed"
    assert "RuntimeError: the one that counts" in result.reason
    lines = result.excerpt.splitlines()
    assert len(lines) <= EXCERPT_MAX_LINES and lines[-1] == "RuntimeError: the one that counts"
    assert "KeyError" not in result.excerpt


def test_usage_error_without_a_traceback_names_the_last_line(tmp_path):
    result = launch(spec(tmp_path, py("import sys; print('nsa-train: error: --stepz is not a flag', "
                                      "file=sys.stderr); sys.exit(2)")))
    assert result.status == "failed" and result.returncode == 2 and result.excerpt is None
    assert result.reason == "exit code 2: nsa-train: error: --stepz is not a flag"


def test_the_first_error_file_names_the_failing_rank(tmp_path):
    # what the trainer leaves when rank 1 crashes and rank 0 then fails in its next collective
    out_dir = tmp_path / "out"
    code = ("import os, sys, time\n"
            "out = sys.argv[1]\n"
            "os.makedirs(out)\n"
            "tb = 'Traceback (most recent call last):\\n  File \"t.py\", line 1, in step\\n{}\\n'\n"
            "open(os.path.join(out, 'error_rank1.txt'), 'w').write(tb.format('nsa.training.safety.InjectedCrash: boom')); "
            "time.sleep(0.05)\n"
            "open(os.path.join(out, 'error_rank0.txt'), 'w').write(tb.format('RuntimeError: peer closed'))\n"
            "open(os.path.join(out, 'status.json'), 'w').write('{\"status\": \"crashed\", \"reason\": \"x\"}')\n"
            "sys.exit(1)\n")
    result = launch(spec(tmp_path, py(code, str(out_dir)), trainer_out_dir=out_dir))
    assert result.status == "failed"
    assert result.reason == ("exit code 1 (rank 1): nsa.training.safety.InjectedCrash: boom; "
                             "trainer status.json: crashed (x)"), result.reason
    assert result.excerpt.splitlines()[-1] == "nsa.training.safety.InjectedCrash: boom"


def test_torchrun_failure_summary_is_parsed():
    summary = "\n".join([
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================",
        "nsa.training FAILED",
        "------------------------------------------------------------",
        "Failures:",
        "[1]:",
        "  time      : 2026-11-21_20:48:15",
        "  host      : localhost",
        "  rank      : 0 (local_rank: 0)",
        "  exitcode  : -15 (pid: 2085)  (SIGTERM)",
        "  error_file: <N/A>",
        "------------------------------------------------------------",
        "Root Cause (first observed failure):",
        "[0]:",
        "  time      : 2026-11-21_20:48:15",
        "  host      : localhost",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : 1 (pid: 2086) ",
        "============================================================",
    ])
    assert _torchrun_failures(summary) == (1, {0: -15, 1: 1})
    assert _torchrun_failures("nothing here") == (None, {})


def test_a_command_that_cannot_start_is_an_error_result(tmp_path):
    result = launch(spec(tmp_path, [str(tmp_path / "no-such-program"), "--x"]))
    assert result.status == "error" and result.returncode is None and result.pid is None
    assert "no-such-program" in result.reason
    assert (tmp_path / "step" / "command.json").is_file()
    assert "could not start" in result.log_path.read_text()


def test_invalid_specs_raise(tmp_path):
    with pytest.raises(TypeError):
        launch(spec(tmp_path, "python -c pass"))  # a shell string, not an argv list
    with pytest.raises(ValueError):
        launch(spec(tmp_path, py("pass"), nproc_per_node=0))
    with pytest.raises(ValueError):
        launch(spec(tmp_path, py("pass"), stall_timeout_s=3))  # a stall watch needs trainer_out_dir


def test_timeout_ends_a_child_that_obeys_sigterm(tmp_path):
    result = launch(spec(tmp_path, py(SPAWNER, "0"), timeout_s=1.5))
    assert result.status == "timeout" and "timed out after 1.5s" in result.reason and "SIGTERM" in result.reason
    assert result.duration_s < 1.5 + 3
    pids = spawned_pids(result.log_path)
    assert len(pids) == 3 and pids[0] == result.pid
    assert_all_dead(pids)
    assert_group_gone(result.pid)


def test_timeout_kills_a_tree_that_ignores_sigterm(tmp_path):
    # the child and both grandchildren ignore SIGTERM; one grandchild is in a session of its own
    result = launch(spec(tmp_path, py(SPAWNER, "1"), timeout_s=1.5, term_grace_s=2.0))
    assert result.status == "timeout" and "SIGKILL" in result.reason
    assert result.returncode == -signal.SIGKILL
    assert 1.5 + 2.0 <= result.duration_s < 1.5 + 2.0 + 4
    pids = spawned_pids(result.log_path)
    assert len(pids) == 3
    assert_all_dead(pids)
    assert_group_gone(result.pid)
    assert_group_gone(pids[2])


def test_processes_left_behind_by_a_finished_child_are_ended(tmp_path):
    code = ("import subprocess, sys\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)'], start_new_session=True)\n"
            "print('PIDS', g.pid, flush=True)\n")
    result = launch(spec(tmp_path, py(code)))
    assert result.status == "ok"
    pids = spawned_pids(result.log_path)
    assert len(pids) == 1
    assert_all_dead(pids)
    assert "left behind" in result.log_path.read_text()


def test_ctrl_c_ends_every_process_and_reraises(tmp_path):
    state = {}
    log_path = tmp_path / "step" / "stdout.log"

    def on_progress(p: Progress) -> None:
        if not state.get("sent") and spawned_pids(log_path):
            state["pids"] = spawned_pids(log_path)
            state["sent"] = True
            if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                signal.raise_signal(signal.SIGINT)  # a real Ctrl-C, delivered to this (main) thread
            raise KeyboardInterrupt  # in case a handler swallowed it

    t0 = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        launch(spec(tmp_path, py(SPAWNER, "1"), on_progress=on_progress, term_grace_s=1.0))
    assert time.monotonic() - t0 < 20
    pids = state["pids"]
    assert len(pids) == 3
    assert_all_dead(pids)
    assert_group_gone(pids[0])
    assert "interrupted" in log_path.read_text()


def test_a_ctrl_c_while_the_child_is_being_started_is_held_until_it_is_tracked():
    # Python's own Ctrl-C handler for the test, whatever this process inherited (a shell's background job starts
    # with SIGINT ignored)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        reached = []
        with pytest.raises(KeyboardInterrupt):
            with _sigint_deferred():
                signal.raise_signal(signal.SIGINT)
                reached.append("end of block")
        assert reached == ["end of block"]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


# --------------------------------------------------------------------------------------- heartbeats (fake ones)

HEARTBEATS = r"""
import json, os, socket, sys, time
out, n, hang = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
os.makedirs(out, exist_ok=True)
path = os.path.join(out, "heartbeat_rank0.jsonl")
def beat(step, msg, **metrics):
    rec = {"ts": time.time(), "rank": 0, "pid": os.getpid(), "host": socket.gethostname(), "step": step, "msg": msg}
    rec.update(metrics)
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
def dump(signum, frame):
    with open(os.path.join(out, "stackdump_rank0_1.txt"), "w") as f:
        f.write("# stack dump: rank 0\n\n## thread MainThread (1)\n  File \"fake.py\", line 1, in hang\n")
import signal
signal.signal(signal.SIGUSR1, dump)
beat(0, "boot")
for step in range(1, n + 1):
    time.sleep(0.15)
    beat(step, "step", toks_per_s=1000.0 * step, loss=1.0)
if hang:
    time.sleep(1000)
beat(n, "done")
"""


def test_progress_reports_steps_and_throughput_from_rank0_heartbeats(tmp_path):
    out_dir = tmp_path / "out"
    seen: list[Progress] = []
    result = launch(spec(tmp_path, py(HEARTBEATS, str(out_dir), "8", "0"), trainer_out_dir=out_dir,
                         stall_timeout_s=30, poll_s=0.05, on_progress=seen.append))
    assert result.status == "ok", result.reason
    steps = [p.step for p in seen if p.step is not None]
    assert len(set(steps)) >= 3 and steps == sorted(steps), steps
    tps = [p.toks_per_s for p in seen if p.toks_per_s is not None]
    assert tps and all(t > 0 for t in tps) and tps == sorted(tps)
    assert "running" in {p.state for p in seen}
    elapsed = [p.elapsed_s for p in seen]
    assert elapsed == sorted(elapsed)


def test_stale_heartbeats_of_an_earlier_run_do_not_count_as_a_stall(tmp_path):
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    old = {"ts": time.time() - 500, "rank": 0, "pid": 1, "host": socket.gethostname(), "step": 7, "msg": "step"}
    (out_dir / "heartbeat_rank0.jsonl").write_text(json.dumps(old) + "\n")
    result = launch(spec(tmp_path, py("import time; time.sleep(2)"), trainer_out_dir=out_dir, stall_timeout_s=1,
                         expected_ranks=1))
    assert result.status == "ok", result.reason


def test_a_stall_asks_for_stack_dumps_then_ends_the_run(tmp_path):
    out_dir = tmp_path / "out"
    result = launch(spec(tmp_path, py(HEARTBEATS, str(out_dir), "2", "1"), trainer_out_dir=out_dir,
                         stall_timeout_s=1.0, expected_ranks=1))
    assert result.status == "hang", result.reason
    assert "stalled" in result.reason and "rank 0" in result.reason and "1 stack dump file" in result.reason
    assert result.stack_dumps == [out_dir / "stackdump_rank0_1.txt"]
    assert "fake.py" in result.excerpt
    assert result.duration_s < 8
    assert_all_dead(heartbeat_pids(out_dir))
    assert_group_gone(result.pid)


TWO_RANKS_ONE_HANG = r"""
import json, os, socket, sys, time
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
def beat(rank, step, msg):
    rec = {"ts": time.time(), "rank": rank, "pid": os.getpid(), "host": socket.gethostname(), "step": step, "msg": msg}
    with open(os.path.join(out, f"heartbeat_rank{rank}.jsonl"), "a") as f:
        f.write(json.dumps(rec) + "\n")
def dump(signum, frame):
    for rank, where in ((0, "allreduce_wait"), (1, "hung_in_data_loader")):
        with open(os.path.join(out, f"stackdump_rank{rank}_1.txt"), "w") as f:
            f.write(f"# stack dump: rank {rank}\n\n## thread MainThread (1)\n  File \"fake.py\", line 1, in {where}\n")
import signal
signal.signal(signal.SIGUSR1, dump)
for rank in (0, 1):
    beat(rank, 0, "boot")
beat(0, 1, "step")      # rank 0 ends step 1, then waits in step 2's collective
time.sleep(0.1)
beat(1, 2, "fault")     # rank 1 writes its last heartbeat a moment later, then hangs
time.sleep(1000)
"""


def test_a_hang_names_every_rank_stalled_by_the_time_the_dumps_are_in_not_only_the_first_over_the_threshold(
        tmp_path):
    """The ranks of one hang stop moments apart, the one that hung last when it wrote a heartbeat before it hung:
    the first rank over the threshold is then one waiting for it. The result names the stall as it stands once the
    dumps are in, before the ranks are ended."""
    out_dir = tmp_path / "out"
    result = launch(spec(tmp_path, py(TWO_RANKS_ONE_HANG, str(out_dir)), trainer_out_dir=out_dir,
                         stall_timeout_s=1.0, expected_ranks=2, poll_s=0.05))
    assert result.status == "hang", result.reason
    assert "rank 0 last heartbeat" in result.reason and "rank 1 last heartbeat" in result.reason, result.reason
    assert "msg 'fault'" in result.reason, result.reason
    assert "allreduce_wait" in result.excerpt and "hung_in_data_loader" in result.excerpt, result.excerpt
    assert_group_gone(result.pid)


# -------------------------------------------------------------------------------------- parsing and argv shapes


def test_tracebacks_are_found_through_torchrun_prefixes_and_interleaving():
    text = "\n".join([
        "[default0]:[nsa-train r0] step 1/3",
        "[default1]:[rank1]: Traceback (most recent call last):",
        "[default1]:[rank1]:   File \"/work/nsa/train.py\", line 381, in run",
        "[default0]:[nsa-train r0] still going",
        "[default1]:[rank1]:     self.control.crash(step)",
        "[default1]:[rank1]: nsa.training.safety.InjectedCrash: NSA_FAULT injected crash at step 2 on rank 1",
        "E1121 20:48:15.533000 2043 api.py:1002] failed (exitcode: 1) local_rank: 1",
        "Traceback (most recent call last):",
        "  File \"run.py\", line 1, in <module>",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ])
    tbs = _tracebacks(text)
    assert [tb.rank for tb in tbs] == [1, None]
    assert tbs[0].exception == "nsa.training.safety.InjectedCrash: NSA_FAULT injected crash at step 2 on rank 1"
    assert tbs[0].lines == ["Traceback (most recent call last):", "  File \"/work/nsa/train.py\", line 381, in run",
                            "    self.control.crash(step)", tbs[0].exception]
    assert tbs[1].exception.startswith("torch.distributed.elastic.multiprocessing.errors.ChildFailedError")


def test_torchrun_argv_shapes(tmp_path):
    prefix = torchrun_prefix(2, 29555, tmp_path / "ranks")
    assert prefix[:5] == [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master-port=29555"]
    assert prefix[5:] == ["--log-dir", str(tmp_path / "ranks"), "--redirects", "3", "--tee", "3"]
    assert torchrun_prefix(2, 29555) == prefix[:5]
    mod = _torchrun_argv([sys.executable, "-m", "nsa.training", "--steps", "3"], prefix)
    assert mod[-4:] == ["-m", "nsa.training", "--steps", "3"] and "--no-python" not in mod
    script = _torchrun_argv([sys.executable, "x.py", "-a"], prefix)
    assert script[-2:] == ["x.py", "-a"]
    other = _torchrun_argv(["pytest", "-q"], prefix)
    assert other[-3:] == ["--no-python", "pytest", "-q"]
    assert 0 < free_port() < 65536


def test_torchrun_multi_node_prefixes():
    c10d = torchrun_prefix(2, 29555, nnodes=2, node_rank=1, rdzv_id="nsav-x")
    assert c10d[3:] == ["--nproc_per_node=2", "--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29555",
                        "--rdzv-id=nsav-x"]
    static = torchrun_prefix(1, 0, nnodes=3, node_rank=2, rdzv_backend="static", rdzv_endpoint="head:29600")
    assert static[3:] == ["--nproc_per_node=1", "--nnodes=3", "--node-rank=2", "--master-addr=head",
                          "--master-port=29600"]
    with pytest.raises(ValueError, match="rdzv_backend"):
        torchrun_prefix(1, 1, nnodes=2, rdzv_backend="etcd")


# ------------------------------------------------------------------------------------------ torchrun, real trainer


def test_port_clash_is_retried_on_a_fresh_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = launch(spec(tmp_path, py("import os; print('hello from rank', os.environ['RANK'])"),
                             torchrun=True, master_port=port, port_retries=2))
    assert result.status == "ok", result.reason + "\n" + result.log_path.read_text()[-3000:]
    assert result.attempts == 2 and result.master_port not in (None, port)
    assert f"--master-port={result.master_port}" in result.argv
    first = (tmp_path / "step" / "stdout.attempt1.log").read_text()
    assert "EADDRINUSE" in first or "address already in use" in first.lower()
    assert "hello from rank 0" in result.log_path.read_text()
    assert "hello from rank 0" in result.rank_logs[0].read_text()
    cmd = json.loads((tmp_path / "step" / "command.json").read_text())
    assert cmd["attempt"] == 2 and cmd["argv"] == result.argv
    assert_group_gone(result.pid)


def test_port_clash_without_retries_fails_with_the_reason(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = launch(spec(tmp_path, py("print('never')"), torchrun=True, master_port=busy.getsockname()[1],
                             port_retries=0))
    assert result.status == "failed" and result.attempts == 1
    assert "EADDRINUSE" in result.reason and "DistNetworkError" in result.excerpt


def test_trainer_two_ranks_ok_with_rank_logs_and_progress(tmp_path):
    out_dir = tmp_path / "out"
    seen: list[Progress] = []
    result = launch(spec(tmp_path, trainer_argv(out_dir, "--steps", "8", "--ddp", "1"), nproc_per_node=2,
                         trainer_out_dir=out_dir, stall_timeout_s=60, on_progress=seen.append, timeout_s=120))
    assert result.status == "ok", result.reason + "\n" + result.log_path.read_text()[-3000:]
    assert result.argv[1:3] == ["-m", "torch.distributed.run"] and "nsa.training" in result.argv
    assert sorted(result.rank_logs) == [0, 1]
    assert "[nsa-train r0]" in result.rank_logs[0].read_text()
    assert all(p.is_file() and p.stat().st_size > 0 for p in result.rank_logs.values())
    assert "trainer status.json: completed" in result.reason
    steps = [p.step for p in seen if p.step is not None]
    assert steps and steps == sorted(steps) and max(steps) >= 1
    assert any(p.toks_per_s and p.toks_per_s > 0 for p in seen)
    assert_all_dead(heartbeat_pids(out_dir))
    assert_group_gone(result.pid)


def test_trainer_crash_on_rank_1_names_the_rank_and_the_injected_crash(tmp_path):
    out_dir = tmp_path / "out"
    result = launch(spec(tmp_path, trainer_argv(out_dir, "--steps", "4", "--ddp", "1"), nproc_per_node=2,
                         env=child_env(NSA_FAULT="crash@2:1"), trainer_out_dir=out_dir, stall_timeout_s=60,
                         timeout_s=120))
    assert result.status == "failed" and result.returncode == 1, result.reason
    assert "NSA_FAULT injected crash" in result.reason and "rank 1" in result.reason
    assert "NSA_FAULT injected crash at step 2 on rank 1" in result.excerpt
    assert result.excerpt.startswith("Traceback") and len(result.excerpt.splitlines()) <= EXCERPT_MAX_LINES
    assert "trainer status.json: crashed" in result.reason
    assert sorted(result.rank_logs) == [0, 1]
    assert_all_dead(heartbeat_pids(out_dir))
    assert_group_gone(result.pid)


def test_trainer_hang_is_detected_dumped_and_ended_long_before_the_pg_timeout(tmp_path):
    out_dir = tmp_path / "out"
    result = launch(spec(tmp_path, trainer_argv(out_dir, "--steps", "50", "--ddp", "1", "--pg-timeout", "120"),
                         nproc_per_node=2, env=child_env(NSA_FAULT="hang@3:1"), trainer_out_dir=out_dir,
                         stall_timeout_s=3, timeout_s=110))
    assert result.status == "hang", result.reason + "\n" + result.log_path.read_text()[-3000:]
    assert result.duration_s < 60
    assert "stalled" in result.reason and "rank 1" in result.reason
    assert result.stack_dumps and all(p.stat().st_size > 0 for p in result.stack_dumps)
    names = [p.name for p in result.stack_dumps]
    assert any(n.startswith("stackdump_rank1_") for n in names), names  # Python-level dump of the hung rank
    assert any(n == "stackdump_rank0.txt" for n in names), names  # C-level dump of the rank stuck in the collective
    assert "hang" in result.excerpt
    pids = heartbeat_pids(out_dir)
    assert len(pids) == 2
    assert_all_dead(pids)
    assert_group_gone(result.pid)
