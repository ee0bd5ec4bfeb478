"""Every Triton kernel compiles for sm_80 (A100) and sm_90 (H100) with no GPU: tensor-core instructions in the PTX,
0 bytes of spill stores reported by the bundled `ptxas -v` (nsa.attention.kernels.aot).

The compiler runs in a subprocess without TRITON_INTERPRET (this session may have set it for the interpreter
tests). Registers and shared memory per kernel are printed; the kernels' docstrings record them.
"""

import json
import os
import subprocess
import sys

import pytest

from triton_test_utils import needs_triton
from nsa.attention.kernels.aot import KERNEL_MODULES

# Kernels whose main products must compile to Hopper's wgmma on sm_90 (the others use mma.sync there).
WGMMA_ON_SM90: set[str] = {"range_fwd", "range_dq", "range_dkdv", "sel_fwd_kv_stats", "sel_fwd_kv_out",
                           "_blocksel_topk_kernel", "_blocksel_importance_kernel"}


@needs_triton
@pytest.mark.skipif(not KERNEL_MODULES, reason="no Triton kernel modules registered yet")
def test_every_kernel_compiles_for_sm80_and_sm90_without_spills():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "nsa.attention.kernels.aot", "--json"], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.stdout.strip(), f"aot printed nothing; stderr:\n{proc.stderr[-3000:]}"
    results = json.loads(proc.stdout)
    for r in results:
        print(f"{r['kernel']:<60} {r['target']}: {r['registers']} regs, {r['shared_bytes']} B shared, "
              f"spills {r['spill_stores']}, mma {r['mma']}, wgmma {r['wgmma']} {'; '.join(r['problems'])}")
    failed = [f"{r['kernel']} {r['target']}: {'; '.join(r['problems'])} {r['error']}" for r in results if not r["ok"]]
    assert not failed, "\n".join(failed)
    assert {r["target"] for r in results} == {"sm_80", "sm_90"}
    for r in results:
        if r["target"] == "sm_80" and r["tensor_cores_expected"]:
            assert r["mma"], r["kernel"]
        if r["target"] == "sm_90":
            base = r["kernel"].split("[")[0]
            if base in WGMMA_ON_SM90:
                assert r["wgmma"], f"{r['kernel']} does not reach wgmma on sm_90"


@needs_triton
def test_a_spill_is_a_problem_unless_accepted_for_that_kernel_target_and_triton(monkeypatch):
    """aot.ACCEPTED_SPILLS names (kernel case, target, triton major.minor) -> (at most N bytes, why): within it a
    spill is a note; above it, or for any other case, target or version, a problem."""
    import triton

    from nsa.attention.kernels import aot

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = min(aot.all_cases(), key=lambda c: len(c.signature))  # a small kernel: a quick real compile
    version = ".".join(triton.__version__.split(".")[:2])
    monkeypatch.setattr(aot, "_ptxas_report", lambda ptx, cc: (200, 44, 44, ""))
    monkeypatch.setattr(aot, "ACCEPTED_SPILLS", {(case.name, "sm_90", version): (64, "a stated reason")})
    accepted = aot.compile_case(case, 90)
    assert accepted.ok and accepted.problems == [] and "a stated reason" in accepted.notes[0]
    other_target = aot.compile_case(case, 80)
    assert not other_target.ok and other_target.problems == ["44 bytes of spill stores"]
    monkeypatch.setattr(aot, "ACCEPTED_SPILLS", {(case.name, "sm_90", version): (32, "too few bytes")})
    assert aot.compile_case(case, 90).problems == ["44 bytes of spill stores"]
