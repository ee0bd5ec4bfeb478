"""validation.launch.telemetry.HostProbe on a quiet machine whose scan of /proc is slow: the run's processes are
read (ProcStat.at) some time before the machine's counters (/proc/stat), and that lag changes from one sample to the
next. The figures are worked out by hand from a machine where only the run works, at a steady rate."""

from __future__ import annotations

import io
import time

import pytest

from validation.launch import telemetry
from validation.launch.telemetry import ProcStat as PS

TCK = telemetry._CLK_TCK


def test_a_slow_scan_of_proc_is_not_read_as_another_processes_cpu(monkeypatch):
    """The run (root 100 and its rank 101) keeps 4 cores busy and nothing else runs: the machine's busy ticks and the
    rank's grow by 4 * TCK a second on the same clock. The first sample reads the rank's line just before /proc/stat,
    the second 0.1 s before it (a scan held up by the load). Over a 0.4 s period the others used nothing; before the
    fix the machine's 0.4 s were set against the run's 0.3 s and the others read 100% of a core (contended: more
    than the 0.25 core of slack on a machine the launch fills)."""
    rate = 4 * TCK  # ticks a second
    origin = time.monotonic()
    monkeypatch.setattr(telemetry, "_cpu_ticks", lambda: (round(rate * (time.monotonic() - origin)), 0))
    probe = telemetry.HostProbe(100, ncpu=4)

    def table(lag: float) -> dict:
        at = time.monotonic() - lag
        return {100: PS("nsa-validate", "S", 1, 5, 0, 0, at),
                101: PS("python", "R", 100, 6, round(rate * (at - origin)), 0, at)}

    probe.sample(table(0.0))
    time.sleep(0.4)
    out = probe.sample(table(0.1))
    assert out["host_cpu_pct"] == pytest.approx(400.0, abs=15.0), out
    assert out["other_cpu_pct"] == pytest.approx(0.0, abs=10.0), out
    assert out["other_top"] is None, out


def test_a_neighbour_is_still_measured_when_the_scan_is_slow(monkeypatch):
    """The same run beside a neighbour (pid 200) busy on one core: the others read one core, whatever the lag."""
    rate, extra = 4 * TCK, TCK
    origin = time.monotonic()
    monkeypatch.setattr(telemetry, "_cpu_ticks", lambda: (round((rate + extra) * (time.monotonic() - origin)), 0))
    probe = telemetry.HostProbe(100, ncpu=8)

    def table(lag: float) -> dict:
        at = time.monotonic() - lag
        return {100: PS("nsa-validate", "S", 1, 5, 0, 0, at),
                101: PS("python", "R", 100, 6, round(rate * (at - origin)), 0, at),
                200: PS("python", "R", 1, 7, round(extra * (at - origin)), 0, at)}

    probe.sample(table(0.1))
    time.sleep(0.4)
    out = probe.sample(table(0.0))
    assert out["other_cpu_pct"] == pytest.approx(100.0, abs=12.0), out


def _fake_proc_stat(monkeypatch, per_cpu) -> None:
    """/proc/stat as telemetry reads it: the CPUs' user ticks per_cpu(t) at monotonic time t (their sum on the
    first line, as the kernel writes it); every other file read as it is."""
    real_open = open

    def fake_open(path, *args, **kwargs):
        if str(path) != "/proc/stat":
            return real_open(path, *args, **kwargs)
        ticks = per_cpu(time.monotonic())
        lines = [f"cpu  {sum(ticks)} 0 0 0 0 0 0 0 0 0"]
        lines += [f"cpu{i} {v} 0 0 0 0 0 0 0 0 0" for i, v in enumerate(ticks)]
        return io.BytesIO(("\n".join(lines) + "\nintr 0\n").encode())

    monkeypatch.setattr(telemetry, "open", fake_open, raising=False)


def test_a_neighbour_on_the_cpus_of_the_runs_cpuset_is_seen_and_other_tenants_are_not(monkeypatch):
    """A 128-CPU host; the run may use CPUs 0 and 1 (its container's cpuset). The launch keeps CPU 0 busy, a neighbour
    in the same container (pid 200) CPU 1, and other tenants 50 of the other 126 CPUs. Of the run's two CPUs the
    others used one: with a launch set to use both, contended. Before the fix the probe counted all 128 CPUs: the
    others read 51 cores of 128, and with 126 cores left free by the launch no sample was ever contended."""
    monkeypatch.setattr(telemetry.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(telemetry.os, "cpu_count", lambda: 128)
    origin = time.monotonic()
    _fake_proc_stat(monkeypatch, lambda t: [round(TCK * (t - origin))] * 2
                    + [round(TCK * (t - origin) * 50 / 126)] * 126)
    probe = telemetry.HostProbe(100)

    def table() -> dict:
        at = time.monotonic()
        used = round(TCK * (at - origin))
        return {100: PS("nsa-validate", "R", 1, 5, used, 0, at), 200: PS("python", "R", 1, 7, used, 0, at)}

    rows = [{"time": 1000.0, "node": "n0", "sample": 0, "step_cores": 2, **probe.sample(table())}]
    time.sleep(0.4)
    rows.append({"time": 1000.4, "node": "n0", "sample": 1, "step_cores": 2, **probe.sample(table())})
    assert rows[1]["ncpu"] == 2
    assert rows[1]["other_cpu_pct"] == pytest.approx(100.0, abs=12.0), rows[1]
    verdict = telemetry.interference(rows)
    assert verdict.disturbed and verdict.contended == 1 and "cpu" in verdict.causes, verdict
