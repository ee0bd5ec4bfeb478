"""Kernel-launching ops of ONE NSAAttention layer's forward + backward on the Triton path, counted on CPU.

    TRITON_INTERPRET=1 python benchmarks/bench_ops.py [--seq-lens 256,1024] [--check] [--json FILE]

The host cost of a layer is the number of kernels it launches. This counts them at the dispatcher with a
TorchDispatchMode over one forward + backward of NSAAttention(kernel="triton") under Triton's interpreter
(fp32, CPU), B = 1. Shape: the m7c heads (H = 12, G = 2, d_k = d_v = 64, l = 32, d = 16, l_sel = 64, n_sel = 16,
w = 512, phi = mlp, sigmoid gate) at dim = 128 instead of 768: the width changes GEMM sizes only, not the ops.

What is counted
- every aten op the layer issues, the autograd engine's backward ops included, and every aten op issued INSIDE
  an nsa:: custom op (its host glue: a custom op may hold Triton launches, not hidden aten work). The custom op
  itself is not an op (it launches nothing by itself); it is listed in its own column.
- each Triton kernel launch, separately ("triton launches").
What is not counted
- ops that launch no kernel: views and metadata (EXCLUDED below), and pure allocations (empty, empty_like,
  empty_strided, new_empty, new_empty_strided);
- the interpreter's own copies of a kernel's arguments between the host and the "device" around a launch (it
  runs the kernel on numpy copies): the counter is paused while the interpreter runs a launch.

--check exits 1 when a length's total exceeds MAX_OPS or the totals differ between the lengths (a count that
grows with S means a Python loop over data). Issue 21 measured 232 ops at the GPU's dispatcher before the glue
was fused (profile at S = 256 and 512).

Measured (this counter, the shape above, S = 256 and 1,024, identical at both):
    before the fused glue (main at 7b08b84):  270 ops (66 of them inside nsa:: custom ops), 11 Triton launches
    with the packed projection and triton_glue, the fused selection:  108 ops, 21 Triton launches. Of the 108, 59
        are the inverted-index
        build inside nsa::selected_attention_fwd, 3 zeros inside nsa::selected_attention_bwd and 4 sums inside
        nsa::range_attention_bwd (the dK/dV partials), and 5 are zero gradients autograd materialises for the
        non-differentiable outputs of nsa::range_attention (lse) and nsa::selected_attention_fwd; the layer's own
        37: 21 GEMMs (mm 16, addmm 5), 7 bias / position-embedding gradient sums (+1 inside glue_project_bwd),
        2 gelu + 2 gelu_backward, 1 cat (the packed weight), 3 add (dq from three branches, v_cmp = mean + mlp).
    with the tiled selection as the default (2026-11-25; it runs choose_blocks inside nsa::select_blocks: 29 aten
        ops, and a constant_pad_nd x2 at S = 256 only) and the 5 zero gradients gone: 132 ops at S = 256, 130 at
        S = 1,024, 21 Triton launches.
    with choose_blocks padding its result to n_sel columns at every length (a zero-width pad when there are
        n_sel blocks or more; 2026-11-26): 132 ops at both lengths, 21 Triton launches. Still to go under 80: the
        index build in nsa::selected_attention_fwd (59) and select_blocks' glue (31).
    with the Triton build of the index (`--index-build triton`, nsa/attention/kernels/selected_attn/index.py; qualified
        on an H100 2026-11-26): 80 ops at both lengths (7 left inside selected_attention_fwd: zeros 2, one of them
        the index's histogram, mul_ 2, _to_copy, full, logsumexp), 27 Triton launches (+6: the index's hist,
        colscan, keyscan, scatter and two tile tables). The torch build still counts 132.
    the Triton build made the default on a GPU (NSAConfig.index_build "auto", 2026-11-26, after an alternating A/B
        on an H100: reports/gpu/2026-11-26-h100/run6): this benchmark counts it by default, as a GPU runs the layer
        (`--index-build torch` counts the build "auto" takes under the interpreter). The Triton build's tl.sort is
        slow in the interpreter: the default count takes about 2 minutes on 2 CPU cores, the torch build's seconds.
    the selection's top-n_sel choice (`--topk-choice`, nsa.attention.selection.TOPK_CHOICE; issue 31 item 2.2,
        2026-11-28): "sort" (what "auto" takes until a GPU run qualifies "topk") 80 ops at both lengths, 29 of them
        inside nsa::select_blocks (eq 5, full_like 5, where 5, arange 2, bitwise_or 2, sort 2, constant_pad_nd 2,
        full, div, sub, gt, lt, copy_); "topk" 59 ops at both lengths, 8 inside nsa::select_blocks (topk, lt,
        masked_fill_ 2, sort, constant_pad_nd, eq, copy_: the keys kernel writes every entry of its buffer, so no
        fill and no where), 27 Triton launches with either. The line "sort and topk ops" gives the width each one
        ranks: with "sort" a sort of every row's n_blocks and one of the n_sel kept indices, with "topk" a topk of
        n_blocks and a sort of the n_sel kept indices only (`--seq-lens 2048`: sort[32] + sort[16] against topk[32] +
        sort[16], 80 and 59 ops; at the m7c length 65,536 the full sort ranks 1,024 keys a row, topk's sort 16).
    issue 31 item 2.6 (2026-11-29), S = 256, the default build and choices: the window's single dK/dV partial cast
        instead of summed (range_attn.host, a pure host change): 78 ops (sum 2 fewer inside nsa::range_attention_bwd),
        27 Triton launches. The selected branch's host glue choice (`--sel-host-choice`, selected_attn.host.
        HOST_CHOICE; "auto" = "torch" until a GPU run qualifies "fused"): "fused" 70 ops, 28 Triton launches (the lse
        reduction and the atomics' zero fills in _sel_fwd_lse and _sel_bwd_delta_zero: full, mul_ 2, logsumexp and
        zeros gone from nsa::selected_attention_fwd, which keeps _to_copy (the blocks' int32 copy) and the index's
        zeros, and zeros 3 from nsa::selected_attention_bwd, which has none left). In bf16 on a GPU the casts of
        fp32 accumulators also launch (not seen here: fp32 casts are no-ops): the selected output, dQ, dK, dV and
        the range dK/dV (4).
    issue 31 item 2.6, second part (2026-11-29), S 256 and 1,024 (the same at both), the Triton index build: the
        default ("auto": selected host glue "torch", range glue "torch") is unchanged, 78 ops and 27 Triton launches
        before and after. `--sel-host-choice fused` 70 ops, 28 launches -> 68 ops, 28 launches: the kernels read
        choose_blocks' int64 block lists as they are (each kernel that reads them converts a loaded index to int32;
        the blocks' _to_copy goes) and _index_hist zeroes its own histogram rows (the index's zeros goes), so
        nsa::selected_attention_fwd and _bwd issue no aten op at all. The range backward's glue choice
        (`--range-glue-choice`, range_attn.host.GLUE_CHOICE; "auto" = "torch" until a GPU run qualifies "fused"):
        with both fused, 66 ops and 29 launches (_range_dkdv_sum sums the cmp branch's dK/dV partials and casts them
        in one launch: sum 2 gone from nsa::range_attention_bwd, which has none left). In bf16 on a GPU (not seen
        here: fp32 casts are no-ops, and the window's single partial launches nothing in fp32) the fused choices
        also fold the casts: the selected backward's dQ, dK, dV (3 aten casts) into one _sel_cast launch, the cmp
        branch's 2 sums + 2 casts and the window's 2 casts into one _range_dkdv_sum launch each: 9 cast/sum launches
        become 3. Left: the selected forward's output cast in bf16 (nothing reads the fp32 output after
        _sel_fwd_kv_out's atomics, so a kernel of its own would be one launch too), glue_project_bwd's db1 sum (1),
        and select_blocks' glue (29 ops under "sort", 8 under "topk"). With the band forced choice too
        (`--sel-forced-choice band`, both glue choices fused): 66 ops and 35 launches against band's 77 and 32 with
        the default glue (nsa::selected_band_attention_fwd/_bwd and nsa::range_attention_bwd issue no aten op: the
        band's fp32 dK/dV split is summed by _range_dkdv_sum too, one launch for the cmp branch's and one for the
        band's). Not timed: counted on CPU only.
    the selected branch's forced-block choice (`--sel-forced-choice`, selected_attn.host.FORCED_CHOICE; issue 31
        item 2.4, 2026-11-29; "auto" = "sparse" until a GPU run qualifies "band"), S 256 and 1,024 (the same at both):
        "band" 77 ops and 32 Triton launches against "sparse"'s 78 and 27 with the Triton index build (129 and 26
        against 130 and 21 with the torch build). Inside nsa::selected_band_attention_bwd the selected backward's
        atomics add onto the band's fp32 gradients, so its 3 zero fills go, and sum 2 (the band's dK/dV split
        partials, as the cmp branch's) come; +5 launches: _sel_band_rest, _sel_band_merge and the band's
        _range_fwd_kernel, _range_bwd_dq_kernel, _range_bwd_dkdv_kernel. In bf16 on a GPU the band forward also
        saves the selected output's cast (the merge writes o in q's dtype). The torch index build sorts 13 of 16
        pairs a query (sort[26624] against sort[32768] at S 1,024); the Triton build pads a query's slots to a power
        of two (NS_PAD 16), so its chunked sort does the same work with either choice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections import Counter
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported (the interpreter is chosen
                                                # when a kernel is defined)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

MAX_OPS = 80  # issue 21's target: kernel-launching ops per layer forward + backward
SHAPE = dict(dim=128, n_heads=12, n_kv_groups=2, d_k=64, d_v=64, l=32, d=16, l_sel=64, n_sel=16, w=512,
             phi="mlp", gate="sigmoid")

# Views and metadata: they launch no kernel.
VIEWS = frozenset({
    "view", "_unsafe_view", "reshape", "_reshape_alias", "view_as", "transpose", "permute", "expand", "expand_as",
    "slice", "select", "as_strided", "detach", "alias", "t", "unsqueeze", "squeeze", "split", "split_with_sizes",
    "unbind", "chunk", "narrow", "unfold", "diagonal", "movedim", "flatten", "unflatten", "lift_fresh",
    "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_has_compatible_shallow_copy_type",
    "_to_copy_noop", "_conj", "_neg_view", "resolve_conj", "resolve_neg", "real", "imag", "prim::device",
})
# Allocations without a fill: they launch no kernel.
ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})
EXCLUDED = VIEWS | ALLOCATIONS


def _custom_impl(func):
    """The Python implementation of a torch.library.custom_op (CPU kernel), or None."""
    from torch._library.custom_ops import OPDEFS

    opdef = OPDEFS.get(func._schema.name)
    if opdef is None:
        return None
    return opdef._backend_fns.get("cpu") or opdef._init_fn


def _composite(func) -> bool:
    return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")


class OpCounter(TorchDispatchMode):
    """Counts kernel-launching aten ops (see the module docstring), descending into nsa:: custom ops."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.inside: Counter[str] = Counter()  # of which issued inside an nsa:: custom op
        self.custom: Counter[str] = Counter()
        self.launches: Counter[str] = Counter()
        self.excluded: Counter[str] = Counter()
        self.by_custom: dict[str, Counter[str]] = {}  # inside ops per custom op
        self.sort_widths: Counter[int] = Counter()  # sorts and top-k by the width of the dimension they rank
        self._paused = 0
        self._stack: list[str] = []

    @contextlib.contextmanager
    def paused(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        namespace = func.namespace
        name = func.__name__.split(".")[0]
        if namespace == "nsa":
            impl = _custom_impl(func)
            if impl is None:
                raise RuntimeError(f"cannot descend into custom op {func}")
            self.custom[f"{namespace}::{name}"] += 1
            self._stack.append(f"{namespace}::{name}")
            try:
                with self:  # the op's own aten glue is counted too
                    return impl(*args, **kwargs)
            finally:
                self._stack.pop()
        if self._stack and _composite(func):
            # inside a custom op, composite ops (to, reshape, ...) reach this mode undecomposed: count what they
            # decompose to (nothing for a no-op .to(), a view or a copy for reshape)
            with self:
                return func.decompose(*args, **kwargs)
        key = name if namespace == "aten" else f"{namespace}::{name}"
        if name in ("sort", "topk") and args and isinstance(args[0], torch.Tensor):
            dim = kwargs.get("dim", args[2] if name == "topk" and len(args) > 2 else
                             args[1] if name == "sort" and len(args) > 1 and isinstance(args[1], int) else -1)
            self.sort_widths[f"{name}[{args[0].shape[dim]}]"] += 1
        if key in EXCLUDED or name in EXCLUDED:
            self.excluded[key] += 1
        else:
            self.ops[key] += 1
            if self._stack:
                self.inside[key] += 1
                self.by_custom.setdefault(self._stack[-1], Counter())[key] += 1
        return func(*args, **kwargs)

    @property
    def total(self) -> int:
        return sum(self.ops.values())


@contextlib.contextmanager
def counting_triton_launches(counter: OpCounter):
    """Counts every interpreted Triton launch by kernel name, with the op counter paused inside the launch."""
    from triton.runtime import interpreter

    original = interpreter.GridExecutor.__call__

    def call(self, *args, **kwargs):
        counter.launches[getattr(self.fn, "__name__", str(self.fn))] += 1
        with counter.paused():
            return original(self, *args, **kwargs)

    interpreter.GridExecutor.__call__ = call
    try:
        yield
    finally:
        interpreter.GridExecutor.__call__ = original


def make_layer(seed: int = 0, **overrides):
    """The counted layer: kernel "triton", SHAPE and `overrides` (NSAConfig fields, e.g. index_build)."""
    from nsa import NSAAttention, NSAConfig

    torch.manual_seed(seed)
    return NSAAttention(NSAConfig(**{**SHAPE, **overrides, "kernel": "triton"}))


def count_layer(layer, s: int, batch: int = 1, seed: int = 1, warmup: bool = True) -> OpCounter:
    """One forward + backward of `layer` on x [batch, s, dim], counted (a warm-up pass first fills caches: lazy
    imports, cached RoPE frequencies; they are shape-independent, so one warm-up per layer is enough)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, s, layer.cfg.dim, generator=gen).requires_grad_(True)
    upstream = torch.randn(batch, s, layer.cfg.dim, generator=gen)
    if warmup:
        layer(x).backward(upstream)
    layer.zero_grad(set_to_none=True)  # gradients start empty, as in a training step after zero_grad
    x.grad = None
    counter = OpCounter()
    with counting_triton_launches(counter), counter:
        layer(x).backward(upstream)
    return counter


def table(counts: dict[int, OpCounter]) -> str:
    lens = sorted(counts)
    names = sorted(set().union(*(c.ops for c in counts.values())),
                   key=lambda n: (-max(counts[s].ops[n] for s in lens), n))
    head = "| op | " + " | ".join(f"S={s}" for s in lens) + " | inside nsa:: ops |"
    rows = [head, "|---|" + "---:|" * len(lens) + "---:|"]
    for n in names:
        rows.append(f"| {n} | " + " | ".join(str(counts[s].ops[n]) for s in lens)
                    + f" | {counts[lens[0]].inside[n]} |")
    rows.append("| **total ops** | " + " | ".join(f"**{counts[s].total}**" for s in lens)
                + f" | {sum(counts[lens[0]].inside.values())} |")
    rows.append("| triton launches | " + " | ".join(str(sum(counts[s].launches.values())) for s in lens) + " | |")
    rows.append("| nsa:: custom op calls | " + " | ".join(str(sum(counts[s].custom.values())) for s in lens)
                + " | |")
    return "\n".join(rows)


def reproduce(args, seq_lens: list[int]) -> str:
    """The command that counts the same: every option that changes a count (the lengths as they were read, one
    comma-separated word), and --check where it was given."""
    return (f"TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/bench_ops.py --seq-lens {','.join(map(str, seq_lens))} "
            f"--index-build {args.index_build} --topk-choice {args.topk_choice} --sel-host-choice "
            f"{args.sel_host_choice} --sel-forced-choice {args.sel_forced_choice} --range-glue-choice "
            f"{args.range_glue_choice}" + (" --check" if args.check else ""))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq-lens", default="256,1024")
    ap.add_argument("--check", action="store_true", help=f"exit 1 if a total exceeds {MAX_OPS} or differs by S")
    ap.add_argument("--json", type=Path, help="also write the counts here")
    ap.add_argument("--index-build", choices=("triton", "torch"), default="triton",
                    help="the selected branch's inverted index (NSAConfig.index_build): triton (default: the build "
                         "a GPU runs) or torch (the build the interpreter runs by default)")
    ap.add_argument("--topk-choice", choices=("auto", "sort", "topk"), default="auto",
                    help="the selection's top-n_sel choice (nsa.attention.selection.TOPK_CHOICE; auto: "
                         "QUALIFIED_TOPK): sort (the full sort) or topk (packed keys + torch.topk)")
    ap.add_argument("--sel-host-choice", choices=("auto", "torch", "fused"), default="auto",
                    help="the selected branch's host glue (selected_attn.host.HOST_CHOICE; auto: QUALIFIED_HOST): "
                         "torch (the lse reduction and zero fills in aten ops) or fused (folded into kernels)")
    ap.add_argument("--range-glue-choice", choices=("auto", "torch", "fused"), default="auto",
                    help="the range backward's glue (range_attn.host.GLUE_CHOICE; auto: QUALIFIED_GLUE): torch (dK/dV "
                         "partials summed and cast in aten ops) or fused (one _range_dkdv_sum launch)")
    ap.add_argument("--sel-forced-choice", choices=("auto", "sparse", "band"), default="auto",
                    help="the selected branch's forced blocks (selected_attn.host.FORCED_CHOICE; auto: "
                         "QUALIFIED_FORCED): sparse (every listed block through the selected kernels) or band (the "
                         "forced blocks through the range kernels' band, merged by lse)")
    args = ap.parse_args(argv)
    try:
        seq_lens = [int(s) for s in args.seq_lens.split(",") if s.strip()]
    except ValueError:
        seq_lens = []
    if not seq_lens or min(seq_lens) < 1:
        ap.error(f"--seq-lens {args.seq_lens!r}: expected comma-separated lengths >= 1, e.g. 256,1024")
    twice = sorted({s for s in seq_lens if seq_lens.count(s) > 1})
    if twice:  # the counts are keyed by S: a length counted twice would keep one count and print one column
        ap.error(f"--seq-lens: {', '.join(map(str, twice))} given more than once (each length is counted once)")
    from nsa.attention import kernels, selection
    from nsa.attention.kernels.range_attn import host as range_host
    from nsa.attention.kernels.selected_attn import host as selected_host

    selection.TOPK_CHOICE = args.topk_choice
    selected_host.HOST_CHOICE = args.sel_host_choice
    selected_host.FORCED_CHOICE = args.sel_forced_choice
    range_host.GLUE_CHOICE = args.range_glue_choice

    if not kernels.interpreting():
        print("TRITON_INTERPRET must be 1 (the counter runs the Triton kernels in the interpreter on CPU)",
              file=sys.stderr)
        return 2
    layer = make_layer(index_build=args.index_build)
    counts = {s: count_layer(layer, s, warmup=i == 0) for i, s in enumerate(seq_lens)}
    print(f"kernel-launching ops of one NSAAttention layer forward + backward, kernel=triton, index build "
          f"{args.index_build}, top-n_sel choice {selection.topk_choice()} ({args.topk_choice}), selected host glue "
          f"{selected_host.host_choice()} ({args.sel_host_choice}), forced blocks "
          f"{selected_host.forced_choice()} ({args.sel_forced_choice}), range glue {range_host.glue_choice()} "
          f"({args.range_glue_choice}), TRITON_INTERPRET=1, "
          f"fp32 CPU, B=1, {SHAPE}")
    print(table(counts))
    launches = Counter()
    for c in counts.values():
        launches.update(c.launches)
    print("triton launches per kernel (S=%d): " % seq_lens[0]
          + ", ".join(f"{k} {v}" for k, v in sorted(counts[seq_lens[0]].launches.items())))
    print("custom ops (S=%d): " % seq_lens[0]
          + ", ".join(f"{k} {v}" for k, v in sorted(counts[seq_lens[0]].custom.items())))
    for op, inner in sorted(counts[seq_lens[0]].by_custom.items()):
        print(f"  aten ops inside {op}: " + ", ".join(f"{k} {v}" for k, v in inner.most_common()))
    print(f"not counted: views/metadata {sorted(VIEWS)}; allocations without a fill {sorted(ALLOCATIONS)}; the "
          "interpreter's own host<->device copies inside a Triton launch")
    print("excluded ops seen (S=%d): " % seq_lens[0]
          + ", ".join(f"{k} {v}" for k, v in sorted(counts[seq_lens[0]].excluded.items())))
    print("sort and topk ops [width of the ranked dimension]: " + "; ".join(
        f"S={s}: " + (", ".join(f"{k} {v}" for k, v in sorted(c.sort_widths.items())) or "none")
        for s, c in counts.items()))
    print(f"reproduce: {reproduce(args, seq_lens)}")
    if args.json:
        args.json.write_text(json.dumps({str(s): {"total": c.total, "ops": dict(c.ops), "inside": dict(c.inside),
                                                  "triton_launches": dict(c.launches), "custom": dict(c.custom),
                                                  "sort_widths": dict(c.sort_widths)}
                                         for s, c in counts.items()}, indent=1))
    totals = {s: counts[s].total for s in seq_lens}
    problems = [f"S={s}: {t} ops > {MAX_OPS}" for s, t in totals.items() if t > MAX_OPS]
    if len(set(totals.values())) > 1:
        problems.append(f"the total grows with S: {totals}")
    if args.check and problems:
        print("CHECK FAILED: " + "; ".join(problems), file=sys.stderr)
        return 1
    if args.check:
        print(f"check passed: {max(totals.values())} <= {MAX_OPS} ops at every S, the same at every S")
    return 0


if __name__ == "__main__":
    sys.exit(main())
