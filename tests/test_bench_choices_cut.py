"""benchmarks/bench_choices.py cut by its step's time limit: timeout's SIGTERM is not a crash of the arm in
progress, which a resumed process measures afresh; cut a second time it is failed, so that the arms after it are
measured (a crash, an illegal memory access, is recorded as one: that is tests/test_next_run.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]

FAKE = '''
"""bench_choices.main with its device and launch choices replaced (no torch here: this process starts in a fraction
of a second): fixed block times (topk 8 ms, sort 10 ms); a block under the topk choice is terminated as timeout
terminates a step at its limit (SIGTERM to the process) while the file CUT names is there."""
import os, signal, sys, types
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks"))
sys.modules["torch"] = types.SimpleNamespace(__version__="none")  # main's `import torch`: no device is used
import bench_choices as bc
now = {"topk-choice": "auto"}
class Choices:
    def __init__(self, flags):
        pass
    def apply(self, settings):
        now["topk-choice"] = settings.get("topk-choice", "auto")
    def restore(self):
        self.apply({})
def measure(one, warmup, repeats, device):
    if now["topk-choice"] == "topk" and os.path.exists(os.environ["CUT"]):
        os.kill(os.getpid(), signal.SIGTERM)
    t = .008 if now["topk-choice"] == "topk" else .01
    return {"times_s": {m: {"min": t, "median": t, "max": t} for m in ("fwd", "bwd", "fwdbwd")}, "passes": 5,
            "loss": 1.0, "grad_norm": 1.0}
bc.Choices, bc.measure_block, bc.layer_pass = Choices, measure, lambda args: None
bc.choice_problem = lambda flag, value: None
bc.choices_in_effect = lambda path, index_build="auto": {"topk_choice": now["topk-choice"].replace("auto", "sort")}
sys.exit(bc.main(sys.argv[1:]))
'''


def _setup(tmp_path):
    fake, out, cut = tmp_path / "fake.py", tmp_path / "c.json", tmp_path / "cut"
    fake.write_text(FAKE)
    cut.touch()
    argv = [sys.executable, str(fake), "--path", "nsa-torch", "--seq-len", "64", "--rounds", "3",
            "--arm", "sort=topk-choice:sort", "--arm", "again=topk-choice:sort", "--arm", "topk=topk-choice:topk",
            "--arm", "last=topk-choice:sort", "--json", str(out), "--resume", str(out)]
    env = {**os.environ, "REPO": str(ROOT), "CUT": str(cut), "PYTHONPATH": str(ROOT)}
    return argv, env, out, cut


def _resume_here(argv, monkeypatch) -> int:
    """The resumed process, run in this one: the same blocks, no cut."""
    from nsa.attention import selection

    bc = load("bench_choices")

    def measure(one, warmup, repeats, device):
        t = .008 if selection.TOPK_CHOICE == "topk" else .01
        return {"times_s": {m: {"min": t, "median": t, "max": t} for m in ("fwd", "bwd", "fwdbwd")}, "passes": 5,
                "loss": 1.0, "grad_norm": 1.0}

    monkeypatch.setattr(bc, "measure_block", measure)
    monkeypatch.setattr(bc, "layer_pass", lambda args: None)
    return bc.main(argv[2:])


def test_an_arm_cut_by_the_time_limit_is_measured_afresh_by_resume_not_recorded_as_crashed(tmp_path, monkeypatch):
    argv, env, out, cut = _setup(tmp_path)
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 124, (first.returncode, first.stdout, first.stderr)
    data = json.loads(out.read_text())
    assert data["in_progress"] is None and data["arms"]["topk"] == {"cuts": 1}  # no error: measured afresh
    assert data["arms"]["again"]["verdict"] == "mixed"  # the arm finished before the cut is kept
    cut.unlink()
    assert _resume_here(argv, monkeypatch) == 0
    arms = json.loads(out.read_text())["arms"]
    assert "error" not in arms["topk"] and arms["topk"]["verdict"] == "faster in every round"
    assert [r["ratio"]["fwdbwd"] for r in arms["topk"]["rounds"]] == [0.8] * 3  # 8 ms against 10 ms, three rounds
    assert arms["last"]["verdict"] == "mixed"


def test_an_arm_cut_twice_is_failed_and_the_arms_after_it_are_measured(tmp_path, monkeypatch):
    argv, env, out, cut = _setup(tmp_path)
    ab = load("ab_table")
    for _ in range(2):
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 124, (proc.stdout, proc.stderr)
    once = json.loads(out.read_text())
    (record,) = [r for r in ab.choices_records(tmp_path, out) if r["choice"] == "topk"]
    assert record["verdict"] == "incomplete" and "cut twice" in record["rounds"][-1]["failed"]
    assert _resume_here(argv, monkeypatch) == 1  # one arm failed
    arms = json.loads(out.read_text())["arms"]
    assert arms["topk"] == once["arms"]["topk"] and arms["topk"]["cuts"] == 2
    assert arms["last"]["verdict"] == "mixed" and "error" not in arms["last"]


def test_an_arm_cut_once_and_not_measured_since_has_its_row_in_the_table(tmp_path):
    ab = load("ab_table")
    out = tmp_path / "c.json"
    out.write_text(json.dumps({"bench": "choices", "seq_len": 2048, "batch": 8, "baseline": "shipped",
                               "arm_settings": {"shipped": {}, "dq_query": {}}, "in_progress": None,
                               "arms": {"dq_query": {"cuts": 1}}}))
    (record,) = ab.choices_records(tmp_path, out)
    assert record["verdict"] == "incomplete" and record["rounds"][-1]["failed"].startswith("cut by its step's time")
    assert "| c | 2048b8 | dq_query vs shipped |" in ab.table([record])
