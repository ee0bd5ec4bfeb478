"""Telemetry rows of several nodes summed per moment (validation.launch.telemetry.summarize), read from hand-made
telemetry-<node>.csv files, and the launch's process tree (TreeProbe) over hand-made /proc tables where a process of
the tree outlives its parent. Every expected figure is worked out by hand."""

from __future__ import annotations

import csv
import time

from validation import contracts
from validation.launch import telemetry
from validation.launch.telemetry import ProcStat as PS


def _node_file(path, node: str, t0: float, n: int, cpu: float, rss: float) -> None:
    """A node's sampler file: `n` samples one second apart from unix time `t0`, two GPUs each (two rows per sample
    sharing the CPU figures), the launch's processes on that node at `cpu` percent and `rss` GiB throughout."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(contracts.TELEMETRY_COLUMNS))
        writer.writeheader()
        for i in range(n):
            for gpu in (0, 1):
                writer.writerow({"time": f"{t0 + i:.3f}", "elapsed_s": f"{i:.3f}", "node": node, "sample": i,
                                 "gpu": gpu, "ours": 1, "gpu_util_pct": 90, "cpu_util_pct": cpu, "rss_gb": rss,
                                 "procs": 2})


def test_nodes_whose_samplers_started_apart_are_summed_per_moment_not_per_sample_number(tmp_path):
    """Node a samples at 1000, 1001, ... 1011 (its launch processes at 30% and 3 GiB throughout), node b, whose task
    started 3.5 s later, at 1003.5, ... 1014.5 (20%, 2 GiB). Over the window [1004, 1009] both nodes ran all along,
    so the launch used 30 + 20 = 50% and 3 + 2 = 5 GiB at every moment. Summed by sample number, b's sample k
    (at 1003.5 + k) went with a's sample k (at 1000 + k), and the window's edges summed one node only: a mean of
    31.1% (min 20) and 3.1 GiB (min 2)."""
    _node_file(tmp_path / "telemetry-b.csv", "b", 1003.5, 12, cpu=20.0, rss=2.0)
    _node_file(tmp_path / "telemetry-a.csv", "a", 1000.0, 12, cpu=30.0, rss=3.0)
    rows = contracts.read_telemetry(tmp_path)
    m = telemetry.summarize(rows, 1004.0, 1009.0)
    assert (m.cpu_util.mean, m.cpu_util.min, m.cpu_util.max) == (50.0, 50.0, 50.0), m.cpu_util
    assert (m.rss_gb.mean, m.rss_gb.min, m.rss_gb.max) == (5.0, 5.0, 5.0), m.rss_gb
    assert m.cpu_util.n == 6  # the rounds starting at 1004, 1005, ..., 1009
    # the same rows in another order (the files read the other way round, a file's rows shuffled) sum the same
    again = telemetry.summarize(list(reversed(rows)), 1004.0, 1009.0)
    assert again.cpu_util == m.cpu_util and again.rss_gb == m.rss_gb


def test_a_nodes_sample_nine_tenths_of_an_interval_after_anothers_is_summed_with_it():
    """Node a at 1000, 1001, ...; node b at 1000.9, 1001.9, ... (1 s interval): every moment has one sample of each
    node, 40% + 60% = 100%. Over [1002, 1006] a has the samples 2..6 and b 2..5 (1002.9 .. 1005.9): by sample number
    the last one summed a alone (mean 88%, min 40)."""
    rows = [{"time": t0 + i, "node": node, "sample": i, "gpu": None, "cpu_util_pct": cpu, "rss_gb": 1.0}
            for node, t0, cpu in (("a", 1000.0, 40.0), ("b", 1000.9, 60.0)) for i in range(10)]
    m = telemetry.summarize(rows, 1002.0, 1006.0)
    assert m.cpu_util == telemetry.Gauge(mean=100.0, min=100.0, max=100.0, n=5), m.cpu_util
    assert m.rss_gb.min == 2.0


def test_one_nodes_samples_are_unchanged_by_the_rounds():
    """One node: every sample is its own round (a mean over the samples in the window, as before)."""
    rows = [{"time": 1000.0 + i, "node": "n", "sample": i, "gpu": None, "cpu_util_pct": float(10 * i),
             "rss_gb": 1.0} for i in range(6)]
    m = telemetry.summarize(rows, 1001.0, 1004.0)
    assert m.cpu_util == telemetry.Gauge(mean=25.0, min=10.0, max=40.0, n=4)


def test_a_rank_re_parented_when_its_agent_died_is_still_the_launchs():
    """Launch root 100 -> agent 101 -> rank 102 -> its loader 103. Between two samples one second apart the agent
    dies (5 ticks since the last sample; 100 waited for it, its children time 55 = the agent's 50 + 5); the rank is
    re-parented to PID 1 and keeps computing (80 ticks), its loader 10 ticks. The launch's processes used
    5 + 80 + 10 = 95 ticks, 95 / CLK_TCK cores, and 3 of them live (100, 102, 103); before, the re-parented rank and
    its loader left the tree: 5 ticks and 1 process."""
    tck = telemetry._CLK_TCK
    before = {100: PS("torchrun", "S", 1, 5, 0, 0), 101: PS("agent", "S", 100, 6, 50, 0),
              102: PS("python", "R", 101, 7, 300, 0), 103: PS("loader", "S", 102, 8, 20, 0)}
    after = {100: PS("torchrun", "S", 1, 5, 0, 55), 102: PS("python", "R", 1, 7, 380, 0),
             103: PS("loader", "S", 102, 8, 30, 0)}
    probe = telemetry.TreeProbe(100)
    t0 = time.monotonic()
    assert probe.sample({p: st._replace(at=t0) for p, st in before.items()})["cpu_util_pct"] is None
    out = probe.sample({p: st._replace(at=t0 + 1.0) for p, st in after.items()})
    assert abs(out["cpu_util_pct"] - round(100.0 * 95 / tck, 1)) < 0.05, out
    assert out["procs"] == 3 and probe.last_pids == {100, 102, 103}
    # a process that merely has the pid of one of the tree's, started after it ended (another start time), and a
    # process outside the tree all along, are not the launch's
    later = {100: PS("torchrun", "S", 1, 5, 0, 55), 102: PS("other", "R", 1, 999, 50, 0),
             200: PS("neighbour", "R", 1, 9, 500, 0)}
    out = probe.sample({p: st._replace(at=t0 + 2.0) for p, st in later.items()})
    assert probe.last_pids == {100} and out["procs"] == 1
