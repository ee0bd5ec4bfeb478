"""The records of RUN_DIR/results.json, everything a validation run found (the one input of every report), as
TypedDicts; `check_results` holds a parsed results.json to them.

results.json is plain UTF-8 JSON with no NaN or infinity anywhere, no integer beyond a float's range and no object
holding a key twice. Each record below is a TypedDict of this module (the schema is written once more here, key by
key, and tests/validation/test_results_model.py keeps the two equal).
A key marked `?` may be absent: it is written only when it applies, or the run was written before the key was
added; every other key is always there (null where its type says `| None`). A record may hold keys beyond those
listed (a step kind's own): they are kept and must be JSON values. `JSONValue` is any JSON value.

RunResults: the whole file
    schema_version      int                     SCHEMA_VERSION; a file of another version is refused
    tool                Tool
    runbook             RunbookRef
    run_dir             str                     the run directory as given, e.g. artifacts/validate/<runbook>-<time>
    started             str                     ISO time
    finished            str | None              ISO time; null until the verdict is computed
    duration_s          float | None            null until the verdict is computed
    verdict             Verdict                 INCOMPLETE: interrupted, steps still pending, or a required
                                                criterion not evaluated (its step did not run); CLI exit 0/1/3
    verdict_reason      str                     one sentence
    interrupted_by?     str | None              the signal that ended the run: "SIGINT", "SIGTERM", "SIGHUP",
                                                "Ctrl-C"; null when none did
    resumes?            list[Resume]            absent until the run is continued with --resume; one entry each time
    environment         dict[str, JSONValue]    validation.launch.environment.probe: git_sha, host, python, torch, cuda,
                                                nccl, gpus [{index, name, memory_gb, capability}], gpu_count,
                                                cpu_count, packages {name: version}, ...
    options             Options
    phases              list[PhaseRecord]
    steps               dict[str, StepResult]   by step name, in runbook order
    acceptance          list[Criterion]         in runbook order; empty until the verdict is computed
    recommendations     Recommendations
    performance_analysis?  dict[str, JSONValue]  with run/report --against: validation.report.compare.performance_analysis
    evidence?           dict[str, JSONValue]    validation.execution.evidence.assess, once the verdict is computed: disturbed
                                                steps, figures outside their physical range, the measured steps,
                                                the interference thresholds, the command that runs them again
    reused?             list[dict[str, JSONValue]]  phases taken from an earlier run of the same source (run
                                                --reuse; validation.results.reuse; read as run.ReusedRecord):
                                                phase, from, runbook, finished, device, source_digest, and
                                                differences? (what its steps ran without that they have here)
    plots               list[Plot]

Tool: the program that wrote the file
    name                str                     "nsa-validate"
    version             str

RunbookRef: the runbook the run ran
    name                str
    description         str
    path                str
    sha256              str                     of the runbook file (a resume says whether it changed)
    compare?            dict[str, float] | None  its `compare` noise ({"run_sd", "launch_sd", "pairs"}); absent in runs
                                                 made before the key existed

Options: the command line's selection
    only                list[str]               --only phases
    skip                list[str]               --skip phases
    set                 list[str]               --set key=value overrides

PhaseRecord: a phase of the runbook
    name                str
    title               str
    description         str
    steps               list[str]               its step names in order

Resume: one --resume of the run
    at                  str                     ISO time of the resume
    previous_end        str | None              when the earlier attempt ended: its "finished", or the last write
                                                of results.json when it was killed
    previous_state      str                     "interrupted by SIGINT" | "finished (GO)" | "stopped without
                                                finishing (...)"
    steps               list[str]               the steps this attempt set out to run
    rerun               list[str]               those of them run again by --rerun
    replaced            dict[str, ReplacedStep]  by step name: what a step run again by --rerun held before
    runbook_changed     bool                    the runbook's sha256 differs from the run's
    options?            Options                 this resume's own --only, --skip and --set (a resume does not
                                                take the run's --set again: what it ran with is this); absent in
                                                resumes recorded before the key existed
    kept_changed?       dict[str, str]          by step name: a step the resume kept whose recorded definition is
                                                not what the runbook and this resume's --set would run now, and
                                                the first difference (its result was measured under other
                                                settings; --rerun STEP measures it again)
    source_changed?     dict[str, JSONValue]    the earlier attempt ran another source: {"before", "now"}, each
                                                {git_sha, git_dirty, source_digest} (environment holds the latest)
    not_rerun?          dict[str, str]          by step name: a step --rerun named that did not run again after all
                                                (a step before it stopped the run, its winner was missing, this
                                                machine lacks what it needs), and why; its earlier result is kept

ReplacedStep: what a step held before --rerun ran it again
    status              StepStatus | None
    reason              str | None
    started             str | None
    duration_s          float | None

StepResult: one step (its kind, a registered step kind of validation.kinds, documents its metrics, runs, winner
and comparison in validation/kinds/<kind>.py and declares its metric names in `metrics = (...)`)
    name                str
    phase               str
    kind                str
    title               str
    description         str
    status              StepStatus
    reason              str | None              one sentence; null when it passed without remark
    started             str | None              ISO time; null until it starts
    duration_s          float | None
    dir                 str                     the step's directory, relative to run_dir
    command             list[str] | None        argv of its (last) launch
    env                 dict[str, str]          the NSA_/NCCL_/TORCH_/CONFIG variables set for it
    metrics             dict[str, JSONValue]    kind-specific
    runs                list[LaunchRun]         a multi-launch step (sweep, ab, scan, ...): one entry per launch
    winner              Choice | None           the choice when it rests on a significant difference, else null
    comparison          list[dict[str, JSONValue]]  a step that compares (ab): validation.analysis.significance.Comparison
                                                (baseline, variant, metric, method, mean_a, mean_b, rel, ci_low,
                                                ci_high, p_value, noise_floor, significant, verdict, ...)
    artifacts           list[str]               paths relative to run_dir
    excerpt             str | None              the failing rank's traceback excerpt
    stack_dumps         list[str]               paths relative to run_dir
    optional            bool                    the runbook's `optional`: its failure does not make the run NO-GO
    decision?           dict[str, JSONValue]    a step that decides (sweep, ab with recommend): the decision of
                                                validation.analysis.significance.decide (winner, choice, significant,
                                                comparison with CI and p, noise_floor, recommended_repeats,
                                                reason, ...) plus order_seed and order
    choice?             Choice | None           what ${step.winner.env.X} resolves to: the winner, or the point kept
    order_seed?         int                     the seed of the random run order (steps that interleave repeats)
    order?              list[str]               the run labels in the order they ran
    notes?              list[str]               remarks on the runs (e.g. a setting the trainer ignored)
    interference?       dict[str, JSONValue] | None  what else used the machine while it measured
                                                (validation.execution.evidence.step_interference: disturbed, launches, text)
    superseded?         list[dict[str, JSONValue]]  runs of a repeat other work disturbed, run again (ab, sweep,
                                                triage; the runbook's retry_disturbed): each LaunchRun's keys plus
                                                superseded_by, the directory of the run that replaced it
    reused?             dict[str, JSONValue]    taken from an earlier run of the same source (run --reuse): the
                                                run-level record of its phase; nothing of the step ran here
    definition?         dict[str, JSONValue]    what the step runs as the runbook and --set of the attempt that
                                                recorded it resolve it (validation.runbook.plan.step_definition:
                                                kind, requires, optional, on_failure, every launch's label, argv,
                                                env, limits, ...); a reused step keeps this run's own. Absent in
                                                runs recorded before the key existed

LaunchRun: one launch of a multi-launch step
    label               str
    params              dict[str, JSONValue]    e.g. {"env.NSA_DDP_BUCKET_MB": "25"}
    status              StepStatus
    reason              str | None
    dir                 str                     relative to run_dir
    command             list[str] | None
    metrics             dict[str, JSONValue]
    repeat              int
    source?             str                     what planned it (a scan's "bisect" point)

Choice: the run a decision chose (also a step's winner; a winner written before decisions has only the first three)
    label               str
    params              dict[str, JSONValue]
    explanation         str
    significant?        bool
    kept_default?       bool

Criterion: one acceptance criterion's row
    name                str
    expr                str
    target              str
    severity            Severity
    description         str
    status              CriterionStatus
    actual              str                     the values behind the verdict, e.g. "baseline.toks_per_s.mean = 847.2"
    detail              str | None              why it is an error or was not evaluated

Recommendations: the settings to export
    env                 dict[str, str]          significant decisions and the runbook's recommend.env only
    notes               list[str]               sentences

Plot: a plot the report shows (validation.report.plots)
    title               str
    path                str                     relative to run_dir
    step?               str | None              the step whose section shows it
    context?            str | None              what it measured (seq_len, micro-batch, precision, world size)
    caption?            str
    marked?             JSONValue               the run label of the bar a bar chart marks
    mark?               str                     that mark's word

Statuses: StepStatus is one of STEP_STATUSES (a step is "running" only while it runs), CriterionStatus one of
CRITERION_STATUSES, Severity one of SEVERITIES, Verdict one of VERDICTS.

Writes (validation.results.store.write_results) check the record first and are atomic; reads
(validation.results.store.read_results) check it too: a malformed file is refused with a ResultsError naming the file,
the key path (e.g. `steps.baseline.status`) and what is wrong.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from typing import Any, Literal, TypedDict, Union, get_args, get_origin

SCHEMA_VERSION = 1

StepStatus = Literal["passed", "failed", "skipped", "hang", "timeout", "error", "pending", "running", "interrupted"]
STEP_STATUSES: tuple[str, ...] = get_args(StepStatus)
FINAL_STEP_STATUSES = ("passed", "failed", "skipped", "hang", "timeout", "error")
FAILED_STEP_STATUSES = ("failed", "hang", "timeout", "error")  # a step that ran and did not pass
Verdict = Literal["GO", "NO-GO", "INCOMPLETE"]
VERDICTS: tuple[str, ...] = get_args(Verdict)
CriterionStatus = Literal["pass", "fail", "warn", "error", "skipped", "inconclusive"]
CRITERION_STATUSES: tuple[str, ...] = get_args(CriterionStatus)
Severity = Literal["fail", "warn"]
SEVERITIES: tuple[str, ...] = get_args(Severity)

JSONValue = Any  # None, bool, int, a finite float, str, or a list or dict (str keys) of JSON values


class ResultsError(ValueError):
    """results.json is missing, unreadable, of another schema version or malformed; the message names the file
    (and the key path)."""


# ---------------------------------------------------------------------------------------------------------------
# the records (each documented key by key in the module docstring)

class Tool(TypedDict):
    name: str
    version: str


class _RunbookRefKeys(TypedDict):
    name: str
    description: str
    path: str
    sha256: str


class RunbookRef(_RunbookRefKeys, total=False):
    compare: dict[str, float] | None  # the runbook's declared noise; absent where it declares none (and in runs
    # made before the key existed; runs of 2026-11-28 to 11-30 wrote null there)


class Options(TypedDict):
    only: list[str]
    skip: list[str]
    set: list[str]


class PhaseRecord(TypedDict):
    name: str
    title: str
    description: str
    steps: list[str]


class ReplacedStep(TypedDict):
    status: StepStatus | None
    reason: str | None
    started: str | None
    duration_s: float | None


class _ResumeKeys(TypedDict):
    at: str
    previous_end: str | None
    previous_state: str
    steps: list[str]
    rerun: list[str]
    replaced: dict[str, ReplacedStep]
    runbook_changed: bool


class Resume(_ResumeKeys, total=False):
    options: Options  # absent in resumes recorded before the key existed
    kept_changed: dict[str, str]  # steps kept whose definition differs from what would run now
    source_changed: dict[str, JSONValue]  # the earlier attempt's source and this one's, when they differ
    not_rerun: dict[str, str]  # steps --rerun named that did not run again (why): their earlier results kept


class _ChoiceKeys(TypedDict):
    label: str
    params: dict[str, JSONValue]
    explanation: str


class Choice(_ChoiceKeys, total=False):
    significant: bool
    kept_default: bool


class _LaunchRunKeys(TypedDict):
    label: str
    params: dict[str, JSONValue]
    status: StepStatus
    reason: str | None
    dir: str
    command: list[str] | None
    metrics: dict[str, JSONValue]
    repeat: int


class LaunchRun(_LaunchRunKeys, total=False):
    source: str


class _StepKeys(TypedDict):
    name: str
    phase: str
    kind: str
    title: str
    description: str
    status: StepStatus
    reason: str | None
    started: str | None
    duration_s: float | None
    dir: str
    command: list[str] | None
    env: dict[str, str]
    metrics: dict[str, JSONValue]
    runs: list[LaunchRun]
    winner: Choice | None
    comparison: list[dict[str, JSONValue]]
    artifacts: list[str]
    excerpt: str | None
    stack_dumps: list[str]
    optional: bool


class StepResult(_StepKeys, total=False):
    decision: dict[str, JSONValue]
    choice: Choice | None
    order_seed: int
    order: list[str]
    notes: list[str]
    interference: dict[str, JSONValue] | None
    superseded: list[dict[str, JSONValue]]
    reused: dict[str, JSONValue]  # taken from an earlier run of the same source (validation.results.reuse)
    definition: dict[str, JSONValue]  # what the step runs (validation.runbook.plan.step_definition)


class Criterion(TypedDict):
    name: str
    expr: str
    target: str
    severity: Severity
    description: str
    status: CriterionStatus
    actual: str
    detail: str | None


class Recommendations(TypedDict):
    env: dict[str, str]
    notes: list[str]


class _PlotKeys(TypedDict):
    title: str
    path: str


class Plot(_PlotKeys, total=False):
    step: str | None
    context: str | None
    caption: str
    marked: JSONValue
    mark: str


class _RunKeys(TypedDict):
    schema_version: int
    tool: Tool
    runbook: RunbookRef
    run_dir: str
    started: str
    finished: str | None
    duration_s: float | None
    verdict: Verdict
    verdict_reason: str
    environment: dict[str, JSONValue]
    options: Options
    phases: list[PhaseRecord]
    steps: dict[str, StepResult]
    acceptance: list[Criterion]
    recommendations: Recommendations
    plots: list[Plot]


class RunResults(_RunKeys, total=False):
    interrupted_by: str | None
    resumes: list[Resume]
    performance_analysis: dict[str, JSONValue]
    evidence: dict[str, JSONValue]
    reused: list[dict[str, JSONValue]]  # the phases taken from earlier runs (validation.results.reuse.Reuse.record)


# results.json's top-level keys in the order the docstring lists them: write_results writes them so, whenever a key
# was added (evidence, performance_analysis and reused come after plots, which the first save already holds)
RUN_KEY_ORDER: tuple[str, ...] = ("schema_version", "tool", "runbook", "run_dir", "started", "finished", "duration_s",
                                  "verdict", "verdict_reason", "interrupted_by", "resumes", "environment", "options",
                                  "phases", "steps", "acceptance", "recommendations", "performance_analysis",
                                  "evidence", "reused", "plots")

# a step record's keys in the order the docstring lists them (StepResult's, its required keys first): write_results
# writes them so, whatever order a step's keys were added in (its definition is there from the start, its
# interference once it has run)
STEP_KEY_ORDER: tuple[str, ...] = tuple(StepResult.__annotations__)

RECORDS: tuple[type, ...] = (RunResults, Tool, RunbookRef, Options, PhaseRecord, Resume, ReplacedStep, StepResult,
                             LaunchRun, Choice, Criterion, Recommendations, Plot)

# what a record is called in a message ("missing (required in a step record)")
_RECORD_WORDS = {"RunResults": "results.json", "Tool": "tool record", "RunbookRef": "runbook record",
                 "Options": "options record", "PhaseRecord": "phase record", "Resume": "resume record",
                 "ReplacedStep": "replaced-step record", "StepResult": "step record", "LaunchRun": "run record",
                 "Choice": "choice record", "Criterion": "criterion record",
                 "Recommendations": "recommendations record", "Plot": "plot record"}


# ---------------------------------------------------------------------------------------------------------------
# the check

class _Malformed(Exception):
    def __init__(self, path: str, what: str):
        super().__init__(f"{path or '(top level)'}: {what}")


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def _key_path(path: str, key: Any) -> str:
    """steps.baseline, or params["env.NSA_DDP_BUCKET_MB"] for a key that is not a plain name."""
    if isinstance(key, str) and _IDENTIFIER.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path}[{key!r}]" if path else repr(key)


def _show(value: Any) -> str:
    try:
        text = repr(value)
    except ValueError:  # an integer of more digits than repr writes (sys.get_int_max_str_digits)
        return f"an integer of {value.bit_length()} bits"
    return text if len(text) <= 60 else text[:57] + "..."


def _kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"a boolean ({value!r})"
    if isinstance(value, (int, float)):
        return f"a number ({_show(value)})"
    if isinstance(value, str):
        return f"a string ({_show(value)})"
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__} ({_show(value)}), not a JSON value"


_HINTS: dict[type, dict[str, Any]] = {}  # each record's resolved key types, filled on first use


def _describe(hint: Any) -> str:
    """The expected type in words: "a string or null", "one of pass, fail, ...", "a list"."""
    if hint is Any:
        return "a JSON value"
    if hint is type(None):
        return "null"
    if hint is str:
        return "a string"
    if hint is bool:
        return "a boolean"
    if hint is int:
        return "an integer"
    if hint is float:
        return "a number"
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(hint))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(hint))
    if origin is list:
        return "a list"
    if origin is dict or typing.is_typeddict(hint):
        return "an object"
    return str(hint)


def _check_key(key: Any, path: str) -> None:
    """A key json.dumps can write: a string, or an integer, a finite number, a boolean or null (written as a
    string)."""
    if isinstance(key, float) and not math.isfinite(key) or not (key is None or isinstance(key, (str, int, float))):
        raise _Malformed(_key_path(path, key), f"key {key!r} cannot be a JSON object's key")


def _check_keys(mapping: dict, path: str) -> None:
    """Every key of `mapping` one json.dumps can write (_check_key), and no two written as the same string (1 and
    "1", True and "true"): the file would hold that key twice, and read_results refuses such a file."""
    written: dict[str, Any] = {}
    for key in mapping:
        _check_key(key, path)
        text = key if isinstance(key, str) else json.dumps(key)
        if text in written:
            raise _Malformed(_key_path(path, key), f"keys {written[text]!r} and {key!r} are both written as "
                             f"{json.dumps(text)}: the object would hold that key twice")
        written[text] = key


def _finite_number(value: int | float) -> bool:
    """Whether a number is one results.json holds: a finite float, or an integer within a float's range (a figure
    is read as a float; a larger one would be infinite)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _not_finite(value: int | float) -> str:
    if isinstance(value, float):
        return f"{value!r} is not a JSON number (results.json holds finite numbers only)"
    return (f"an integer of {value.bit_length()} bits is beyond a float's range (results.json holds finite numbers "
            "only)")


def _check_json(value: Any, path: str) -> None:
    """`value` is a JSON value as json.dumps writes one (a tuple as a list), with finite numbers only."""
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, (int, float)):
        if not _finite_number(value):
            raise _Malformed(path, _not_finite(value))
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_json(item, f"{path}[{i}]")
        return
    if isinstance(value, dict):
        _check_keys(value, path)
        for key, item in value.items():
            _check_json(item, _key_path(path, key))
        return
    raise _Malformed(path, f"{_kind_of(value)}")


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` is of `hint` at its top level (a union's member is chosen by this)."""
    if hint is Any:
        return True
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    origin = get_origin(hint)
    if origin is Literal:
        return isinstance(value, str) and value in get_args(hint)
    if origin is list:
        return isinstance(value, (list, tuple))
    if origin is dict or typing.is_typeddict(hint):
        return isinstance(value, dict)
    raise TypeError(f"results_model: no check for the type {hint!r}")


def _check(value: Any, hint: Any, path: str) -> None:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        for member in get_args(hint):
            if _matches(value, member):
                _check(value, member, path)
                return
        raise _Malformed(path, f"expected {_describe(hint)}, got {_kind_of(value)}")
    if not _matches(value, hint):
        if get_origin(hint) is Literal and isinstance(value, str):
            raise _Malformed(path, f"{value!r} is not {_describe(hint)}")
        raise _Malformed(path, f"expected {_describe(hint)}, got {_kind_of(value)}")
    if hint is Any:
        _check_json(value, path)
    elif isinstance(value, (int, float)) and not isinstance(value, bool) and not _finite_number(value):
        raise _Malformed(path, _not_finite(value))
    elif origin is list:
        (item,) = get_args(hint)
        for i, element in enumerate(value):
            _check(element, item, f"{path}[{i}]")
    elif origin is dict:
        _, item = get_args(hint)
        _check_keys(value, path)
        for key, element in value.items():
            _check(element, item, _key_path(path, key))
    elif typing.is_typeddict(hint):
        _check_record(value, hint, path)


def _check_record(value: dict, record: type, path: str) -> None:
    hints = _HINTS.get(record)
    if hints is None:
        hints = _HINTS[record] = typing.get_type_hints(record)
    for key in record.__annotations__:
        if key in record.__required_keys__ and key not in value:
            raise _Malformed(_key_path(path, key), f"missing (required in a {_RECORD_WORDS[record.__name__]})"
                             if record is not RunResults else "missing (a required key of results.json)")
    _check_keys(value, path)
    for key, element in value.items():
        if key in hints:
            _check(element, hints[key], _key_path(path, key))
        else:  # a key beyond the schema (a step kind's own): any JSON value
            _check_json(element, _key_path(path, key))


def check_results(data: Any, source: str) -> RunResults:
    """`data` (a parsed results.json) as RunResults, once it holds to the schema (the module docstring): every
    required key there, every value of its type, statuses among the allowed ones, no NaN or infinity,
    schema_version == SCHEMA_VERSION. Raises ResultsError "SOURCE: KEY.PATH: what is wrong" (the first problem
    found); `source` names the file."""
    if not isinstance(data, dict):
        raise ResultsError(f"{source}: not a results record: expected a JSON object, got {_kind_of(data)}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise ResultsError(f"{source}: schema_version {version!r}, this nsa-validate reads {SCHEMA_VERSION}")
    try:
        _check_record(data, RunResults, "")
    except _Malformed as exc:
        raise ResultsError(f"{source}: {exc}") from None
    except RecursionError:
        raise ResultsError(f"{source}: a value nested deeper than can be checked") from None
    return typing.cast(RunResults, data)
