"""The readers that turn a GPU session's JSON and logs into decisions, on partial output shaped as the scripts write
it: benchmarks/ab_table.py (bench_choices' JSON of a run cut before its own checks, a file cut mid-write, a round or
a variant never measured, ratios outside a time's range, malformed blocks), profile_layer.py's roofline and its
reading of a case's output, and bench_train.py's crediting of each model's fastest mode. Every "faster in every
round" holds in every round; what was not measured says so; nothing crashes."""

from __future__ import annotations

import json
import math
import subprocess

import pytest

from benchmark_scripts import load

ab = load("ab_table")
pl = load("profile_layer")
bt = load("bench_train")

H100 = "NVIDIA H100 80GB HBM3"
SHAPE = dict(dim=768, n_heads=12, n_kv_groups=2, d_k=64, d_v=64)
GLUE = "void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor>"


def _block(ms: float, loss: float = 1.0, grad_norm: float = 3.0) -> dict:
    """One bench_choices block: its medians (seconds) of forward, backward and their sum, and its outputs."""
    times = {"fwd": ms * 0.4e-3, "bwd": ms * 0.6e-3, "fwdbwd": ms * 1e-3}
    return {"times_s": {m: {"min": t, "median": t, "max": t} for m, t in times.items()}, "passes": 5,
            "loss": loss, "grad_norm": grad_norm}


def _choices(arms: dict, **extra) -> dict:
    return {"bench": "choices", "seq_len": 65536, "batch": 1, "baseline": "shipped", "rounds": 2,
            "arm_settings": {"shipped": {}, **{a: {} for a in arms}}, "arms": arms, "in_progress": None, **extra}


def _arm(*pairs, **extra) -> dict:
    """An arm's rounds from (baseline ms, arm ms[, baseline loss]) per round."""
    return {"rounds": [{"round": i + 1, "baseline": _block(p[0], *p[2:]), "arm": _block(p[1])}
                       for i, p in enumerate(pairs)], **extra}


@pytest.mark.parametrize("ratios, want", [
    ([-0.9, -0.8], "incomplete"),  # a negative time on one side: no measurement, never "faster"
    ([0.0, 0.5], "incomplete"),  # a zero time: no measurement
    ([math.nan, math.nan], "incomplete"),
    ([0.5, math.inf], "incomplete"),
    ([0.9, 0.95], "faster in every round"),
    ([1.0, 0.9], "mixed"),  # a tie is neither
    ([1.1, 1.0], "mixed"),
    ([0.9], "incomplete"),  # one round decides nothing
])
def test_a_ratio_outside_a_times_range_decides_nothing(ratios, want):
    assert ab.round_verdict(ratios) == want


def test_a_baseline_drift_in_a_run_cut_before_its_own_check_invalidates_every_arm(tmp_path):
    """bench_choices compares the baseline's outputs at the end of a run; a run cut by its step's time limit (or a
    lost CUDA context) never did. 9 ms against 10 ms in both rounds is faster, until the baseline's loss moved from
    1.0 to 1.5 (50%, beyond the 2% tolerance) in a later arm's block: then no arm of the file is a figure."""
    arms = {"fast": _arm((10, 9), (10, 9)), "late": _arm((10, 12, 1.5))}
    path = tmp_path / "choices_65536b1.json"
    path.write_text(json.dumps(_choices(arms, in_progress="late")))
    rec = {r["choice"]: r for r in ab.choices_records(tmp_path, path)}
    assert rec["fast"]["verdict"] == "incomplete"
    assert "the baseline's outputs changed: loss 1.5" in rec["fast"]["rounds"][-1]["failed"]
    assert all(not r["ratio"] for r in rec["fast"]["rounds"])
    # within the tolerance (1%): the finished arm keeps its verdict, by its own rounds' ratios 0.9 and 0.9
    arms["late"] = _arm((10, 12, 1.01))
    path.write_text(json.dumps(_choices(arms, in_progress="late")))
    rec = {r["choice"]: r for r in ab.choices_records(tmp_path, path)}
    assert rec["fast"]["verdict"] == "faster in every round"
    assert [r["ratio"]["fwdbwd"] for r in rec["fast"]["rounds"]] == [pytest.approx(0.9)] * 2
    assert rec["late"]["verdict"] == "incomplete"


def test_a_file_cut_mid_write_is_listed_as_not_measured(tmp_path, capsys):
    """bench_selection writes its JSON at the end: killed by timeout while writing, it leaves half a file. The log
    (next_run.sh's lines: an exit 124, a step skipped, a step done in an earlier call, a step run twice) gives the
    step's last exit."""
    whole = {"repeats": 11, "by_seq_len": [{"seq_len": 2048, "tiled_ratio": 0.9}]}
    (tmp_path / "topk_ab.json").write_text(json.dumps(whole)[:30])
    (tmp_path / "log.txt").write_text(
        "[3s] K3_topk_ab exit 124 (limit 90s)\n"
        "[4s] DONE K3_layer_topk_65536b1: exit 0 in an earlier call on this machine\n"
        "[5s] K4_choices_65536b1 exit 1 (limit 240s)\n"
        "[9s] K4_choices_65536b1_resume1 exit 0 (limit 240s)\n"
        "[10s] SKIPPED K4_choices_2048b8: 20s left, it needs about 180s\n")
    (rec,) = ab.comparisons(tmp_path, ("shipped", "sort"))
    assert rec["verdict"] == "not measured" and rec["label"] == "topk_ab"
    assert "not readable" in rec["rounds"][0]["failed"] and "exit 124" in rec["rounds"][0]["failed"]
    assert ab.step_problems(tmp_path) == ["K3_topk_ab: exit 124", "K4_choices_65536b1: exit 1",
                                          "K4_choices_2048b8: skipped (20s left, it needs about 180s)"]
    assert ab.main([str(tmp_path)]) == 0
    assert "**not measured**" in capsys.readouterr().out


def test_a_round_with_no_file_says_not_measured(tmp_path):
    """One bench_attention file per arm and round: the choice's round 2 never ran (its file is missing)."""
    def write(name, ms):
        case = {"path": "nsa-triton", "times_s": {"fwd": {"median": ms * 0.4e-3}, "fwdbwd": {"median": ms * 1e-3}}}
        (tmp_path / name).write_text(json.dumps({"results": [case]}))
    for r in (1, 2):
        write(f"layer_shipped_r{r}_65536.json", 10.0)
    write("layer_auto_r1_65536.json", 9.0)
    (rec,) = ab.comparisons(tmp_path, ("shipped",))
    assert rec["verdict"] == "incomplete"
    assert rec["rounds"][0]["ratio"]["fwdbwd"] == pytest.approx(0.9) and "failed" not in rec["rounds"][0]
    assert rec["rounds"][1]["failed"] == "choice not measured (no file)"


def test_malformed_blocks_are_no_figure_never_a_crash(tmp_path):
    """Shapes a benchmark killed at the wrong moment (or an older one) may leave: times_s not a mapping, a round
    that is not a record, a run without its repeat."""
    (tmp_path / "x_shipped_r1_1.json").write_text(json.dumps({"results": [{"times_s": [0.01]}]}))
    (tmp_path / "x_new_r1_1.json").write_text(json.dumps({"results": [{"times_s": None}]}))
    arms = {"odd": {"rounds": [None, {"round": 2, "baseline": {"times_s": None}, "arm": 5}]}}
    (tmp_path / "choices_1b1.json").write_text(json.dumps(_choices(arms)))
    runs = [{"toks_per_s": 100.0, "repeat": None, "variant": "old", "model": "dense", "mode": "graphs"},
            {"toks_per_s": 110.0, "repeat": 0, "variant": "rope", "model": "dense", "mode": "graphs"}]
    (tmp_path / "t.runs.json").write_text(json.dumps(runs))
    recs = {r["label"]: r for r in ab.comparisons(tmp_path, ("shipped", "old"))}
    assert recs["x"]["verdict"] == "incomplete" and recs["choices_1b1"]["verdict"] == "incomplete"
    assert "not measured" in recs["x"]["rounds"][0]["failed"]
    assert "t" not in recs  # no baseline run with a repeat to pair it by: no comparison
    assert ab.table(list(recs.values()))


def test_a_variant_none_of_whose_runs_ran_is_listed_not_measured(tmp_path):
    """bench_train --variant (T1): old and rope ran in repeat 0, rope failed in repeat 1, loss failed in both (its
    errors in the summaries, <name>.json; no row in <name>.runs.json)."""
    def run(variant, repeat, tps):
        return {"case": f"d@{variant}", "ranks": 1, "model": "dense", "mode": "graphs", "variant": variant,
                "seq_len": 2048, "batch": 8, "repeat": repeat, "toks_per_s": tps}
    runs = [run("old", 0, 100.0), run("rope", 0, 125.0), run("old", 1, 100.0)]
    (tmp_path / "each.runs.json").write_text(json.dumps(runs))
    errors = [{"case": "d@loss", "ranks": 1, "model": "dense", "mode": "graphs", "variant": "loss", "seq_len": 2048,
               "error": "boom"} for _ in (0, 1)]
    (tmp_path / "each.json").write_text(json.dumps([{**runs[0], "runs": 2}] + errors))
    recs = {r["choice"]: r for r in ab.comparisons(tmp_path, ("old",))}
    assert recs["rope"]["verdict"] == "incomplete"
    assert recs["rope"]["rounds"][0]["ratio"]["time"] == pytest.approx(100 / 125)
    assert recs["rope"]["rounds"][1]["failed"] == "choice not measured (its run failed)"
    assert recs["loss"]["verdict"] == "incomplete"
    assert [r["failed"] for r in recs["loss"]["rounds"]] == ["choice not measured (its run failed)"] * 2


@pytest.mark.parametrize("bad", [-0.5, math.nan])
def test_a_kernel_time_that_is_no_duration_is_flagged_not_summed(bad):
    """A glue kernel at -0.5 ms (or NaN) in the forward: no GPU time and no efficiency for the forward or the layer
    (a sum over it would read 0.5 ms, not 1.0), the backward's kept; the shares are of the 3.0 ms of real times."""
    by_pass = {"fwd": {"_range_fwd_kernel": [1.0, 2], GLUE: [bad, 1]}, "bwd": {"_range_bwd_dq_kernel": [2.0, 1]}}
    r = pl.roofline(by_pass, "nsa-triton", 65536, 1, H100, SHAPE)
    assert r["fwd_gpu_ms"] is None and r["efficiency_fwd"] is None and r["efficiency"] is None
    assert r["bwd_gpu_ms"] == pytest.approx(2.0) and r["efficiency_bwd"] is not None
    rows = {k["name"]: k for k in r["kernels"]}
    assert rows[GLUE]["bad_time"] and rows[GLUE]["share"] is None
    assert rows["_range_fwd_kernel"]["share"] == pytest.approx(1.0 / 3.0)
    assert len(r["bad_time"]) == 1 and r["bad_time"][0].startswith(f"fwd {GLUE[:20]}")
    text = "\n".join(pl.describe({**r, "device_name": H100}))
    assert "negative or not finite" in text and "GPU n/a ms" in text
    table = pl.as_json([{"path": "nsa-triton", "seq_len": 65536, "batch": 1, **r}])["kernels"]
    assert all(k["ms"] != k["ms"] or k["ms"] >= 0 or k.get("bad_time") for k in table)  # never summed into a row


def test_a_case_whose_output_is_not_its_record_is_an_error_not_a_crash(monkeypatch, tmp_path, capsys):
    """A --case subprocess that exits 0 but whose last line is not its JSON record (a line printed after it)."""
    monkeypatch.setattr(pl.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 0, stdout='{"kernel_launches": 3}\nAutotuning done\n', stderr=""))
    out = tmp_path / "p.json"
    assert pl.main(["--paths", "dense", "--seq-lens", "64", "--batch", "1", "--json", str(out)]) == 1
    (rec,) = json.loads(out.read_text())["results"]
    assert rec["path"] == "dense" and "Autotuning done" in rec["error"]
    # its record alone but without the figures the case's line prints: an error too, not a KeyError
    monkeypatch.setattr(pl.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 0, stdout='{"kernel_launches": 3}\n', stderr=""))
    assert pl.main(["--paths", "dense", "--seq-lens", "64", "--batch", "1", "--json", str(out)]) == 1
    assert "without its record" in json.loads(out.read_text())["results"][0]["error"]


def _summary(model, mode, tps, runs=1):
    return {"case": f"{model}+{mode}", "ranks": 1, "model": model, "mode": mode, "toks_per_s": tps, "runs": runs,
            "variant": "", "seq_len": 2048, "batch": 8, "config": "c.yaml", "attention_kernel": "auto"}


def test_a_nan_throughput_is_never_credited_as_the_fastest_mode():
    """max() over a NaN first keeps the NaN: NSA eager at NaN tokens/s against graphs at 150 credited eager."""
    lines = bt.comparisons([_summary("nsa", "eager", math.nan), _summary("nsa", "graphs", 150.0)])
    assert lines == ["nsa: fastest graphs of the measured modes (150 tokens/s; graphs 150, eager not measured)"]


def test_a_mode_not_measured_is_never_credited_fastest_and_is_said():
    """NSA's eager run gave NaN tokens/s (max() over a NaN keeps it when it comes first) and its compile failed:
    the fastest NSA mode is graphs, of the measured modes, and the fastest-of-each ratio says what it could not see
    (150 / 260 = 0.577)."""
    results = [_summary("nsa", "eager", math.nan), _summary("nsa", "graphs", 150.0),
               _summary("dense", "eager", 200.0), _summary("dense", "graphs", 250.0),
               _summary("dense", "compile", 260.0)]
    failed = [{"case": "nsa+compile", "ranks": 1, "model": "nsa", "mode": "compile", "variant": "", "seq_len": 2048,
               "batch": 8, "config": "c.yaml", "error": "boom"}]
    lines = bt.comparisons(results, None, failed)
    nsa = next(line for line in lines if line.startswith("nsa: "))
    assert nsa.startswith("nsa: fastest graphs of the measured modes (150 tokens/s;")
    assert "eager not measured" in nsa and "compile not measured" in nsa
    ratio = next(line for line in lines if line.startswith("fastest NSA"))
    assert f"{150 / 260:.3f}" in ratio and "not measured: nsa eager, compile" in ratio
    assert "compile: NSA / dense twin tokens/s not measured (nsa compile not measured)" in lines
    assert not any(line.startswith("eager: NSA / dense twin tokens/s =") for line in lines)


def test_main_passes_the_failed_cases_to_the_fastest_mode_lines(monkeypatch, capsys):
    """bench_train's run on a GPU with the trainer replaced: dense's graphs case fails, so dense has no mode beside
    eager and its fastest is said to be of the measured modes only."""
    def run_case(name, config, flags, steps, warmup, nproc, peak, timeout, env):
        if "_dense" in name and "--cuda-graphs" in flags:
            raise SystemExit(f"{name} x1 failed (1): boom")
        tps = 100.0 if "_dense" not in name else 200.0
        return {"case": name, "ranks": nproc, "device": "gpu", "steps": 60, "steady_steps": 50, "toks_per_s": tps,
                "toks_per_s_stdev": 1.0, "toks_per_s_per_rank": tps, "achieved_tflops": 1.0, "mfu": 0.1,
                "peak_mem_gb": 1.0, "params_m": 125.0, "flops_per_token_g": 1.0, "final_loss": 5.0, "wall_s": 1.0,
                "csv": "x.csv", "attention_kernel": "auto"}
    monkeypatch.setattr(bt, "run_case", run_case)
    monkeypatch.setattr(bt, "no_cuda_here", lambda: None)
    assert bt.main(["--device", "cuda", "--modes", "eager,graphs"]) == 1
    out = capsys.readouterr().out
    assert "dense: fastest eager of the measured modes (200 tokens/s; eager 200, graphs not measured)" in out
    assert "of the measured modes only (not measured: dense graphs)" in out


def test_an_ab_line_whose_variant_or_baseline_has_no_figure_says_not_measured():
    """--variant old (the baseline) and rope: old's graphs case failed, so rope's graphs line has no baseline (it
    was left out); rope's eager run gave NaN tokens/s (it printed "= nan"). Eager's old against fused: 110 / 100."""
    def summary(mode, variant, tps):
        return {**_summary("dense", mode, tps), "case": f"dense+{mode}@{variant}", "variant": variant}
    results = [summary("eager", "old", 100.0), summary("eager", "rope", math.nan), summary("graphs", "rope", 120.0),
               summary("eager", "fused", 110.0)]
    failed = [{**summary("graphs", "old", None), "error": "boom"}]
    lines = [line for line in bt.comparisons(results, None, failed, ["old", "rope", "fused"]) if line.startswith("A/B")]
    assert lines == ["A/B dense eager S 2,048: @rope / @old tokens/s not measured (@rope not measured)",
                     "A/B dense graphs S 2,048: @rope / @old tokens/s not measured (@old not measured)",
                     "A/B dense eager S 2,048: @fused / @old tokens/s = 1.100"]
