"""Acceptance criteria on figures that were not measured, and on disturbed evidence (validation.runbook.expressions,
validation.execution.acceptance; the README's criteria section):

- a null (a kind's "not measured" or "inconclusive", e.g. a scan's `cliff`, a CPU run's `throttled`) never makes a
  criterion pass: `not (a.throttled or b.throttled)` with a.throttled null is an error as `not a.throttled` is,
  never "neither throttled";
- values of different kinds compared for equality are a type mismatch (an error), never a pass: `x.code != '0'`
  with the code 0 "held";
- a correctness check decides on a disturbed step: a criterion that fails on a loss that rose, never reading the
  throughput the disturbance shook, is NO-GO, not INCOMPLETE with "nothing evaluated failed";
- a log nobody could read is no evidence: `not log_contains(step, 'Traceback')` on a step that recorded no log, or
  whose recorded log is gone, is an error, never "no traceback";
- `ab.runs['x'].toks_per_s.mean` reads one launch: a disturbed one the decision left out makes the criterion
  inconclusive, though the step's own record says its decision is undisturbed.
"""

from __future__ import annotations

import pytest

from validation.analysis.interference import decision_record
from validation.execution.acceptance import evaluate, verdict
from validation.execution.evidence import assess
from validation.runbook.expressions import compile_expression
from validation.runbook.loader import load_runbook

NS = {
    "a": {"throttled": None, "cliff": None, "drift": None, "code": 0, "ok": True, "zero": 0, "label": "50",
          "reasons": ["hw_slowdown"], "winner": {"label": "50"}, "sizes": [1, 2]},
    "b": {"throttled": False, "cliff": False, "rate": 2.0},
}


def ev(text: str):
    return compile_expression(text).evaluate(NS)


# --- a null skipped by `or` ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", [
    "not (a.throttled or b.throttled)",          # Python: not (None or False) -> True
    "not (a.cliff or b.cliff)",
    "not (a.throttled or a.zero)",
    "not (b.throttled or a.throttled or b.cliff)",
    "not (a.drift or b.rate > 5)",
])
def test_a_null_skipped_by_or_is_no_evidence_for_not(text):
    r = ev(text)
    assert r.status == "error", r
    assert "None under 'not'" in r.detail


@pytest.mark.parametrize("text, status", [
    ("a.throttled or b.throttled", "fail"),      # not known to hold: never a pass
    ("a.throttled or b.rate > 1", "pass"),       # holds whatever the null would have been
    ("b.rate > 1 or a.throttled", "pass"),
    ("a.throttled is None or b.throttled", "pass"),  # asks for the absence explicitly
    ("not (b.cliff or b.throttled)", "pass"),    # both measured: unchanged
])
def test_or_with_a_null_passes_only_when_a_measured_side_holds(text, status):
    assert ev(text).status == status


# --- equality across kinds -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, kinds", [
    ("a.code != '0'", "number 0 with text '0'"),                  # Python: 0 != '0' -> True
    ("a.label != 50", "text '50' with number 50"),                # Python: True
    ("a.winner != '50'", "mapping {label=50} with text '50'"),    # Python: True (the winner is a mapping)
    ("a.reasons != 'hw_slowdown'", "list [hw_slowdown] with text 'hw_slowdown'"),
    ("a.sizes != ['1', '2']", "number 1 with text '1'"),          # item by item
    ("a.ok != 'True'", "flag True with text 'True'"),
    ("'0' not in (a.code, 1)", "text '0' with number 0"),          # nothing of its kind to find
    ("'1' not in a.sizes", "text '1' with number 1"),
])
def test_equality_across_kinds_is_a_type_mismatch_never_a_pass(text, kinds):
    r = ev(text)
    assert r.status == "error", r
    assert f"cannot compare {kinds}" in r.detail and "type mismatch" in r.detail


@pytest.mark.parametrize("text, status", [
    ("a.code == 0", "pass"), ("a.code != 1", "pass"), ("a.label == '50'", "pass"), ("a.sizes == (1, 2)", "pass"),
    ("a.sizes != [1, 3]", "pass"), ("a.ok == True", "pass"), ("a.code == 0.0", "pass"), ("2 in a.sizes", "pass"),
    ("3 not in a.sizes", "pass"), ("'hw_slowdown' in a.reasons", "pass"), ("a.label in ('25', 50, '50')", "pass"),
    ("a.winner == a.winner", "pass"), ("a.reasons == []", "fail"),
])
def test_equality_within_a_kind_is_unchanged(text, status):
    assert ev(text).status == status


# --- a correctness check on a disturbed step -----------------------------------------------------------------------

RUNBOOK = """\
name: mixed
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: p
    steps:
      - {name: baseline, kind: train}
acceptance:
  - {name: "Learns and is fast", expr: "EXPR", target: "loss falls, 100 tokens/s"}
"""
BUSY = {"disturbed": True, "text": "other processes used 1.40 of 2 cores on average in 5 of 8 samples (62%)",
        "share": 0.625}


def _judge(tmp_path, expr: str, loss_drop: float, interference: dict | None = BUSY, artifacts: list | None = None):
    path = tmp_path / "mixed.yaml"
    path.write_text(RUNBOOK.replace("EXPR", expr))
    runbook = load_runbook(path)
    metrics = {"loss_drop": loss_drop, "toks_per_s": {"mean": 500.0, "n": 20, "cv": 0.05}}
    if interference is not None:
        metrics["interference"] = interference
    results = {"runbook": {"name": "mixed", "path": str(path)}, "run_dir": str(tmp_path), "acceptance": [],
               "steps": {"baseline": {"name": "baseline", "kind": "train", "status": "passed", "metrics": metrics,
                                      "artifacts": artifacts or []}}}
    results["acceptance"] = evaluate(runbook, results, tmp_path)
    return results["acceptance"][0], verdict(results, False)


def test_a_loss_that_rose_on_a_disturbed_step_is_no_go_when_the_throughput_was_never_read(tmp_path):
    row, got = _judge(tmp_path, "baseline.loss_drop > 0 and baseline.toks_per_s.mean > 100", loss_drop=-0.5)
    assert row["status"] == "fail", row
    assert got == ("NO-GO", "criteria failed: Learns and is fast")


@pytest.mark.parametrize("expr, loss_drop", [
    ("baseline.loss_drop > 0 and baseline.toks_per_s.mean > 100", 0.5),   # held: the throughput decided too
    ("baseline.toks_per_s.mean > 100", 0.5),
    ("baseline.loss_drop < 0 or baseline.toks_per_s.mean > 100", 0.5),    # the throughput decided
])
def test_a_figure_the_disturbance_shook_that_decided_stays_inconclusive(tmp_path, expr, loss_drop):
    row, (word, _) = _judge(tmp_path, expr, loss_drop)
    assert row["status"] == "inconclusive" and row["detail"].startswith("it held, but on disturbed evidence"), row
    assert word == "INCOMPLETE"


def test_what_an_evaluation_read_is_recorded():
    assert compile_expression("b.rate > 1 or a.code == 0").evaluate(NS).reads == (("b", ("rate",)),)
    assert compile_expression("b.rate > 5 or a.code == 0").evaluate(NS).reads == (("b", ("rate",)),
                                                                                  ("a", ("code",)))
    assert compile_expression("max(b.rate, a.code) >= 2 and len(a.sizes) == 2").evaluate(NS).reads == (
        ("b", ("rate",)), ("a", ("code",)), ("a", ("sizes",)))


# --- logs that cannot be read ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("expr", ["not log_contains(baseline, 'Traceback')", "log_count(baseline, 'WARNING') == 0"])
@pytest.mark.parametrize("artifacts, words", [
    ([], "no log for step baseline"),                                           # the step recorded no log
    (["baseline/gone.log"], "baseline/gone.log cannot be read"),                # its log is gone
    (["baseline/stdout.log", "baseline/gone.log"], "baseline/gone.log cannot be read"),  # one of two is
])
def test_a_log_that_cannot_be_read_is_an_error_never_clean(tmp_path, expr, artifacts, words):
    (tmp_path / "baseline").mkdir()
    (tmp_path / "baseline" / "stdout.log").write_text("step 1\n")
    row, got = _judge(tmp_path, expr, loss_drop=0.5, interference=None, artifacts=artifacts)
    assert row["status"] == "error" and words in row["detail"], row
    assert got == ("NO-GO", "criteria failed: Learns and is fast")
    # the log that is there, read: clean
    row, got = _judge(tmp_path, expr, loss_drop=0.5, interference=None, artifacts=["baseline/stdout.log"])
    assert row["status"] == "pass" and got[0] == "GO", row


def test_a_log_that_was_read_still_decides(tmp_path):
    (tmp_path / "baseline").mkdir()
    (tmp_path / "baseline" / "stdout.log").write_text("Traceback (most recent call last):\n")
    (tmp_path / "baseline" / "empty.log").write_text("")  # a log that exists and is empty was read
    row, got = _judge(tmp_path, "not log_contains(baseline, 'Traceback')", loss_drop=0.5, interference=None,
                      artifacts=["baseline/stdout.log", "baseline/empty.log"])
    assert row["status"] == "fail" and got[0] == "NO-GO"


# --- one run of a decision, read by its label ---------------------------------------------------------------------

AB_RUNBOOK = """\
name: ev
requirements: {gpus: 0, backend: gloo}
defaults: {config: configs/tiny_cpu.yaml}
phases:
  - name: p
    steps:
      - name: prefill
        kind: ab
        baseline: {}
        variants: {batched: {env: {NSA_PREFILL_BATCHED: "1"}}}
        repeats: 3
acceptance:
  - {name: "Batched fast", expr: "prefill.runs['batched'].toks_per_s.mean > 1000", target: "> 1000 tokens/s"}
"""
QUIET = {"disturbed": False, "text": "no interference in 8 samples", "share": 0.0}


def _ab(tmp_path, last_batched: tuple[float, dict]):
    """An A/B whose decision (batched faster, replicated) stands on its undisturbed runs; the criterion reads
    runs['batched'], the last batched repeat, measured as `last_batched` (tokens/s, interference)."""
    path = tmp_path / "ev.yaml"
    path.write_text(AB_RUNBOOK)
    runbook = load_runbook(path)

    def run(label, repeat, toks, interference):
        return {"label": label, "repeat": repeat,
                "params": {"env.NSA_PREFILL_BATCHED": "1"} if label == "batched" else {},
                "metrics": {"toks_per_s": {"mean": toks, "cv": 0.05, "n": 20}, "interference": interference}}

    runs = ([run("baseline", r, 1000.0 + r, QUIET) for r in range(3)]
            + [run("batched", 0, 1300.0, QUIET), run("batched", 1, 1310.0, QUIET), run("batched", 2, *last_batched)])
    choice = {"label": "batched", "explanation": "30% faster", "significant": True,
              "params": {"env.NSA_PREFILL_BATCHED": "1"}}
    step = {"name": "prefill", "kind": "ab", "status": "passed", "runs": runs, "choice": choice, "winner": choice,
            "decision": {"significant": True, "recommendable": True}, "metrics": {"decided": True, "significant": True}}
    step["interference"] = decision_record(step, conclusive=True)
    results = {"runbook": {"name": "ev", "path": "runbooks/ev.yaml"}, "run_dir": "artifacts/validate/ev-1",
               "steps": {"prefill": step}, "acceptance": []}
    results["evidence"] = assess(runbook, results, results["run_dir"])
    results["acceptance"] = evaluate(runbook, results, results["run_dir"])
    return step, results["acceptance"][0], verdict(results, False)


@pytest.mark.parametrize("toks", [700.0, 1320.0])  # fails, holds: neither decides
def test_a_disturbed_run_read_by_its_label_is_inconclusive_though_the_decision_left_it_out(tmp_path, toks):
    step, row, (word, reason) = _ab(tmp_path, (toks, BUSY))
    assert step["interference"]["disturbed"] is False  # the decision stands on the undisturbed runs
    assert row["actual"] == f"prefill.runs['batched'].toks_per_s.mean = {toks:.4g}"
    assert row["status"] == "inconclusive", row
    assert "the run of step prefill it reads was disturbed: batched, repeat 3: other processes used" in row["detail"]
    rerun = "nsa-validate run runbooks/ev.yaml --resume artifacts/validate/ev-1 --rerun prefill"
    assert row["detail"].endswith(f"run again: {rerun}")
    assert word == "INCOMPLETE"
    assert "(disturbed: prefill); run again: " + rerun in reason


@pytest.mark.parametrize("toks, status, word", [(700.0, "fail", "NO-GO"), (1320.0, "pass", "GO")])
def test_an_undisturbed_run_read_by_its_label_decides(tmp_path, toks, status, word):
    _, row, got = _ab(tmp_path, (toks, QUIET))
    assert row["status"] == status and got[0] == word, (row, got)
