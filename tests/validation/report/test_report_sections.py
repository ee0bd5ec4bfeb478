"""The report's sections that say what a run means: what each tokens/s was measured at (sequence, batches, model,
precision, world size, TFLOP/s, MFU), the open problems, the one command that runs the validated settings, and the
performance analysis against an earlier run. From results.json alone (the fixtures), in both formats."""

from __future__ import annotations

import copy
import json
import os
import re
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

from validation import contracts
from validation.analysis import metrics
from validation.report import findings, render
from validation.report.command import validated_command
from validation.formatting import context_text, shared_context_text
from validation.report.performance import performance_view
from validation.report.problems import open_problems
from validation.kinds import get as get_kind

FIXTURES = Path(__file__).parents[1] / "fixtures"
CONTEXT = {"seq_len": 2048, "micro_batch": 2, "accum": 4, "world_size": 2, "global_batch_tokens": 32768,
           "n_params": 124_500_000, "precision": "bf16", "flops_per_token": 7.9e8, "peak_flops": 312e12,
           "device": "NVIDIA A100-SXM4-80GB"}


@pytest.fixture
def results() -> dict:
    return json.loads((FIXTURES / "results_example.json").read_text(encoding="utf-8"))


@pytest.fixture
def against(results) -> dict:
    results["performance_analysis"] = json.loads((FIXTURES / "performance_analysis.json").read_text("utf-8"))
    return results


# ---------------------------------------------------------------------------------------------------------------
# What a tokens/s means

def test_run_context_from_env_json():
    env = {"world_size": 4, "n_params": 186296, "flops_per_token": 1100017.0, "peak_flops": None,
           "device_name": "cpu", "config": {"train": {"seq_len": 256, "batch_size": 4, "accum": 3,
                                                       "precision": "fp32"}}}
    ctx = contracts.run_context(env)
    assert ctx == {"seq_len": 256, "micro_batch": 4, "accum": 3, "world_size": 4, "global_batch_tokens": 256 * 4 * 3 * 4,
                   "n_params": 186296, "precision": "fp32", "flops_per_token": 1100017.0, "peak_flops": None,
                   "device": "cpu"}
    assert contracts.run_context({}) == {}
    damaged = contracts.run_context({"config": {"train": {"seq_len": "x", "batch_size": -1}}, "world_size": True})
    assert damaged["seq_len"] is None and damaged["micro_batch"] is None and damaged["global_batch_tokens"] is None
    # achieved model TFLOP/s = FLOPs per token x global tokens/s
    assert metrics.model_tflops(1.1e6, 40000.0) == pytest.approx(0.044)
    assert metrics.model_tflops(None, 40000.0) is None and metrics.model_tflops(1.1e6, float("nan")) is None


def test_context_text_beside_every_tokens_per_second(results):
    m = {"context": CONTEXT, "tflops_per_s": 105.3, "mfu": {"mean": 0.1688}}
    assert context_text(m) == ("seq_len 2,048, micro-batch 2, accum 4, world size 2, global batch 32,768 tokens, "
                               "params 124.5M, precision bf16, TFLOP/s 105.3, MFU 16.9%")
    cpu = {"context": {**CONTEXT, "peak_flops": None}, "tflops_per_s": 0.0127}
    assert context_text(cpu).endswith("TFLOP/s 0.0127, MFU n/a (device peak unknown)")
    assert context_text({}) == ""
    runs = [{"context": {**CONTEXT, "micro_batch": b}, "tflops_per_s": t} for b, t in ((2, 1.0), (4, 2.0))]
    shared = shared_context_text(runs)
    assert "micro-batch 2 / 4" in shared and "TFLOP/s" not in shared and "MFU 16.9%" not in shared

    # the report: the train table's context line, the sweep's per-row TFLOP/s and MFU, the key figure
    base = results["steps"]["baseline"]["metrics"]
    base.update(context=CONTEXT, tflops_per_s=4.616, mfu={"mean": 0.0074, "n": 20})
    for run, tflops in zip(results["steps"]["bucket_sweep"]["runs"], (4.75, 4.63, 4.72)):
        run["metrics"].update(context=CONTEXT, tflops_per_s=tflops, mfu={"mean": tflops / 624})
    md = render(results, "md")
    line = ("seq_len 2,048, micro-batch 2, accum 4, world size 2, global batch 32,768 tokens, params 124.5M, "
            "precision bf16")
    assert f"Context of the tokens/s: {line}, TFLOP/s 4.62, MFU 0.7%" in md
    assert "| 25 | 6,012.4 | 85.3 | 1.4% | 20 | 4.75 | 0.8% | **BEST** |" in md
    assert f"Context of the tokens/s: {line}\n" in md  # the sweep's shared line: TFLOP/s and MFU are per row
    assert re.search(r"- \*\*Baseline throughput\*\*: 5,843\.2 ± 112\.4 tokens/s \(window mean ± stdev, all ranks\) — "
                     r".*; at " + re.escape(line), md)
    html = render(results, "html")
    assert f'<p class="context">Context of the tokens/s: {line}, TFLOP/s 4.62, MFU 0.7%</p>' in html
    # the console line printed when the step ends
    summary = get_kind("train").summary_line(results["steps"]["baseline"])
    assert summary == f" (5,843 tok/s mean, last 20 steps; {line}, TFLOP/s 4.62, MFU 0.7%)"


# ---------------------------------------------------------------------------------------------------------------
# Open problems

def test_open_problems_lists_every_failure_warning_and_skip(results):
    results["steps"]["fused_adamw"]["notes"] = ["fused: the trainer ignored NSA_OPT_FUSED on this machine"]
    results["steps"]["single"]["metrics"].update(status="short", note="window has 12 of the 20 steps asked")
    results["steps"]["longrun"].update(status="timeout", reason="exceeded 900 s")
    problems = open_problems(results)
    table = [(p["severity"], p["where"], p["what"]) for p in problems]
    # failures first, then skipped, then warnings; each with its reason
    assert table[0] == ("TIMEOUT", "step longrun", "exceeded 900 s")
    assert table[1][:2] == ("FAIL", "criterion Selection v2 faster")
    assert "got sel_perf.ranges_speedup_min = 0.871" in table[1][2]
    assert ("SKIPPED", "step ddp_nccl", "needs 2 GPU(s), found 0") in table
    assert ("SKIPPED", "criterion NCCL baseline throughput",
            "not evaluated: ddp_nccl: skipped (needs 2 GPU(s), found 0)") in table
    assert ("WARN", "step fused_adamw", "fused: the trainer ignored NSA_OPT_FUSED on this machine") in table
    assert ("WARN", "step single", "training.csv: window has 12 of the 20 steps asked") in table
    assert ("WARN", "step snapshot", results["steps"]["snapshot"]["reason"]) in table  # passed with a caveat
    assert any(s == "WARN" and w.startswith("criterion Per-rank scaling") for s, w, _ in table)
    ranks = ["FAIL TIMEOUT".split(), ["SKIPPED"], ["WARN"]]
    order = [next(i for i, r in enumerate(ranks) if s in r) for s, _, _ in table]
    assert order == sorted(order)
    # a criterion that failed, a skipped step: both formats list them under "Open Problems"
    md = render(results, "md")
    section = md[md.index("## Open Problems"):md.index("## Recommendations")]
    assert "| TIMEOUT | step longrun | exceeded 900 s |" in section
    assert "| SKIPPED | step ddp_nccl | needs 2 GPU(s), found 0 |" in section
    assert "- **Open problems**: " + str(len(problems)) in md
    html = render(results, "html")
    assert '<span class="status warn">WARN</span></td><td>step fused_adamw</td>' in html


def test_no_open_problems():
    results = {"verdict": "GO", "steps": {"a": {"kind": "train", "status": "passed"}},
               "phases": [{"name": "p", "steps": ["a"]}], "acceptance": [{"name": "x", "status": "pass"}]}
    assert open_problems(results) == []
    assert "None: every step ran and passed and every criterion holds." in render(results, "md")


# ---------------------------------------------------------------------------------------------------------------
# Run with the validated settings

def _stub_torchrun(tmp_path: Path) -> Path:
    """A `torchrun` that records its argv and the NSA_/NCCL_ environment it was given."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "torchrun"
    stub.write_text("#!/usr/bin/env python3\nimport json, os, sys\n"
                    "print(json.dumps({'argv': sys.argv[1:], 'env': {k: v for k, v in os.environ.items() "
                    "if k.startswith(('NSA_', 'NCCL_'))}}))\n")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def test_validated_command_runs_only_settings_that_ran_together(results, tmp_path):
    cmd = validated_command(results)
    assert cmd["step"] == "baseline"
    # executed by a shell as a user would paste it: the trainer gets the config, the flags and the environment of
    # the baseline step as it ran; the sweep's recommended bucket (25 MB) ran in another step, so it is named beside
    # the command, never merged into it (settings measured apart are not validated together)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("NSA_", "NCCL_"))}
    env["PATH"] = f"{_stub_torchrun(tmp_path)}:{env['PATH']}"
    out = subprocess.run(["bash", "-c", cmd["text"]], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["argv"] == ["--nproc_per_node=2", "-m", "nsa.train", "--config", "configs/tiny_cpu.yaml", "--dataset",
                           "synthetic", "--ddp", "1", "--save-every", "100000", "--steps", "60"]
    assert got["env"] == results["steps"]["baseline"]["env"]
    assert got["env"]["NSA_DDP_BUCKET_MB"] == "50" and results["recommendations"]["env"]["NSA_DDP_BUCKET_MB"] == "25"
    assert cmd["apart"]["NSA_DDP_BUCKET_MB"] == "25" and "NSA_DDP_BUCKET_MB=25" in cmd["note"]
    assert "not run together with it" in cmd["note"]
    # one block in both reports
    md = render(results, "md")
    assert "### Run with the validated settings" in md
    assert f"```bash\n{cmd['text']}\n```" in md
    assert "the run ended NO-GO." in md and "These settings are not validated until a run of them ends GO." in md
    assert "--out-dir" not in cmd["text"]


def test_validated_command_keeps_the_step_arguments_and_quotes_values(results):
    results["verdict"] = "GO"
    results["steps"]["bucket_sweep"]["winner"]["params"] = {"args.batch_size": 8, "env.NSA_DDP_BUCKET_MB": "25"}
    results["steps"]["baseline"]["env"]["NCCL_SOCKET_IFNAME"] = "eth0 eth1"
    cmd = validated_command(results)
    tokens = shlex.split(cmd["text"].replace("\\\n", " "))
    assert "NCCL_SOCKET_IFNAME=eth0 eth1" in tokens
    assert "--batch-size" not in tokens  # the sweep's winning argument ran in the sweep, not with this command
    assert "not validated until" not in cmd["note"]
    for step in results["steps"].values():
        if step["kind"] == "train":
            step["status"] = "failed"
    none = validated_command(results)
    assert none["lines"] == [] and none["note"] == "No validated command: no training step passed."
    assert "No validated command: no training step passed." in render(results, "md")
    for name in [n for n, step in results["steps"].items() if step["kind"] == "train"]:
        del results["steps"][name]  # a runbook that trains in no step (gpu_kernels): nothing failed to train
    assert (validated_command(results)["note"]
            == "No validated command: this runbook has no train step to build it from.")


# ---------------------------------------------------------------------------------------------------------------
# Performance analysis against an earlier run

def test_performance_analysis_section(against):
    view = performance_view(against)
    assert view["against"] == "artifacts/validate/cpu_smoke-20250830T090000Z"
    assert view["summary"] == "5 metrics compared, 4 tested: 1 significantly better, 1 significantly worse"
    rows = {(r["step"], r["metric"]): r for r in view["rows"]}
    base = rows[("baseline", "toks_per_s")]
    assert (base["mean_a"], base["mean_b"], base["rel_delta"], base["ci_range"], base["p"], base["verdict"]) == (
        "6,620.5", "5,843.2", "-11.7%", "-16.2% to -7.1%", "0.002", "worse")
    assert rows[("baseline", "final_loss")]["p"] == "not tested"
    assert view["notes"] == ["baseline final_loss: one value per run: shown, not tested, never gating"]
    md = render(against, "md")
    sections = ["## Test Results Summary", "## Performance Analysis", "## Acceptance Criteria Assessment"]
    assert [md.index(s) for s in sections] == sorted(md.index(s) for s in sections)
    finding = against["performance_analysis"]["key_finding"]["text"]
    assert f"- **Key finding against the earlier run**: {finding}" in md
    assert ("| baseline | toks_per_s | 6,620.5 | 5,843.2 | -11.7% | -16.2% to -7.1% | 0.002 | worse (significant) |"
            in md)
    assert "| bucket_sweep[NSA_DDP_BUCKET_MB=50] | toks_per_s | 5,830.0 | 5,861.7 | +0.5% | -3.1% to +4.3% | 1.000 | same |" in md
    assert "Holm's step-down correction over 4 tested rows" in md
    assert "- WARN: host differs" in md
    # the significant regression is an open problem too
    assert any(p["where"] == "baseline toks_per_s vs earlier run" and p["severity"] == "WARN"
               for p in open_problems(against))
    html = render(against, "html")
    assert '<h2 id="performance">Performance Analysis</h2>' in html
    assert '<span class="status fail">worse</span> (significant)' in html
    alone = {k: v for k, v in against.items() if k != "performance_analysis"}
    assert "Against an earlier run" not in render(alone, "md")
    # the section stays whenever the run itself compared with and without (its A/B and sweep), else it is absent
    assert ("## Performance Analysis" in render(alone, "md")) == bool(findings.comparisons(alone))
    bare = {**alone, "steps": {k: v for k, v in alone["steps"].items() if v.get("kind") not in ("ab", "sweep")}}
    assert "Performance" not in render(bare, "md")


def test_key_finding_is_computed_when_absent_and_none_without_significant_rows(against):
    block = against["performance_analysis"]
    del block["key_finding"]
    assert performance_view(against)["key_finding"].startswith("baseline toks_per_s worse, -11.7% (95% CI -16.2% to")
    block["rows"][0]["rel_delta"] = -0.01  # now the improvement is the largest significant change
    assert performance_view(against)["key_finding"].startswith("bucket_sweep[NSA_DDP_BUCKET_MB=25] toks_per_s better")
    for row in block["rows"]:
        row["significant"] = False
    assert performance_view(against)["key_finding"] == "none: no metric changed significantly against the earlier run"
    block["rows"] = []
    view = performance_view(against)
    assert view["key_finding"] == "none: no metric could be compared with the earlier run"
    assert "No metric could be compared." in render(against, "md")
    damaged = copy.deepcopy(against)
    damaged["performance_analysis"] = {"rows": [None, {"ci_low": "x"}], "against": ["odd"]}
    for fmt in ("md", "html"):
        assert render(damaged, fmt)
