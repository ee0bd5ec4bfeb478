"""The GPU side of the telemetry (validation.launch.telemetry.GpuProbe, summarize, interference) against NVML's
documented API, through a stand-in pynvml: the clock event reason bits and which of them are a throttle, GPUs NVML
counts but may not open, Xid events a GPU does not support, the v2 process list of a driver without the v3 call,
process memory NVML does not know (NVML_VALUE_NOT_AVAILABLE), and the interference judgement on hand-built samples."""

from __future__ import annotations

import sys
import types

import pytest

from validation.launch import telemetry

GIB = 1024 ** 3
NOT_AVAILABLE = 2 ** 64 - 1  # NVML_VALUE_NOT_AVAILABLE as an unsigned long long


class NVMLError(Exception):
    pass


class NotSupported(NVMLError):
    def __str__(self):
        return "Not Supported"


class NoPermission(NVMLError):
    def __str__(self):
        return "Insufficient Permissions"


class FunctionNotFound(NVMLError):
    def __str__(self):
        return "Function Not Found"


def stand_in(gpus: list[dict]) -> types.ModuleType:
    """A pynvml with one GPU per dict of `gpus`, by NVML index: "denied" (nvmlDeviceGetHandleByIndex raises
    NO_PERMISSION), "procs" [(pid, usedGpuMemory)], "v2_only" (the unversioned process call is missing from the
    driver, as before R510), "mask" (clock event reasons), "no_events" (Xid registration NOT_SUPPORTED), "mig" (every
    figure NOT_SUPPORTED). Units as NVML gives them: power in mW, memory in bytes, clocks in MHz."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVML_VOLATILE_ECC, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 0, 1
    nv.NVML_CLOCK_SM, nv.NVML_TEMPERATURE_GPU, nv.nvmlEventTypeXidCriticalError = 1, 0, 8
    ns = types.SimpleNamespace
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: len(gpus)
    nv.registered = []

    def handle(i):
        if gpus[i].get("denied"):
            raise NoPermission()
        return i

    def gpu(h, what=None):
        if gpus[h].get("mig") and what != "procs":
            raise NotSupported()
        return gpus[h]

    def processes(h, versioned=False):
        g = gpu(h, "procs")
        if g.get("v2_only") and not versioned:
            raise FunctionNotFound()
        if g.get("mig") and not g.get("procs"):
            raise NotSupported()
        return [ns(pid=pid, usedGpuMemory=mem) for pid, mem in g.get("procs", [])]

    def register(h, kind, events):
        if gpus[h].get("no_events") or gpus[h].get("mig"):
            raise NotSupported()
        nv.registered.append(h)

    def wait(events, ms):
        raise NVMLError("Timeout")

    nv.nvmlDeviceGetHandleByIndex = handle
    nv.nvmlDeviceGetIndex = lambda h: h
    nv.nvmlEventSetCreate = lambda: "set"
    nv.nvmlEventSetFree = lambda s: None
    nv.nvmlDeviceRegisterEvents = register
    nv.nvmlEventSetWait_v2 = wait
    nv.nvmlDeviceGetUtilizationRates = lambda h: ns(gpu=gpu(h).get("util", 97), memory=40)
    nv.nvmlDeviceGetMemoryInfo = lambda h: ns(used=gpu(h).get("used", 60 * GIB), total=80 * GIB,
                                              free=80 * GIB - gpu(h).get("used", 60 * GIB))
    nv.nvmlDeviceGetPowerUsage = lambda h: gpu(h).get("power_mw", 612_345)
    nv.nvmlDeviceGetCurrentClocksEventReasons = lambda h: gpu(h).get("mask", 0)
    nv.nvmlDeviceGetComputeRunningProcesses = processes
    nv.nvmlDeviceGetComputeRunningProcesses_v2 = lambda h: processes(h, versioned=True)
    nv.nvmlDeviceGetClockInfo = lambda h, clock: gpu(h) and 1980
    nv.nvmlDeviceGetTemperature = lambda h, sensor: gpu(h) and 71
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: gpu(h) and 5
    nv.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: gpu(h) and 5
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: gpu(h) and 16
    nv.nvmlDeviceGetMaxPcieLinkWidth = lambda h: gpu(h) and 16
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: gpu(h) and 0
    return nv


def probe_rows(monkeypatch, gpus: list[dict], pids=frozenset({100}), node: str = "n") -> list[dict]:
    """Two samples of a GpuProbe over the stand-in, as summarize and interference read them."""
    monkeypatch.setitem(sys.modules, "pynvml", stand_in(gpus))
    probe = telemetry.GpuProbe()
    rows = []
    for i in range(2):
        for row in probe.sample(set(pids)):
            rows.append({**row, "time": 1000.0 + i, "node": node, "sample": i})
    probe.close()
    return rows


def test_units_as_nvml_gives_them(monkeypatch):
    # by hand: 612,345 mW = 612.3 W; 60 GiB of 80 in bytes; MHz and degrees as they are
    row = probe_rows(monkeypatch, [{"procs": [(100, 59 * GIB)]}])[0]
    assert (row["power_w"], row["mem_used_gb"], row["mem_total_gb"]) == (612.3, 60.0, 80.0)
    assert (row["sm_clock_mhz"], row["temp_c"], row["gpu_util_pct"], row["ours"]) == (1980, 71, 97, 1)


# the bits of NVML's documentation (group nvmlClocksEventReasons), one by one
NVML_BITS = [(0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"), (0x8, "hw_slowdown"),
             (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"), (0x40, "hw_thermal_slowdown"),
             (0x80, "hw_power_brake_slowdown"), (0x100, "display_clock_setting"), (0x200, "board_limit"),
             (0x400, "reliability")]


def test_clock_event_reason_bits_are_nvmls():
    for bit, name in NVML_BITS:
        assert telemetry.throttle_names(bit) == [name]
    assert telemetry.throttle_names(0x800 | 0x8) == ["hw_slowdown", "0x800"] and telemetry.throttle_names(0) == []


def test_an_idle_gpu_and_application_clocks_are_not_a_throttle_a_power_cap_is(monkeypatch):
    # the masks as NVML reports them, through the probe: an idle GPU at the application clocks its owner set
    # (nvidia-smi -ac) is not throttled; a power cap or a thermal slowdown is
    for mask, throttled in [(0x1 | 0x2, False), (0x2, False), (0x0, False), (0x4, True), (0x2 | 0x40, True)]:
        rows = probe_rows(monkeypatch, [{"procs": [(100, GIB)], "mask": mask}])
        m = telemetry.summarize(rows)
        assert m.throttled is throttled, (hex(mask), m.throttle_reasons)
    assert m.throttle_reasons == ["applications_clocks_setting", "hw_thermal_slowdown"]


def test_a_gpu_nvml_counts_but_may_not_open_is_left_out_and_the_others_keep_their_nvml_index(monkeypatch):
    # a Slurm job's cgroup: NVML counts 3 GPUs, opens only its own (NVML indices 1 and 2; CUDA would number them 0
    # and 1); the launch runs on NVML index 2, another job's process on index 1
    gpus = [{"denied": True}, {"procs": [(555, 4 * GIB)]}, {"procs": [(100, 30 * GIB)]}]
    rows = probe_rows(monkeypatch, gpus)
    assert [(r["gpu"], r["ours"], r["other_gpu_procs"]) for r in rows[:2]] == [(1, 0, 1), (2, 1, 0)]
    m = telemetry.summarize(rows)
    assert m.gpus == ["n:2"] and m.gpu_match == "by process" and m.gpu_util.mean == 97
    # none it may open: a problem naming why, no rows
    monkeypatch.setitem(sys.modules, "pynvml", stand_in([{"denied": True}]))
    probe = telemetry.GpuProbe()
    assert not probe.available and probe.sample({100}) == []
    assert probe.problem == "NVML: GPU 0: Insufficient Permissions"


def test_a_gpu_whose_events_nvml_does_not_support_has_no_xid_count_not_zero(monkeypatch):
    # GPU 0 has its Xid events watched; GPU 1 (a consumer GPU: NVML_ERROR_NOT_SUPPORTED) and GPU 2 (MIG: every
    # figure NOT_SUPPORTED, processes listed) do not
    gpus = [{"procs": [(100, GIB)]}, {"procs": [(101, GIB)], "no_events": True},
            {"procs": [(102, NOT_AVAILABLE)], "mig": True}]
    rows = probe_rows(monkeypatch, gpus, pids={100, 101, 102})
    assert [r["xid_errors"] for r in rows[:3]] == [0, None, None]
    mig = rows[2]
    assert all(mig[k] is None for k in ("gpu_util_pct", "mem_used_gb", "power_w", "throttle", "temp_c",
                                        "ecc_uncorrected")) and mig["ours"] == 1
    # a launch on GPUs 0 and 1: its Xid count is not known; on GPU 0 alone: 0
    assert telemetry.summarize(rows).xid_errors is None
    assert telemetry.summarize([r for r in rows if r["gpu"] == 0]).xid_errors == 0
    assert telemetry.summarize([r for r in rows if r["gpu"] == 2]).throttled is None


def test_summarized_xid_count_of_unwatched_gpus_is_unknown():
    def row(i, gpu, xid):
        return {"time": 1000.0 + i, "node": "n", "sample": i, "gpu": gpu, "ours": 1, "xid_errors": xid}

    # by hand: GPU 0 saw 1 then 2 events (a count since the sampler started: 2), GPU 1 one event: 3
    assert telemetry.summarize([row(0, 0, 1), row(0, 1, 1), row(1, 0, 2), row(1, 1, 1)]).xid_errors == 3
    # neither GPU watched: not known (it read 0, "no Xid error")
    assert telemetry.summarize([row(0, 0, None), row(1, 0, None)]).xid_errors is None
    # one of the two watched: not known either
    assert telemetry.summarize([row(0, 0, 0), row(0, 1, None), row(1, 0, 0), row(1, 1, None)]).xid_errors is None


def test_a_driver_without_the_v3_process_list_is_read_through_v2(monkeypatch):
    gpus = [{"procs": [(100, 30 * GIB), (777, 2 * GIB)], "v2_only": True}]
    rows = probe_rows(monkeypatch, gpus)
    assert (rows[0]["ours"], rows[0]["other_gpu_procs"], rows[0]["other_gpu_mem_gb"]) == (1, 1, 2.0)


@pytest.mark.parametrize("memory, want", [([3 * GIB, GIB], 4.0), ([None], None), ([NOT_AVAILABLE], None),
                                          ([GIB, NOT_AVAILABLE], None), ([], 0.0)],
                         ids=["known", "none", "not-available", "one-unknown", "no-others"])
def test_other_processes_memory_nvml_does_not_know_is_unknown_not_a_figure(monkeypatch, memory, want):
    procs = [(100, 20 * GIB)] + [(900 + i, m) for i, m in enumerate(memory)]
    row = probe_rows(monkeypatch, [{"procs": procs}])[0]
    assert row["other_gpu_procs"] == len(memory) and row["other_gpu_mem_gb"] == want


def samples(n: int, gpu: dict, at: dict[int, dict] | None = None) -> list[dict]:
    """`n` samples a second apart, the CPU quiet, one GPU row each: `gpu`, with `at` {sample: changes}."""
    out = []
    for i in range(n):
        out.append({"time": 1000.0 + i, "node": "n", "sample": i, "ncpu": 8, "step_cores": 8,
                    "host_cpu_pct": 100.0, "other_cpu_pct": None if i == 0 else 0.0,
                    "steal_pct": None if i == 0 else 0.0, **gpu, **(at or {}).get(i, {})})
    return out


def test_interference_from_gpu_samples_by_hand():
    ours = {"gpu": 0, "ours": 1, "other_gpu_procs": 0, "other_gpu_mem_gb": 0.0, "throttle": "none"}
    # 11 samples: 10 periods. Another process on our GPU in periods 3 and 4 (2 of 10: 20%, the disturbed share)
    crowded = samples(11, ours, {3: {"other_gpu_procs": 2, "other_gpu_mem_gb": 6.5},
                                 4: {"other_gpu_procs": 1, "other_gpu_mem_gb": 1.0}})
    got = telemetry.interference(crowded)
    assert (got.samples, got.contended, got.share, got.disturbed) == (10, 2, 0.2, True)
    assert got.causes["gpu"].procs == 2 and got.causes["gpu"].mem_gb == 6.5
    assert "2 other process(es) computed on the launch's GPU(s), using up to 6.5 GiB, in 2 of 10 samples" in got.text
    # the same process, its memory unknown to NVML: said so, not "0.0 GiB"
    blind = telemetry.interference(samples(11, ours, {3: {"other_gpu_procs": 1, "other_gpu_mem_gb": None}}))
    assert blind.causes["gpu"].mem_gb is None and "GiB" not in blind.text
    assert "1 other process(es) computed on the launch's GPU(s), their GPU memory unknown to NVML" in blind.text
    # a throttle: the hardware slowdown in period 7 only counts where the measured period (6.5, 8.0] covers it
    hot = samples(11, ours, {7: {"throttle": "sw_power_cap+hw_slowdown"}})
    window = telemetry.interference(hot, start=1006.5, end=1008.0)
    assert (window.samples, window.contended, window.causes["throttle"].reasons) == (2, 1, ["hw_slowdown"])
    assert "throttle" not in telemetry.interference(hot, start=1008.0).causes
    # clocks at the application setting, idle, power-capped, sync boost: settings, not interference
    calm = samples(11, {**ours, "throttle": "gpu_idle+applications_clocks_setting+sw_power_cap+sync_boost"})
    assert telemetry.interference(calm).contended == 0
    # the throttle of a GPU the launch does not use decides nothing
    other_gpu = [dict(r, gpu=1, ours=0, throttle="hw_thermal_slowdown") for r in samples(11, ours)]
    assert telemetry.interference(samples(11, ours) + other_gpu).contended == 0
