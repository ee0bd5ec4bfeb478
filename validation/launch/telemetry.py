"""Device telemetry beside a trainer launch: one sampler per node, started and ended by the launch (never by the
trainer), writing ``telemetry.csv`` (``telemetry-<node>.csv`` for a Slurm job's nodes) into the step directory.

Local launches (validation.launch.local.Run): a ``Sampler`` thread of nsa-validate itself, started when the
launch's first process is tracked and stopped (joined) when the launch ends, so there is no process to leave
behind. A Slurm job: every node's task starts ``python -m validation.launch.telemetry --out ... --root $$`` in the
background before torchrun and ends it after (validation.launch.slurm.batch_script); the sampler also ends by itself
as soon as its root process is gone.

Every ``interval_s`` (default 1 s) one row per GPU of the node (one row with ``gpu`` empty without pynvml or a GPU):
``COLUMNS`` (validation.contracts.TELEMETRY_COLUMNS, where the file's format is defined beside its reader)
documents each column. GPU figures come from NVML (``pynvml``, imported lazily; a figure the driver does not report
is empty); the CPU figures are the launch's process tree (the root and its descendants, /proc, a descendant
re-parented out of the tree when its parent ended included while it lives: TreeProbe): CPU utilisation in percent of
one core (200 = two cores busy) and the sum of the processes' resident set sizes; a multi-node launch's figures are
the nodes' summed per moment (summarize). Reading the file:
validation.contracts.read_telemetry; metrics for criteria: ``summarize``; the low-utilisation diagnosis:
``diagnose``.
"""

from __future__ import annotations

import argparse
import csv
import os
import signal
import socket
import sys
import threading
import time
import dataclasses
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from validation.contracts import TELEMETRY_COLUMNS as COLUMNS
from validation.launch.processes import descendants, launch_ids_of
from validation.results.codec import encode
from validation.results.interference import Cause, LaunchInterference, OtherCommand
from validation.results.trainer_launch import Cause as Diagnosed
from validation.results.trainer_launch import Gauge, GpuDiagnosis, Num

INTERVAL_S = 1.0
LOW_GPU_UTIL_PCT = 80.0  # seed 003, "Low GPU Utilization": GPU utilization < 80%

# Interference: what else used the machine while a launch ran (``interference`` judges the samples). Declared once,
# each with its reason; the report shows them (``interference_rules``).
OTHER_CPU_SLACK_CORES = 0.25  # other processes may use this much CPU beyond the cores the launch leaves free: the
#                               system's daemons, the kernel's threads and the rounding of the kernel's tick counts
STEAL_SLACK_CORES = 0.10  # a hypervisor that takes more than a tenth of a core from the VM slows whatever runs on it
DISTURBED_SHARE = 0.20  # a launch is disturbed when at least this share of its samples over the measured period were
#                         contended: a cron job's second is not, a neighbour busy for a fifth of the window is
# GPU clock throttles that slow a measurement without the run asking for them; a power cap (sw_power_cap), an idle
# clock (gpu_idle), application clocks and sync boost are settings of the machine, not interference
DISTURBING_THROTTLES = ("hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown")
TOP_OTHERS = 3  # the busiest other processes named in a contended sample

# NVML clock event (throttle) reason bits (nvmlClocksEventReason*, formerly nvmlClocksThrottleReason*; board_limit
# and reliability from newer drivers only).
THROTTLE_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting", 0x200: "board_limit",
                    0x400: "reliability"}
# not a throttle: an idle GPU lowering its clocks, and clocks running at the application clocks the machine's owner
# set (nvidia-smi -ac), which are what the GPU is meant to run at
NOT_THROTTLED = ("gpu_idle", "applications_clocks_setting")

_GIB = 1024 ** 3
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def throttle_names(mask: int) -> list[str]:
    """NVML throttle reason bits -> names (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return names + ([hex(rest)] if rest else [])


# ------------------------------------------------------------------------------------------- probes
class ProcStat(NamedTuple):
    """One process's line of /proc/PID/stat, the fields the probes read (times in clock ticks)."""

    comm: str
    state: str
    ppid: int
    start: int  # start time, ticks since boot: with the pid, the process's identity
    user_sys: int  # utime + stime
    children: int  # cutime + cstime: the CPU of children it has waited for
    at: float = 0.0  # time.monotonic() when the line was read: a busy machine can hold a scan of /proc for longer
    #                  than a tenth of the interval, and a period timed from the scan's end would not be the ticks'


def scan_processes() -> dict[int, ProcStat]:
    """{pid: ProcStat} of every process (one read of /proc per sample, shared by the probes); {} without /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return {}
    table = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
            head, _, rest = data.rpartition(b")")
            fields = rest.split()
            table[int(name)] = ProcStat(head.partition(b"(")[2].decode(errors="replace"), fields[0].decode(),
                                        int(fields[1]), int(fields[19]), int(fields[11]) + int(fields[12]),
                                        int(fields[13]) + int(fields[14]), time.monotonic())
        except (OSError, ValueError, IndexError):
            continue
    return table


def _cpu_ticks(cpus: frozenset[int] | None = None) -> tuple[int, int] | None:
    """(busy, steal) ticks of all CPUs (of the CPUs `cpus` only, where given) from /proc/stat: busy = user + nice +
    system (a process's utime and stime; interrupt time belongs to no process), steal = what the hypervisor gave
    other guests; None without /proc (or without a line for one of `cpus`)."""
    try:
        with open("/proc/stat", "rb") as f:
            if cpus is None:
                lines = [f.readline().split()]
            else:
                lines = [fields for fields in map(bytes.split, f)
                         if fields and fields[0].startswith(b"cpu") and fields[0][3:].isdigit()
                         and int(fields[0][3:]) in cpus]
                if len(lines) != len(cpus):
                    return None
        busy = sum(int(fields[1]) + int(fields[2]) + int(fields[3]) for fields in lines)
        return busy, sum(int(fields[8]) if len(fields) > 8 else 0 for fields in lines)
    except (OSError, ValueError, IndexError):
        return None


def usable_cpus() -> frozenset[int] | None:
    """The CPUs this process may run on (its affinity: a container's or a Slurm task's cpuset) where they are fewer
    than the machine's, else None (all of them)."""
    try:
        cpus = frozenset(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    return cpus if cpus and len(cpus) < (os.cpu_count() or 0) else None


def _command(pid: int, comm: str, width: int = 60) -> str:
    """A process's command line, shortened to `width` characters (its name when the line cannot be read), without
    the separators other_top uses."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    text = " ".join([os.path.basename(argv[0]), *argv[1:]]) if argv else comm
    text = " ".join(text.replace(";", " ").replace("[", "(").replace("]", ")").split())
    return text if len(text) <= width else text[:width - 1] + "…"


def _environ_has(pid: int, marker: tuple[str, str]) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{marker[0]}={marker[1]}".encode() in f.read().split(b"\0")
    except OSError:
        return False


class _CpuAccount:
    """The CPU time a set of processes (a run's, a launch's tree) used between two samples of /proc, counted from
    each process's own time and the time of the children it waited for, so that a short-lived child (a compiler, a
    rank that ended) counts even after it is gone: a child reaped by one of the set's processes adds to that parent's
    children time (a child and the parent that reaped it both gone since the last sample, a rank and its agent: to
    the children time of the nearest ancestor still here, where what each had used at the last sample is taken off
    once, never counted twice); only what a child used after the last sample and before it was reaped by a process
    outside the set is lost (never the reverse)."""

    def __init__(self):
        self._own: dict[tuple[int, int], tuple[int, int, int]] = {}  # (pid, start) -> (user_sys, children, ppid)
        self._all: dict[tuple[int, int], int] = {}  # (pid, start) -> user_sys of every process at the last sample:
        #                                             for naming others, and what is new since (not in it)

    def _advance(self, own: dict, table: dict[int, ProcStat]) -> None:
        """Remember this sample's processes: the set's (`own`, as _own_delta takes it) and every one of `table`."""
        self._all = {(p, st.start): st.user_sys for p, st in table.items()}
        self._own = own

    def _new(self, key: tuple[int, int]) -> bool:
        """Whether the process `key` (pid, start) started since the last sample: it was not in the last sample's
        table. (Not its start time against the clock read after that table: a process started while the table was
        read, missing from it, started before that reading and would never count its first period.)"""
        return bool(self._all) and key not in self._all

    def _own_delta(self, own: dict, present: set[tuple[int, int]]) -> int:
        """Ticks the set's processes `own` ({(pid, start): (user_sys, children, ppid)}) used since the last sample
        (see the class docstring); `present`: the (pid, start) of every process now, to tell one that exited (and was
        reaped) from one that left the set."""
        # a process of the set that exited since the last sample: its time is now in the children time of the one
        # that reaped it, its parent, or, when the parent exited too (a rank and the agent that waited for it), the
        # nearest of its ancestors still here; what it had used at the last sample is taken off there, once. An
        # ancestor still here is the process that had its pid at the last sample: a process started since (the
        # kernel gave it the pid of one that ended) holds none of the gone ones' time
        alive = {pid for pid, start in own if (pid, start) in self._own}
        exited = {key: ppid for key, (_, _, ppid) in self._own.items() if key not in own and key not in present}
        parent_of = {pid: ppid for (pid, _), ppid in exited.items()}
        gone: dict[int, int] = {}  # pid -> what its descendants that are gone had used at the last sample
        for key, ppid in exited.items():
            hops = 0
            while ppid not in alive and ppid in parent_of and hops < len(parent_of):
                ppid, hops = parent_of[ppid], hops + 1
            us, ch, _ = self._own[key]
            gone[ppid] = gone.get(ppid, 0) + us + ch
        used = 0
        for key, (us, ch, _) in own.items():
            before = self._own.get(key)
            if before is not None:
                used += max(us - before[0], 0) + max(ch - before[1] - gone.get(key[0], 0), 0)
            elif self._new(key):
                used += us + ch
        return used


class HostProbe(_CpuAccount):
    """The machine's CPU beside a launch, from /proc: what all processes used (/proc/stat; on the CPUs this process
    may run on where its affinity is narrower than the machine: usable_cpus), what the run's own processes used, and
    the difference, the CPU of every other process; steal time; and, when the others used more than
    OTHER_CPU_SLACK_CORES, the busiest of them by name. Each side is a rate over its own period: the machine's from
    its reads of /proc/stat, the run's from when its processes' lines were read (ProcStat.at).

    The run's own processes are `own_root` (nsa-validate itself, or a Slurm node's task) and everything below it,
    plus (a Slurm job whose nodes share one machine) every process whose environment carries `job` (("SLURM_JOB_ID",
    "123")). Their CPU is counted as ``_CpuAccount`` says, so that a short-lived child counts as the run's even after
    it is gone; what a child used after the last sample and before it was reaped by a process outside the run counts
    as another's (never the reverse).
    The others' CPU is the machine's total less the run's, so that processes that live less than a sample (a build's
    compiler jobs) count in full."""

    def __init__(self, own_root: int, job: tuple[str, str] | None = None, ncpu: int | None = None,
                 cpus: frozenset[int] | None = None):
        self.own_root = int(own_root)
        self.job = job
        # the machine is the CPUs the run may use: in a cpuset (a container's, a Slurm task's) of 2 CPUs of 128, a
        # neighbour on one of the two is contention and another tenant on the other 126 is none of the run's
        # business, where counting every CPU saw the reverse (the launch's free cores read as 126). `ncpu` given
        # alone: that many CPUs, all of /proc/stat's
        self.cpus = frozenset(cpus) if cpus else (usable_cpus() if ncpu is None else None)
        self.ncpu = int(ncpu or (len(self.cpus) if self.cpus else os.cpu_count()) or 1)
        super().__init__()
        self._prev: tuple[float, int, int] | None = None  # (monotonic time, busy ticks, steal ticks)
        self._members: dict[tuple[int, int], bool] = {}  # (pid, start) -> carries `job` (read once per process)
        self._read: dict[tuple[int, int], float] = {}  # (pid, start) -> when the run's process was read (at)

    def _own_pids(self, table: dict[int, ProcStat]) -> set[int]:
        # zombies too: a child that has exited but is not yet reaped still holds its CPU time, which its parent's
        # children time takes over only once it waits for it (counted as another's in between, it looked like a
        # neighbour's burst at the end of every launch)
        own = set(descendants(self.own_root, {p: ("S", st.ppid, 0, 0, st.start) for p, st in table.items()}))
        if self.own_root in table:
            own.add(self.own_root)
        if self.job is not None:
            for pid, st in table.items():
                key = (pid, st.start)
                if pid not in own and key not in self._members:
                    self._members[key] = _environ_has(pid, self.job)
                if self._members.get(key):
                    own.add(pid)
        return own

    def sample(self, table: dict[int, ProcStat]) -> dict[str, Any]:
        now, ticks = time.monotonic(), (_cpu_ticks() if self.cpus is None else _cpu_ticks(self.cpus))
        own_pids = self._own_pids(table)
        own = {(p, table[p].start): (table[p].user_sys, table[p].children, table[p].ppid) for p in own_pids}
        out: dict[str, Any] = {"ncpu": self.ncpu, "host_cpu_pct": None, "other_cpu_pct": None, "steal_pct": None,
                               "other_top": None}
        # the run's lines of /proc were read during the scan (ProcStat.at), the machine's counters after it: under
        # load the lag between the two changes from one sample to the next, and the run's ticks over its own period
        # set against the machine's over a longer (shorter) one read as another's CPU (hid another's). Each side is a
        # rate over its own period: the run's from when its processes present at both samples were read
        read = [(table[p].at, self._read[key]) for p in own_pids
                if table[p].at > 0 and self._read.get(key := (p, table[p].start), 0.0) > 0]
        run_dt = sum(a - b for a, b in read) / len(read) if read else None
        # the machine's busy ticks only grow, except where a CPU went offline between the two reads (its counters
        # leave /proc/stat's sum): that period measures nothing (a negative busy share was written before)
        if (ticks is not None and self._prev is not None and now > self._prev[0]
                and ticks[0] >= self._prev[1]):
            dt = now - self._prev[0]
            busy, steal = ticks[0] - self._prev[1], ticks[1] - self._prev[2]
            used = self._own_delta(own, {(p, st.start) for p, st in table.items()})
            if run_dt is not None and run_dt > 0:
                used = used * dt / run_dt  # the run's ticks over the machine's period, at the rate it ran
            others = max(busy - used, 0)
            scale = 100.0 / _CLK_TCK / dt
            out.update(host_cpu_pct=round(busy * scale, 1), other_cpu_pct=round(others * scale, 1),
                       steal_pct=round(max(steal, 0) * scale, 1))
            if others * scale >= 100.0 * OTHER_CPU_SLACK_CORES:
                out["other_top"] = self._top_others(table, own_pids, scale)
        self._advance(own, table)
        self._read = {(p, table[p].start): table[p].at for p in own_pids}
        # a /proc/stat that could not be read leaves no reading to measure the next period from: the run's own
        # reading moved on (_advance), and two periods of the machine against one of the run read as a neighbour
        self._prev = None if ticks is None else (now, ticks[0], ticks[1])
        return out

    def _top_others(self, table: dict[int, ProcStat], own_pids: set[int], scale: float) -> str:
        """The busiest other processes since the last sample: "python3[4242] 98%; cc1[77] 12%"."""
        busy = []
        for pid, st in table.items():
            if pid in own_pids:
                continue
            before = self._all.get((pid, st.start))
            used = st.user_sys - before if before is not None else (st.user_sys if self._new((pid, st.start))
                                                                     else 0)
            if used > 0:
                busy.append((used, pid, st.comm))
        busy.sort(reverse=True)
        return "; ".join(f"{_command(pid, comm)}[{pid}] {used * scale:.0f}%" for used, pid, comm in busy[:TOP_OTHERS])


class TreeProbe(_CpuAccount):
    """CPU utilisation and RSS of a process and its descendants, from /proc. The CPU is counted as HostProbe counts
    the run's (``_CpuAccount``): each process's own time plus the time of the children it waited for, so that a
    child that lived less than a sample (a compiler, a test file's process, a rank that ended) counts in full. A
    process of the tree stays in it while it lives, also once its parent ended and it was re-parented out of the
    tree (a rank whose agent died), with whatever it starts. With `launch_id`, so is every process whose environment
    carries it (LAUNCH_ID_VAR): a daemon the launch started by a double fork is re-parented out of the tree before
    any sample can see it there, and its CPU, memory and GPUs are the launch's all the same."""

    def __init__(self, root_pid: int, exclude: set[int] | None = None, launch_id: str | None = None):
        super().__init__()
        self.root = int(root_pid)
        self.exclude = set(exclude or ())
        self.launch_id = launch_id.encode() if launch_id else None
        self._marked: dict[tuple[int, int], bool] = {}  # (pid, start) -> carries launch_id (environ read once)
        self._root_start: int | None = None  # a process started before the root cannot carry the launch's id
        self._t = time.monotonic()
        self._primed = False
        self.last_pids: set[int] = set()

    def _carries_id(self, pid: int, start: int) -> bool:
        """Whether `pid` (started at `start`) carries the launch's id; its environment is read once per process, and
        only for processes started since the root."""
        if self.launch_id is None or self._root_start is None or start < self._root_start:
            return False
        key = (pid, start)
        if key not in self._marked:
            self._marked[key] = self.launch_id in launch_ids_of(pid)
        return self._marked[key]

    def pids(self) -> list[int]:
        found = set(descendants(self.root)) | ({self.root} if os.path.exists(f"/proc/{self.root}") else set())
        return sorted(found - self.exclude)

    def alive(self) -> bool:
        try:
            with open(f"/proc/{self.root}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
        except (OSError, IndexError):
            return False

    def sample(self, table: dict[int, "ProcStat"] | None = None) -> dict[str, Any]:
        """The tree's CPU and RSS since the last sample; `table` (scan_processes) saves a second scan of /proc. The
        period is timed from when the tree's lines of /proc were read (the mean of their ProcStat.at), not from when
        this is called: under load a scan of /proc or the wait before this call can take a good part of the
        interval, and ticks over a longer window than the period read as more CPU than the cores have."""
        now = time.monotonic()
        table = scan_processes() if table is None else table
        # zombies too (their CPU time is theirs until their parent waits for them: see HostProbe._own_pids)
        parents = {p: ("S", st.ppid, 0, 0, st.start) for p, st in table.items()}
        members = set(descendants(self.root, parents)) | ({self.root} if self.root in table else set())
        # a process of the tree whose parent ended is re-parented out of it (to PID 1, or to nsa-validate, the
        # subreaper) but is still the launch's while it lives: one of the tree at the last sample (the same pid and
        # start time), and whatever it started since
        if self._root_start is None and self.root in table:
            self._root_start = table[self.root].start
        for p, st in table.items():
            if p not in members and ((p, st.start) in self._own or self._carries_id(p, st.start)):
                members |= {p} | set(descendants(p, parents))
        members -= self.exclude
        if self._marked:  # only the processes still here: a reused pid is another process, read afresh
            self._marked = {k: v for k, v in self._marked.items() if k[0] in table and table[k[0]].start == k[1]}
        read = [table[p].at for p in members if table[p].at > 0]
        if read:
            now = sum(read) / len(read)
        own = {(p, table[p].start): (table[p].user_sys, table[p].children, table[p].ppid) for p in members}
        live = sorted(p for p in members if table[p].state != "Z")
        self.last_pids = set(live)
        rss_pages = 0
        for pid in live:
            try:
                with open(f"/proc/{pid}/statm", "rb") as f:
                    rss_pages += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
        util = None
        if self._primed and now > self._t and table:  # the first sample has no period to measure over
            used = self._own_delta(own, {(p, st.start) for p, st in table.items()})
            util = round(max(100.0 * used / _CLK_TCK / (now - self._t), 0.0), 1)
        self._advance(own, table)
        self._t, self._primed = now, True
        return {"cpu_util_pct": util, "rss_gb": round(rss_pages * _PAGE / _GIB, 4), "procs": len(live)}


def load_nvml():
    """The pynvml module, or None where it is not installed (the node's telemetry and the environment probe)."""
    try:
        import pynvml  # optional dependency: without it, no GPU telemetry and no NVML inventory (said where used)
    except ImportError:
        return None
    return pynvml


NVIDIA_DRIVER = Path("/proc/driver/nvidia/version")  # present while the NVIDIA kernel driver is loaded
NO_DRIVER_NOTE = "no NVIDIA driver: no GPU telemetry"


def nvml_no_driver(pynvml, exc: BaseException) -> bool:
    """Whether `exc`, raised by NVML, means this machine has no NVIDIA driver, hence no GPU (not a problem: pynvml
    is installed on CPU machines too): NVML's library was not found or its driver is not loaded, and no NVIDIA kernel
    driver is loaded. Where the driver is loaded (a container without libnvidia-ml, say), the same error is a
    problem: the GPUs are there and unmeasured."""
    kinds = tuple(k for k in (getattr(pynvml, "NVMLError_LibraryNotFound", None),
                              getattr(pynvml, "NVMLError_DriverNotLoaded", None)) if isinstance(k, type))
    return bool(kinds) and isinstance(exc, kinds) and not NVIDIA_DRIVER.exists()


_NVML_VALUE_NOT_AVAILABLE = 2 ** 64 - 1  # an unsigned long long NVML does not know


def _process_memory(proc) -> int | None:
    """The GPU memory (bytes) of one of NVML's process entries, None where NVML does not know it."""
    used = getattr(proc, "usedGpuMemory", None)
    if isinstance(used, bool) or not isinstance(used, int) or not 0 <= used < _NVML_VALUE_NOT_AVAILABLE:
        return None
    return used


class GpuProbe:
    """Every GPU of the node through NVML (pynvml imported here, lazily). ``available`` is False without pynvml, a
    driver or a GPU; ``problem`` says why, except on a machine without the NVIDIA driver (``nvml_no_driver``): no
    GPU there is what the machine is, and ``note`` says so."""

    def __init__(self):
        self.available, self.problem, self.note = False, None, None
        self.handles: list = []
        self.indices: list[int] = []  # the NVML index of each handle (a GPU NVML may not open is left out)
        self.inaccessible: dict[int, str] = {}  # NVML index -> why its handle could not be had
        self.xid_count: dict[int, int] = {}
        self.xid_last: dict[int, int] = {}
        self.xid_watched: set[int] = set()  # NVML indices whose Xid events are registered
        self._events = None
        self._initialised = False
        pynvml = load_nvml()
        if pynvml is None:
            self.problem = "pynvml is not installed: no GPU telemetry"
            return
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            self._initialised = True
            count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            if nvml_no_driver(pynvml, exc):
                self.note = NO_DRIVER_NOTE
            else:
                self.problem = f"NVML: {exc}"
            return
        # the count includes GPUs this process may not open (NVML_ERROR_NO_PERMISSION: a Slurm job's cgroup allows
        # only its own GPUs); those are left out, the others keep their NVML index
        for i in range(count):
            try:
                self.handles.append(pynvml.nvmlDeviceGetHandleByIndex(i))
                self.indices.append(i)
            except Exception as exc:
                self.inaccessible[i] = str(exc)
        self.available = bool(self.handles)
        if not self.handles:
            self.problem = "NVML sees no GPU" if not count else "NVML: " + "; ".join(
                f"GPU {i}: {why}" for i, why in sorted(self.inaccessible.items()))
            return
        try:  # Xid errors arrive as events
            self._events = pynvml.nvmlEventSetCreate()
            for index, h in zip(self.indices, self.handles):
                try:  # NVML_ERROR_NOT_SUPPORTED (a GPU without events): the set still serves the others
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._events)
                    self.xid_watched.add(index)
                except Exception:
                    pass
        except Exception:
            self._events = None

    def _call(self, fn: str, *args):
        try:
            return getattr(self.nvml, fn)(*args)
        except Exception:
            return None

    def _poll_xids(self) -> None:
        if self._events is None:
            return
        for _ in range(64):
            try:
                data = self.nvml.nvmlEventSetWait_v2(self._events, 0)
            except Exception:  # NVMLError_Timeout: nothing pending
                return
            index = self._call("nvmlDeviceGetIndex", data.device)
            if index is not None:
                self.xid_count[index] = self.xid_count.get(index, 0) + 1
                self.xid_last[index] = int(data.eventData)

    def _processes(self, h) -> list | None:
        """The compute processes on GPU `h`, None when NVML cannot say. pynvml's unversioned call asks for the v3
        list, which older drivers lack (NVMLError_FunctionNotFound, or pynvml's NVMLLibraryMismatchError naming
        the versioned call to use): the v2 list then, which has the same pid and usedGpuMemory."""
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", h)
        if procs is None:
            procs = self._call("nvmlDeviceGetComputeRunningProcesses_v2", h)
        return procs

    def sample(self, pids: set[int], own: set[int] | None = None) -> list[dict[str, Any]]:
        """One row per GPU; `pids`: the launch's processes ("ours"), `own`: every process of the run (the others'
        compute processes and memory are those of any other pid)."""
        if not self.available:
            return []
        own = set(pids) | set(own or ())
        nv = self.nvml
        self._poll_xids()
        rows = []
        for index, h in zip(self.indices, self.handles):
            util = self._call("nvmlDeviceGetUtilizationRates", h)
            mem = self._call("nvmlDeviceGetMemoryInfo", h)
            power = self._call("nvmlDeviceGetPowerUsage", h)
            mask = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
            if mask is None:
                mask = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
            procs = self._processes(h)
            ecc = [self._call("nvmlDeviceGetTotalEccErrors", h, kind, nv.NVML_VOLATILE_ECC)
                   for kind in (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)]
            others = None if procs is None else [p for p in procs if p.pid not in own]
            # a process's memory NVML does not know (NVML_VALUE_NOT_AVAILABLE, 2**64 - 1, which pynvml reads as
            # None: MIG, WDDM) makes the others' memory unknown, not 0
            other_mem = [_process_memory(p) for p in others or []]
            rows.append({
                "gpu": index,
                "ours": None if procs is None else int(any(p.pid in pids for p in procs)),
                "other_gpu_procs": None if others is None else len(others),
                "other_gpu_mem_gb": None if others is None or None in other_mem else round(
                    sum(other_mem) / _GIB, 3),
                "gpu_util_pct": None if util is None else util.gpu,
                "mem_used_gb": None if mem is None else round(mem.used / _GIB, 3),
                "mem_total_gb": None if mem is None else round(mem.total / _GIB, 3),
                "power_w": None if power is None else round(power / 1000.0, 1),
                "sm_clock_mhz": self._call("nvmlDeviceGetClockInfo", h, nv.NVML_CLOCK_SM),
                "temp_c": self._call("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU),
                "throttle": None if mask is None else ("+".join(throttle_names(int(mask))) or "none"),
                "pcie_gen": self._call("nvmlDeviceGetCurrPcieLinkGeneration", h),
                "pcie_gen_max": self._call("nvmlDeviceGetMaxPcieLinkGeneration", h),
                "pcie_width": self._call("nvmlDeviceGetCurrPcieLinkWidth", h),
                "pcie_width_max": self._call("nvmlDeviceGetMaxPcieLinkWidth", h),
                "ecc_corrected": ecc[0], "ecc_uncorrected": ecc[1],
                "xid_errors": self.xid_count.get(index, 0) if index in self.xid_watched else None,
                "xid_last": self.xid_last.get(index),
            })
        return rows

    def close(self) -> None:
        if self._initialised:
            try:
                if self._events is not None:
                    self.nvml.nvmlEventSetFree(self._events)
                self.nvml.nvmlShutdown()
            except Exception:
                pass


# ------------------------------------------------------------------------------------------- the sampler
class Sampler:
    """Samples the node's GPUs and the process tree under `root_pid` every `interval_s` into `path` (CSV, one row
    per GPU and sample, flushed per sample). ``start()`` runs it in a daemon thread, ``stop()`` ends and joins it;
    ``run()`` samples in the calling thread until the root process is gone or ``stop()``."""

    def __init__(self, path: Path, root_pid: int, interval_s: float = INTERVAL_S, node: str | None = None,
                 gpus: bool = True, own_root: int | None = None, cores: float | None = None,
                 job: tuple[str, str] | None = None, launch_id: str | None = None):
        """`own_root`: the run's own processes are it and everything below it (default: this process, nsa-validate
        running the launch; a Slurm node's sampler: its task); `cores`: the cores the launch is set to use (its
        ranks on this node times their threads; None: every core), what the others may use of the rest before the
        launch is contended; `job`: an environment variable ("SLURM_JOB_ID", "123") that marks the run's processes
        outside `own_root` (a job's other node on the same machine); `launch_id`: the launch's LAUNCH_ID_VAR, which
        makes a process of the launch re-parented out of the tree before a sample saw it (a daemon started by a
        double fork) one of the tree's (TreeProbe)."""
        if not (isinstance(interval_s, (int, float)) and interval_s > 0):
            raise ValueError(f"telemetry interval must be > 0 s, got {interval_s!r}")
        self.path, self.interval_s = Path(path), float(interval_s)
        self.node = node or socket.gethostname()
        # a node's sampler runs inside the tree it watches
        self.tree = TreeProbe(root_pid, exclude={os.getpid()}, launch_id=launch_id)
        self.host = HostProbe(os.getpid() if own_root is None else own_root, job=job)
        self.cores = float(min(cores, self.host.ncpu)) if cores else float(self.host.ncpu)
        self._want_gpus = gpus
        self.gpu: GpuProbe | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.cpu_s = 0.0  # the sampler's own CPU time (thread time), all samples
        self.error: str | None = None

    def start(self) -> "Sampler":
        self._thread = threading.Thread(target=self._run_safely, name="nsav-telemetry", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run_safely(self) -> None:
        try:
            self.run()
        except Exception as exc:  # telemetry must never take a launch down
            self.error = f"{type(exc).__name__}: {exc}"

    def run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        with open(self.path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS))
            writer.writeheader()
            f.flush()
            c0 = time.thread_time()
            self.gpu = GpuProbe() if self._want_gpus else None
            setup = time.thread_time() - c0
            try:
                while True:
                    self._sample(writer, t0, setup)
                    setup = 0.0
                    f.flush()
                    if self._stop.wait(self.interval_s) or not self.tree.alive():
                        break
            finally:
                if self.gpu is not None:
                    self.gpu.close()

    def _sample(self, writer, t0: float, extra_cpu: float) -> None:
        c0 = time.thread_time()
        now = time.time()
        table = scan_processes()
        tree = self.tree.sample(table if table else None)
        host = self.host.sample(table)
        pids = self.tree.last_pids
        own = self.host._own_pids(table) if self.gpu is not None and self.gpu.available else set()
        gpu_rows = self.gpu.sample(pids, own) if self.gpu is not None else []
        cost = time.thread_time() - c0 + extra_cpu
        self.cpu_s += cost
        base = {"time": f"{now:.3f}", "elapsed_s": f"{now - t0:.3f}", "node": self.node, "sample": self.samples,
                **tree, **host, "step_cores": f"{self.cores:g}", "sampler_cpu_ms": f"{cost * 1000:.2f}"}
        for row in gpu_rows or [{}]:
            writer.writerow({k: ("" if v is None else v) for k, v in {**base, **row}.items()})
        self.samples += 1


# ------------------------------------------------------------------------------------------- metrics
@dataclasses.dataclass(frozen=True)
class Sample:
    """One row of telemetry.csv as validation.contracts.read_telemetry reads it: a field per column of
    ``COLUMNS`` (validation.contracts.TELEMETRY_COLUMNS, where each is documented), numbers as int/float, an empty
    cell (or a column a row lacks) None; "node", "throttle" and "other_top" as text."""
    time: Num | None = None
    elapsed_s: Num | None = None
    node: str | None = None
    sample: Num | None = None
    gpu: Num | None = None
    ours: Num | None = None
    gpu_util_pct: Num | None = None
    mem_used_gb: Num | None = None
    mem_total_gb: Num | None = None
    power_w: Num | None = None
    sm_clock_mhz: Num | None = None
    temp_c: Num | None = None
    throttle: str | None = None
    pcie_gen: Num | None = None
    pcie_gen_max: Num | None = None
    pcie_width: Num | None = None
    pcie_width_max: Num | None = None
    ecc_corrected: Num | None = None
    ecc_uncorrected: Num | None = None
    xid_errors: Num | None = None
    xid_last: Num | None = None
    other_gpu_procs: Num | None = None
    other_gpu_mem_gb: Num | None = None
    cpu_util_pct: Num | None = None
    rss_gb: Num | None = None
    procs: Num | None = None
    ncpu: Num | None = None
    step_cores: Num | None = None
    host_cpu_pct: Num | None = None
    other_cpu_pct: Num | None = None
    steal_pct: Num | None = None
    other_top: str | None = None
    sampler_cpu_ms: Num | None = None

    @classmethod
    def of(cls, row: "Sample | Mapping[str, Any]") -> "Sample":
        """A row of read_telemetry (a dict by column) as a Sample; a Sample as it is."""
        if isinstance(row, Sample):
            return row
        return cls(**{name: row.get(name) for name in _SAMPLE_FIELDS})


_SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(Sample))


@dataclasses.dataclass(frozen=True)
class TelemetrySummary:
    """Telemetry over a period (``summarize``): the samples, nodes and GPUs counted, how the launch's GPUs were told
    apart (gpu_match), each GPU figure as a Gauge over the samples (None without GPU figures), the throttle reasons
    seen, the PCIe links, ECC and Xid counts, and the launch's CPU and RSS per sample (all nodes summed)."""
    samples: int = 0
    nodes: list[str] = dataclasses.field(default_factory=list)
    gpus: list[str] = dataclasses.field(default_factory=list)
    gpu_match: str | None = None
    gpu_util: Gauge | None = None
    gpu_mem_used_gb: Gauge | None = None
    gpu_mem_total_gb: Num | None = None
    power_w: Gauge | None = None
    sm_clock_mhz: Gauge | None = None
    temp_c: Gauge | None = None
    throttled: bool | None = None
    throttle_reasons: list[str] = dataclasses.field(default_factory=list)
    pcie_gen_min: Num | None = None
    pcie_gen_max: Num | None = None
    pcie_width_min: Num | None = None
    pcie_width_max: Num | None = None
    ecc_uncorrected: Num | None = None
    xid_errors: Num | None = None
    cpu_util: Gauge | None = None
    rss_gb: Gauge | None = None

    def criteria_metrics(self) -> dict[str, Any]:
        """The figures a launch's metrics record for criteria (validation.kinds.train_report), as JSON."""
        return encode({"gpu_util": self.gpu_util, "gpu_mem_used_gb": self.gpu_mem_used_gb, "power_w": self.power_w,
                       "sm_clock_mhz": self.sm_clock_mhz, "temp_c": self.temp_c, "throttled": self.throttled,
                       "throttle_reasons": self.throttle_reasons, "pcie_gen_min": self.pcie_gen_min,
                       "pcie_width_min": self.pcie_width_min, "ecc_uncorrected": self.ecc_uncorrected,
                       "xid_errors": self.xid_errors, "cpu_util": self.cpu_util, "rss_gb": self.rss_gb})


def _stat(values: list[float]) -> Gauge | None:
    if not values:
        return None
    return Gauge(mean=round(sum(values) / len(values), 3), min=min(values), max=max(values), n=len(values))


def _numbers(values) -> list[float]:
    """The values that are numbers, as floats."""
    return [float(v) for v in values if isinstance(v, (int, float))]


def _xid_errors(gpu_rows: list[Sample]) -> int | float | None:
    """The Xid events over the GPUs counted: each GPU's last count (a count since the sampler started), summed;
    None where a GPU never had one (its Xid events were not watched: NVML_ERROR_NOT_SUPPORTED), since no count is
    not no error."""
    last: dict[tuple, Any] = {}
    for s in gpu_rows:
        key = (s.node, s.gpu)
        if isinstance(s.xid_errors, (int, float)) or key not in last:
            last[key] = s.xid_errors
    if not last or any(not isinstance(v, (int, float)) for v in last.values()):
        return None
    return sum(last.values())


def summarize(rows: "list[Sample | Mapping[str, Any]]", start: float | None = None, end: float | None = None,
              use_gpus: bool = True) -> TelemetrySummary:
    """Metrics for criteria from telemetry rows (validation.contracts.read_telemetry, or Samples) between unix times
    `start` and `end` (None: open): the TelemetrySummary's gpu_util {mean, min, max, n} (percent, over the launch's
    GPUs, every sample) or None without GPU figures, gpu_mem_used_gb, power_w, sm_clock_mhz, temp_c (same shape or
    None), throttled (any throttle reason other than those of NOT_THROTTLED, an idle GPU and the application clocks
    setting, in any sample; None without GPU figures), throttle_reasons (those seen, sorted), pcie_gen_min /
    pcie_width_min (the lowest current link during the period) with their maxima, ecc_uncorrected (the largest count
    seen), xid_errors (events seen; None where a GPU counted had its events unwatched), cpu_util {mean, min, max, n}
    (percent of one core, per sample), rss_gb {mean, min, max, n} (per sample, all nodes summed: the nodes' samples
    taken together by time, ``_rounds``, a round counting when its first sample is in the period), samples, nodes,
    gpus ("node:index" of the GPUs counted), gpu_match. The launch's GPUs are those a process of the launch used
    (``ours``, gpu_match "by process"); when no GPU shows one of its processes (NVML unable to say, or a container
    whose PIDs NVML does not see), every GPU of the node (gpu_match "all GPUs"). `use_gpus` False (a CPU run on a GPU
    node) leaves the GPU figures out."""
    timed = [s for s in map(Sample.of, rows) if isinstance(s.time, (int, float))]
    samples = [s for s in timed if (start is None or s.time >= start) and (end is None or s.time <= end)]
    gpu_rows = [s for s in samples if s.gpu is not None and use_gpus]
    matched = any(s.ours == 1 for s in gpu_rows)
    if matched:
        gpu_rows = [s for s in gpu_rows if s.ours == 1]

    # CPU figures: one value per (node, sample); a multi-node job's nodes summed per round of samples (_rounds: the
    # nodes' samplers start apart, so a sample number is no moment), the rounds made of every row and then taken by
    # the time of their first sample: a window cutting a round would sum a part of the nodes
    per_sample: dict[tuple, Sample] = {}
    for s in samples:
        per_sample.setdefault((s.node, s.sample), s)
    every: dict[tuple, Sample] = {}
    for s in timed:
        every.setdefault((s.node, s.sample), s)
    sums: list[list[float | None]] = []  # [CPU, RSS] per round, summed over the nodes
    for group in _rounds(list(every.values())):
        t = float(group[0].time)
        if (start is not None and t < start) or (end is not None and t > end):
            continue
        acc: list[float | None] = [None, None]
        for s in group:
            for i, value in enumerate((s.cpu_util_pct, s.rss_gb)):
                if isinstance(value, (int, float)):
                    acc[i] = (0.0 if acc[i] is None else acc[i]) + float(value)
        sums.append(acc)
    reasons = sorted({n for s in gpu_rows for n in str(s.throttle or "").split("+") if n and n != "none"})
    throttled = (any(n not in NOT_THROTTLED for n in reasons)
                 if any(s.throttle is not None for s in gpu_rows) else None)
    gens, widths = _numbers(s.pcie_gen for s in gpu_rows), _numbers(s.pcie_width for s in gpu_rows)
    return TelemetrySummary(
        samples=len(per_sample),
        nodes=sorted({str(s.node) for s in samples if s.node}),
        gpus=sorted({f"{s.node}:{int(s.gpu)}" for s in gpu_rows}),
        gpu_match=("by process" if matched else "all GPUs") if gpu_rows else None,
        gpu_util=_stat(_numbers(s.gpu_util_pct for s in gpu_rows)),
        gpu_mem_used_gb=_stat(_numbers(s.mem_used_gb for s in gpu_rows)),
        gpu_mem_total_gb=max(_numbers(s.mem_total_gb for s in gpu_rows), default=None),
        power_w=_stat(_numbers(s.power_w for s in gpu_rows)),
        sm_clock_mhz=_stat(_numbers(s.sm_clock_mhz for s in gpu_rows)),
        temp_c=_stat(_numbers(s.temp_c for s in gpu_rows)),
        throttled=throttled,
        throttle_reasons=reasons,
        pcie_gen_min=min(gens) if gens else None,
        pcie_gen_max=max(_numbers(s.pcie_gen_max for s in gpu_rows), default=None),
        pcie_width_min=min(widths) if widths else None,
        pcie_width_max=max(_numbers(s.pcie_width_max for s in gpu_rows), default=None),
        ecc_uncorrected=max(_numbers(s.ecc_uncorrected for s in gpu_rows), default=None),
        xid_errors=_xid_errors(gpu_rows),
        cpu_util=_stat([cpu for cpu, _ in sums if cpu is not None]),
        rss_gb=_stat([rss for _, rss in sums if rss is not None]),
    )


def _rounds(samples: list[Sample]) -> list[list[Sample]]:
    """The nodes' samples (one row per node and sample, each with its time) in rounds, in time order: a round holds
    at most one sample of each node, all taken within one sampling interval of the round's first (the median
    spacing of a node's consecutive samples; INTERVAL_S where no node has two), so that the nodes' figures are
    summed at one moment whatever each sampler's sample number or start (a node's sample at t and another's at
    t + 0.9 s of a 1 s interval: one round), and rows out of time order (several files, a clock read late) make the
    same rounds."""
    times: dict[Any, list[float]] = {}
    for s in samples:
        times.setdefault(s.node, []).append(float(s.time))
    ordered = [sorted(ts) for ts in times.values()]
    gaps = sorted(b - a for ts in ordered for a, b in zip(ts, ts[1:]) if b > a)
    interval = gaps[len(gaps) // 2] if gaps else INTERVAL_S
    rounds: list[list[Sample]] = []
    nodes: set = set()
    first = 0.0
    for s in sorted(samples, key=lambda s: (float(s.time), str(s.node))):
        if not rounds or s.node in nodes or float(s.time) - first >= interval:
            rounds.append([])
            nodes, first = set(), float(s.time)
        rounds[-1].append(s)
        nodes.add(s.node)
    return rounds


def interference_rules() -> str:
    """The thresholds ``interference`` applies, in one sentence (the report shows it beside every verdict it
    changed)."""
    return (f"a sample is contended when the processes outside the run use more than the cores the launch leaves "
            f"free plus {OTHER_CPU_SLACK_CORES:g} core, the hypervisor steals more than {STEAL_SLACK_CORES:g} core, "
            f"another process computes on one of the launch's GPUs, or a GPU is slowed by "
            f"{' / '.join(DISTURBING_THROTTLES)} (a power cap or an idle clock is not interference); a launch is "
            f"disturbed when at least {DISTURBED_SHARE:.0%} of its samples over the measured period are contended")


def _periods(samples: list[Sample]) -> list[tuple[float | None, float, Sample, list[Sample]]]:
    """(start, end, the sample's CPU row, its GPU rows) per sample and node, in time order: a sample's figures cover
    the period since the node's previous sample (start None for a node's first)."""
    by_sample: dict[tuple, list[Sample]] = {}
    for s in samples:
        if isinstance(s.time, (int, float)):
            by_sample.setdefault((s.node, s.sample), []).append(s)
    out, last = [], {}
    for (node, _), group in sorted(by_sample.items(), key=lambda kv: (str(kv[0][0]), kv[1][0].time)):
        t = float(group[0].time)
        out.append((last.get(node), t, group[0], [g for g in group if g.gpu is not None]))
        last[node] = t
    return out


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def interference(rows: "list[Sample | Mapping[str, Any]]", start: float | None = None, end: float | None = None,
                 use_gpus: bool = True) -> LaunchInterference | None:
    """What else used the machine over (start, end] (unix times; None: open), from telemetry rows
    (validation.contracts.read_telemetry, or Samples), judged by the thresholds at the top of this module
    (interference_rules).

    Each sample covers the period since the node's previous one; those whose period overlaps the interval count.
    A sample is contended when (any of)
      cpu       the other processes used more than max(ncpu - step_cores, 0) + OTHER_CPU_SLACK_CORES cores;
      steal     the hypervisor stole more than STEAL_SLACK_CORES;
      gpu       another process had a compute context on one of the launch's GPUs (only where NVML tells the
                launch's processes apart: telemetry.summarize's gpu_match "by process");
      throttle  a GPU of the launch ran under one of DISTURBING_THROTTLES.
    Returns None when no sample in the interval has the CPU figures (telemetry written before they existed), else a
    LaunchInterference (validation.results.interference): disturbed (at least DISTURBED_SHARE of the samples
    contended), samples, contended, share, causes {cause: Cause (its samples and figures)}, ncpu, step_cores, text
    (what and how much, in words), rules (interference_rules())."""
    selected = []
    for begin, t, cpu, gpus in _periods([Sample.of(r) for r in rows]):
        if begin is None or _num(cpu.other_cpu_pct) is None:
            continue
        if (end is not None and begin >= end) or (start is not None and t <= start):
            continue
        selected.append((t - begin, cpu, gpus))
    if not selected:
        return None
    matched = use_gpus and any(g.ours == 1 for _, _, gpus in selected for g in gpus)
    seen: list[str] = []  # the causes in the order first seen
    hits = {"cpu": 0, "steal": 0, "gpu": 0, "throttle": 0}  # samples per cause
    cpu_cores: list[float] = []
    cpu_free: float | None = None  # the free cores of the first sample the other processes contended
    steal_cores: list[float] = []
    gpu_procs = 0.0
    gpu_mem: float | None = None  # the others' GPU memory, None while NVML did not know it
    reasons: set[str] = set()
    contended = 0
    tops: dict[str, list[str]] = {}
    ncpu = max((_num(c.ncpu) or 0.0) for _, c, _ in selected) or None
    cores = max((_num(c.step_cores) or 0.0) for _, c, _ in selected) or ncpu

    def hit(cause: str) -> None:
        if not hits[cause]:
            seen.append(cause)
        hits[cause] += 1

    for _, cpu, gpus in selected:
        n = _num(cpu.ncpu) or ncpu or 1.0
        free = max(n - (_num(cpu.step_cores) or n), 0.0)
        other = (_num(cpu.other_cpu_pct) or 0.0) / 100.0
        contended_before = sum(hits.values())
        if other > free + OTHER_CPU_SLACK_CORES:
            hit("cpu")
            cpu_free = free if cpu_free is None else cpu_free
            cpu_cores.append(other)
            for part in str(cpu.other_top or "").split(";"):
                name = part.strip().rsplit("[", 1)[0]
                if name:
                    tops.setdefault(name, []).append(part.strip())
        steal = (_num(cpu.steal_pct) or 0.0) / 100.0
        if steal > STEAL_SLACK_CORES:
            hit("steal")
            steal_cores.append(steal)
        mine = [g for g in gpus if g.ours == 1] if matched else (gpus if use_gpus else [])
        if matched and any((_num(g.other_gpu_procs) or 0) > 0 for g in mine):
            hit("gpu")
            gpu_procs = max(gpu_procs, max(_num(g.other_gpu_procs) or 0.0 for g in mine))
            known = [m for m in (_num(g.other_gpu_mem_gb) for g in mine if (_num(g.other_gpu_procs) or 0) > 0)
                     if m is not None]
            if known:
                gpu_mem = max([gpu_mem or 0.0, *known])
        throttles = {n for g in mine for n in str(g.throttle or "").split("+") if n in DISTURBING_THROTTLES}
        if throttles:
            hit("throttle")
            reasons |= throttles
        contended += sum(hits.values()) > contended_before
    total = len(selected)
    share = contended / total
    parts = []
    causes: dict[str, Cause] = {}
    for name in seen:
        frac = f"in {hits[name]} of {total} samples ({hits[name] / total:.0%})"
        if name == "cpu":
            mean = sum(cpu_cores) / len(cpu_cores)
            names = sorted(tops.items(), key=lambda kv: -len(kv[1]))[:TOP_OTHERS]
            causes[name] = Cause(samples=hits[name], free=cpu_free, cores_mean=round(mean, 2),
                                 cores_max=round(max(cpu_cores), 2),
                                 top=[OtherCommand(command=k, samples=len(v), example=v[0]) for k, v in names])
            parts.append(f"other processes used {mean:.2f} of {ncpu or 0:g} cores on average (the launch uses "
                         f"{cores or 0:g}, leaving {cpu_free:g} free) {frac}"
                         + (f"; the busiest: {', '.join(repr(k) for k, _ in names)}" if names else ""))
        elif name == "steal":
            mean = sum(steal_cores) / len(steal_cores)
            causes[name] = Cause(samples=hits[name], cores_mean=round(mean, 2), cores_max=round(max(steal_cores), 2))
            parts.append(f"the hypervisor stole {mean:.2f} cores on average {frac}")
        elif name == "gpu":
            causes[name] = Cause(samples=hits[name], procs=gpu_procs, mem_gb=gpu_mem)
            memory = (f"using up to {gpu_mem:.1f} GiB" if gpu_mem is not None
                      else "their GPU memory unknown to NVML")
            parts.append(f"{gpu_procs:g} other process(es) computed on the launch's GPU(s), {memory}, {frac}")
        else:
            causes[name] = Cause(samples=hits[name], reasons=sorted(reasons))
            parts.append(f"GPU clocks slowed by {', '.join(sorted(reasons))} {frac}")
    if parts:
        text = "; ".join(parts)
    else:
        text = f"no interference in {total} sample{'s' if total != 1 else ''}"
    return LaunchInterference(disturbed=share >= DISTURBED_SHARE, samples=total, contended=contended,
                              share=round(share, 3), causes=causes, ncpu=ncpu, step_cores=cores, text=text,
                              rules=interference_rules())


def diagnose(t: TelemetrySummary, context: Mapping[str, Any] | None = None,
             threshold: float = LOW_GPU_UTIL_PCT) -> GpuDiagnosis | None:
    """Seed 003's "Low GPU Utilization" applied to `t` (summarize()'s metrics over the training window) and the run's
    context (validation.contracts.run_context): None unless the mean GPU utilisation is below `threshold` percent.
    Otherwise a GpuDiagnosis: gpu_util_mean, threshold, causes [Cause(cause, evidence)] (the seed's causes the
    evidence points to, most likely first), text:

    - batch too small: GPU memory used (max) below half of the GPU's memory -> room to raise the micro-batch;
    - data loading / host-bound: the launch's processes busy >= 90% of one core per GPU on average (the host,
      not the GPU, sets the pace);
    - host-device transfers: the PCIe link below its maximum generation or width during training.

    When no evidence points anywhere, all three are listed as the seed's candidates, unranked."""
    util = t.gpu_util.mean if t.gpu_util else None
    if not isinstance(util, (int, float)) or util >= threshold:
        return None
    context = context or {}
    causes = []
    mem, total = t.gpu_mem_used_gb.max if t.gpu_mem_used_gb else None, t.gpu_mem_total_gb
    micro, seq = context.get("micro_batch"), context.get("seq_len")
    shape = f" (micro-batch {micro} x seq_len {seq})" if micro and seq else ""
    if isinstance(mem, (int, float)) and isinstance(total, (int, float)) and total > 0 and mem < 0.5 * total:
        causes.append(Diagnosed(cause="batch too small",
                                evidence=f"GPU memory used at most {mem:.1f} of {total:.1f} GiB{shape}: raise the "
                                         "batch size"))
    cpu, n_gpus = t.cpu_util.mean if t.cpu_util else None, max(len(t.gpus or []), 1)
    if isinstance(cpu, (int, float)) and cpu >= 90.0 * n_gpus:
        causes.append(Diagnosed(cause="data loading / host-bound",
                                evidence=f"the launch's processes used {cpu:.0f}% CPU (>= 90% of a core per GPU): "
                                         "the host sets the pace (data loading, Python overhead); pin_memory, more "
                                         "loader workers, or profile the host side"))
    gen, gmax = t.pcie_gen_min, t.pcie_gen_max
    width, wmax = t.pcie_width_min, t.pcie_width_max
    if (isinstance(gen, (int, float)) and isinstance(gmax, (int, float)) and gen < gmax) or \
            (isinstance(width, (int, float)) and isinstance(wmax, (int, float)) and width < wmax):
        causes.append(Diagnosed(cause="host-device transfers",
                                evidence=f"PCIe link at Gen{gen:g} x{width:g} during training, the GPU and slot "
                                         f"allow Gen{gmax:g} x{wmax:g}" if None not in (gen, width, gmax, wmax)
                                         else "PCIe link below its maximum during training"))
    if not causes:
        causes = [Diagnosed(cause=c, evidence="no telemetry singles it out")
                  for c in ("batch too small", "data loading", "host-device transfers")]
    text = (f"Low GPU utilisation: {util:.0f}% on average over the training window (< {threshold:.0f}%, seed 003); "
            + "; ".join(f"{c.cause}: {c.evidence}" for c in causes))
    return GpuDiagnosis(gpu_util_mean=util, threshold=threshold, causes=causes, text=text)


# ------------------------------------------------------------------------------------------- a snapshot's PCIe links
def _link_number(text: str | None) -> int | None:
    digits = "".join(c for c in (text or "") if c.isdigit())
    return int(digits) if digits else None


@dataclasses.dataclass(frozen=True)
class GpuLink:
    """One GPU's PCIe link in `nvidia-smi -q -x` output: its index, product name, maximum and current generation and
    width (None where the XML does not say)."""
    gpu: int
    name: str | None = None
    gen_max: int | None = None
    gen: int | None = None
    width_max: int | None = None
    width: int | None = None


@dataclasses.dataclass(frozen=True)
class PcieLinks:
    """The PCIe links of every GPU (pcie_links)."""
    gpus: list[GpuLink] = dataclasses.field(default_factory=list)
    pcie_gen_min: int | None = None
    pcie_gen_current_min: int | None = None
    pcie_width_min: int | None = None


def pcie_links(nvidia_smi_xml: str) -> PcieLinks:
    """The PCIe links of every GPU in `nvidia-smi -q -x` output: gpus (a GpuLink per GPU: gpu, name, gen_max, gen,
    width_max, width), pcie_gen_min (the lowest maximum link generation over the GPUs: what each link runs at under
    load), pcie_gen_current_min (the lowest current one: an idle GPU lowers its link to save power, so a snapshot's
    current generation may read low), pcie_width_min (the lowest maximum width); the figures None when the XML names
    no GPU or is unreadable."""
    gpus = []
    try:
        root = ET.fromstring(nvidia_smi_xml)
    except ET.ParseError:
        root = None
    for i, gpu in enumerate(root.findall("gpu") if root is not None else []):
        gen = gpu.find("pci/pci_gpu_link_info/pcie_gen")
        width = gpu.find("pci/pci_gpu_link_info/link_widths")
        gpus.append(GpuLink(gpu=i, name=(gpu.findtext("product_name") or "").strip() or None,
                            gen_max=_link_number(gen.findtext("max_link_gen")) if gen is not None else None,
                            gen=_link_number(gen.findtext("current_link_gen")) if gen is not None else None,
                            width_max=_link_number(width.findtext("max_link_width")) if width is not None else None,
                            width=_link_number(width.findtext("current_link_width")) if width is not None else None))

    def low(values):
        values = [v for v in values if v is not None]
        return min(values) if values else None

    return PcieLinks(gpus=gpus, pcie_gen_min=low(g.gen_max for g in gpus),
                     pcie_gen_current_min=low(g.gen for g in gpus), pcie_width_min=low(g.width_max for g in gpus))


# ------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """``python -m validation.launch.telemetry --out FILE --root PID [--interval S] [--node NAME]``: sample until
    the root process is gone, or SIGTERM/SIGINT (a Slurm node's sampler). Exit code 0, or 1 with one line on stderr
    when FILE cannot be written (the rows written before stay in it)."""
    parser = argparse.ArgumentParser(prog="python -m validation.launch.telemetry",
                                     description="Sample GPU and process-tree telemetry into a CSV file.")
    parser.add_argument("--out", required=True, type=Path, help="the CSV file to write")
    parser.add_argument("--root", required=True, type=int, help="pid whose process tree is sampled; ends with it")
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between samples (default 1)")
    parser.add_argument("--node", default=None, help="node name in the file (default: the host name)")
    parser.add_argument("--cores", type=float, default=None,
                        help="cores the launch uses on this node (default: all): what other processes may use of the "
                             "rest before the launch counts as contended")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    # the run's processes are the task's (--root); a job whose nodes share this machine marks the others' by its id
    job = ("SLURM_JOB_ID", os.environ["SLURM_JOB_ID"]) if os.environ.get("SLURM_JOB_ID") else None
    sampler = Sampler(args.out, args.root, args.interval, args.node, own_root=args.root, cores=args.cores, job=job)

    def stop(signum, frame):
        sampler._stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        sampler.run()
    except OSError as exc:  # the file cannot be created or written (a missing or read-only directory, a full disk)
        print(f"telemetry: cannot write {args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
