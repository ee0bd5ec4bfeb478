"""Sweep and A/B decisions recorded in results.json, the references that use them and the recommendations they
allow, on synthetic trainer launches with a known truth (decision_support.FakeTrainer: no process is started)."""

from __future__ import annotations

from collections import Counter

import pytest
from decision_support import FakeTrainer, run_runbook

from validation.execution.acceptance import recommendations
from validation.runbook.loader import load_runbook

SWEEP = """\
name: decide
requirements: {{gpus: 0, backend: gloo}}
defaults:
  config: configs/tiny_cpu.yaml
  args: {{steps: 30}}
  window: 25
  warmup_steps: 5
recommend:
  env: {{NSA_PREFILL_BATCHED: "1", NSA_DDP_COMPRESS: bf16{recommend_bucket}}}
phases:
  - name: sweep
    steps:
      - name: sw
        kind: sweep
        matrix: {{env.NSA_DDP_BUCKET_MB: [25, 50, 100]}}
        repeats: {repeats}
        {prefer}
  - name: later
    steps:
      - {{name: after, kind: train, env: {{NSA_DDP_BUCKET_MB: "${{sw.winner.env.NSA_DDP_BUCKET_MB}}"}}}}
acceptance:
  - {{name: decided, expr: "sw.decided", target: "a decision"}}
"""


def sweep_runbook(repeats: int, prefer: str = "prefer: {env.NSA_DDP_BUCKET_MB: 50}", recommend_bucket: str = ""):
    return SWEEP.format(repeats=repeats, prefer=prefer, recommend_bucket=recommend_bucket)


def bucket(spec) -> str:
    return spec.env.get("NSA_DDP_BUCKET_MB", "")


def test_no_true_difference_keeps_the_default_and_passes(monkeypatch, tmp_path):
    """Three points with the same throughput (3% step noise, 3% run-to-run noise), 3 interleaved repeats: no
    winner, the preferred 50 is kept, the step passes, results.json records why with the statistics, the later
    step runs with 50, and the recommendations keep the runbook's own settings but add no bucket size."""
    trainer = FakeTrainer(lambda spec: 10_000.0, cv=0.03, run_cv=0.03)
    results = run_runbook(monkeypatch, tmp_path, sweep_runbook(3, recommend_bucket=', NSA_DDP_BUCKET_MB: "25"'),
                          trainer)
    sw = results["steps"]["sw"]
    assert sw["status"] == "passed", sw["reason"]
    d = sw["decision"]
    assert d["significant"] is False and d["winner"] is None and d["kept_default"] is True
    assert d["choice"] == "NSA_DDP_BUCKET_MB=50" and d["default_source"] == "prefer"
    assert "no significant difference" in d["reason"] and "the default NSA_DDP_BUCKET_MB=50 is kept" in d["reason"]
    comp = d["comparison"]
    assert comp["method"] == "paired" and comp["ci_low"] < comp["rel"] < comp["ci_high"]
    assert 0 <= comp["p_value"] <= 1 and comp["noise_floor"] >= 0.01
    assert d["recommended_repeats"] is None or d["recommended_repeats"] >= 2
    assert isinstance(d["order_seed"], int) and d["method"] == "paired" and d["repeats"] == 3
    # every repeat ran each point once, in the recorded order
    assert [s.label for s in trainer.launched[:9]] == d["order"]
    for r in range(3):
        assert sorted(d["order"][3 * r:3 * r + 3]) == sorted(d["points"])
    assert sw["winner"] is None and sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=50"
    assert sw["metrics"]["decided"] is True and sw["metrics"]["significant"] is False
    # the reference resolves to the point kept
    assert results["steps"]["after"]["status"] == "passed"
    assert results["steps"]["after"]["env"]["NSA_DDP_BUCKET_MB"] == "50"
    assert bucket(trainer.launched[-1]) == "50"
    assert results["acceptance"][0]["status"] == "pass" and results["verdict"] == "GO"
    # no recommendation from a non-significant decision; the runbook's own value stays, compression too
    rec = results["recommendations"]
    assert rec["env"]["NSA_DDP_BUCKET_MB"] == "25" and rec["env"]["NSA_DDP_COMPRESS"] == "bf16"
    assert any("sw: no recommendation: no significant difference" in n and "not recommended" in n
               for n in rec["notes"])


@pytest.mark.parametrize("repeats, method", [(3, "paired"), (1, "blocks")])
def test_a_large_true_difference_is_the_winner_and_recommended(monkeypatch, tmp_path, repeats, method):
    """100 MB is 30% faster: it wins (paired over 3 repeats, or block means of single runs held to the runbook's
    declared launch noise: without a run-to-run noise one run a point names no winner) and the later step uses
    it; it is recommended only when it was replicated in interleaved repeats: one run per point chooses what later
    steps run with, never what a user is told to set."""
    trainer = FakeTrainer(lambda spec: 13_000.0 if bucket(spec) == "100" else 10_000.0, cv=0.02, run_cv=0.005)
    text = sweep_runbook(repeats)
    if repeats == 1:
        text = text.replace("requirements:", "compare: {launch_sd: 0.02, pairs: 20}\nrequirements:", 1)
    results = run_runbook(monkeypatch, tmp_path, text, trainer)
    sw = results["steps"]["sw"]
    d = sw["decision"]
    assert sw["status"] == "passed" and d["significant"] is True and d["method"] == method
    assert d["winner"] == d["choice"] == "NSA_DDP_BUCKET_MB=100" and not d["kept_default"]
    assert d["comparison"]["rel"] > 0.2 and d["comparison"]["verdict"] == "better"
    assert sw["winner"]["params"] == {"env.NSA_DDP_BUCKET_MB": "100"} and sw["winner"]["significant"] is True
    assert results["steps"]["after"]["env"]["NSA_DDP_BUCKET_MB"] == "100"
    if method == "paired":
        assert d["replicated"] is True and d["recommendable"] is True
        assert results["recommendations"]["env"]["NSA_DDP_BUCKET_MB"] == "100"
    else:
        assert d["replicated"] is None and d["recommendable"] is False and "one run per variant" in d["recommendation"]
        assert "NSA_DDP_BUCKET_MB" not in results["recommendations"]["env"]
        assert any(n.startswith("sw: no recommendation: one run per variant") for n in
                   results["recommendations"]["notes"])
    assert len(trainer.launched) == 3 * repeats + 1


def test_a_disturbed_run_is_left_out_and_a_decision_it_leaves_unresolved_is_inconclusive(monkeypatch, tmp_path):
    """100 MB is 30% faster, but another process used the machine during one of its runs: that run decides nothing.
    With 2 repeats the point is left with one run: no winner, the step's evidence is disturbed, its criterion is
    inconclusive and the run INCOMPLETE, naming the command that runs the sweep again; with 3 repeats the other
    two still replicate the effect: the winner stands, recommended, the run GO."""
    def busy(spec):
        return bucket(spec) == "100" and spec.repeat == 1

    trainer = FakeTrainer(lambda spec: 13_000.0 if bucket(spec) == "100" else 10_000.0, cv=0.02, run_cv=0.005,
                          busy=busy)
    results = run_runbook(monkeypatch, tmp_path, sweep_runbook(2), trainer)
    sw = results["steps"]["sw"]
    assert sw["decision"]["disturbed_runs"] == [{"label": "NSA_DDP_BUCKET_MB=100", "repeat": 1}]
    assert sw["decision"]["winner"] is None
    assert "left out because other work used the machine" in sw["decision"]["reason"]
    assert sw["interference"]["disturbed"] is True
    assert "NSA_DDP_BUCKET_MB=100, repeat 2: other processes used 1.50 of 2 cores" in sw["interference"]["text"]
    crit = results["acceptance"][0]
    assert crit["status"] == "inconclusive" and "--rerun sw" in crit["detail"]
    assert results["verdict"] == "INCOMPLETE" and "--rerun sw" in results["verdict_reason"]
    assert "NSA_DDP_BUCKET_MB" not in results["recommendations"]["env"]

    trainer = FakeTrainer(lambda spec: 13_000.0 if bucket(spec) == "100" else 10_000.0, cv=0.02, run_cv=0.005,
                          busy=busy)
    results = run_runbook(monkeypatch, tmp_path, sweep_runbook(3), trainer, "run3")
    sw = results["steps"]["sw"]
    assert sw["decision"]["winner"] == "NSA_DDP_BUCKET_MB=100" and sw["decision"]["recommendable"]
    assert sw["interference"]["disturbed"] is False and sw["interference"]["left_out"] == 1
    assert results["acceptance"][0]["status"] == "pass" and results["verdict"] == "GO"
    assert results["recommendations"]["env"]["NSA_DDP_BUCKET_MB"] == "100"


def test_without_prefer_the_runbook_value_then_the_first_point_is_kept(monkeypatch, tmp_path):
    flat = FakeTrainer(lambda spec: 10_000.0, cv=0.03, run_cv=0.03)
    text = sweep_runbook(2, prefer="env: {NSA_DDP_BUCKET_MB: \"100\"}")
    sw = run_runbook(monkeypatch, tmp_path, text, flat)["steps"]["sw"]
    assert sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=100" and sw["decision"]["default_source"] == "runbook"
    sw = run_runbook(monkeypatch, tmp_path, sweep_runbook(2, prefer=""), flat, "run2")["steps"]["sw"]
    assert sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=25" and sw["decision"]["default_source"] == "first"
    assert sw["status"] == "passed"


def test_prefer_and_repeats_are_validated(tmp_path):
    from validation.runbook.loader import RunbookError

    path = tmp_path / "rb.yaml"
    for repeats, prefer, needle in [(2, "prefer: {env.NSA_DDP_BUCKET_MB: 75}", "75 is not one of the matrix values"),
                                    (2, "prefer: {env.OTHER: 1}", "a value for every matrix key"),
                                    (0, "", "repeats: must be >= 1"), ("two", "", "repeats: must be an integer")]:
        path.write_text(sweep_runbook(repeats, prefer=prefer))
        with pytest.raises(RunbookError, match=needle):
            load_runbook(path)
    path.write_text(sweep_runbook(2, prefer="prefer: [50, 25]"))
    assert load_runbook(path).step("sw").prefer == [{"env.NSA_DDP_BUCKET_MB": "50"},
                                                    {"env.NSA_DDP_BUCKET_MB": "25"}]


AB = """\
name: ab
requirements: {{gpus: 0, backend: gloo}}
defaults:
  config: configs/tiny_cpu.yaml
  args: {{steps: 30}}
  window: 25
  warmup_steps: 5
phases:
  - name: ab
    steps:
      - name: fused_adamw
        kind: ab
        baseline: {{}}
        variants: {{fused: {{env: {{NSA_OPT_FUSED: "1"}}}}, other: {{env: {{NSA_DISABLE_AUX_STATS: "1"}}}}}}
        repeats: {repeats}
        recommend: true
"""


def test_ab_recommends_only_a_significant_honoured_variant(monkeypatch, tmp_path):
    """`other` is 25% faster; `fused` measures 40% faster but its trainer reports NSA_OPT_FUSED as ignored, so it
    is never considered: `other` is kept, paired over 3 repeats in a random order per repeat, Holm over the two
    variants."""
    def level(spec):
        return {"baseline": 10_000.0, "fused": 14_000.0, "other": 12_500.0}[spec.label]

    trainer = FakeTrainer(level, cv=0.02, run_cv=0.005,
                          notes=lambda spec: ["NSA_OPT_FUSED=1 is ignored: no CUDA"] if spec.label == "fused" else [])
    results = run_runbook(monkeypatch, tmp_path, AB.format(repeats=3), trainer)
    ab = results["steps"]["fused_adamw"]
    assert ab["status"] == "passed"
    rows = {c["variant"]: c for c in ab["comparison"]}
    assert rows["other"]["method"] == "paired" and rows["other"]["family_size"] == 2
    assert rows["other"]["significant"] and rows["other"]["verdict"] == "better"
    assert ab["decision"]["excluded_ignored"] == ["fused"]
    assert ab["choice"]["label"] == "other" and ab["winner"]["params"] == {"env.NSA_DISABLE_AUX_STATS": "1"}
    assert results["recommendations"]["env"] == {"NSA_DISABLE_AUX_STATS": "1"}
    for r in range(3):
        assert Counter(ab["order"][3 * r:3 * r + 3]) == Counter(["baseline", "fused", "other"])


def test_ab_without_a_difference_keeps_the_baseline(monkeypatch, tmp_path):
    trainer = FakeTrainer(lambda spec: 10_000.0, cv=0.03, run_cv=0.02)
    results = run_runbook(monkeypatch, tmp_path, AB.format(repeats=1), trainer)
    ab = results["steps"]["fused_adamw"]
    assert ab["status"] == "passed" and ab["winner"] is None
    assert ab["choice"]["label"] == "baseline" and ab["choice"]["kept_default"]
    assert {c["method"] for c in ab["comparison"]} == {"blocks"}
    assert not any(c["significant"] for c in ab["comparison"])
    assert results["recommendations"]["env"] == {}


def test_cpu_smoke_recommends_compression_and_no_unproven_bucket():
    """The bug the issue names: cpu_smoke's baseline validates bf16 gradient compression, but its recommended
    exports never carried NSA_DDP_COMPRESS (its recommend block lacked it). A sweep without a significant
    difference adds no bucket size; a run that measured nothing recommends nothing."""
    rb = load_runbook("runbooks/cpu_smoke.yaml")
    passed = {"status": "passed", "kind": "train", "metrics": {}}
    sweep = {"status": "passed", "kind": "sweep", "runs": [{"params": {"env.NSA_DDP_BUCKET_MB": "25"}}],
             "choice": {"label": "NSA_DDP_BUCKET_MB=50", "params": {"env.NSA_DDP_BUCKET_MB": "50"},
                        "significant": False, "kept_default": True}, "winner": None}
    rec = recommendations(rb, {"steps": {"baseline": passed, "bucket_sweep": sweep}})
    assert rec["env"]["NSA_DDP_COMPRESS"] == "bf16" and "NSA_DDP_BUCKET_MB" not in rec["env"]
    sweep["choice"]["significant"] = True
    assert recommendations(rb, {"steps": {"baseline": passed, "bucket_sweep": sweep}})["env"][
        "NSA_DDP_BUCKET_MB"] == "50"
    nothing = recommendations(rb, {"steps": {"baseline": {**passed, "status": "skipped"}}})
    assert nothing["env"] == {} and "nothing was measured" in nothing["notes"][0]


def test_a_single_run_decision_states_the_ab_tables_comparison_number_for_number():
    """One run per variant: the decision's comparison (best against the runner-up) is the A/B table's
    (compare.compare_windows, whose means are each window's mean over every step), not a second estimate of the
    same effect from the steps that fill whole blocks (it read +0.9% under a table row of +1.5%)."""
    import numpy as np

    from validation.report.compare import compare_windows
    from validation.analysis.significance import decide

    rng = np.random.default_rng(7)
    base = list(1000 + 40 * rng.standard_normal(23))  # 23 steps: not a whole number of blocks
    fused = list(1012 + 40 * rng.standard_normal(23))
    table = compare_windows(base, fused, higher_is_better=True, baseline="baseline", variant="fused")
    d = decide({"baseline": [base], "fused": [fused]}, default="baseline")  # one run (its series) each
    best = d.comparison
    assert (best.baseline, best.variant) == ("baseline", "fused")
    for field in ("mean_a", "mean_b", "rel", "ci_low", "ci_high", "p_value"):
        assert getattr(best, field) == pytest.approx(getattr(table, field), rel=1e-12), field
    assert best.mean_a == pytest.approx(len(base) / sum(1 / v for v in base))  # the window's tokens over its time


# ------------------------------------------------------------------------------ a runbook's declared launch noise
def test_two_repeats_that_agree_by_chance_decide_nothing_under_the_runbooks_declared_launch_noise():
    """Two interleaved repeats +8% and +9% (a paired t with 1 degree of freedom: significant) are within what one
    launch differs from the next on a 2-core machine (aa_cpu's launch_sd 12% from 30 A/A pairs): no winner, no
    culprit under the declaration; a 2x change still wins and is named."""
    from validation.analysis.significance import PairNoise, compare_paired, decide, pair_noise_from
    from validation.kinds.trainer import declared_pair_noise
    from validation.analysis.triage import rank_suspects

    declared = {"run_sd": 0.061, "launch_sd": 0.12, "pairs": 30.0}
    noise = pair_noise_from(declared)
    assert noise == PairNoise(sd=0.12, source=noise.source) and "12.0%" in noise.source and "30 A/A" in noise.source
    assert pair_noise_from(None) is None and pair_noise_from({"run_sd": 0.06, "pairs": 30}) is None
    assert pair_noise_from({"launch_sd": 0.0, "pairs": 30}) is None and pair_noise_from("x") is None
    ctx = type("Ctx", (), {"results": {"runbook": {"name": "aa_cpu", "compare": declared}}})()
    assert declared_pair_noise(ctx) == noise
    assert declared_pair_noise(type("Ctx", (), {"results": {"runbook": {"name": "x"}}})()) is None

    base, chance, real = [1000.0, 1010.0], [1080.0, 1100.9], [14000.0, 14700.0]  # real: x14, as batched prefill
    assert compare_paired(base, chance).significant
    held = compare_paired(base, chance, pair_noise=noise)
    assert not held.significant and held.df == 1.0 and held.noise_floor > 0.5  # 1 df: blunter, never sharper
    assert compare_paired(base, real, pair_noise=noise).significant

    runs = {"baseline": base, "torch": chance}
    assert decide(runs, default="baseline").winner == "torch"
    d = decide(runs, default="baseline", pair_noise=noise)
    assert d.winner is None and d.choice == "baseline" and not d.recommendable
    assert d.recommended_repeats > decide(runs, default="baseline").recommended_repeats
    d = decide({"baseline": base, "batched": real}, default="baseline", pair_noise=noise)
    assert d.winner == "batched" and d.recommendable

    assert rank_suspects(base, {"kernel_torch": chance}, min_effect=0.05).culprit == "kernel_torch"
    assert rank_suspects(base, {"kernel_torch": chance}, min_effect=0.05, pair_noise=noise).culprit is None
    assert rank_suspects(base, {"sel_v2": real}, pair_noise=noise).culprit == "sel_v2"


def test_a_decision_that_compared_nothing_says_so_is_not_decided_and_its_criterion_never_passes(monkeypatch,
                                                                                                tmp_path):
    """A sweep or an A/B whose points were never compared (every run disturbed; windows too short for block means)
    keeps its default for later steps, but it is no decision: `decided` is false, so `sw.decided` does not hold
    (inconclusive where the runs were disturbed, failed otherwise), and the report and the console say "no decision,
    nothing compared", never "no significant difference"."""
    from validation.kinds import get
    from validation.report import render

    results = run_runbook(monkeypatch, tmp_path, sweep_runbook(2), FakeTrainer(lambda spec: 10_000.0,
                                                                               busy=lambda spec: True))
    sw = results["steps"]["sw"]
    assert sw["decision"]["comparisons"] == [] and sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=50"
    assert sw["metrics"]["decided"] is False
    assert results["acceptance"][0]["status"] == "inconclusive" and results["verdict"] == "INCOMPLETE"
    md = render(results, "md")
    section = md[md.index("**Decision**"):]
    assert section.startswith("**Decision**: no decision, nothing compared: NSA_DDP_BUCKET_MB=50 kept")
    assert "kept: no decision, nothing compared — step `sw`" in md  # the key figure
    assert "no significant difference" not in md.replace("otherwise no significant difference", "")
    assert "nothing compared" in get("sweep").summary_line(get("sweep").read(sw))

    ab = run_runbook(monkeypatch, tmp_path, AB.format(repeats=2), FakeTrainer(lambda spec: 10_000.0,
                                                                               busy=lambda spec: True), "ab")
    step = ab["steps"]["fused_adamw"]
    assert step["decision"]["comparisons"] == [] and step["choice"]["label"] == "baseline"
    assert step["metrics"]["decided"] is False
    md = render(ab, "md")
    assert "**Decision**: no decision, nothing compared: baseline kept" in md
    assert "no significant difference" not in md.replace("otherwise no significant difference", "")

    # undisturbed, but 6 steps a run cannot be compared on block means: the criterion fails, the run is NO-GO
    short = sweep_runbook(1).replace("args: {steps: 30}\n  window: 25\n  warmup_steps: 5",
                                     "args: {steps: 8}\n  window: 6\n  warmup_steps: 2")
    results = run_runbook(monkeypatch, tmp_path, short, FakeTrainer(lambda spec: 10_000.0), "short")
    sw = results["steps"]["sw"]
    assert sw["decision"]["comparisons"] == [] and "block means need" in sw["decision"]["reason"]
    assert sw["metrics"]["decided"] is False and sw["choice"]["label"] == "NSA_DDP_BUCKET_MB=50"
    assert results["acceptance"][0]["status"] == "fail" and results["verdict"] == "NO-GO"
