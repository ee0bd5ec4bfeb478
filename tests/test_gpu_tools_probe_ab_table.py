"""benchmarks/ab_table.py on hand-built GPU outputs in the formats next_run.sh's steps write: S3's
bench_selection --topk-ab JSON (topk / sort per alternated call) is in the table with its own verdict per S and
measure, and a bench_attention file whose step the log says was cut or skipped (a file an earlier call left) is a
failed round, never a figure of the run."""

from __future__ import annotations

import json
import re
import os
import subprocess
from pathlib import Path

import pytest

from benchmark_scripts import load

ab = load("ab_table")
SCRIPT = Path(__file__).resolve().parents[1] / "reports" / "gpu" / "next_run.sh"


def _topk_ab(folder: Path, rows: list[dict], repeats: int = 11) -> None:
    """bench_selection --topk-ab's --json: per S the medians (ms, with min / max) of each choice, topk / sort of the
    medians and the min / max of the rounds' topk / sort, for the tiled selection and for choose_blocks."""
    by_s = []
    for s, tiled, choose in rows:
        row = {"seq_len": s}
        for what, (sort_ms, topk_ms, rmin, rmax) in (("tiled", tiled), ("choose", choose)):
            for name, ms in (("sort", sort_ms), ("topk", topk_ms)):
                row.update({f"{what}_{name}_ms": ms, f"{what}_{name}_ms_min": ms * 0.95,
                            f"{what}_{name}_ms_max": ms * 1.1})
            row.update({f"{what}_ratio": topk_ms / sort_ms, f"{what}_ratio_min": rmin, f"{what}_ratio_max": rmax})
        by_s.append(row)
    data = {"device": "cuda", "dtype": "torch.bfloat16", "shape": {"b": 1, "h": 12}, "parity": True,
            "repeats": repeats, "by_seq_len": by_s, "tiled_ratio_max": max(r["tiled_ratio"] for r in by_s),
            "choose_ratio_max": max(r["choose_ratio"] for r in by_s)}
    (folder / "topk_ab.json").write_text(json.dumps(data, indent=2) + "\n")


def test_the_selection_topk_ab_is_in_the_table_round_by_round(tmp_path, capsys):
    # (S, tiled (sort ms, topk ms, rounds' min, max), choose_blocks (...)): the ratios are topk / sort of times
    _topk_ab(tmp_path, [(2048, (0.40, 0.20, 0.45, 0.60), (0.10, 0.09, 0.80, 1.05)),
                        (65536, (3.0, 3.6, 1.10, 1.30), (1.0, 0.7, 0.60, 1.0))])
    recs = {(r["label"], r["case"]): r for r in ab.comparisons(tmp_path, ("shipped", "sort", "old"))}
    assert set(recs) == {("topk_ab tiled selection", "2048"), ("topk_ab choose_blocks", "2048"),
                         ("topk_ab tiled selection", "65536"), ("topk_ab choose_blocks", "65536")}
    tiled = recs[("topk_ab tiled selection", "2048")]
    assert (tiled["baseline"], tiled["choice"], tiled["verdict"]) == ("sort", "topk", "faster in every round")
    assert tiled["rounds"][0]["ratio"]["call"] == pytest.approx(0.5)
    assert recs[("topk_ab choose_blocks", "2048")]["verdict"] == "mixed"  # one round of 11 was slower
    assert recs[("topk_ab tiled selection", "65536")]["verdict"] == "slower in every round"
    # a round at exactly 1.0 is not faster: every round means every round
    assert recs[("topk_ab choose_blocks", "65536")]["verdict"] == "mixed"
    assert ab.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert ("| topk_ab tiled selection | 2048 | topk vs sort | 1-11 calls | per call 0.400, 0.200 | 0.500 (rounds "
            "0.450-0.600) | - | **faster in every round** (by chance 1 in 2,048: 11 rounds) |") in out
    # one call decides nothing, however fast
    _topk_ab(tmp_path, [(2048, (0.40, 0.20, 0.5, 0.5), (0.10, 0.05, 0.5, 0.5))], repeats=1)
    assert {r["verdict"] for r in ab.comparisons(tmp_path, ("shipped",))} == {"incomplete"}


def _bench(folder: Path, name: str, fwdbwd_ms: float) -> None:
    """A bench_attention --json of one timed case (medians in s, as it writes them)."""
    times = {m: {"min": v * 0.9e-3, "median": v * 1e-3, "max": v * 1.1e-3}
             for m, v in (("fwd", fwdbwd_ms / 3), ("bwd", fwdbwd_ms * 2 / 3), ("fwdbwd", fwdbwd_ms))}
    (folder / name).write_text(json.dumps({"shape": "m7c", "results": [
        {"path": "nsa-triton", "seq_len": 65536, "batch": 1, "times_s": times, "repeats": 5}], "checks": []}))


def test_a_file_whose_step_was_cut_or_skipped_is_a_failed_round(tmp_path, capsys):
    """A warm machine's second call: round 2's files are the first call's, since this call's round-2 steps were cut
    by their limit or skipped for time (next_run.sh's log says so); they are not this run's figures."""
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for case in ("65536", "2048b8"):
        for r, (base, choice) in enumerate(((10.0, 8.0), (10.0, 9.0)), 1):
            _bench(kernels, f"layer_shipped_r{r}_{case}.json", base)
            _bench(kernels, f"layer_auto_r{r}_{case}.json", choice)
    (tmp_path / "log.txt").write_text(
        "[3s] K1_layer_shipped_r1_65536 exit 0 (limit 90s)\n"
        "[40s] K1_layer_auto_r1_65536 exit 0 (limit 90s)\n"
        "[70s] K1_layer_shipped_r1_2048b8 exit 0 (limit 60s)\n"
        "[95s] K1_layer_auto_r1_2048b8 exit 0 (limit 60s)\n"
        "[130s] K1_layer_shipped_r2_65536 exit 0 (limit 30s)\n"
        "[161s] K1_layer_auto_r2_65536 exit 124 (limit 30s)\n"
        "[161s] SKIPPED K1_layer_shipped_r2_2048b8: 12s left, it needs about 25s\n"
        "[161s] SKIPPED K1_layer_auto_r2_2048b8: 12s left, it needs about 25s\n")
    recs = {r["case"]: r for r in ab.comparisons(kernels, ("shipped",))}
    for case in ("65536", "2048b8"):
        rec = recs[case]
        assert rec["verdict"] == "incomplete", case  # the files alone read "faster in every round"
        assert rec["rounds"][0]["ratio"]["fwdbwd"] == pytest.approx(0.8) and "failed" not in rec["rounds"][0]
        assert rec["rounds"][1]["ratio"] == {} and rec["rounds"][1]["choice_ms"] is None
    assert "K1_layer_auto_r2_65536: exit 124" in recs["65536"]["rounds"][1]["failed"]
    assert recs["65536"]["rounds"][1]["baseline_ms"]["fwdbwd"] == 10.0  # its own step exited 0
    assert "skipped" in recs["2048b8"]["rounds"][1]["failed"]
    # a step that failed and then ran again to exit 0 is a figure
    with (tmp_path / "log.txt").open("a") as log:
        log.write("[200s] K1_layer_auto_r2_65536 exit 0 (limit 30s)\n")
    assert {r["case"]: r["verdict"] for r in ab.comparisons(kernels, ("shipped",))}["65536"] == \
        "faster in every round"


def test_the_loss_bench_is_read_against_its_reference(tmp_path):
    """bench_loss's --json: per implementation the call's min / median / max ms and its per-round time / the
    reference's time (median and range); fused is faster in every round, chunked in some only."""
    by_impl = {"reference": {"ms_min": 9.0, "ms_median": 10.0, "ms_max": 11.0, "ratio_median": 1.0, "ratio_min": 1.0,
                             "ratio_max": 1.0, "peak_gib": 6.2},
               "chunked": {"ms_min": 9.1, "ms_median": 9.5, "ms_max": 12.0, "ratio_median": 0.95, "ratio_min": 0.9,
                           "ratio_max": 1.02, "peak_gib": 1.1, "loss_diff": 0.0},
               "fused": {"ms_min": 6.0, "ms_median": 6.5, "ms_max": 7.0, "ratio_median": 0.65, "ratio_min": 0.6,
                         "ratio_max": 0.7, "peak_gib": 0.4, "loss_diff": 0.0}}
    (tmp_path / "loss.json").write_text(json.dumps({
        "device": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "tokens": 16384, "vocab": 50304,
        "dim": 768, "dtype": "bf16", "chunk": 4096, "repeats": 10, "by_impl": by_impl}, indent=2) + "\n")
    recs = {r["choice"]: r for r in ab.comparisons(tmp_path, ("shipped", "sort", "old"))}
    assert set(recs) == {"chunked", "fused"} and {r["baseline"] for r in recs.values()} == {"reference"}
    assert recs["fused"]["verdict"] == "faster in every round" and recs["chunked"]["verdict"] == "mixed"
    assert recs["fused"]["rounds"][0]["baseline_ms"] == {"call": 10.0} and recs["fused"]["case"] == "16384 x 50304"


def _runs(folder: Path, name: str, tok_s: dict[str, list[float | None]]) -> None:
    """bench_train --variant's <name>.runs.json (one row per run; a run that failed has none) and its <name>.json
    of summaries (each with the repeat of its median run), the dense twin in graphs mode."""
    runs, summary = [], []
    for variant, per_rep in tok_s.items():
        for rep, value in enumerate(per_rep):
            if value is not None:
                runs.append({"case": f"m7c_125m_s2048_bf16_dense+graphs@{variant}", "ranks": 1, "toks_per_s": value,
                             "mfu": 0.16, "model": "dense", "mode": "graphs", "variant": variant,
                             "env": {"NSA_OPT_FUSED": "0"}, "seq_len": 2048, "batch": 8, "repeat": rep})
        done = [v for v in per_rep if v is not None]
        summary.append({"case": f"m7c_125m_s2048_bf16_dense+graphs@{variant}", "ranks": 1, "toks_per_s": max(done),
                        "model": "dense", "mode": "graphs", "variant": variant, "seq_len": 2048, "batch": 8,
                        "repeat": 0, "runs": len(done), "toks_per_s_min": min(done), "toks_per_s_max": max(done)})
    (folder / f"{name}.runs.json").write_text(json.dumps(runs, indent=2) + "\n")
    (folder / f"{name}.json").write_text(json.dumps(summary, indent=2) + "\n")


def test_the_trainer_variants_are_read_as_throughput(tmp_path, capsys):
    """T1's variants against "old", per repeat: more tokens/s is faster, so the time ratio is old's tokens/s over
    the variant's (rope: 200k / 210k = 0.952 and 0.909); a run that failed leaves its round missing."""
    _runs(tmp_path, "dense_each_change", {"old": [200e3, 200e3], "rope": [210e3, 220e3], "adam": [230e3, None],
                                          "loss": [190e3, 180e3]})
    recs = {r["choice"]: r for r in ab.comparisons(tmp_path, ("shipped", "sort", "old"))}
    assert set(recs) == {"rope", "adam", "loss"}  # the runs only: the summaries are no second comparison
    rope = recs["rope"]
    assert (rope["baseline"], rope["case"], rope["verdict"]) == ("old", "dense graphs S 2048 B 8",
                                                                  "faster in every round")
    assert [r["ratio"]["time"] for r in rope["rounds"]] == pytest.approx([200 / 210, 200 / 220])
    assert recs["loss"]["verdict"] == "slower in every round"
    assert recs["adam"]["verdict"] == "incomplete"  # its second run failed: one round only
    assert ab.main([str(tmp_path)]) == 0
    assert "| dense_each_change | dense graphs S 2048 B 8 | rope vs old | 2 | tok/s 200,000, 220,000 | 0.909 (time) " \
           "| - | **faster in every round** (by chance 1 in 4: 2 rounds) |" in capsys.readouterr().out
    # bench_train writes its runs and exits 1 when one failed: the file is this call's; cut at its limit, it is not
    (tmp_path / "log.txt").write_text("[250s] T1_dense_each_change exit 1 (limit 240s)\n")
    assert {r["choice"]: r["verdict"] for r in ab.comparisons(tmp_path, ("old",))}["rope"] == "faster in every round"
    (tmp_path / "log.txt").write_text("[250s] T1_dense_each_change exit 124 (limit 240s)\n")
    assert {r["verdict"] for r in ab.comparisons(tmp_path, ("old",))} == {"incomplete"}


@pytest.mark.parametrize("part", ["kernels", "selection", "choices", "trainer"])
def test_each_ab_file_is_found_by_its_step_in_next_run_sh(tmp_path, part):
    """next_run.sh's own steps (its DRY mode: each step's command, run nothing): the step of every A/B file the
    table reads (K3, K4, S3, C3, T1) names that file, so that the log's exit of the step reaches the file's rounds."""
    env = {**os.environ, "PART": part, "OUT": str(tmp_path / "out"), "W": str(tmp_path / "w"),
           "DRY": str(tmp_path / "argv"), "BUDGET": "100000"}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=SCRIPT.parents[2], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    checked = 0
    for f in sorted((tmp_path / "argv").glob("*.argv")):
        step, argv = f.stem.split("_", 1)[1], f.read_bytes().decode().split("\0")[:-1]
        if "--json" not in argv or not step.startswith(("K3_", "K4_", "S3_", "C3_", "T0_", "T1_")):
            continue
        if re.search(r"_resume\d+$", step):  # continues the file of the step before it (bench_choices' JSON says
            continue                                # itself which of its arms finished)
        stem = Path(argv[argv.index("--json") + 1]).name.split(".")[0]
        m = ab.STEP_OF_FILE.match(step)
        assert m and m["stem"] == stem, (step, stem)
        checked += 1
    assert checked > 0
