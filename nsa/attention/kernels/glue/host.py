"""The NSA layer's glue in Triton: what the Triton path does between its GEMMs and its attention kernels.

The PyTorch path spends ~10 aten ops on each RoPE, ~6 on each compression's pooling, ~8 on the gates and the
branch combine, forward and backward each; on a GPU each is a kernel launch and the layer is host-bound at
training lengths (issue 21: 232 launching ops per layer forward + backward). Here each is one launch forward and
one backward, as torch.library custom ops with fake and autograd registrations (opaque to torch.compile,
capturable in a CUDA graph, no host synchronisation), on the same layouts as the attention kernels:

    project_heads(y, b1, H, G, d_k, d_v, S, start, theta)
        y [B*S, N] is the ONE packed projection x @ [W_q; W_ksel; W_kwin; W_vsel; W_vwin; W_kcmp; W_vcmp; W_gate1]^T
        (columns in that order: H*d_k, G*d_k, G*d_k, G*d_v, G*d_v, G*d_k, G*d_v, hidden) ->
        (q [B, S, H, d_k], k_sel, k_win [B, S, G, d_k] rotated at positions start..start+S-1; v_sel, v_win,
        k_raw [B, S, G, d_k], v_raw [B, S, G, d_v] split; a [B*S, hidden] = silu(h + b1), the gate MLP's hidden
        layer). Backward: one pass writes the whole dy (inverse rotation, copies, silu'), db1 from per-tile
        partial sums (one torch sum).
    compress_pool(raw, pos, l, d, with_x) -> (x [B*G*n, l*W] = block + pos flattened (j, c), mean [B, G, n, W])
        raw [B, S, G, W] (contiguous), blocks [i*d, i*d + l) (paper Eq. 7: the Compressor's MLP input and mean
        term). Backward: each token gathers the <= ceil(l/d) blocks that hold it; dpos is one torch sum.
    rope_add(a, b, n, p_mul, p_add, theta) -> rope(a + b) of rows [R, W] (b may be None) at positions
        (r % n) * p_mul + p_add: the compressed keys, rotated at each block's last position (i*d + l - 1).
    gate_combine(logits, o_cmp, o_sel, o_win, sigmoid) -> sum_c gate_c * o_c [B, S, H*d_v]
        logits [B, S, H, 3] (the gate MLP's output), gate = sigmoid or softmax over the 3 branches (fp32); o_c
        [B, H, S, d_v] with any strides of unit last stride (the attention kernels' [B, S, H, d] storage).

RoPE angles are position * inv_freq in fp32, inv_freq computed once per (width, theta, device) by
nsa.attention.rope's own formula, so the rotation matches the PyTorch path's. All arithmetic is fp32 in
registers; outputs take the inputs' dtype. Widths d_k, d_v in {32, 64, 128} (nsa.attention.kernels.TRITON_HEAD_DIMS).

Measured: op counts in benchmarks/bench_ops.py (CPU, interpreter). GPU timings: not measured (no GPU here).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Optional

import torch
import triton

from nsa.attention.kernels.aot import AotCase
from nsa.attention.kernels.common import interpreting
from nsa.attention.rope import inv_frequencies
from nsa.attention.kernels.glue.jit import (_cmp_pool_bwd_kernel, _cmp_pool_fwd_kernel,
                                                       _combine_bwd_kernel, _combine_fwd_kernel, _prep_bwd_kernel,
                                                       _prep_fwd_kernel, _rope_rows_kernel)

# Launch configurations (every one is in aot_cases()). The RoPE kernels' precise sin/cos (libdevice, with its
# large-argument reduction) made ptxas spill a few bytes at 16 and 32 rows for some widths on sm_80 or sm_90
# (2-8 warps tried); 8 rows and 4 warps compile clean for every width on both.
BLOCK_R_PROJECT = 8  # token rows per program of project_heads (forward and backward)
# ... but 4 rows for the backward at head widths of 128: 8 rows spilled 4 bytes on sm_80 under triton 3.6 (d_k 64,
# d_v 128, bf16; the GPU run of test_aot_compile, 2026-11-26)
BLOCK_R_PROJECT_BWD_WIDE = 4


def _project_bwd_rows(d_max: int) -> int:
    return BLOCK_R_PROJECT_BWD_WIDE if d_max >= 128 else BLOCK_R_PROJECT
BLOCK_R = 8  # rows per program of rope_add
ROPE_WARPS = 4
BLOCK_T = 32  # tokens per program of the pooling backward and the combine
NUM_WARPS = 4
# Under Triton's interpreter (CPU tests) each program costs ~1 ms of Python whatever its size: the kernels take
# 64-row (token) tiles and 8 compression blocks a program there (the same jit code; masks cover any size), several
# times fewer programs than on a GPU.
INTERPRETER_ROWS = 64
INTERPRETER_BLOCKS = 8


def _rows(block: int) -> int:
    return INTERPRETER_ROWS if interpreting() else block


@lru_cache(maxsize=64)
def _inv_freq(width: int, theta: float, device: torch.device) -> torch.Tensor:
    """nsa.attention.rope's frequencies for this width and base, computed once per device."""
    with torch.no_grad():
        return inv_frequencies(width, theta, device)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


# ----------------------------------------------------------------------------------------------------- projections
def _prep_slots(h: int, g: int, hidden: int, d_max: int) -> int:
    return h + 2 * g + 4 * g + triton.cdiv(hidden, d_max)


@torch.library.custom_op("nsa::glue_project", mutates_args=())
def _project_op(y: torch.Tensor, b1: torch.Tensor, h: int, g: int, d_k: int, d_v: int, s: int, start: int,
                theta: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                       torch.Tensor, torch.Tensor, torch.Tensor]:
    r, hidden = y.shape[0], b1.shape[0]
    b = r // s
    new = lambda n, d: y.new_empty(b, s, n, d)  # noqa: E731
    q, ks, kw, vs, vw, kr, vr = new(h, d_k), new(g, d_k), new(g, d_k), new(g, d_v), new(g, d_v), new(g, d_k), new(g, d_v)
    a = y.new_empty(r, hidden)
    d_max = max(d_k, d_v)
    rows = _rows(BLOCK_R_PROJECT)
    grid = (triton.cdiv(r, rows), _prep_slots(h, g, hidden, d_max))
    _prep_fwd_kernel[grid](y, b1, _inv_freq(d_k, theta, y.device), q, ks, kw, vs, vw, kr, vr, a,
                           r, s, y.stride(0), h, g, hidden, start,
                           D_K=d_k, D_V=d_v, D_MAX=d_max, BLOCK_R=rows, num_warps=NUM_WARPS)
    return q, ks, kw, vs, vw, kr, vr, a


@_project_op.register_fake
def _(y, b1, h, g, d_k, d_v, s, start, theta):
    b = y.shape[0] // s
    new = lambda n, d: y.new_empty(b, s, n, d)  # noqa: E731
    return (new(h, d_k), new(g, d_k), new(g, d_k), new(g, d_v), new(g, d_v), new(g, d_k), new(g, d_v),
            y.new_empty(y.shape[0], b1.shape[0]))


@torch.library.custom_op("nsa::glue_project_bwd", mutates_args=())
def _project_bwd_op(dq: torch.Tensor, dks: torch.Tensor, dkw: torch.Tensor, dvs: torch.Tensor, dvw: torch.Tensor,
                    dkr: torch.Tensor, dvr: torch.Tensor, da: torch.Tensor, y: torch.Tensor, b1: torch.Tensor,
                    h: int, g: int, d_k: int, d_v: int, s: int, start: int,
                    theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    r, hidden = y.shape[0], b1.shape[0]
    dy = torch.empty_like(y)
    d_max = max(d_k, d_v)
    rows = _rows(_project_bwd_rows(d_max))
    tiles = triton.cdiv(r, rows)
    db1_part = torch.empty(tiles, hidden, dtype=torch.float32, device=y.device)
    heads = [t if t.stride(-1) == 1 else t.contiguous() for t in (dq, dks, dkw, dvs, dvw, dkr, dvr)]
    strides = [st for t in heads for st in t.stride()[:3]]
    _prep_bwd_kernel[(tiles, _prep_slots(h, g, hidden, d_max))](
        *heads, da.contiguous(), y, b1, _inv_freq(d_k, theta, y.device), dy, db1_part, r, s, y.stride(0),
        dy.stride(0), h, g, hidden, start, *strides, D_K=d_k, D_V=d_v, D_MAX=d_max, BLOCK_R=rows,
        num_warps=NUM_WARPS)
    return dy, db1_part.sum(0, dtype=b1.dtype)


@_project_bwd_op.register_fake
def _(dq, dks, dkw, dvs, dvw, dkr, dvr, da, y, b1, h, g, d_k, d_v, s, start, theta):
    return torch.empty_like(y), torch.empty_like(b1)


def _project_setup(ctx, inputs, output):
    y, b1, *params = inputs
    ctx.save_for_backward(y, b1)
    ctx.params = params


def _project_backward(ctx, dq, dks, dkw, dvs, dvw, dkr, dvr, da):
    y, b1 = ctx.saved_tensors
    dy, db1 = _project_bwd_op(dq, dks, dkw, dvs, dvw, dkr, dvr, da, y, b1, *ctx.params)
    return dy, db1, None, None, None, None, None, None, None


_project_op.register_autograd(_project_backward, setup_context=_project_setup)


def project_heads(y: torch.Tensor, b1: torch.Tensor, h: int, g: int, d_k: int, d_v: int, s: int, start: int,
                  theta: float):
    """(q, k_sel, k_win, v_sel, v_win, k_raw, v_raw, a) from the packed projection y (module docstring)."""
    hidden = b1.shape[0]
    n = (h + 2 * g) * d_k + 3 * g * d_v + g * d_k + hidden
    if y.dim() != 2 or y.shape[1] != n or y.shape[0] % s or y.stride(1) != 1:
        raise ValueError(f"project_heads: y must be [B*S, {n}] with unit column stride, got {tuple(y.shape)}")
    if d_k % 2 or d_k not in (32, 64, 128) or d_v not in (32, 64, 128):
        raise ValueError(f"project_heads: d_k, d_v must be 32, 64 or 128, got {d_k}, {d_v}")
    return _project_op(y, b1, h, g, d_k, d_v, s, start, float(theta))


# ----------------------------------------------------------------------------------------------------- compression
@torch.library.custom_op("nsa::glue_compress_pool", mutates_args=())
def _pool_op(raw: torch.Tensor, pos: torch.Tensor, l: int, d: int,
             with_x: bool) -> tuple[torch.Tensor, torch.Tensor]:
    b, s, g, w = raw.shape
    n = (s - l) // d + 1 if s >= l else 0
    x = raw.new_empty(b * g * n if with_x else 0, l * w)
    mean = raw.new_empty(b, g, n, w)
    if n:
        blocks = INTERPRETER_BLOCKS if _rows(1) != 1 else 1  # compression blocks a program
        _cmp_pool_fwd_kernel[(triton.cdiv(n, blocks), b * g)](raw, pos, x, mean, s, g, n, l, d, W=w,
                                                              BLOCK_L=_pow2(l), WITH_X=with_x, BLOCKS=blocks,
                                                              num_warps=NUM_WARPS)
    return x, mean


@_pool_op.register_fake
def _(raw, pos, l, d, with_x):
    b, s, g, w = raw.shape
    n = (s - l) // d + 1 if s >= l else 0
    return raw.new_empty(b * g * n if with_x else 0, l * w), raw.new_empty(b, g, n, w)


@torch.library.custom_op("nsa::glue_compress_pool_bwd", mutates_args=())
def _pool_bwd_op(dx: torch.Tensor, dmean: torch.Tensor, raw_shape: list[int], l: int, d: int,
                 with_x: bool) -> torch.Tensor:
    b, s, g, w = raw_shape
    n = dmean.shape[2]
    draw = dmean.new_empty(b, s, g, w)
    dx, dmean = dx.contiguous(), dmean.contiguous()
    tokens = _rows(BLOCK_T)
    _cmp_pool_bwd_kernel[(triton.cdiv(s, tokens), b * g)](dx, dmean, draw, s, g, n, l, d, triton.cdiv(l, d), W=w,
                                                         BLOCK_T=tokens, WITH_X=with_x, num_warps=NUM_WARPS)
    return draw


@_pool_bwd_op.register_fake
def _(dx, dmean, raw_shape, l, d, with_x):
    return dmean.new_empty(raw_shape)


def _pool_setup(ctx, inputs, output):
    raw, pos, l, d, with_x = inputs
    ctx.params = (list(raw.shape), l, d, with_x)
    ctx.pos_shape = pos.shape


def _pool_backward(ctx, dx, dmean):
    raw_shape, l, d, with_x = ctx.params
    draw = _pool_bwd_op(dx, dmean, *ctx.params)
    # the position embedding is added to every block: its gradient sums dx over the blocks
    dpos = dx.view(-1, *ctx.pos_shape).sum(0) if with_x else None
    return draw, dpos, None, None, None


_pool_op.register_autograd(_pool_backward, setup_context=_pool_setup)


def compress_pool(raw: torch.Tensor, pos: Optional[torch.Tensor], l: int, d: int):
    """(x, mean): the MLP input (block + pos, [B*G*n, l*W]; empty when pos is None) and the block mean
    [B, G, n, W] of raw [B, S, G, W] (contiguous)."""
    if not raw.is_contiguous() or raw.shape[-1] not in (32, 64, 128):
        raise ValueError(f"compress_pool: raw must be contiguous [B, S, G, 32|64|128], got {tuple(raw.shape)}")
    with_x = pos is not None
    return _pool_op(raw, pos if with_x else raw.new_empty(0), l, d, with_x)


# ----------------------------------------------------------------------------------------------------- RoPE of rows
@torch.library.custom_op("nsa::glue_rope_rows", mutates_args=())
def _rope_rows_op(a: torch.Tensor, b: Optional[torch.Tensor], n: int, p_mul: int, p_add: int, theta: float,
                  inverse: bool) -> torch.Tensor:
    w = a.shape[-1]
    out = torch.empty(a.shape, dtype=a.dtype, device=a.device)
    r = a.numel() // w
    a = a.contiguous()
    b = b.contiguous() if b is not None else None
    if r:
        rows = _rows(BLOCK_R)
        _rope_rows_kernel[(triton.cdiv(r, rows),)](a, b if b is not None else a, out, _inv_freq(w, theta, a.device),
                                                   r, n, p_mul, p_add, W=w, BLOCK_R=rows,
                                                   HAS_B=b is not None, SIGN=-1.0 if inverse else 1.0,
                                                   num_warps=ROPE_WARPS)
    return out


@_rope_rows_op.register_fake
def _(a, b, n, p_mul, p_add, theta, inverse):
    return torch.empty(a.shape, dtype=a.dtype, device=a.device)


def _rope_setup(ctx, inputs, output):
    a, b, n, p_mul, p_add, theta, inverse = inputs
    ctx.params = (n, p_mul, p_add, theta, not inverse)
    ctx.has_b = b is not None


def _rope_backward(ctx, dout):
    da = _rope_rows_op(dout, None, *ctx.params)
    return da, (da if ctx.has_b else None), None, None, None, None, None


_rope_rows_op.register_autograd(_rope_backward, setup_context=_rope_setup)


def rope_add(a: torch.Tensor, b: Optional[torch.Tensor], n: int, p_mul: int, p_add: int,
             theta: float) -> torch.Tensor:
    """rope(a + b) (b optional) over rows of a [..., n, W], row r at position (r % n) * p_mul + p_add."""
    if b is not None and b.shape != a.shape:
        raise ValueError(f"rope_add: shapes differ, {tuple(a.shape)} and {tuple(b.shape)}")
    return _rope_rows_op(a, b, n, p_mul, p_add, float(theta), False)


# ----------------------------------------------------------------------------------------------------- gate + combine
def _o_strides(*os):
    return [st for o in os for st in (o.stride(0), o.stride(1), o.stride(2))]


@torch.library.custom_op("nsa::glue_gate_combine", mutates_args=())
def _combine_op(logits: torch.Tensor, o_cmp: torch.Tensor, o_sel: torch.Tensor, o_win: torch.Tensor,
                sigmoid: bool) -> torch.Tensor:
    b, h, s, d_v = o_cmp.shape
    out = o_cmp.new_empty(b, s, h * d_v)
    logits = logits.contiguous()
    tokens = _rows(BLOCK_T)
    _combine_fwd_kernel[(triton.cdiv(s, tokens), b * h)](logits, o_cmp, o_sel, o_win, out, s, h,
                                                        *_o_strides(o_cmp, o_sel, o_win), D_V=d_v,
                                                        BLOCK_T=tokens, SIGMOID=sigmoid, num_warps=NUM_WARPS)
    return out


@_combine_op.register_fake
def _(logits, o_cmp, o_sel, o_win, sigmoid):
    b, h, s, d_v = o_cmp.shape
    return o_cmp.new_empty(b, s, h * d_v)


@torch.library.custom_op("nsa::glue_gate_combine_bwd", mutates_args=())
def _combine_bwd_op(dout: torch.Tensor, logits: torch.Tensor, o_cmp: torch.Tensor, o_sel: torch.Tensor,
                    o_win: torch.Tensor, sigmoid: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                                 torch.Tensor]:
    b, h, s, d_v = o_cmp.shape
    logits, dout = logits.contiguous(), dout.contiguous()
    dlogits = torch.empty_like(logits)
    new = lambda: o_cmp.new_empty(b, s, h, d_v)  # noqa: E731
    doc, dos, dow = new(), new(), new()
    tokens = _rows(BLOCK_T)
    _combine_bwd_kernel[(triton.cdiv(s, tokens), b * h)](dout, logits, o_cmp, o_sel, o_win, dlogits, doc, dos, dow,
                                                        s, h, *_o_strides(o_cmp, o_sel, o_win), D_V=d_v,
                                                        BLOCK_T=tokens, SIGMOID=sigmoid, num_warps=NUM_WARPS)
    return dlogits, doc.transpose(1, 2), dos.transpose(1, 2), dow.transpose(1, 2)


@_combine_bwd_op.register_fake
def _(dout, logits, o_cmp, o_sel, o_win, sigmoid):
    b, h, s, d_v = o_cmp.shape
    new = lambda: o_cmp.new_empty(b, s, h, d_v).transpose(1, 2)  # noqa: E731
    return torch.empty_like(logits), new(), new(), new()


def _combine_setup(ctx, inputs, output):
    logits, o_cmp, o_sel, o_win, sigmoid = inputs
    ctx.save_for_backward(logits, o_cmp, o_sel, o_win)
    ctx.sigmoid = sigmoid


def _combine_backward(ctx, dout):
    dlogits, doc, dos, dow = _combine_bwd_op(dout, *ctx.saved_tensors, ctx.sigmoid)
    return dlogits, doc, dos, dow, None


_combine_op.register_autograd(_combine_backward, setup_context=_combine_setup)


def gate_combine(logits: torch.Tensor, o_cmp: torch.Tensor, o_sel: torch.Tensor, o_win: torch.Tensor,
                 gate: str) -> torch.Tensor:
    """sum_c gate_c * o_c as [B, S, H*d_v]: logits [B, S, H, 3], o_c [B, H, S, d_v]; gate "sigmoid" | "softmax"."""
    b, h, s, d_v = o_cmp.shape
    if logits.shape != (b, s, h, 3) or o_sel.shape != o_cmp.shape or o_win.shape != o_cmp.shape:
        raise ValueError(f"gate_combine: logits {tuple(logits.shape)} and branch outputs {tuple(o_cmp.shape)}, "
                         f"{tuple(o_sel.shape)}, {tuple(o_win.shape)} do not match")
    if gate not in ("sigmoid", "softmax") or d_v not in (32, 64, 128):
        raise ValueError(f"gate_combine: gate {gate!r}, d_v {d_v} (sigmoid | softmax; 32, 64 or 128)")
    if any(o.stride(-1) != 1 for o in (o_cmp, o_sel, o_win)):
        o_cmp, o_sel, o_win = (o.contiguous() for o in (o_cmp, o_sel, o_win))
    return _combine_op(logits, o_cmp, o_sel, o_win, gate == "sigmoid")


# ----------------------------------------------------------------------------------------------------- AOT cases
AOT_DIMS = ((32, 32), (64, 64), (128, 128), (64, 128))


def aot_cases(dims=AOT_DIMS, dtype: str = "bf16") -> list:
    """Every glue kernel at each (d_k, d_v) the layer may use; block sizes are fixed, the rest runtime arguments.
    Activations in `dtype`, parameters (gate bias, position embedding) fp32: training runs bf16 autocast over fp32
    weights. Element-wise passes: no tensor-core instruction expected."""
    p, f32 = f"*{dtype}", "*fp32"
    cases = []

    def add(name, fn, sig, constexprs, warps=NUM_WARPS):
        sig = {**sig, **{k: "constexpr" for k in constexprs}}
        label = f"glue_{name}[" + ",".join(f"{k}={v}" for k, v in constexprs.items()) + f",warps={warps},{dtype}]"
        cases.append(AotCase(name=label, fn=fn, signature=sig, constexprs=constexprs, num_warps=warps,
                             num_stages=1, tensor_cores=False))

    ints = lambda *names: {n: "i32" for n in names}  # noqa: E731
    for d_k, d_v in dims:
        dm = max(d_k, d_v)
        add("project_fwd", _prep_fwd_kernel,
            {"Y": p, "B1": f32, "INV_FREQ": f32, **{n: p for n in ("Q", "KS", "KW", "VS", "VW", "KR", "VR", "A")},
             **ints("R", "S", "sy", "H", "G", "HID", "START")},
            dict(D_K=d_k, D_V=d_v, D_MAX=dm, BLOCK_R=BLOCK_R_PROJECT))
        add("project_bwd", _prep_bwd_kernel,
            {**{n: p for n in ("DQ", "DKS", "DKW", "DVS", "DVW", "DKR", "DVR", "DA", "Y")}, "B1": f32, "INV_FREQ": f32,
             "DY": p, "DB1": f32, **ints("R", "S", "sy", "sdy", "H", "G", "HID", "START"),
             **ints(*(f"s{t}_{a}" for t in ("q", "ks", "kw", "vs", "vw", "kr", "vr") for a in "bsh"))},
            dict(D_K=d_k, D_V=d_v, D_MAX=dm, BLOCK_R=_project_bwd_rows(dm)))
        add("combine_fwd", _combine_fwd_kernel,
            {"LOGITS": p, "OC": p, "OS": p, "OW": p, "OUT": p,
             **ints("S", "H", "soc_b", "soc_h", "soc_s", "sos_b", "sos_h", "sos_s", "sow_b", "sow_h", "sow_s")},
            dict(D_V=d_v, BLOCK_T=BLOCK_T, SIGMOID=True))
        add("combine_bwd", _combine_bwd_kernel,
            {"DOUT": p, "LOGITS": p, "OC": p, "OS": p, "OW": p, "DLOGITS": p, "DOC": p, "DOS": p, "DOW": p,
             **ints("S", "H", "soc_b", "soc_h", "soc_s", "sos_b", "sos_h", "sos_s", "sow_b", "sow_h", "sow_s")},
            dict(D_V=d_v, BLOCK_T=BLOCK_T, SIGMOID=True))
    for w in sorted({d for pair in dims for d in pair}):
        add("pool_fwd", _cmp_pool_fwd_kernel, {"RAW": p, "POS": f32, "X": p, "MEAN": p, **ints("S", "G", "N", "L", "D")},
            dict(W=w, BLOCK_L=32, WITH_X=True, BLOCKS=1))
        add("pool_bwd", _cmp_pool_bwd_kernel, {"DX": p, "DMEAN": p, "DRAW": p, **ints("S", "G", "N", "L", "D", "NQ")},
            dict(W=w, BLOCK_T=BLOCK_T, WITH_X=True))
        add("rope_rows", _rope_rows_kernel, {"A": p, "B": p, "OUT": p, "INV_FREQ": f32,
                                             **ints("R", "N", "P_MUL", "P_ADD")},
            dict(W=w, BLOCK_R=BLOCK_R, HAS_B=True, SIGN=1.0), warps=ROPE_WARPS)
    return cases
