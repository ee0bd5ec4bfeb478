"""benchmarks/tune_kernels.py's plumbing at a tiny shape (the interpreter on CPU, the GPU where present): a
candidate configuration really reaches the launcher (its outputs equal the shipped configuration's up to summation
order), both are timed, and the launchers are left as they were."""

from __future__ import annotations

import math

import pytest

from triton_test_utils import KERNEL_DEVICE, ON_GPU, needs_triton

from benchmark_scripts import load

pytestmark = needs_triton

tune = load("tune_kernels")


@pytest.mark.parametrize("family,cand", [("range_dkdv", 4), ("sel_bwd", 3)])
def test_a_candidate_runs_beside_the_shipped_configuration(family, cand):
    from nsa.attention.kernels.range_attn import host as triton_range
    from nsa.attention.kernels.selected_attn import host as triton_selected

    before = (triton_range.query_config, triton_range.dkdv_config, triton_selected._config)
    row = tune.run_case(family, cand, 48, 1, device=KERNEL_DEVICE.type, dtype_name="bf16" if ON_GPU else "fp32",
                        repeats=1, warmup=0)
    assert (triton_range.query_config, triton_range.dkdv_config, triton_selected._config) == before
    assert row["config"] == str(list(tune.FAMILIES[family][cand])) and not row["wrong"]
    assert row["max_rel_diff"] < (tune.WRONG if ON_GPU else 1e-5)
    for which in ("shipped", "candidate"):
        assert 0 < row[which]["fwd"]["min"] <= row[which]["fwd"]["median"] <= row[which]["fwd"]["max"]
        assert row[which]["bwd"]["min"] > 0
    assert math.isfinite(row["ratio_fwdbwd"]) and row["ratio_fwdbwd"] > 0


def test_the_patch_reaches_the_launcher():
    from nsa.attention.kernels.range_attn import host as triton_range
    from nsa.attention.kernels.selected_attn import host as triton_selected

    undo = tune._patch("range_q", (64, 128, 4, 3))
    try:
        assert triton_range.query_config(64, 64) == triton_range.LaunchConfig(64, 128, 4, 3)
    finally:
        undo()
    assert triton_range.query_config(64, 64) == triton_range.LARGE_Q
    undo = tune._patch("sel_bwd", (64, 32, 4, 2))
    try:
        assert triton_selected._config("bwd", 6, 64, 64) == (64, 32, 4, 2)
        assert triton_selected._config("out", 6, 64, 64) == (128, 64, 8, 1)  # the other kinds as shipped
    finally:
        undo()
    assert triton_selected._config("bwd", 6, 64, 64) == (32, 64, 8, 1)


def test_a_named_dkdv_choice_runs_beside_the_shipped_one_and_is_undone():
    """The range_dkdv candidates after the tuples are DKDV_CHOICES names (a tile and the cmp launch's split)."""
    from nsa.attention.kernels.range_attn import host as triton_range

    cand = tune.FAMILIES["range_dkdv"].index("w4s1_split")
    assert tune._select("w4s1_split,1", "range_dkdv") == [cand, 1]
    row = tune.run_case("range_dkdv", cand, 48, 1, device=KERNEL_DEVICE.type,
                        dtype_name="bf16" if ON_GPU else "fp32", repeats=1, warmup=0)
    assert triton_range.DKDV_CHOICE == "auto"
    assert row["config"] == "w4s1_split" and not row["wrong"]
    assert row["max_rel_diff"] < (tune.WRONG if ON_GPU else 1e-5)


def test_ctas_per_sm_from_registers_and_shared_memory():
    assert tune.ctas_per_sm(133, 33024, 8, 90) == (1, "registers")  # 136 x 256 threads > 32,768
    assert tune.ctas_per_sm(128, 33024, 8, 90) == (2, "registers")
    assert tune.ctas_per_sm(204, 24576, 4, 90) == (2, "registers")
    assert tune.ctas_per_sm(64, 120000, 4, 90) == (1, "shared memory")
    assert tune.ctas_per_sm(24, 1024, 4, 90) == (16, "threads")


def test_a_named_query_choice_reaches_both_launches_and_is_undone():
    """The range_q candidates after the tuples are QUERY_CHOICES names (the forward and the dQ tile); a tuple
    reaches both launches too."""
    from nsa.attention.kernels.range_attn import host as triton_range

    names = tune.FAMILIES["range_q"]
    assert [n for n in names if isinstance(n, str)] == [n for n in triton_range.QUERY_CHOICES if n != "shipped"]
    assert tune._select("m64_bn32,bn32,1,bn32", "range_q") == [names.index("m64_bn32"), names.index("bn32"), 1]
    with pytest.raises(ValueError, match="bn32_s3"):
        tune._select("nope", "range_q")
    undo = tune._patch("range_q", "m64_bn32")
    try:
        assert triton_range.QUERY_CHOICE == "m64_bn32"
        assert triton_range.fwd_config(64, 64) == triton_range.dq_config(64, 64) == triton_range.LaunchConfig(64, 32, 4)
    finally:
        undo()
    assert triton_range.QUERY_CHOICE == "auto" and triton_range.fwd_config(64, 64) == triton_range.LARGE_Q
    undo = tune._patch("range_q", (64, 64, 8, 2))
    try:
        assert triton_range.fwd_config(64, 64) == triton_range.dq_config(64, 64) == triton_range.LaunchConfig(64, 64, 8)
    finally:
        undo()
    assert triton_range.dq_config(64, 64) == triton_range.query_config(64, 64) == triton_range.LARGE_Q
