"""The scan and triage step kinds without live runs: their runbook keys (one clear error each, exit 2 from the
CLI), their plans (interleaved repeats, the scanned value and each suspect's change on the command line), and their
report views of real and damaged results."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.runbook.loader import RunbookError, load_runbook

REPO = Path(__file__).resolve().parents[2]
RB = """\
name: t
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml, args: {steps: 5}, nproc_per_node: 1, env: {NSA_FAULT: sel_v1_quadratic@256}}
phases:
  - name: p
    steps:
      - {name: sc, kind: scan, %s}
      - {name: tr, kind: triage, %s}
acceptance:
  - {name: c, expr: "sc.cliff_localised and tr.culprit == 'a'"}
"""
SCAN_OK = "values: {args.seq_len: [64, 128]}"
TRIAGE_OK = "suspects: {a: {env: {NSA_SEL_RANGES_V2: '1'}}}"


def load(tmp_path, scan=SCAN_OK, triage=TRIAGE_OK):
    path = tmp_path / "rb.yaml"
    path.write_text(RB % (scan, triage))
    return load_runbook(path, cwd=str(REPO))


@pytest.mark.parametrize("scan,triage,needle", [
    ("values: {args.seq_len: [64]}", TRIAGE_OK, "values.args.seq_len: expected a list of at least 2 positive numbers"),
    ("values: {args.seq_len: [64, 64]}", TRIAGE_OK, "values must be distinct"),
    ("values: {seq_len: [64, 128]}", TRIAGE_OK, "env.VARIABLE or args.flag"),
    ("values: {args.seq_len: [64, 128], args.batch_size: [1, 2]}", TRIAGE_OK, "expected one setting"),
    ("values: {args.out_dir: [1, 2]}", TRIAGE_OK, "set by nsa-validate itself"),
    (SCAN_OK + ", bisect: {steps: 0}", TRIAGE_OK, "bisect.steps"),
    (SCAN_OK + ", bisect: {resolution: -1}", TRIAGE_OK, "bisect.resolution"),
    (SCAN_OK + ", expected_exponent: 0", TRIAGE_OK, "expected_exponent"),
    (SCAN_OK, "suspects: {a: {env: {NSA_FAULT: 'sel_v1_quadratic@64'}}}", "suspects.a.env.NSA_FAULT"),
    (SCAN_OK, "suspects: {config: {env: {X: '1'}}}", "suspect names are identifiers other than 'config'"),
    (SCAN_OK, "suspects: {a: {}}", "a suspect changes at least one"),
    (SCAN_OK, "suspects: {a: {args: {stepz: 1}}}", "stepz"),
    (SCAN_OK, TRIAGE_OK + ", repeats: 1", "repeats"),
    (SCAN_OK, "suspects: []", "suspects"),
])
def test_bad_keys_are_one_clear_error(tmp_path, scan, triage, needle):
    with pytest.raises(RunbookError) as info:
        load(tmp_path, scan, triage)
    assert needle in str(info.value)


def test_a_fault_as_suspect_is_exit_2_naming_the_key(tmp_path, cli):
    path = tmp_path / "rb.yaml"
    path.write_text(RB % (SCAN_OK, "suspects: {sel: {env: {NSA_FAULT: 'sel_v1_quadratic@64'}}}"))
    proc = cli("plan", path)
    assert proc.returncode == 2
    out = proc.stdout + proc.stderr
    assert "suspects.sel.env.NSA_FAULT" in out and "never a suspect" in out and "Traceback" not in out


def test_plans_interleave_repeats_and_change_one_thing(tmp_path):
    from validation.runbook.plan import step_launches

    sc, tr = load(tmp_path, SCAN_OK + ", repeats: 3",
                  "suspects: {v2: {env: {NSA_SEL_RANGES_V2: '1'}}, acc: {args: {accum: 2}}}, repeats: 2").steps()
    specs = step_launches(sc, None, None)
    assert sorted(s.label for s in specs) == ["128"] * 3 + ["64"] * 3
    for s in specs:
        assert s.argv[s.argv.index("--seq-len") + 1] == s.label and s.env["NSA_FAULT"] == "sel_v1_quadratic@256"
    assert {s.repeat for s in specs[:2]} == {0}  # each repeat runs every point before the next repeat starts
    specs = step_launches(tr, None, None)
    assert sorted(s.label for s in specs) == ["acc", "acc", "config", "config", "v2", "v2"]
    for s in specs:
        argv = " ".join(s.argv)
        assert (s.env.get("NSA_SEL_RANGES_V2") == "1") == (s.label == "v2") and ("--accum 2" in argv) == (s.label == "acc")
        assert s.env["NSA_FAULT"] == "sel_v1_quadratic@256"  # the fault is the configuration's, in every run


def test_views_format_real_results():
    """(A damaged step: tests/validation/kinds/test_registry.py, every kind.)"""
    from validation.kinds import get
    from validation.report.renderer import blocks_markdown

    def md(kind, result):
        return blocks_markdown(get(kind).blocks(get(kind).read(result)))

    scan = {"metrics": {"setting": "args.seq_len", "exponent": 1.234, "exponent_ci": [1.0, 1.5], "cliff": True,
                        "cliff_interval": [256, 320], "cliff_localised": True, "expected_exponent": 1.5,
                        "bisection": {"points": [[384, "bad"], [320, "bad"]], "width": 64, "resolution": 64,
                                      "stopped": "done"},
                        "points": [{"value": 256, "source": "scan", "runs": 2, "passed": 2, "step_time_s": 0.0552,
                                    "toks_per_s": 18593.2, "time_to_first_step_s": 2.18, "peak_mem_gb": 0.43,
                                    "exponent_to_next": 3.83, "cliff_to_next": True}]}}
    text = md("scan", scan)
    assert "**Cost exponent** (log step time vs log seq_len): 1.23 (95% CI 1.00 .. 1.50)" in text
    assert "**Cliff**: yes, between 256 and 320 (localised" in text and "Bisection: 384: bad, 320: bad" in text
    # no device peak recorded: no MFU
    assert "| 256 | scan | 2/2 | 55.2 ms | 18,593.2 | 2.18 s | 0.43 GiB | **3.83 CLIFF** |" in text
    scan["metrics"]["points"][0]["mfu"] = 0.2951
    assert "| 18,593.2 (MFU 29.5%) |" in md("scan", scan)
    # scaling's rows likewise: MFU beside tokens/s where the runs recorded it
    scaling = {"metrics": {"weak": {"base": 1, "rows": [
        {"world_size": 1, "toks_per_s": 1000.0, "speedup": 1.0, "efficiency": 1.0, "batch_per_rank": 4, "mfu": None},
        {"world_size": 2, "toks_per_s": 1900.0, "speedup": 1.9, "efficiency": 0.95, "batch_per_rank": 4,
         "mfu": 0.31}]}}}
    text = md("scaling", scaling)
    assert "| 1 | 4 | 1,000.0 | 1.00x | 100% |" in text and "| 2 | 4 | 1,900.0 (MFU 31.0%) | 1.90x | 95% |" in text
    assert "cliff between 256 and 320 (localised)" in get("scan").summary_line(get("scan").read(scan))
    tri = {"metrics": {"culprit": "a", "reason": "why", "ranking": ["a", "b"], "config_toks_per_s": 1000.0,
                       "suspects": {"a": {"effect": 4.0, "ci": [3.5, 4.5], "p_adjusted": 0.0002, "significant": True,
                                          "toks_per_s": 5000.0, "changes": "NSA_SEL_RANGES_V2=1"},
                                    "b": {"effect": -0.5, "ci": [-0.6, -0.4], "p_adjusted": 0.01,
                                          "significant": True, "toks_per_s": 500.0}}}}
    text = md("triage", tri)
    assert text.index("| **a CULPRIT** | NSA_SEL_RANGES_V2=1 | 5,000.0 | +400") < text.index("| b | — | 500.0 |")
    assert "| 0.0002 | yes |" in text and "**Culprit**: a — why" in text
    assert "culprit: a" in get("triage").summary_line(tri)


def simulated_scan(monkeypatch, tmp_path, cliff_at):
    """Run the scan step with its launches faked: a run's window of step times is 1 ms per 32 tokens, plus a
    quadratic term above `cliff_at` (None: none), times 3% noise; every launch is collected as passed."""
    import numpy as np

    from validation.kinds import scan as scan_mod
    from validation.kinds.trainer import Runs
    from validation.results.codec import decode, encode
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun

    rng = np.random.default_rng(11)
    launched = []

    def times(run):
        v = float(next(iter(run["params"].values())))
        t = v / 32000 + (1e-5 * v * v if cliff_at is not None and v > cliff_at else 0.0)
        return list(t * np.exp(rng.normal(0, 0.03, 5)))

    def fake_run_all(ctx, retry_disturbed=False, launches=None, on_progress=None):
        """run_all with every launch collected as passed, each run saved as it ends."""
        runs = []
        for spec in ctx.launches if launches is None else launches:
            launched.append(spec)
            runs.append(LaunchRun(label=spec.label, params=dict(spec.params), status="passed", dir=spec.dir,
                                  command=list(spec.argv), repeat=spec.repeat,
                                  metrics=decode(LaunchMetrics, {"toks_per_s": {"mean": 1000.0}})))
            (on_progress or (lambda so_far: ctx.save(so_far.partial())))(Runs(list(runs)))
        return Runs(runs)

    monkeypatch.setattr(scan_mod, "run_all", fake_run_all)
    monkeypatch.setattr(scan_mod, "run_values", lambda run_dir, step, run, metric: times(run))
    sc = load(tmp_path, "values: {args.seq_len: [64, 128, 256, 512]}, repeats: 2, "
                        "bisect: {steps: 4, resolution: 32, multiple_of: 32}").steps()[0]
    from validation.runbook.plan import step_launches

    saved = []
    ctx = SimpleNamespace(run_dir=tmp_path, step=sc, launches=step_launches(sc, {}, tmp_path), winners=dict,
                          save=lambda partial=None: saved.append(partial))
    result = scan_mod.Scan().run(sc.options, ctx)
    assert len(saved) == len(launched)  # every run saved as it ended
    assert [r.dir for r in saved[-1].runs] == [r.dir for r in result.runs[:len(saved[-1].runs)]]
    return encode(result), launched


def test_scan_run_bisects_a_simulated_cliff(monkeypatch, tmp_path):
    result, launched = simulated_scan(monkeypatch, tmp_path, cliff_at=300)
    m = result["metrics"]
    assert result["status"] == "passed" and m["cliff"] and m["cliff_pair"]["a"] == 256 and m["cliff_pair"]["b"] == 512
    good, bad = m["cliff_interval"]
    assert good <= 300 < bad and bad - good <= 32 and m["cliff_localised"]
    bisected = [v for v, _ in m["bisection"]["points"]]
    assert all(v % 32 == 0 for v in bisected) and bisected[0] == 384
    probes = [s for s in launched if "/bisect_" in s.dir]
    assert len(probes) == 2 * len(bisected)  # every bisection point runs `repeats` times, in its own directory
    assert len({s.dir for s in probes}) == len(probes)
    assert {p["value"] for p in m["points"] if p["source"] == "bisect"} == set(bisected)
    assert m["exponent_ci"][0] < m["exponent"] < m["exponent_ci"][1]


def test_scan_run_without_a_cliff_does_not_bisect(monkeypatch, tmp_path):
    result, launched = simulated_scan(monkeypatch, tmp_path, cliff_at=None)
    m = result["metrics"]
    assert result["status"] == "passed" and not m["cliff"] and m["bisection"] is None and not m["cliff_localised"]
    assert abs(m["exponent"] - 1.0) < 0.1 and len(launched) == 8  # linear cost: exponent 1


def _simulated_triage(monkeypatch, tmp_path, disturbed):
    """Triage.run over fake launches: the suspect 40% faster in every repeat; `disturbed(spec)` marks the runs
    another process disturbed (their telemetry's interference). Returns the Result as results.json would hold it."""
    from validation.kinds import triage as triage_mod
    from validation.kinds.trainer import Runs
    from validation.results.codec import decode, encode
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun

    def fake_run_all(ctx, retry_disturbed=False, **_):
        return Runs([LaunchRun(label=s.label, params=dict(s.params), status="passed", dir=s.dir, command=list(s.argv),
                               repeat=s.repeat, metrics=decode(LaunchMetrics, {"interference": {
                                   "disturbed": disturbed(s), "share": 0.5,
                                   "text": "other processes used 1.50 of 2 cores" if disturbed(s) else "no interference"}}))
                     for s in ctx.launches])

    monkeypatch.setattr(triage_mod, "run_all", fake_run_all)
    monkeypatch.setattr(triage_mod, "run_toks",
                        lambda ctx, step, run: 1400.0 + run.repeat if run.label == "a" else 1000.0)
    tr = load(tmp_path, triage=TRIAGE_OK + ", repeats: 3").steps()[1]
    from validation.runbook.plan import step_launches

    ctx = SimpleNamespace(run_dir=tmp_path, save=lambda partial=None: None, step=tr,
                          launches=step_launches(tr, {}, tmp_path))
    return encode(triage_mod.Triage().run(tr.options, ctx))


def test_triage_leaves_disturbed_runs_out_and_is_inconclusive_not_failed_when_too_few_remain(monkeypatch, tmp_path):
    clean = _simulated_triage(monkeypatch, tmp_path, lambda spec: False)
    assert clean["status"] == "passed" and clean["metrics"]["culprit"] == "a"
    assert clean["interference"]["disturbed"] is False
    # one repeat of the suspect disturbed: named from the other two, the record says it was left out
    one = _simulated_triage(monkeypatch, tmp_path, lambda spec: spec.label == "a" and spec.repeat == 0)
    assert one["metrics"]["culprit"] == "a" and "left out because other work used the machine" in \
        one["metrics"]["reason"]
    assert one["interference"]["disturbed"] is False and one["interference"]["left_out"] == 1
    # every run disturbed: no ranking; nothing failed, the evidence is missing: passed, and disturbed (criteria on
    # it inconclusive, the run INCOMPLETE), never NO-GO
    every = _simulated_triage(monkeypatch, tmp_path, lambda spec: True)
    # nothing compared: no verdict, so no culprit key (a criterion `tr.culprit is None` cannot hold on it)
    assert every["status"] == "passed" and "culprit" not in every["metrics"]
    assert every["reason"].startswith("no ranking: ") and "inconclusive" in every["reason"]
    assert every["interference"]["disturbed"] is True


def test_a_triage_that_compared_nothing_names_no_verdict_and_a_criterion_on_its_culprit_cannot_pass(monkeypatch,
                                                                                                      tmp_path):
    """Every run disturbed: no suspect was compared, so the triage has no verdict. Its culprit key is absent (a
    criterion `tr.culprit is None`, "no false culprit", cannot hold on it: an error, which the disturbance makes
    inconclusive), and its key figure, section and console line say "nothing compared", never "no culprit" alone;
    results written before (a null culprit without a ranking) read the same."""
    from validation import kinds
    from validation.kinds import get
    from validation.report.renderer import blocks_markdown
    from validation.runbook.expressions import compile_expression

    every = {**_simulated_triage(monkeypatch, tmp_path, lambda spec: True), "name": "tr", "kind": "triage"}
    older = {**every, "metrics": {**every["metrics"], "culprit": None}}
    triage = get("triage")
    for step in (every, older):
        (figure,) = triage.key_figures(kinds.read_steps([step]))
        assert figure.value == "none, nothing compared" and "no ranking: " in figure.note
        assert triage.summary_line(triage.read(step)) == " no culprit named, nothing compared"
        section = blocks_markdown(triage.blocks(triage.read(step)))
        assert "**Culprit**: none, nothing compared — no ranking: " in section
    result = compile_expression("tr.culprit is None").evaluate({"tr": every["metrics"]})
    assert result.status == "error" and "culprit" in result.detail
    # a triage that ranked its suspects and named none still says so
    ranked = {**every, "metrics": {**older["metrics"], "ranking": ["a"], "reason": "no suspect changes toks_per_s"}}
    (figure,) = triage.key_figures(kinds.read_steps([ranked]))
    assert figure.value == "none named" and triage.summary_line(triage.read(ranked)).startswith(" no culprit (")
    assert compile_expression("tr.culprit is None").evaluate({"tr": ranked["metrics"]}).status == "pass"


def _one_run_scan(monkeypatch, tmp_path, steps):
    """Scan.run with one run a point and a window of `steps` step times each: 1 ms per 32 tokens, 8x the cost
    from 256 to 512 (a local exponent of 3, a cliff), 3% noise with a lag-1 correlation of 0.7."""
    from validation.kinds import scan as scan_mod
    from validation.kinds.trainer import Runs
    from validation.results.codec import decode, encode
    from validation.results.trainer_launch import LaunchMetrics, LaunchRun
    from validation.runbook.plan import step_launches

    from decision_support import ar1_series

    def times(run):
        v = float(next(iter(run["params"].values())))
        level = v / 32000 * (4.0 if v >= 512 else 1.0)
        return list(ar1_series(int(v), steps, level, 0.03, phi=0.7))

    def fake_run_all(ctx, retry_disturbed=False, launches=None, on_progress=None):
        return Runs([LaunchRun(label=s.label, params=dict(s.params), status="passed", dir=s.dir,
                               command=list(s.argv), repeat=s.repeat,
                               metrics=decode(LaunchMetrics, {"toks_per_s": {"mean": 1000.0}}))
                     for s in (ctx.launches if launches is None else launches)])

    monkeypatch.setattr(scan_mod, "run_all", fake_run_all)
    monkeypatch.setattr(scan_mod, "run_values", lambda run_dir, step, run, metric: times(run))
    sc = load(tmp_path, "values: {args.seq_len: [64, 128, 256, 512]}, repeats: 1").steps()[0]
    ctx = SimpleNamespace(run_dir=tmp_path, step=sc, launches=step_launches(sc, {}, tmp_path), winners=dict,
                          save=lambda partial=None: None)
    return encode(scan_mod.Scan().run(sc.options, ctx))


def test_one_run_a_point_calls_a_cliff_only_from_windows_long_enough_for_block_means(monkeypatch, tmp_path):
    """With one run a point the noise is the block means of its window, whose 95% interval holds only from 20 steps
    (validation.analysis.significance.units), and which never sees the run-to-run noise: at 20 steps the jump is
    an inconclusive cliff; a 10-step window gives no noise estimate: no cliff is called, and a note names the points
    and what to change."""
    long = _one_run_scan(monkeypatch, tmp_path, 20)
    # block means see no run-to-run noise: with no declared launch noise the cliff they find is inconclusive
    lm = long["metrics"]
    assert lm["cliff"] is None and lm["noise_source"] == "blocks" and lm["run_to_run"] == "unknown"
    assert lm["cliff_reason"].startswith("inconclusive: between 256 and 512") and not long.get("notes")
    short = _one_run_scan(monkeypatch, tmp_path, 10)
    m = short["metrics"]
    assert short["status"] == "passed" and not m["cliff"] and m["noise_source"] == "none"
    assert "no cliff can be called" in m["cliff_reason"]
    assert m["exponent"] > 1  # the cost exponent needs no per-point noise: still fitted
    (note,) = short["notes"]
    assert "shorter than 20 steps at 64 (10 steps), 128 (10 steps), 256 (10 steps), 512 (10 steps)" in note
    assert "use repeats >= 2 or a window of at least 20 steps" in note
