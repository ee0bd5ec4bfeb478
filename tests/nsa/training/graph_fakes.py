"""A stand-in for CUDA graph capture on CPU (nsa.training.graphs.CudaCapture), for the tests of the code around it.

FakeCapture.capture(fn) runs fn once, as a real capture runs its Python, and returns a FakeGraph whose replay()
runs fn again, less what it tells the communication counter: the captured step's Python is written to give the
same result when run again (see GraphedStep._step_body). Every call is recorded in order in `FakeCapture.events`
(class-wide: the trainer builds its own instance). `install(monkeypatch)` puts it in place of the real capture, lets the capture run on CPU and
the torch reference kernels, and lets torch's capturable AdamW step CPU tensors.

Run as a script, it installs the fakes and runs `nsa-train` with the remaining arguments (for torchrun).
"""

from __future__ import annotations

import contextlib
import sys

import torch
import torch.optim.adam as torch_adam

from nsa.training import graphs
from nsa.training.comm_count import CommCounter


class FakeGraph:
    def __init__(self, fn, name: str, events: list):
        self.fn, self.name, self.events, self.replays = fn, name, events, 0

    def replay(self) -> None:
        """fn's Python again; what it tells a communication counter is dropped, as a real replay runs no Python
        (GraphedStep counts the collectives recorded at capture instead)."""
        self.replays += 1
        self.events.append(("replay", self.name))
        original = CommCounter.issue
        CommCounter.issue = lambda counter, kind, nbytes, source="model": None
        try:
            self.fn()
        finally:
            CommCounter.issue = original


class FakeCapture:
    events: list = []
    instances: list = []

    def __init__(self, device):
        self.device = device
        self.graphs: list[FakeGraph] = []
        self.in_side_stream = False
        FakeCapture.instances.append(self)

    @contextlib.contextmanager
    def side_stream(self):
        self.events.append(("side_stream", "enter"))
        self.in_side_stream = True
        try:
            yield
        finally:
            self.in_side_stream = False
            self.events.append(("side_stream", "exit"))

    def capture(self, fn):
        name = fn.__name__.strip("_").replace("_body", "")  # "step" / "optimizer"
        self.events.append(("capture", name))
        fn()
        graph = FakeGraph(fn, name, self.events)
        self.graphs.append(graph)
        return graph


def _capturable_anywhere(supports_xla: bool = True) -> list[str]:
    return ["cuda", "cpu"]


def install(setattr) -> None:
    """setattr: pytest's monkeypatch.setattr, or plain setattr in a subprocess."""
    FakeCapture.events.clear()
    FakeCapture.instances.clear()
    setattr(graphs, "CudaCapture", FakeCapture)
    setattr(graphs, "CAPTURE_DEVICES", ("cuda", "cpu"))
    setattr(graphs, "CAPTURABLE_KERNELS", graphs.CAPTURABLE_KERNELS + ("torch",))
    setattr(torch_adam, "_get_capturable_supported_devices", _capturable_anywhere)


if __name__ == "__main__":
    install(setattr)
    from nsa.training import cli

    sys.exit(cli.main(sys.argv[1:]))
