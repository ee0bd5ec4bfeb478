"""validation.launch.diagnosis on logs of unusual shape: a tail of blank lines (what torchrun's summary patterns scan
line by line), a log cut without its final newline, and a rank whose log shows a handled traceback (a compiler's
warning) before what really ended it: an NCCL watchdog's abort, the OOM killer's SIGKILL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.launch import LaunchSpec
from validation.launch.diagnosis import explain, torchrun_failures

SUMMARY = ["Failures:", "[1]:", "  time      : 2026-11-30_10:20:13", "  host      : localhost",
           "  rank      : 0 (local_rank: 0)", "  exitcode  : -15 (pid: 2600)", "-" * 54,
           "Root Cause (first observed failure):", "[0]:", "  time      : 2026-11-30_10:20:12",
           "  host      : localhost", "  rank      : 1 (local_rank: 1)", "  exitcode  : -9 (pid: 2601)", "=" * 54]


def test_torchruns_summary_is_read_across_blank_lines_and_crlf_endings():
    """The summary's figures as torchrun prints them, after a run of blank lines and with CRLF line ends."""
    text = "\n" * 1000 + "\n".join(SUMMARY) + "\n"
    assert torchrun_failures(text) == (1, {0: -15, 1: -9})
    assert torchrun_failures(text.replace("\n", "\r\n")) == (1, {0: -15, 1: -9})


def test_a_tail_of_blank_lines_is_diagnosed_without_scanning_it_once_per_line(tmp_path):
    """A failed launch whose log ends in 2 MiB of blank lines (what the diagnosis reads of a log: its tail). Before
    the fix the summary patterns, anchored at each line start with a blank class that spans lines, retried every
    line to the end of the run: some 2 * 10**12 steps, hours of one core, where a linear scan takes a fraction of a
    second. Run in a child process so that the old code cannot hold the suite: the bound (120 s) is several hundred
    times what the new code needs on a loaded 2-core machine."""
    log = tmp_path / "stdout.log"
    log.write_text("[default1]:step 3 loss 2.1\n" + "\n" * (2 << 20))
    code = ("import sys\nfrom validation.launch.diagnosis import torchrun_failures, read_tail\n"
            "print(torchrun_failures(read_tail(sys.argv[1])))\n")
    done = subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "(None, {})", done.stderr


def test_a_rank_log_without_a_final_newline_names_its_last_line(tmp_path):
    """A rank killed mid-write (SIGKILL, exit -9): its log's last line has no newline; the reason names it."""
    log_path = tmp_path / "stdout.log"
    log_path.write_text("\n".join(["[default1]:step 3 loss 2.1", "[default1]:step 4 lo", *SUMMARY]))
    run = SimpleNamespace(status="failed", returncode=1, how_ended="", last_step=None, error="")
    reason, excerpt = explain(run, log_path, {1: _rank_log(tmp_path, "step 3 loss 2.1\nstep 4 lo")}, None,
                              time.time() - 60, [], LaunchSpec(argv=["x"], env={}))
    assert reason == "exit code 1 (rank 1: killed by SIGKILL (exit code -9)): step 4 lo"
    assert excerpt is None


def _rank_log(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "rank1.log"
    path.write_text(text)
    return path


# a warning torch._dynamo logs with the traceback of a frame it could not compile; the rank goes on training
HANDLED = ["W1130 10:20:01.000000 2601 torch/_dynamo/convert_frame.py:1125] WON'T CONVERT forward model.py line 80",
           "W1130 10:20:01.000000 2601 torch/_dynamo/convert_frame.py:1125] due to:",
           "Traceback (most recent call last):",
           '  File "/venv/lib/python3.11/site-packages/torch/_dynamo/convert_frame.py", line 1064, in __call__',
           "    result = self._inner_convert(",
           "torch._dynamo.exc.Unsupported: call_function BuiltinVariable(print) [ConstantVariable()] {}",
           "",
           "step 10 loss 3.1"]
WATCHDOG_ABORT = [
    "[E1130 10:30:01.159932949 ProcessGroupNCCL.cpp:616] [Rank 1] Watchdog caught collective operation timeout: "
    "WorkNCCL(SeqNum=808, OpType=ALLREDUCE, NumelIn=9801523, NumelOut=9801523, Timeout(ms)=600000) ran for 600030 "
    "milliseconds before timing out.",
    "terminate called after throwing an instance of 'c10::DistBackendError'",
    "  what():  [PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated with exception: "
    "[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=808, OpType=ALLREDUCE)",
    "Exception raised from checkTimeout at /pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:632 "
    "(most recent call first):",
    "frame #0: c10::Error::Error(c10::SourceLocation, std::string) + 0x96 (0x7f5a9616c1b6 in libc10.so)"]


def _explain(tmp_path: Path, err: list[str], code: int, own_log: bool) -> tuple[str, str | None]:
    """The reason for a launch whose rank 1 ended first with `code`, its stderr `err`: from its own log (torchrun's
    per-rank files) when `own_log`, else from the combined log's "[default1]:" lines."""
    summary = [line.replace("exitcode  : -9", f"exitcode  : {code}") for line in SUMMARY]
    log_path = tmp_path / "stdout.log"
    log_path.write_text("\n".join(["[default0]:step 10 loss 3.1", *(f"[default1]:{line}" for line in err), *summary])
                        + "\n")
    rank_logs = {1: _rank_log(tmp_path, "\n".join(err) + "\n")} if own_log else {}
    run = SimpleNamespace(status="failed", returncode=1, how_ended="", last_step=None, error="")
    return explain(run, log_path, rank_logs, None, time.time() - 60, [], LaunchSpec(argv=["x"], env={}))


@pytest.mark.parametrize("own_log", [True, False])
def test_an_nccl_abort_after_a_handled_traceback_is_named_not_the_traceback(tmp_path, own_log):
    """Before the fix the reason named the warning's exception (torch._dynamo.exc.Unsupported), logged minutes
    before the watchdog's abort that ended the rank."""
    reason, _ = _explain(tmp_path, HANDLED + WATCHDOG_ABORT, -6, own_log)
    assert reason.startswith("exit code 1 (rank 1: killed by SIGABRT (exit code -6)): c10::DistBackendError: "
                             "[PG ID 0 PG GUID 0(default_pg) Rank 1] Process group watchdog thread terminated"), reason


@pytest.mark.parametrize("own_log", [True, False])
def test_a_rank_sigkilled_after_a_handled_traceback_is_named_by_its_last_output(tmp_path, own_log):
    """The OOM killer ends rank 1 (SIGKILL: no exception of its own) after it went on training past a warning's
    traceback: its last output says where, the warning's exception never why."""
    reason, excerpt = _explain(tmp_path, HANDLED + ["step 11 loss 3.0"], -9, own_log)
    assert reason == "exit code 1 (rank 1: killed by SIGKILL (exit code -9)): step 11 loss 3.0"
    assert excerpt is None


@pytest.mark.parametrize("code", [1, -9])
def test_a_traceback_that_is_the_last_word_stays_the_reason(tmp_path, code):
    """A traceback nothing follows (exit 1; or killed while it was being handled) is still what the reason names,
    its excerpt the traceback."""
    err = ["step 10 loss 3.1", "Traceback (most recent call last):", '  File "train.py", line 9, in <module>',
           "ValueError: loss is nan", ""]
    reason, excerpt = _explain(tmp_path, err, code, True)
    assert reason.endswith("): ValueError: loss is nan"), reason
    assert excerpt.splitlines()[-1] == "ValueError: loss is nan"


def test_a_rank_stream_cut_mid_line_keeps_the_next_header_off_its_last_line(tmp_path):
    """collect_rank_logs joins a rank's stdout.log and stderr.log under a header each: a stdout cut mid-line (a
    SIGKILLed rank) had the stderr header glued to its last line, which the diagnosis then named as the reason
    ('step 4 lo===== rank 1 stderr ...'). The line stays its own."""
    from validation.launch.attempt import collect_rank_logs

    d = tmp_path / "ranks" / "none_ab12cd34" / "attempt_0" / "1"
    d.mkdir(parents=True)
    (d / "stdout.log").write_bytes(b"step 3 loss 2.1\nstep 4 lo")
    (d / "stderr.log").write_bytes(b"")
    logs = collect_rank_logs(tmp_path / "ranks", tmp_path / "stdout.log")
    lines = logs[1].read_text().splitlines()
    assert "step 4 lo" in lines and any(line.startswith("===== rank 1 stderr") for line in lines)
