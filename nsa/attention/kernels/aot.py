"""Ahead-of-time compilation of every Triton kernel for the GPUs they target, with no GPU needed.

    python -m nsa.attention.kernels.aot            # table: kernel, config, target, registers, shared memory, ...
                                                   # (reports/aot/triton-<version>.md: this table, committed)
    python -m nsa.attention.kernels.aot --json     # the same as JSON (the compile test reads this)
    python -m nsa.attention.kernels.aot --jobs 1   # one compile at a time (default: one process per CPU)
    python -m nsa.attention.kernels.aot --cases default   # the default path's cases only (or: choices)
    python -m nsa.attention.kernels.aot --ptx DIR  # also each case's PTX, debug lines left out, in DIR: a change
                                                   # meant to keep the code (a jit helper drawn out) diffs empty

Each Triton module listed in KERNEL_MODULES defines `aot_cases()`: one AotCase per kernel and per block
configuration its autotuner (or launcher) may pick. Every case is compiled with `triton.compile` for sm_80 (A100)
and sm_90 (H100), always compiled (never from triton's cache), with the log of the ptxas -v that triton runs itself
(the one bundled in its wheel, with triton's own options) captured: registers and spill stores. A compile error,
a spill, or (where a case says it needs them) missing tensor-core instructions is a failure. The interpreter
(TRITON_INTERPRET=1) accepts things the compiler rejects (tl.dot on dimensions below 16, aranges that are not
powers of two); this is what catches them on a CPU-only machine.

This must run in a process where TRITON_INTERPRET is not set: under the interpreter, @triton.jit yields
interpreted functions, which cannot be compiled.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import multiprocessing
import os
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nsa.attention.kernels.common import interpreting

# The Triton kernel modules (each defines aot_cases()). A module is added here together with its kernels.
KERNEL_MODULES: tuple[str, ...] = ("nsa.attention.kernels.range_attn.host", "nsa.attention.kernels.selected_attn.host",
                                  "nsa.attention.kernels.selection.host", "nsa.attention.kernels.glue.host",
                                  "nsa.attention.kernels.selected_attn.index",
                                  "nsa.attention.kernels.cross_entropy.host")

TARGETS = (80, 90)  # compute capabilities: A100, H100


@dataclass(frozen=True)
class AotCase:
    """One kernel at one configuration.

    name        a stable label, e.g. "sel_fwd[BLOCK_M=64,hpg=6,d=64]"
    fn          the @triton.jit function
    signature   {argument: type} as triton.compile wants it ("*bf16", "*fp32", "i32", "fp32", "constexpr")
    constexprs  {argument: value} for every constexpr argument
    num_warps, num_stages  launch options the launcher uses for this configuration
    tensor_cores  the kernel's main products must appear as mma (sm_80) / mma or wgmma (sm_90) in the PTX
    divisible   integer arguments a real launch sees as multiples of 16 (strides of contiguous rows, ...): the
                JIT specialises them, so the ahead-of-time compile is told too. Pointer arguments are always
                compiled as 16-byte aligned, as the JIT specialises every torch allocation; without these hints
                loads and atomics compile scalar and registers are overstated.
    choice      the launch choice that alone runs this compile, as "<module constant> <value>" (e.g. "HOST_CHOICE
                fused"), or "<toggle> <value>" for a model setting (e.g. "NSA_LOSS fused"): one a GPU run has not
                qualified, beside the default path. Empty: the default path's (what `auto` launches). The CI
                compile test takes the default path's cases; the choices' run under -m slow (`--cases choices`),
                and the committed tables hold both.
    """

    name: str
    fn: object
    signature: dict
    constexprs: dict
    num_warps: int = 4
    num_stages: int = 2
    tensor_cores: bool = True
    divisible: tuple[str, ...] = ()
    choice: str = ""


CASE_SETS = ("all", "default", "choices")  # --cases: every case, the default path's (choice ""), the choices'


@dataclass
class AotResult:
    kernel: str
    target: str
    ok: bool
    error: str = ""
    registers: int | None = None
    shared_bytes: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    mma: bool = False
    wgmma: bool = False
    tensor_cores_expected: bool = True
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# Spills accepted where the alternative is worse: (case name, target, triton major.minor) -> (at most this many
# bytes of spill stores, why). They are reported in `notes`; any other spill is a problem.
ACCEPTED_SPILLS: dict[tuple[str, str, str], tuple[int, str]] = {
    # (triton 3.6's 44 bytes in the importance kernel at hpg 1, d_k 128 on sm_90 were a compile without the integer
    # arguments' 16-divisibility the JIT gives a launch; with it, 56 registers and no spill)
    ("_blocksel_topk_kernel[BM=64,BT=32,D=128,BC=32,hpg=3,bf16]", "sm_80", "3.9"): (
        8, "the fused top-k kernel (off the default path: select_method 'tiled') at hpg 3, d_k 128 on an A100, as the "
           "JIT compiles it under triton 3.9 (its 16-divisible arguments stated, 128 registers); without them it "
           "took 168 and did not spill; 3.6 does not spill there"),
}

_PTXAS_REGS = re.compile(r"Used (\d+) registers")
_PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def _triton():
    """The triton package with its compiler backends (GPUTarget, the bundled ptxas) loaded."""
    # triton is optional: this module (KERNEL_MODULES, the compile test's list) imports without it
    import triton.backends.compiler, triton.backends.nvidia.compiler  # noqa: E401

    return triton


def _compile(case: AotCase, cc: int):
    """(the compiled kernel, triton's ptxas -v log): triton.compile always compiles here (never from its cache) and
    prints the log of the ptxas it runs itself (knobs.nvidia.dump_ptxas_log), so that the registers and spills are
    those of the cubin triton builds, with its own ptxas options (triton 3.9 adds --regAllocOptLevel=2), from one
    ptxas run per compile."""
    triton = _triton()
    src = triton.compiler.ASTSource(fn=case.fn, signature=case.signature, constexprs=case.constexprs,
                                    attrs=_alignment_attrs(case))
    log = io.StringIO()
    with triton.knobs.nvidia.scope(), triton.knobs.compilation.scope():
        triton.knobs.nvidia.dump_ptxas_log = True
        triton.knobs.compilation.always_compile = True
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(src, target=triton.backends.compiler.GPUTarget("cuda", cc, 32),
                                      options={"num_warps": case.num_warps, "num_stages": case.num_stages})
    return compiled, log.getvalue()


def _ptxas_figures(log: str) -> tuple[int | None, int | None, int | None]:
    """(registers, spill stores, spill loads) from a ptxas -v log (None where the log does not say)."""
    regs = _PTXAS_REGS.search(log)
    spill = _PTXAS_SPILL.search(log)
    return (int(regs.group(1)) if regs else None, int(spill.group(1)) if spill else None,
            int(spill.group(2)) if spill else None)


def _alignment_attrs(case: AotCase) -> dict:
    """{(argument index,): [["tt.divisibility", 16]]} for pointers and the case's divisible integers."""
    unknown = set(case.divisible) - set(case.signature)
    if unknown:
        raise ValueError(f"{case.name}: divisible names unknown arguments {sorted(unknown)}")
    return {(i,): [["tt.divisibility", 16]] for i, (name, kind) in enumerate(case.signature.items())
            if (kind.startswith("*") or name in case.divisible) and kind != "constexpr"}


_DEBUG_LABEL = re.compile(r"\$L__tmp\d+:")  # the label of an inlined call's place, for the debug sections


def plain_ptx(ptx: str) -> str:
    """PTX without what moves when only the source's lines do: the .loc and .file directives, comments, blank lines,
    the debug labels of inlined calls ($L__tmpN:) and the debug sections. Two compiles of one kernel give the same
    text exactly when their instructions, registers and labels are the same."""
    keep = []
    for line in ptx.splitlines():
        text = line.strip()
        if text.startswith(".section") and ".debug" in text:
            break  # the debug sections come last
        if not text or text.startswith((".loc", ".file", "//")) or _DEBUG_LABEL.fullmatch(text):
            continue
        keep.append(line)
    return "\n".join(keep) + "\n"


def ptx_file_name(case: AotCase, cc: int) -> str:
    """<case name, with characters other than letters, digits and _.=,- as _>.sm_<cc>.ptx"""
    return re.sub(r"[^A-Za-z0-9_.=,-]", "_", case.name) + f".sm_{cc}.ptx"


def compile_case(case: AotCase, cc: int, ptx_dir: Path | None = None) -> AotResult:
    """One case for one target; with ptx_dir, its plain_ptx is written there too (ptx_file_name)."""
    triton = _triton()
    result = AotResult(kernel=case.name, target=f"sm_{cc}", ok=False, tensor_cores_expected=case.tensor_cores)
    try:
        compiled, log = _compile(case, cc)
    except Exception as exc:  # a compile error (ptxas's included) is the finding: report it, go on with the others
        lines = [line for line in str(exc).strip().splitlines() if line.strip()]
        ptxas = next((line for line in lines if "ptxas" in line and ("error" in line or "fatal" in line)), None)
        result.error = f"{type(exc).__name__}: {(ptxas or (lines[-1] if lines else '')).strip()}"
        result.problems.append("ptxas failed" if ptxas or "ptxas" in str(exc) else "compile error")
        return result
    ptx = compiled.asm["ptx"]
    if ptx_dir is not None:
        Path(ptx_dir).mkdir(parents=True, exist_ok=True)
        (Path(ptx_dir) / ptx_file_name(case, cc)).write_text(plain_ptx(ptx))
    result.shared_bytes = int(getattr(compiled.metadata, "shared", 0))
    result.mma = bool(re.search(r"\bmma\.sync", ptx))
    result.wgmma = "wgmma.mma_async" in ptx
    result.registers, result.spill_stores, result.spill_loads = _ptxas_figures(log)
    if result.registers is None:
        result.problems.append("no ptxas -v figures in triton's ptxas log")
    if result.spill_stores:
        version = ".".join(triton.__version__.split(".")[:2])
        limit, why = ACCEPTED_SPILLS.get((case.name, result.target, version), (0, ""))
        if result.spill_stores <= limit:
            result.notes.append(f"{result.spill_stores} bytes of spill stores accepted under triton {version}: {why}")
        else:
            result.problems.append(f"{result.spill_stores} bytes of spill stores")
    if case.tensor_cores and not (result.mma or result.wgmma):
        result.problems.append("no tensor-core instruction (mma/wgmma) in the PTX")
    result.ok = not result.problems
    return result


def _compile_key(case: AotCase) -> tuple:
    """What triton.compile is given for a case (its name aside): two cases with one key compile alike."""
    return (id(case.fn), repr(case.signature), repr(sorted(case.constexprs.items(), key=str)), case.num_warps,
            case.num_stages, tuple(sorted(case.divisible)), case.tensor_cores, case.choice)


def all_cases(which: str = "all") -> list[AotCase]:
    """Every module's aot_cases(), in KERNEL_MODULES order, each compile once (a later case that compiles as an
    earlier one is left out); which: "all", "default" (the default path's: no choice) or "choices" (the launch
    choices' alone; AotCase.choice)."""
    if which not in CASE_SETS:
        raise ValueError(f"aot cases: which must be one of {', '.join(CASE_SETS)}, got {which!r}")
    cases: list[AotCase] = []
    seen: set[tuple] = set()
    for module in KERNEL_MODULES:
        for case in importlib.import_module(module).aot_cases():
            # a configuration two geometries share (the gate combine depends on d_v alone) is compiled once
            key = _compile_key(case)
            if key not in seen:
                seen.add(key)
                cases.append(case)
    if which == "all":
        return cases
    return [c for c in cases if bool(c.choice) == (which == "choices")]


_CASES: list[AotCase] = []  # a worker's copy of all_cases() (forked from the parent, which filled it)


def _compile_nth(job: tuple[int, int, Path | None]) -> AotResult:
    return compile_case(_CASES[job[0]], job[1], job[2])


def compile_all(targets=TARGETS, jobs: int | None = None, which: str = "all",
                ptx_dir: Path | None = None) -> list[AotResult]:
    """Every case of all_cases(which) for every target, in that order; `jobs` compiles in that many forked
    processes (default: one per CPU; each compile is one core's work, ~0.1-5 s); ptx_dir: compile_case's."""
    if interpreting():  # TRITON_INTERPRET as Triton reads it
        raise RuntimeError("TRITON_INTERPRET is set: interpreted kernels cannot be compiled ahead of time "
                           "(run this in a process without it)")
    _CASES[:] = all_cases(which)
    work = [(i, cc, ptx_dir) for i in range(len(_CASES)) for cc in targets]
    jobs = min(jobs or os.cpu_count() or 1, len(work))
    if jobs <= 1 or sys.platform != "linux":
        return [_compile_nth(job) for job in work]
    # fork: the workers inherit the imported kernel modules and _CASES (no CUDA context exists in this process)
    with multiprocessing.get_context("fork").Pool(jobs) as pool:
        return pool.map(_compile_nth, work, chunksize=1)


REPORTS = Path(__file__).resolve().parents[3] / "reports" / "aot"  # this table per triton version, committed


def report_path(version: str) -> Path:
    """reports/aot/triton-<major.minor>.md: the table this module prints, as committed for that triton version."""
    return REPORTS / f"triton-{'.'.join(version.split('.')[:2])}.md"


def table(results: list[AotResult], version: str) -> str:
    """The printed report: a line naming the triton version, then one row per (case, target)."""
    return (f"Every Triton kernel case compiled ahead of time with triton {version} (`python -m "
            f"nsa.attention.kernels.aot`; registers and spill stores from the log of the ptxas -v triton runs):\n\n"
            + _table(results) + "\n")


def _table(results: list[AotResult]) -> str:
    rows = ["| kernel | target | ok | registers | shared (B) | spill stores | mma | wgmma | problems |",
            "|---|---|---|---:|---:|---:|---|---|---|"]
    for r in results:
        rows.append(f"| {r.kernel} | {r.target} | {'yes' if r.ok else 'NO'} | {r.registers} | {r.shared_bytes} | "
                    f"{r.spill_stores} | {'yes' if r.mma else 'no'} | {'yes' if r.wgmma else 'no'} | "
                    f"{'; '.join(r.problems + r.notes) or '-'}{(' (' + r.error + ')') if r.error else ''} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nsa.attention.kernels.aot",
                                     description="Compile every Triton kernel for sm_80 and sm_90 without a GPU.")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--target", type=int, action="append", help="compute capability (default: 80 and 90)")
    parser.add_argument("--jobs", type=int, default=None, help="compile processes (default: one per CPU)")
    parser.add_argument("--cases", choices=CASE_SETS, default="all",
                        help="every case (default: the committed tables), the default path's only, or the launch "
                             "choices' only (AotCase.choice)")
    parser.add_argument("--ptx", type=Path, default=None, metavar="DIR",
                        help="also write each case's PTX in DIR, without its debug lines (plain_ptx), one file a case "
                             "and target: `diff -r` of two such folders shows what a change did to the code")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if args.ptx is not None and args.ptx.exists() and not args.ptx.is_dir():
        parser.error(f"--ptx must name a folder, {args.ptx} is a file")
    results = compile_all(tuple(args.target) if args.target else TARGETS, args.jobs, args.cases, args.ptx)
    sys.stdout.write(json.dumps([asdict(r) for r in results], indent=1) + "\n" if args.json
                     else table(results, _triton().__version__))
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
