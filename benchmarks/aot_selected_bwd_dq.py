"""The selected branch's dQ choices compiled ahead of time (no GPU): registers, spills, CTAs per SM, shared memory and
tensor-core instructions of the backward's dQ-carrying kernels, the shipped "atomic" choice (_sel_bwd_kv with dQ
atomics) beside "query" (_sel_bwd_kv without dQ and _sel_bwd_dq_query), for sm_80 and sm_90 with the installed
triton (nsa.attention.kernels.selected_attn.host.DQ_CHOICES, bwd_aot_cases).

    python benchmarks/aot_selected_bwd_dq.py                        # markdown rows for this triton
    PYTHONPATH=/tmp/t36 python benchmarks/aot_selected_bwd_dq.py    # triton 3.6.0 installed on its own

Nothing here is a GPU timing. reports/aot/selected_bwd_dq.md holds the output under triton 3.9 and 3.6.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

# (hpg, d) compiled: the m7c shape first (12 heads, 2 KV groups, d 64), then other row tilings and head dims
SHAPES = ((6, 64), (1, 64), (16, 64), (6, 32), (6, 128))


def rows(shapes=SHAPES) -> list[dict]:
    from tune_kernels import ctas_per_sm

    from nsa.attention.kernels import aot
    from nsa.attention.kernels.selected_attn import host as ts

    out = []
    for hpg, d in shapes:
        for choice in ts.DQ_CHOICES:
            for case in ts.bwd_aot_cases(hpg, d, choice):
                for cc in aot.TARGETS:
                    r = aot.compile_case(case, cc)
                    ctas, limit = ctas_per_sm(r.registers or 255, r.shared_bytes or 0, case.num_warps, cc) \
                        if r.registers else (None, "-")
                    out.append(dict(hpg=hpg, d=d, choice=choice, kernel=case.name, warps=case.num_warps,
                                    stages=case.num_stages, target=r.target, ok=r.ok, registers=r.registers,
                                    spills=r.spill_stores, shared=r.shared_bytes, ctas=ctas, limit=limit,
                                    cores=" + ".join(n for n, on in (("wgmma", r.wgmma), ("mma.sync", r.mma)) if on) or "none",
                                    problems="; ".join(r.problems) + (f" ({r.error})" if r.error else "")))
    return out


def markdown(found: list[dict], version: str) -> str:
    lines = [f"### triton {version}", "",
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
    ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("TRITON_INTERPRET is set: the kernels cannot be compiled ahead of time")
    import triton

    found = rows()
    sys.stdout.write(markdown(found, triton.__version__))
    return 0 if all(r["ok"] for r in found) else 1


if __name__ == "__main__":
    sys.exit(main())
