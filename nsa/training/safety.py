"""Run control for the trainer: stack dumps, clean stops, and deliberate faults.

- SIGUSR1: every thread's stack goes to out_dir/stackdump_rank{r}_{time}.txt (Python level, with thread names
  and the current step) and, from the C level, to out_dir/stackdump_rank{r}.txt (faulthandler: written even
  when the main thread is stuck inside a C call such as a hung collective). Training continues.
- SIGTERM / SIGHUP / SIGINT: a stop is requested; the trainer finishes the current step, saves a checkpoint and exits
  0 (SIGHUP: a terminal closed under `nsa-train`, or torchrun passing on the SIGHUP it received, which ended the rank
  with status.json "running" before). A second SIGINT raises KeyboardInterrupt as usual. Once the trainer writes
  its last records (RunControl.hold), SIGTERM, SIGINT and SIGHUP are recorded and not acted on, so that those
  records end complete.
- out_dir/.HALT (written by a person or `nsa-train watchdog`): stop at the next step with a final checkpoint.
- NSA_FAULT (nsa.toggles.Fault): crash, hang or NaN at a given step on purpose, for testing the validation suite:
  crash raises InjectedCrash (exit 1, status crashed); hang blocks the rank until SIGTERM/SIGINT/SIGKILL (the
  other ranks then block in the next collective until the process-group timeout or a watchdog); nan makes the
  rank's loss NaN (every rank stops at that step, exit 3, status nonfinite). The csv_* kinds make rank 0 damage
  its own training.csv after writing that step's row (damage_training_csv), as a dying disk or writer would:
  training itself goes on and ends as usual. wait@STAGE[:RANK] holds a rank at a start-up stage (``wait_at``:
  "imports", before `python -m nsa.training` imports torch; "pg_init", right before the process group is set up)
  so the launcher's signal handling can be tested there; each rank records the stages it reaches. slow_step@SHARE
  makes every step of every rank sleep SHARE times its own time before the step's clock stops (RunControl.slow_step):
  a uniform slowdown of tokens/s by SHARE / (1 + SHARE), for measuring whether a comparison of runs detects it.

All ranks agree on stopping through one small all-reduce per step in the trainer, so one rank's signal, .HALT
or non-finite loss stops every rank at the same step.
"""

from __future__ import annotations

import ctypes
import faulthandler
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from nsa import toggles
from nsa.toggles import Fault
from nsa.training.outputs import write_json
from nsa.training.watchdog import HALT_NAME


class InjectedCrash(RuntimeError):
    """Raised by NSA_FAULT=crash@STEP."""


# csv faults after which the trainer writes no more rows (the file is gone, empty, or ends mid-row); its writer is
# closed before the damage. After csv_garble it goes on appending.
CSV_FAULTS_STOPPING_WRITER = ("csv_missing", "csv_empty", "csv_truncate")


def damage_training_csv(path: Path, kind: str) -> None:
    """Damage training.csv at `path` as NSA_FAULT kind `kind` says:

        csv_missing   delete the file
        csv_empty     truncate it to 0 bytes
        csv_truncate  cut it in the middle of its last row: no newline at the end, the row's second half gone
        csv_garble    every cell of its last row but the step becomes x's, in place and of the same length (so
                      a writer still open at the end of the file goes on appending rows after it)
    """
    path = Path(path)
    if kind == "csv_missing":
        path.unlink(missing_ok=True)
        return
    if kind == "csv_empty":
        path.write_bytes(b"")
        return
    data = path.read_bytes()
    body = data.rstrip(b"\r\n")
    start = body.rfind(b"\n") + 1  # the last row (or the header, when no row was written yet)
    row = body[start:]
    if kind == "csv_truncate":
        path.write_bytes(data[:start] + row[: max(1, len(row) // 2)])
        return
    if kind == "csv_garble":
        cells = row.split(b",")
        garbled = b",".join(cells[:1] + [b"x" * max(1, len(c)) if c else b"" for c in cells[1:]])
        with open(path, "r+b") as f:
            f.seek(start)
            f.write(garbled[: len(row)])
        return
    raise ValueError(f"not a training.csv fault: {kind!r}")


def stop_with_launcher() -> None:
    """Under torchrun (Linux): a SIGTERM to this rank when its torchrun agent dies, even by SIGKILL
    (PR_SET_PDEATHSIG), so the rank stops at its next step with a checkpoint instead of running on alone; if the
    agent is already gone, now. Call it once the SIGTERM handler is installed."""
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RUN_ID" not in os.environ:
        return

    parent = os.getppid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
    except OSError:
        return
    if os.getppid() != parent or parent == 1:  # the agent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


FAULT_STAGE_FILE = "fault_stage_rank{rank}.json"  # NSA_FAULT=wait@...: the last start-up stage a rank reached


def wait_at(stage: str, fault: Fault | None, out_dir: str | Path | None, rank: int) -> None:
    """NSA_FAULT=wait@STAGE[:RANK] (a testing aid): with a wait fault set, record that this rank reached `stage`
    (out_dir/fault_stage_rank{r}.json: {"stage", "waiting", "rank", "pid", "time"}, replaced whole) and, when the
    fault names this stage and rank, stay here until a signal ends the process (no handler is installed this
    early: SIGTERM, SIGHUP and SIGINT end it at once). Does nothing for other faults or none."""
    if fault is None or fault.kind != "wait":
        return
    waiting = fault.stage == stage and (fault.rank is None or fault.rank == rank)
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_json(Path(out_dir) / FAULT_STAGE_FILE.format(rank=rank),
                   {"stage": stage, "waiting": waiting, "rank": rank, "pid": os.getpid(), "time": time.time()})
    while waiting:
        time.sleep(0.2)


def early_start(argv: list[str] | None = None, environ=os.environ) -> None:
    """First thing `python -m nsa.training` does, before it imports torch: under torchrun, ask for SIGTERM when
    the agent dies (``stop_with_launcher``: no SIGTERM handler is installed yet, so the rank simply ends; a rank
    that would otherwise install it only after its imports keeps running alone if the agent is killed
    meanwhile), then NSA_FAULT=wait@imports. The out_dir comes from --out-dir in `argv`."""
    stop_with_launcher()
    try:
        fault = toggles.parse("NSA_FAULT", environ)
    except ValueError:  # reported properly once the trainer reads its toggles
        return
    if fault is None or fault.kind != "wait":
        return
    args = list(sys.argv[1:] if argv is None else argv)
    out_dir = None
    for i, arg in enumerate(args):
        if arg == "--out-dir" and i + 1 < len(args):
            out_dir = args[i + 1]
        elif arg.startswith("--out-dir="):
            out_dir = arg.split("=", 1)[1]
    try:
        rank = int(environ.get("RANK", "0") or 0)
    except ValueError:
        rank = 0
    wait_at("imports", fault, out_dir, rank)


class RunControl:
    def __init__(self, out_dir: Path, rank: int, fault: Fault | None = None):
        self.out_dir, self.rank, self.fault = Path(out_dir), rank, fault
        self.stop_signal: str | None = None
        self.step = 0
        self._installed: dict[int, object] = {}
        self._fault_file = None
        self._interrupts = 0
        self._holding = False
        self.held: list[str] = []  # the signals received while held (hold), by name, in their order

    # ------------------------------------------------------------------ signals
    def install(self) -> None:
        """Install the handlers (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        self._installed[signal.SIGTERM] = signal.signal(signal.SIGTERM, self._on_stop)
        self._installed[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_stop)
        hangup = getattr(signal, "SIGHUP", None)  # a closed terminal, or torchrun passing on its own (not on Windows)
        if hangup is not None:
            self._installed[hangup] = signal.signal(hangup, self._on_stop)
        self._installed[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_usr1)
        stop_with_launcher()
        # C-level dump chained in front of the Python handler: works while the interpreter is blocked
        self._fault_file = open(self.out_dir / f"stackdump_rank{self.rank}.txt", "a")
        faulthandler.register(signal.SIGUSR1, file=self._fault_file, all_threads=True, chain=True)

    def hold(self) -> None:
        """From now until uninstall, while the trainer writes a run's last records (status.json, summary.json, the
        heartbeat's last line): SIGTERM, SIGINT (a second one too) and SIGHUP are recorded (`held`, and
        `stop_signal` when none was) and not acted on: no KeyboardInterrupt, no end of the process with those
        records half-written. Nothing where the handlers are not installed (not the main thread)."""
        if signal.SIGINT not in self._installed:
            return
        self._holding = True  # (install() took SIGHUP too, where the platform has it)

    def uninstall(self) -> None:
        if signal.SIGUSR1 in self._installed:
            faulthandler.unregister(signal.SIGUSR1)
        for signum, previous in self._installed.items():
            signal.signal(signum, previous)
        self._installed.clear()
        self._holding = False  # once the handlers are the earlier ones: a signal meanwhile is still held
        if self._fault_file is not None:
            self._fault_file.close()
            path = Path(self._fault_file.name)
            if path.exists() and path.stat().st_size == 0:  # no dump happened: leave no empty file behind
                path.unlink()
            self._fault_file = None

    def _on_stop(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self._holding:
            self.held.append(name)
            self.stop_signal = self.stop_signal or name
            return
        if signum == signal.SIGINT:
            self._interrupts += 1
            if self._interrupts > 1:
                raise KeyboardInterrupt
        self.stop_signal = self.stop_signal or name

    def _on_usr1(self, signum, frame) -> None:
        self.dump_stacks("SIGUSR1")

    def dump_stacks(self, reason: str) -> Path:
        """Write every thread's Python stack to a new stackdump file; returns its path."""
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{int(time.time() * 1000) % 1000:03d}"
        path = self.out_dir / f"stackdump_rank{self.rank}_{stamp}.txt"
        names = {t.ident: t.name for t in threading.enumerate()}
        lines = [f"# stack dump: rank {self.rank}, step {self.step}, reason {reason}, {time.ctime()}\n"]
        for ident, frame in sys._current_frames().items():
            lines.append(f"\n## thread {names.get(ident, '?')} ({ident})\n")
            lines.extend(traceback.format_stack(frame))
        path.write_text("".join(lines))
        return path

    # ------------------------------------------------------------------ stop requests
    def halt_requested(self) -> bool:
        return (self.out_dir / HALT_NAME).exists()

    def halt_reason(self) -> str:
        """The text of out_dir/.HALT (its first 500 characters; bytes that are not UTF-8 replaced, never an error:
        the stop it asks for must not become a crash), "empty .HALT file", or ".HALT file" where it cannot be read."""
        try:
            text = (self.out_dir / HALT_NAME).read_bytes().decode("utf-8", errors="replace")
        except OSError:
            return ".HALT file"
        return text.strip()[:500] or "empty .HALT file"

    # ------------------------------------------------------------------ deliberate faults
    def fault_at(self, step: int) -> str | None:
        """The fault kind to inject at this step on this rank, or None."""
        if self.fault is not None and self.fault.fires(step, self.rank):
            return self.fault.kind
        return None

    def slow_step(self, step_s: float, sleep=None) -> float:
        """NSA_FAULT=slow_step@SHARE (a testing aid): sleep SHARE x `step_s`, the time this step took so far
        (forward, backward, optimizer), so that the step takes (1 + SHARE) times as long and tokens/s drops by
        SHARE / (1 + SHARE) (0.25: 20%). The trainer calls it at the end of every optimizer step, on every rank,
        inside the timed step. Returns the seconds asked of `sleep` (default time.sleep); 0 (no sleep) for any other
        fault or none."""
        if self.fault is None or self.fault.kind != "slow_step" or not self.fault.share or step_s <= 0:
            return 0.0
        pause = self.fault.share * step_s
        (sleep or time.sleep)(pause)
        return pause

    def crash(self, step: int) -> None:
        raise InjectedCrash(f"NSA_FAULT injected crash at step {step} on rank {self.rank}")

    def hang(self, step: int) -> None:
        """Block this rank, like a stuck collective, until a signal ends it: SIGTERM/SIGINT exit the process at
        once (status 143, no checkpoint: a hung rank cannot take part in one); SIGUSR1 still dumps stacks."""
        self.step = step
        while self.stop_signal is None:
            time.sleep(0.2)
        os._exit(143)
