"""StepKind: everything one kind of runbook step does, in one class. A kind module defines a subclass and registers
an instance (validation.kinds.register); the runbook, the plan, the runner, the report, compare and the CLI ask the
registry for the kind of a step and call these hooks, so adding a kind touches its module only (docs/architecture.md,
"How to add a step kind").

What a kind defines:

    name, summary        the `kind:` value and one line for `nsa-validate kinds` (the README table)
    keys, launch_keys    its own runbook keys, and which launch settings (config, env, args, ...) it takes
    trainer              True when it launches the trainer: heartbeats, GPUs per rank, metrics per launch
    host_only            True when it needs none of the devices the runbook's `requirements` ask for (a
                         snapshot, a test suite whose CUDA tests skip themselves): only its own `requires` apply
    parse / check        schema: its own keys -> step.options (its Options dataclass); cross-step references once
                         every step is read
    input_files          the files its own keys name (test paths, a benchmark script): checked before a run
    launches             plan: the LaunchSpecs the step starts (argv, env, directories), in order
    skip_reason          a reason it cannot run here although the machine meets its requirements
    Result               its step record: a frozen dataclass subclass of validation.results.run.Step (status, reason,
                         runs, ...) whose `metrics` (and any key of its own) are typed fields; results.json's step
                         entry is its encoding (validation.results.codec), and every hook below reads it decoded
    run                  run(options, ctx) -> Result: run the launches (ctx.launches) through the runner's context and
                         return the step's record; the runner adds the step's frame (name, phase, timing) and what
                         every launch left (command, logs, excerpt, stack dumps)
    summary_line         what the console prints after the step
    trainer_launches     (label, metrics, status) of each trainer launch, for `nsa-validate compare`
    metrics              the metric names its steps produce (results.json "metrics"), as dotted patterns
                         (metric_names(step) when they depend on the step's own keys): what acceptance criteria
                         may read, checked before anything runs (check_metric_reference) and after a step ran
                         (undeclared_metrics: the runner notes what a step recorded beyond them)
    blocks               its part of the report's step section: paragraphs, lists and tables (validation.kinds.blocks),
                         which the report renders to Markdown and HTML alike
    view                 changes to the fields every step section shows (a command hidden where each run shows its
                         own, a reason already shown as problems)
    key_figures, plots   executive-summary figures (KeyFigure: an id, never matched by label) and extra plots
                         (key_figure_steps: the steps those figures use)
    comparisons          the with/without comparisons a passed step measured (Effect): the report's findings and
                         its Key finding
    repeatable           a passed step is a trainer run a user can repeat: the report's validated command
    performance, decides the metric names that measure speed (validation.execution.evidence: what interference can change),
                         and whether every step of the kind decides on speed (a sweep, an A/B, a triage)
    derived_from         the other steps whose measurements a figure of a step is computed from (train's scaling
                         efficiency: its scaling_baseline step): a disturbance of any of them makes it disturbed too

Hooks have defaults that do nothing, so a small kind needs `name`, `summary`, `launches`, `run` and `metrics`. The
report hooks (summary_line, trainer_launches, view, blocks, key_figures, comparisons, key_figure_steps, plots) get the
step as its kind's Result, decoded leniently (read): results may be damaged, and a report still renders.

Metric-name patterns: "toks_per_s.mean" is key "mean" of metric "toks_per_s"; a segment `<word>` stands for any one
key (a point's label, a collective, a strategy, a variant, a list index); a last segment `*` for anything below (a
record of free form, e.g. a benchmark's own JSON). A criterion may read a name or any part of one ("toks_per_s" as
a whole, "nodes" for len()). Besides its metrics, a criterion reads STEP_FIELDS of every step.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Mapping

from validation.formatting import as_dict, context_text, finite, fmt_num, params_text
from validation.kinds.blocks import Block
from validation.launch.slurm import SlurmOptions
from validation.launch.spec import PLAN_RUN_DIR, LaunchSpec, safe_name
from validation.results.codec import decode, given, written
from validation.results.decision import ComparisonRecord
from validation.results.run import Step as StepRecord
from validation.results.trainer_launch import LaunchMetrics, as_launch
from validation.results.store import inside_run_dir

if TYPE_CHECKING:
    from validation.runbook.model import Step
    from validation.runbook.schema import Ctx

# Keys every step takes, whatever its kind.
BASE_KEYS = ("name", "kind", "title", "description", "requires", "optional", "on_failure")
# Launch settings a step may take (and inherits from `defaults`); validation.runbook.loader parses them.
LAUNCH_KEYS = ("config", "env", "args", "nproc_per_node", "master_port", "port_retries", "timeout_s",
               "stall_timeout_s", "window", "warmup_steps", "launcher", "nnodes", "retry_disturbed")
# A step of a kind that decides from repeats (ab, sweep, triage) may also set `retry_disturbed` (how often a repeat
# other work disturbed runs again); `defaults` may set it for the whole runbook, any other step may not (it would
# be silently ignored there).
RETRY_KEY = "retry_disturbed"
DECIDING_LAUNCH_KEYS = LAUNCH_KEYS
# Launch settings of a step that runs one command and no trainer (a test suite, a benchmark).
COMMAND_LAUNCH_KEYS = ("env", "timeout_s", "launcher")
# What a criterion reads of every step besides its metrics (validation.execution.acceptance's namespace): "runs" maps each
# run's label to its metrics (a kind with runs declares "runs.<label>..." among its metrics), "comparison" each
# A/B variant to its statistics, "winner" a decision's chosen point.
STEP_FIELDS = ("status", "reason", "excerpt", "stack_dumps", "winner.*", "runs", "comparison.<variant>.*")


@dataclasses.dataclass(frozen=True)
class Settings:
    """Env variables and trainer args that a launch adds to its step's own: an A/B variant, a triage suspect, a
    parallelism strategy."""
    env: Mapping[str, str] = dataclasses.field(default_factory=dict)
    args: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def params(self) -> dict[str, Any]:
        """{"env.X": v, "args.y": w}: the run's params as results.json records them."""
        return {**{f"env.{k}": v for k, v in self.env.items()}, **{f"args.{k}": v for k, v in self.args.items()}}



@dataclasses.dataclass(frozen=True)
class KeyFigure:
    """A figure of the report's executive summary (StepKind.key_figures)."""
    id: str  # what it is, for code: e.g. "baseline_throughput"; the report never matches a label
    label: str  # what the reader sees
    value: str
    note: str
    order: int = 50  # its place among the figures of every kind (lower first)
    steps: tuple[str, ...] = ()  # the steps it comes from
    metric: str | None = None  # the metric name of `raw` (its physical range: validation.analysis.plausibility)
    raw: float | None = None
    problem: str | None = None  # why `raw` cannot be a result (outside its physical range)
    # it divides one rank's throughput of a multi-rank run by a single process's: where the ranks share a CPU's
    # cores that measures the sharing, and the report says so
    shared_cores: bool = False


@dataclasses.dataclass(frozen=True)
class Effect:
    """One with/without comparison a step measured (StepKind.comparisons): the report's findings and its Key
    finding. `ignored`: the trainer ignored the setting, so the comparison is an A/A check, never a finding."""
    without: str  # what the side without ran: settings or a label
    with_: str
    rel: float  # with / without - 1
    metric: str = "toks_per_s"
    mean_without: float | None = None
    mean_with: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    p: float | None = None  # Holm-adjusted when the step adjusted
    significant: bool = False
    verdict: str | None = None
    ignored: bool = False


def effect_of(comp: ComparisonRecord | Mapping[str, Any], without: str, with_: str, ignored: bool = False,
              rel_delta: Any = None) -> Effect | None:
    """An Effect from a recorded comparison (validation.results.decision.ComparisonRecord, significance.Comparison's
    record, or a mapping of its keys: rel, ci_low, ci_high, p_adjusted or p_value, mean_a, mean_b, ...); `rel_delta`
    stands for rel where the record has none (an A/B's comparisons written before rel was). None without a relative
    difference."""
    c = comp if isinstance(comp, ComparisonRecord) else decode(ComparisonRecord, comp, lenient=True)
    rel = finite(c.rel if c.rel is not None else rel_delta)
    if rel is None:
        return None
    p = finite(c.p_adjusted) if finite(c.p_adjusted) is not None else finite(c.p_value)
    return Effect(without, with_, rel, metric=str(c.metric or "toks_per_s"),
                  mean_without=finite(c.mean_a), mean_with=finite(c.mean_b),
                  ci_low=finite(c.ci_low), ci_high=finite(c.ci_high), p=p, significant=c.significant is True,
                  verdict=str(c.verdict) if c.verdict else None, ignored=ignored)


# A run's params that set how long it measures, not what it runs: an A/B variant that runs more steps (a faster one,
# so that its window lasts about as long) differs in them, yet they are no setting to adopt or recommend
LENGTH_PARAMS = {"args.steps": "steps"}


def run_side(step: StepRecord, label: Any) -> str:
    """What a run of a multi-run step (its record) ran, for a sentence: its params ("NSA_X=1 (fused)"), else its
    label; a run length among other params after the label ("NSA_X=1 (fused, 40 steps)": LENGTH_PARAMS)."""
    params = next((r.params for r in step.runs if r.label == label and r.params), None)
    points = (step.decision.points if step.decision is not None else None) or {}
    params = as_dict(params) or as_dict(points.get(label) if isinstance(label, str) else None)  # JSON keys are text
    settings = {k: v for k, v in params.items() if k not in LENGTH_PARAMS}
    lengths = [f"{fmt_num(v)} {LENGTH_PARAMS[k]}" for k, v in params.items() if k in LENGTH_PARAMS]
    if not settings:  # the run length is all that differs: it is the setting
        settings, lengths = params, []
    text = params_text(settings) if settings else None
    names = ([str(label)] if text and str(label) not in text else []) + lengths
    if text and names:
        return f"{text} ({', '.join(names)})"
    return text or str(label)


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """The Options of a kind without keys of its own (snapshot, longrun)."""


class StepKind:
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    keys: ClassVar[tuple[str, ...]] = ()
    launch_keys: ClassVar[tuple[str, ...]] = tuple(k for k in LAUNCH_KEYS if k != RETRY_KEY)
    trainer: ClassVar[bool] = False
    host_only: ClassVar[bool] = False  # True: the runbook's requirements do not apply, only the step's `requires`
    # True: a passed step is one trainer run that a user can repeat as it is: the report's validated command is built
    # from such a step (the one named *baseline*, else the first)
    repeatable: ClassVar[bool] = False
    # Its place in `nsa-validate kinds` and README's table of kinds (lower first; the order a validation goes); None:
    # after the kinds that have one, by package name.
    listing: ClassVar[int | None] = None
    plan_note: ClassVar[str | None] = None  # a line `nsa-validate plan` prints under the step (in-process work)
    # The metric names the kind's steps produce (patterns; see the module docstring). None: not declared, and then
    # criteria on its steps are checked only when they run (tests/validation/test_prerun_checks.py lists such kinds).
    metrics: ClassVar[tuple[str, ...] | None] = None
    # The metric-name patterns (a subset of `metrics`) that measure speed: what interference can change, so that a
    # criterion reading one of a disturbed step is inconclusive (validation.execution.evidence); correctness (a loss that
    # falls, tests that pass) is never among them and decides on a busy machine too.
    performance: ClassVar[tuple[str, ...]] = ()
    # True: every step of the kind decides on performance (a sweep, an A/B, a triage, a scan): its runs are measured
    # evidence whether or not a criterion reads them (validation.execution.evidence.measured_steps).
    decides: ClassVar[bool] = False
    # The kind's step record (see the module docstring): what run() returns and what the report hooks read.
    result_type: ClassVar[type[StepRecord]] = StepRecord

    def read(self, entry: Any) -> StepRecord:
        """A step's results.json entry as this kind's Result, decoded leniently (a damaged value takes its field's
        default); a record already decoded is returned as it is."""
        if isinstance(entry, StepRecord):
            return entry
        return decode(self.result_type, entry, f"steps.{as_dict(entry).get('name') or self.name}", lenient=True)

    def metric_names(self, step: Step | None) -> tuple[str, ...] | None:
        """The metric-name patterns of `step` (None: of any step of the kind), e.g. with the A/B's own variant
        names in place of <variant>; None when the kind declares none."""
        return self.metrics

    # ------------------------------------------------------------------ schema
    def allowed_keys(self) -> tuple[str, ...]:
        return BASE_KEYS + tuple(self.launch_keys) + tuple(self.keys)

    def parse(self, raw: dict[str, Any], path: tuple, ctx: Ctx) -> Any:
        """The kind's own keys of `raw` (already checked against allowed_keys), validated into the kind's Options (a
        frozen dataclass; read as step.<field>): step.options. Errors: ``raise ctx.error(path + (key,), "what was
        expected")``."""
        return NoOptions()

    def concurrency(self, step: Step) -> int:
        """How many of the step's launches run at a time (`plan` says so when more than one)."""
        return 1

    def check(self, step: Step, order: list[Step], error: Callable[[str], Exception]) -> None:
        """Cross-step checks once every step is read (`order`: all steps in run order); raise error(message)."""

    def input_files(self, step: Step) -> list[tuple[tuple, str]]:
        """(key path inside the step, file path) of every file the kind's own keys name, e.g. (("tests", 0),
        "tests/nsa/test_x.py"): `nsa-validate run` and `plan` check that each exists (relative to the working
        directory) before anything runs. A trainer config (`config`) is checked for every kind that takes it."""
        return []

    # ------------------------------------------------------------------ plan
    def launches(self, step: Step, winners: dict[str, dict[str, Any]] | None,
                 run_dir: Path | None) -> list[LaunchSpec]:
        """Every process the step starts, in order. winners None: plan mode (${x.winner...} left as text);
        run_dir None: paths as RUN_DIR/... (run_path)."""
        return []

    def skip_reason(self, step: Step) -> str | None:
        return None

    def winner_params(self, step: Step) -> tuple[str, ...] | None:
        """The parameters ("env.X", "args.y") a winner of this step can carry, which later steps may use as
        ${step.winner.env.X}; None: later steps cannot refer to its winner."""
        return None

    # ------------------------------------------------------------------ run
    def run(self, options: Any, ctx) -> StepRecord:
        """Run the step and return its Result (status, reason, metrics, runs, winner, ...). `options` is the step's
        Options (what parse returned); `ctx` is the runner's StepContext: step (the runbook's Step: name, launch
        settings), launches (the planned LaunchSpecs), launch(spec, index, total) and launch_all(specs, jobs,
        on_done), each launch's command, logs, excerpt and stack dumps recorded in the step's entry by the runner;
        save(partial) (write results.json now with a partial Result: a multi-launch step's runs so far), rel(path),
        winners() (the earlier steps' winners), run_dir, cwd, results (the whole run's results so far)."""
        raise NotImplementedError(f"step kind {self.name!r} does not run")

    def summary_line(self, result: StepRecord) -> str:
        """Extra text of the console line printed when the step ends (e.g. its mean throughput, its winner)."""
        extra = ""
        step = self.read(result)
        m = as_launch(step.metrics)
        if m.toks_per_s is not None and m.toks_per_s.mean is not None:
            context = context_text(written(step.metrics))
            extra = (f" ({m.toks_per_s.mean:,.0f} tok/s mean, last {m.window.n} steps"
                     + (f"; {context}" if context else "") + ")")
        winner = given(step.winner)
        if winner is not None:
            extra += f" winner: {winner.label}"
        return extra

    def trainer_launches(self, result: StepRecord) -> list[tuple[str, dict, str | None]]:
        """(label, metrics as results.json holds them, how the launch ended: its status) of every trainer launch of
        the step: its runs (a sweep's, an A/B's), or the step itself when its metrics name a training.csv."""
        step = self.read(result)
        if step.runs:
            return [(f"{step.name}[{r.label}]", written(r.metrics), r.status) for r in step.runs]
        m = written(step.metrics)
        return [(str(step.name), m, step.status)] if decode(LaunchMetrics, m, "metrics", lenient=True).csv else []

    # ------------------------------------------------------------------ report
    def view(self, result: dict[str, Any], view: dict[str, Any]) -> dict[str, Any]:
        """Changes to the fields every step section shows, merged into the step `view` (which it may read: name,
        status, reason, command, ...): e.g. {"command": ""} where each run shows its own. Must accept anything:
        results may be damaged."""
        return {}

    def blocks(self, result: dict[str, Any]) -> list[Block]:
        """The kind's part of the step section as report blocks (validation.kinds.blocks: paragraphs, lists,
        tables), which the report renders to Markdown and to HTML alike. Must accept anything: results may be
        damaged."""
        return []

    def key_figures(self, steps: list[dict[str, Any]]) -> list[KeyFigure]:
        """Figures for the executive summary, from every step's result in run order (not only this kind's); the
        figures of all kinds are shown sorted by their order."""
        return []

    def comparisons(self, result: dict[str, Any]) -> list[Effect]:
        """The with/without comparisons a passed step of the kind measured (an A/B's variants against its baseline,
        a sweep's best point against the others, a triage's suspects against the configuration), for the report's
        findings; must accept anything."""
        return []

    def key_figure_steps(self, steps: list[dict[str, Any]]) -> list[str]:
        """The steps whose performance figures key_figures shows (so that they count as measured evidence)."""
        return []

    def derived_from(self, result: StepRecord, path: tuple) -> list[str]:
        """The other steps whose measurements the figure at key `path` of this step (`result`: its record) is
        computed from, e.g. a train step's scaling efficiency from its `scaling_baseline` step's tokens/s; path ()
        is the step as a whole (every figure of it). A criterion reading such a figure is inconclusive when any of
        them was measured under interference (validation.execution.evidence.derived_from), and they count as
        measured evidence. Default: none (a figure of the step's own launches). Must accept anything."""
        return []

    def plots(self, name: str, result: dict[str, Any], plotter) -> None:
        """Extra plots of the step, drawn with validation.report.plots.Plotter (bars(...), figure(...)); the
        tokens/s-per-step plot of every step with a training.csv is drawn for every kind."""


@dataclasses.dataclass(frozen=True)
class Ended:
    """One launch of a step whose launches run side by side (launch_each): its spec, how its process ended and the
    kind's record of it (None: the launch was interrupted)."""
    spec: LaunchSpec
    lr: Any  # validation.launch.LaunchResult
    record: Any


@dataclasses.dataclass(frozen=True)
class EachEnded:
    """The launches of launch_each that ended, in plan order: what a run one after another would have recorded."""
    ended: list[Ended]

    @property
    def records(self) -> list[Any]:
        """The records of the launches that were not interrupted, in plan order."""
        return [e.record for e in self.ended if e.record is not None]

    @property
    def excerpt(self) -> str | None:
        """The excerpt of the last launch in plan order that has one."""
        return next((e.lr.excerpt for e in reversed(self.ended) if e.lr.excerpt), None)

    def interrupted(self, result: StepRecord) -> StepRecord | None:
        """`result` as an interrupted step (the command of the last launch in plan order, the reason of the first
        interrupted one), or None when no launch was interrupted."""
        stopped = next((e for e in self.ended if e.record is None), None)
        if stopped is None:
            return None
        return dataclasses.replace(result, status="interrupted", command=list(self.ended[-1].lr.argv),
                                   reason=f"{stopped.spec.label}: {stopped.lr.reason}")


def launch_each(ctx, jobs: int, collect: Callable[[int, LaunchSpec, Any], Any],
                partial: Callable[[EachEnded], StepRecord]) -> EachEnded:
    """Run the step's launches (ctx.launches) up to `jobs` at a time (ctx.launch_all), recorded as a run one after
    another would record them: `collect(index, spec, launch_result)` makes each ended launch's record (not called
    for an interrupted one, after which no further launch starts), and the step's partial Result, `partial(the
    launches ended so far, in plan order)`, is saved as each record is made. Returns the launches that ended."""
    ended: dict[int, Ended] = {}  # plan index -> the launch and its record

    def so_far() -> EachEnded:
        return EachEnded([ended[j] for j in sorted(ended)])

    def done(i: int, spec: LaunchSpec, lr: Any) -> bool:
        record = None if lr.status == "interrupted" else collect(i, spec, lr)
        ended[i] = Ended(spec, lr, record)
        if record is not None:
            ctx.save(partial(so_far()))  # each launch's record is on disk as soon as it ends
        return record is None  # interrupted: no further launch starts

    ctx.launch_all(ctx.launches, jobs, done)
    return so_far()


def run_path(run_dir: Path | None, rel: str) -> str:
    """A path for a command line: absolute under the run directory (also for a relative --out: a benchmark that
    changes its directory still finds it), or RUN_DIR/... in plan mode."""
    path = step_dir(run_dir, rel)
    return str(path.absolute() if run_dir is not None else path)


def step_dir(run_dir: Path | None, rel: str) -> Path:
    """Where a launch's files go: run_dir/rel, or RUN_DIR/rel in plan mode (LaunchSpec.dir is then `rel`)."""
    return inside_run_dir(run_dir, rel) if run_dir is not None else PLAN_RUN_DIR / rel  # RunDirError: outside it


def launch_identity(step: Step, label: str = "") -> dict[str, Any]:
    """The LaunchSpec fields that say where and as what a launch of `step` runs: the runbook's launcher block
    (torchrun rendezvous, Slurm allocation), the Slurm job name, the step and the label."""
    lc = step.launch.launcher
    return dict(launcher=lc.type, rdzv_backend=lc.rdzv_backend, rdzv_endpoint=lc.rdzv_endpoint,
                slurm=SlurmOptions(partition=lc.partition, account=lc.account, time_limit=lc.time_limit,
                                   gpus_per_node=lc.gpus_per_node, cpus_per_task=lc.cpus_per_task, sbatch=lc.sbatch),
                job_name="nsav-" + safe_name(f"{step.name}-{label}" if label else step.name), step=step.name,
                label=label)


def command_launch(step: Step, argv: list[str], run_dir, label: str = "", nnodes: int = 1) -> LaunchSpec:
    """A launch of one command that is not the trainer (a test suite, a benchmark), in RUN_DIR/<step>, with the
    step's own environment variables and timeout."""
    return LaunchSpec(argv=argv, env=dict(step.launch.env), inherit_env=True, run_dir=run_dir,
                      step_dir=step_dir(run_dir, step.name), timeout_s=step.launch.timeout_s, nnodes=nnodes,
                      **launch_identity(step, label))


def earlier_step_of_kind(order, step, name: str, kind: str) -> bool:
    """Whether `name` is a step of `kind` that runs before `step` in `order` (the runbook's steps in run order):
    what a key naming another step's results (train's scaling_baseline, parallelism's comm) needs."""
    position = {s.name: i for i, s in enumerate(order)}
    base = next((s for s in order if s.name == name), None)
    return base is not None and base.kind == kind and position[base.name] < position[step.name]


# ---------------------------------------------------------------------------------------------- metric names
def _segments(pattern: str) -> tuple[str, ...]:
    return tuple(pattern.split("."))


def _placeholder(segment: str) -> bool:
    return segment.startswith("<") and segment.endswith(">")


def _covers(pattern: tuple[str, ...], path: tuple) -> bool:
    """Whether `pattern` names `path` or something inside it (path is a prefix of a name it stands for)."""
    for i, key in enumerate(path):
        if i >= len(pattern):
            return False
        if pattern[i] == "*":
            return True
        if _placeholder(pattern[i]):
            continue
        if isinstance(key, int) or str(key) != pattern[i]:
            return False
    return True


def with_labels(patterns: tuple[str, ...], placeholder: str, labels) -> tuple[str, ...]:
    """`patterns` with each one that starts "<placeholder>" or "runs.<placeholder>" written once per label (a
    point's, a variant's, a suspect's): what metric_names(step) returns where the step's own keys name them."""
    out = []
    for p in patterns:
        labelled = p.startswith((f"{placeholder}.", f"runs.{placeholder}."))
        out += [p.replace(placeholder, str(label), 1) for label in labels] if labelled else [p]
    return tuple(out)


def readable_names(kind: StepKind, step: Step | None = None) -> tuple[str, ...] | None:
    """Every name a criterion may read of `step` (STEP_FIELDS and its kind's metrics); None when undeclared."""
    own = kind.metric_names(step)
    return None if own is None else STEP_FIELDS + tuple(own)


def metric_declared(path: tuple, patterns: tuple[str, ...]) -> bool:
    """Whether key path `path` (("toks_per_s", "mean"), ("runs", "50", "loss")) is, or lies inside, a declared name."""
    return any(_covers(_segments(p), tuple(path)) for p in patterns)


def undeclared_metrics(kind: StepKind, step: Step | None, metrics: dict) -> list[str]:
    """The leaves of a step's recorded `metrics` (a dict of dicts; a list is one leaf) that no name of its kind
    declares, as dotted names; [] when the kind declares none (kind.metric_names is None)."""
    names = kind.metric_names(step)
    if names is None:
        return []
    out: list[str] = []

    def walk(value, path: tuple) -> None:
        if isinstance(value, dict) and value:
            for key, inner in value.items():
                walk(inner, path + (key,))
        elif path and not metric_declared(path, names):
            out.append(".".join(map(str, path)))

    walk(metrics, ())
    return out


def close_metric_names(path: tuple, patterns: tuple[str, ...], n: int = 4) -> list[str]:
    """The declared names closest to `path` where it first goes astray: the names one key deep below its longest
    declared prefix (e.g. toks_per_s, toks_per_s_per_gpu for toks_per_sec), closest first (difflib)."""
    path = tuple(path)
    depth = max((d for d in range(len(path) + 1) if metric_declared(path[:d], patterns)), default=0)
    prefix, wrong = path[:depth], str(path[depth]) if depth < len(path) else ""
    below: dict[str, str] = {}  # each key one deeper -> its name
    for p in patterns:
        segs = _segments(p)
        if len(segs) > depth and segs[depth] != "*" and _covers(segs, prefix):
            below.setdefault(segs[depth], ".".join([*map(str, prefix), segs[depth]]))
    near = difflib.get_close_matches(wrong, list(below), n=n, cutoff=0.5)
    return [below[k] for k in near] or list(below.values())[:n * 2]


def mapping_reference(step: Step, path: tuple) -> list[str] | None:
    """The keys below `path` of `step` when the kind's names make it a mapping of figures (every declared name that
    covers it is longer, none stands for anything at or above its depth: `toks_per_s` of `toks_per_s.mean`,
    `toks_per_s.median`, ...), sorted; None when it may be a figure (declared as itself, a wildcard, or the kind
    declares nothing)."""
    names = readable_names(step.kind_impl, step)
    if names is None:
        return None
    below = set()
    for pattern in map(_segments, names):
        if not _covers(pattern, tuple(path)):
            continue
        if len(pattern) <= len(path) or "*" in pattern[:len(path) + 1] or _placeholder(pattern[len(path)]):
            return None  # a name that is the path itself, or may be: it can be a figure
        below.add(pattern[len(path)])
    return sorted(below) or None


def check_metric_reference(step: Step, path: tuple) -> str | None:
    """Why a criterion cannot read `path` of `step` (no name its kind declares holds it, with the close names), or
    None (declared, or the kind declares nothing)."""
    names = readable_names(step.kind_impl, step)
    if names is None or metric_declared(path, names):
        return None
    shown = ".".join([step.name, *(f"[{k}]" if isinstance(k, int) else str(k) for k in path)]).replace(".[", "[")
    close = close_metric_names(path, names)
    return (f"{shown}: the {step.kind} step {step.name} produces no such metric"
            + (f" (close: {', '.join(f'{step.name}.{c}' for c in close)})" if close else ""))
