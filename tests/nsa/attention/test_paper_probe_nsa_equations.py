"""NSAAttention against the NSA paper's equations (Yuan et al., 2025), written here as a plain per-query loop in
Python floats (float64) for one KV group at a time: no tensor code of the layer, no vectorised masks.

Per query t (0-based) of KV group g, with the layer's weights:
  compression (Eq. 7)  block i = phi(k[i*d : i*d + l]), phi = block mean + MLP(flatten(block + position embedding))
                       (the README's phi="mlp"), visible to t once complete: i*d + l - 1 <= t; its key is rotated at
                       the block's last position i*d + l - 1 (README);
  p_cmp (Eq. 8)        softmax over the visible compressed keys of q_t . k / sqrt(d_k), per head;
  p_slc (Eq. 9)        p_slc[j] = sum_{m < l_sel/d} sum_{n < l/d} p_cmp[(l_sel/d) * j + m - n] (the README's aligned
                       index; cross-checked below against the token-overlap reading: |block i & block j| / d);
  p_slc' (Eq. 10)      summed over the heads of the group;
  top-n (Eq. 11)       block 0, the block holding t and the one before it always kept (README), the rest the largest
                       p_slc' among blocks that have started (j <= t // l_sel), ties to the lower index;
  selected (Eq. 12)    attention over the tokens <= t of the kept blocks;
  window               attention over the last w tokens (t - w, t];
  output (Eq. 5)       sum over the branches of sigmoid(gate MLP(x_t))[head, branch] * branch output, then o_proj.
"""

from __future__ import annotations

import math

import pytest
import torch

from nsa.attention.selection import choose_blocks
from nsa_test_utils import make_attn, make_cfg

# ----------------------------------------------------------------------------------------------- plain helpers


def _vec(t):
    return [float(v) for v in t.detach().double().reshape(-1).tolist()]


def _mat(linear):
    """(rows of the weight as lists, bias list or None)."""
    w = linear.weight.detach().double().tolist()
    b = None if linear.bias is None else _vec(linear.bias)
    return w, b


def _apply(mb, x):
    w, b = mb
    out = [sum(wi * xi for wi, xi in zip(row, x)) for row in w]
    return out if b is None else [o + bi for o, bi in zip(out, b)]


def _rope(x, pos, theta):
    """Rotate-half RoPE: the pair (x_j, x_{j + D/2}) turned by the angle pos * theta^(-2j/D)."""
    half = len(x) // 2
    out = list(x)
    for j in range(half):
        ang = pos * theta ** (-2.0 * j / len(x))
        c, s = math.cos(ang), math.sin(ang)
        out[j] = x[j] * c - x[j + half] * s
        out[j + half] = x[j + half] * c + x[j] * s
    return out


def _dot(a, b):
    return sum(x * y for x, y in zip(a, b))


def _softmax(scores):
    top = max(scores)
    e = [math.exp(s - top) for s in scores]
    z = sum(e)
    return [v / z for v in e]


def _attend(q, keys, values):
    """softmax(q . k / sqrt(d_k)) v over the given keys; 0 when there is none."""
    if not keys:
        return None, []
    p = _softmax([_dot(q, k) / math.sqrt(len(q)) for k in keys])
    return [sum(pi * v[c] for pi, v in zip(p, values)) for c in range(len(values[0]))], p


def _gelu(v):
    return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))


def _silu(v):
    return v / (1.0 + math.exp(-v))


def _phi(rows, comp):
    """phi of one block (a list of l token vectors): mean, plus the MLP of the flattened block + position."""
    width = len(rows[0])
    mean = [sum(r[c] for r in rows) / len(rows) for c in range(width)]
    if comp.kind == "avg":
        return mean
    pos = comp.pos.detach().double().tolist()
    flat = [r[c] + pos[i][c] for i, r in enumerate(rows) for c in range(width)]
    hidden = [_gelu(v) for v in _apply(_mat(comp.fc1), flat)]
    return [m + v for m, v in zip(mean, _apply(_mat(comp.fc2), hidden))]


# ----------------------------------------------------------------------------------------------- the reference


def importance_eq9(p_cmp, n_blocks, l, d, l_sel):
    """Eq. 9 as a double sum over compression-block indices (aligned: (l_sel/d) * j + m - n)."""
    a, b = l_sel // d, l // d
    out = []
    for j in range(n_blocks):
        total = 0.0
        for m in range(a):
            for n in range(b):
                i = a * j + m - n
                if 0 <= i < len(p_cmp):
                    total += p_cmp[i]
        out.append(total)
    return out


def importance_overlap(p_cmp, n_blocks, l, d, l_sel):
    """Eq. 9's meaning in tokens: compression block i counts |[i*d, i*d + l) & [j*l_sel, (j+1)*l_sel)| / d."""
    return [sum(p * len(set(range(i * d, i * d + l)) & set(range(j * l_sel, (j + 1) * l_sel))) / d
                for i, p in enumerate(p_cmp)) for j in range(n_blocks)]


def top_blocks(importance, t, n_sel, l_sel):
    """Eq. 11 with the README's forced blocks: 0, t // l_sel, t // l_sel - 1; ties to the lower index."""
    cur = t // l_sel
    forced = sorted({0, cur, max(cur - 1, 0)})
    rest = [j for j in range(cur + 1) if j not in forced]
    rest.sort(key=lambda j: (-importance[j], j))
    return sorted((forced + rest)[:n_sel])


def group_reference(attn, x_row, g):
    """One sequence x_row [S, dim] and KV group g: per query t, {"cmp", "sel", "win"} -> [hpg][d_v] branch outputs,
    gates [hpg][3], the kept blocks, the Eq. 9 importance both ways."""
    cfg = attn.cfg
    s = len(x_row)
    hpg, d_k, d_v = cfg.heads_per_group, cfg.d_k, cfg.d_v
    l, d, l_sel, theta = cfg.l, cfg.d, cfg.l_sel, cfg.rope_theta
    heads = range(g * hpg, (g + 1) * hpg)

    def rows(linear, lo, width):
        return [_apply(_mat(linear), x)[lo * width: (lo + 1) * width] for x in x_row]

    q = {h: [_rope(r, t, theta) for t, r in enumerate(rows(attn.q_proj, h, d_k))] for h in heads}
    k_sel = [_rope(r, t, theta) for t, r in enumerate(rows(attn.k_sel, g, d_k))]
    v_sel = rows(attn.v_sel, g, d_v)
    k_win = [_rope(r, t, theta) for t, r in enumerate(rows(attn.k_win, g, d_k))]
    v_win = rows(attn.v_win, g, d_v)
    k_raw, v_raw = rows(attn.k_cmp, g, d_k), rows(attn.v_cmp, g, d_v)
    n_cmp = (s - l) // d + 1 if s >= l else 0
    k_cmp = [_rope(_phi(k_raw[i * d: i * d + l], attn.phi_k), i * d + l - 1, theta) for i in range(n_cmp)]
    v_cmp = [_phi(v_raw[i * d: i * d + l], attn.phi_v) for i in range(n_cmp)]
    gate1, gate2 = _mat(attn.gate[0]), _mat(attn.gate[2])

    out = []
    for t in range(s):
        logits = _apply(gate2, [_silu(v) for v in _apply(gate1, x_row[t])])
        gates = [[1.0 / (1.0 + math.exp(-logits[h * 3 + c])) for c in range(3)] for h in heads]
        visible = [i for i in range(n_cmp) if i * d + l - 1 <= t]
        o_cmp, p_group = [], [0.0] * len(visible)
        for h in heads:
            o, p = _attend(q[h][t], [k_cmp[i] for i in visible], [v_cmp[i] for i in visible])
            o_cmp.append(o if o is not None else [0.0] * d_v)
            p_group = [a + b for a, b in zip(p_group, p)]  # Eq. 10: the heads of the group summed
        n_blocks = t // l_sel + 1
        imp = importance_eq9(p_group, n_blocks, l, d, l_sel)
        kept = top_blocks(imp, t, cfg.n_sel, l_sel)
        tokens = [p for j in kept for p in range(j * l_sel, min((j + 1) * l_sel, t + 1))]
        o_sel = [_attend(q[h][t], [k_sel[p] for p in tokens], [v_sel[p] for p in tokens])[0] for h in heads]
        window = range(max(0, t - cfg.w + 1), t + 1)
        o_win = [_attend(q[h][t], [k_win[p] for p in window], [v_win[p] for p in window])[0] for h in heads]
        out.append(dict(cmp=o_cmp, sel=o_sel, win=o_win, gates=gates, kept=kept, imp=imp,
                        imp_overlap=importance_overlap(p_group, n_blocks, l, d, l_sel)))
    return out


def layer_reference(attn, x):
    """(output [B][S][dim], per (b, g) the group_reference rows) of the whole layer."""
    cfg = attn.cfg
    o_proj = _mat(attn.o_proj)
    result, groups = [], {}
    for bi in range(x.shape[0]):
        x_row = [_vec(x[bi, t]) for t in range(x.shape[1])]
        for g in range(cfg.n_kv_groups):
            groups[bi, g] = group_reference(attn, x_row, g)
        seq = []
        for t in range(x.shape[1]):
            mixed = []
            for g in range(cfg.n_kv_groups):
                r = groups[bi, g][t]
                for hi in range(cfg.heads_per_group):
                    mixed += [sum(r["gates"][hi][c] * r[name][hi][e] for c, name in enumerate(("cmp", "sel", "win")))
                              for e in range(cfg.d_v)]
            seq.append(_apply(o_proj, mixed))
        result.append(seq)
    return result, groups


# ----------------------------------------------------------------------------------------------- the comparisons

# boundaries crossed: S past l, several strides, several selection blocks beyond n_sel * l_sel (importance decides),
# a partial last block of every kind, w < S; l_sel above, equal to and below l; the paper's l = l_sel = d case;
# heads per group 1 and 2
SHAPES = [
    pytest.param(dict(l=4, d=2, l_sel=4, n_sel=4, w=5), 31, id="l4-d2-lsel4"),
    pytest.param(dict(l=6, d=2, l_sel=6, n_sel=4, w=7), 35, id="l6-d2-lsel6"),
    pytest.param(dict(l=4, d=2, l_sel=8, n_sel=4, w=3), 43, id="lsel>l"),
    pytest.param(dict(l=8, d=4, l_sel=4, n_sel=4, w=6), 29, id="lsel<l"),
    pytest.param(dict(l=4, d=4, l_sel=4, n_sel=4, w=4), 27, id="l=d=lsel"),
    pytest.param(dict(l=4, d=2, l_sel=4, n_sel=5, w=9, n_kv_groups=4), 30, id="hpg1"),
]
TINY = dict(dim=16, n_heads=4, n_kv_groups=2, d_k=4, d_v=4)


def _layer(over, prefill, selection):
    return make_attn(make_cfg(**{**TINY, **over, "prefill": prefill, "selection": selection}), seed=3).double()


def _x(attn, s, b=2):
    return torch.randn(b, s, attn.cfg.dim, generator=torch.Generator().manual_seed(s), dtype=torch.float64)


def _max_diff(got, want):
    return (got - torch.tensor(want, dtype=torch.float64)).abs().max().item()


@pytest.mark.parametrize("prefill,selection", [("batched", "v2"), ("sequential", "v1")])
@pytest.mark.parametrize("over,s", SHAPES)
def test_layer_follows_the_paper_equations(over, s, prefill, selection):
    attn = _layer(over, prefill, selection)
    cfg = attn.cfg
    x = _x(attn, s)
    with torch.no_grad():
        y = attn(x)
        branches = attn.branch_outputs(x)
        blocks = attn.selected_blocks(x)
    want, groups = layer_reference(attn, x)
    scale = max(abs(v) for seq in want for row in seq for v in row)
    assert scale > 1e-2
    assert _max_diff(y, want) <= 1e-10 * scale
    hpg = cfg.heads_per_group
    for (bi, g), rows in groups.items():
        for name in ("cmp", "sel", "win"):
            got = branches[name][bi, g * hpg: (g + 1) * hpg].transpose(0, 1)  # [S, hpg, d_v]
            assert _max_diff(got, [r[name] for r in rows]) <= 1e-10, (name, bi, g)
        for t, r in enumerate(rows):
            assert max(abs(a - b) for a, b in zip(r["imp"], r["imp_overlap"])) < 1e-12  # the two Eq. 9 readings
            want_blocks = r["kept"] + [-1] * (cfg.n_sel - len(r["kept"]))
            assert blocks[bi, g, t].tolist() == want_blocks, (bi, g, t)


def test_importance_decides_past_the_forced_blocks():
    """Guard against a vacuous selection check: at these shapes the kept blocks beyond the forced ones differ
    between queries and groups (importance chooses them) and some started block is left out."""
    attn = _layer(SHAPES[2].values[0], "batched", "v2")
    x = _x(attn, 43)
    with torch.no_grad():
        blocks = attn.selected_blocks(x)
    free = set()
    for t in range(43):
        cur = t // attn.cfg.l_sel
        for row in blocks[:, :, t].reshape(-1, attn.cfg.n_sel).tolist():
            chosen = frozenset(j for j in row if j >= 0) - {0, cur, cur - 1}
            free.add((t // attn.cfg.l_sel, chosen))
            if cur + 1 > attn.cfg.n_sel:
                assert len([j for j in row if j >= 0]) == attn.cfg.n_sel
    assert len({c for cur, c in free if cur >= 4}) > 1


@pytest.mark.parametrize("method", ["sort", "topk"])
def test_ties_go_to_the_lower_block_and_no_future_block_is_kept(method):
    """Equal importance: the lower index wins; a block past the query's (not started) is never kept even when its
    importance is the largest; block 0 and the two local blocks are kept whatever their importance."""
    l_sel, n_sel = 4, 5
    imp = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 9.0, 9.0],   # t = 27: block 6 current
                        [-5.0, 2.0, 2.0, 3.0, 2.0, -5.0, -5.0, 9.0, 9.0]])  # t = 24
    positions = torch.tensor([27, 24])
    got = choose_blocks(imp, positions, n_sel, l_sel, method=method).tolist()
    assert got[0] == [0, 1, 2, 5, 6]  # forced 0, 5, 6; ties among 1..4 -> 1, 2
    assert got[1] == [0, 1, 3, 5, 6]  # forced 0, 5, 6; 3 (largest), then the tie 1, 2, 4 -> 1
