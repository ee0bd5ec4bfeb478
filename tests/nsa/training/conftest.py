"""Fixtures shared by the trainer's tests."""

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
