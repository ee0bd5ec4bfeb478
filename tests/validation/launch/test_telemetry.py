"""Device telemetry beside a launch (validation.launch.telemetry): the sampler's CPU columns and interval, that it
ends with the launch and leaves no process, the per-node sampler of a Slurm job's script (run here with bash, no
cluster needed), the GPU columns through a stand-in NVML, the reader (validation.contracts.read_telemetry), the
metrics for criteria, the low-utilisation diagnosis and a snapshot's PCIe links."""

from __future__ import annotations

import csv
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import pytest
from process_checks import assert_no_orphans

from validation import contracts
from validation.launch import telemetry
from validation.launch.attempt import launch
from validation.launch.spec import LaunchSpec
from validation.launch.slurm import SlurmOptions, batch_script

REPO = Path(__file__).resolve().parents[3]
BUSY = "import time\nt = time.time()\nwhile time.time() - t < {s}: pass\n"


def _rows(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_sampler_records_cpu_and_rss_of_the_tree_every_interval_and_ends_with_its_root(tmp_path):
    # the root starts a busy child: the tree's CPU is the child's, found by parent pid; the child reports its own
    # CPU time, the independent reference for the sampled utilisation (whatever the machine's load)
    busy = BUSY.format(s=1.6) + f"open({str(tmp_path / 'cpu.txt')!r}, 'w').write(str(time.process_time()))\n"
    code = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {busy!r}])\n"
    proc = subprocess.Popen([sys.executable, "-c", code])
    sampler = telemetry.Sampler(tmp_path / "telemetry.csv", proc.pid, interval_s=0.25, node="n0").start()
    proc.wait()
    sampler._thread.join(5)  # ends by itself once its root is gone, without stop()
    assert not sampler._thread.is_alive() and sampler.error is None
    rows = _rows(tmp_path / "telemetry.csv")
    assert list(rows[0]) == list(telemetry.COLUMNS)
    assert 4 <= len(rows) <= 12, len(rows)
    times = [float(r["time"]) for r in rows]
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    assert 0.2 <= gaps[len(gaps) // 2] <= 0.6  # the interval, not faster, not much slower
    assert rows[0]["cpu_util_pct"] == ""  # the first sample has no period to measure over
    # CPU seconds = the integral of the utilisation over the sample periods, against the child's own figure (the
    # part after the last sample is lost: at most one interval)
    sampled = sum(float(b["cpu_util_pct"]) / 100 * (float(b["time"]) - float(a["time"]))
                  for a, b in zip(rows, rows[1:]) if b["cpu_util_pct"])
    own = float((tmp_path / "cpu.txt").read_text())
    assert 0.5 * own <= sampled <= 1.3 * own + 0.1, (sampled, own)
    assert max(int(r["procs"]) for r in rows) == 2
    assert all(r["gpu"] == "" and r["gpu_util_pct"] == "" for r in rows)  # no GPU here: GPU columns empty
    assert all(float(r["rss_gb"]) > 0 for r in rows[:-1]) and {r["node"] for r in rows} == {"n0"}
    assert all(float(r["sampler_cpu_ms"]) >= 0 for r in rows)


def test_children_shorter_than_the_interval_count_in_the_trees_cpu(tmp_path):
    # the root runs short busy children one after another, each gone well within a sampling interval (a compiler, a
    # test file's process); the root's own and its reaped children's CPU time (getrusage) is the reference for the
    # CPU the tree used, which the sampled utilisation must add up to (it read a fifth of it when only the processes
    # alive at a sample counted). The root outlives its last child by two intervals: a sample sees it reaped.
    short = BUSY.format(s=0.06)
    code = ("import resource, subprocess, sys, time\n"
            f"for _ in range(6): subprocess.run([sys.executable, '-S', '-c', {short!r}])\n"
            "used = sum(getattr(resource.getrusage(who), f) for who in (resource.RUSAGE_SELF, "
            "resource.RUSAGE_CHILDREN) for f in ('ru_utime', 'ru_stime'))\n"
            f"open({str(tmp_path / 'cpu.txt')!r}, 'w').write(str(used))\n"
            "time.sleep(0.7)\n")
    proc = subprocess.Popen([sys.executable, "-S", "-c", code])
    sampler = telemetry.Sampler(tmp_path / "telemetry.csv", proc.pid, interval_s=0.3, node="n0").start()
    proc.wait()
    sampler._thread.join(5)
    assert not sampler._thread.is_alive() and sampler.error is None
    rows = _rows(tmp_path / "telemetry.csv")
    sampled = sum(float(b["cpu_util_pct"]) / 100 * (float(b["time"]) - float(a["time"]))
                  for a, b in zip(rows, rows[1:]) if b["cpu_util_pct"])
    own = float((tmp_path / "cpu.txt").read_text())
    assert 0.8 * own - 0.05 <= sampled <= 1.2 * own + 0.05, (sampled, own)


def test_a_launch_with_telemetry_writes_it_and_leaves_no_thread_or_process(tmp_path):
    code = (f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {BUSY.format(s=30)!r}])\n"
            "import time; time.sleep(1.2)\n")  # leaves its busy child behind: the launch ends it
    spec = LaunchSpec(argv=[sys.executable, "-c", code, str(tmp_path)], env=dict(os.environ), cwd=tmp_path,
                      step_dir=tmp_path / "step", telemetry_s=0.3, timeout_s=60, term_grace_s=2)
    result = launch(spec)
    assert result.status == "ok", result.reason
    assert not [t for t in threading.enumerate() if t.name == "nsav-telemetry"]
    assert_no_orphans(cmdline_contains=str(tmp_path))
    rows = contracts.read_telemetry(tmp_path / "step")
    assert len(rows) >= 3 and max(r["procs"] for r in rows) == 2
    # a second launch in the same step directory sets the first file aside; the reader reads the new one only
    again = launch(spec)
    assert again.status == "ok"
    assert (tmp_path / "step" / "telemetry.prev1.csv").is_file()
    assert contracts.telemetry_files(tmp_path / "step") == [tmp_path / "step" / "telemetry.csv"]


def test_launches_without_telemetry_write_none(tmp_path):
    spec = LaunchSpec(argv=[sys.executable, "-c", "pass"], env=dict(os.environ), step_dir=tmp_path, timeout_s=30)
    assert launch(spec).status == "ok"
    assert not (tmp_path / "telemetry.csv").exists()
    with pytest.raises(ValueError, match="telemetry_s"):
        launch(LaunchSpec(argv=["true"], env={}, step_dir=tmp_path, telemetry_s=0))


def _task_program(script: str) -> str:
    line = next(l for l in script.splitlines() if l.startswith("srun --kill-on-bad-exit"))
    words = shlex.split(line.rstrip("\\"))
    return words[words.index("-c") + 1]


def test_slurm_script_runs_one_sampler_per_node_that_ends_with_the_node_task(tmp_path):
    script = batch_script(job_name="t", nnodes=2, nproc_per_node=1, argv=[sys.executable, "-m", "nsa.training"],
                          env={}, cwd=REPO, log_path=tmp_path / "stdout.log", ranks_dir=tmp_path / "ranks",
                          options=SlurmOptions(), python=sys.executable, telemetry_s=0.25, telemetry_dir=tmp_path)
    assert "-m validation.launch.telemetry" in script and "telemetry-$SLURMD_NODENAME.csv" in script
    assert f"NSAV_TELEMETRY_DIR={tmp_path}" in script
    plain = batch_script(job_name="t", nnodes=2, nproc_per_node=1, argv=[sys.executable, "-m", "nsa.training"],
                         env={}, cwd=REPO, log_path=tmp_path / "l", ranks_dir=tmp_path / "r", options=SlurmOptions(),
                         python=sys.executable)
    assert "validation.launch.telemetry" not in plain
    # what one node's task runs, here with bash: the sampler beside the command, ended after it, its exit code kept
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLURMD_NODENAME": "nodeA", "NSAV_HEAD_NODE": "nodeA",
           "NSAV_RANKS_DIR": str(tmp_path / "ranks"), "NSAV_TELEMETRY_DIR": str(tmp_path),
           "NSAV_PYTHON": sys.executable}
    proc = subprocess.run(["bash", "-c", _task_program(script), "nsav-task", sys.executable, "-c",
                           BUSY.format(s=1.0) + "raise SystemExit(3)", str(tmp_path)],
                          env=env, cwd=REPO, timeout=60)
    assert proc.returncode == 3
    assert_no_orphans(cmdline_contains=str(tmp_path))
    rows = contracts.read_telemetry(tmp_path)
    assert rows and {r["node"] for r in rows} == {"nodeA"}
    assert contracts.telemetry_files(tmp_path) == [tmp_path / "telemetry-nodeA.csv"]
    assert max(r["cpu_util_pct"] or 0 for r in rows) > 5  # the busy command is in the sampled tree


def test_node_sampler_command_ends_on_sigterm(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        proc = subprocess.Popen([sys.executable, "-m", "validation.launch.telemetry", "--out",
                                 str(tmp_path / "t.csv"), "--root", str(sleeper.pid), "--interval", "0.2"],
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(_rows(tmp_path / "t.csv") if (tmp_path / "t.csv").exists()
                                                     else []) < 2:
            time.sleep(0.1)
        proc.terminate()
        assert proc.wait(10) == 0
    finally:
        sleeper.kill()
        sleeper.wait()
    assert len(_rows(tmp_path / "t.csv")) >= 2


def test_node_sampler_command_that_cannot_write_its_file_says_so_in_one_line(tmp_path, capsys):
    (tmp_path / "a-file").write_text("")
    out = tmp_path / "a-file" / "telemetry.csv"  # its directory is a file: not even root can create it
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}  # main() sets its own
    try:
        assert telemetry.main(["--out", str(out), "--root", str(os.getpid()), "--interval", "0.05"]) == 1
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    err = capsys.readouterr().err
    assert err.startswith(f"telemetry: cannot write {out}: ") and len(err.strip().splitlines()) == 1


# ------------------------------------------------------------------------------------------------ GPU columns
class _Err(Exception):
    pass


def fake_nvml(pid_on_gpu0: int) -> types.ModuleType:
    """A stand-in pynvml: two GPUs; GPU 0 runs `pid_on_gpu0`, power-capped, on a Gen3 x8 link of a Gen4 x16 slot;
    GPU 1 is idle; one Xid 79 pending on GPU 0."""
    nv = types.ModuleType("pynvml")
    nv.NVML_VOLATILE_ECC, nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 0, 1
    nv.NVML_CLOCK_SM, nv.NVML_TEMPERATURE_GPU, nv.nvmlEventTypeXidCriticalError = 1, 0, 8
    ns = types.SimpleNamespace
    events = [ns(device=0, eventData=79)]
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 2
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetIndex = lambda h: h
    nv.nvmlEventSetCreate = lambda: "set"
    nv.nvmlEventSetFree = lambda s: None
    nv.nvmlDeviceRegisterEvents = lambda h, kind, s: None

    def wait(s, ms):
        if not events:
            raise _Err("timeout")
        return events.pop()

    nv.nvmlEventSetWait_v2 = wait
    nv.nvmlDeviceGetUtilizationRates = lambda h: ns(gpu=[45, 0][h], memory=10)
    nv.nvmlDeviceGetMemoryInfo = lambda h: ns(used=[8, 0.5][h] * 1024 ** 3, total=80 * 1024 ** 3)
    nv.nvmlDeviceGetPowerUsage = lambda h: [250_000, 60_000][h]
    nv.nvmlDeviceGetCurrentClocksThrottleReasons = lambda h: [0x4, 0x1][h]
    nv.nvmlDeviceGetComputeRunningProcesses = lambda h: [ns(pid=pid_on_gpu0)] if h == 0 else []
    nv.nvmlDeviceGetClockInfo = lambda h, clock: 1410

    def temperature(h, sensor):
        raise _Err("not supported")  # a figure the driver does not report stays empty

    nv.nvmlDeviceGetTemperature = temperature
    nv.nvmlDeviceGetCurrPcieLinkGeneration = lambda h: 3
    nv.nvmlDeviceGetMaxPcieLinkGeneration = lambda h: 4
    nv.nvmlDeviceGetCurrPcieLinkWidth = lambda h: 8
    nv.nvmlDeviceGetMaxPcieLinkWidth = lambda h: 16
    nv.nvmlDeviceGetTotalEccErrors = lambda h, kind, counter: [2, 0][kind]
    return nv


def test_gpu_columns_through_nvml_and_the_metrics_for_criteria(tmp_path, monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", BUSY.format(s=0.8)])
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(child.pid))
    sampler = telemetry.Sampler(tmp_path / "telemetry.csv", child.pid, interval_s=0.2, node="g").start()
    child.wait()
    sampler.stop()
    rows = contracts.read_telemetry(tmp_path)
    gpu0 = [r for r in rows if r["gpu"] == 0]
    assert len(rows) == 2 * len(gpu0) >= 4  # one row per GPU and sample
    r = gpu0[0]
    assert (r["ours"], r["gpu_util_pct"], r["mem_used_gb"], r["power_w"], r["sm_clock_mhz"]) == (1, 45, 8.0, 250.0,
                                                                                                    1410)
    assert r["temp_c"] is None and r["throttle"] == "sw_power_cap"
    assert (r["pcie_gen"], r["pcie_gen_max"], r["pcie_width"], r["pcie_width_max"]) == (3, 4, 8, 16)
    assert (r["ecc_corrected"], r["ecc_uncorrected"], r["xid_errors"], r["xid_last"]) == (2, 0, 1, 79)
    assert {x["throttle"] for x in rows if x["gpu"] == 1} == {"gpu_idle"} and {x["ours"] for x in rows
                                                                                if x["gpu"] == 1} == {0}
    m = telemetry.summarize(rows)
    # only the GPU the launch used counts: the idle one would halve the utilisation
    assert m.gpus == ["g:0"] and m.gpu_util.mean == 45 and m.throttled is True
    assert m.throttle_reasons == ["sw_power_cap"] and m.pcie_gen_min == 3 and m.xid_errors == 1
    assert m.cpu_util.n == len(gpu0) - 1  # one CPU figure per sample, not per GPU row


NVML_ERRORS = {"NVMLError_LibraryNotFound": "NVML Shared Library Not Found",
               "NVMLError_DriverNotLoaded": "Driver Not Loaded", "NVMLError_NoPermission": "Insufficient Permissions"}


def failing_nvml(error: str) -> types.ModuleType:
    """A stand-in pynvml whose nvmlInit raises `error`, one of the real module's NVMLError subclasses (by name)."""
    nv = types.ModuleType("pynvml")
    nv.NVMLError = type("NVMLError", (Exception,), {})
    for name, message in NVML_ERRORS.items():
        setattr(nv, name, type(name, (nv.NVMLError,), {"__str__": lambda self, m=message: m}))

    def init():
        raise getattr(nv, error)()

    nv.nvmlInit, nv.nvmlShutdown = init, lambda: None
    return nv


@pytest.mark.parametrize("error, driver, problem", [
    ("NVMLError_LibraryNotFound", False, None),  # a CPU machine (CI) with the gpu extra installed
    ("NVMLError_DriverNotLoaded", False, None),
    ("NVMLError_LibraryNotFound", True, "NVML Shared Library Not Found"),  # a driver, no libnvidia-ml
    ("NVMLError_NoPermission", False, "Insufficient Permissions"),
], ids=["no-library", "no-driver", "driver-without-library", "other-error"])
def test_nvml_without_an_nvidia_driver_is_no_gpu_not_a_problem(error, driver, problem, tmp_path, monkeypatch):
    from validation.launch import environment

    monkeypatch.setitem(sys.modules, "pynvml", failing_nvml(error))
    monkeypatch.setattr(telemetry, "NVIDIA_DRIVER", tmp_path / "version")
    if driver:
        (tmp_path / "version").write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04\n")
    probe = telemetry.GpuProbe()
    assert not probe.available and probe.sample(set()) == [] and probe.problem == (problem and f"NVML: {problem}")
    assert probe.note == (None if problem else "no NVIDIA driver: no GPU telemetry")
    # the snapshot step's NVML inventory: no GPU, or the problem in its list (the report's "Open problems")
    monkeypatch.setattr(environment, "probe", lambda cwd=None: {"git_sha": None, "gpu_count": 0, "gpus": []})
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)  # no nvidia-smi (nor git)
    monkeypatch.setattr(environment.subprocess, "run",
                        lambda argv, **kw: subprocess.CompletedProcess(argv, 0, "collect_env\n", ""))
    monkeypatch.setattr(environment.importlib.util, "find_spec", lambda name: object())  # pynvml installed
    env, _, problems = environment.snapshot(tmp_path / "snapshot", tmp_path)
    assert problems == ["nvidia-smi not found: no GPU inventory XML"] + ([f"pynvml: {problem}"] if problem else [])
    assert env.get("nvml") == (None if problem else [])


# ------------------------------------------------------------------------------------------------ reader, metrics
def _write(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(telemetry.COLUMNS))
        w.writeheader()
        for row in rows:
            w.writerow({k: row.get(k, "") for k in telemetry.COLUMNS})


def gpu_rows(util: list[float], *, t0: float = 1000.0, mem: float = 10.0, cpu: float = 50.0, gen: int = 4,
             throttle: str = "none") -> list[dict]:
    return [{"time": t0 + i, "elapsed_s": i, "node": "n", "sample": i, "gpu": 0, "ours": 1, "gpu_util_pct": u,
             "mem_used_gb": mem, "mem_total_gb": 80, "power_w": 300, "throttle": throttle, "pcie_gen": gen,
             "pcie_gen_max": 4, "pcie_width": 16, "pcie_width_max": 16, "cpu_util_pct": cpu, "rss_gb": 3.0,
             "procs": 3} for i, u in enumerate(util)]


def test_reader_skips_a_cut_off_row_and_set_aside_files(tmp_path):
    _write(tmp_path / "telemetry.csv", gpu_rows([90, 91, 92]))
    with open(tmp_path / "telemetry.csv", "a") as f:
        f.write("1003.0,3,n,3,0,1,9")  # a killed writer's last line
    _write(tmp_path / "telemetry.prev1.csv", gpu_rows([1]))
    rows = contracts.read_telemetry(tmp_path)
    assert [r["gpu_util_pct"] for r in rows] == [90, 91, 92]
    assert rows[0]["throttle"] == "none" and rows[0]["node"] == "n" and isinstance(rows[0]["time"], float)
    assert contracts.read_telemetry(tmp_path / "nowhere") == [] and contracts.read_telemetry(None) == []


def test_summarize_window_throttle_rule_and_multi_node_sums():
    rows = gpu_rows([10, 10, 95, 95, 95, 10], throttle="gpu_idle")
    m = telemetry.summarize(rows, start=1002.0, end=1004.0)  # the training window only
    assert m.gpu_util == telemetry.Gauge(mean=95, min=95, max=95, n=3) and m.throttled is False
    rows[3]["throttle"] = "hw_slowdown+sw_thermal_slowdown"
    assert telemetry.summarize(rows, 1002.0, 1004.0).throttled is True
    assert telemetry.summarize(rows, 1005.0, None).throttled is False  # outside the window
    other = [{**r, "node": "m"} for r in gpu_rows([50] * 6, cpu=20)]
    both = telemetry.summarize(gpu_rows([50] * 6, cpu=30) + other)
    assert both.cpu_util.mean == 50 and both.rss_gb.max == 6.0  # the nodes summed per sample
    assert both.gpus == ["m:0", "n:0"]
    # no GPU shows a process of the launch (a container NVML cannot match): every GPU counts, and it says so
    unmatched = telemetry.summarize([{**r, "ours": 0} for r in gpu_rows([50] * 3)])
    assert unmatched.gpu_util.mean == 50 and unmatched.gpu_match == "all GPUs"
    assert telemetry.summarize(gpu_rows([50] * 3)).gpu_match == "by process"
    cpu_run = telemetry.summarize(gpu_rows([0] * 3), use_gpus=False)  # a CPU run on a GPU node
    assert cpu_run.gpu_util is None and cpu_run.cpu_util.mean == 50
    cpu_only = telemetry.summarize([{"time": 1.0, "node": "n", "sample": 0, "gpu": None, "cpu_util_pct": 100.0,
                                     "rss_gb": 1.0}])
    assert cpu_only.gpu_util is None and cpu_only.throttled is None and cpu_only.pcie_gen_min is None


def test_low_gpu_utilisation_is_diagnosed_with_its_evidence():
    assert telemetry.diagnose(telemetry.summarize(gpu_rows([90] * 5))) is None
    small = telemetry.diagnose(telemetry.summarize(gpu_rows([40] * 5, mem=6.0)), {"micro_batch": 1, "seq_len": 512})
    assert small.causes[0].cause == "batch too small" and "6.0 of 80.0 GiB" in small.text
    assert "micro-batch 1 x seq_len 512" in small.text and len(small.causes) == 1
    host = telemetry.diagnose(telemetry.summarize(gpu_rows([40] * 5, mem=60.0, cpu=99.0)))
    assert [c.cause for c in host.causes] == ["data loading / host-bound"]
    link = telemetry.diagnose(telemetry.summarize(gpu_rows([40] * 5, mem=60.0, gen=3)))
    assert [c.cause for c in link.causes] == ["host-device transfers"] and "Gen3" in link.text
    unknown = telemetry.diagnose(telemetry.summarize(gpu_rows([40] * 5, mem=60.0)))
    assert len(unknown.causes) == 3 and unknown.gpu_util_mean == 40
    assert telemetry.diagnose(telemetry.summarize(gpu_rows([70] * 5, mem=60.0)), threshold=60) is None


SMI = """<?xml version="1.0" ?><nvidia_smi_log>
<gpu id="00000000:17:00.0"><product_name>NVIDIA A100 80GB PCIe</product_name><pci><pci_gpu_link_info>
<pcie_gen><max_link_gen>4</max_link_gen><current_link_gen>1</current_link_gen></pcie_gen>
<link_widths><max_link_width>16x</max_link_width><current_link_width>16x</current_link_width></link_widths>
</pci_gpu_link_info></pci></gpu>
<gpu id="00000000:65:00.0"><product_name>NVIDIA A100 80GB PCIe</product_name><pci><pci_gpu_link_info>
<pcie_gen><max_link_gen>3</max_link_gen><current_link_gen>3</current_link_gen></pcie_gen>
<link_widths><max_link_width>8x</max_link_width><current_link_width>8x</current_link_width></link_widths>
</pci_gpu_link_info></pci></gpu></nvidia_smi_log>"""


def test_snapshot_pcie_links_from_nvidia_smi_xml(tmp_path):
    links = telemetry.pcie_links(SMI)
    assert (links.pcie_gen_min, links.pcie_gen_current_min, links.pcie_width_min) == (3, 1, 8)
    assert links.gpus[0] == telemetry.GpuLink(gpu=0, name="NVIDIA A100 80GB PCIe", gen_max=4, gen=1, width_max=16,
                                              width=16)
    assert telemetry.pcie_links("<nvidia_smi_log/>").pcie_gen_min is None
    assert telemetry.pcie_links("not xml").gpus == []
    from validation.kinds.snapshot import pcie_metrics

    (tmp_path / "nvidia_smi.xml").write_text(SMI)
    m = pcie_metrics([tmp_path / "git_sha.txt", tmp_path / "nvidia_smi.xml"])
    assert m.pcie_gen_min == 3 and "Gen3 x8" in m.pcie.text and m.pcie.extra["pcie_width_min"] == 8
    cpu = pcie_metrics([tmp_path / "git_sha.txt"])
    assert cpu.pcie_gen_min is None and "not measured" in cpu.pcie.text


def test_a_trees_cpu_is_timed_from_when_its_processes_were_read_not_from_the_call():
    """Ticks read one second apart over 100 ticks of one process are 100% of a core, however late the probe is
    called after the scan (a busy machine holds the sampler; a period timed from the call read 2 cores' worth of
    ticks over a shorter period as more CPU than the node has)."""
    from validation.launch.telemetry import ProcStat, TreeProbe, _CLK_TCK
    root = 4_000_000  # no such pid: the tables below are the probe's whole view of /proc
    probe = TreeProbe(root)

    def table(ticks, at):
        return {root: ProcStat("python3", "R", 1, 12345, ticks, 0, at)}

    t0 = time.monotonic()
    assert probe.sample(table(0, t0))["cpu_util_pct"] is None  # no period yet
    time.sleep(0.3)  # the call comes 0.3 s after the first, the reads were 1 s apart
    out = probe.sample(table(int(_CLK_TCK), t0 + 1.0))
    assert out["cpu_util_pct"] == pytest.approx(100.0, abs=0.5)


def test_a_launch_sets_aside_an_earlier_slurm_jobs_node_files(tmp_path):
    """A Slurm job writes telemetry-<node>.csv per node; a later launch in the step directory (a resume, a rerun, a
    launch on other nodes or on this machine) must not have them read as its own: they are set aside first."""
    step = tmp_path / "step"
    step.mkdir()
    stale = step / "telemetry-node7.csv"
    stale.write_text(",".join(contracts.TELEMETRY_COLUMNS) + "\n")
    spec = LaunchSpec(argv=[sys.executable, "-c", "pass"], env=dict(os.environ), step_dir=step, timeout_s=30)
    assert launch(spec).status == "ok"
    assert not stale.exists() and (step / "telemetry-node7.prev1.csv").is_file()
    assert contracts.telemetry_files(step) == []
