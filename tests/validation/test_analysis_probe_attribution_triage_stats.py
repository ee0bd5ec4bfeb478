"""validation.analysis.attribution, triage.rank_suspects and stats.welch_t_test against hand-computed figures and
scipy: a torch profiler trace's ProfilerStep#N range around every step is not work within the step; a suspect whose
runs cannot be compared does not take the other suspects' ranking with it; Welch's test on samples of a tiny scale
gives the figures of the same samples scaled up."""

import math

import pytest
import scipy.stats

from validation.analysis.attribution import attribute_events
from validation.analysis.significance import StatsError
from validation.analysis.stats import t_sf2, welch_t_test
from validation.analysis.triage import rank_suspects


def ev(name, ts, dur, cat="cpu_op"):
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "pid": 7, "tid": 7, "cat": cat}


def test_the_profilers_own_step_range_leaves_the_steps_idle_time_idle():
    """torch.profiler with a schedule writes ProfilerStep#N (user_annotation, the step's thread) from one
    profiler.step() to the next, around nsa.step and nsa.optim: counted as an open event it left no instant idle and
    gave the idle 45 of 115 us to "other"."""
    events = [ev("ProfilerStep#1", 0, 130, cat="user_annotation"),
              ev("nsa.step", 5, 95, cat="user_annotation"), ev("aten::mm", 10, 50),  # 50 GEMM, 45 idle
              ev("nsa.optim", 105, 20, cat="user_annotation"), ev("aten::add_", 110, 5)]  # 20 optimizer
    out = attribute_events(events)
    c = out["categories"]
    assert out["steps"] == 1 and out["step_time_ms"] == pytest.approx(0.115)
    assert c["idle"] == pytest.approx(45 / 115) and c["other"] == 0.0
    assert c["MLP/GEMM"] == pytest.approx(50 / 115) and c["optimizer"] == pytest.approx(20 / 115)
    assert sum(c.values()) == pytest.approx(1.0)
    # the same trace without the profiler's range: the same figures
    assert attribute_events(events[1:]) == out


def test_a_suspect_without_comparable_runs_is_left_out_and_the_others_are_ranked():
    """One suspect whose runs all failed (or were all disturbed, so left out) raised StatsError for the whole
    triage: no ranking, no culprit, "nothing compared", although the other suspect removed a 5x slowdown."""
    base = [100.0, 104.0, 98.0]
    fix = [500.0, 510.0, 495.0]
    r = rank_suspects(base, {"fix": fix, "crash": [None, None, None], "one": [None, 120.0, None]})
    assert r.culprit == "fix" and [c.variant for c in r.comparisons] == ["fix"]
    c = r.comparisons[0]
    # hand figures: ratio of geometric means, Holm over the one suspect compared
    logs = [math.log(b / a) for a, b in zip(base, fix)]
    assert c.rel == pytest.approx(math.exp(sum(logs) / 3) - 1) and c.family_size == 1
    assert c.p_adjusted == pytest.approx(c.p_value)
    assert set(r.unranked) == {"crash", "one"} and "got 0" in r.unranked["crash"] and "got 1" in r.unranked["one"]
    assert "not compared: crash (" in r.reason and "one (" in r.reason
    assert r.as_dict()["unranked"] == r.unranked
    with pytest.raises(StatsError, match="no suspect could be compared: a: .*; b: "):
        rank_suspects(base, {"a": [None] * 3, "b": [1.0, None, None]})
    with pytest.raises(StatsError, match="at least 2 repeats"):
        rank_suspects(base, {"a": [None] * 3})


@pytest.mark.parametrize("scale", [1e-100, 1e-120])
def test_welch_on_a_tiny_scale_gives_the_figures_of_the_scaled_samples(scale):
    """The Welch-Satterthwaite degrees of freedom squared the variances: below a spread of ~1e-81 their squares
    underflowed to 0 and the test raised ZeroDivisionError. t and p are scale-free: scipy on the scaled samples."""
    a, b = [0.0, 1.0, 3.0], [0.0, 2.0]
    ref = scipy.stats.ttest_ind(a, b, equal_var=False)
    t, p = welch_t_test([x * scale for x in a], [x * scale for x in b])
    assert t == pytest.approx(ref.statistic, rel=1e-9) and p == pytest.approx(ref.pvalue, rel=1e-9)


@pytest.mark.parametrize("df, q975", [(1, 12.706204736174707), (2, 4.302652729749464), (3, 3.182446305284263)])
def test_two_sided_t_tail_at_small_df_is_five_percent_at_the_tabled_quantile(df, q975):
    assert t_sf2(q975, df) == pytest.approx(0.05, rel=1e-9) and t_sf2(-q975, df) == pytest.approx(0.05, rel=1e-9)


RUNBOOK = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5}, nproc_per_node: 1}
phases:
  - name: p
    steps:
      - {name: tr, kind: triage, repeats: 3, suspects: {a: {env: {NSA_SEL_RANGES_V2: '1'}}, b: {args: {accum: 2}}}}
"""


def test_a_triage_whose_one_suspect_was_disturbed_in_every_repeat_still_ranks_the_other(monkeypatch, tmp_path):
    """Suspect b disturbed in every repeat (left out, as a failed run would be): the triage had no verdict at all
    ("no ranking: paired comparison needs at least 2 repeats ..."), although suspect a was 40% faster in every
    undisturbed repeat."""
    from pathlib import Path
    from types import SimpleNamespace

    from validation.kinds import triage as triage_mod
    from validation.kinds.trainer import Runs
    from validation.results.codec import decode, encode
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun
    from validation.runbook.loader import load_runbook
    from validation.runbook.plan import step_launches

    def shaken(spec):
        return spec.label == "b"

    def fake_run_all(ctx, retry_disturbed=False, **_):
        return Runs([LaunchRun(label=s.label, params=dict(s.params), status="passed", dir=s.dir, command=list(s.argv),
                               repeat=s.repeat, metrics=decode(LaunchMetrics, {"interference": {
                                   "disturbed": shaken(s), "share": 0.5 if shaken(s) else 0.0,
                                   "text": "busy" if shaken(s) else "no interference"}}))
                     for s in ctx.launches])

    monkeypatch.setattr(triage_mod, "run_all", fake_run_all)
    monkeypatch.setattr(triage_mod, "run_toks",
                        lambda ctx, step, run: 1400.0 + run.repeat if run.label == "a" else 1000.0)
    path = tmp_path / "rb.yaml"
    path.write_text(RUNBOOK)
    tr = load_runbook(path, cwd=str(Path(__file__).resolve().parents[2])).steps()[0]
    ctx = SimpleNamespace(run_dir=tmp_path, save=lambda partial=None: None, step=tr,
                          launches=step_launches(tr, {}, tmp_path))
    result = encode(triage_mod.Triage().run(tr.options, ctx))
    m = result["metrics"]
    assert result["status"] == "passed" and m["culprit"] == "a" and m["ranking"] == ["a"]
    assert m["suspects"]["a"]["effect"] == pytest.approx(math.exp(sum(math.log(1.4 + r / 1000) for r in range(3)) / 3)
                                                         - 1)
    assert "not compared: b (" in m["reason"] and "b (repeat 1), b (repeat 2), b (repeat 3)" in m["reason"]
    assert result["interference"]["disturbed"] is False and result["interference"]["left_out"] == 3
