"""Helpers for the Triton kernel tests (tests/nsa/attention/kernels/).

Triton kernel tests need the `triton` package (the `gpu` extra; CI installs it). Without a GPU they run through
the interpreter (TRITON_INTERPRET=1, set by tests/nsa/conftest.py before anything imports triton): fp32, small
shapes. With a GPU the same tests run natively.
"""

import importlib.util
import math
import os
import re

import pytest
import torch

from nsa import toggles
from nsa.attention.selection import choose_blocks

HAVE_TRITON = importlib.util.find_spec("triton") is not None
ON_GPU = torch.cuda.is_available()

needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="needs the triton package (pip install -e '.[gpu]')")

# Where the Triton kernels run in this session: cuda natively, else cpu through the interpreter.
KERNEL_DEVICE = torch.device("cuda" if ON_GPU else "cpu")


def compile_env(*paths: str) -> dict[str, str]:
    """This process's environment without TRITON_INTERPRET (which this session may have set for the interpreter
    tests, and under which @triton.jit functions cannot be compiled), `paths` put first on PYTHONPATH: for a
    subprocess that compiles kernels."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if paths:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [*paths, env.get("PYTHONPATH")]))
    return env

# The fused top-k selection (selection/host.py, method="fused") faulted on an H100 (its module docstring, "Known
# fault"): a fault leaves the process's CUDA context unusable, so on a GPU its tests run only when asked for,
# in a process of their own; through the interpreter they always run.
FUSED_SELECTION_ENV = "NSA_TEST_FUSED_SELECTION"
RUN_FUSED_SELECTION = not ON_GPU or toggles.parse(FUSED_SELECTION_ENV)
fused_selection = pytest.mark.skipif(not RUN_FUSED_SELECTION,
                                     reason=f"the fused selection is not qualified on a GPU yet: set "
                                            f"{FUSED_SELECTION_ENV}=1 to run it (in a process of its own)")
# the selection methods as test parameters, the fused one under that condition
SELECTION_METHODS = [pytest.param("fused", marks=fused_selection), "tiled"]


def _max_abs(x: torch.Tensor) -> float:
    return x.double().abs().max().item() if x.numel() else 0.0


def assert_within_torch_error(what: str, got: torch.Tensor, ref: torch.Tensor, torch_out: torch.Tensor,
                              factor: float = 2.0, rel_floor: float = 1e-3) -> None:
    """The numerics rule of the kernel tests (FlashAttention's), per tensor:

        max|got - ref| <= factor * max|torch_out - ref| + rel_floor * max|ref|

    ref: a float64 reference; torch_out: the PyTorch path's result at the kernel's dtype from the same inputs (its
    own rounding error sets the scale); got: the kernel's. Never the kernel against the PyTorch path elementwise at
    a low precision: both round, and which one is nearer the truth is what matters.
    """
    assert got.shape == ref.shape == torch_out.shape, f"{what}: shapes {got.shape}, {ref.shape}, {torch_out.shape}"
    assert torch.isfinite(got).all(), f"{what}: the kernel's result is not finite"
    ref64 = ref.double()
    err = _max_abs(got.double() - ref64)
    err_torch = _max_abs(torch_out.double() - ref64)
    bound = factor * err_torch + rel_floor * _max_abs(ref64)
    assert err <= bound, (f"{what}: max error {err:.3g} against the float64 reference > {factor:g} x the PyTorch "
                          f"path's {err_torch:.3g} + {rel_floor:g} x max|ref| {_max_abs(ref64):.3g} = {bound:.3g}")


def _uniform_reads_writes(text: str) -> tuple[set[int], set[int]]:
    """(read, written) uniform registers of one SASS instruction ("OPCODE dst, src, ..." without the ';')."""
    opcode, _, operands = text.strip().partition(" ")
    if opcode.startswith("@"):  # a predicated instruction: "@P0 OPCODE ..."
        opcode, _, operands = operands.strip().partition(" ")
    ops = [o.strip() for o in operands.split(",")]
    reads, writes = set(), set()
    if opcode.startswith("HGMMA"):
        # gdesc[URx]: A's descriptor in URx, URx+1 and B's in URx+2, URx+3; with A in registers (R operand
        # before gdesc) the hardware reads B's only (nvdisasm's dataflow counts all four)
        x = int(re.search(r"gdesc\[UR(\d+)\]", operands).group(1))
        a_in_registers = len(ops) > 1 and re.fullmatch(r"R\d+", ops[1]) is not None
        reads.update(range(x + 2, x + 4) if a_in_registers else range(x, x + 4))
        return reads, writes
    dest = re.fullmatch(r"UR(\d+)", ops[0]) if ops and ops[0] else None
    for o in ops[1:] if dest else ops:
        reads.update(int(n) for n in re.findall(r"\bUR(\d+)", o))
    if dest:
        n = int(dest.group(1))
        # a 64-bit write ("ULDC.64", "UIMAD.WIDE", "UIMAD.WIDE.U32": the product's two halves) writes the pair
        wide = ".64" in opcode or ".WIDE" in opcode
        writes.update(range(n, n + (4 if ".128" in opcode else 2 if wide else 1)))
    return reads, writes


def uniform_registers_read_before_written(sass: str) -> list[str]:
    """Uniform registers a kernel reads before any instruction writes them, in address order of its SASS
    (`nvdisasm -c` of the cubin); URZ excluded.

    A uniform register holds a warp-wide value: an address, a loop bound, a wgmma shared-memory descriptor. Read
    before it is written it holds whatever the SM's previous occupant left there: a compiler fault. ptxas 12.8
    (triton 3.6's) builds three of the four wgmma descriptors of _blocksel_topk_kernel's P @ W from an unwritten
    register pair (the "Out-of-range shared or local address" it met on an H100). A 64-bit write ("ULDC.64 UR32",
    "UIMAD.WIDE.U32 UR8") writes the pair; a wgmma whose A operand is in registers reads only B's descriptor slot. Address order is the
    program order of straight-line code; a value first written in a block placed after its reader would be
    reported too (nvdisasm's own dataflow, `-plr`, agreed on the kernels checked). Ordinary registers are not
    checked: Triton's reductions leave a predicated shared-memory load's register undefined in lanes whose value
    is then discarded.
    """
    seen, problems = set(), []
    for m in re.finditer(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", sass):
        reads, writes = _uniform_reads_writes(m.group(2))
        for reg in sorted(reads - seen - {255}):
            problems.append(f"UR{reg} read at 0x{m.group(1)} ({m.group(2).strip()}) before any write")
        seen |= reads | writes
    return problems


# ---------------------------------------------------------------------------------------------------------------
# the selected branch's launch-choice tests (test_selected_*_choice*.py): their inputs, block lists and closeness
CHOICE_DTYPE = torch.bfloat16 if ON_GPU else torch.float32
CHOICE_TOL = 3e-2 if ON_GPU else 2e-5  # |got - want| <= TOL * max|want| + TOL per tensor (the interpreter's fp32)


def choice_inputs(b: int, h: int, g: int, s: int, d: int, seed: int) -> list[torch.Tensor]:
    """q [B, H, S, d], k, v [B, G, S, d] and dO [B, H, S, d], in CHOICE_DTYPE on the kernel device: q, k and v as
    transposed views of [B, S, heads, d] storage, as the layer's projections lay them out."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, s, n, d, generator=gen).transpose(1, 2) for n in (h, g, g))
    do = torch.randn(b, h, s, d, generator=gen)
    return [t.to(KERNEL_DEVICE, CHOICE_DTYPE) for t in (q, k, v, do)]


def choice_blocks(b: int, g: int, s: int, l_sel: int, n_sel: int, seed: int, edits=()) -> torch.Tensor:
    """choose_blocks on random importance (block 0, the previous and the own block forced; -1 padding), then
    `edits`: (t, slot, block) entries written into -1 slots of every (sequence, group)'s list of query t."""
    gen = torch.Generator().manual_seed(seed)
    nb = -(-s // l_sel)
    blocks = choose_blocks(torch.rand(b, g, s, nb, generator=gen), torch.arange(s), n_sel, l_sel).clone()
    for t, slot, block in edits:
        assert (blocks[:, :, t, slot] == -1).all(), (t, slot)
        blocks[:, :, t, slot] = block
    return blocks.to(KERNEL_DEVICE)


def assert_choice_close(what: str, got: torch.Tensor, want: torch.Tensor, low: torch.Tensor) -> None:
    """`got` finite and close to the float64 `want`: on a GPU within a small factor of the PyTorch path's own error
    `low` at the same dtype (assert_within_torch_error), under the interpreter within CHOICE_TOL."""
    assert torch.isfinite(got).all(), f"{what}: not finite"
    if ON_GPU:
        assert_within_torch_error(what, got, want, low)
        return
    err = (got.double() - want.double()).abs().max().item()
    bound = CHOICE_TOL * want.abs().max().item() + CHOICE_TOL
    assert err <= bound, f"{what}: max error {err:.3g} > {bound:.3g}"


def listed_reference(q, k, v, blocks, l_sel, dtype):
    """The selected branch in `dtype` with an explicit mask: softmax(q k^T / sqrt(d) + log(count)) v, count[t, p] =
    how often key p's block is listed for query t (a repeated block weighs twice, as the kernels compute), 0 where
    p > t; a query with no key gets 0."""
    h, s, d = q.shape[1], q.shape[2], q.shape[3]
    hpg = h // k.shape[1]
    pos = torch.arange(s, device=q.device)
    listed = blocks.long()[..., :, None] == (pos // l_sel)[None, None, None, None, :]  # [B, G, t, slot, p]
    count = (listed.sum(-2) * (pos[None, :] <= pos[:, None])).repeat_interleave(hpg, dim=1).to(dtype)
    q, k, v = q.to(dtype), k.to(dtype).repeat_interleave(hpg, dim=1), v.to(dtype).repeat_interleave(hpg, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d) + torch.log(count)
    has = (count > 0).any(-1, keepdim=True)
    return torch.softmax(torch.where(has, scores, torch.zeros_like(scores)), dim=-1) * has @ v


# ---------------------------------------------------------------------------------------------------------------
# the tiled selection's tests (test_triton_selection_*.py): q, compressed keys and the compressed branch's lse
def selection_inputs(b, g, hpg, s, d_k, l, d, dtype, seed=0, scale=2.0):
    """q [B, H, S, d_k] (a transposed view of [B, S, H, d_k]), k_cmp [B, G, n_cmp, d_k] in `dtype` on the kernel
    device, and the float64 log-sum-exp of the scaled compressed scores over the visible blocks, as fp32."""
    import reference as R  # tests/nsa/reference.py

    gen = torch.Generator().manual_seed(seed)
    n_cmp = R.num_cmp_blocks(s, l, d)
    q = (torch.randn(b, s, g * hpg, d_k, generator=gen) * scale).to(dtype).to(KERNEL_DEVICE).transpose(1, 2)
    k = torch.randn(b, g, n_cmp, d_k, generator=gen).to(dtype).to(KERNEL_DEVICE)
    scores = q.double() @ R.expand_groups(k.double(), g * hpg).transpose(-1, -2) / math.sqrt(d_k)
    visible = R.cmp_visible_mask(s, n_cmp, l, d, device=q.device)
    return q, k, scores.masked_fill(~visible, float("-inf")).logsumexp(-1).float()
