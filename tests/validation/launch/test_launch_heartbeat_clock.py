"""The launcher judges a launch's heartbeats by their place in the files and on its own clock
(validation.launch.local.Run with nsa.training.watchdog.Watch): a trainer whose clock is an hour behind (another
node on a shared filesystem) is running, not waiting for ever; an earlier run's records, there before the launch,
are not this launch's whatever their time stamps say."""

from __future__ import annotations

import time

from nsa.training.heartbeat import HeartbeatWriter
from nsa.training.watchdog import FINISHED, RUNNING, WAITING
from validation.launch.local import Run
from validation.launch.spec import LaunchSpec


def _run(tmp_path, out_dir) -> Run:
    spec = LaunchSpec(argv=["x"], env={}, step_dir=tmp_path / "step", trainer_out_dir=out_dir, stall_timeout_s=30)
    return Run(spec, ["x"], tmp_path / "log.txt", time.time(), time.time() + 600)


def test_a_trainer_whose_clock_is_an_hour_behind_is_running(tmp_path):
    out = tmp_path / "out"
    run = _run(tmp_path, out)
    run.begin_watch()  # as execute() does, before the trainer starts
    writer = HeartbeatWriter(out, 0, clock=lambda: time.time() - 3600)
    writer.write(1, "step", toks_per_s=1000.0)
    verdict = run._look_at_heartbeats()
    assert verdict.state == RUNNING and run.last_step == 1, verdict


def test_an_earlier_runs_records_stamped_ahead_are_not_this_launchs(tmp_path):
    out = tmp_path / "out"
    earlier = HeartbeatWriter(out, 0, clock=lambda: time.time() + 3600)
    earlier.write(7, "done")
    run = _run(tmp_path, out)
    run.begin_watch()
    assert run._look_at_heartbeats().state == WAITING  # not FINISHED: the done is the run before's
    HeartbeatWriter(out, 0).write(8, "step")
    assert run._look_at_heartbeats().state == RUNNING
    HeartbeatWriter(out, 0).write(9, "done")
    assert run._look_at_heartbeats().state == FINISHED
