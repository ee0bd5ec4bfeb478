"""Per-step measurements: memory, device peaks (FLOP/s for MFU; exp/s and HBM bytes/s for the roofline of
nsa.attention.cost_model) and MFU; the torch profiler of train.profile_steps."""

from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from nsa.attention.cost_model import Peaks

# Peaks per device: (name substring, dense bf16/fp16 tensor-core TFLOP/s, fp32 non-tensor TFLOP/s, HBM TB/s,
# exponentials T/s). First match wins, so more specific names come first (H100 PCIe before H100, GH200 before H200,
# the A100s by memory). TFLOP/s: NVIDIA data sheets, the DENSE figures (989.4 on an H100 SXM, never the 2:4
# sparse 1,979). HBM: data sheets (A100 40 GB 1.555, 80 GB SXM 2.039, 80 GB PCIe 1.935; H100 SXM 3.35, PCIe 2.0;
# H200 4.8; GH200 4.9, its 144 GB HBM3e part: the larger figure, so no efficiency is overstated). A name matches an
# entry that it holds not followed by a digit: an "NVIDIA L40" is not an L4 (whose 121 TFLOP/s would overstate its
# MFU 1.5x), an "NVIDIA RTX A1000" not an A100; such devices are unknown (train.peak_tflops). Exponentials:
# SMs x 16 MUFU ex2 a clock per SM x the clock the dense bf16 peak implies (bf16 TFLOP/s / (SMs x tensor FLOPs a
# clock per SM)): H100 SXM and H200 132 x 16 x 1.83 GHz = 3.86 T/s, H100 PCIe 114 x 16 x 1.62 GHz = 2.95 T/s,
# A100 108 x 16 x 1.41 GHz = 2.44 T/s. None: not known here (those devices' roofline says "peak unknown").
# The NVL parts (H100 NVL, H200 NVL: 132 SMs held to a lower clock by their power limit) have their own, lower
# peaks: 835.5 dense bf16 TFLOP/s (1,671 sparse), 60 fp32, HBM 3.9 (H100 NVL) and 4.8 TB/s (H200 NVL), exponentials
# 132 x 16 x 1.545 GHz = 3.26 T/s; read as an SXM part they would get 989.4 and understate their MFU by 16%.
DEVICE_PEAKS = (
    ("H100 PCIe", 756.0, 51.0, 2.0, 114 * 16 * 1.62e-3),
    ("H100 NVL", 835.5, 60.0, 3.9, 132 * 16 * 1.545e-3),
    ("H200 NVL", 835.5, 60.0, 4.8, 132 * 16 * 1.545e-3),
    ("H100", 989.4, 66.9, 3.35, 132 * 16 * 1.83e-3),
    ("GH200", 989.4, 66.9, 4.9, 132 * 16 * 1.83e-3),
    ("H200", 989.4, 66.9, 4.8, 132 * 16 * 1.83e-3),
    ("B200", 2250.0, 80.0, None, None),
    ("A100-SXM4-40GB", 312.0, 19.5, 1.555, 108 * 16 * 1.41e-3),
    ("A100-PCIE-40GB", 312.0, 19.5, 1.555, 108 * 16 * 1.41e-3),
    ("A100 80GB PCIe", 312.0, 19.5, 1.935, 108 * 16 * 1.41e-3),
    ("A100", 312.0, 19.5, 2.039, 108 * 16 * 1.41e-3),
    ("L40S", 362.1, 91.6, None, None),
    ("L4", 121.0, 30.3, None, None),
    ("A10G", 70.0, 31.2, None, None),
    ("V100", 125.0, 15.7, None, None),
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
    entry = _device_entry(name)
    if entry is None:
        return None
    return (entry[1] if precision in ("bf16", "fp16") else entry[2]) * 1e12


def _device_entry(name: str) -> tuple | None:
    """The DEVICE_PEAKS entry of a device name: the first whose model name the name holds, not followed by a digit
    (so "L4" is not an "NVIDIA L40", nor "A100" an "NVIDIA RTX A1000": another model, whose peak is not known here)."""
    return next((entry for entry in DEVICE_PEAKS if re.search(re.escape(entry[0]) + r"(?!\d)", name)), None)


def roofline_peaks(name: str, precision: str = "bf16") -> Peaks | None:
    """A device's roofline peaks by its name (torch.cuda.get_device_name): dense matmul FLOP/s at the precision
    (bf16/fp16: tensor cores; else fp32), exponentials/s and HBM bytes/s; None ("peak unknown") for a device not
    listed or listed without its bandwidth and exp throughput."""
    entry = _device_entry(name)
    if entry is None or entry[3] is None or entry[4] is None:
        return None
    flops = entry[1] if precision in ("bf16", "fp16") else entry[2]
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
