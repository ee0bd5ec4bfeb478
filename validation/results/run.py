"""A whole validation run (RUN_DIR/results.json) as typed records, read with validation.results.codec:

    run = read_run(results)                      once, leniently: a damaged results.json still renders
    run.verdict, run.runbook.path, run.environment.gpus[0].name, run.steps["baseline"].status,
    run.acceptance[0].status, run.recommendations.env, run.plots[0].caption, run.evidence.disturbed, ...

The keys and what they mean are validation.results.model's module docstring (its TypedDicts are the schema the
writers are checked against; these records name the same keys). A step's `metrics` stay the JSON dict: each step kind
decodes its own (validation.kinds.<kind>.Result); a step's runs are validation.results.trainer_launch.LaunchRun,
its decision and choice validation.results.decision's records. The records are wide where the report is: a value
the report shows as text (a criterion's name, a note) keeps whatever JSON it holds.

Every committed results.json decodes strictly into Run and encodes back to the same JSON (key order aside;
tests/validation/test_run_records.py): a key a writer adds only when it applies is an absent() field, and keys
not declared here are kept in `extra`.

This is a foundation module: the report, the comparison of runs and the run's execution read it alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from validation.results.codec import absent, decode, keyed
from validation.results.decision import Choice, DecisionRecord
from validation.results.trainer_launch import LaunchRun

Num = int | float  # a figure as its writer gave it (an int stays an int: the JSON is written back unchanged)


@dataclasses.dataclass(frozen=True)
class Tool:
    """The program that wrote the file."""
    name: str | None = None
    version: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RunbookRef:
    """The runbook the run ran; `compare` its declared noise ({"run_sd", "launch_sd", "pairs"})."""
    name: str | None = None
    description: str | None = None
    path: str | None = None
    sha256: str | None = None
    compare: dict[str, Any] | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Gpu:
    """One GPU of the machine (validation.launch.environment.probe)."""
    index: int | None = None
    name: str | None = None
    memory_gb: Num | None = None
    capability: Any = None  # [major, minor] (a string in some records)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Node:
    """A node a training step ran on (its trainers' env.json): host, GPU names, the node's NCCL_/UCX_/... variables."""
    host: str | None = None
    gpus: list[Any] = dataclasses.field(default_factory=list)
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Environment:
    """The machine and software the run ran on (validation.launch.environment.probe); `gpus` is None where the
    record has no such key (an older or hand-made record), [] on a machine without a GPU."""
    git_sha: str | None = None
    git_branch: str | None = None
    git_dirty: bool | None = None
    git_changes: int | None = None
    host: str | None = None
    platform: str | None = None
    python: str | None = None
    torch: str | None = None
    cuda: str | None = None
    nccl: str | None = None
    gpus: list[Gpu] | None = absent()
    gpu_count: int | None = None
    cpu_count: int | None = None
    packages: dict[str, Any] = dataclasses.field(default_factory=dict)
    source_digest: str | None = absent()  # validation.version.source_digest: what `run --reuse` matches against
    nodes: dict[str, Node] = absent({})
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """The command line's selection: --only, --skip and --set (a {key: value} mapping in some records)."""
    only: list[Any] = dataclasses.field(default_factory=list)
    skip: list[Any] = dataclasses.field(default_factory=list)
    set: list[Any] | dict[str, Any] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PhaseRecord:
    """A phase of the runbook: its step names in order."""
    name: str | None = None
    title: str | None = None
    description: str | None = None
    steps: list[Any] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ReplacedStep:
    """What a step held before --rerun ran it again."""
    status: str | None = None
    reason: str | None = None
    started: str | None = None
    duration_s: Num | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class SourceRef:
    """The source one attempt of a run ran: its git commit, whether the tree had uncommitted changes, its digest."""
    git_sha: str | None = None
    git_dirty: bool | None = None
    source_digest: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def text(self) -> str:
        """"git abc123 dirty, digest 0f1e2d": what is known of it ("not recorded" for what is not)."""
        sha = str(self.git_sha)[:12] if self.git_sha else "not recorded"
        digest = str(self.source_digest)[:12] if self.source_digest else "not recorded"
        return f"git {sha}{' dirty' if self.git_dirty else ''}, digest {digest}"


@dataclasses.dataclass(frozen=True)
class SourceChange:
    """A resume's source against the earlier attempt's (validation.execution.runner: when they differ)."""
    before: SourceRef = dataclasses.field(default_factory=SourceRef)
    now: SourceRef = dataclasses.field(default_factory=SourceRef)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Resume:
    """One --resume of the run."""
    at: str | None = None
    previous_end: str | None = None
    previous_state: str | None = None
    steps: list[str] = dataclasses.field(default_factory=list)
    rerun: list[str] = dataclasses.field(default_factory=list)
    replaced: dict[str, ReplacedStep] = dataclasses.field(default_factory=dict)
    runbook_changed: bool | None = None
    options: RunOptions | None = absent()  # this resume's own --only, --skip, --set
    kept_changed: dict[str, str] = absent({})  # steps kept whose definition differs from what would run now
    source_changed: SourceChange | None = absent()  # the sources of the two attempts, when they differ
    not_rerun: dict[str, str] = absent({})  # steps --rerun named that did not run again (why): earlier results kept
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class ReusedRecord:
    """A phase taken from an earlier run of the same source (run --reuse; validation.results.reuse.Reuse.entry):
    results.json's run-level `reused` entries and a reused step's `reused`. `source` is the JSON's "from" (a Python
    keyword): the earlier run's results.json; `differences` the environment its steps ran without that this runbook's
    defaults.env adds (written only when there is some)."""
    phase: str | None = None
    source: str | None = keyed("from")
    runbook: str | None = None
    finished: str | None = None
    device: str | None = None
    source_digest: str | None = None
    differences: list[str] | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Step:
    """One step's record: what every step holds (its frame: kind, status, reason, command, failure evidence), its
    kind's metrics as JSON (the kind decodes them), its runs, and what a deciding or measuring step adds. `status`
    is any string (a report shows an unknown one as it is)."""
    name: str | None = None
    phase: str | None = None
    kind: str | None = None
    title: str | None = None
    description: str | None = None
    status: str | None = None
    reason: str | None = None
    started: str | None = None
    duration_s: Num | None = None
    dir: str | None = None
    command: list[Any] | None = None
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics: dict[str, Any] = dataclasses.field(default_factory=dict)
    runs: list[LaunchRun] = dataclasses.field(default_factory=list)
    winner: Choice | None = None
    comparison: list[Any] = dataclasses.field(default_factory=list)  # the kind's (ab: its Comparison records)
    artifacts: list[Any] = dataclasses.field(default_factory=list)
    excerpt: str | None = None
    stack_dumps: list[Any] = dataclasses.field(default_factory=list)
    optional: bool | None = None
    decision: DecisionRecord | None = absent()
    choice: Choice | None = absent(beside="decision")
    order_seed: int | None = absent()
    order: list[str] | None = absent()
    notes: list[Any] | None = absent()
    interference: dict[str, Any] | None = absent()  # validation.analysis.interference.step_interference
    superseded: list[LaunchRun] | None = absent()
    reused: ReusedRecord | None = absent()  # taken from an earlier run (--reuse): ReusedRecord() where it is {}
    definition: dict[str, Any] | None = absent()  # validation.runbook.plan.step_definition: what the step runs
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Criterion:
    """One acceptance criterion's row; `status` and `severity` any string (a report shows an unknown one)."""
    name: Any = None
    expr: str | None = None
    target: Any = None
    severity: str | None = None
    description: str | None = None
    status: str | None = None
    actual: Any = None
    detail: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Recommendations:
    """The settings to export and the notes beside them."""
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    notes: list[Any] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Plot:
    """A plot the report shows (validation.report.plots): path relative to run_dir, the step whose section shows it,
    and the bar a bar chart marks."""
    title: str | None = None
    path: str | None = None
    step: str | None = None
    context: str | None = None
    caption: str | None = None
    marked: Any = absent()
    mark: str | None = absent(beside="marked")
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class DisturbedStep:
    """A measured step other work disturbed (validation.execution.evidence.assess): its launches that were."""
    step: str | None = None
    text: str | None = None
    launches: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Implausible:
    """A figure outside its physical range (validation.analysis.plausibility.implausible, or a kind's key figure)."""
    step: Any = None
    metric: Any = None
    value: Any = None
    range: Any = None
    reason: Any = None
    disturbed: bool | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """results.json's "evidence" (validation.execution.evidence.assess)."""
    disturbed: list[DisturbedStep] = dataclasses.field(default_factory=list)
    implausible: list[Implausible] = dataclasses.field(default_factory=list)
    measured: list[Any] = dataclasses.field(default_factory=list)
    rules: Any = None
    rerun: str | None = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AnalysisRow:
    """One row of a comparison of two runs (validation.report.compare.compare_runs' docstring): a tested row has
    significance.Comparison's keys too (rel, ci_low, ci_high, confidence, noise_floor, text, ...)."""
    step: Any = None
    metric: Any = None
    tested: Any = None
    mean_a: Any = None
    mean_b: Any = None
    rel_delta: Any = None
    rel: Any = absent()
    ci_low: Any = absent()
    ci_high: Any = absent()
    confidence: Any = absent()
    p_value: Any = None
    p_adjusted: Any = None
    noise_floor: Any = absent()
    significant: Any = None
    verdict: Any = None
    note: Any = None
    text: Any = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Noise:
    """A run-to-run variation (significance.RunNoise.as_dict)."""
    between: Any = None
    total: Any = None
    within: Any = None
    df: Any = None
    runs: Any = None
    groups: Any = None
    source: Any = None
    text: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class AgainstRun:
    """The earlier run a run was compared with."""
    run_dir: Any = None
    runbook: Any = None
    started: Any = None
    verdict: Any = None
    git_sha: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Family:
    """How the family-wise error of a comparison's tested rows was controlled (significance.adjust_family)."""
    correction: Any = None
    alpha: Any = None
    family_size: Any = None
    statement: Any = None
    significant: Any = None
    regressions: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class KeyFinding:
    """The largest significant change of a comparison with an earlier run, or "none: ..." (its `text`)."""
    text: Any = None
    step: Any = None
    metric: Any = None
    rel: Any = None
    verdict: Any = None
    row: Any = None
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class PerformanceAnalysis:
    """What validation.report.compare.compare_runs returns (two runs compared), and results.json's
    "performance_analysis" (compare.performance_analysis: this run against an earlier one), which adds `against` (the
    earlier run; a plain string, its directory, in some records) and `key_finding`."""
    against: AgainstRun | str | None = absent()
    run_a: Any = None
    run_b: Any = None
    runbooks: Any = None
    verdicts: Any = None
    alpha: Any = None
    noise: Any = None
    noise_source: Any = None
    run_noise: Any = None  # {step: RunNoise.as_dict()} (one RunNoise.as_dict() in older records)
    step_spread: Noise | None = absent()
    declared_noise: Any = absent()
    family: Family = dataclasses.field(default_factory=Family)
    rows: list[AnalysisRow] = dataclasses.field(default_factory=list)
    regressions: list[Any] = dataclasses.field(default_factory=list)
    improvements: Any = None
    exit_code: Any = None
    gate: Any = None
    warnings: list[Any] = dataclasses.field(default_factory=list)
    same_run: bool | None = absent()  # the two sides are one run directory (validation.report.compare.same_run_dirs)
    key_finding: KeyFinding | None = absent()
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Run:
    """RUN_DIR/results.json: everything a validation run found. `steps` by name in runbook order; a step whose record
    is not an object is None there (read_run)."""
    schema_version: int | None = None
    tool: Tool = dataclasses.field(default_factory=Tool)
    runbook: RunbookRef = dataclasses.field(default_factory=RunbookRef)
    run_dir: str | None = None
    started: str | None = None
    finished: str | None = None
    duration_s: Num | None = None
    verdict: str | None = None
    verdict_reason: str | None = None
    interrupted_by: str | None = None
    resumes: list[Resume] = absent([])
    environment: Environment = dataclasses.field(default_factory=Environment)
    options: RunOptions = dataclasses.field(default_factory=RunOptions)
    phases: list[PhaseRecord] = dataclasses.field(default_factory=list)
    steps: dict[str, Step | None] = dataclasses.field(default_factory=dict)
    acceptance: list[Criterion] = dataclasses.field(default_factory=list)
    recommendations: Recommendations = dataclasses.field(default_factory=Recommendations)
    performance_analysis: PerformanceAnalysis = absent(PerformanceAnalysis())  # PerformanceAnalysis() when absent
    evidence: Evidence = absent(Evidence())  # Evidence() when absent
    reused: list[ReusedRecord] | None = absent()  # one per phase taken from an earlier run (--reuse)
    plots: list[Plot] = dataclasses.field(default_factory=list)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def phases_in_order(self) -> list[tuple[PhaseRecord, list[str]]]:
        """(phase, [step names]) in runbook order, plus an "other" phase for the steps no phase lists."""
        listed: set[str] = set()
        out = []
        for phase in self.phases:
            names = [str(n) for n in phase.steps]
            listed.update(names)
            out.append((phase, names))
        others = sorted(n for n in self.steps if n not in listed)
        if others:
            out.append((PhaseRecord(name="other", title="Other steps"), others))
        return out

    def steps_in_order(self) -> list[tuple[str, Step | None]]:
        """(step name, its record, None when it has none) of every step in runbook order."""
        return [(name, self.steps.get(name)) for _, names in self.phases_in_order() for name in names]

    def overrides(self, steps=()) -> list[str]:
        """The --set options (KEY=VALUE) of the attempt that ran any of `steps` last (with none named: of the
        latest attempt): the first run's `options.set`, or the `options.set` of the last resume that set out to run
        one of them. A resume recorded before resumes recorded their options counts as the first run's; a step
        --rerun named that did not run again (its not_rerun) keeps the result of an earlier attempt, so that resume
        did not run it. What a suggested `nsa-validate run` command repeats, so that it runs what ran."""
        wanted = {str(s) for s in steps}
        chosen = self.options
        for resume in self.resumes:
            if not isinstance(resume, Resume):
                continue
            if not wanted or wanted & {str(s) for s in resume.steps if str(s) not in resume.not_rerun}:
                chosen = self.options if resume.options is None else resume.options
        values = chosen.set
        if isinstance(values, dict):  # some early records: {key: value}
            return [f"{k}={v}" for k, v in values.items()]
        return [str(v) for v in values or []]


def read_run(results: Any) -> Run:
    """A parsed results.json (or a record built in memory) as a Run, decoded leniently: a missing or malformed value
    takes its field's default, a step whose record is not an object is None. A Run is returned as it is."""
    if isinstance(results, Run):
        return results
    data = results if isinstance(results, dict) else {}
    raw_steps = data.get("steps")
    run = decode(Run, {**data, "steps": {}}, "results", lenient=True)
    steps = {str(name): decode(Step, step, f"results.steps.{name}", lenient=True) if isinstance(step, dict) else None
             for name, step in (raw_steps.items() if isinstance(raw_steps, dict) else ())}
    return dataclasses.replace(run, steps=steps)
