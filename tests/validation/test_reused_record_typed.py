"""A phase taken from an earlier run (run --reuse) is recorded in results.json under "reused" (the run's entries and
each reused step's): read as validation.results.run.ReusedRecord, whose `source` is the JSON's "from" (a Python
keyword: the codec's keyed() maps the field to that key). Checked against a results.json written out by hand here,
as write_results lays one out (two-space indent, the schema's key order, a newline at the end): it reads back into
the typed attributes and is written back to the same bytes."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from validation.execution.acceptance import _logs
from validation.results.codec import decode, encode, keyed
from validation.results.model import ResultsError
from validation.results.run import ReusedRecord, Run, Step, read_run
from validation.results.store import reused_note, reused_notes, write_results

# a run whose phase "kernels" (step kbench) was taken from an earlier run, its steps having run without NSA_X=1
RESULTS_JSON = """{
  "schema_version": 1,
  "tool": {
    "name": "nsa-validate",
    "version": "0.4.0"
  },
  "runbook": {
    "name": "h100_single",
    "description": "one H100",
    "path": "runbooks/h100_single.yaml",
    "sha256": "aaaa"
  },
  "run_dir": "artifacts/validate/now",
  "started": "2026-02-02T10:00:00+0000",
  "finished": "2026-02-02T10:05:00+0000",
  "duration_s": 300.0,
  "verdict": "GO",
  "verdict_reason": "every criterion passed",
  "interrupted_by": null,
  "environment": {
    "git_sha": "abc",
    "git_branch": "main",
    "git_dirty": false,
    "git_changes": 0,
    "host": "node1",
    "platform": "Linux",
    "python": "3.11.7",
    "torch": "2.4.0",
    "cuda": "12.4",
    "nccl": "2.21.5",
    "gpus": [
      {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_gb": 80,
        "capability": [
          9,
          0
        ]
      }
    ],
    "gpu_count": 1,
    "cpu_count": 32,
    "packages": {},
    "source_digest": "5555666677778888"
  },
  "options": {
    "only": [],
    "skip": [],
    "set": []
  },
  "phases": [
    {
      "name": "kernels",
      "title": "Kernels",
      "description": "",
      "steps": [
        "kbench"
      ]
    }
  ],
  "steps": {
    "kbench": {
      "name": "kbench",
      "phase": "kernels",
      "kind": "bench",
      "title": "Kernel bench",
      "description": "",
      "status": "passed",
      "reason": "not run here: phase kernels: its results are those of reports/gpu/earlier/results.json",
      "started": "2026-02-02T10:00:01+0000",
      "duration_s": 412.5,
      "dir": "kbench",
      "command": null,
      "env": {},
      "metrics": {
        "speed": 1.5
      },
      "runs": [],
      "winner": null,
      "comparison": [],
      "artifacts": [],
      "excerpt": null,
      "stack_dumps": [],
      "optional": false,
      "reused": {
        "phase": "kernels",
        "from": "reports/gpu/earlier/results.json",
        "runbook": "gpu_kernels",
        "finished": "2026-01-31T23:59:00+0100",
        "device": "2 x NVIDIA H100 80GB HBM3",
        "source_digest": "5555666677778888",
        "differences": [
          "NSA_X=1"
        ]
      }
    }
  },
  "acceptance": [],
  "recommendations": {
    "env": {},
    "notes": []
  },
  "reused": [
    {
      "phase": "kernels",
      "from": "reports/gpu/earlier/results.json",
      "runbook": "gpu_kernels",
      "finished": "2026-01-31T23:59:00+0100",
      "device": "2 x NVIDIA H100 80GB HBM3",
      "source_digest": "5555666677778888",
      "differences": [
        "NSA_X=1"
      ]
    }
  ],
  "plots": []
}
"""


def test_a_reused_phase_reads_into_typed_attributes():
    run = decode(Run, json.loads(RESULTS_JSON), "results")  # strictly: every value of the right type
    taken = run.steps["kbench"].reused
    assert isinstance(taken, ReusedRecord)
    assert taken.phase == "kernels" and taken.source == "reports/gpu/earlier/results.json"
    assert taken.runbook == "gpu_kernels" and taken.finished == "2026-01-31T23:59:00+0100"
    assert taken.device == "2 x NVIDIA H100 80GB HBM3" and taken.source_digest == "5555666677778888"
    assert taken.differences == ["NSA_X=1"] and taken.extra == {}  # "from" is the field, not an unknown key
    assert run.reused == [taken]
    assert read_run(json.loads(RESULTS_JSON)) == run  # the lenient reading of a sound record: the same


def test_a_results_json_with_a_reused_phase_is_written_back_byte_for_byte(tmp_path):
    run = decode(Run, json.loads(RESULTS_JSON), "results")
    path = write_results(tmp_path, encode(run))
    assert path.read_bytes() == RESULTS_JSON.encode("utf-8")


def test_the_note_names_the_earlier_run_from_the_typed_record():
    run = read_run(json.loads(RESULTS_JSON))
    expected = ("phase kernels: its results are those of reports/gpu/earlier/results.json (gpu_kernels run finished "
                "2026-01-31T23:59:00+0100 on 2 x NVIDIA H100 80GB HBM3; the same source, digest 555566667777; "
                "its steps ran without NSA_X=1, which this runbook's defaults.env adds); nothing of it ran here")
    assert reused_note(run.steps["kbench"].reused) == expected
    assert reused_notes(run) == [expected] == reused_notes(json.loads(RESULTS_JSON))


def test_a_reused_record_without_differences_leaves_the_key_out_and_keeps_unknown_keys():
    record = {"phase": "p", "from": "r/results.json", "runbook": None, "finished": None, "device": "no GPU",
              "source_digest": "d", "later": 1}
    taken = decode(ReusedRecord, record)
    assert taken.source == "r/results.json" and taken.differences is None and taken.extra == {"later": 1}
    assert json.dumps(encode(taken)) == json.dumps(record)  # the same keys in the same order
    assert encode(ReusedRecord(phase="p", source="s"))["from"] == "s"


def test_a_keyed_field_is_read_only_from_its_json_key():
    @dataclasses.dataclass(frozen=True)
    class Rec:
        source: str | None = keyed("from")
        extra: dict = dataclasses.field(default_factory=dict)

    assert decode(Rec, {"source": "x"}) == Rec(source=None, extra={"source": "x"})
    with pytest.raises(ResultsError, match=r"^rec\.from: expected str \| None, got int$"):
        decode(Rec, {"from": 3}, "rec")
    assert decode(Rec, {"from": 3}, lenient=True) == Rec()


def test_an_empty_reused_record_is_no_reuse(tmp_path):
    """`"reused": {}` names no earlier run: the step's logs are read where it ran (this run's directory)."""
    (tmp_path / "kbench").mkdir()
    (tmp_path / "kbench" / "stdout.log").write_text("here\n")
    run = read_run({"steps": {"kbench": {"name": "kbench", "artifacts": ["kbench/stdout.log"], "reused": {}}}})
    assert run.steps["kbench"].reused == ReusedRecord()
    assert _logs(run, Path(tmp_path))("kbench") == "here\n"
    assert read_run({"steps": {"kbench": {}}}).steps["kbench"] == Step()
