"""Per-step measurements: memory, device peaks (nsa.devices' table: FLOP/s for MFU; exp/s and HBM bytes/s for the
roofline of nsa.attention.cost_model) and MFU; the torch profiler of train.profile_steps."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from nsa.attention.cost_model import Peaks
from nsa.devices import BF16_UNSUPPORTED, device_entry as _device_entry

GB = 1024 ** 3


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return "cpu"


def peak_flops(device: torch.device, precision: str, override_tflops: float | None = None) -> float | None:
    """Peak FLOP/s of one device at this precision, or None when unknown (CPU, unlisted GPU)."""
    if override_tflops is not None:
        return override_tflops * 1e12
    if device.type != "cuda":
        return None
    name = device_name(device)
    entry = _device_entry(name)
    if entry is None or (precision == "bf16" and entry[0] in BF16_UNSUPPORTED):
        return None
    peak = entry[1] if precision in ("bf16", "fp16") else entry[2]
    return None if peak is None else peak * 1e12  # None: a listed part whose peak is not known (its link is)


def roofline_peaks(name: str, precision: str = "bf16") -> Peaks | None:
    """A device's roofline peaks by its name (torch.cuda.get_device_name): dense matmul FLOP/s at the precision
    (bf16/fp16: tensor cores; else fp32), exponentials/s and HBM bytes/s; None ("peak unknown") for a device not
    listed or listed without its bandwidth and exp throughput."""
    entry = _device_entry(name)
    if entry is None or entry[3] is None or entry[4] is None:
        return None
    flops = entry[1] if precision in ("bf16", "fp16") else entry[2]
    if flops is None or (precision == "bf16" and entry[0] in BF16_UNSUPPORTED):
        return None
    return Peaks(flops=flops * 1e12, exps=entry[4] * 1e12, bytes=entry[3] * 1e12)


def mfu(flops_per_token: float, tokens_per_s: float, world_size: int, peak: float | None) -> float | None:
    """Model FLOPs utilization: achieved FLOP/s over all devices' peak."""
    if peak is None or tokens_per_s <= 0:
        return None
    return flops_per_token * tokens_per_s / (peak * world_size)


def memory_gb(device: torch.device) -> tuple[float, float]:
    """(allocated, reserved) in GiB. CUDA: allocated now and peak reserved by the caching allocator.
    CPU: resident set size now and the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device) / GB, torch.cuda.max_memory_reserved(device) / GB
    now = _rss_bytes()
    return now / GB, max(now, _peak_rss_bytes()) / GB


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return _peak_rss_bytes()


def _peak_rss_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def memory_detail_gb(device: torch.device) -> dict[str, float | None]:
    """GiB for the Training Summary: allocated now, reserved now, peak allocated, peak reserved.
    CUDA: the caching allocator's figures. CPU: allocated = resident set size (now / the process's peak);
    reserved is None (there is no caching allocator to reserve anything)."""
    if device.type == "cuda":
        return {"alloc": torch.cuda.memory_allocated(device) / GB, "reserved": torch.cuda.memory_reserved(device) / GB,
                "peak_alloc": torch.cuda.max_memory_allocated(device) / GB,
                "peak_reserved": torch.cuda.max_memory_reserved(device) / GB}
    now = _rss_bytes()
    return {"alloc": now / GB, "reserved": None, "peak_alloc": max(now, _peak_rss_bytes()) / GB,
            "peak_reserved": None}


def profiler(tc, device: torch.device, out: Path, rank: int, first_step: int = 0):
    """The torch profiler for train.profile_steps steps after train.profile_start (None when profile_steps is 0):
    CPU activity, plus CUDA on a GPU; one Chrome trace per rank in out/profile/trace_rank{r}_step{n}.json, n the
    training step the trace ends at. first_step: the step this process continues from (a resume's checkpoint), so
    that a resumed run's trace is named by its own steps and never replaces the earlier process's trace."""
    if tc.profile_steps <= 0:
        return None

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    trace_dir = out / "profile"
    trace_dir.mkdir(parents=True, exist_ok=True)

    def ready(prof):
        prof.export_chrome_trace(str(trace_dir / f"trace_rank{rank}_step{first_step + prof.step_num}.json"))

    wait = max(0, tc.profile_start - 1)
    return profile(activities=activities, schedule=schedule(wait=wait, warmup=1, active=tc.profile_steps, repeat=1),
                   on_trace_ready=ready)
