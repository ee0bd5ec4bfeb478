"""An A/B of one run each (validation.kinds.ab) against its documented contract: block means of one run's window see
only the noise within it, never how far the next launch's level lies, so with neither a run-to-run noise measured
earlier in the run nor a declared launch noise (`compare: {launch_sd, pairs}`) no difference is significant, in the
comparison as in the decision, which keeps the baseline and names the fix. With either noise a large effect still
decides. The launches are synthetic (tests/validation/decision_support.py: no process is started)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from decision_support import ar1_series, run_ab_step  # noqa: E402

from validation.analysis.significance.comparison import PairNoise, RunNoise  # noqa: E402
from validation.kinds import get  # noqa: E402
from validation.kinds import ab as ab_mod  # noqa: E402
from validation.kinds._decision_view import decision_blocks  # noqa: E402
from validation.report.findings import comparisons, key_finding  # noqa: E402

RB = """\
name: t
requirements: {{gpus: 0, backend: gloo}}
defaults: {{config: configs/tiny_cpu.yaml, args: {{steps: 60}}, window: 50, warmup_steps: 5, nproc_per_node: 1}}
phases:
  - name: p
    steps:
      - name: fa
        kind: ab
        baseline: {{env: {{NSA_OPT_FUSED: "0"}}}}
        variants: {{fused: {{env: {{NSA_OPT_FUSED: "1"}}}}}}
        recommend: {recommend}
"""
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QUIET = {"disturbed": False, "share": 0.0, "text": "no interference"}


def _ab(monkeypatch, tmp_path, levels: dict[str, float], seed: int, recommend: bool = True) -> dict:
    """One A/B of one run each: each side's 50-step window AR(1) noise of 1% around its launch's level."""
    series = {k: ar1_series(1000 * seed + i, 50, level, 0.01) for i, (k, level) in enumerate(levels.items())}

    def collect(spec):
        return {"toks_per_s": {"mean": float(series[spec.label].mean())}, "throughput_stable": True,
                "interference": QUIET}

    where = tmp_path / str(seed)
    where.mkdir(parents=True, exist_ok=True)
    return run_ab_step(monkeypatch, where, RB.format(recommend=str(recommend).lower()), collect,
                       lambda run: list(series[run["label"]]))


def _equal_launches(seed: int) -> dict[str, float]:
    """Two equal settings: each launch's level drawn around 10,000 tokens/s with a 3% sd (as launches differ)."""
    rng = np.random.default_rng(seed)
    return {k: 10_000.0 * (1.0 + 0.03 * rng.standard_normal()) for k in ("baseline", "fused")}


def test_equal_variants_of_one_run_each_without_a_run_to_run_noise_are_never_significant(monkeypatch, tmp_path):
    """40 seeded A/Bs of two equal settings whose launch levels differ by 3% sd: block means alone called the
    difference significant in most of them (and chose the variant in about a third); without a measured or declared
    launch noise none is significant, the baseline is kept every time and the reason names the fix."""
    for seed in range(40):
        result = _ab(monkeypatch, tmp_path, _equal_launches(seed), seed)
        (comp,) = result["comparison"]
        d = result["decision"]
        assert comp["method"] == "blocks" and comp["run_to_run"] is None
        assert comp["significant"] is False and comp["verdict"] in ("inconclusive", "same"), (seed, comp["text"])
        assert result["metrics"]["variants"]["fused"]["significant"] is False
        assert d["significant"] is False and d["winner"] is None and d["recommendable"] is False, seed
        assert result["choice"]["label"] == "baseline" and result["choice"]["kept_default"] is True
        assert result["winner"] is None and result["metrics"]["significant"] is False
        assert result["metrics"]["decided"] is True and result["metrics"]["choice"] == "baseline"
        assert "no run-to-run noise measured or declared" in d["reason"] and "`repeats: 2`" in d["reason"]
        assert "`compare: {launch_sd, pairs}`" in d["reason"]


def test_a_difference_of_one_run_each_without_noise_is_no_significant_finding(monkeypatch, tmp_path):
    """Launches 6% apart (1% step noise): block means alone give p far below 0.05. Without recommend the comparison
    is inconclusive and says why; the step's effect is not significant, so the run's key finding is none; with
    recommend the decision keeps the baseline, and its headline says the variant is ahead on block means alone."""
    levels = {"baseline": 10_000.0, "fused": 10_600.0}
    plain = _ab(monkeypatch, tmp_path, levels, 1, recommend=False)
    (comp,) = plain["comparison"]
    assert comp["p_value"] < 1e-3 and comp["rel"] > 0.04  # block means alone: far beyond chance
    assert comp["significant"] is False and comp["verdict"] == "inconclusive"
    assert "so no variant can be significant" in comp["text"] and plain.get("decision") is None
    impl = get("ab")
    (effect,) = impl.comparisons(impl.read(plain))
    assert effect.significant is False and effect.verdict == "inconclusive"
    results = json.loads((FIXTURES / "results_example.json").read_text())
    results["steps"]["fa"] = {**plain, "name": "fa", "kind": "ab", "title": "A/B", "env": {}}
    results["phases"].append({"name": "fa", "title": "A/B", "steps": ["fa"]})
    found = [c for c in comparisons(results) if c.step == "fa"]
    assert [c.significant for c in found] == [False]
    assert key_finding(found)["text"].startswith("none: no significant effect")

    decided = _ab(monkeypatch, tmp_path, levels, 2)
    step = impl.read(decided)
    assert decided["choice"]["label"] == "baseline" and decided["decision"]["ranking"][0]["label"] == "fused"
    headline = decision_blocks(step.decision, step.choice)[0].text
    line = impl.summary_line(step)
    assert headline.startswith("**Decision**: NSA_OPT_FUSED=0 kept, no winner: fused +")
    assert line.startswith(" baseline kept, no winner: fused +")
    for text in (headline, line):
        assert "against baseline is ahead on block means alone, which decides nothing" in text, text
        assert "is significant" not in text and "no significant difference" not in text


def _rn(total: float) -> RunNoise:
    return RunNoise(between=total, total=total, within=0.0, df=6.0, runs=9, groups=3, source="earlier (3 x 3 runs)")


def _with_noise(monkeypatch, tmp_path, levels, seed, run_noise=None, pair_noise=None) -> dict:
    """_ab with a run-to-run noise measured earlier in the run and a declared launch noise (run_ab_step declares
    none: its setting of declared_pair_noise is replaced after it)."""
    real = monkeypatch.setattr

    def setattr_(target, name, value, *rest, **kw):
        if target is ab_mod and name == "declared_pair_noise":
            value = lambda ctx: pair_noise  # noqa: E731
        return real(target, name, value, *rest, **kw)

    monkeypatch.setattr(ab_mod, "measured_run_noise", lambda *args, **kwargs: run_noise)
    monkeypatch.setattr = setattr_
    try:
        return _ab(monkeypatch, tmp_path, levels, seed)
    finally:
        monkeypatch.setattr = real


def test_one_run_each_held_to_a_measured_or_declared_noise_still_decides_a_large_effect(monkeypatch, tmp_path):
    """The A/Bs with a declared `compare` (cpu_smoke's launch_sd 12% from 70 pairs) or a run-to-run noise measured
    in earlier repeats decide as before: 60% ahead is the significant winner with either; 6% against the declared
    12% launch noise is not, and its reason is the statistics', not the missing noise."""
    large = {"baseline": 10_000.0, "fused": 16_000.0}
    declared = PairNoise(sd=0.12, source="runbook compare", pairs=70)
    for run_noise, pair_noise in ((_rn(0.01), None), (None, declared)):
        result = _with_noise(monkeypatch, tmp_path / str(pair_noise is None), large, 3, run_noise, pair_noise)
        (comp,) = result["comparison"]
        assert comp["run_to_run"] is not None and comp["significant"] is True and comp["verdict"] == "better"
        assert result["choice"]["label"] == "fused" and result["choice"]["significant"] is True
        assert result["winner"]["label"] == "fused"
        assert "no run-to-run noise" not in result["decision"]["reason"] + comp["text"]
    small = _with_noise(monkeypatch, tmp_path / "small", {"baseline": 10_000.0, "fused": 10_600.0}, 4, None, declared)
    assert small["comparison"][0]["significant"] is False and small["choice"]["label"] == "baseline"
    assert "no run-to-run noise" not in small["decision"]["reason"]
