"""benchmarks/bench_train.py's case list and comparison lines (no training: the cases it would run and the lines
it prints from given runs)."""

from __future__ import annotations

import pytest

from benchmark_scripts import load

bench = load("bench_train")


def test_variant_parsing():
    assert bench.parse_variant("base") == ("base", {})
    assert bench.parse_variant("new:NSA_OPT_FUSED=1, NSA_LOSS=chunked") == (
        "new", {"NSA_OPT_FUSED": "1", "NSA_LOSS": "chunked"})
    for bad in ("", ":A=1", "x y", "a:NSA_OPT_FUSED", "a:=1"):
        with pytest.raises(ValueError, match="--variant"):
            bench.parse_variant(bad)


def test_cases_alternate_variants_and_size_long_contexts():
    variants = [("a", {}), ("b", {"NSA_OPT_FUSED": "1"})]
    cases = bench.gpu_cases(["graphs", "compile+graphs"], ["dense"], [2048, 32768], variants)
    assert len(cases) == 2 * 2 * 2
    # the variants of one (model, mode, context) are adjacent: repeats alternate them (A B, then B A)
    assert [c["variant"] for c in cases] == ["a", "b"] * 4
    assert len({c["name"] for c in cases}) == len(cases)
    long = [c for c in cases if c["seq_len"] == 32768]
    assert all(c["batch"] == 1 and c["flags"][-6:] == ["--batch-size", "1", "--accum", "1", "--seq-len", "32768"]
               for c in long)
    assert all("--compile" in c["flags"] and "--cuda-graphs" in c["flags"] for c in cases
               if c["mode"] == "compile+graphs")
    assert all(c["env"] == {"NSA_OPT_FUSED": "1"} for c in cases if c["variant"] == "b")
    short = [c for c in cases if c["seq_len"] == 2048]
    assert all("--seq-len" not in c["flags"] and c["batch"] == 8 for c in short)
    # the default run keeps its case names
    assert [c["name"] for c in bench.gpu_cases(["eager"])] == ["m7c_125m_s2048_bf16", "m7c_125m_s2048_bf16_dense"]


def _run(case, model, variant, rep, tps, seq=2048, mode="graphs"):
    return {"case": case, "ranks": 1, "model": model, "mode": mode, "variant": variant, "seq_len": seq, "batch": 8,
            "repeat": rep, "toks_per_s": tps, "attention_kernel": "k",  # and the figures collect() derives:
            "toks_per_s_stdev": 0.0, "toks_per_s_per_rank": tps, "achieved_tflops": 1e-3 * tps, "mfu": None,
            "peak_mem_gb": 1.0}


def test_ab_lines_pair_the_runs_of_each_repeat():
    runs = {"d@a": [_run("d@a", "dense", "a", 0, 100.0), _run("d@a", "dense", "a", 1, 80.0)],
            "d@b": [_run("d@b", "dense", "b", 0, 110.0), _run("d@b", "dense", "b", 1, 96.0)],
            "n@a": [_run("n@a", "nsa", "a", 0, 50.0), _run("n@a", "nsa", "a", 1, 60.0)],
            "n@b": [_run("n@b", "nsa", "b", 0, 50.0), _run("n@b", "nsa", "b", 1, 60.0)]}
    results = [bench.summarize(r) for r in runs.values()]
    lines = bench.comparisons(results, runs)
    dense_ab = next(line for line in lines if line.startswith("A/B dense"))
    # medians 90 and 103; paired ratios 1.1 and 1.2 (the repeat where both were slow pairs with itself)
    assert "= 1.144" in dense_ab and "1.100 / 1.150 / 1.200 over 2" in dense_ab
    assert any(line.startswith("A/B nsa") and "= 1.000" in line for line in lines)
    assert any("@b] graphs: NSA / dense twin tokens/s = 0.534" in line for line in lines)  # 55 / 103
