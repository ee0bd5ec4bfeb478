"""Which kernels run where: the batched path's kernel choice (auto | torch | triton) against Triton's interpreter
switch, and the qualification driver's device check (nsa.attention.kernels.qualify.device_problem).

The contract (README, "Prefill paths and kernels" and "Qualifying the kernels on a GPU"): a Triton choice where
Triton cannot run is an error naming why, never a kernel compiled for a GPU launched on CPU tensors; on CPU the
Triton kernels run only under Triton's interpreter, which Triton turns on for TRITON_INTERPRET=1 / true / on (and
off for anything else, "2" or " 1" among them); `qualify --device cuda` runs the compiled kernels (what
compute-sanitizer checks), never the interpreter's host copies. No kernel runs here: only the selection logic.
"""

from __future__ import annotations

import argparse
import sys

import pytest
import torch

from nsa.attention import kernels
from nsa.attention.kernels import KernelUnavailable, qualify, resolve
from nsa.attention.kernels.common import interpreting, index_build
from nsa.config import NSAConfig
from triton_test_utils import needs_triton

CPU = torch.device("cpu")
CFG = NSAConfig(dim=64, n_heads=2, n_kv_groups=1, d_k=32, d_v=32)

# TRITON_INTERPRET values and whether Triton runs its interpreter for them (every triton the project supports reads
# 1 / true / on, any case, as on; anything else, unstripped, as off)
INTERPRET = {"1": True, "true": True, "TRUE": True, "On": True, "0": False, "": False, "false": False, "off": False,
             "2": False, " 1": False, "1 ": False, "enable": False, "01": False}


@pytest.mark.parametrize("triton_imported", [False, True], ids=["before_triton_import", "after_triton_import"])
def test_interpreting_reads_triton_interpret_as_triton_does(monkeypatch, triton_imported):
    if triton_imported:
        pytest.importorskip("triton")
    else:
        monkeypatch.delitem(sys.modules, "triton", raising=False)
    got = {}
    for value in INTERPRET:
        monkeypatch.setenv("TRITON_INTERPRET", value)
        got[value] = interpreting()
    monkeypatch.delenv("TRITON_INTERPRET")
    got["<unset>"] = interpreting()
    assert got == {**INTERPRET, "<unset>": False}


@needs_triton
@pytest.mark.parametrize("value", ["2", " 1", "enable"])
def test_a_triton_choice_on_cpu_is_refused_where_triton_does_not_interpret(monkeypatch, value):
    """TRITON_INTERPRET=2: Triton compiles for a GPU, so a Triton choice on CPU is KernelUnavailable naming the
    variable (it was accepted, and the first forward failed inside Triton: '0 active drivers'); auto takes torch."""
    monkeypatch.setenv("TRITON_INTERPRET", value)
    assert kernels.triton_status(CPU, CFG, torch.float32) is not None
    with pytest.raises(KernelUnavailable, match="'triton' but no CUDA device .*TRITON_INTERPRET=1"):
        resolve("triton", CPU, CFG, torch.float32)
    assert resolve("auto", CPU, CFG, torch.float32) == "torch"
    assert resolve("torch", CPU, CFG, torch.float32) == "torch"
    assert index_build("auto") == "triton"  # not the interpreter's torch build


@needs_triton
def test_a_triton_choice_on_cpu_runs_under_the_interpreter_and_auto_stays_on_torch(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve("triton", CPU, CFG, torch.float32) == "triton"
    assert resolve("auto", CPU, CFG, torch.float32) == "torch"  # auto takes Triton on CUDA only
    with pytest.raises(KernelUnavailable, match="under the interpreter, not bfloat16"):
        resolve("triton", CPU, CFG, torch.bfloat16)
    assert index_build("auto") == "torch"


@needs_triton
def test_the_interpreter_computes_in_its_own_dtypes_on_a_cuda_device_too(monkeypatch):
    """The interpreter runs CUDA tensors on host copies, in fp32/fp16 only (bf16 there gives garbage): with
    TRITON_INTERPRET=1 a bf16 layer on a CUDA device is refused for Triton and auto keeps torch; with the
    interpreter off the same bf16 layer may take the compiled kernels. Only the selection logic runs (no tensor)."""
    cuda = torch.device("cuda")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "under the interpreter, not bfloat16" in kernels.triton_status(cuda, CFG, torch.bfloat16)
    assert resolve("auto", cuda, CFG, torch.bfloat16) == "torch"
    assert kernels.triton_status(cuda, CFG, torch.float32) is None
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert kernels.triton_status(cuda, CFG, torch.bfloat16) is None


def test_an_unknown_kernel_choice_names_the_setting_and_its_values():
    with pytest.raises(ValueError, match=r"NSAConfig.kernel must be one of auto \| torch \| triton, got 'Triton'"):
        NSAConfig(dim=64, n_heads=2, n_kv_groups=1, d_k=32, d_v=32, kernel="Triton")
    with pytest.raises(ValueError, match=r"kernel must be one of auto \| torch \| triton, got 'cuda'"):
        resolve("cuda", CPU)
    with pytest.raises(ValueError, match="index_build must be one of auto, torch, triton, got 'fast'"):
        index_build("fast")


def _qualify_args(*argv: str) -> argparse.Namespace:
    return qualify.parse_args(list(argv))


@needs_triton
@pytest.mark.parametrize("value", ["1", "true"])
def test_qualify_on_cuda_refuses_the_interpreter(monkeypatch, capsys, value):
    """Under TRITON_INTERPRET=1 the kernels run on host copies of the CUDA tensors: 'all kernels ran' and a clean
    memcheck would qualify nothing. Refused (exit 2, one line naming the variable) before anything runs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("TRITON_INTERPRET", value)
    problem = qualify.device_problem(_qualify_args("--device", "cuda", "--dtype", "bf16"))
    assert problem is not None and "TRITON_INTERPRET" in problem and "--device cuda" in problem
    assert qualify.main(["--device", "cuda", "--kernels", "cmp"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("qualify: error: --device cuda") and "qualify: ok" not in err
    monkeypatch.setenv("TRITON_INTERPRET", "0")  # the compiled kernels on a GPU: nothing to refuse
    assert qualify.device_problem(_qualify_args("--device", "cuda")) is None


@needs_triton
def test_qualify_on_cpu_needs_the_interpreter_as_triton_reads_it(monkeypatch):
    args = _qualify_args("--device", "cpu", "--dtype", "fp32")
    monkeypatch.setenv("TRITON_INTERPRET", "2")
    assert qualify.device_problem(args) == ("--device cpu runs the Triton kernels only under the interpreter: set "
                                            "TRITON_INTERPRET=1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert qualify.device_problem(args) is None
