"""What else used the machine while a launch measured (validation.launch.telemetry: HostProbe, interference), proven
both ways: real processes (a neighbour busy for the middle half of a step marks it disturbed; the run's own CPU,
short-lived children included, is never counted as another's) and the thresholds on recorded samples (a quiet run is
not marked; free cores, steal, GPU neighbours and throttles)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from validation import contracts
from validation.launch import telemetry

BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def _neighbour(seconds: float) -> int:
    """A busy process that is not below this one (double-forked, in a session of its own): another tenant of the
    machine. Its pid."""
    code = (f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {BUSY.format(s=seconds)!r}], "
            "start_new_session=True)\nprint(p.pid)")
    return int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def test_a_neighbour_busy_for_the_middle_half_of_a_step_marks_it_disturbed(tmp_path):
    # the step keeps every core busy for 4 s (one busy child per core); a neighbour spins from 1 s to 3 s
    ncpu = os.cpu_count() or 1
    step = ("import subprocess, sys\nps = [subprocess.Popen([sys.executable, '-c', "
            f"{BUSY.format(s=4)!r}]) for _ in range({ncpu})]\n[p.wait() for p in ps]\n")
    proc = subprocess.Popen([sys.executable, "-c", step])
    sampler = telemetry.Sampler(tmp_path / "telemetry.csv", proc.pid, interval_s=0.25, node="n0",
                                own_root=proc.pid, cores=ncpu).start()
    neighbour = None
    try:
        time.sleep(1.0)
        neighbour = _neighbour(2.0)
        proc.wait(timeout=60)
    finally:
        sampler.stop()
        if neighbour is not None:
            _kill(neighbour)
    rows = contracts.read_telemetry(tmp_path)
    got = telemetry.interference(rows)
    assert got is not None and got.disturbed, got
    assert got.share >= telemetry.DISTURBED_SHARE and got.causes["cpu"].cores_mean > 0.5, got
    # the text names the step's busiest others over the whole step: the neighbour here, unless other work on the
    # machine used more (a CI run with other busy workers beside it named a trainer and a compiler instead)
    assert f"of {ncpu:g} cores" in got.text and "; the busiest: " in got.text, got.text
    # while the neighbour ran, it was named among the busiest others of each sample
    named = [r for r in rows if f"[{neighbour}]" in str(r.get("other_top") or "")]
    assert named, [r.get("other_top") for r in rows]


def test_the_runs_own_cpu_short_lived_children_included_is_never_anothers(tmp_path):
    """The run's CPU as the sampler accounts it (host less others) against the CPU its processes report
    themselves: a step that starts 0.15-second busy children one after another for 3 s, each gone before the next
    sample, counts in full as the run's, whatever else the machine is doing."""
    report = tmp_path / "cpu.txt"
    step = ("import resource, subprocess, sys, time\nt = time.time()\n"
            f"while time.time() - t < 3:\n    subprocess.run([sys.executable, '-c', {BUSY.format(s=0.15)!r}])\n"
            "me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)\n"
            f"open({str(report)!r}, 'w').write(str(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime))\n"
            "time.sleep(0.6)\n")  # one more sample sees the last children's time in its parent
    proc = subprocess.Popen([sys.executable, "-c", step])
    sampler = telemetry.Sampler(tmp_path / "telemetry.csv", proc.pid, interval_s=0.25, node="n0",
                                own_root=proc.pid).start()
    proc.wait(timeout=60)
    sampler._thread.join(10)
    rows = contracts.read_telemetry(tmp_path)
    own = float(report.read_text())
    times = [r["time"] for r in rows]
    accounted = sum((r["host_cpu_pct"] - r["other_cpu_pct"]) / 100.0 * (t - t0)
                    for r, t, t0 in zip(rows[1:], times[1:], times) if r["host_cpu_pct"] is not None)
    # what the run used, less at most the time after the last sample; never what other processes used
    assert 0.6 * own <= accounted <= 1.15 * own + 0.15, (accounted, own)


# ------------------------------------------------------------------------------------------------ the thresholds
def _rows(others: list[float], *, ncpu: int = 2, cores: float = 2, steal: float = 0.0, t0: float = 1000.0,
          gpu: dict | None = None) -> list[dict]:
    """Recorded samples, one a second: other processes' CPU (percent of one core) per sample."""
    out = []
    for i, other in enumerate(others):
        base = {"time": t0 + i, "node": "n0", "sample": i, "ncpu": ncpu, "step_cores": cores,
                "host_cpu_pct": 180.0 + other, "other_cpu_pct": None if i == 0 else other,
                "steal_pct": None if i == 0 else steal, "other_top": "python -c busy[42] 99%" if other > 50 else None,
                "gpu": None}
        out.append({**base, **(gpu or {})})
    return out


def test_a_quiet_run_is_not_marked_and_the_rules_are_stated():
    got = telemetry.interference(_rows([0.0, 3.0, 12.0, 5.0, 20.0, 8.0, 4.0, 2.0]))
    assert got.disturbed is False and got.contended == 0 and got.samples == 7
    assert got.text == "no interference in 7 samples"
    assert f"plus {telemetry.OTHER_CPU_SLACK_CORES:g} core" in got.rules
    assert telemetry.interference([]) is None
    # telemetry written before the CPU figures existed: no judgment
    assert telemetry.interference([{k: v for k, v in r.items() if k != "other_cpu_pct"}
                                   for r in _rows([0.0, 90.0])]) is None


def test_a_neighbour_for_half_the_window_is_named_with_what_and_how_much():
    rows = _rows([0.0, 2.0, 2.0, 140.0, 140.0, 140.0, 140.0, 3.0, 2.0])
    got = telemetry.interference(rows)
    assert got.disturbed and got.contended == 4 and got.share == 0.5
    assert got.text.startswith("other processes used 1.40 of 2 cores on average (the launch uses 2, leaving 0 "
                                  "free) in 4 of 8 samples (50%)")
    assert got.causes["cpu"].top[0].command == "python -c busy"
    # the same samples outside the measured period decide nothing: only those whose period overlaps it count
    quiet = telemetry.interference(rows, start=1000.5, end=1002.0)
    assert quiet.samples == 2 and not quiet.disturbed
    # a short burst (one sample of ten) is below the disturbed share
    assert not telemetry.interference(_rows([0.0] * 5 + [150.0] + [0.0] * 5)).disturbed


def test_free_cores_steal_gpu_neighbours_and_throttles():
    # a launch that uses 1 of 2 cores leaves one free: a neighbour busy on it does not contend
    assert not telemetry.interference(_rows([100.0] * 6, cores=1)).disturbed
    assert telemetry.interference(_rows([140.0] * 6, cores=1)).disturbed
    # the hypervisor taking 30% of a core does
    stolen = telemetry.interference(_rows([0.0] * 6, steal=30.0))
    assert stolen.disturbed and "hypervisor stole 0.30 cores" in stolen.text
    # GPUs: another process on the launch's GPU, a thermal slowdown; a power cap is a setting, not interference
    ours = {"gpu": 0, "ours": 1, "other_gpu_procs": 0, "other_gpu_mem_gb": 0.0, "throttle": "sw_power_cap"}
    assert not telemetry.interference(_rows([0.0] * 6, gpu=ours)).disturbed
    crowded = telemetry.interference(_rows([0.0] * 6, gpu={**ours, "other_gpu_procs": 1, "other_gpu_mem_gb": 7.5}))
    assert crowded.disturbed and "1 other process(es) computed on the launch's GPU(s), using up to 7.5 GiB" in \
        crowded.text
    hot = telemetry.interference(_rows([0.0] * 6, gpu={**ours, "throttle": "sw_power_cap+hw_thermal_slowdown"}))
    assert hot.disturbed and "hw_thermal_slowdown" in hot.text
    # NVML that cannot tell the launch's processes apart (no GPU row is "ours"): its process list decides nothing
    blind = {**ours, "ours": 0, "other_gpu_procs": 3}
    assert not telemetry.interference(_rows([0.0] * 6, gpu=blind)).disturbed
    # a CPU run on a GPU node: the GPUs are not its evidence
    assert not telemetry.interference(_rows([0.0] * 6, gpu={**ours, "other_gpu_procs": 2}),
                                      use_gpus=False).disturbed


@pytest.mark.parametrize("env, nproc, torchrun, want", [
    ({"OMP_NUM_THREADS": "1"}, 2, True, 2.0), ({"OMP_NUM_THREADS": "3"}, 1, False, 3.0), ({}, 2, True, 2.0),
    ({}, 1, False, None), ({"OMP_NUM_THREADS": "x"}, 1, False, None)])
def test_the_cores_a_launch_uses(env, nproc, torchrun, want):
    from validation.launch.spec import LaunchSpec

    spec = LaunchSpec(argv=["x"], env=env, nproc_per_node=nproc, torchrun=torchrun)
    assert spec.cores() == want


def test_a_slurm_node_sampler_is_told_the_cores(tmp_path):
    from validation.launch.sbatch import batch_script
    from validation.launch.slurm import SlurmOptions

    script = batch_script(job_name="j", nnodes=2, nproc_per_node=2, argv=[sys.executable, "-m", "x"], env={},
                          cwd=tmp_path, log_path=tmp_path / "log", ranks_dir=tmp_path / "ranks",
                          options=SlurmOptions(), python=sys.executable, telemetry_s=1.0, cores=2.0)
    assert "validation.launch.telemetry --root $$ --interval 1 --cores 2 " in script
    assert Path(tmp_path).is_dir()


def test_a_child_that_exited_but_is_not_yet_reaped_is_still_the_runs():
    """A zombie keeps its CPU time until its parent waits for it; counted as another's in between, the end of every
    launch looked like a neighbour's burst."""
    ps = telemetry.ProcStat
    table = {100: ps("python", "S", 1, 5, 10, 0), 101: ps("torchrun", "S", 100, 6, 10, 0),
             102: ps("python", "Z", 101, 7, 300, 0), 103: ps("other", "R", 1, 8, 50, 0)}
    probe = telemetry.HostProbe(100)
    assert probe._own_pids(table) == {100, 101, 102}


def test_a_decision_whose_default_was_left_out_does_not_fail():
    """The default's runs all left out (disturbed, failed): the other points are compared among themselves."""
    from validation.analysis.significance import decide

    d = decide({"a": [1000.0, 1010.0], "b": [1300.0, 1310.0], "c": [1000.0, 990.0]}, default="a",
               disturbed={"a": [True, False]})
    assert d.disturbed_runs == (("a", 0),) and "a" in dict(d.excluded) and d.choice is not None
