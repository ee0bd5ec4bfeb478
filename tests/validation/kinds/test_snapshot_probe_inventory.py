"""The preflight snapshot's inventory (validation.launch.environment and validation.kinds.snapshot) against what the
system tools really print: nvidia-smi's XML as drivers 535-580 write it, nvidia-smi's own failure messages (exit 9:
no driver; exit 18: driver/library mismatch), a Slurm node's missing tools, and the requirement checks that read
the GPU records (figures of the committed H100 run, reports/gpu/2026-11-26-h100)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

from validation.kinds import get
from validation.kinds.snapshot import pcie_metrics
from validation.launch import environment
from validation.launch.spec import LaunchResult, LaunchSpec
from validation.runbook.model import Requirements

H100 = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "memory_gb": 79.18, "capability": 9.0}


def _tool(bin_dir: Path, name: str, script: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def _snapshot(tmp_path, monkeypatch, nvidia_smi: str | None):
    """environment.snapshot on a PATH holding only the given nvidia-smi script (None: no nvidia-smi), torch's probe
    and collect_env replaced by quick stand-ins (the subprocess and the files are the real code's)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if nvidia_smi is not None:
        _tool(bin_dir, "nvidia-smi", nvidia_smi)
    _tool(bin_dir, "python", "echo 'PyTorch version: 2.x'\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setattr(environment.sys, "executable", str(bin_dir / "python"))
    monkeypatch.setattr(environment, "probe", lambda cwd: {"git_sha": None, "gpu_count": 0, "gpus": []})
    monkeypatch.setattr(environment, "_nvml_inventory", lambda: [])
    return environment.snapshot(tmp_path / "snap", tmp_path, timeout_s=30)


def test_a_capability_or_memory_requirement_without_a_gpu_count_checks_the_first_gpu():
    """`requires: {min_cuda_capability: 8.0}` (no `gpus`) on an H100 machine is met; the step was skipped with
    "found no GPU" although the machine has one. The figures compared are the first GPU's (9.0, 79.18)."""
    h100 = {"gpu_count": 1, "gpus": [H100], "nccl": "2.28.9"}
    assert environment.unmet(Requirements(min_cuda_capability=8.0), h100) is None
    assert environment.unmet(Requirements(min_gpu_memory_gb=70), h100) is None
    assert environment.unmet(Requirements(min_cuda_capability=9.5), h100) == \
        "needs CUDA capability >= 9.5, found 9"
    assert environment.unmet(Requirements(min_gpu_memory_gb=100), h100) == \
        "needs GPUs with >= 100 GiB, found 79.18 GiB"
    cpu = {"gpu_count": 0, "gpus": []}
    assert environment.unmet(Requirements(min_cuda_capability=8.0), cpu) == \
        "needs CUDA capability >= 8, found no GPU"
    # with a GPU count, the first that many GPUs are the ones compared: a slower third GPU is not used by 2
    mixed = {"gpu_count": 3, "gpus": [H100, H100, dict(H100, index=2, capability=7.5)]}
    assert environment.unmet(Requirements(gpus=2, min_cuda_capability=9.0), mixed) is None
    assert environment.unmet(Requirements(gpus=3, min_cuda_capability=9.0), mixed) == \
        "needs CUDA capability >= 9, found 7.5"


def test_nvidia_smi_without_a_driver_is_a_problem_that_says_why_and_measures_no_pcie(tmp_path, monkeypatch):
    """nvidia-smi installed, the driver not loaded: it prints its reason on stdout and exits 9. The snapshot notes
    the exit and the reason, and the PCIe figure is None (not a number read from the message)."""
    message = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the "
               "latest NVIDIA driver is installed and running.")
    env, files, problems = _snapshot(tmp_path, monkeypatch, f"echo \"{message}\"\necho\nexit 9\n")
    assert problems == [f"nvidia-smi -q -x exited 9: {message}"]
    assert [f.name for f in files] == ["git_sha.txt", "collect_env.txt", "nvidia_smi.xml", "environment.json"]
    m = pcie_metrics(files)
    assert m.pcie_gen_min is None and m.pcie.extra == {"gpus": []} and "not measured" in m.pcie.text


def test_nvidia_smi_with_a_mismatched_library_says_so(tmp_path, monkeypatch):
    env, files, problems = _snapshot(
        tmp_path, monkeypatch,
        "echo 'Failed to initialize NVML: Driver/library version mismatch'\necho 'NVML library version: 535.161'\n"
        "exit 18\n")
    assert problems == ["nvidia-smi -q -x exited 18: Failed to initialize NVML: Driver/library version mismatch"]


def test_no_nvidia_smi_is_a_problem_and_no_pcie_figure(tmp_path, monkeypatch):
    env, files, problems = _snapshot(tmp_path, monkeypatch, None)
    assert problems == ["nvidia-smi not found: no GPU inventory XML"]
    assert pcie_metrics(files).pcie_gen_min is None


# nvidia-smi -q -x as driver 535+ writes it (the DOCTYPE, the device and host maxima beside the link's own):
# GPU 0 an idle H100 (link down to Gen1, x16 of x16); GPU 1 in a Gen4 host slot whose link trained at x8 of x16.
XML = """<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log>
\t<driver_version>580.159.04</driver_version>
\t<cuda_version>13.0</cuda_version>
\t<attached_gpus>2</attached_gpus>
{gpus}
</nvidia_smi_log>
"""
GPU = """\t<gpu id="{bus}">
\t\t<product_name>NVIDIA H100 80GB HBM3</product_name>
\t\t<mig_mode><current_mig>Disabled</current_mig><pending_mig>Disabled</pending_mig></mig_mode>
\t\t<pci>
\t\t\t<pci_bus_id>{bus}</pci_bus_id>
\t\t\t<pci_gpu_link_info>
\t\t\t\t<pcie_gen>
\t\t\t\t\t<max_link_gen>{gen_max}</max_link_gen>
\t\t\t\t\t<current_link_gen>{gen}</current_link_gen>
\t\t\t\t\t<device_current_link_gen>{gen}</device_current_link_gen>
\t\t\t\t\t<max_device_link_gen>5</max_device_link_gen>
\t\t\t\t\t<max_host_link_gen>{gen_max}</max_host_link_gen>
\t\t\t\t</pcie_gen>
\t\t\t\t<link_widths>
\t\t\t\t\t<max_link_width>16x</max_link_width>
\t\t\t\t\t<current_link_width>{width}x</current_link_width>
\t\t\t\t</link_widths>
\t\t\t</pci_gpu_link_info>
\t\t\t<tx_util>0 KB/s</tx_util>
\t\t</pci>
\t</gpu>"""


def test_the_pcie_figures_are_read_from_nvidia_smis_xml_as_drivers_write_it(tmp_path, monkeypatch):
    gpus = "\n".join([GPU.format(bus="00000000:19:00.0", gen_max=5, gen=1, width=16),
                      GPU.format(bus="00000000:3B:00.0", gen_max=4, gen=4, width=8)])
    xml = XML.format(gpus=gpus).replace("'", "'\\''")
    env, files, problems = _snapshot(tmp_path, monkeypatch, f"printf '%s' '{xml}'\n")
    assert problems == []
    m = pcie_metrics(files)
    # the lowest maximum generation is GPU 1's host-limited Gen4, not GPU 0's idle Gen1 nor the device's Gen5
    assert m.pcie_gen_min == 4
    assert (m.pcie.extra["pcie_gen_current_min"], m.pcie.extra["pcie_width_min"]) == (1, 16)
    assert [(g["gen_max"], g["gen"], g["width_max"], g["width"]) for g in m.pcie.extra["gpus"]] == \
        [(5, 1, 16, 16), (4, 4, 16, 8)]
    assert "GPU 1 Gen4 x8 (max Gen4 x16)" in m.pcie.text  # the narrowed link is shown


def test_a_nodes_missing_tools_are_the_steps_problems(tmp_path, monkeypatch):
    """launcher slurm: a compute node without nvidia-smi writes its problem into its environment.json, and the
    snapshot step notes it as it notes the submitting machine's (it was printed to the job's log only)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))  # no nvidia-smi, no ibv_devinfo on the node
    monkeypatch.setenv("NSA_NODE_NAME", "nodeA")

    def node_snapshot(step_dir, cwd, timeout_s=300):
        step_dir.mkdir(parents=True, exist_ok=True)
        (step_dir / "git_sha.txt").write_text("abc\n")
        return {"git_sha": "abc", "gpu_count": 0}, [step_dir / "git_sha.txt"], [
            "nvidia-smi not found: no GPU inventory XML"]

    monkeypatch.setattr(environment, "snapshot", node_snapshot)
    nodes_dir = tmp_path / "snap" / "nodes"
    assert environment.node_snapshot_main([str(nodes_dir)]) == 0
    written = json.loads((nodes_dir / "nodeA" / "environment.json").read_text())
    assert written["problems"] == ["nvidia-smi not found: no GPU inventory XML"]

    # the step: this machine has no problem, the one node has one
    monkeypatch.setattr(environment, "snapshot",
                        lambda step_dir, cwd, timeout_s: ({"git_sha": "abc", "gpu_count": 1}, [], []))
    lr = LaunchResult(status="ok", returncode=0, duration_s=1.0, argv=["sbatch"], log_path=tmp_path / "log",
                      rank_logs={}, reason="exited 0", excerpt=None, stack_dumps=[], attempts=1)
    ctx = SimpleNamespace(step=SimpleNamespace(name="snap", launch=SimpleNamespace(timeout_s=10)),
                          launches=[LaunchSpec(argv=["python"], env={}, nnodes=1, label="nodes")],
                          run_dir=tmp_path, cwd=tmp_path, results={"environment": {}},
                          launch=lambda s, i, n: lr, rel=lambda p: os.path.relpath(p, tmp_path))
    result = get("snapshot").run(None, ctx)
    assert result.status == "passed" and result.metrics.nodes == ["nodeA"]
    assert result.metrics.problems == ["node nodeA: nvidia-smi not found: no GPU inventory XML"]
    assert result.reason == "node nodeA: nvidia-smi not found: no GPU inventory XML"


def test_the_node_snapshot_command_takes_no_option_for_its_directory(tmp_path, monkeypatch, capsys):
    """`python -m validation.launch.environment --help` printed nothing useful and wrote a snapshot into ./--help/;
    now --help prints the usage (exit 0) and any other option is refused (exit 2), writing nothing."""
    from validation.launch import environment
    monkeypatch.chdir(tmp_path)
    assert environment.node_snapshot_main(["--help"]) == 0
    assert "usage: python -m validation.launch.environment NODES_DIR" in capsys.readouterr().out
    assert environment.node_snapshot_main(["--nodes"]) == 2
    assert list(tmp_path.iterdir()) == []
