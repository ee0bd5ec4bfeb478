"""Launch configurations of the kernels that dominate the NSA layer on a GPU, timed against the shipped one.

    python benchmarks/tune_kernels.py --aot                       # no GPU: which candidates compile without spills
    python benchmarks/tune_kernels.py --device cuda               # GPU: time every candidate that compiles cleanly
    python benchmarks/tune_kernels.py --device cuda --families range_dkdv,sel_bwd --seq-lens 65536 --batch 1
    python benchmarks/tune_kernels.py --device cuda --families range_q --dry-run    # check the options, list the cases

The profile of one layer (benchmarks/profile_layer.py; reports/gpu/2026-11-26) puts most of the GPU time in four
kernel families: the range kernels' forward and dQ (`range_q`: nsa.attention.kernels.range_attn.host.fwd_config /
dq_config), their dK/dV (`range_dkdv`: dkdv_config; 13.6 of 43 ms at S = 65,536), the selected branch's backward
(`sel_bwd`: selected_attn.host._config("bwd", ...); 7.6 ms there, the largest kernel at S = 2,048) and its forward passes
(`sel_fwd`: _config("stats"/"out")). Their configurations were chosen from the ahead-of-time compile (no spills,
tensor cores), never from GPU timings. Each family here lists candidate configurations; candidate 0 is the shipped
one. After range_dkdv's tuples come names of range_attn.host.DKDV_CHOICES (a tile and the compressed branch's dK/dV
split, chosen through DKDV_CHOICE), after range_q's names of QUERY_CHOICES (the forward and the dQ tile, chosen
through QUERY_CHOICE); `--candidates` picks some by index or name, e.g. the A/Bs of reports/aot/
range_dkdv_occupancy.md and reports/aot/range_query_occupancy.md:

    python benchmarks/tune_kernels.py --device cuda --all --families range_dkdv \
        --candidates w4s1_split,split,bn32_w4_split,w4s1 --seq-lens 65536 --batch 1 --repeats 5 --warmup 1
    python benchmarks/tune_kernels.py --device cuda --all --families range_q \
        --candidates bn32,bn32_s3,m64_bn32,1 --seq-lens 65536,2048 --batch 1,8 --repeats 5 --warmup 1

`--aot` compiles every candidate's kernels for sm_80 and sm_90 with the installed triton (no GPU) and reports
registers, spill stores and the CTAs per SM they allow (`--markdown`: one row per kernel and target): a candidate
that spills is left out of the timing unless `--all`.

On a GPU each (family, candidate, S) is one subprocess (a candidate that faults loses only its own row): at the m7c
shape (B x S tokens, H 12, G 2, d 64, bf16; window 512, l 32, d 16, l_sel 64, n_sel 16) it runs the family's
branches forward and backward with the shipped configuration and with the candidate, alternately (shipped,
candidate, shipped, ... : drift falls on both), `--warmup` untimed then `--repeats` timed passes each, and reports
min / median / max of the forward and the backward time of each, the ratio of the medians (candidate / shipped,
below 1 is faster) and the largest difference of the candidate's outputs and gradients from the shipped
configuration's, relative to the largest shipped value (configurations change the summation order only: a
difference above 2e-2 in bf16 marks the row WRONG). The command that reproduces the table is printed first; the
JSON (`--json`) holds every row (a case that failed or timed out: its "error", and the script exits 1). A benchmark,
not a test: it reports and changes nothing; adopt a faster candidate by editing the configuration function, then
rerun runbooks/gpu_kernels.yaml.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# (block_m, block_n, num_warps, num_stages) for the range kernels; (block_r, block_n, num_warps, num_stages) for
# the selected branch's (sel_fwd: both forward passes take it). Candidate 0 of each family (None) is what the
# launcher ships (range: 128 x 64 rows / keys, 8 warps for forward and dQ, QUALIFIED_QUERY "shipped", and the tuples
# replace both kernels' tile; dK/dV: the qualified choice of
# range_attn.host.QUALIFIED_DKDV, since 2026-11-28 w4s1_split: 32 x 64, 4 warps, 1 stage, the finer cmp split, and
# the tuples below change its tile only; name "shipped" to time the 8-warp tile before it ("w4s1_split" is now
# candidate 0 itself: an A/A); selected:
# 128 x 64 with 4 warps for its stats pass and 8 for its output pass, 32 x 64, 8 warps for backward; d = 64).
FAMILIES: dict[str, tuple] = {
    # after the tuples, names of range_attn.host.QUERY_CHOICES: the forward and the dQ tile (issue 31 item 2.5)
    "range_q": (None, (64, 64, 4, 2), (128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 8, 2), (64, 128, 4, 2),
                "bn32", "bn32_s3", "m64_bn32"),
    # after the tuples, names of range_attn.host.DKDV_CHOICES: a tile and the cmp launch's split (issue 31 item 2.1)
    "range_dkdv": (None, (32, 64, 4, 2), (32, 64, 8, 3), (64, 64, 8, 2), (32, 128, 8, 2), (64, 64, 4, 2),
                   "w4s1", "w4s1_split", "bn32_w4_split", "split", "shipped"),
    "sel_bwd": (None, (32, 64, 4, 1), (64, 64, 8, 1), (32, 64, 8, 2), (64, 64, 4, 1), (32, 32, 4, 1)),
    "sel_fwd": (None, (64, 64, 4, 1), (128, 64, 8, 2), (128, 128, 8, 1), (64, 64, 8, 1), (128, 64, 4, 1)),
}
SHAPE = dict(h=12, g=2, d=64, w=512, l=32, stride=16, l_sel=64, n_sel=16)
WRONG = 2e-2  # relative difference from the shipped configuration's outputs above which a row is WRONG (bf16)


# Register file and shared memory per SM (bytes usable by CTAs, with the 1 KiB each CTA reserves) of the targets:
# CTAs per SM = the smallest of what registers (allocated per warp in units of 256: 8 a thread), shared memory,
# threads (2,048) and the 32-block limit allow.
REGS_PER_SM = 65536
SHARED_PER_SM = {80: 167936, 90: 233472}
SHARED_RESERVED = 1024


def ctas_per_sm(registers: int, shared_bytes: int, num_warps: int, cc: int) -> tuple[int, str]:
    """(CTAs per SM, what limits it) of a kernel using `registers` a thread and `shared_bytes` a CTA."""
    regs_per_warp = -(-max(registers, 1) // 8) * 8 * 32
    limits = {"registers": REGS_PER_SM // (regs_per_warp * num_warps),
              "shared memory": SHARED_PER_SM[cc] // (shared_bytes + SHARED_RESERVED),
              "threads": 2048 // (32 * num_warps), "blocks": 32}
    low = min(limits.values())
    return low, "/".join(k for k, v in limits.items() if v == low)


def _label(cand) -> str:
    if isinstance(cand, str):
        return cand
    return "shipped" if cand is None else str(list(cand))


def _select(cands: str | None, family: str) -> list[int]:
    """Candidate indices (>= 1) named by --candidates (indices or the family's choice names; None: all)."""
    every = list(range(1, len(FAMILIES[family])))
    if not cands:
        return every
    out = []
    for c in (x.strip() for x in cands.split(",") if x.strip()):
        if c.isdigit() and int(c) in every:
            i = int(c)
        elif c in FAMILIES[family]:
            i = FAMILIES[family].index(c)
        else:
            raise ValueError(f"--candidates: {c!r} is not a candidate of {family} (1-{len(every)} or a name: "
                             f"{', '.join(x for x in FAMILIES[family] if isinstance(x, str)) or 'none'})")
        if i not in out:
            out.append(i)
    return out


def _patch(family: str, cand):
    """Make the launchers pick `cand` for `family` (None: what they ship); returns a function that undoes it."""
    if cand is None:
        return lambda: None
    from nsa.attention.kernels.range_attn import host as tr
    from nsa.attention.kernels.selected_attn import host as ts

    if isinstance(cand, str):  # a named choice: dK/dV's tile and split, or the forward and dQ tiles
        attr, choices = ("QUERY_CHOICE", tr.QUERY_CHOICES) if family == "range_q" else ("DKDV_CHOICE", tr.DKDV_CHOICES)
        saved_choice = getattr(tr, attr)
        if cand not in choices:
            raise ValueError(f"{family}: {cand!r} is not one of {', '.join(choices)}")
        setattr(tr, attr, cand)
        return lambda: setattr(tr, attr, saved_choice)
    if family in ("range_q", "range_dkdv"):
        # a tuple: the forward and dQ launches both take it (fwd_config, dq_config; query_config too)
        names = ("query_config", "fwd_config", "dq_config") if family == "range_q" else ("dkdv_config",)
        saved = {name: getattr(tr, name) for name in names}
        cfg = tr.LaunchConfig(*cand)
        for name in names:
            setattr(tr, name, lambda d_k, d_v: cfg)
        return lambda: [setattr(tr, name, fn) for name, fn in saved.items()]
    saved = ts._config
    kinds = ("bwd",) if family == "sel_bwd" else ("stats", "out")

    def config(kind, hpg, d_k, d_v):
        if kind in kinds:
            return max(cand[0], ts._pow2(hpg)), cand[1], cand[2], cand[3]
        return saved(kind, hpg, d_k, d_v)

    ts._config = config
    return lambda: setattr(ts, "_config", saved)


def aot_report(families: list[str], candidates: str | None = None) -> list[dict]:
    """Every candidate's kernels (or those --candidates names, and the shipped one) compiled for sm_80 and sm_90
    (installed triton, no GPU): registers, spills and the CTAs per SM they allow (`kernels`: one entry each)."""
    from nsa.attention.kernels import aot
    from nsa.attention.kernels.range_attn import host as triton_range
    from nsa.attention.kernels.selected_attn import host as triton_selected

    rows = []
    for family in families:
        for i in [0, *_select(candidates, family)]:
            cand = FAMILIES[family][i]
            undo = _patch(family, cand)
            try:
                if family == "range_q":  # aot_cases holds the launcher's forward and dQ pick: one case each
                    cases = [c for c in triton_range.aot_cases(dims=((64, 64),))
                             if c.name.startswith(("range_fwd[", "range_dq["))]
                elif family == "range_dkdv":
                    cfg = triton_range.dkdv_config(64, 64)
                    tag = (f"[BLOCK_M={cfg.block_m},BLOCK_N={cfg.block_n},warps={cfg.num_warps},"
                           f"stages={cfg.num_stages},")
                    cases = [c for c in triton_range.aot_cases(dims=((64, 64),)) if c.name.startswith("range_dkdv")
                             and tag in c.name]
                else:
                    want = ("sel_bwd_kv",) if family == "sel_bwd" else ("sel_fwd_kv_stats", "sel_fwd_kv_out")
                    cases = [c for c in triton_selected.aot_cases() if c.name.startswith(want)
                             and "hpg=6," in c.name and "d=64," in c.name]
                results = [(c, aot.compile_case(c, cc)) for c in cases for cc in aot.TARGETS]
            finally:
                undo()
            kernels = []
            for c, r in results:
                occ, limit = (ctas_per_sm(r.registers, r.shared_bytes or 0, c.num_warps, int(r.target[3:]))
                              if r.registers else (None, "does not compile"))
                kernels.append({"kernel": r.kernel, "target": r.target, "ok": r.ok, "registers": r.registers,
                                "spill_stores": r.spill_stores, "shared_bytes": r.shared_bytes, "mma": r.mma,
                                "wgmma": r.wgmma, "num_warps": c.num_warps, "ctas_per_sm": occ, "limit": limit})
            spills = max((k["spill_stores"] or 0) for k in kernels) if kernels else None
            sm90 = [k["ctas_per_sm"] or 0 for k in kernels if k["target"] == "sm_90"]
            rows.append({"family": family, "candidate": i, "config": _label(cand),
                         "ok": bool(kernels) and all(k["ok"] for k in kernels),
                         "max_registers": max((k["registers"] or 0) for k in kernels) if kernels else None,
                         "spill_stores": spills, "ctas_per_sm_sm90": min(sm90) if sm90 else None,
                         "kernels": kernels, "problems": sorted({p for _, r in results for p in r.problems})})
    return rows


def aot_markdown(rows: list[dict]) -> str:
    """The --aot rows as a Markdown table, one line per (candidate, kernel, target)."""
    out = ["| family | # | candidate | kernel | target | registers | spill stores | shared (B) | mma | wgmma | "
           "CTAs/SM | limited by |", "|---|---:|---|---|---|---:|---:|---:|---|---|---:|---|"]
    for r in rows:
        for k in r["kernels"]:
            out.append(f"| {r['family']} | {r['candidate']} | {r['config']} | {k['kernel']} | {k['target']} | "
                       f"{k['registers']} | {k['spill_stores']} | {k['shared_bytes']} | "
                       f"{'yes' if k['mma'] else 'no'} | {'yes' if k['wgmma'] else 'no'} | {k['ctas_per_sm']} | "
                       f"{k['limit']} |")
    return "\n".join(out)


def _inputs(family: str, b: int, s: int, device: str, dtype):
    import torch

    from nsa.attention.geometry import num_cmp_blocks
    from nsa.attention.selection import choose_blocks

    gen = torch.Generator().manual_seed(s + b)
    h, g, d = SHAPE["h"], SHAPE["g"], SHAPE["d"]

    def t(heads, length):  # [B, heads, length, d] through [B, length, heads, d] storage, as the layer lays it out
        return torch.randn(b, length, heads, d, generator=gen).to(device, dtype).transpose(1, 2).requires_grad_()

    q, k, v = t(h, s), t(g, s), t(g, s)
    if family.startswith("range"):
        n_cmp = num_cmp_blocks(s, SHAPE["l"], SHAPE["stride"])
        return q, k, v, t(g, n_cmp), t(g, n_cmp)
    nb = -(-s // SHAPE["l_sel"])
    blocks = choose_blocks(torch.rand(b, g, s, nb, generator=gen), torch.arange(s), SHAPE["n_sel"], SHAPE["l_sel"])
    return q, k, v, blocks.to(device)


def max_rel_diff(got, shipped) -> float:
    """The largest difference of the candidate's tensors from the shipped configuration's, each relative to the
    largest shipped value; NaN where either holds a non-finite value (never hidden by a finite one beside it)."""
    diffs = []
    for a, r in zip(got, shipped, strict=True):
        a, r = a.double(), r.double()
        if not (bool(a.isfinite().all()) and bool(r.isfinite().all())):
            return float("nan")
        diffs.append(float((a - r).abs().max()) / max(float(r.abs().max()), 1e-30))
    return max(diffs)


def run_case(family: str, cand_index: int, s: int, b: int, device: str = "cuda", dtype_name: str = "bf16",
             repeats: int = 10, warmup: int = 3) -> dict:
    """One (family, candidate, S) in this process: shipped and candidate configurations, alternately."""
    import torch

    from nsa.attention.kernels.range_attn import host as tr
    from nsa.attention.kernels.selected_attn import host as ts

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype_name]
    inputs = _inputs(family, b, s, device, dtype)
    leaves = [x for x in inputs if x.is_floating_point()]

    def sync():
        if device == "cuda":
            torch.cuda.synchronize()

    def forward():
        if family.startswith("range"):
            q, k, v, kc, vc = inputs
            return tr.window_attention(q, k, v, SHAPE["w"]) + tr.compressed_attention(q, kc, vc, SHAPE["l"],
                                                                                        SHAPE["stride"])
        q, k, v, blocks = inputs
        return ts.selected_attention(q, k, v, blocks, SHAPE["l_sel"])

    upstream = torch.randn(forward().shape, generator=torch.Generator().manual_seed(7)).to(device, dtype)

    def one():
        sync()
        t0 = time.perf_counter()
        out = forward()
        sync()
        t1 = time.perf_counter()
        grads = torch.autograd.grad(out, leaves, upstream)
        sync()
        return t1 - t0, time.perf_counter() - t1, [out.detach(), *grads]

    shipped = one()[2]  # compiles the shipped configuration; its outputs are the comparison's reference
    undo = _patch(family, FAMILIES[family][cand_index])
    try:
        got = one()[2]  # compiles the candidate
    finally:
        undo()
    diff = max_rel_diff(got, shipped)
    times = {"shipped": [], "candidate": []}
    for i in range(warmup + repeats):
        for which in ("shipped", "candidate"):
            undo = _patch(family, FAMILIES[family][cand_index]) if which == "candidate" else (lambda: None)
            try:
                f, bwd, _ = one()
            finally:
                undo()
            if i >= warmup:
                times[which].append((f, bwd))

    def stats(pairs, j):
        vals = [p[j] for p in pairs]
        return {"min": min(vals), "median": statistics.median(vals), "max": max(vals)}

    # "candidate" and "shipped" hold the two arms' times below; the candidate's number is "candidate_index"
    out = {"family": family, "candidate_index": cand_index, "config": _label(FAMILIES[family][cand_index]),
           "seq_len": s, "batch": b, "dtype": dtype_name, "device": device, "repeats": repeats, "max_rel_diff": diff,
           "wrong": not diff <= WRONG}  # a NaN difference (a non-finite output) is WRONG too
    for which, pairs in times.items():
        out[which] = {"fwd": stats(pairs, 0), "bwd": stats(pairs, 1)}
    total = {w: statistics.median(f + bw for f, bw in times[w]) for w in times}
    out["ratio_fwdbwd"] = total["candidate"] / total["shipped"]
    if device == "cuda":
        out["device_name"] = torch.cuda.get_device_name()
    return out


def _spawn(family: str, cand: int, s: int, b: int, args) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--case", f"{family}:{cand}", "--seq-lens", str(s),
           "--batch", str(b), "--device", args.device, "--dtype", args.dtype, "--repeats", str(args.repeats),
           "--warmup", str(args.warmup)]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        return {"family": family, "candidate": cand, "candidate_index": cand, "seq_len": s, "batch": b,
                "error": f"timeout {args.timeout} s"}
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return {"family": family, "candidate": cand, "candidate_index": cand, "seq_len": s, "batch": b,
                "error": f"exit {proc.returncode}: {(lines or ['no output'])[-1]}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ms(t: dict) -> str:
    return f"{t['min'] * 1e3:7.3f}/{t['median'] * 1e3:7.3f}/{t['max'] * 1e3:7.3f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default=",".join(FAMILIES), help=f"subset of {','.join(FAMILIES)}")
    ap.add_argument("--aot", action="store_true", help="compile the candidates for sm_80/sm_90 (no GPU) and stop")
    ap.add_argument("--all", action="store_true", help="also time the candidates that spill (and skip the compile "
                    "check before timing)")
    ap.add_argument("--candidates", help="indices or choice names (DKDV_CHOICES, QUERY_CHOICES) to compile/time "
                    "(default: all)")
    ap.add_argument("--markdown", action="store_true", help="with --aot: one Markdown row per kernel and target")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp16", "fp32"))
    ap.add_argument("--seq-lens", default="2048,65536")
    ap.add_argument("--batch", default="8,1", help="B per length (one value: every length)")
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--timeout", type=int, default=300, help="seconds per case")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--dry-run", action="store_true", help="check the options and print the cases, run nothing (no "
                                                            "device is needed)")
    ap.add_argument("--case", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        ap.error(f"--families: {unknown[0]!r} is not one of {', '.join(FAMILIES)}")
    try:
        for family in families:
            _select(args.candidates, family)
    except ValueError as exc:
        ap.error(str(exc))
    try:
        lens = [int(x) for x in args.seq_lens.split(",")]
        batches = [int(x) for x in args.batch.split(",")]
    except ValueError:
        ap.error(f"--seq-lens {args.seq_lens!r} and --batch {args.batch!r} must be comma-separated integers")
    if len(batches) == 1:
        batches *= len(lens)
    if len(batches) != len(lens) or min(lens + batches) < 1 or args.repeats < 1 or args.warmup < 0:
        ap.error("--batch needs one value or one per --seq-lens value; lengths, batches and --repeats >= 1")
    if args.dry_run:
        for family in families:
            for s, b in zip(lens, batches):
                for cand in _select(args.candidates, family):
                    print(f"{family} at S {s:,} x B {b}: #{cand} {_label(FAMILIES[family][cand])} vs shipped"
                          + (" (compile check only)" if args.aot else ""))
        return 0
    if args.case:
        family, cand = args.case.split(":")
        print(json.dumps(run_case(family, int(cand), lens[0], batches[0], args.device, args.dtype, args.repeats,
                                  args.warmup)))
        return 0
    if args.aot:
        from nsa.attention.kernels.common import interpreting  # as Triton reads TRITON_INTERPRET

        if interpreting():
            ap.error("--aot compiles the kernels: run it without TRITON_INTERPRET")
        rows = aot_report(families, args.candidates)
        if args.markdown:
            print(aot_markdown(rows))
        for r in rows if not args.markdown else []:
            print(f"{r['family']:<11} #{r['candidate']} {r['config']:<17} ok={r['ok']}  max registers "
                  f"{r['max_registers']}  spill stores {r['spill_stores']}  CTAs/SM on sm_90 "
                  f"{r['ctas_per_sm_sm90']}  {'; '.join(r['problems'])}")
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
        return 0
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("tune_kernels: no CUDA device (use --aot to compile the candidates without one)", file=sys.stderr)
        return 2
    print("reproduce: python benchmarks/tune_kernels.py " + shlex.join(sys.argv[1:] if argv is None else argv))
    clean = {(r["family"], r["candidate"]) for r in aot_report(families, args.candidates)
             if r["ok"] and not r["spill_stores"]} \
        if not args.all and args.device == "cuda" else None
    rows = []
    for family in families:
        for s, b in zip(lens, batches):
            print(f"\n{family} at S {s:,} x B {b} ({args.dtype}); ms min/median/max over {args.repeats}: "
                  "candidate vs shipped")
            for cand in _select(args.candidates, family):
                if clean is not None and (family, cand) not in clean:
                    print(f"  #{cand} {_label(FAMILIES[family][cand])}: skipped (spills or does not compile: --aot)")
                    continue
                row = _spawn(family, cand, s, b, args)
                rows.append(row)
                if "error" in row:
                    print(f"  #{cand} {_label(FAMILIES[family][cand])}: {row['error']}")
                    continue
                print(f"  #{cand} {row['config']}: fwd {_ms(row['candidate']['fwd'])} vs {_ms(row['shipped']['fwd'])}"
                      f"  bwd {_ms(row['candidate']['bwd'])} vs {_ms(row['shipped']['bwd'])}  fwd+bwd ratio "
                      f"{row['ratio_fwdbwd']:.3f}  rel diff {row['max_rel_diff']:.1e}"
                      + ("  WRONG" if row["wrong"] else ""))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1))
    return 1 if any("error" in row for row in rows) else 0  # a case that failed is no figure: the caller sees it


if __name__ == "__main__":
    sys.exit(main())
