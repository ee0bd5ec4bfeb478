"""A launch the launcher had to start again (its rendezvous port was in use: validation.launch.attempt) leaves a note
in its step's record, naming the launch, how many times it started and where the earlier attempts' logs are; a
launch started once leaves none, and the step's own notes stay first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from validation.execution.runner import StepLaunches
from validation.launch.spec import LaunchResult
from validation.results.run import Step


def _ended(tmp_path: Path, attempts: int, label: str) -> tuple[object, LaunchResult]:
    log = tmp_path / "sweep" / label / "stdout.log"
    spec = SimpleNamespace(env={}, label=label)
    return spec, LaunchResult(status="ok", returncode=0, duration_s=1.0, argv=["torchrun", "x"], log_path=log,
                              rank_logs={}, reason="exit code 0", excerpt=None, stack_dumps=[], attempts=attempts)


def test_a_launch_started_again_leaves_a_note_naming_it_and_its_logs(tmp_path):
    runner = SimpleNamespace(_rel=lambda p: str(Path(p).relative_to(tmp_path)))
    launched = StepLaunches()
    for attempts, label in ((1, "a"), (3, "b")):
        launched.add(runner, *_ended(tmp_path, attempts, label))
    out = launched.into(Step(notes=["the kind's own note"]))
    assert out["notes"] == [
        "the kind's own note",
        "launch b was started 3 times: its rendezvous port was in use (address already in use), so it ran again on a "
        "fresh port; sweep/b/stdout.log is the last attempt's log, the earlier ones are kept beside it "
        "(stdout.attempt<n>.log)"]
    assert set(out) >= {"command", "env", "artifacts", "excerpt", "stack_dumps"}


def test_launches_started_once_add_no_notes_key(tmp_path):
    runner = SimpleNamespace(_rel=lambda p: str(Path(p).relative_to(tmp_path)))
    launched = StepLaunches()
    launched.add(runner, *_ended(tmp_path, 1, "a"))
    assert "notes" not in launched.into(Step())
