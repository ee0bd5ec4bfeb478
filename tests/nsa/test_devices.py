"""The devices the project knows by name (nsa.devices): the link between two GPUs each part has, by the names
torch, nvidia-smi and nccl-tests give them; a name that holds a listed model followed by a digit is another
model."""

from __future__ import annotations

import sys

import pytest

from nsa.devices import DEVICE_PEAKS, link_gbps


@pytest.mark.parametrize("name, gbps", [
    ("NVIDIA H100 80GB HBM3", 450.0),  # NVLink 4: 900 GB/s both ways (data sheet)
    ("NVIDIA H200", 450.0),
    ("NVIDIA GH200 480GB", 450.0),
    ("NVIDIA H100 PCIe", 300.0),  # the NVLink bridge: 600 GB/s both ways
    ("NVIDIA A100-SXM4-80GB", 300.0),  # NVLink 3: 600 GB/s both ways
    ("NVIDIA B200", 900.0),  # NVLink 5: 1.8 TB/s both ways
    ("Tesla V100-SXM2-16GB", 150.0),  # NVLink 2: 300 GB/s both ways
    ("NVIDIA L40S", 32.0),  # PCIe 4.0 x16
    ("NVIDIA L40", None),  # not an L4
    ("NVIDIA RTX A1000", None),  # not an A100
    ("cpu", None),
])
def test_link_of_a_device_by_its_name(name, gbps):
    assert link_gbps(name) == gbps


def test_every_listed_device_has_a_positive_link_and_the_table_needs_no_torch():
    assert all(isinstance(entry[5], float) and entry[5] > 0 for entry in DEVICE_PEAKS)
    # the validation suite's plausibility checks read the table without loading torch
    import subprocess
    code = "import sys, nsa.devices; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
