"""The parallelism analysis against its definitions: the byte model counted by hand from parameter sizes, and the
recommendation on evidence whose right answer is known."""

import pytest

from nsa.training.comm_model import ParamSpec, comm_model
from validation.analysis.parallelism import aligned_collectives, exposed_comm, recommend

# a root (embedding 100 x 8, head 8 x 100, norm 8) and two blocks of a 6 x 8 and a 7-row x 3 parameter, fp32
SPECS = [ParamSpec("emb.weight", (100, 8), 4), ParamSpec("blocks.0.w", (6, 8), 4, "blocks.0"),
         ParamSpec("blocks.0.g", (7, 3), 4, "blocks.0"), ParamSpec("blocks.1.w", (6, 8), 4, "blocks.1"),
         ParamSpec("blocks.1.g", (7, 3), 4, "blocks.1"), ParamSpec("norm.weight", (8,), 4),
         ParamSpec("head.weight", (100, 8), 4)]


def test_ddp_all_reduces_the_gradient_bytes_once_per_step_and_bf16_halves_them():
    grad_bytes = sum(s.numel * 4 for s in SPECS)
    for accum in (1, 4):
        assert comm_model(SPECS, "ddp", world_size=4, accum=accum).bytes_per_step == grad_bytes
    assert comm_model(SPECS, "ddp", world_size=4, compress="bf16").bytes_per_step == grad_bytes // 2


def test_fsdp_gathers_forward_and_backward_and_reduce_scatters_once():
    world = 4
    # per unit, world x its padded shards (rows rounded up to a multiple of world): the all-gather output
    root = world * (25 * 8 + 25 * 8 + 2 * 1) * 4  # 100 rows -> 25 per rank; norm 8 -> 2 per rank
    block = world * (2 * 8 + 2 * 3) * 4  # 6 rows -> 2 (padded from 1.5); 7 rows -> 2
    full = comm_model(SPECS, "fsdp", world_size=world, accum=2)
    assert full.per_step["all_gather"]["sizes"] == [root, block, block, block, block] * 2  # fwd 3 + bwd 2 blocks
    assert full.per_step["reduce_scatter"]["sizes"] == [block, block, root]  # once per step, backward order
    keep = comm_model(SPECS, "fsdp", world_size=world, accum=2, reshard_after_forward=False)
    assert keep.per_step["all_gather"]["sizes"] == [root, block, block] * 2  # no backward all-gather
    assert keep.per_step["reduce_scatter"] == full.per_step["reduce_scatter"]


def sig(rel):
    return {"rel": rel, "ci_low": rel - 0.03, "ci_high": rel + 0.03, "p_value": 0.001, "significant": True}


def same(rel):
    return {"rel": rel, "ci_low": rel - 0.2, "ci_high": rel + 0.2, "p_value": 0.6, "significant": False}


def ev(peak, cap=80):
    return {"fits": True, "peak_gb": peak, "capacity_gb": cap, "toks_per_s": 100.0}


def test_ddp_is_not_kept_when_both_fsdp_modes_are_significantly_faster():
    """Both FSDP modes +30% (significant) over DDP, not different from each other: the rule took DDP with the
    reason "no FSDP mode is significantly faster", which its own numbers contradict."""
    r = recommend({"ddp": ev(10), "fsdp": ev(6), "fsdp_no_reshard": ev(8)},
                  {"fsdp:ddp": sig(0.30), "fsdp_no_reshard:ddp": sig(0.32), "fsdp_no_reshard:fsdp": same(0.01)})
    assert r["regime"] == "fits_with_headroom" and r["strategy"] == "fsdp_no_reshard"
    assert "no FSDP mode is significantly faster" not in r["reason"]
    # one mode faster than DDP, the other neither faster than DDP nor different from the first: the faster one
    r = recommend({"ddp": ev(10), "fsdp": ev(6), "fsdp_no_reshard": ev(8)},
                  {"fsdp:ddp": sig(0.25), "fsdp_no_reshard:ddp": same(0.1), "fsdp_no_reshard:fsdp": same(-0.1)})
    assert r["strategy"] == "fsdp"


def test_tight_memory_never_takes_a_strategy_significantly_slower_than_another():
    tight = {"ddp": ev(76), "fsdp": ev(40), "fsdp_no_reshard": ev(50)}
    # DDP significantly faster than full shard; no-reshard not different from either: not full shard
    r = recommend(tight, {"fsdp:ddp": sig(-0.3), "fsdp_no_reshard:ddp": same(-0.05), "fsdp_no_reshard:fsdp": same(0.1)})
    assert r["regime"] == "tight" and r["strategy"] == "fsdp_no_reshard"
    # both FSDP modes significantly faster than DDP: the reason must not say nothing is
    r = recommend(tight, {"fsdp:ddp": sig(0.3), "fsdp_no_reshard:ddp": sig(0.3), "fsdp_no_reshard:fsdp": same(0.0)})
    assert r["strategy"] == "fsdp" and "no strategy is significantly faster" not in r["reason"]
    r = recommend(tight, {"fsdp:ddp": same(0.0), "fsdp_no_reshard:ddp": same(0.0), "fsdp_no_reshard:fsdp": same(0.0)})
    assert r["strategy"] == "fsdp" and "no strategy is significantly faster" in r["reason"]


# ---------------------------------------------------------------------------------------------- GPU traces
def x(name, ts, dur, tid=1, cat="cpu_op", pid=1):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid, "cat": cat}


def gpu_rank(shift=0.0):
    """Two profiled steps of one rank on a GPU: each ProfilerStep#N on the host and, as Kineto writes every
    record_function range, again as a gpu_user_annotation over the step's kernels on the stream."""
    out = []
    for i, t0 in enumerate((0, 1000)):
        out += [x(f"ProfilerStep#{i + 1}", t0, 1000, cat="user_annotation"),
                x(f"ProfilerStep#{i + 1}", t0 + 50, 900, tid=7, pid=0, cat="gpu_user_annotation"),
                x("sm90_gemm", t0 + 50, 300, tid=7, pid=0, cat="kernel"),
                x("ncclDevKernel_AllReduce_Sum_f32", t0 + 300 + shift, 200, tid=7, pid=0, cat="kernel")]
    return out


def test_per_step_figures_of_a_gpu_trace_count_each_profiled_step_once():
    """gpu_user_annotation copies of ProfilerStep#N doubled the step count: every per-step figure halved."""
    out = exposed_comm(gpu_rank())
    assert out["steps"] == 2
    assert out["per_step_comm_s"] == pytest.approx(200e-6) and out["per_step_exposed_s"] == pytest.approx(150e-6)
    aligned = aligned_collectives([gpu_rank(), gpu_rank(shift=20)])
    assert aligned["steps"] == 2 and aligned["per_step_s"] == pytest.approx(200e-6)  # latest start to latest end


def test_tight_memory_without_a_difference_takes_no_reshard_over_ddp_when_full_shard_does_not_fit():
    """Tight for DDP (5% headroom), full shard out of memory, no-reshard fits with 37.5%, no significant
    difference: the rule saves memory (full shard, no-reshard, DDP in that order), so no-reshard, not DDP."""
    oom = {"fits": False, "peak_gb": None, "capacity_gb": 80, "toks_per_s": None}
    r = recommend({"ddp": ev(76), "fsdp": oom, "fsdp_no_reshard": ev(50)}, {"fsdp_no_reshard:ddp": same(0.0)})
    assert r["regime"] == "tight" and r["strategy"] == "fsdp_no_reshard"
    assert "no strategy is significantly faster" in r["reason"]
    r = recommend({"ddp": ev(76), "fsdp_no_reshard": ev(50)}, {"fsdp_no_reshard:ddp": same(0.0)})
    assert r["strategy"] == "fsdp_no_reshard"
    # nothing but DDP fits: DDP
    r = recommend({"ddp": ev(76), "fsdp": oom}, {})
    assert (r["strategy"], r["regime"]) == ("ddp", "tight")


@pytest.mark.parametrize("cap, headroom", [(80, 0.2), (10, 0.3), (100, 0.1), (48, 0.35)])
def test_a_peak_exactly_at_the_headroom_limit_fits_with_headroom(cap, headroom):
    """The module doc: fits with headroom when peak <= (1 - headroom) x capacity, the limit included."""
    limit = (1 - headroom) * cap
    r = recommend({"ddp": ev(limit, cap), "fsdp": ev(limit / 2, cap)}, {"fsdp:ddp": same(0.0)}, headroom=headroom)
    assert (r["strategy"], r["regime"]) == ("ddp", "fits_with_headroom")
    # DDP out of memory, both FSDP modes fit, no-reshard exactly at the limit: no-reshard (doc: fits with headroom)
    r = recommend({"ddp": {"fits": False}, "fsdp": ev(limit / 2, cap), "fsdp_no_reshard": ev(limit, cap)},
                  {"fsdp_no_reshard:fsdp": same(0.0)}, headroom=headroom)
    assert r["strategy"] == "fsdp_no_reshard"
