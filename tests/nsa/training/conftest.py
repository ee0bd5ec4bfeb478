"""Fixtures shared by the trainer's tests."""

import signal

import pytest
import torch.distributed as dist


@pytest.fixture()
def one_rank_group(tmp_path):
    """A one-rank gloo process group in this process for the test's length (real torch collectives, counted and
    hooked as a run's are)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


class Ended(Exception):
    """What the signal's default action would have done: end the process."""


@pytest.fixture
def ending(monkeypatch):
    """SIGTERM, SIGINT and SIGHUP raise Ended while the test runs (their handlers restored after it)."""
    monkeypatch.setenv("NSA_TB_DISABLE", "1")

    def end(signum, frame):
        raise Ended(signal.Signals(signum).name)

    previous = {signum: signal.signal(signum, end) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    yield end
    for signum, handler in previous.items():
        signal.signal(signum, handler)
