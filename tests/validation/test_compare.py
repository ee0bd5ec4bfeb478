"""compare_runs: direction of better, noise, and warnings when environments differ (on synthetic run dirs)."""

from __future__ import annotations

import copy

from validation.compare import compare_runs, environment_differences


def _csv(path, values):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = ["step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"]
    rows += [f"{i + 1},{5 - i * 0.01},0.001,{v},{4096 / v},1.0,1.0,{1.5 + i * 0.0}" for i, v in enumerate(values)]
    path.write_text("\n".join(rows) + "\n")


def _results(final_loss=4.0):
    return {"runbook": {"name": "rb"}, "verdict": "GO",
            "environment": {"host": "a", "gpu_count": 2, "torch": "2.13.0", "cuda": "12.8", "nccl": "2.27",
                            "python": "3.11", "git_sha": "x", "gpus": [{"name": "A100"}, {"name": "A100"}]},
            "steps": {"baseline": {"name": "baseline", "runs": [], "metrics": {
                "csv": "baseline/out/training.csv", "window": {"last": 20, "warmup": 0},
                "final_loss": final_loss, "mem_peak_gb": 1.5}}}}


def test_faster_run_is_better_and_noise_is_same(tmp_path):
    a_dir, b_dir, c_dir = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    base = [1000 + (i % 5) for i in range(20)]
    _csv(a_dir / "baseline/out/training.csv", base)
    _csv(b_dir / "baseline/out/training.csv", [v * 1.10 for v in base])
    _csv(c_dir / "baseline/out/training.csv", [v + 1 for v in base])
    a, b = _results(), _results(final_loss=3.0)
    out = compare_runs(a, b, a_dir, b_dir)
    rows = {r["metric"]: r for r in out["rows"]}
    assert rows["toks_per_s"]["verdict"] == "better" and rows["toks_per_s"]["significant"]
    assert rows["toks_per_s"]["rel_delta"] > 0.09
    assert rows["final_loss"]["verdict"] == "better"  # lower loss is better
    assert rows["mem_peak_gb"]["verdict"] == "same"
    assert compare_runs(a, _results(), a_dir, c_dir)["rows"][0]["verdict"] == "same"  # 0.1%: noise
    worse = compare_runs(b, a, b_dir, a_dir)
    assert {r["metric"]: r["verdict"] for r in worse["rows"]}["toks_per_s"] == "worse"
    assert out["warnings"] == []


def test_environment_differences_are_warned():
    a = _results()
    b = copy.deepcopy(a)
    b["environment"]["torch"] = "2.7.1"
    b["environment"]["gpus"] = [{"name": "H100"}]
    b["environment"]["gpu_count"] = 1
    warnings = environment_differences(a, b)
    assert any("torch differs" in w for w in warnings) and any("GPUs differ" in w for w in warnings)
    assert any("gpu_count" in w for w in warnings)
    assert environment_differences(a, copy.deepcopy(a)) == []
