"""nsa-train: train an NSAModel in one process or under torchrun (DDP or FSDP2).

    python -m nsa.training --config configs/tiny_cpu.yaml --steps 50
    torchrun --nproc_per_node=2 -m nsa.training --config configs/m7c_125m_2xa100_production.yaml --ddp 1
    nsa-train watchdog --dir artifacts/run --halt 1 --interval 30

Flags override the config file (nsa.training.config); the resolved config is saved as out_dir/config.yaml. Outputs
are described in nsa.training.outputs; environment toggles in nsa.toggles; stop/dump/fault behaviour in nsa.training.safety.

Start-up stays light: this module imports no torch, so `nsa-train --help`, a bad flag and `nsa-train watchdog` never
load it; main() imports the trainer (torch, the kernels) once the command line has parsed.

Exit codes: 0 completed, halted (.HALT) or stopped by SIGTERM/SIGINT with a checkpoint; 1 crashed (status.json says
why, error_rank{r}.txt holds the traceback; on stderr the traceback, or for a checkpoint that cannot be written, a
full disk say, one line naming the path and the error); 2 bad command line, config or data (at start-up, a checkpoint
--resume cannot read too); 3 stopped on a non-finite loss or gradient. A
KeyboardInterrupt the stop handlers did not take (a second Ctrl-C, or one before they are installed) ends the
process by SIGINT (130 in a shell), status.json "terminated", no checkpoint of the step it cut short.
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from nsa.process import exit_without_teardown
from nsa.toggles import Toggles
from nsa.training import flags, safety, timeline, watchdog
from nsa.training.config import ConfigError, RunConfig, UsageError, apply_overrides, load_config
from nsa.training.flags import DEFAULT_CONFIG, build_parser


# ---------------------------------------------------------------------- command line (its flags: nsa.training.flags)
def resolve_config(args: argparse.Namespace, environ=os.environ) -> tuple[RunConfig, str]:
    """The config file (flag, $CONFIG or the default) with the command-line overrides applied."""
    if args.config == "":  # `--config "$UNSET"`: refused, not taken for no --config (the default is a 125M run)
        raise ConfigError("--config: an empty path: give the run config's YAML file, or leave "
                          f"--config out to use $CONFIG or {DEFAULT_CONFIG}")
    path = args.config or environ.get("CONFIG") or DEFAULT_CONFIG
    if not args.config and not environ.get("CONFIG") and not Path(path).is_file():
        raise ConfigError(f"no config given and the default {DEFAULT_CONFIG} is not here (cwd {os.getcwd()}): "
                          "pass --config PATH or set CONFIG")
    cfg = load_config(path)
    return apply_overrides(cfg, flags.overrides(args)), str(path)


# ---------------------------------------------------------------------- entry point
def _log_rank(environ=os.environ) -> int:
    """RANK as this process's log prefix and messages name it: 0 where it is unset or not an integer (the launch's
    variables are checked by nsa.training.distributed.init, which names a bad one; exit 2)."""
    try:
        return int(environ.get("RANK", "0") or 0)
    except ValueError:
        return 0


class _Output(logging.StreamHandler):
    """The run's log on stdout. Once nobody reads it (`nsa-train ... | head -1`, a closed pipe), stdout is pointed
    at /dev/null and training goes on: logging printed a traceback to stderr for every later line."""

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if not (isinstance(exc, OSError) and exc.errno == errno.EPIPE):
            super().handleError(record)
            return
        try:  # what is still buffered, and the flush at exit, go to /dev/null instead of failing again
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self.stream.fileno())
            finally:
                os.close(devnull)
        except (OSError, ValueError, AttributeError):  # no file descriptor under it: drop the output
            self.setStream(open(os.devnull, "w"))


def _setup_logging(rank: int) -> None:
    handler = _Output(sys.stdout)
    handler.setFormatter(logging.Formatter(f"[nsa-train r{rank}] %(message)s"))
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, handlers=[handler], force=True)


def _import_trainer():
    """The trainer's modules: torch and the kernels (seconds), imported once the command line has parsed. A Ctrl-C
    meanwhile is held until they are imported, then raised (KeyboardInterrupt): torch swallows an exception raised
    while it imports numpy (a warning, and it goes on), so the interrupt was lost and the run trained on, or failed
    later on a half-imported numpy."""
    hold = (threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) is signal.default_int_handler)
    received: list[int] = []
    if hold:
        signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        from nsa.attention import kernels  # torch and the kernels (seconds): once the command line has parsed
        from nsa.training import checkpoint, data, distributed, trainer  # torch (seconds): likewise
    finally:
        if hold:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if received:
        raise KeyboardInterrupt
    return kernels, checkpoint, data, distributed, trainer


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "watchdog":
        return watchdog.main(argv[1:], prog="nsa-train watchdog")
    args = build_parser().parse_args(argv)  # --help and a bad flag end here, before torch is imported
    rank = _log_rank()
    try:  # a bad config or toggle ends here too, before the seconds of importing torch
        cfg, config_path = resolve_config(args)
        tg = Toggles.read()
    except (ConfigError, UsageError, ValueError) as exc:  # ValueError: toggles name the variable
        print(f"nsa-train: error: {exc}", file=sys.stderr)
        return flags.EXIT_USAGE
    kernels, checkpoint, data, distributed, trainer = _import_trainer()

    marks = timeline.reset()  # start-up milestones (timeline.json), in seconds since this process started
    marks.mark("imports_done")
    _setup_logging(rank)
    try:
        safety.wait_at("pg_init", tg.fault, cfg.train.out_dir, rank)  # NSA_FAULT=wait@pg_init (a testing aid)
        info = distributed.init(cfg.train.device, cfg.train.pg_timeout_s)
        marks.mark("process_group_ready")
    except (ConfigError, UsageError, distributed.LaunchError, ValueError) as exc:
        # ValueError: toggles and model configs name the variable or field
        print(f"nsa-train: error: {exc}", file=sys.stderr)
        return trainer.EXIT_USAGE
    training, together = None, False  # together: every rank ended the run at the same step (as the loop stops them)
    try:
        try:
            training = trainer.Trainer(cfg, config_path, info, tg, args.resume, ["nsa-train", *argv])
        except (ConfigError, UsageError, data.DataError, distributed.LaunchError, checkpoint.CheckpointError,
                kernels.KernelUnavailable) as exc:
            print(f"nsa-train: error: {'' if rank == 0 else f'[rank {rank}] '}{exc}", file=sys.stderr)
            return trainer.EXIT_USAGE
        try:
            code = training.run()
            together = True
            return code
        except data.DataError as exc:  # e.g. a streaming loader that stopped answering; status.json has it too
            print(f"nsa-train: error: {exc}", file=sys.stderr)
            return trainer.EXIT_USAGE
        except checkpoint.CheckpointError as exc:
            # a checkpoint that cannot be written (a full disk, a permission, a file system gone; on any rank: every
            # rank raises it): a failure of where the run writes, not of the code, so one line naming the path and
            # the OS error, no traceback; the run has recorded it as any crash (status.json "crashed", the heartbeat's
            # "error", error_rank{r}.txt with the traceback, which the validation suite's diagnosis reads)
            print(f"nsa-train: error: {'' if rank == 0 else f'[rank {rank}] '}{exc}", file=sys.stderr)
            return trainer.EXIT_CRASH
    finally:
        # the process group and its backend end here, with a barrier first after a run every rank ended
        # (nsa.training.distributed.shutdown); the trainer goes first: its model holds the process group too
        training = None
        distributed.shutdown(synchronize=together)


def console_main() -> None:  # console script `nsa-train`, and `python -m nsa.training`
    exit_without_teardown(main())  # with torch loaded, the teardown took 0.7-0.8 s of a core per rank (nsa.process)


if __name__ == "__main__":
    sys.exit(main())
