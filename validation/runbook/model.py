"""What a validated runbook holds: the Runbook, its phases, steps, launch settings, requirements and acceptance
criteria (frozen dataclasses). validation.runbook.loader reads YAML into them; the step kinds, the plan, the runner and
the reports read them. Nothing here reads files or knows a step kind: a Step carries its kind (`kind_impl`, set by
the reader from the registry, validation.kinds)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping

from validation.runbook.expressions import Expression


@dataclass(frozen=True)
class Overridden:
    """A `--set defaults.KEY=...` (item) that step `step` overrides with its own KEY (own: its value, shown)."""

    step: str
    key: str
    own: str
    item: str


@dataclass(frozen=True)
class Requirements:
    gpus: int = 0
    min_cuda_capability: float | None = None
    min_gpu_memory_gb: float | None = None
    backend: str | None = None


@dataclass(frozen=True)
class Launcher:
    """How a step's processes start: ``torchrun`` on this machine (nnodes > 1: that many agents here, emulated
    nodes) or a ``slurm`` job per launch (nnodes nodes, srun + torchrun with c10d rendezvous)."""

    type: str = "torchrun"
    rdzv_backend: str = "c10d"  # torchrun, nnodes > 1
    rdzv_endpoint: str | None = None  # torchrun, nnodes > 1: host:port (None: 127.0.0.1 and a free port)
    partition: str | None = None  # slurm
    account: str | None = None
    time_limit: str | None = None
    gpus_per_node: int = 0
    cpus_per_task: int | None = None
    sbatch: tuple[str, ...] = ()  # extra #SBATCH option lines


@dataclass(frozen=True)
class LaunchSettings:
    """The launch settings a step inherits from `defaults` and may override (what the runbook says; the plan
    turns them into concrete launches, validation.launch.LaunchSpec)."""

    config: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)
    nproc_per_node: int = 1
    master_port: str | int = "auto"
    port_retries: int = 3
    timeout_s: float = 3600.0
    stall_timeout_s: float = 600.0
    window: int = 50
    warmup_steps: int = 0
    launcher: Launcher = field(default_factory=Launcher)
    nnodes: int = 1
    retry_disturbed: int = 1  # ab, sweep, triage: a repeat measured under interference is run again this often


@dataclass(frozen=True)
class Step:
    """One runbook step. Its kind's own keys are in `options`, the kind's Options dataclass (a plugin's kind may still
    give a mapping), and read as attributes (step.matrix, step.tests)."""

    name: str
    kind: str
    phase: str
    title: str
    description: str
    launch: LaunchSettings
    requires: Requirements
    optional: bool = False
    on_failure: str = "continue"     # "stop": a failed/timeout/hang/error end of this step ends the run
    options: Any = field(default_factory=dict)  # the kind's Options (a frozen dataclass), or a mapping
    # the step's kind (a validation.kinds.StepKind), set by the runbook's reader from the registry
    kind_impl: Any = field(default=None, repr=False, compare=False)

    def __getattr__(self, key: str) -> Any:
        options = self.__dict__.get("options")
        if isinstance(options, Mapping):
            if key in options:
                return options[key]
        elif dataclasses.is_dataclass(options) and key in {f.name for f in dataclasses.fields(options)}:
            return getattr(options, key)
        raise AttributeError(f"{type(self).__name__} of kind {self.__dict__.get('kind')!r} has no {key!r}")

    @property
    def is_training(self) -> bool:
        """Whether the step launches the trainer (heartbeats, a GPU per rank)."""
        return self.kind_impl.trainer


@dataclass(frozen=True)
class Phase:
    name: str
    title: str
    description: str
    steps: list[Step]


@dataclass(frozen=True)
class Criterion:
    name: str
    expr: Expression
    target: str
    severity: str
    description: str = ""


@dataclass(frozen=True)
class Runbook:
    name: str
    description: str
    path: str
    sha256: str
    requirements: Requirements
    defaults: LaunchSettings
    phases: list[Phase]
    acceptance: list[Criterion]
    recommend_env: dict[str, str]
    # compare: how two runs of this runbook on its machine differ when nothing changed, measured with
    # benchmarks/bench_aa_compare.py: {"run_sd", "launch_sd" (either may be absent), "pairs"}; None: not declared.
    # Stored in results.json's runbook record; `compare` holds its noise to at least these
    compare_noise: dict[str, float] | None = None
    # a --set of a defaults key that a step's own value overrides (`plan` shows them under the step, `run` warns)
    overridden: tuple[Overridden, ...] = ()

    def step_notes(self, name: str) -> list[str]:
        """What `plan` says under step `name`: each --set default its own value overrides."""
        return [f"its own {o.key} = {o.own} overrides --set {o.item} (a step's own value wins over defaults; "
                f"change it with --set steps.{name}.{o.key}=...)" for o in self.overridden if o.step == name]

    @property
    def notes(self) -> list[str]:
        """One warning per --set of a defaults key that some steps override with their own value."""
        by_item: dict[str, list[Overridden]] = {}
        for o in self.overridden:
            by_item.setdefault(o.item, []).append(o)
        return [f"--set {item} does not change step(s) {', '.join(f'{o.step} ({o.key} = {o.own})' for o in os_)}: "
                f"a step's own value wins over defaults (change one with --set steps.STEP.{os_[0].key}=...)"
                for item, os_ in by_item.items()]

    def steps(self) -> list[Step]:
        return [s for p in self.phases for s in p.steps]

    def step(self, name: str) -> Step:
        for s in self.steps():
            if s.name == name:
                return s
        raise KeyError(name)


def step_definition(step: Step) -> dict[str, Any]:
    """What `step` runs, as JSON: its kind, requirements, `optional` and `on_failure`, and every launch of its plan
    (label, argv, wrapper, environment, ranks, nodes, launcher, limits, window, params, repeat), the run directory
    written RUN_DIR and this Python's path "python" (a machine's install is not the step's definition). Recorded under
    each step of results.json (`definition`): a step kept from another run (--reuse) or from an earlier attempt
    (--resume) ran what this says, so that what it would run now can be held against it
    (validation.results.reuse.definition_differences). The launches are the plan's
    (validation.runbook.plan.step_launches in plan mode: winners and the run directory left as text)."""
    def argv(args: list[Any]) -> list[str]:
        return ["python" if str(a) == sys.executable else str(a) for a in args]

    launches = [{"label": spec.label, "argv": argv(spec.argv), "wrapper": argv(spec.wrapper),
                 "env": {str(k): str(v) for k, v in spec.env.items()}, "nproc_per_node": spec.nproc_per_node,
                 "nnodes": spec.nnodes, "launcher": spec.launcher, "timeout_s": spec.timeout_s,
                 "stall_timeout_s": spec.stall_timeout_s, "window": spec.window, "params": spec.params,
                 "repeat": spec.repeat} for spec in step.kind_impl.launches(step, None, None)]
    record = {"kind": step.kind, "requires": dataclasses.asdict(step.requires), "optional": step.optional,
              "on_failure": step.on_failure, "launches": launches}
    return json.loads(json.dumps(record, default=str))  # JSON as results.json holds it (tuples as lists)


# ${step.winner.env.X} / ${step.winner.args.X}: a later step's setting taken from an earlier step's winner
REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\.winner\.(env|args)\.([A-Za-z0-9_.-]+)\}")


def resolve_references(value: Any, winners: dict[str, dict[str, Any]]) -> Any:
    """Replace ${step.winner.env.X} with the winning value (winners: step -> {"env.X": v, ...})."""
    if not isinstance(value, str):
        return value

    def sub(match: re.Match) -> str:
        ref, section, key = match.groups()
        won = winners.get(ref)
        if not won or f"{section}.{key}" not in won:
            raise LookupError(f"{ref} has no winner for {section}.{key}")
        return str(won[f"{section}.{key}"])

    return REF_RE.sub(sub, value)


def references(value: Any) -> list[str]:
    return [m[0] for m in REF_RE.findall(value)] if isinstance(value, str) else []
