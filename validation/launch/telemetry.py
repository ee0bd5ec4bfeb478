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
is empty); the CPU figures are the launch's process tree (the root and its descendants, /proc): CPU utilisation in
percent of one core (200 = two cores busy) and the sum of the processes' resident set sizes. Reading the file:
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
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from validation.contracts import TELEMETRY_COLUMNS as COLUMNS
from validation.launch.processes import descendants

INTERVAL_S = 1.0
LOW_GPU_UTIL_PCT = 80.0  # seed 003, "Low GPU Utilization": GPU utilization < 80%

# NVML clock throttle reason bits (nvmlClocksThrottleReason*); "gpu_idle" is not a slowdown.
THROTTLE_REASONS = {0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
                    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown",
                    0x80: "hw_power_brake_slowdown", 0x100: "display_clock_setting"}
NOT_THROTTLED = ("gpu_idle",)

_GIB = 1024 ** 3
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def throttle_names(mask: int) -> list[str]:
    """NVML throttle reason bits -> names (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_REASONS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_REASONS)
    return names + ([hex(rest)] if rest else [])


# ------------------------------------------------------------------------------------------- probes
class TreeProbe:
    """CPU utilisation and RSS of a process and its descendants, from /proc."""

    def __init__(self, root_pid: int, exclude: set[int] | None = None):
        self.root = int(root_pid)
        self.exclude = set(exclude or ())
        self._ticks: dict[tuple[int, int], int] = {}
        self._t = time.monotonic()
        self._primed = False
        self.last_pids: set[int] = set()

    def pids(self) -> list[int]:
        found = set(descendants(self.root)) | ({self.root} if os.path.exists(f"/proc/{self.root}") else set())
        return sorted(found - self.exclude)

    def alive(self) -> bool:
        try:
            with open(f"/proc/{self.root}/stat", "rb") as f:
                return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
        except (OSError, IndexError):
            return False

    def sample(self) -> dict[str, Any]:
        now = time.monotonic()
        ticks, rss_pages = {}, 0
        pids = self.pids()
        self.last_pids = set(pids)
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as f:
                    fields = f.read().rsplit(b")", 1)[1].split()
                with open(f"/proc/{pid}/statm", "rb") as f:
                    rss_pages += int(f.read().split()[1])
            except (OSError, IndexError, ValueError):
                continue
            ticks[(pid, int(fields[19]))] = int(fields[11]) + int(fields[12])  # utime + stime
        util = None
        if self._primed and now > self._t:  # the first sample has no period to measure over
            used = sum(t - self._ticks.get(key, 0) for key, t in ticks.items())  # a new process: all its ticks
            util = round(max(100.0 * used / _CLK_TCK / (now - self._t), 0.0), 1)
        self._ticks, self._t, self._primed = ticks, now, True
        return {"cpu_util_pct": util, "rss_gb": round(rss_pages * _PAGE / _GIB, 4), "procs": len(ticks)}


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


class GpuProbe:
    """Every GPU of the node through NVML (pynvml imported here, lazily). ``available`` is False without pynvml, a
    driver or a GPU; ``problem`` says why, except on a machine without the NVIDIA driver (``nvml_no_driver``): no
    GPU there is what the machine is, and ``note`` says so."""

    def __init__(self):
        self.available, self.problem, self.note, self.handles = False, None, None, []
        self.xid_count: dict[int, int] = {}
        self.xid_last: dict[int, int] = {}
        self._events = None
        pynvml = load_nvml()
        if pynvml is None:
            self.problem = "pynvml is not installed: no GPU telemetry"
            return
        self.nvml = pynvml
        try:
            pynvml.nvmlInit()
            self.handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
            if nvml_no_driver(pynvml, exc):
                self.note = NO_DRIVER_NOTE
            else:
                self.problem = f"NVML: {exc}"
            return
        self.available = bool(self.handles)
        if not self.handles:
            self.problem = "NVML sees no GPU"
            return
        try:  # Xid errors arrive as events
            self._events = pynvml.nvmlEventSetCreate()
            for h in self.handles:
                try:
                    pynvml.nvmlDeviceRegisterEvents(h, pynvml.nvmlEventTypeXidCriticalError, self._events)
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

    def sample(self, pids: set[int]) -> list[dict[str, Any]]:
        if not self.available:
            return []
        nv = self.nvml
        self._poll_xids()
        rows = []
        for index, h in enumerate(self.handles):
            util = self._call("nvmlDeviceGetUtilizationRates", h)
            mem = self._call("nvmlDeviceGetMemoryInfo", h)
            power = self._call("nvmlDeviceGetPowerUsage", h)
            mask = self._call("nvmlDeviceGetCurrentClocksThrottleReasons", h)
            if mask is None:
                mask = self._call("nvmlDeviceGetCurrentClocksEventReasons", h)
            procs = self._call("nvmlDeviceGetComputeRunningProcesses", h)
            ecc = [self._call("nvmlDeviceGetTotalEccErrors", h, kind, nv.NVML_VOLATILE_ECC)
                   for kind in (nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)]
            rows.append({
                "gpu": index,
                "ours": None if procs is None else int(any(p.pid in pids for p in procs)),
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
                "xid_errors": self.xid_count.get(index, 0) if self._events is not None else None,
                "xid_last": self.xid_last.get(index),
            })
        return rows

    def close(self) -> None:
        if self.available or self.handles:
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
                 gpus: bool = True):
        if not (isinstance(interval_s, (int, float)) and interval_s > 0):
            raise ValueError(f"telemetry interval must be > 0 s, got {interval_s!r}")
        self.path, self.interval_s = Path(path), float(interval_s)
        self.node = node or socket.gethostname()
        self.tree = TreeProbe(root_pid, exclude={os.getpid()})  # a node's sampler runs inside the tree it watches
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
        tree = self.tree.sample()
        pids = self.tree.last_pids
        gpu_rows = self.gpu.sample(pids) if self.gpu is not None else []
        cost = time.thread_time() - c0 + extra_cpu
        self.cpu_s += cost
        base = {"time": f"{now:.3f}", "elapsed_s": f"{now - t0:.3f}", "node": self.node, "sample": self.samples,
                **tree, "sampler_cpu_ms": f"{cost * 1000:.2f}"}
        for row in gpu_rows or [{}]:
            writer.writerow({k: ("" if v is None else v) for k, v in {**base, **row}.items()})
        self.samples += 1


# ------------------------------------------------------------------------------------------- metrics
def _stat(values: list[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"mean": round(sum(values) / len(values), 3), "min": min(values), "max": max(values), "n": len(values)}


def summarize(rows: list[dict[str, Any]], start: float | None = None, end: float | None = None,
              use_gpus: bool = True) -> dict[str, Any]:
    """Metrics for criteria from telemetry rows (validation.contracts.read_telemetry) between unix times `start` and
    `end` (None: open): {"gpu_util": {mean, min, max, n} (percent, over the launch's GPUs, every sample) or None
    without GPU figures, "gpu_mem_used_gb", "power_w", "sm_clock_mhz", "temp_c" (same shape or None), "throttled"
    (any throttle reason other than gpu_idle in any sample; None without GPU figures), "throttle_reasons" (those
    seen, sorted), "pcie_gen_min" / "pcie_width_min" (the lowest current link during the period) with their
    maxima, "ecc_uncorrected" (the largest count seen), "xid_errors" (events seen), "cpu_util" {mean, min, max, n}
    (percent of one core, per sample), "rss_gb" {mean, min, max, n} (per sample, all nodes summed), "samples",
    "nodes", "gpus" ("node:index" of the GPUs counted), "gpu_match"}. The launch's GPUs are those a process of the
    launch used (``ours``, gpu_match "by process"); when no GPU shows one of its processes (NVML unable to say, or
    a container whose PIDs NVML does not see), every GPU of the node (gpu_match "all GPUs"). `use_gpus` False (a CPU
    run on a GPU node) leaves the GPU figures out."""
    def within(r):
        t = r.get("time")
        return t is not None and (start is None or t >= start) and (end is None or t <= end)

    rows = [r for r in rows if within(r)]
    gpu_rows = [r for r in rows if r.get("gpu") is not None and use_gpus]
    matched = any(r.get("ours") == 1 for r in gpu_rows)
    if matched:
        gpu_rows = [r for r in gpu_rows if r.get("ours") == 1]

    def col(name, source=gpu_rows):
        return [float(r[name]) for r in source if isinstance(r.get(name), (int, float))]

    # CPU figures: one value per (node, sample); a multi-node job's nodes summed per sample number
    per_sample: dict[tuple, dict] = {}
    for r in rows:
        per_sample.setdefault((r.get("node"), r.get("sample")), r)
    by_number: dict[Any, dict[str, float]] = {}
    for (_, number), r in per_sample.items():
        acc = by_number.setdefault(number, {})
        for name in ("cpu_util_pct", "rss_gb"):
            if isinstance(r.get(name), (int, float)):
                acc[name] = acc.get(name, 0.0) + float(r[name])
    reasons = sorted({n for r in gpu_rows for n in str(r.get("throttle") or "").split("+") if n and n != "none"})
    throttled = (any(n not in NOT_THROTTLED for n in reasons)
                 if any(r.get("throttle") is not None for r in gpu_rows) else None)
    gens, widths = col("pcie_gen"), col("pcie_width")
    return {
        "samples": len(per_sample),
        "nodes": sorted({str(r.get("node")) for r in rows if r.get("node")}),
        "gpus": sorted({f"{r.get('node')}:{int(r['gpu'])}" for r in gpu_rows}),
        "gpu_match": ("by process" if matched else "all GPUs") if gpu_rows else None,
        "gpu_util": _stat(col("gpu_util_pct")),
        "gpu_mem_used_gb": _stat(col("mem_used_gb")),
        "gpu_mem_total_gb": max(col("mem_total_gb"), default=None),
        "power_w": _stat(col("power_w")),
        "sm_clock_mhz": _stat(col("sm_clock_mhz")),
        "temp_c": _stat(col("temp_c")),
        "throttled": throttled,
        "throttle_reasons": reasons,
        "pcie_gen_min": min(gens) if gens else None,
        "pcie_gen_max": max(col("pcie_gen_max"), default=None),
        "pcie_width_min": min(widths) if widths else None,
        "pcie_width_max": max(col("pcie_width_max"), default=None),
        "ecc_uncorrected": max(col("ecc_uncorrected"), default=None),
        "xid_errors": sum({(r.get("node"), r.get("gpu")): r["xid_errors"] for r in gpu_rows
                           if isinstance(r.get("xid_errors"), (int, float))}.values()) if gpu_rows else None,
        "cpu_util": _stat([v["cpu_util_pct"] for v in by_number.values() if "cpu_util_pct" in v]),
        "rss_gb": _stat([v["rss_gb"] for v in by_number.values() if "rss_gb" in v]),
    }


def diagnose(t: dict[str, Any], context: dict[str, Any] | None = None,
             threshold: float = LOW_GPU_UTIL_PCT) -> dict[str, Any] | None:
    """Seed 003's "Low GPU Utilization" applied to `t` (summarize()'s metrics over the training window) and the run's
    context (validation.contracts.run_context): None unless the mean GPU utilisation is below `threshold` percent.
    Otherwise {"gpu_util_mean", "threshold", "causes": [{"cause", "evidence"}] (the seed's causes the evidence
    points to, most likely first), "text"}:

    - batch too small: GPU memory used (max) below half of the GPU's memory -> room to raise the micro-batch;
    - data loading / host-bound: the launch's processes busy >= 90% of one core per GPU on average (the host,
      not the GPU, sets the pace);
    - host-device transfers: the PCIe link below its maximum generation or width during training.

    When no evidence points anywhere, all three are listed as the seed's candidates, unranked."""
    util = (t.get("gpu_util") or {}).get("mean")
    if not isinstance(util, (int, float)) or util >= threshold:
        return None
    context = context or {}
    causes = []
    mem, total = (t.get("gpu_mem_used_gb") or {}).get("max"), t.get("gpu_mem_total_gb")
    micro, seq = context.get("micro_batch"), context.get("seq_len")
    shape = f" (micro-batch {micro} x seq_len {seq})" if micro and seq else ""
    if isinstance(mem, (int, float)) and isinstance(total, (int, float)) and total > 0 and mem < 0.5 * total:
        causes.append({"cause": "batch too small",
                       "evidence": f"GPU memory used at most {mem:.1f} of {total:.1f} GiB{shape}: raise the "
                                   "batch size"})
    cpu, n_gpus = (t.get("cpu_util") or {}).get("mean"), max(len(t.get("gpus") or []), 1)
    if isinstance(cpu, (int, float)) and cpu >= 90.0 * n_gpus:
        causes.append({"cause": "data loading / host-bound",
                       "evidence": f"the launch's processes used {cpu:.0f}% CPU (>= 90% of a core per GPU): the "
                                   "host sets the pace (data loading, Python overhead); pin_memory, more loader "
                                   "workers, or profile the host side"})
    gen, gmax = t.get("pcie_gen_min"), t.get("pcie_gen_max")
    width, wmax = t.get("pcie_width_min"), t.get("pcie_width_max")
    if (isinstance(gen, (int, float)) and isinstance(gmax, (int, float)) and gen < gmax) or \
            (isinstance(width, (int, float)) and isinstance(wmax, (int, float)) and width < wmax):
        causes.append({"cause": "host-device transfers",
                       "evidence": f"PCIe link at Gen{gen:g} x{width:g} during training, the GPU and slot allow "
                                   f"Gen{gmax:g} x{wmax:g}" if None not in (gen, width, gmax, wmax)
                                   else "PCIe link below its maximum during training"})
    if not causes:
        causes = [{"cause": c, "evidence": "no telemetry singles it out"}
                  for c in ("batch too small", "data loading", "host-device transfers")]
    text = (f"Low GPU utilisation: {util:.0f}% on average over the training window (< {threshold:.0f}%, seed 003); "
            + "; ".join(f"{c['cause']}: {c['evidence']}" for c in causes))
    return {"gpu_util_mean": util, "threshold": threshold, "causes": causes, "text": text}


# ------------------------------------------------------------------------------------------- a snapshot's PCIe links
def _link_number(text: str | None) -> int | None:
    digits = "".join(c for c in (text or "") if c.isdigit())
    return int(digits) if digits else None


def pcie_links(nvidia_smi_xml: str) -> dict[str, Any]:
    """The PCIe links of every GPU in `nvidia-smi -q -x` output: {"gpus": [{"gpu", "name", "gen_max", "gen",
    "width_max", "width"}], "pcie_gen_min" (the lowest maximum link generation over the GPUs: what each link runs
    at under load), "pcie_gen_current_min" (the lowest current one: an idle GPU lowers its link to save power, so
    a snapshot's current generation may read low), "pcie_width_min" (the lowest maximum width)}; the figures None
    when the XML names no GPU or is unreadable."""
    gpus = []
    try:
        root = ET.fromstring(nvidia_smi_xml)
    except ET.ParseError:
        root = None
    for i, gpu in enumerate(root.findall("gpu") if root is not None else []):
        gen = gpu.find("pci/pci_gpu_link_info/pcie_gen")
        width = gpu.find("pci/pci_gpu_link_info/link_widths")
        gpus.append({"gpu": i, "name": (gpu.findtext("product_name") or "").strip() or None,
                     "gen_max": _link_number(gen.findtext("max_link_gen")) if gen is not None else None,
                     "gen": _link_number(gen.findtext("current_link_gen")) if gen is not None else None,
                     "width_max": _link_number(width.findtext("max_link_width")) if width is not None else None,
                     "width": _link_number(width.findtext("current_link_width")) if width is not None else None})

    def low(key):
        values = [g[key] for g in gpus if g[key] is not None]
        return min(values) if values else None

    return {"gpus": gpus, "pcie_gen_min": low("gen_max"), "pcie_gen_current_min": low("gen"),
            "pcie_width_min": low("width_max")}


# ------------------------------------------------------------------------------------------- command line
def main(argv: list[str] | None = None) -> int:
    """``python -m validation.launch.telemetry --out FILE --root PID [--interval S] [--node NAME]``: sample until
    the root process is gone, or SIGTERM/SIGINT (a Slurm node's sampler)."""
    parser = argparse.ArgumentParser(prog="python -m validation.launch.telemetry",
                                     description="Sample GPU and process-tree telemetry into a CSV file.")
    parser.add_argument("--out", required=True, type=Path, help="the CSV file to write")
    parser.add_argument("--root", required=True, type=int, help="pid whose process tree is sampled; ends with it")
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between samples (default 1)")
    parser.add_argument("--node", default=None, help="node name in the file (default: the host name)")
    args = parser.parse_args(argv)
    if args.interval <= 0:
        parser.error("--interval must be > 0")
    sampler = Sampler(args.out, args.root, args.interval, args.node)

    def stop(signum, frame):
        sampler._stop.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    sampler.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
