"""DDP's gradient hook (nsa.training.distributed.wrap_ddp, NSA_DDP_COMPRESS, NSA_DDP_BUCKET_MB) on 2 gloo ranks,
against an independent reference: every rank's own fp32 gradient, gathered, summed and divided by the world size.

- none: the reference exactly (a / 2 + b / 2 == (a + b) / 2 in binary floating point);
- bf16 / fp16: the reference to the rounding of the format: each rank's gradient is rounded once, the sum once,
  so |got - ref| <= 3 u (|a| + |b|) / 2 (u = 2^-8 for bf16, 2^-11 for fp16), plus fp16's subnormal spacing
  (2^-24) per rounding for gradients below its normal range;
- averaged, not summed: the ranks' gradients differ by a factor of 3 in scale, so a sum would be off by 2x;
- the bucket size does not change the result (bitwise): each element is reduced on its own.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from train_utils import REPO, clean_env, finish, free_port

DRIVER = r"""
import gc, os, sys
import torch, torch.distributed as dist
from nsa.training.distributed import DistInfo, wrap_ddp

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
info = DistInfo(rank, world, rank, torch.device("cpu"), "gloo")

def net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 200), torch.nn.GELU(), torch.nn.Linear(200, 32))

# each rank its own batch; rank 1's inputs 3x larger, so its gradients are larger than rank 0's
x = torch.randn(world, 8, 32, generator=torch.Generator().manual_seed(1)) * torch.tensor([1.0, 3.0])[:, None, None]
plain = net()
plain(x[rank]).pow(2).mean().backward()
every = []  # [param][rank]: each rank's own fp32 gradient
for p in plain.parameters():
    gathered = [torch.empty_like(p.grad) for _ in range(world)]
    dist.all_gather(gathered, p.grad)
    every.append(gathered)
got = {}
for compress in ("none", "bf16", "fp16"):
    for bucket_mb in (25, 0.002):  # one bucket; many (0.002 MB = 500 fp32 elements)
        model = net()
        ddp = wrap_ddp(model, info, bucket_mb, compress)
        ddp(x[rank]).pow(2).mean().backward()
        got[f"{compress}/{bucket_mb}"] = [p.grad.clone() for p in model.parameters()]
if rank == 0:
    torch.save({"every": every, "got": got}, sys.argv[1])
# the last DDP wrapper goes before its process group: its reducer destroyed after the group (at interpreter exit)
# can abort the process ("terminate called without an active exception"), seen once under load
del ddp, model
gc.collect()
dist.barrier()
dist.destroy_process_group()
"""

UNIT = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
TINY_SPACING = {"bf16": 0.0, "fp16": 2.0 ** -24}


@pytest.fixture(scope="module")
def hook_results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hook")
    driver, result = tmp / "driver.py", tmp / "grads.pt"
    driver.write_text(DRIVER)
    argv = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master-port={free_port()}",
            str(driver), str(result)]
    proc = subprocess.Popen(argv, cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    code, log = finish(proc, timeout=120)
    assert code == 0, log[-3000:]
    return torch.load(result, weights_only=False)


def _reference(every):
    return [sum(per_rank) / len(per_rank) for per_rank in every], [sum(g.abs() for g in per_rank) / len(per_rank)
                                                                   for per_rank in every]


def test_plain_hook_is_the_exact_fp32_average(hook_results):
    ref, _ = _reference(hook_results["every"])
    for bucket in ("25", "0.002"):
        for got, want in zip(hook_results["got"][f"none/{bucket}"], ref):
            assert torch.equal(got, want)


@pytest.mark.parametrize("compress", ["bf16", "fp16"])
def test_compressed_hook_is_the_average_to_the_formats_rounding(hook_results, compress):
    ref, mean_abs = _reference(hook_results["every"])
    got = hook_results["got"][f"{compress}/25"]
    worst = 0.0
    for g, r, a in zip(got, ref, mean_abs):
        bound = 3 * UNIT[compress] * a + 3 * TINY_SPACING[compress]
        assert bool(((g - r).abs() <= bound).all()), f"{compress}: max excess {((g - r).abs() - bound).max():.3g}"
        worst = max(worst, ((g - r).abs() / (a + 1e-30)).max().item())
    assert worst > 0  # compressed for real (not the fp32 average)
    # averaged, not summed: the gradient as a whole is the reference's size (a sum would be twice it)
    norm = torch.cat([g.flatten() for g in got]).norm() / torch.cat([r.flatten() for r in ref]).norm()
    assert norm.item() == pytest.approx(1.0, abs=4 * UNIT[compress])


@pytest.mark.parametrize("compress", ["none", "bf16", "fp16"])
def test_the_bucket_size_does_not_change_the_average(hook_results, compress):
    one, many = hook_results["got"][f"{compress}/25"], hook_results["got"][f"{compress}/0.002"]
    for a, b in zip(one, many):
        assert torch.equal(a, b)
