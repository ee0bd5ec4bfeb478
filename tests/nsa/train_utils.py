"""Launching the trainer from tests: a single process or a 2-rank torchrun with gloo, always bounded in time and
never leaving processes behind."""

from __future__ import annotations

import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
from process_checks import pid_alive  # one definition for both suites (tests/process_checks.py)

__all__ = ["REPO", "TINY", "free_port", "clean_env", "trainer_argv", "start", "finish", "kill_group", "run",
           "read_csv", "heartbeats", "wait_for", "last_step", "final_params", "pid_alive"]

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny_cpu.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSA_", "CONFIG"))}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.update(extra or {})
    return env


def trainer_argv(out_dir: Path, *flags: str, nproc: int = 1, config: Path | None = TINY) -> list[str]:
    base = ["--out-dir", str(out_dir)] + (["--config", str(config)] if config else []) + list(flags)
    if nproc == 1:
        return [sys.executable, "-m", "nsa.training", *base]
    return [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}",
            f"--master-port={free_port()}", "-m", "nsa.training", *base]


def start(out_dir: Path, *flags: str, nproc: int = 1, env: dict | None = None,
          config: Path | None = TINY) -> subprocess.Popen:
    return subprocess.Popen(trainer_argv(out_dir, *flags, nproc=nproc, config=config), cwd=REPO,
                            env=clean_env(env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc: subprocess.Popen, timeout: float = 180) -> tuple[int, str]:
    """Wait for proc; on timeout kill its whole process group and fail loudly."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        out, _ = proc.communicate()
        raise AssertionError(f"trainer did not finish in {timeout} s; output:\n{out[-4000:]}")
    return proc.returncode, out


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(out_dir: Path, *flags: str, nproc: int = 1, env: dict | None = None, timeout: float = 180,
        config: Path | None = TINY) -> tuple[int, str]:
    return finish(start(out_dir, *flags, nproc=nproc, env=env, config=config), timeout)


def train_here(out_dir: Path, *flags: str) -> int:
    """nsa-train in this process (nsa.training.cli.main), the tiny CPU config shortened to 2 sequences of 128 tokens
    a step: its exit code."""
    from nsa.training import cli

    return cli.main(["--config", str(TINY), "--out-dir", str(out_dir), "--seq-len", "128", "--batch-size", "2",
                     *flags])

def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def heartbeats(out_dir: Path, rank: int) -> list[dict]:
    path = Path(out_dir) / f"heartbeat_rank{rank}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen | None = None, poll: float = 0.1):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process exited ({proc.returncode}) while waiting for {what}:\n"
                                 f"{proc.stdout.read()[-4000:] if proc.stdout else ''}")
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def last_step(out_dir: Path, rank: int = 0) -> int:
    try:
        records = heartbeats(out_dir, rank)
    except (FileNotFoundError, json.JSONDecodeError):
        return 0
    steps = [r["step"] for r in records if r["msg"] == "step"]
    return steps[-1] if steps else 0


def final_params(out_dir: Path) -> dict[str, torch.Tensor]:
    """Model state of the latest checkpoint in out_dir."""
    from nsa.training.checkpoint import latest_checkpoint

    ckpt = latest_checkpoint(Path(out_dir))
    assert ckpt is not None, f"no checkpoint in {out_dir}"
    return torch.load(ckpt / "model_optim.pt", map_location="cpu", weights_only=False)["model"]


def flat_items(x, prefix=""):
    """(path, leaf) of every leaf of nested dicts, lists and tuples (a checkpoint's state dicts): "/model/w", ..."""
    if isinstance(x, dict):
        for k, v in x.items():
            yield from flat_items(v, f"{prefix}/{k}")
    elif isinstance(x, (list, tuple)):
        for i, v in enumerate(x):
            yield from flat_items(v, f"{prefix}/{i}")
    else:
        yield prefix, x


def in_step(monkeypatch, at: int, act) -> None:
    """`act()` at the start of step `at`'s train step of an in-process run (the steps before it recorded, this one
    not yet): nsa.training.trainer.Trainer.train_step wrapped for the test."""
    from nsa.training import trainer

    step_fn = trainer.Trainer.train_step

    def stepping(self, step, record_stats):
        if step == at:
            act()
        return step_fn(self, step, record_stats)

    monkeypatch.setattr(trainer.Trainer, "train_step", stepping)


def spawn_ranks(main, root: Path, world: int, timeout_s: float) -> list:
    """Run `main(rank, store_path, root)` in `world` spawned processes (a file store under root/store for their
    process group), each saving its results as root/rank{r}.pt; the ranks' results, in rank order. A rank still
    alive after `timeout_s` in all is killed, and any rank that did not exit 0 fails the test."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=main, args=(r, str(root / "store"), str(root))) for r in range(world)]
    for p in procs:
        p.start()
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert [p.exitcode for p in procs] == [0] * world
    return [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(world)]
