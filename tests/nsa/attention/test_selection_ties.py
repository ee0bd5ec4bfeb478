"""Exact ties in the block selection: every path of NSAAttention keeps the lower of two equally important blocks.

A query of zero (here: a zero q_proj, so every query is 0 whatever x is) gives every visible compression block the
same compressed probability 1 / n_visible. Selection block j's importance (Eq. 9, 10) is then proportional to the
integer sum over the visible compression blocks i of |[i*d, i*d + l) & [j*l_sel, (j+1)*l_sel)|, so blocks with the
same overlap count tie exactly and the contract (ties to the lower index) decides. The reference below ranks the
blocks by that integer count and builds the output as dense float64 attention with explicit masks over the layer's
projections; the batched forward, the per-token (sequential) forward and the decode steps must all match it.

l = 6, d = 2, l_sel = 4 is a geometry where l is not a multiple of l_sel: a compression block covers 3 stride
chunks and a selection block 2, so every interior selection block overlaps the visible compression blocks by the same
6 chunk memberships (12 tokens) and all of them tie; with n_sel = 4 the one non-forced slot must go to block 1.
The per-token path used to map the probabilities to blocks with a matmul by the overlap weights, whose summation
order gave one of the equal blocks an importance 1 ulp higher than block 1 (from S = 33 on).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "nsa"))

from nsa import NSAConfig  # noqa: E402
from nsa.attention import layer as layer_mod  # noqa: E402
from nsa_test_utils import make_attn, rand_x, variant  # noqa: E402

S = 34


def _cfg(n_heads: int, n_kv_groups: int) -> NSAConfig:
    return NSAConfig(dim=16, n_heads=n_heads, n_kv_groups=n_kv_groups, d_k=4, d_v=6, l=6, d=2, l_sel=4, n_sel=4,
                     w=6, phi="avg", kernel="torch")


def _zero_query_layer(cfg: NSAConfig, seed: int = 0):
    attn = make_attn(cfg, seed=seed).double()
    with torch.no_grad():
        attn.q_proj.weight.zero_()
    return attn


def _reference_blocks(cfg: NSAConfig, s: int) -> list[list[int]]:
    """Per query t: the n_sel blocks the contract keeps when every visible compression block is equally likely."""
    out = []
    for t in range(s):
        visible = [i for i in range(s) if i * cfg.d + cfg.l - 1 <= t]
        cur = t // cfg.l_sel
        count = {}
        for j in range(cur + 1):
            count[j] = sum(max(0, min(i * cfg.d + cfg.l, (j + 1) * cfg.l_sel) - max(i * cfg.d, j * cfg.l_sel))
                           for i in visible)
        forced = sorted({0, cur, max(cur - 1, 0)})
        rest = sorted((j for j in range(cur + 1) if j not in forced), key=lambda j: (-count[j], j))
        kept = sorted(forced + rest[: cfg.n_sel - len(forced)])
        out.append(kept + [-1] * (cfg.n_sel - len(kept)))
    return out


def _reference_output(attn, x: torch.Tensor, blocks: list[list[int]]) -> torch.Tensor:
    """o_proj(sum_c gate_c * branch_c) with every branch dense float64 attention under an explicit mask."""
    cfg = attn.cfg
    with torch.no_grad():
        p = attn.project(x)
    b, h, s, d_k = p.q.shape
    hpg = cfg.n_heads // cfg.n_kv_groups
    t = torch.arange(s).view(s, 1)
    pos = torch.arange(s).view(1, s)
    n_cmp = p.k_cmp.shape[2]
    cmp_mask = (torch.arange(n_cmp).view(1, n_cmp) * cfg.d + cfg.l - 1) <= t
    sel_mask = torch.zeros(s, s, dtype=torch.bool)
    for q_pos, kept in enumerate(blocks):
        for j in kept:
            if j >= 0:
                sel_mask[q_pos, j * cfg.l_sel: min((j + 1) * cfg.l_sel, q_pos + 1)] = True
    win_mask = (pos <= t) & (pos > t - cfg.w)

    def attend(keys, values, mask):
        k = keys.double().repeat_interleave(hpg, dim=1)
        v = values.double().repeat_interleave(hpg, dim=1)
        scores = (p.q.double() @ k.transpose(-1, -2)) / math.sqrt(d_k)
        scores = scores.masked_fill(~mask, float("-inf"))
        seen = mask.any(-1, keepdim=True)
        probs = torch.softmax(torch.where(seen, scores, torch.zeros_like(scores)), -1) * mask
        return probs @ v  # [B, H, S, d_v]; 0 where nothing is visible

    branches = (attend(p.k_cmp, p.v_cmp, cmp_mask), attend(p.k_sel, p.v_sel, sel_mask),
                attend(p.k_win, p.v_win, win_mask))
    gates = p.gates.double()
    mixed = sum(gates[..., i].unsqueeze(-1) * out.transpose(1, 2) for i, out in enumerate(branches))
    return mixed.flatten(2) @ attn.o_proj.weight.double().T


@pytest.mark.parametrize("heads", [(2, 2), (6, 2)], ids=["hpg1", "hpg3"])
@pytest.mark.parametrize("prefill", ["batched", "sequential"])
def test_equal_importance_keeps_the_lower_block_in_every_prefill(prefill, heads):
    cfg = _cfg(*heads)
    attn = variant(_zero_query_layer(cfg), prefill=prefill)
    x = rand_x(2, S, cfg.dim, seed=3).double()
    expected = _reference_blocks(cfg, S)
    got = attn.selected_blocks(x)
    for bi in range(2):
        for gi in range(cfg.n_kv_groups):
            assert got[bi, gi].tolist() == expected, f"sequence {bi}, group {gi}"
    with torch.no_grad():
        out = attn(x)
    ref = _reference_output(attn, x, expected)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10 * ref.abs().max().item())


@pytest.mark.parametrize("heads", [(2, 2), (6, 2)], ids=["hpg1", "hpg3"])
@pytest.mark.parametrize("selected", layer_mod.DECODE_SELECTED_CHOICES)
def test_equal_importance_keeps_the_lower_block_step_by_step_in_decode(monkeypatch, selected, heads):
    monkeypatch.setattr(layer_mod, "DECODE_SELECTED", selected)
    cfg = _cfg(*heads)
    attn = _zero_query_layer(cfg)
    x = rand_x(2, S, cfg.dim, seed=4).double()
    ref = _reference_output(attn, x, _reference_blocks(cfg, S))
    cache = attn.new_cache(2)
    steps = []
    with torch.no_grad():
        steps.append(attn.prefill(x[:, :5], cache))  # shorter than l: no compression block has ended yet
        for t in range(5, S):
            steps.append(attn.decode_step(x[:, t: t + 1], cache))
    out = torch.cat(steps, dim=1)
    tol = 1e-10 * ref.abs().max().item()
    for t in range(S):  # the first wrong step names itself
        torch.testing.assert_close(out[:, t], ref[:, t], rtol=0, atol=tol, msg=lambda m, t=t: f"position {t}: {m}")
