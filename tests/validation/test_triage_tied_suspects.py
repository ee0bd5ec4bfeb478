"""A triage names a single culprit only when its best suspect also beats every other suspect paired over the same
repeats (validation.analysis.triage.rank_suspects, as a sweep's winner beats every other point); two suspects the
data cannot tell apart are reported as tied, through the step kind's metrics, criterion, console line, key figure
and section. Figures hand-computed from the run means below."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.analysis.triage import rank_suspects

CONFIG = [100.0, 102.0, 98.0, 101.0]
A = [150.0, 155.0, 146.0, 151.0]
B = [149.0, 154.0, 147.0, 150.5]
T975_3 = 3.182446305284263  # two-sided 95% t quantile, 3 degrees of freedom


def _paired(base, other):
    """exp(mean log-ratio) - 1 and its 95% t-interval over the repeats, computed here from the run means."""
    d = [math.log(b / a) for a, b in zip(base, other)]
    m = sum(d) / len(d)
    sd = math.sqrt(sum((x - m) ** 2 for x in d) / (len(d) - 1))
    half = T975_3 * sd / math.sqrt(len(d))
    return math.exp(m) - 1, math.exp(m - half) - 1, math.exp(m + half) - 1


def test_two_suspects_the_data_cannot_tell_apart_name_no_single_culprit():
    # by hand: each suspect is about +50% on the configuration, far beyond its noise...
    for runs, effect, low, high in ((A, 0.5011, 0.4806, 0.5219), (B, 0.4975, 0.4825, 0.5126)):
        rel, lo, hi = _paired(CONFIG, runs)
        assert (rel, lo, hi) == pytest.approx((effect, low, high), abs=5e-4)
    # ...but a against b is +0.24%, its 95% interval -0.77% .. +1.26% holding 0 (and b ahead in repeat 3)
    rel, lo, hi = _paired(B, A)
    assert lo < 0 < hi and rel == pytest.approx(0.00242, abs=5e-5)
    r = rank_suspects(CONFIG, {"a": A, "b": B})
    assert [c.variant for c in r.comparisons] == ["a", "b"]
    assert all(c.significant and c.verdict == "better" for c in r.comparisons)
    assert r.comparisons[0].rel == pytest.approx(_paired(CONFIG, A)[0], rel=1e-9)
    assert r.culprit is None and r.tied == ("a", "b") and r.as_dict()["tied"] == ["a", "b"]
    assert r.reason.startswith("no single culprit: a ") and "cannot tell it apart from b (" in r.reason
    assert "a against b: " in r.reason and r.reason.endswith("tied: a, b")


def test_a_culprit_ahead_of_every_other_suspect_in_every_repeat_is_still_named():
    # b is +20% on the configuration, a about 25% ahead of b in every repeat: a is the culprit
    b = [120.0, 122.0, 117.0, 121.0]
    rel, lo, hi = _paired(b, A)
    assert lo > 0.2 and rel == pytest.approx(math.exp(sum(math.log(x / y) for x, y in zip(A, b)) / 4) - 1)
    r = rank_suspects(CONFIG, {"b": b, "a": A})
    assert r.culprit == "a" and r.tied == () and r.as_dict()["tied"] == []
    assert "against the runner-up b: " in r.reason


RUNBOOK = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5}, nproc_per_node: 1}
phases:
  - name: p
    steps:
      - {name: tr, kind: triage, repeats: 4, suspects: {a: {env: {NSA_SEL_RANGES_V2: '1'}}, b: {args: {accum: 2}}}}
"""


def test_the_triage_step_reports_tied_suspects_and_a_criterion_naming_one_does_not_pass(monkeypatch, tmp_path):
    from validation import kinds
    from validation.kinds import get
    from validation.kinds import triage as triage_mod
    from validation.kinds.trainer import Runs
    from validation.report.renderer import blocks_markdown
    from validation.results.codec import decode, encode
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun
    from validation.runbook.expressions import compile_expression
    from validation.runbook.loader import load_runbook
    from validation.runbook.plan import step_launches

    def fake_run_all(ctx, retry_disturbed=False, **_):
        return Runs([LaunchRun(label=s.label, params=dict(s.params), status="passed", dir=s.dir, command=list(s.argv),
                               repeat=s.repeat, metrics=decode(LaunchMetrics, {}))
                     for s in ctx.launches])

    toks = {"config": CONFIG, "a": A, "b": B}
    monkeypatch.setattr(triage_mod, "run_all", fake_run_all)
    monkeypatch.setattr(triage_mod, "run_toks", lambda ctx, step, run: toks[run.label][run.repeat])
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    tr = load_runbook(path, cwd=str(Path(__file__).resolve().parents[2])).steps()[0]
    ctx = SimpleNamespace(run_dir=tmp_path, save=lambda partial=None: None, step=tr,
                          launches=step_launches(tr, {}, tmp_path))
    step = {**encode(triage_mod.Triage().run(tr.options, ctx)), "name": "tr", "kind": "triage"}
    m = step["metrics"]
    assert step["status"] == "passed" and m["culprit"] is None and m["tied"] == ["a", "b"]
    assert m["ranking"] == ["a", "b"] and all(m["suspects"][k]["significant"] for k in "ab")
    # the tokens/s shown: each side's 4 runs (equal work) over their time, 4 / (1/100 + 1/102 + 1/98 + 1/101) =
    # 100.2280..., not their plain mean 100.25 (a: 150.4319..., not 150.5)
    assert m["config_toks_per_s"] == pytest.approx(4 / sum(1 / x for x in CONFIG), rel=1e-12)
    assert m["config_toks_per_s"] == pytest.approx(100.22804, abs=1e-5)
    assert m["suspects"]["a"]["toks_per_s"] == pytest.approx(150.43186, abs=1e-5)
    assert compile_expression("tr.culprit == 'a'").evaluate({"tr": m}).status != "pass"
    triage = get("triage")
    assert triage.summary_line(triage.read(step)) == " no single culprit: a, b cannot be told apart"
    (figure,) = triage.key_figures(kinds.read_steps([step]))
    assert figure.value == "none named (a, b tied)" and "no single culprit" in figure.note
    assert "**Culprit**: none (a, b tied) — no single culprit: " in blocks_markdown(triage.blocks(triage.read(step)))
    # a record written without the key (a culprit named, or before ties were reported) reads as no tie
    older = {**step, "metrics": {k: v for k, v in m.items() if k != "tied"}}
    assert triage.read(older).metrics.tied == []


def test_suspects_measured_in_different_repeats_cannot_be_told_apart_and_a_slowdown_is_no_rival():
    # a measured in repeats 1-2 (+51%), the other suspect in repeats 3-4: never paired with a
    a = [150.0, 155.0, None, None]
    close = rank_suspects(CONFIG, {"a": a, "n": [None, None, 140.0, 141.0]})  # n about +41%: a cannot be told from it
    assert close.culprit is None and close.tied == ("a", "n") and "a against n: not compared directly" in close.reason
    # a suspect whose change is below a culprit's least effect (here a slowdown, about -49%) is no rival
    slower = rank_suspects(CONFIG, {"a": a, "w": [None, None, 50.0, 51.0]})
    assert [c.verdict for c in slower.comparisons] == ["better", "worse"]
    assert slower.culprit == "a" and slower.tied == ()
    # nor one without effect next to a clear culprit (b about +0.3%): only suspects of at least 10% are rivals
    r = rank_suspects(CONFIG, {"a": A, "b": [100.0, 103.0, 98.0, 102.0]})
    assert r.culprit == "a" and "runner-up" not in r.reason
