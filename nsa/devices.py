"""The devices the project knows by name (torch-free: the validation suite's plausibility checks read it as the
trainer's MFU does): their peaks (DEVICE_PEAKS: FLOP/s for MFU; exp/s and HBM bytes/s for the roofline of
nsa.attention.cost_model; the link between two GPUs for the ceiling of a collective's bandwidth) and the lookup of
a device by its name as torch.cuda.get_device_name (or nvidia-smi, or nccl-tests) gives it."""

from __future__ import annotations

import re

# Peaks per device: (name substring, dense bf16/fp16 tensor-core TFLOP/s, fp32 non-tensor TFLOP/s, HBM TB/s,
# exponentials T/s, GPU-to-GPU link GB/s each way). First match wins, so more specific names come first (H100 PCIe
# before H100, GH200 before H200, the A100s by memory). TFLOP/s: NVIDIA data sheets, the DENSE figures (989.4 on an H100
# SXM, never the 2:4 sparse 1,979). HBM: data sheets (A100 40 GB 1.555, 80 GB SXM 2.039, 80 GB PCIe 1.935; H100 SXM
# 3.35, PCIe 2.0; H200 4.8; GH200 4.9, its 144 GB HBM3e part: the larger figure, so no efficiency is overstated). A name
# matches an entry that it holds as a whole word, with no letter or digit either side: an "NVIDIA L40" is not an L4
# (whose 121 TFLOP/s would overstate its MFU 1.5x), an "NVIDIA RTX A1000" not an A100, an "NVIDIA GB200" (the Grace
# Blackwell superchip's GPU, at its own power limit and clock) not a B200, a "Tesla V100S" (a faster part) not a V100;
# such devices are unknown (train.peak_tflops), and so is a MIG instance of a listed part (a slice of its SMs and
# bandwidth, "NVIDIA A100-SXM4-40GB MIG 1g.5gb": the whole part's peaks would understate its MFU 7.7x). Exponentials:
# SMs x 16 MUFU ex2 a clock per SM x the clock the dense bf16 peak implies (bf16 TFLOP/s / (SMs x tensor FLOPs a clock
# per SM)): H100 SXM and H200 132 x 16 x 1.83 GHz = 3.86 T/s, H100 PCIe 114 x 16 x 1.62 GHz = 2.95 T/s, A100 108 x 16 x
# 1.41 GHz = 2.44 T/s. None: not known here (those devices' roofline says "peak unknown"). The NVL parts (H100 NVL, H200
# NVL: 132 SMs held to a lower clock by their power limit) have their own, lower peaks: 835.5 dense bf16 TFLOP/s (1,671
# sparse), 60 fp32, HBM 3.9 (H100 NVL) and 4.8 TB/s (H200 NVL), exponentials 132 x 16 x 1.545 GHz = 3.26 T/s; read as an
# SXM part they would get 989.4 and understate their MFU by 16%.
# Links (the last column): the fastest link the part has to another GPU, in GB/s each way (the data sheets give both
# directions together): NVLink 4 on an H100/H200 SXM and GH200 900 GB/s -> 450; NVLink 5 on a B200 1.8 TB/s -> 900;
# NVLink 3 on an A100 SXM 600 GB/s -> 300, and the NVLink bridge of the PCIe parts (A100 PCIe, H100 PCIe and H100
# NVL 600 GB/s -> 300, H200 NVL 900 GB/s -> 450); NVLink 2 on a V100 SXM2 300 GB/s -> 150 (the PCIe V100 is slower:
# the larger figure, so no real figure is called impossible); no NVLink on L40S, L4 and A10G: PCIe 4.0 x16, 32.
# Volta (NVIDIA Tesla V100 data sheet): SXM2 125 fp16 tensor TFLOP/s and 15.7 fp32, PCIe 112 and 14; it has no bf16
# tensor cores, so bf16 has no peak there (BF16_UNSUPPORTED). The A10G (AWS's part) has no NVIDIA data sheet and the
# figures published for it disagree (62.5 to 125 bf16 TFLOP/s): its peaks are unknown (None), its link is not.
DEVICE_PEAKS = (
    ("H100 PCIe", 756.0, 51.0, 2.0, 114 * 16 * 1.62e-3, 300.0),
    ("H100 NVL", 835.5, 60.0, 3.9, 132 * 16 * 1.545e-3, 300.0),
    ("H200 NVL", 835.5, 60.0, 4.8, 132 * 16 * 1.545e-3, 450.0),
    ("H100", 989.4, 66.9, 3.35, 132 * 16 * 1.83e-3, 450.0),
    ("GH200", 989.4, 66.9, 4.9, 132 * 16 * 1.83e-3, 450.0),
    ("H200", 989.4, 66.9, 4.8, 132 * 16 * 1.83e-3, 450.0),
    ("B200", 2250.0, 80.0, None, None, 900.0),
    ("A100-SXM4-40GB", 312.0, 19.5, 1.555, 108 * 16 * 1.41e-3, 300.0),
    ("A100-PCIE-40GB", 312.0, 19.5, 1.555, 108 * 16 * 1.41e-3, 300.0),
    ("A100 80GB PCIe", 312.0, 19.5, 1.935, 108 * 16 * 1.41e-3, 300.0),
    ("A100", 312.0, 19.5, 2.039, 108 * 16 * 1.41e-3, 300.0),
    ("L40S", 362.1, 91.6, None, None, 32.0),
    ("L4", 121.0, 30.3, None, None, 32.0),
    ("A10G", None, None, None, None, 32.0),
    ("V100-PCIE", 112.0, 14.0, None, None, 150.0),
    ("V100", 125.0, 15.7, None, None, 150.0),
)
# parts whose tensor cores have no bf16 (their column is the fp16 peak): bf16 on them has no peak here
BF16_UNSUPPORTED = ("V100-PCIE", "V100")


def device_entry(name: str) -> tuple | None:
    """The DEVICE_PEAKS entry of a device name: the first whose model name the name holds as a whole word, with no
    letter or digit either side (so "L4" is not an "NVIDIA L40", "A100" not an "NVIDIA RTX A1000", "B200" not an
    "NVIDIA GB200", "V100" not a "Tesla V100S": another model, whose peak is not known here). None for a MIG
    instance ("NVIDIA A100-SXM4-40GB MIG 1g.5gb"): a slice of the part, with a fraction of its SMs and of its memory
    bandwidth (14 of an A100's 108 SMs in a 1g slice), whose peaks are not the whole part's."""
    if re.search(r"(?<![A-Za-z0-9])MIG(?![A-Za-z0-9])", str(name)):
        return None
    return next((entry for entry in DEVICE_PEAKS
                 if re.search(r"(?<![A-Za-z0-9])" + re.escape(entry[0]) + r"(?![A-Za-z0-9])", str(name))), None)


def link_gbps(name: str) -> float | None:
    """The fastest link (GB/s each way) between two GPUs of the device named `name` (DEVICE_PEAKS' last column), or
    None for a device not listed (a CPU, an unknown GPU)."""
    entry = device_entry(name)
    return None if entry is None else entry[5]
