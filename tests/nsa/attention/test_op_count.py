"""Kernel-launching ops of one NSA layer forward + backward on the Triton path (benchmarks/bench_ops.py's counter).

A structural count, not a timing: the ops the dispatcher sees (views, metadata and bare allocations excluded, the
aten glue inside nsa:: custom ops included), under Triton's interpreter on CPU. It must not grow with S (a Python
loop over data would make it grow), and issue 21 sets at most 80 per layer.
"""

from __future__ import annotations


import pytest

from op_counting import bench_ops
from triton_test_utils import ON_GPU, needs_triton

pytestmark = [needs_triton, pytest.mark.skipif(ON_GPU, reason="counts under the interpreter (CPU)")]

# Custom ops whose internals belong to the selection kernels (nsa.attention.kernels.selected_attn.host /
# triton_selection / triton_range), outside the layer's own glue.
ATTENTION_OPS = ("nsa::range_attention", "nsa::range_attention_bwd", "nsa::select_blocks",
                 "nsa::selected_attention_fwd", "nsa::selected_attention_bwd")
LAYER_GLUE_MAX = 45  # the layer's own ops (GEMMs, bias gradients, GELU, packed-weight cat, ...): 42 measured
# small heads and blocks (the op structure does not depend on them)
SHAPE = dict(dim=64, n_heads=4, n_kv_groups=2, d_k=32, d_v=32, l=8, d=4, l_sel=8, n_sel=3, w=8)
LENGTHS = (16, 64)  # 2 selection blocks (fewer than n_sel: the padded case) and 8


@pytest.fixture(scope="module")
def counts():
    bench = bench_ops()
    layer = bench.make_layer(**SHAPE)
    return bench, {s: bench.count_layer(layer, s, warmup=i == 0) for i, s in enumerate(LENGTHS)}


def test_the_op_count_does_not_grow_with_the_sequence_length(counts):
    _, by_len = counts
    a, b = (by_len[s] for s in LENGTHS)
    assert a.total == b.total and a.ops == b.ops, (a.ops, b.ops)
    assert sum(a.launches.values()) == sum(b.launches.values())
    assert a.launches["_prep_fwd_kernel"] == 1 and a.launches["_combine_bwd_kernel"] == 1
    assert "_index_scatter" not in a.launches  # index_build "auto" is the torch build under the interpreter


def test_the_layers_own_ops_stay_within_budget(counts):
    _, by_len = counts
    c = by_len[LENGTHS[0]]
    inside_attention = sum(sum(c.by_custom.get(op, {}).values()) for op in ATTENTION_OPS)
    own = c.total - inside_attention
    assert own <= LAYER_GLUE_MAX, (own, c.ops)
    # whatever stays in aten outside the custom ops is GEMMs and their bias/gelu/cat companions, no RoPE or gates
    for name in ("cos", "sin", "sigmoid", "silu", "neg", "pow", "slice_backward", "unfold_backward"):
        assert c.ops[name] == 0, (name, c.ops)
    # autograd fills no zero gradient for the custom ops' outputs that carry none (lse, the index tables)
    zeros_inside = sum(c.by_custom.get(op, {}).get("zeros", 0) for op in c.by_custom)
    assert c.ops["zeros"] == zeros_inside, (c.ops["zeros"], c.by_custom)


def test_at_most_80_ops_per_layer(monkeypatch):
    """The layer as a GPU runs it: with the Triton build of the index, which index_build "auto" takes there
    (test_triton_selected; under the interpreter "auto" takes the torch build, whose 53 aten ops the `counts`
    above include: 132 in all at S 256)."""
    from nsa.attention.kernels.selected_attn import index as triton_index

    # the interpreter's sort of 2,048 pairs takes seconds; the ops do not depend on the chunk
    monkeypatch.setattr(triton_index, "PAIRS", 64)
    bench = bench_ops()
    layer = bench.make_layer(**SHAPE, index_build="triton")
    by_len = {s: bench.count_layer(layer, s, warmup=i == 0) for i, s in enumerate(LENGTHS)}
    totals = {s: c.total for s, c in by_len.items()}
    assert all(t <= bench.MAX_OPS for t in totals.values()) and len(set(totals.values())) == 1, totals
    inner = by_len[LENGTHS[0]].by_custom["nsa::selected_attention_fwd"]
    assert sum(inner.values()) <= 8, inner  # the index is 1 zeros + Triton launches; the rest is the forward's own
    assert by_len[LENGTHS[0]].launches["_index_scatter"] == 1
