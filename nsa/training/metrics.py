"""Per-step measurements: memory, device peak FLOP/s and MFU; the torch profiler of train.profile_steps."""

from __future__ import annotations

import resource
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

# Dense (no sparsity) peak TFLOP/s per device: (name substring, bf16/fp16 tensor core, fp32 non-tensor).
# First match wins, so more specific names come first. Sources: NVIDIA data sheets.
DEVICE_PEAKS = (
    ("H100 PCIe", 756.0, 51.0),
    ("H100", 989.4, 66.9),
    ("H200", 989.4, 66.9),
    ("GH200", 989.4, 66.9),
    ("B200", 2250.0, 80.0),
    ("A100", 312.0, 19.5),
    ("L40S", 362.1, 91.6),
    ("L4", 121.0, 30.3),
    ("A10G", 70.0, 31.2),
    ("V100", 125.0, 15.7),
)

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
    for pattern, low_precision, fp32 in DEVICE_PEAKS:
        if pattern in name:
            return (low_precision if precision in ("bf16", "fp16") else fp32) * 1e12
    return None


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


def profiler(tc, device: torch.device, out: Path, rank: int):
    """The torch profiler for train.profile_steps steps after train.profile_start (None when profile_steps is 0):
    CPU activity, plus CUDA on a GPU; one Chrome trace per rank in out/profile/trace_rank{r}_step{n}.json."""
    if tc.profile_steps <= 0:
        return None

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    trace_dir = out / "profile"
    trace_dir.mkdir(parents=True, exist_ok=True)

    def ready(prof):
        prof.export_chrome_trace(str(trace_dir / f"trace_rank{rank}_step{prof.step_num}.json"))

    wait = max(0, tc.profile_start - 1)
    return profile(activities=activities, schedule=schedule(wait=wait, warmup=1, active=tc.profile_steps, repeat=1),
                   on_trace_ready=ready)
