"""Block selection on the GPU: the Triton kernels (tiled, and fused on request) against the layer's PyTorch path.

    python benchmarks/bench_triton_selection.py [--seq-lens 4096,16384,65536] [--fused] [--json out.json]

Shape: the model's (B=1, H=12, G=2, d_k=64, l=32, d=16, l_sel=64, n_sel=16), bf16. Per S: milliseconds of
select_blocks(method="tiled") (the default), with --fused of select_blocks(method="fused") too (not qualified on
a GPU yet: triton_selection's "Known fault"; a fault ends the process), the PyTorch path (cmp_group_probabilities +
importance_from_cmp + choose_blocks, as NSAAttention._select_batched; skipped above --torch-max), and of the
Q K^T + softmax work alone (SDPA over the compressed keys, the lower bound the fused kernel is compared with), plus
the share of queries whose Triton (tiled; fused with --fused) and PyTorch choices differ (near-ties only: it
should be ~0). Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from nsa.attention.geometry import num_cmp_blocks, num_sel_blocks  # noqa: E402
from nsa.attention.kernels import cmp_group_probabilities, compressed_attention  # noqa: E402
from nsa.attention.selection import choose_blocks, importance_from_cmp  # noqa: E402

B, H, G, D_K, L, D, L_SEL, N_SEL = 1, 12, 2, 64, 32, 16, 64, 16


def lse_cmp(q, k_cmp, chunk=2048):
    """[B, H, S] fp32 log-sum-exp of the scaled compressed scores over the visible blocks, in query chunks."""
    s, n_cmp = q.shape[2], k_cmp.shape[2]
    k = k_cmp.float().repeat_interleave(H // G, 1).transpose(-1, -2)
    out = torch.empty(B, H, s, device=q.device)
    for r0 in range(0, s, chunk):
        t = torch.arange(r0, min(s, r0 + chunk), device=q.device)[:, None]
        scores = (q[:, :, r0: r0 + chunk].float() @ k) / math.sqrt(D_K)
        visible = torch.arange(n_cmp, device=q.device) * D + L - 1 <= t
        out[:, :, r0: r0 + chunk] = scores.masked_fill(~visible, float("-inf")).logsumexp(-1)
    return out


def torch_path(q, k_cmp, s):
    n_blocks = num_sel_blocks(s, L_SEL)
    importance = torch.zeros(B, G, s, n_blocks, device=q.device)
    first = min(s, N_SEL * L_SEL)
    for start, probs in cmp_group_probabilities(q, k_cmp, L, D, first):
        importance[:, :, start: start + probs.shape[2]] = importance_from_cmp(probs, n_blocks, L, D, L_SEL)
    return choose_blocks(importance, torch.arange(s, device=q.device), N_SEL, L_SEL)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="4096,16384,65536")
    ap.add_argument("--torch-max", type=int, default=16384, help="largest S for the (slow) PyTorch path")
    ap.add_argument("--fused", action="store_true", help="also time the fused kernel (not qualified on a GPU yet)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA device", file=sys.stderr)
        return 1
    import triton.testing

    from nsa.attention.kernels.selection.host import select_blocks

    rows = []
    print(f"{'S':>6} | {'fused ms':>9} {'tiled ms':>9} {'torch ms':>9} {'cmp attn ms':>11} | {'differ':>7}")
    for s in (int(x) for x in args.seq_lens.split(",")):
        torch.manual_seed(0)
        n_cmp = num_cmp_blocks(s, L, D)
        q = torch.randn(B, s, H, D_K, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        k_cmp = torch.randn(B, G, n_cmp, D_K, device="cuda", dtype=torch.bfloat16)
        v_cmp = torch.randn_like(k_cmp)
        lse = lse_cmp(q, k_cmp)
        row = {"seq_len": s}
        row["fused_ms"] = None
        if args.fused:
            row["fused_ms"] = triton.testing.do_bench(lambda: select_blocks(q, k_cmp, lse, L, D, L_SEL, N_SEL, "fused"))
        row["tiled_ms"] = triton.testing.do_bench(lambda: select_blocks(q, k_cmp, lse, L, D, L_SEL, N_SEL, "tiled"))
        row["cmp_attention_ms"] = triton.testing.do_bench(lambda: compressed_attention(q, k_cmp, v_cmp, L, D))
        row["torch_ms"] = row["differ"] = None
        if s <= args.torch_max:
            row["torch_ms"] = triton.testing.do_bench(lambda: torch_path(q, k_cmp, s), rep=200)
            chosen = select_blocks(q, k_cmp, lse, L, D, L_SEL, N_SEL, "fused" if args.fused else "tiled")
            row["differ"] = (chosen != torch_path(q, k_cmp, s)).any(-1).float().mean().item()
        rows.append(row)
        fmt = lambda v, w, p=2: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
        print(f"{s:>6} | {fmt(row['fused_ms'], 9)} {fmt(row['tiled_ms'], 9)} {fmt(row['torch_ms'], 9)} "
              f"{fmt(row['cmp_attention_ms'], 11)} | {fmt(row['differ'], 7, 4)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "by_seq_len": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
