"""results.json's typed records (validation.results.model): every committed results.json holds to them and is
written back byte for byte; each kind of malformation is refused naming the file and the key path, on read and on
write (the previous file kept); the schema written in the module docstring and the TypedDicts are the same, key by
key; each status list is defined once."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path
from typing import Any, Callable

import pytest
from results_records import run_record
from typer.testing import CliRunner

from validation import formatting
from validation.results import store as results
from validation.results import model as results_model
from validation.runbook import loader as runbook
from validation.cli import app
from validation.results.store import RESULTS_JSON, read_results, write_results
from validation.results.model import RECORDS, ResultsError, check_results

REPO = Path(__file__).resolve().parents[2]
COMMITTED = sorted([*(REPO / "reports").rglob("results.json"), REPO / "tests/validation/fixtures/results_example.json"])
EXAMPLE = REPO / "tests/validation/fixtures/results_example.json"


def test_the_examples_are_found():
    assert {p.parent.name for p in (REPO / "reports" / "examples").glob("*/results.json")} >= {
        "cpu_smoke", "parallelism_cpu", "triage_cpu"}


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: str(p.relative_to(REPO)))
def test_every_committed_results_json_holds_and_is_written_back_unchanged(path, tmp_path):
    """The examples (reports/examples/*), the GPU runs (reports/gpu/*) and the test fixture pass check_results;
    read_results returns them as they are, and write_results writes the same bytes (the format is unchanged)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    assert check_results(data, str(path)) is data
    if path.name == RESULTS_JSON:
        assert read_results(path.parent) == data
        write_results(tmp_path, data)
        assert (tmp_path / RESULTS_JSON).read_bytes() == path.read_bytes()


# ---------------------------------------------------------------------------------------------------------------
# malformations: each is refused with the key path and what is wrong

def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A change to the record: the value at `path` ("steps.baseline.status", "acceptance.0.actual") set."""
    *parents, last = path.split("/")

    def change(data: dict) -> None:
        target: Any = data
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return change


def _delete(path: str) -> Callable[[dict], None]:
    *parents, last = path.split("/")

    def change(data: dict) -> None:
        target: Any = data
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        del target[last]
    return change


MALFORMED = {
    # missing required keys, at each level
    "missing run key": (_delete("verdict"), "verdict: missing (a required key of results.json)"),
    "missing step key": (_delete("steps/baseline/status"), "steps.baseline.status: missing (required in a step "
                                                            "record)"),
    "missing run entry key": (_delete("steps/bucket_sweep/runs/1/repeat"),
                              "steps.bucket_sweep.runs[1].repeat: missing (required in a run record)"),
    "missing criterion key": (_delete("acceptance/2/severity"),
                              "acceptance[2].severity: missing (required in a criterion record)"),
    "missing tool": (_delete("tool/version"), "tool.version: missing (required in a tool record)"),
    # wrong types
    "string for a number": (_set("steps/baseline/duration_s", "3.2"),
                            "steps.baseline.duration_s: expected a number or null, got a string ('3.2')"),
    "number for a string": (_set("acceptance/0/actual", 3), "acceptance[0].actual: expected a string, got a number "
                                                            "(3)"),
    "null where required": (_set("steps/baseline/dir", None), "steps.baseline.dir: expected a string, got null"),
    "boolean for an integer": (_set("steps/bucket_sweep/runs/0/repeat", True),
                               "steps.bucket_sweep.runs[0].repeat: expected an integer, got a boolean (True)"),
    "float for an integer": (_set("steps/bucket_sweep/runs/0/repeat", 1.5),
                             "steps.bucket_sweep.runs[0].repeat: expected an integer, got a number (1.5)"),
    "object for a list": (_set("steps/baseline/artifacts", {}), "steps.baseline.artifacts: expected a list, got an "
                                                               "object"),
    "list for metrics": (_set("steps/baseline/metrics", []), "steps.baseline.metrics: expected an object, got a list"),
    "number in a command": (_set("steps/baseline/command", ["torchrun", 2]),
                            "steps.baseline.command[1]: expected a string, got a number (2)"),
    "number as an env value": (_set("steps/baseline/env/NSA_DDP_BUCKET_MB", 25),
                               "steps.baseline.env.NSA_DDP_BUCKET_MB: expected a string, got a number (25)"),
    "steps as a list": (_set("steps", []), "steps: expected an object, got a list"),
    # statuses and verdicts
    "unknown step status": (_set("steps/baseline/status", "finished"),
                            "steps.baseline.status: 'finished' is not one of passed, failed, skipped, hang, timeout, "
                            "error, pending, running, interrupted"),
    "unknown run status": (_set("steps/bucket_sweep/runs/0/status", "ok"),
                           "steps.bucket_sweep.runs[0].status: 'ok' is not one of passed"),
    "unknown criterion status": (_set("acceptance/0/status", "passed"),
                                 "acceptance[0].status: 'passed' is not one of pass, fail, warn, error, skipped"),
    "unknown severity": (_set("acceptance/0/severity", "warning"),
                         "acceptance[0].severity: 'warning' is not one of fail, warn"),
    "unknown verdict": (_set("verdict", "MAYBE"), "verdict: 'MAYBE' is not one of GO, NO-GO, INCOMPLETE"),
    # NaN and infinity, in a typed key and deep inside an open dict
    "NaN in metrics": (_set("steps/baseline/metrics/toks_per_s/mean", math.nan),
                       "steps.baseline.metrics.toks_per_s.mean: nan is not a JSON number (results.json holds finite "
                       "numbers only)"),
    "infinity as a duration": (_set("steps/baseline/duration_s", math.inf),
                               "steps.baseline.duration_s: inf is not a JSON number"),
    "NaN under a dotted key": (_set("steps/bucket_sweep/runs/0/params/env.NSA_DDP_BUCKET_MB", math.nan),
                               "steps.bucket_sweep.runs[0].params['env.NSA_DDP_BUCKET_MB']: nan is not a JSON "
                               "number"),
    "NaN in a step kind's own key": (_set("steps/baseline/extra", {"x": [1.0, -math.inf]}),
                                     "steps.baseline.extra.x[1]: -inf is not a JSON number"),
    "not JSON at all": (_set("steps/baseline/metrics/when", {1, 2}),
                        "steps.baseline.metrics.when: a set ({1, 2}), not a JSON value"),
}


@pytest.fixture
def example() -> dict:
    return json.loads(EXAMPLE.read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_record_is_refused_naming_the_file_and_the_key_path(case, example):
    change, expected = MALFORMED[case]
    change(example)
    with pytest.raises(ResultsError) as info:
        check_results(example, "run/results.json")
    message = str(info.value)
    assert message.startswith(f"run/results.json: {expected}"), message
    assert "\n" not in message


@pytest.mark.parametrize("version", [2, 0, "1", None, True])
def test_another_schema_version_is_refused(version, example):
    example["schema_version"] = version
    with pytest.raises(ResultsError, match=re.escape(f"r.json: schema_version {version!r}, this nsa-validate reads 1")):
        check_results(example, "r.json")


def test_a_missing_schema_version_and_a_non_object_are_refused(example):
    del example["schema_version"]
    with pytest.raises(ResultsError, match=r"^r.json: schema_version None, this nsa-validate reads 1$"):
        check_results(example, "r.json")
    with pytest.raises(ResultsError, match=r"^r.json: not a results record: expected a JSON object, got a list$"):
        check_results([], "r.json")


def test_optional_keys_may_be_absent_and_a_kinds_own_keys_are_kept(example):
    """interrupted_by (files written before it was recorded, like the fixture), resumes, performance_analysis,
    a step's decision/choice/order and a run's source are optional; keys beyond the schema pass when JSON."""
    assert "interrupted_by" not in example and "resumes" not in example
    example["steps"]["baseline"]["my_kind_key"] = {"nested": [1, 2.5, None, "x"]}
    example["my_top_key"] = True
    assert check_results(example, "r.json")["steps"]["baseline"]["my_kind_key"]["nested"][1] == 2.5


def test_what_json_dumps_accepts_in_memory_passes(example):
    """A record in memory may hold what json.dumps writes as JSON: tuples (lists) and integer keys (strings)."""
    example["steps"]["baseline"]["command"] = ("torchrun", "-m", "nsa.training")
    example["steps"]["baseline"]["metrics"]["by_world_size"] = {1: 2.0, 2: (3.5, None)}
    check_results(example, "r.json")
    example["steps"]["baseline"]["metrics"]["by_world_size"] = {(1, 2): 2.0}
    with pytest.raises(ResultsError, match=re.escape("steps.baseline.metrics.by_world_size[(1, 2)]: key (1, 2) "
                                                     "cannot be a JSON object's key")):
        check_results(example, "r.json")


def test_a_resumed_run_and_a_running_step_hold(example):
    example["steps"]["baseline"]["status"] = "running"
    example["resumes"] = [{"at": "T2", "previous_end": None, "previous_state": "interrupted by SIGINT",
                           "steps": ["baseline"], "rerun": ["baseline"], "runbook_changed": False,
                           "replaced": {"baseline": {"status": "failed", "reason": "x", "started": "T0",
                                                     "duration_s": 3.0}}}]
    check_results(example, "r.json")
    example["resumes"][0]["replaced"]["baseline"]["status"] = "gone"
    with pytest.raises(ResultsError, match=re.escape("resumes[0].replaced.baseline.status: expected one of passed")):
        check_results(example, "r.json")


def test_read_results_refuses_a_file_with_nan_naming_it_and_the_key(tmp_path, example):
    text = json.dumps(example, indent=2).replace('"mean": 5843.2', '"mean": NaN')
    assert "NaN" in text
    (tmp_path / RESULTS_JSON).write_text(text)
    with pytest.raises(ResultsError) as info:
        read_results(tmp_path)
    assert str(info.value) == (f"{tmp_path / RESULTS_JSON}: steps.baseline.metrics.toks_per_s.mean: nan is not a "
                               "JSON number (results.json holds finite numbers only)")


@pytest.mark.parametrize("command", ["report", "compare"])
def test_the_cli_refuses_a_malformed_results_json_in_one_line(command, tmp_path, example):
    example["steps"]["baseline"]["status"] = "finished"
    (tmp_path / RESULTS_JSON).write_text(json.dumps(example))
    args = [command, str(tmp_path)] + ([str(REPO / "reports/examples/cpu_smoke")] if command == "compare" else [])
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (f"nsa-validate: error: {tmp_path / RESULTS_JSON}: steps.baseline.status: "
                                     "'finished' is not one of passed, failed, skipped, hang, timeout, error, "
                                     "pending, running, interrupted")


def test_write_results_refuses_a_malformed_record_and_keeps_the_previous_file(tmp_path, example):
    write_results(tmp_path, example)
    before = (tmp_path / RESULTS_JSON).read_bytes()
    broken = copy.deepcopy(example)
    broken["steps"]["baseline"]["status"] = "done"
    with pytest.raises(ResultsError) as info:
        write_results(tmp_path, broken)
    assert str(info.value) == (f"{tmp_path / RESULTS_JSON}: steps.baseline.status: 'done' is not one of passed, "
                               "failed, skipped, hang, timeout, error, pending, running, interrupted; not written "
                               "(the previous results.json, if any, is unchanged)")
    assert (tmp_path / RESULTS_JSON).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [RESULTS_JSON]  # no temp file left
    broken = copy.deepcopy(example)
    broken["steps"]["baseline"]["metrics"]["loss"] = math.nan
    with pytest.raises(ResultsError, match=r"steps\.baseline\.metrics\.loss: nan is not a JSON number"):
        write_results(tmp_path, broken)
    assert (tmp_path / RESULTS_JSON).read_bytes() == before


def test_a_synthetic_record_of_the_tests_holds():
    """tests/validation/results_records.py completes a record the way the runner writes one."""
    record = run_record({"steps": {"s": {"kind": "sweep", "runs": [{"label": "a"}]}}, "runbook": {"name": "x"}})
    check_results(record, "synthetic")


# ---------------------------------------------------------------------------------------------------------------
# the docstring's schema and the TypedDicts cannot drift apart

_HEADER = re.compile(r"^([A-Z][A-Za-z]+): ")
_FIELD = re.compile(r"^    ([a-z_][a-z0-9_]*)(\?)?\s{2,}(\S.*?)(?:\s{2,}\S.*)?$")


def documented_schema() -> dict[str, dict[str, tuple[bool, str]]]:
    """{record: {key: (optional, type text)}} as the module docstring of validation.results.model writes them."""
    schema: dict[str, dict[str, tuple[bool, str]]] = {}
    current = None
    for line in (results_model.__doc__ or "").splitlines():
        header = _HEADER.match(line)
        if header:
            current = header.group(1)
            continue
        field = _FIELD.match(line)
        if field and current is not None:
            key, optional, type_text = field.groups()
            assert key not in schema.setdefault(current, {}), f"{current}.{key} documented twice"
            schema[current][key] = (optional == "?", type_text)
    return schema


def typed_schema(record: type) -> dict[str, tuple[bool, str]]:
    """{key: (optional, annotation text)} of a TypedDict."""
    return {key: (key in record.__optional_keys__, getattr(hint, "__forward_arg__", hint))
            for key, hint in record.__annotations__.items()}


def test_the_docstring_documents_every_record():
    documented = documented_schema()
    assert {"RunResults", "StepResult", "Criterion", "LaunchRun"} <= set(documented)
    assert set(documented) == {r.__name__ for r in RECORDS}


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_the_docstring_and_the_typeddict_have_the_same_keys_and_types(record):
    """Every key the docstring documents (run, step, run entry, criterion, ... level) is a key of the TypedDict,
    with the same type and the same "may be absent" mark, and the other way round."""
    documented = documented_schema()[record.__name__]
    typed = typed_schema(record)
    assert set(documented) - set(typed) == set(), f"documented in the docstring only ({record.__name__})"
    assert set(typed) - set(documented) == set(), f"in the TypedDict only ({record.__name__})"
    assert documented == typed


def test_results_json_is_written_with_its_keys_in_the_documented_order_whatever_order_they_were_added(tmp_path):
    """RUN_KEY_ORDER is the docstring's order, and write_results writes the top-level keys in it: the evidence, added
    once the verdict is computed, comes before plots, which the first save already holds (a run wrote it after)."""
    assert list(results_model.RUN_KEY_ORDER) == list(documented_schema()["RunResults"])
    data = json.loads((REPO / "reports/examples/cpu_smoke/results.json").read_text())
    evidence, plots = data.pop("evidence"), data.pop("plots")
    scrambled = {"plots": plots, **data, "evidence": evidence}
    write_results(tmp_path, scrambled)
    written = list(json.loads((tmp_path / "results.json").read_text()))
    assert written == [k for k in results_model.RUN_KEY_ORDER if k in written] and written.index("evidence") < written.index("plots")


def test_a_step_records_keys_are_written_in_the_documented_order_whatever_order_they_were_added(tmp_path):
    """STEP_KEY_ORDER is the docstring's order of a step record, and write_results writes every step's keys in it: a
    step's definition, there from the start, comes after its interference, added once it has run (a run wrote them
    the other way round)."""
    assert list(results_model.STEP_KEY_ORDER) == list(documented_schema()["StepResult"])
    data = json.loads((REPO / "reports/examples/cpu_smoke/results.json").read_text())
    for name, step in data["steps"].items():
        data["steps"][name] = dict(reversed(list(step.items())))  # every key out of place
    write_results(tmp_path, data)
    for name, step in json.loads((tmp_path / "results.json").read_text())["steps"].items():
        assert list(step) == [k for k in results_model.STEP_KEY_ORDER if k in step], name


def test_a_written_run_has_the_keys_in_the_documented_order():
    """The runner writes the keys in the docstring's order: the examples' keys come in that order (the optional
    ones left out where absent)."""
    data = json.loads((REPO / "reports/examples/cpu_smoke/results.json").read_text())
    documented = documented_schema()
    assert [k for k in documented["RunResults"] if k in data] == list(data)
    step = data["steps"]["baseline"]
    assert [k for k in documented["StepResult"] if k in step] == list(step)
    assert [k for k in documented["Criterion"]] == list(data["acceptance"][0])


# ---------------------------------------------------------------------------------------------------------------
# each status list is defined once

def test_statuses_are_defined_once():
    assert results.STEP_STATUSES is results_model.STEP_STATUSES
    assert results.FINAL_STEP_STATUSES is results_model.FINAL_STEP_STATUSES
    assert results.FAILED_STEP_STATUSES is results_model.FAILED_STEP_STATUSES
    assert results.VERDICTS is results_model.VERDICTS and results.CRITERION_STATUSES is results_model.CRITERION_STATUSES
    assert formatting.FAILED_STATUSES is results_model.FAILED_STEP_STATUSES
    assert runbook.SEVERITIES is results_model.SEVERITIES
    assert set(results_model.FINAL_STEP_STATUSES) < set(results_model.STEP_STATUSES)
    assert set(results_model.FAILED_STEP_STATUSES) < set(results_model.FINAL_STEP_STATUSES)
    # the report words every status the schema allows
    assert set(formatting.STATUS_LABELS) == set(results_model.STEP_STATUSES)
    assert set(formatting.CRITERION_LABELS) == set(results_model.CRITERION_STATUSES)
    assert set(formatting.VERDICT_LABELS) == set(results_model.VERDICTS)
