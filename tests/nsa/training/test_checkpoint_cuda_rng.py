"""A checkpoint's CUDA random generator belongs to the rank that wrote it: each rank saves its own current device's
generator with that device's index and a resume restores it onto the resuming rank's current device, whatever
devices that process sees (another node, a narrower CUDA_VISIBLE_DEVICES, another device index). An older
checkpoint, which holds the list of every device the saving rank saw, still loads: the entry of the current
device's index is restored, and where the list has none a warning says so. On CPU, with torch.cuda's generator
functions replaced by fakes that keep one generator state per device and record every call."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

from nsa.training import checkpoint

INFO = checkpoint.DistInfo(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend=None)


class FakeCuda:
    """`count` devices, the current one `current`; device d's generator state starts as bytes [d, 100 + d]."""

    def __init__(self, count: int, current: int) -> None:
        self.count, self.current = count, current
        self.states = {d: torch.tensor([d, 100 + d], dtype=torch.uint8) for d in range(count)}
        self.calls: list[tuple] = []

    def _index(self, device) -> int:
        index = device if isinstance(device, int) else torch.device(device).index
        index = self.current if index is None else index
        if not 0 <= index < self.count:
            raise RuntimeError("CUDA error: invalid device ordinal")
        return index

    def install(self, mp: pytest.MonkeyPatch) -> None:
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "device_count", lambda: self.count)
        mp.setattr(torch.cuda, "current_device", lambda: self.current)
        mp.setattr(torch.cuda, "get_rng_state", self.get_rng_state)
        mp.setattr(torch.cuda, "set_rng_state", self.set_rng_state)
        mp.setattr(torch.cuda, "get_rng_state_all", self.get_rng_state_all)
        mp.setattr(torch.cuda, "set_rng_state_all", self.set_rng_state_all)

    def get_rng_state(self, device="cuda"):
        index = self._index(device)
        self.calls.append(("get", index))
        return self.states[index].clone()

    def set_rng_state(self, new_state, device="cuda"):
        index = self._index(device)
        self.calls.append(("set", index))
        self.states[index] = new_state.clone()

    def get_rng_state_all(self):
        self.calls.append(("get_all",))
        return [self.states[d].clone() for d in range(self.count)]

    def set_rng_state_all(self, new_states):
        self.calls.append(("set_all", len(new_states)))
        for d, s in enumerate(new_states):
            self.set_rng_state(s, d)

    def sets(self) -> list[tuple]:
        return [c for c in self.calls if c[0] in ("set", "set_all")]


def _save(out, cuda: FakeCuda | None):
    net = nn.Linear(4, 3)
    opt = torch.optim.AdamW(net.parameters(), lr=0.1)
    with pytest.MonkeyPatch.context() as mp:
        if cuda is not None:
            cuda.install(mp)
        return checkpoint.save(out, 5, net, opt, INFO, data_state={}, scaler=None, parallel="none", keep=1)


def _load(path, cuda: FakeCuda) -> None:
    net = nn.Linear(4, 3)
    with pytest.MonkeyPatch.context() as mp:
        cuda.install(mp)
        checkpoint.load(path, net, torch.optim.AdamW(net.parameters(), lr=0.1), INFO, scaler=None)


def _old_checkpoint(out, states: list[torch.Tensor]):
    """A checkpoint as written before: rank0.pt's "cuda" is the list of every device's generator state."""
    path = _save(out, None)
    blob = torch.load(path / "rank0.pt", weights_only=False)
    blob["rng"]["cuda"] = states
    torch.save(blob, path / "rank0.pt")
    return path


def test_a_rank_saves_only_its_own_devices_generator_with_its_index(tmp_path):
    saver = FakeCuda(count=4, current=2)
    path = _save(tmp_path, saver)
    rng = torch.load(path / "rank0.pt", weights_only=False)["rng"]
    assert rng["cuda"]["device"] == 2
    assert rng["cuda"]["state"].tolist() == [2, 102]
    assert ("get_all",) not in saver.calls


@pytest.mark.parametrize("saved_on, count_then, resumed_on, count_now", [
    (1, 2, 0, 1),  # another node with one device (or CUDA_VISIBLE_DEVICES narrowed to one)
    (0, 1, 3, 8),  # more devices, another index
    (5, 8, 5, 8),  # the same layout
], ids=["fewer_devices", "more_devices_other_index", "same_layout"])
def test_a_resume_restores_the_saving_ranks_generator_onto_its_current_device(tmp_path, saved_on, count_then,
                                                                              resumed_on, count_now):
    path = _save(tmp_path, FakeCuda(count=count_then, current=saved_on))
    resumer = FakeCuda(count=count_now, current=resumed_on)
    _load(path, resumer)
    assert resumer.sets() == [("set", resumed_on)]  # the current device only: no other generator touched
    assert resumer.states[resumed_on].tolist() == [saved_on, 100 + saved_on]
    untouched = [d for d in range(count_now) if d != resumed_on]
    assert all(resumer.states[d].tolist() == [d, 100 + d] for d in untouched)


def test_an_older_checkpoints_list_restores_the_entry_of_the_current_device(tmp_path):
    old = [torch.tensor([7, d], dtype=torch.uint8) for d in range(4)]
    path = _old_checkpoint(tmp_path, old)
    resumer = FakeCuda(count=2, current=1)  # fewer devices than the list: its device 1 entry still applies
    _load(path, resumer)
    assert resumer.sets() == [("set", 1)]
    assert resumer.states[1].tolist() == [7, 1]
    assert resumer.states[0].tolist() == [0, 100]


def test_an_older_checkpoints_list_without_the_current_device_is_a_warning(tmp_path, caplog):
    old = [torch.tensor([7, d], dtype=torch.uint8) for d in range(2)]
    path = _old_checkpoint(tmp_path, old)
    resumer = FakeCuda(count=4, current=3)
    with caplog.at_level(logging.WARNING, logger=checkpoint.__name__):
        _load(path, resumer)
    assert resumer.sets() == []  # no generator is set from another device's state
    assert all(resumer.states[d].tolist() == [d, 100 + d] for d in range(4))
    (record,) = [r for r in caplog.records if r.name == checkpoint.__name__]
    message = record.getMessage()
    assert "cuda:3" in message and "not restored" in message and str(path) in message
