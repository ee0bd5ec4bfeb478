"""validation.launch.diagnosis and the port-clash retry of validation.launch.attempt on failure output as PyTorch,
torchrun, NCCL and gloo print it (logs and error files written here, no process started): the reason names the
failing rank, how it ended and the first line that says why; only a port clash is retried."""

from __future__ import annotations

import ast
import os
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import pytest

import validation.launch.attempt as attempt
from validation.launch import LaunchSpec
from validation.launch.attempt import collect_rank_logs, launch
from validation.launch.diagnosis import explain, port_clash

TORCHRUN_TB = [
    "Traceback (most recent call last):",
    '  File "/usr/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 383, in launch_agent',
    "    raise ChildFailedError(",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
]


def entry(idx: int, rank: int, code: int, when: str = "2026-11-30_10:20:12") -> list[str]:
    """One failure of torchrun's summary, as torch.distributed.elastic formats it."""
    name = {-6: "  (SIGABRT)", -9: "  (SIGKILL)", -11: "  (SIGSEGV)", -15: "  (SIGTERM)"}.get(code, "")
    signum = {-6: "6 (SIGABRT)", -9: "9 (SIGKILL)", -11: "11 (SIGSEGV)", -15: "15 (SIGTERM)"}.get(code)
    return [f"[{idx}]:", f"  time      : {when}", "  host      : localhost",
            f"  rank      : {rank} (local_rank: {rank})", f"  exitcode  : {code} (pid: {2600 + rank}){name}",
            "  error_file: <N/A>",
            f"  traceback : Signal {signum} received by PID {2600 + rank}" if signum else
            "  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html"]


def summary(root: list[str], others: list[list[str]] = ()) -> list[str]:
    rule = "=" * 54
    return TORCHRUN_TB + [rule, "train.py FAILED", "-" * 54, "Failures:",
                          *([line for o in others for line in o] or ["  <NO_OTHER_FAILURES>"]), "-" * 54,
                          "Root Cause (first observed failure):", *root, rule]


def write_rank_dirs(step: Path, outputs: dict[int, tuple[str, str]]) -> None:
    """torchrun --log-dir files: ranks/<run id>/attempt_0/<local rank>/{stdout,stderr}.log."""
    for rank, (out, err) in outputs.items():
        d = step / "ranks" / "none_ab12cd34" / "attempt_0" / str(rank)
        d.mkdir(parents=True)
        (d / "stdout.log").write_text(out)
        (d / "stderr.log").write_text(err)


def diagnose(step: Path, log: list[str], out_dir: Path | None = None, returncode: int = 1):
    log_path = step / "stdout.log"
    log_path.write_text("\n".join(log) + "\n")
    rank_logs = collect_rank_logs(step / "ranks", log_path)
    run = SimpleNamespace(status="failed", returncode=returncode, how_ended="", last_step=None, error="")
    return explain(run, log_path, rank_logs, out_dir, time.time() - 60, [], LaunchSpec(argv=["x"], env={}))


def write_error_file(out_dir: Path, rank: int, exception: str, age_s: float = 0.0) -> None:
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"error_rank{rank}.txt"
    path.write_text("Traceback (most recent call last):\n  File \"/work/nsa/training/trainer.py\", line 520, in run\n"
                    f"    loss = self._step(batch)\n{exception}\n")
    t = time.time() - age_s
    os.utime(path, (t, t))


GLOO_PEER_GONE = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer "
                  "[127.0.0.1]:18121")


# ------------------------------------------------------------------------------------ a rank killed by a signal

def test_a_rank_killed_with_nothing_on_stderr_is_named_by_its_last_output_not_a_log_header(tmp_path):
    # as a real 2-rank gloo run prints it when rank 1 is SIGKILLed (the OOM killer) after its first step
    write_rank_dirs(tmp_path, {0: ("step 1 done\n", ""), 1: ("step 1 done\n", "")})
    log = ["[default1]:step 1 done", "[default0]:step 1 done",
           "W1130 10:20:12.584000 2615 api.py:1028] Sending process 2600 closing signal SIGTERM",
           "E1130 10:20:12.785000 2615 api.py:1002] failed (exitcode: -9) local_rank: 1 (pid: 2601) of binary: python",
           *summary(entry(0, 1, -9), [entry(1, 0, -15)])]
    reason, excerpt = diagnose(tmp_path, log)
    assert reason == "exit code 1 (rank 1: killed by SIGKILL (exit code -9)): step 1 done"
    assert excerpt is None


def test_a_rank_killed_before_printing_anything_has_no_message_not_torchruns_own_traceback(tmp_path):
    write_rank_dirs(tmp_path, {0: ("step 1 done\n", ""), 1: ("", "")})
    reason, excerpt = diagnose(tmp_path, ["[default0]:step 1 done", *summary(entry(0, 1, -11), [entry(1, 0, -15)])])
    assert reason == "exit code 1 (rank 1: killed by SIGSEGV (exit code -11)) (no error message in the logs)"
    assert excerpt is None


NCCL_WATCHDOG_ABORT = [
    "[rank0]:[E626 06:24:44.159932949 ProcessGroupNCCL.cpp:616] [Rank 0] Watchdog caught collective operation "
    "timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for "
    "600030 milliseconds before timing out.",
    "[rank0]:[E626 06:24:44.160366013 ProcessGroupNCCL.cpp:1785] [PG ID 0 PG GUID 0(default_pg) Rank 0] Exception "
    "(either an error or timeout) detected by watchdog at work: 808, last enqueued NCCL work: 811, last completed "
    "NCCL work: 807.",
    "terminate called after throwing an instance of 'c10::DistBackendError'",
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with exception: "
    "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE, "
    "NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600030 milliseconds before timing out.",
    "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632 "
    "(most recent call first):",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f5a9616c1b6 in "
    "/venv/lib/python3.11/site-packages/torch/lib/libc10.so)",
    "frame #1: c10d::ProcessGroupNCCL::watchdogHandler() + 0x890 (0x7f5a4441d7d0 in "
    "/venv/lib/python3.11/site-packages/torch/lib/libtorch_cuda.so)",
    "frame #2: clone + 0x44 (0x7fe18c62fa04 in /usr/lib/x86_64-linux-gnu/libc.so.6)",
    "",
]


def test_an_nccl_watchdog_abort_names_the_collective_that_timed_out_not_a_stack_frame(tmp_path):
    write_rank_dirs(tmp_path, {0: ("step 5 loss 3.2\n", "\n".join(NCCL_WATCHDOG_ABORT)),
                               1: ("step 5 loss 3.2\n", "")})
    log = [f"[default0]:{line}" for line in NCCL_WATCHDOG_ABORT] + summary(entry(0, 0, -6), [entry(1, 1, -15)])
    reason, _ = diagnose(tmp_path, log)
    assert reason.startswith("exit code 1 (rank 0: killed by SIGABRT (exit code -6)): c10::DistBackendError: "
                             "[PG ID 0 PG GUID 0(default_pg) Rank 0] Process group watchdog thread terminated with "
                             "exception: [Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, "
                             "OpType=ALLREDUCE"), reason
    assert "frame #" not in reason


def test_a_cuda_error_in_a_cpp_thread_names_its_first_message_line(tmp_path):
    err = ["terminate called after throwing an instance of 'c10::Error'",
           "  what():  CUDA error: an illegal memory access was encountered",
           "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
           "might be incorrect.",
           "For debugging consider passing CUDA_LAUNCH_BLOCKING=1",
           "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.",
           "",
           "Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:43 "
           "(most recent call first):",
           "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f in libc10.so)",
           ""]
    write_rank_dirs(tmp_path, {0: ("", "\n".join(err))})
    reason, _ = diagnose(tmp_path, [f"[default0]:{line}" for line in err] + summary(entry(0, 0, -6)))
    assert reason == ("exit code 1 (rank 0: killed by SIGABRT (exit code -6)): c10::Error: CUDA error: an illegal "
                      "memory access was encountered")


# ------------------------------------------------------------------- the error file of a rank that lost its peer

def test_a_rank_the_oom_killer_ended_first_outranks_the_error_file_of_the_peer_that_lost_it(tmp_path):
    out_dir = tmp_path / "out"
    write_error_file(out_dir, 0, GLOO_PEER_GONE)
    write_rank_dirs(tmp_path, {0: ("step 3 loss 2.1\n", ""), 1: ("step 3 loss 2.1\n", "")})
    log = summary(entry(0, 1, -9, "2026-11-30_10:20:12"), [entry(1, 0, 1, "2026-11-30_10:20:13")])
    reason, excerpt = diagnose(tmp_path, log, out_dir)
    assert reason == "exit code 1 (rank 1: killed by SIGKILL (exit code -9)): step 3 loss 2.1"
    # the peer still writing its error file when torchrun stopped it (SIGTERM): the same
    log = summary(entry(0, 1, -9), [entry(1, 0, -15)])
    assert diagnose(tmp_path, log, out_dir)[0] == "exit code 1 (rank 1: killed by SIGKILL (exit code -9)): step 3 loss 2.1"


def test_the_error_file_stays_the_cause_when_torchrun_cannot_tell_which_came_first(tmp_path):
    out_dir = tmp_path / "out"
    write_error_file(out_dir, 0, GLOO_PEER_GONE)
    write_rank_dirs(tmp_path, {0: ("", ""), 1: ("", "")})
    # both noticed in the same poll: torchrun's root cause is only the lower index
    log = summary(entry(0, 1, -9), [entry(1, 0, 1)])
    assert diagnose(tmp_path, log, out_dir)[0] == f"exit code 1 (rank 0: exit code 1): {GLOO_PEER_GONE}"
    # a Python crash (exit 1, its error file) first, the peer stopped by torchrun: the crash
    (out_dir / "error_rank0.txt").unlink()
    write_error_file(out_dir, 1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 1 "
                     "has a total capacity of 79.15 GiB of which 1.23 GiB is free.")
    log = summary(entry(0, 1, 1), [entry(1, 0, -15)])
    reason, excerpt = diagnose(tmp_path, log, out_dir)
    assert reason.startswith("exit code 1 (rank 1: exit code 1): torch.OutOfMemoryError: CUDA out of memory. "
                             "Tried to allocate 2.00 GiB")
    assert excerpt.splitlines()[-1].startswith("torch.OutOfMemoryError: CUDA out of memory.")


# ---------------------------------------------------------------------------------------------- port clashes

CLASH_NOW = ("torch.distributed.DistNetworkError: The server socket has failed to listen on any local network "
             "address. port: 35397, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use")
CLASH_OLD = ("RuntimeError: The server socket has failed to listen on any local network address. The server socket "
             "has failed to bind to [::]:29500 (errno: 98 - Address already in use). The server socket has failed "
             "to bind to 0.0.0.0:29500 (errno: 98 - Address already in use).")


def torchrun_clash(message: str) -> str:
    return "\n".join(TORCHRUN_TB[:3] + [message]) + "\n"


def rank_oom_with_a_clash_line() -> str:
    return "\n".join([
        "[default0]:OSError: [Errno 98] Address already in use",
        "[default0]:Traceback (most recent call last):",
        '[default0]:  File "train.py", line 9, in <module>',
        "[default0]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 GiB",
        *summary(entry(0, 0, 1)),
    ]) + "\n"


def test_port_clash_is_torchruns_own_failure_to_bind_only(tmp_path):
    log = tmp_path / "stdout.log"
    for text in (torchrun_clash(CLASH_NOW), torchrun_clash(CLASH_OLD)):
        log.write_text(text)
        assert port_clash(log)
    # a rank's own "address already in use", then its out-of-memory failure: the workers ran, not a clash
    log.write_text(rank_oom_with_a_clash_line())
    assert not port_clash(log)
    # torchrun's own bind warning (IPv6 taken, IPv4 bound), then a worker failed: not a clash either
    log.write_text("[W socket.cpp:464] [c10d] The server socket has failed to bind to [::]:29500 (errno: 98 - "
                   "Address already in use).\n" + "\n".join(summary(entry(0, 0, 1))) + "\n")
    assert not port_clash(log)


class FakeRun:
    """validation.launch.local.Run's face to launch(): each attempt writes the next log text and fails."""

    logs: list[str] = []
    made: list[list[str]] = []

    def __init__(self, spec, argv, log_path, started, deadline):
        self.spec, self.argv, self.log_path, self.started = spec, argv, log_path, started
        self.status, self.returncode, self.how_ended, self.error = "failed", 1, "", ""
        self.last_step, self.stack_dumps, self.pid, self.launch_id = None, [], None, "x"
        FakeRun.made.append(argv)

    def execute(self):
        self.log_path.write_text(FakeRun.logs[min(len(FakeRun.made), len(FakeRun.logs)) - 1])


@pytest.fixture
def fake_run(monkeypatch):
    FakeRun.logs, FakeRun.made = [], []
    monkeypatch.setattr(attempt, "Run", FakeRun)
    return FakeRun


def test_only_a_port_clash_is_retried_never_an_out_of_memory_failure(tmp_path, fake_run):
    fake_run.logs = [torchrun_clash(CLASH_NOW)]
    result = launch(LaunchSpec(argv=["python", "t.py"], env={}, step_dir=tmp_path / "a", torchrun=True,
                               port_retries=2))
    assert result.attempts == 3 and "EADDRINUSE" in result.reason
    fake_run.made = []
    fake_run.logs = [rank_oom_with_a_clash_line()]
    result = launch(LaunchSpec(argv=["python", "t.py"], env={}, step_dir=tmp_path / "b", torchrun=True,
                               port_retries=2))
    assert result.attempts == 1 and "torch.OutOfMemoryError: CUDA out of memory" in result.reason
    assert not list((tmp_path / "b").glob("stdout.attempt*.log"))


def test_a_clash_on_a_given_multi_node_endpoint_is_not_retried_on_the_same_port(tmp_path, fake_run):
    fake_run.logs = [torchrun_clash(CLASH_NOW)]
    result = launch(LaunchSpec(argv=["python", "t.py"], env={}, step_dir=tmp_path / "fixed", nnodes=2,
                               rdzv_endpoint="127.0.0.1:29611", port_retries=2))
    assert result.attempts == 1 and result.status == "failed"
    fake_run.made = []
    result = launch(LaunchSpec(argv=["python", "t.py"], env={}, step_dir=tmp_path / "picked", nnodes=2,
                               port_retries=2))
    assert result.attempts == 3  # the launcher's own endpoint: a fresh port every attempt


# ------------------------------------------------------------------------------- a node of a multi-node launch

def test_a_node_agent_killed_by_a_signal_is_named_from_the_agents_exit_code(tmp_path):
    # validation.launch.agents exits 128 + N when the first agent to fail was killed by signal N
    log_path = tmp_path / "stdout.log"
    log_path.write_text("[default0]:step 2 loss 2.5\n[agents] node1 exited with -9 (killed by SIGKILL)\n"
                        "[agents] node0 exited with 1\n")
    run = SimpleNamespace(status="failed", returncode=137, how_ended="", last_step=None, error="")
    spec = LaunchSpec(argv=["x"], env={}, nnodes=2)
    reason, _ = explain(run, log_path, {}, None, time.time() - 60, [], spec)
    assert reason.startswith("exit code 137 (a node's torchrun agent was killed by SIGKILL)"), reason
    # one node: 137 is the child's own exit code, nothing is read into it
    reason, _ = explain(run, log_path, {}, None, time.time() - 60, [], LaunchSpec(argv=["x"], env={}))
    assert reason == "exit code 137: [agents] node0 exited with 1"


# ---------------------------------------------------------------------------------------- Triton compile errors

KERNEL = '''def _fwd_kernel(Q, Out, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)

    q = tl.load(Q + offs)
    acc = tl.dot(q, q)
    tl.store(Out + offs, acc)
'''


def test_a_triton_compile_error_names_what_was_wrong_and_keeps_the_kernel_line(tmp_path):
    errors = pytest.importorskip("triton.compiler.errors")
    node = ast.parse(KERNEL).body[0].body[2].value  # the tl.dot call, after a blank line in the kernel
    problem = "ValueError('Cannot make_shape_compatible: incompatible dimensions at index 0: 64 and 32')"
    try:
        raise errors.CompilationError(KERNEL, node, problem)
    except errors.CompilationError:
        text = traceback.format_exc()  # as the trainer writes error_rank{r}.txt
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    (out_dir / "error_rank0.txt").write_text(text)
    reason, excerpt = diagnose(tmp_path, [""], out_dir)
    assert reason == f"exit code 1 (rank 0): triton.compiler.errors.CompilationError: at 5:10: {problem}"
    lines = excerpt.splitlines()
    assert lines[-3:] == ["    acc = tl.dot(q, q)", "          ^", problem]
    assert "triton.compiler.errors.CompilationError: at 5:10:" in lines


# ------------------------------------------------------------------------------------------------------ a hang

# faulthandler's dump (all threads) when SIGUSR1 landed on a thread that threading started, not on the main thread
# where the rank waits; as faulthandler writes it
DUMP_ON_A_WORKER_THREAD = """Current thread 0x00007f9dcfdee6c0 (most recent call first):
  File "/work/nsa/training/heartbeat.py", line 88 in _writer
  File "/usr/lib/python3.11/threading.py", line 982 in run
  File "/usr/lib/python3.11/threading.py", line 1045 in _bootstrap_inner
  File "/usr/lib/python3.11/threading.py", line 1002 in _bootstrap

Thread 0x00007f9dd0c30b80 (most recent call first):
  File "/usr/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 2501 in all_reduce
  File "/work/nsa/training/trainer.py", line 512 in _step
  File "/work/nsa/training/__main__.py", line 4 in <module>
"""


def test_a_hang_shows_where_the_main_thread_waits_when_the_signal_landed_on_another_thread(tmp_path):
    dump = tmp_path / "stackdump_rank1.txt"
    dump.write_text(DUMP_ON_A_WORKER_THREAD)
    log_path = tmp_path / "stdout.log"
    log_path.write_text("")
    run = SimpleNamespace(status="hang", returncode=None, how_ended="SIGTERM", last_step=4, error="",
                          verdict=SimpleNamespace(reason="rank 1 wrote no heartbeat for 30s", stalled_ranks=[1]),
                          signalled=[4242])
    _, excerpt = explain(run, log_path, {}, None, time.time() - 60, [dump], LaunchSpec(argv=["x"], env={}))
    lines = excerpt.splitlines()
    assert lines[0] == "rank 1 (stackdump_rank1.txt, C level, at the signal, innermost first):"
    assert "in all_reduce" in lines[1] and "in _step" in lines[2] and "in <module>" in lines[3]
    assert "_writer" not in excerpt
