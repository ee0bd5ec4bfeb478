"""The trainer's heartbeats outside the training steps: every rank writes progress records that name the phase it
is in (start-up stages, an evaluation's batches, a checkpoint save or load, a compilation), so that a start-up, an
evaluation or a checkpoint longer than a watchdog's stall threshold is not ended as a hang, while one that stops
making progress still is. The phases that are one long call with no progress point inside (a checkpoint read or
written whole, a compilation, a graph capture) get a longer silence from the watchdog (nsa.training.watchdog:
long_call_after_s, by default LONG_CALL_FACTOR x stall_after_s), which the launchers' stall watch shares (it calls
the same check). In process, the tiny CPU config shortened to 2 sequences of 128 tokens a step."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml

from nsa.training import checkpoint, cli, trainer, watchdog
from nsa.training.heartbeat import LONG_CALL_MSGS, TERMINAL_MSGS, HeartbeatWriter, in_long_call

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "configs" / "tiny_cpu.yaml"
T0 = 1_700_000_000.0
STARTUP = ["model_built", "model_on_device", "model_wrapped", "optimizer_built", "data_ready"]


def _train(out_dir: Path, *flags: str, config: Path = TINY) -> int:
    return cli.main(["--config", str(config), "--out-dir", str(out_dir), "--seq-len", "128", "--batch-size", "2",
                     *flags])


def _beats(out_dir: Path) -> list[dict]:
    path = out_dir / "heartbeat_rank0.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _outline(beats: list[dict]) -> list[tuple]:
    """(msg, step, what names the progress) of each record."""
    out = []
    for b in beats:
        detail = b.get("stage", b.get("during", b.get("batch")))
        if b["msg"] == "eval" and "val_loss" in b:
            detail = "val_loss"
        out.append((b["msg"], b["step"], detail))
    return out


@pytest.fixture(autouse=True)
def _quiet(monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")


def test_a_run_with_eval_checkpoints_a_compile_and_a_resume_writes_each_phase_in_order(tmp_path, monkeypatch):
    # the first forward taken for one that compiles (the heartbeat says so; nothing is compiled on this CPU run)
    monkeypatch.setattr(trainer.Trainer, "_compiles", lambda self, during="train": True)
    out = tmp_path / "run"
    assert _train(out, "--steps", "2", "--eval-every", "2", "--save-every", "2") == 0
    evals = [("eval", 2, i) for i in range(5)]
    assert _outline(_beats(out)) == (
        [("boot", 0, None)] + [("starting", 0, s) for s in STARTUP] + [("starting", 0, "ready")]
        + [("compiling", 0, "train"), ("step", 1, None), ("step", 2, None)]
        + evals[:1] + [("compiling", 2, "eval")] + evals[1:] + [("eval", 2, "val_loss")]
        + [("saving", 2, None), ("checkpoint", 2, None), ("done", 2, None)])
    # the watchdog's reading of each: the long calls (and only they) get the longer silence; none is terminal
    long = {b["msg"] for b in _beats(out) if in_long_call(b)}
    assert long == {"compiling", "saving"} and not long & set(TERMINAL_MSGS)

    monkeypatch.setattr(trainer.Trainer, "_compiles", lambda self, during="train": False)
    assert _train(out, "--steps", "3", "--resume") == 0
    beats = _beats(out)
    second = beats[max(i for i, b in enumerate(beats) if b["msg"] == "boot"):]
    assert _outline(second) == (
        [("boot", 2, None)] + [("starting", 2, s) for s in STARTUP]
        + [("loading", 2, None), ("starting", 2, "checkpoint_loaded"), ("starting", 2, "ready")]
        + [("step", 3, None), ("saving", 3, None), ("checkpoint", 3, None), ("done", 3, None)])
    assert second[6]["path"].endswith("step_00000002")  # the load names the checkpoint it reads


def test_a_cuda_graph_capture_is_announced_as_one_long_call(tmp_path, monkeypatch):
    """The capture (warm-up steps on a side stream, then the capture) is one call: "capturing" before it, after the
    start-up's last stage, and "cuda_graphs" once it returns. The capture mocked on CPU (graph_fakes)."""
    monkeypatch.syspath_prepend(str(REPO / "tests" / "nsa" / "training"))
    graph_fakes = __import__("graph_fakes")
    graph_fakes.install(monkeypatch.setattr)
    raw = yaml.safe_load(TINY.read_text())
    raw["train"]["device"] = "auto"  # the fakes let the capture run on this machine's device, CPU included
    config = tmp_path / "graphed.yaml"
    config.write_text(yaml.safe_dump(raw))
    out = tmp_path / "run"
    assert _train(out, "--steps", "1", "--cuda-graphs", config=config) == 0
    assert _outline(_beats(out)) == (
        [("boot", 0, None)] + [("starting", 0, s) for s in STARTUP] + [("starting", 0, "ready")]
        + [("capturing", 0, None), ("cuda_graphs", 0, None), ("step", 1, None)]
        + [("saving", 1, None), ("checkpoint", 1, None), ("done", 1, None)])


class _Clock:
    """The heartbeats' clock: a slow evaluation batch or checkpoint save moves it on instead of sleeping."""

    def __init__(self):
        self.t = T0

    def __call__(self) -> float:
        return self.t


def test_a_slow_eval_and_save_are_running_while_they_progress_and_stalled_once_they_stop(tmp_path, monkeypatch):
    """Stall threshold 300 s (long calls: 3 x 300 = 900 s). Step 1: each of the 4 evaluation batches takes 200 s (800
    s in all, progress between them) and the save 800 s (one call): the watchdog, looking in the middle of each, says
    running (without the records, the first look after 400 s of evaluation was a stall). Step 2: the third batch hangs
    for 400 s and the save for 1,000 s: stalled, each time, and named by the phase it stopped in."""
    clock = _Clock()
    monkeypatch.setattr(trainer, "HeartbeatWriter", functools.partial(HeartbeatWriter, clock=clock))
    out = tmp_path / "run"
    seen: list[tuple] = []

    def look(what):
        verdict = watchdog.check(out, 300, now=clock.t)
        seen.append((what, verdict.state, [verdict.latest[0]["msg"], verdict.latest[0].get("batch")]))

    build_eval = trainer.build_eval_source

    def slow_eval_source(*args, **kwargs):
        source = build_eval(*args, **kwargs)
        batch = source.next_batch
        calls = [0]

        def next_batch():
            calls[0] += 1
            step, i = (calls[0] - 1) // 4 + 1, (calls[0] - 1) % 4 + 1
            clock.t += 400.0 if (step, i) == (2, 3) else 200.0
            look(f"eval {step}.{i}")
            return batch()

        source.next_batch = next_batch
        return source

    monkeypatch.setattr(trainer, "build_eval_source", slow_eval_source)
    save = checkpoint.save

    def slow_save(out_dir, step, *args, **kwargs):
        clock.t += 800.0 if step == 1 else 1000.0
        look(f"save {step}")
        return save(out_dir, step, *args, **kwargs)

    monkeypatch.setattr(checkpoint, "save", slow_save)
    assert _train(out, "--steps", "2", "--eval-every", "1", "--save-every", "1") == 0
    assert seen == [
        ("eval 1.1", "running", ["eval", 0]), ("eval 1.2", "running", ["eval", 1]),
        ("eval 1.3", "running", ["eval", 2]), ("eval 1.4", "running", ["eval", 3]),
        ("save 1", "running", ["saving", None]),
        ("eval 2.1", "running", ["eval", 0]), ("eval 2.2", "running", ["eval", 1]),
        ("eval 2.3", "stalled", ["eval", 2]), ("eval 2.4", "running", ["eval", 3]),
        ("save 2", "stalled", ["saving", None])]


def test_the_long_call_allowance_applies_to_the_long_calls_only(tmp_path):
    """A rank silent 301..899 s after "saving" is running at a 300 s threshold, stalled after 900 s (3 x 300), or
    after what --long-call-after / long_call_after_s says; after any other record it is stalled after 300 s."""
    assert set(LONG_CALL_MSGS) == {"loading", "saving", "compiling", "capturing"}
    for msg in LONG_CALL_MSGS:
        (tmp_path / msg).mkdir()
        HeartbeatWriter(tmp_path / msg, 0, clock=lambda: T0).write(5, msg)
        assert watchdog.check(tmp_path / msg, 300, now=T0 + 899).state == "running"
        verdict = watchdog.check(tmp_path / msg, 300, now=T0 + 901)
        assert verdict.state == "stalled" and "allowed 900s" in verdict.reason
        assert watchdog.check(tmp_path / msg, 300, now=T0 + 501, long_call_after_s=500).state == "stalled"
        assert watchdog.check(tmp_path / msg, 300, now=T0 + 499, long_call_after_s=500).state == "running"
        # an allowance below the usual threshold does not shorten it
        assert watchdog.check(tmp_path / msg, 300, now=T0 + 299, long_call_after_s=100).state == "running"
    for msg in ("starting", "eval", "step", "stopping", "cuda_graphs", "checkpoint"):
        (tmp_path / msg).mkdir()
        HeartbeatWriter(tmp_path / msg, 0, clock=lambda: T0).write(5, msg)
        assert watchdog.check(tmp_path / msg, 300, now=T0 + 301).state == "stalled", msg
    args = watchdog.build_parser().parse_args(["--dir", str(tmp_path), "--long-call-after", "1200"])
    assert args.long_call_after == 1200.0
    with pytest.raises(ValueError):
        watchdog.WatchdogConfig(out_dir=tmp_path, long_call_after_s=0)
