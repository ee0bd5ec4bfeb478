"""Every Triton kernel compiles for sm_80 (A100) and sm_90 (H100) with no GPU: tensor-core instructions in the PTX,
0 bytes of spill stores reported by the bundled `ptxas -v` (nsa.attention.kernels.aot).

The compiler runs in a subprocess without TRITON_INTERPRET (this session may have set it for the interpreter
tests). Registers and shared memory per kernel are printed; the kernels' docstrings record them.
"""

import importlib.metadata
import json
import subprocess
import sys

import pytest

from triton_test_utils import ON_GPU, compile_env, needs_triton
from nsa.attention.kernels import aot
from nsa.attention.kernels.aot import KERNEL_MODULES

# Kernels whose main products must compile to Hopper's wgmma on sm_90 (the others use mma.sync there).
WGMMA_ON_SM90: set[str] = {"range_fwd", "range_dq", "range_dkdv", "sel_fwd_kv_stats", "sel_fwd_kv_out",
                           "_blocksel_topk_kernel", "_blocksel_importance_kernel", "_blocksel_keys_kernel",
                           "_blocksel_rows_kernel"}


def _compile(which: str, ptx_dir=None) -> list[dict]:
    """`python -m nsa.attention.kernels.aot --json --cases which [--ptx ptx_dir]`, in a process without
    TRITON_INTERPRET."""
    cmd = [sys.executable, "-m", "nsa.attention.kernels.aot", "--json", "--cases", which]
    proc = subprocess.run(cmd + (["--ptx", str(ptx_dir)] if ptx_dir else []), capture_output=True, text=True,
                          env=compile_env(), timeout=900)
    assert proc.stdout.strip(), f"aot printed nothing; stderr:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


def _table_rows(text: str) -> list[str]:
    """A table's rows, its header and rule left out."""
    return [line for line in text[text.index("| kernel |"):].splitlines() if line.startswith("| ")][1:]


def _check_compiled(results: list[dict], which: str):
    for r in results:
        print(f"{r['kernel']:<60} {r['target']}: {r['registers']} regs, {r['shared_bytes']} B shared, "
              f"spills {r['spill_stores']}, mma {r['mma']}, wgmma {r['wgmma']} {'; '.join(r['problems'])}")
    assert len(results) == 2 * len(aot.all_cases(which))
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
    # the committed table for this triton version (reports/aot/) holds what the compile prints now, row for row;
    # checked where CI runs it (no GPU), so that a stale table never turns a GPU qualification run NO-GO
    version = importlib.metadata.version("triton")
    committed = aot.report_path(version)
    if committed.exists() and not ON_GPU:
        fresh = _table_rows(aot.table([aot.AotResult(**r) for r in results], version))
        rows = set(_table_rows(committed.read_text()))
        stale = [row for row in fresh if row not in rows]
        assert not stale, (
            f"{committed} is not what the compile prints now ({len(stale)} rows differ, first: {stale[0]}): "
            f"`python -m nsa.attention.kernels.aot > {committed}` (in an environment with triton {version})")


@needs_triton
@pytest.mark.skipif(not KERNEL_MODULES, reason="no Triton kernel modules registered yet")
def test_every_kernel_compiles_for_sm80_and_sm90_without_spills(tmp_path):
    """The default path's cases (AotCase.choice empty): what `auto` launches; --ptx writes each one's PTX from the
    compile processes."""
    _check_compiled(_compile("default", tmp_path), "default")
    files = {aot.ptx_file_name(c, cc): c for c in aot.all_cases("default") for cc in aot.TARGETS}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)  # one file a case and target, none shared
    for name, case in files.items():
        text = (tmp_path / name).read_text()
        words = [line.split() for line in text.splitlines()]
        assert any(".entry" in w for w in words) and not any(w[0] in (".loc", ".file") for w in words if w), name
        assert "mma" in text or not case.tensor_cores, name


@needs_triton
@pytest.mark.slow
@pytest.mark.skipif(not KERNEL_MODULES, reason="no Triton kernel modules registered yet")
def test_every_launch_choices_kernel_compiles_for_sm80_and_sm90_without_spills():
    """The launch choices' own cases (AotCase.choice: the kernels of choices no GPU run has qualified yet, beside
    the default path); a third of the compile time, so under -m slow in CI (run by default on a GPU)."""
    _check_compiled(_compile("choices"), "choices")


@needs_triton
def test_the_committed_tables_list_every_case_for_both_targets():
    """reports/aot/triton-<version>.md lists every case of all_cases() for sm_80 and sm_90 in order, the choices'
    included (whose rows the slow compile test checks): a case added or renamed without regenerating the tables is
    seen without compiling anything."""
    names = [(c.name, f"sm_{cc}") for c in aot.all_cases() for cc in aot.TARGETS]
    for path in sorted(aot.REPORTS.glob("triton-*.md")):
        listed = [tuple(cell.strip() for cell in row.split("|")[1:3]) for row in _table_rows(path.read_text())]
        assert listed == names, (f"{path.name} lists other cases than all_cases(): regenerate it with "
                                 f"`python -m nsa.attention.kernels.aot > {path}` under that triton version")


def test_case_sets_split_the_cases_by_choice():
    every = aot.all_cases()
    default, choices = aot.all_cases("default"), aot.all_cases("choices")
    assert default and choices and len(default) + len(choices) == len(every)
    assert all(not c.choice for c in default) and all(c.choice for c in choices)
    assert {c.name for c in default} | {c.name for c in choices} == {c.name for c in every}
    with pytest.raises(ValueError, match="which must be one of"):
        aot.all_cases("some")


_SPILL_SCRIPT = r"""
import json, triton
from nsa.attention.kernels import aot
case = min(aot.all_cases(), key=lambda c: len(c.signature))  # a small kernel: a quick real compile
version = ".".join(triton.__version__.split(".")[:2])
aot._ptxas_figures = lambda log: (200, 44, 44)
out = {}
aot.ACCEPTED_SPILLS = {(case.name, "sm_90", version): (64, "a stated reason")}
for name, cc in (("accepted", 90), ("other_target", 80)):
    r = aot.compile_case(case, cc)
    out[name] = {"ok": r.ok, "problems": r.problems, "notes": r.notes}
aot.ACCEPTED_SPILLS = {(case.name, "sm_90", version): (32, "too few bytes")}
r = aot.compile_case(case, 90)
out["over"] = {"ok": r.ok, "problems": r.problems, "notes": r.notes}
print(json.dumps(out))
"""


@needs_triton
def test_a_spill_is_a_problem_unless_accepted_for_that_kernel_target_and_triton():
    """aot.ACCEPTED_SPILLS names (kernel case, target, triton major.minor) -> (at most N bytes, why): within it a
    spill is a note; above it, or for any other case, target or version, a problem. (A real compile of a small
    kernel, with ptxas's report replaced by a 44-byte spill; in a process without TRITON_INTERPRET, which would
    turn the kernels into interpreted functions for every later test of this session.)"""
    env = compile_env()
    proc = subprocess.run([sys.executable, "-c", _SPILL_SCRIPT], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    accepted = out["accepted"]
    assert accepted["ok"] and accepted["problems"] == [] and "a stated reason" in accepted["notes"][0]
    assert not out["other_target"]["ok"] and out["other_target"]["problems"] == ["44 bytes of spill stores"]
    assert not out["over"]["ok"] and out["over"]["problems"] == ["44 bytes of spill stores"]


_PRECISION_SCRIPT = r"""
import dataclasses, json
from nsa.attention.kernels import aot
from nsa.attention.kernels.range_attn import host as triton_range
from nsa.attention.kernels.selected_attn import host as triton_selected
cases = {"range_fwd": next(c for c in triton_range.aot_cases(dims=((32, 32),), dtype="fp32")
                          if c.name.startswith("range_fwd")),
         "sel_fwd_query": next(c for c in triton_selected.aot_cases() if c.name.startswith("sel_fwd_query[hpg=6,d=32"))}
out = {}
for name, case in cases.items():
    sig = {k: "*fp32" if v == "*bf16" else v for k, v in case.signature.items()}
    for prec in ("ieee", "tf32"):
        c = dataclasses.replace(case, signature=sig, constexprs={**case.constexprs, "DOT_PREC": prec})
        r = aot.compile_case(c, 80)
        assert not r.error, r.error
        out[f"{name}/{prec}"] = r.mma
print(json.dumps(out))
"""


@needs_triton
def test_fp32_products_are_ieee_or_tf32_as_dot_prec_says():
    """The range and selected kernels' constexpr DOT_PREC reaches every tl.dot: fp32 operands compile to tensor-core
    mma (TF32) under "tf32" and to none under "ieee" (sm_80, a real compile; nsa.attention.kernels.common.
    dot_precision picks it at launch, test_dot_precision checks that pick)."""
    env = compile_env()
    proc = subprocess.run([sys.executable, "-c", _PRECISION_SCRIPT], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"range_fwd/ieee": False, "range_fwd/tf32": True, "sel_fwd_query/ieee": False,
                   "sel_fwd_query/tf32": True}, out


def test_a_configuration_two_geometries_share_is_compiled_once(monkeypatch):
    """The gate combine depends on d_v alone: the d 128 and the d_k 64 / d_v 128 geometries both listed its d_v 128
    case, compiled twice in CI; all_cases keeps the first of cases that compile alike, and no other."""
    import types

    def kernel():  # stands for a @triton.jit function: all_cases compiles nothing
        pass

    def case(name, d_v, warps=4):
        return aot.AotCase(name=name, fn=kernel, signature={"X": "*bf16", "D_V": "constexpr"},
                           constexprs={"D_V": d_v}, num_warps=warps)

    module = types.ModuleType("fake_kernels")
    module.aot_cases = lambda: [case("combine[128]", 128), case("combine[64]", 64), case("combine[128] again", 128),
                                case("combine[128] 8 warps", 128, warps=8)]
    monkeypatch.setitem(sys.modules, "fake_kernels", module)
    monkeypatch.setattr(aot, "KERNEL_MODULES", ("fake_kernels",))
    assert [c.name for c in aot.all_cases()] == ["combine[128]", "combine[64]", "combine[128] 8 warps"]


@needs_triton
def test_the_shipped_cases_compile_alike_at_most_once():
    keys = [aot._compile_key(c) for c in aot.all_cases()]
    assert len(keys) == len(set(keys))


def test_plain_ptx_drops_what_moves_with_the_source_lines_only():
    """Two compiles of one kernel whose source lines moved (a docstring grew, a jit helper was drawn out) differ in
    .loc and .file lines, the $L__tmp labels of inlined calls and the debug sections; plain_ptx leaves those out and
    keeps every instruction and branch label, so that a changed instruction still shows."""
    body = ["\tld.global.b32 \t%r1, [%rd1];", "$L__BB0_2:", "\tmul.f32 \t%r2, %r1, %r1;", "\tret;", "}"]

    def compiled(loc: int, *extra):
        return "\n".join([".version 8.7", "// begin inline asm", ".file 1 \"/src/jit.py\"", ".visible .entry k(",
                          ")", "{", f"\t.loc 1 {loc} 5", "$L__tmp0:", body[0], "", f"\t.loc 1 {loc + 3} 9",
                          *extra, *body[1:], "\t.section\t.debug_abbrev", "{", ".b8 1", "}"])

    a, b = aot.plain_ptx(compiled(40)), aot.plain_ptx(compiled(77, "$L__tmp1:"))
    assert a == b
    assert "$L__BB0_2:" in a and "mul.f32" in a and ".entry k(" in a
    assert ".loc" not in a and ".file" not in a and "$L__tmp" not in a and "debug" not in a and "//" not in a
    assert aot.plain_ptx(compiled(40).replace("mul.f32", "add.f32")) != a


_HELPER_KERNELS = {
    "inline": """
import triton
import triton.language as tl

@triton.jit
def kernel(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    x = tl.load(X + i, mask=m, other=0.0)
    lo = tl.minimum(x, 0.0)
    hi = tl.maximum(x, 0.0)
    tl.store(Y + i, hi * hi - lo, mask=m)
""",
    "helper": """
import triton
import triton.language as tl

@triton.jit
def _parts(X, i, m):
    \"\"\"a helper returning a tuple, as the kernels' _tile_key and _tile_pv do\"\"\"
    x = tl.load(X + i, mask=m, other=0.0)
    return tl.minimum(x, 0.0), tl.maximum(x, 0.0)


@triton.jit
def kernel(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    lo, hi = _parts(X, i, m)
    tl.store(Y + i, hi * hi - lo, mask=m)
""",
    "changed": """
import triton
import triton.language as tl

@triton.jit
def kernel(X, Y, N, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < N
    x = tl.load(X + i, mask=m, other=0.0)
    tl.store(Y + i, x * x, mask=m)
"""}


@needs_triton
def test_a_jit_helper_drawn_out_compiles_to_the_same_plain_ptx(tmp_path):
    """What --ptx is for: one kernel written inline and with its start drawn out into a jit helper (returning a
    tuple) compiles, at other source lines, to the same plain PTX for sm_90; a kernel that computes something else
    does not."""
    for name, source in _HELPER_KERNELS.items():
        (tmp_path / f"k_{name}.py").write_text(source)
    script = (
        "import importlib, sys\n"
        "from pathlib import Path\n"
        "from nsa.attention.kernels import aot\n"
        "for name in sys.argv[2:]:\n"
        "    fn = importlib.import_module('k_' + name).kernel\n"
        "    case = aot.AotCase(name=name, fn=fn, signature={'X': '*fp32', 'Y': '*fp32', 'N': 'i32', "
        "'BLOCK': 'constexpr'}, constexprs={'BLOCK': 128}, tensor_cores=False)\n"
        "    result = aot.compile_case(case, 90, Path(sys.argv[1]))\n"
        "    assert result.ok, result\n")
    env = compile_env(str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "ptx"), *_HELPER_KERNELS], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ptx = {name: (tmp_path / "ptx" / f"{name}.sm_90.ptx").read_text() for name in _HELPER_KERNELS}
    assert ptx["inline"] == ptx["helper"]
    assert ptx["changed"] != ptx["inline"]
