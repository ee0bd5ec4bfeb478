"""The selected branch's dQ choices compiled ahead of time (no GPU): registers, spills, CTAs per SM, shared memory and
tensor-core instructions of the backward's dQ-carrying kernels, the shipped "atomic" choice (_sel_bwd_kv with dQ
atomics) beside "query" (_sel_bwd_kv without dQ and _sel_bwd_dq_query), for sm_80 and sm_90 with the installed
triton (nsa.attention.kernels.selected_attn.host.DQ_CHOICES, bwd_aot_cases).

    python benchmarks/aot_selected_bwd_dq.py                        # markdown rows for this triton
    python benchmarks/aot_selected_bwd_dq.py --part fwd             # the kv forward's output choices (OUT_CHOICES)
    python benchmarks/aot_selected_bwd_dq.py --part tile            # its tile choices (FWD_TILE_CHOICES), d 64
    PYTHONPATH=/tmp/t36 python benchmarks/aot_selected_bwd_dq.py    # triton 3.6.0 installed on its own

Nothing here is a GPU timing. reports/aot/selected_bwd_dq.md holds the output under triton 3.9 and 3.6 (--part tile:
reports/aot/selected_fwd_occupancy.md).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

# (hpg, d) compiled: the m7c shape first (12 heads, 2 KV groups, d 64), then other row tilings and head dims
SHAPES = ((6, 64), (1, 64), (16, 64), (6, 32), (6, 128))


def _cases(part: str, shapes):
    """(hpg, d, choice, case) of the backward's dQ choices ("bwd") or of the kv forward's output choices at the
    m7c shape ("fwd": sel_fwd_kv_out, the shipped "atomic", beside "partial")."""
    from nsa.attention.kernels.selected_attn import host as ts

    if part == "bwd":
        return [(hpg, d, choice, case) for hpg, d in shapes for choice in ts.DQ_CHOICES
                for case in ts.bwd_aot_cases(hpg, d, choice)]
    if part == "tile":  # the kv forward's tile choices, at d = 64 (the choices' head dim) for each hpg
        return [(hpg, d, choice, case) for hpg, d in (*shapes, (32, 64)) if d == 64 for choice in ts.FWD_TILE_CHOICES
                for case in ts.fwd_tile_aot_cases(hpg, d, choice)]
    hpg, d = shapes[0]
    shipped = [c for c in ts.aot_cases() if c.name.startswith(f"sel_fwd_kv_out[hpg={hpg},d={d},")]
    return [(hpg, d, "atomic", c) for c in shipped] + [(hpg, d, "partial", c) for c in ts.fwd_out_aot_cases(hpg, d)]


def rows(shapes=SHAPES, part: str = "bwd") -> list[dict]:
    from tune_kernels import ctas_per_sm

    from nsa.attention.kernels import aot

    out = []
    for hpg, d, choice, case in _cases(part, shapes):
        for cc in aot.TARGETS:
            r = aot.compile_case(case, cc)
            ctas, limit = ctas_per_sm(r.registers, r.shared_bytes or 0, case.num_warps, cc) if r.registers \
                else (None, "-")
            cores = " + ".join(n for n, on in (("wgmma", r.wgmma), ("mma.sync", r.mma)) if on) or "none"
            out.append(dict(hpg=hpg, d=d, choice=choice, kernel=case.name, warps=case.num_warps,
                            stages=case.num_stages, target=r.target, ok=r.ok, registers=r.registers,
                            spills=r.spill_stores, shared=r.shared_bytes, ctas=ctas, limit=limit, cores=cores,
                            problems="; ".join(r.problems) + (f" ({r.error})" if r.error else "")))
    return out


def markdown(found: list[dict], version: str, title: str = "") -> str:
    lines = [f"### triton {version}{title}", "",
             "| hpg, d | choice | kernel | warps, stages | target | registers | spill stores | CTAs/SM (limited by) "
             "| shared (B) | tensor cores | problems |",
             "|---|---|---|---|---|---:|---:|---|---:|---|---|"]
    for r in found:
        lines.append(f"| {r['hpg']}, {r['d']} | {r['choice']} | {r['kernel']} | {r['warps']}, {r['stages']} | "
                     f"{r['target']} | {r['registers']} | {r['spills']} | {r['ctas']} ({r['limit']}) | {r['shared']} | "
                     f"{r['cores']} | {r['problems'] or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("bwd", "fwd", "tile"), default="bwd",
                    help="bwd: the backward's dQ choices (default); fwd: the kv forward's output choices, m7c shape; "
                         "tile: the kv forward's tile choices (FWD_TILE_CHOICES), d 64")
    args = ap.parse_args(argv)
    from nsa.attention.kernels.common import interpreting  # as Triton reads TRITON_INTERPRET

    if interpreting():
        raise SystemExit("TRITON_INTERPRET is set: the kernels cannot be compiled ahead of time")
    import triton

    found = rows(part=args.part)
    title = {"bwd": "", "fwd": ", kv forward output choices", "tile": ", kv forward tile choices"}[args.part]
    sys.stdout.write(markdown(found, triton.__version__, title))
    return 0 if all(r["ok"] for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
