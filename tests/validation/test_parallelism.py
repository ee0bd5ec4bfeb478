"""validation.analysis.parallelism (the batch-size search, the recommendation rule of seed 003, exposed communication from a
profiler trace, scaling efficiency) and what the parallelism/scaling step kinds make of their runs, without
launching anything: each function against an independent reference (brute force, hand-computed figures)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from validation.analysis.collectives import bandwidth_row
from validation.analysis.parallelism import (SearchError, batch_search, exposed_comm, is_oom, recommend, scaling_table)
from validation.runbook.loader import RunbookError, load_runbook


# ---------------------------------------------------------------------------------------------- batch search
def fake_fits(threshold: int, calls: list[int]):
    def fits(b: int) -> bool:
        calls.append(b)
        return b <= threshold
    return fits


@pytest.mark.parametrize("start", [1, 2, 3, 5])
@pytest.mark.parametrize("maximum", [1, 7, 64])
def test_search_finds_the_largest_batch_that_fits_like_brute_force(start, maximum):
    if maximum < start:
        return
    for threshold in range(0, 80):
        calls: list[int] = []
        found = batch_search(fake_fits(threshold, calls), start, maximum)
        fitting = [b for b in range(start, maximum + 1) if b <= threshold]
        assert found.largest == (max(fitting) if fitting else None), (start, maximum, threshold)
        assert found.first_oom == (None if threshold >= maximum else max(threshold + 1, start))
        assert len(calls) == len(set(calls)), "no batch is launched twice"
        assert all(start <= b <= maximum for b in calls)
        assert [b for b, _ in found.tried] == calls and len(calls) <= 2 * maximum.bit_length() + 2


def test_search_doubles_then_bisects():
    calls: list[int] = []
    found = batch_search(fake_fits(37, calls), 1, 64)
    assert calls == [1, 2, 4, 8, 16, 32, 64, 48, 40, 36, 38, 37]
    assert (found.largest, found.first_oom, found.error) == (37, 38, None)


def test_search_stops_on_a_failure_that_is_not_out_of_memory():
    def fits(b):
        if b == 8:
            raise SearchError("batch 8: NaN loss")
        return True

    found = batch_search(fits, 1, 64)
    assert found.largest == 4 and found.error == "batch 8: NaN loss" and found.first_oom is None
    with pytest.raises(ValueError):
        batch_search(fits, 0, 4)
    with pytest.raises(ValueError):
        batch_search(fits, 8, 4)


def test_oom_recognised_in_reasons_and_tracebacks():
    assert is_oom(None, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
    assert is_oom("exit code 1 (rank 0: RuntimeError: CUDA error: out of memory)")
    assert not is_oom("exit code 1 (rank 0: NaN loss)", None, "")


# ---------------------------------------------------------------------------------------------- recommendation
def comp(rel, significant, p=None):
    return {"rel": rel, "ci_low": rel - 0.03, "ci_high": rel + 0.03, "p_value": p if p is not None else (
        0.001 if significant else 0.4), "significant": significant}


def ev(fits=True, peak=None, cap=None, toks=100.0):
    return {"fits": fits, "peak_gb": peak, "capacity_gb": cap, "toks_per_s": toks}


def test_small_model_fits_with_headroom_and_ddp_faster():
    r = recommend({"ddp": ev(peak=24, cap=80), "fsdp": ev(peak=14, cap=80), "fsdp_no_reshard": ev(peak=18, cap=80)},
                  {"fsdp:ddp": comp(-0.12, True), "fsdp_no_reshard:ddp": comp(-0.06, True),
                   "fsdp_no_reshard:fsdp": comp(0.07, True)})
    assert (r["strategy"], r["regime"]) == ("ddp", "fits_with_headroom")
    assert "significantly faster" in r["reason"] and "70.0% headroom" in r["reason"]
    assert "-12.0% tokens/s (95% CI -15.0% .. -9.0%, p = 0.001, significant)" in r["reason"]
    assert r["numbers"]["ddp"]["headroom"] == pytest.approx(0.7)


def test_no_significant_difference_keeps_ddp_and_says_so():
    r = recommend({"ddp": ev(peak=2, cap=10), "fsdp": ev(peak=1, cap=10)}, {"fsdp:ddp": comp(0.02, False)})
    assert r["strategy"] == "ddp" and "no significant difference" in r["reason"]
    assert "not significant" in r["reason"]


def test_fsdp_significantly_faster_wins_even_when_ddp_fits():
    r = recommend({"ddp": ev(peak=2, cap=10), "fsdp": ev(peak=1, cap=10)}, {"fsdp:ddp": comp(0.10, True)})
    assert r["strategy"] == "fsdp" and r["regime"] == "fits_with_headroom"


def test_large_model_ddp_does_not_fit():
    base = {"ddp": ev(fits=False), "fsdp": ev(peak=50, cap=80)}
    r = recommend({**base, "fsdp_no_reshard": ev(peak=60, cap=80)}, {"fsdp_no_reshard:fsdp": comp(0.02, False)})
    assert (r["strategy"], r["regime"]) == ("fsdp_no_reshard", "does_not_fit")  # 25% headroom, not slower
    assert "DDP does not fit" in r["reason"] and "ddp does not fit (out of memory)" in r["reason"]
    # the batch-size search found the batch out of memory while the runs that passed peaked well inside: the reason
    # is the search's, not a peak that fits
    searched = recommend({"ddp": {**ev(peak=10, cap=80), "fits": False, "largest_batch": 64}, "fsdp": ev(peak=50, cap=80)},
                         {})
    assert "ddp does not fit (out of memory: the largest micro-batch that fits is 64)" in searched["reason"]
    assert "peak 10 GB" not in searched["reason"]
    r = recommend({**base, "fsdp_no_reshard": ev(peak=75, cap=80)}, {"fsdp_no_reshard:fsdp": comp(0.02, False)})
    assert r["strategy"] == "fsdp"  # no-reshard fits but with 6% headroom only
    r = recommend({**base, "fsdp_no_reshard": ev(peak=60, cap=80)}, {"fsdp_no_reshard:fsdp": comp(-0.1, True)})
    assert r["strategy"] == "fsdp"  # no-reshard significantly slower
    r = recommend({**base, "fsdp_no_reshard": ev(fits=False)}, {})
    assert r["strategy"] == "fsdp"
    # a peak above the memory a rank has counts as not fitting even when the run survived (e.g. host swap)
    r = recommend({"ddp": ev(peak=90, cap=80), "fsdp": ev(peak=50, cap=80)}, {})
    assert r["regime"] == "does_not_fit" and r["strategy"] == "fsdp"


def test_nothing_fits():
    r = recommend({"ddp": ev(fits=False), "fsdp": ev(fits=False)}, {})
    assert r["strategy"] is None and r["regime"] == "does_not_fit" and "no strategy fits" in r["reason"]
    assert recommend({"fsdp": ev()}, {})["strategy"] is None


def test_tight_memory_takes_the_faster_else_fsdp():
    tight = {"ddp": ev(peak=76, cap=80), "fsdp": ev(peak=50, cap=80)}
    r = recommend(tight, {"fsdp:ddp": comp(-0.08, True)})
    assert (r["strategy"], r["regime"]) == ("ddp", "tight")
    assert "5.0% headroom" in r["reason"] and "-8.0% tokens/s" in r["reason"]
    r = recommend(tight, {"fsdp:ddp": comp(-0.01, False)})
    assert r["strategy"] == "fsdp" and "no strategy is significantly faster" in r["reason"]
    r = recommend(tight, {"fsdp:ddp": comp(0.05, True)})
    assert r["strategy"] == "fsdp"


# ---------------------------------------------------------------------------------------------- exposed comm
def x(name, ts, dur, tid=1, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "cat": cat}


def test_exposed_comm_cpu_trace():
    events = [x("ProfilerStep#5", 0, 1000, cat="user_annotation"),
              x("aten::mm", 0, 100), x("aten::mm", 10, 20), x("aten::add", 200, 300),  # compute 0-100, 200-500
              x("c10d::allreduce_", 90, 5),  # launching a collective is not compute: 90-95 exposed
              x("autograd::engine::evaluate_function: X", 500, 300), x("_c10d_functional::wait_tensor", 600, 200),
              x("gloo:all_reduce", 50, 200, tid=7, cat="user_annotation"),  # 50-250: exposed 90-95, 100-200
              x("gloo:all_reduce", 550, 200, tid=8, cat="user_annotation")]  # 550-750: compute until 600
    out = exposed_comm(events)
    assert out["comm_s"] == pytest.approx(400e-6)
    assert out["exposed_s"] == pytest.approx((5 + 100 + 150) * 1e-6)
    assert out["steps"] == 1 and out["per_step_exposed_s"] == pytest.approx(255e-6)
    assert exposed_comm([x("aten::mm", 0, 100)]) is None


def test_exposed_comm_gpu_kernels():
    k = lambda name, ts, dur: x(name, ts, dur, tid=7, cat="kernel")  # noqa: E731
    events = [x("ProfilerStep#1", 0, 500, cat="user_annotation"), x("ProfilerStep#2", 500, 500, cat="user_annotation"),
              k("sm80_gemm", 0, 300), k("ncclDevKernel_AllReduce_Sum_f32", 200, 200), k("elementwise", 350, 20)]
    out = exposed_comm(events)
    assert out["comm_s"] == pytest.approx(200e-6) and out["exposed_s"] == pytest.approx((50 + 30) * 1e-6)
    assert out["steps"] == 2 and "NCCL" in out["source"]


# ---------------------------------------------------------------------------------------------- scaling
def test_scaling_efficiency():
    t = scaling_table({1: 100.0, 2: 180.0, 4: None}, "strong")
    assert [(r["speedup"], r["efficiency"]) for r in t["rows"][:2]] == [(1.0, 1.0), (1.8, 0.9)]
    # 4 ranks not measured: no min or last (the min of the others is of fewer points, the last another size's)
    assert t["rows"][2]["efficiency"] is None and (t["efficiency"]["min"], t["efficiency"]["last"]) == (None, None)
    # 1 rank not measured: the rows are against 2 ranks, but no min or last (4 against 2 is not the step's efficiency)
    t = scaling_table({1: None, 2: 100.0, 4: 180.0}, "strong")
    assert t["base"] == 2 and t["rows"][2]["efficiency"] == pytest.approx(0.9)
    assert (t["efficiency"]["min"], t["efficiency"]["last"]) == (None, None)
    assert "1 not measured" in t["efficiency"]["reason"]
    t = scaling_table({2: 100.0, 8: 300.0}, "weak")  # base 2: 4x the ranks, 3x the throughput
    assert t["base"] == 2 and t["rows"][1]["efficiency"] == pytest.approx(0.75)
    assert scaling_table({1: None}, "weak")["efficiency"]["min"] is None
    # the min is over the world sizes beyond the base: a superlinear point shows (the base's 1.0 would hide it)
    t = scaling_table({1: 100.0, 2: 210.0, 4: 440.0}, "strong")
    assert t["efficiency"]["min"] == pytest.approx(1.05) and t["efficiency"]["last"] == pytest.approx(1.1)
    e = scaling_table({1: 100.0}, "weak")["efficiency"]
    assert (e["min"], e["last"]) == (None, None)
    with pytest.raises(ValueError):
        scaling_table({1: 1.0}, "diagonal")


# ---------------------------------------------------------------------------------------------- the step's figures
def summary(strategy, per_step, model_bytes, comm_time=0.5, steps=10):
    return {"schema": 1, "world_size": 2, "steps": steps, "avg_step_time_excl_first_s": 0.2,
            "peak_mem_alloc_gb": 0.5, "peak_mem_reserved_gb": None, "memory_kind": "cpu_rss",
            "memory_model": {"total": 1024 ** 3}, "comm_time_s": comm_time, "comm_share": 0.2,
            "comm": {"counted_by": "x", "per_step": per_step},
            "comm_model": {"strategy": strategy, "per_step": {r["kind"]: {"bytes": model_bytes.get(r["kind"], 0)}
                                                              for r in per_step}},
            "comm_model_matches": all(model_bytes.get(r["kind"]) == r["bytes"] for r in per_step)}


def test_strategy_figures_predict_from_the_comm_tables():
    from validation.kinds.parallelism.analysis import NOT_AVAILABLE, comm_tables, strategy_figures
    from validation.kinds.parallelism import Strategy

    table = [bandwidth_row("all_reduce", 2, b, t) for b, t in ((1024, 1e-4), (65536, 1e-3), (1 << 20, 1e-2))]
    results = {"steps": {"comm": {"status": "passed", "metrics": {
        "world_size": 2, "backend": "gloo", "source": "torch",
        "all_reduce": {"table": table, "sizes": 3, "busbw_gbps": {"max": 1, "median": 1}}}}}}
    step = SimpleNamespace(comm="comm")
    tables, why = comm_tables(step, results)
    assert set(tables) == {"all_reduce"} and "comm step 'comm'" in why
    per_step = [{"kind": "all_reduce", "calls": 2, "bytes": 66560, "sizes": [65536, 1024]}]
    runs = [{"label": "ddp", "status": "passed", "metrics": {"toks_per_s": {"mean": m}}} for m in (100.0, 110.0)]
    infos = [{"summary": summary("ddp", per_step, {"all_reduce": 66560}), "trace": None}] * 2
    s = strategy_figures("ddp", Strategy(strategy="ddp"), runs, infos, tables, why)
    assert s["comm_predicted_s"] == pytest.approx(1e-3 + 1e-4)  # the two sizes are table rows
    assert s["comm_time_s"] == pytest.approx(0.05) and s["toks_per_s"] == pytest.approx(2 / (1 / 100 + 1 / 110))  # work over time
    assert s["comm_model_matches"] is True and s["comm_bytes_counted"] == s["comm_bytes_model"] == 66560
    # tables measured at another world size predict nothing here
    s8 = strategy_figures("ddp", Strategy(strategy="ddp"), runs, infos, tables, why, 8)
    assert s8["comm_predicted_s"] is None and "measured at world size 8, these runs ran at 2" in s8["comm_prediction"]
    assert strategy_figures("ddp", Strategy(strategy="ddp"), runs, infos, tables, why, 2)["comm_predicted_s"] > 0
    # no comm step: prediction not available, said so
    s = strategy_figures("ddp", Strategy(strategy="ddp"), runs, infos, *comm_tables(SimpleNamespace(comm=None), {}))
    assert s["comm_predicted_s"] is None and s["comm_prediction"] == NOT_AVAILABLE
    # a comm step that was skipped: not available, with the reason
    skipped = {"steps": {"comm": {"status": "skipped", "reason": "phase comm skipped (--skip)"}}}
    assert comm_tables(step, skipped)[1].startswith("not available: comm step 'comm' skipped (phase comm skipped")
    # a mismatch in one run makes the strategy's flag false
    bad = [infos[0], {"summary": summary("ddp", per_step, {"all_reduce": 1}), "trace": None}]
    assert strategy_figures("ddp", Strategy(strategy="ddp"), runs, bad, None, "n/a")["comm_model_matches"] is False


def test_the_step_time_comes_from_the_window_its_tokens_per_s_comes_from():
    """The strategy's step time beside its tokens/s is the mean of the runs' windowed step_time_s (the profiler's
    steps, slower, stay outside the window), not the summary's whole-run average that counts them; a run with no
    windowed step time falls back to its summary."""
    from validation.kinds.parallelism.analysis import strategy_figures
    from validation.kinds.parallelism import Strategy

    per_step = [{"kind": "all_reduce", "calls": 1, "bytes": 1024, "sizes": [1024]}]
    infos = [{"summary": summary("ddp", per_step, {"all_reduce": 1024}), "trace": None}] * 2  # whole run: 0.2 s
    runs = [{"label": "ddp", "status": "passed",
             "metrics": {"toks_per_s": {"mean": 100.0}, "step_time_s": {"mean": t}}} for t in (0.1, 0.12)]
    assert strategy_figures("ddp", Strategy(strategy="ddp"), runs, infos, None, "n/a")["step_time_s"] == \
        pytest.approx(0.11)
    runs[1]["metrics"].pop("step_time_s")
    assert strategy_figures("ddp", Strategy(strategy="ddp"), runs, infos, None, "n/a")["step_time_s"] == \
        pytest.approx(0.15)


def test_view_formats_real_results():
    """(A damaged step: tests/validation/kinds/test_registry.py, every kind.)"""
    from validation.kinds import get
    from validation.report.renderer import blocks_markdown

    result = {"order_seed": 7, "metrics": {
        "repeats": 2, "recommendation": "ddp", "regime": "fits_with_headroom", "recommendation_reason": "because",
        "capacity": {"gb": 8.0, "source": "host"}, "headroom": 0.2, "batch_search": {"skipped": "CPU"},
        "comparisons": {"fsdp:ddp": {"text": "+1.0% ...", "verdict": "same"}},
        "strategies": {"ddp": {"strategy": "ddp", "runs": 2, "passed": 2, "toks_per_s": 1000.0,
                               "toks_per_s_runs": [900.0, 1100.0], "step_time_s": 0.25,
                               "comm_bytes_counted": 745184, "comm_bytes_model": 745184, "comm_model_matches": True,
                               "memory_model": {"total": 1024 ** 3 * 2}, "comm_time_s": 0.0143}}}}
    md = blocks_markdown(get("parallelism").blocks(get("parallelism").read(result)))
    assert "| ddp | DDP | 2/2 | 250.0 ms | 1,000.0 (900.0 .. 1,100.0) | n/a |" in md
    assert "| ddp | 745,184 B | 745,184 B | yes | 14.3 ms |" in md
    assert md.count("2.000 GiB") == 1  # the model's total
    assert "**Batch-size search**: CPU" in md and "**Recommendation**: ddp (fits_with_headroom) — because" in md
    assert "seed 7" in md


# ---------------------------------------------------------------------------------------------- runbook keys
RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5, batch_size: 4}, nproc_per_node: 2}
phases:
  - name: p
    steps:
      - {name: par, kind: parallelism, %s}
      - {name: sc, kind: scaling, world_sizes: [1, 2], %s}
acceptance:
  - {name: c, expr: "par.all_ran"}
"""


@pytest.mark.parametrize("par,scale,needle", [
    ("strategies: [ddp, zero3]", "modes: [weak]", "strategies[1]: expected one of ddp, fsdp, fsdp_no_reshard"),
    ("strategies: {a: {strategy: ddp, args: {stepz: 1}}}", "modes: [weak]", "stepz"),
    ("batch_search: {start: 8, max: 4}", "modes: [weak]", "batch_search.max: must be >= start (8)"),
    ("comm: nothere", "modes: [weak]", "comm 'nothere' must name an earlier step of kind comm"),
    ("headroom: 1.5", "modes: [weak]", "headroom"),
    ("repeats: 2", "global_batch: 3", "global_batch 3 does not divide by world size(s) [2]"),
    ("repeats: 2", "modes: [diagonal]", "modes"),
])
def test_bad_keys_are_one_clear_error(tmp_path, par, scale, needle):
    path = tmp_path / "rb.yaml"
    path.write_text(RB % (par, scale))
    with pytest.raises(RunbookError) as info:
        load_runbook(path, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    assert needle in str(info.value)


def test_plan_of_the_strategies_and_world_sizes(tmp_path):
    from validation.runbook.plan import step_launches

    path = tmp_path / "rb.yaml"
    path.write_text(RB % ("strategies: {ddp: {strategy: ddp}, ddp_accum2: {strategy: ddp, args: {accum: 2}}, "
                          "fsdp: {strategy: fsdp}}, repeats: 2", "global_batch: 8"))
    rb = load_runbook(path, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2]))
    par, sc = rb.steps()
    specs = step_launches(par, None, None)
    assert sorted(s.label for s in specs) == ["ddp", "ddp", "ddp_accum2", "ddp_accum2", "fsdp", "fsdp"]
    for s in specs:
        argv = " ".join(s.argv)
        assert ("--fsdp" in argv) == (s.label == "fsdp") and ("--ddp 1" in argv) == (s.label != "fsdp")
        assert ("--accum 2" in argv) == (s.label == "ddp_accum2") and "--profile-steps 2" in argv
    by_label = {s.label: s for s in step_launches(sc, None, None)}
    assert {k: (v.nproc_per_node, v.argv[v.argv.index("--batch-size") + 1]) for k, v in by_label.items()} == {
        "strong_n1": (1, "8"), "strong_n2": (2, "4"), "weak_n1": (1, "4"), "weak_n2": (2, "4")}
    json.dumps([s.params for s in specs])  # params stay JSON


def test_search_batches_launches_probes_and_reads_oom(tmp_path, monkeypatch):
    """The live part of the search with the launches faked: each probe is a trainer launch at --batch-size b with
    the search's steps; a failure whose reason says out of memory is "does not fit", any other stops the search."""
    from validation.kinds.parallelism import analysis
    from validation.kinds.parallelism.records import Capacity, Metrics
    from validation.kinds import trainer
    from validation.results.codec import decode

    path = tmp_path / "rb.yaml"
    path.write_text(RB % ("strategies: [ddp, fsdp], batch_search: {start: 2, max: 64, steps: 3}", "modes: [weak]"))
    par = load_runbook(path, cwd=str(__import__("pathlib").Path(__file__).resolve().parents[2])).steps()[0]
    limits = {"ddp": 12, "fsdp": 40}
    launched = []

    def fake_collect(ctx, step, spec, lr):
        argv = spec.argv
        batch = int(argv[argv.index("--batch-size") + 1])
        assert argv[argv.index("--steps") + 1] == "3" and "--profile-steps" not in argv
        label = spec.label.split("@")[0]
        launched.append((label, batch, spec.dir))
        if label == "fsdp" and batch == 32:
            return "failed", "exit code 1 (rank 0: NaN loss)", {}
        ok = batch <= limits[label]
        return ("passed", None, {}) if ok else ("failed", "exit code 1 (rank 1: torch.OutOfMemoryError: CUDA out of "
                                                          "memory. Tried to allocate 1.00 GiB)", {})

    monkeypatch.setattr(trainer, "collect", fake_collect)
    ctx = SimpleNamespace(run_dir=tmp_path, launch=lambda spec, i, n: SimpleNamespace(reason="", excerpt=None),
                          winners=dict)
    saved = []
    out = analysis.search_batches(par, Metrics(capacity=Capacity(device="cuda")), ctx, on_progress=saved.append)
    assert out["ddp"].largest == 12 and out["ddp"].first_oom == 13 and out["ddp"].error is None
    assert out["fsdp"].largest == 16 and out["fsdp"].error.startswith("batch 32: exit code 1 (rank 0: NaN")
    assert [list(s) for s in saved] == [["ddp"], ["ddp", "fsdp"]]  # saved as each strategy's search ends
    assert len({d for _, _, d in launched}) == len(launched), "every probe has its own directory"
    assert analysis.search_batches(par, Metrics(capacity=Capacity(device="cpu")), ctx).skipped.startswith(
        "skipped on CPU")
    # the recommendation uses what the search found: DDP's largest batch below the batch needed -> does not fit
    m = {"strategies": {k: {"passed": 2, "oom": 0, "peak_alloc_gb": 10.0, "peak_reserved_gb": None,
                            "toks_per_s": 1.0} for k in ("ddp", "fsdp")},
         "capacity": {"gb": 80.0}, "comparisons": {}, "batch_search": {"ddp": {"largest": 2}, "fsdp": {"largest": 16}}}
    m = analysis.decide_recommendation(par, decode(Metrics, m, "metrics"))  # args.batch_size 4
    assert m.batch_needed == 4 and m.regime == "does_not_fit" and m.recommendation == "fsdp"


# ---------------------------------------------------------------------------------------------- across ranks
def test_aligned_collectives_later_start_to_later_end():
    from validation.analysis.parallelism import aligned_collectives
    step = x("ProfilerStep#5", 0, 1000, cat="user_annotation")
    # rank 1 starts each all-reduce 300 us late (its backward was slower); rank 0 waits in flight meanwhile
    r0 = [step, x("gloo:all_reduce", 100, 400), x("gloo:all_reduce", 600, 150), x("gloo:all_gather", 800, 50)]
    r1 = [step, x("gloo:all_reduce", 400, 120), x("gloo:all_reduce", 700, 60), x("gloo:all_gather", 820, 40)]
    out = aligned_collectives([r0, r1])
    # later start -> later end: (520-400) + (760-700) = 180 us; all_gather (860-820) = 40 us
    assert out["by_kind"]["all_reduce"] == {"calls": 2, "total_s": pytest.approx(180e-6)}
    assert out["by_kind"]["all_gather"]["total_s"] == pytest.approx(40e-6)
    assert out["total_s"] == pytest.approx(220e-6) and out["steps"] == 1 and out["per_step_s"] == pytest.approx(220e-6)
    assert aligned_collectives([r0]) is None and aligned_collectives([[step], [step]]) is None


def test_aligned_collectives_nccl_kernels_pair_by_order_per_kind():
    from validation.analysis.parallelism import aligned_collectives
    k = lambda name, ts, dur: x(name, ts, dur, tid=7, cat="kernel")  # noqa: E731
    r0 = [k("ncclDevKernel_AllGather_RING_LL", 0, 100), k("ncclDevKernel_ReduceScatter_Sum_f32", 200, 100),
          k("ncclDevKernel_AllGather_RING_LL", 400, 100)]
    r1 = [k("ncclDevKernel_AllGather_RING_LL", 50, 60), k("ncclDevKernel_ReduceScatter_Sum_f32", 250, 80),
          k("ncclDevKernel_AllGather_RING_LL", 390, 100)]
    out = aligned_collectives([r0, r1])
    assert out["by_kind"]["all_gather"] == {"calls": 2, "total_s": pytest.approx((110 - 50 + 500 - 400) * 1e-6)}
    assert out["by_kind"]["reduce_scatter"]["total_s"] == pytest.approx((330 - 250) * 1e-6)
    assert out["steps"] == 0 and out["per_step_s"] is None


def test_prediction_note_over_2x():
    from validation.kinds.parallelism.view import prediction_note
    note = prediction_note("ddp", 0.4e-3, 2.6e-3, 11.4e-3)  # aligned wins over rank 0's in-flight time
    assert note and "ranks aligned" in note and "compute_ms" in note and "back to back" in note and "6.5x" in note
    assert prediction_note("ddp", 1.0e-3, 1.9e-3, 20e-3) is None  # within 2x (in-flight time not used)
    assert "in-flight" in prediction_note("ddp", 1.0e-3, None, 3e-3)
    assert prediction_note("ddp", None, 1e-3, 1e-3) is None
