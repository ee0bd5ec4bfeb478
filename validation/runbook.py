"""Runbook YAML: the declarative form of a validation runbook, validated completely before anything runs.

    name: ddp_2xa100
    description: ...
    requirements: {gpus: 2, min_cuda_capability: 8.0, min_gpu_memory_gb: 70, backend: nccl}
    defaults:                      # every step inherits these (a step's own values win; env/args are merged)
      config: configs/m7c_125m_2xa100_production.yaml
      env: {NSA_PREFILL_BATCHED: "1"}
      args: {dataset: synthetic}
      nproc_per_node: 2
      master_port: auto            # auto (a free port, retried on a clash) or a number
      timeout_s: 3600
      stall_timeout_s: 600         # heartbeat silence that makes a step a HANG
      window: 50                   # statistics over the last N steps ...
      warmup_steps: 5              # ... after excluding the first ones
      on_failure: continue         # continue (default) or stop: a failed step ends the run, the rest are skipped
    recommend: {env: {NSA_PREFILL_BATCHED: "1"}}   # settings always recommended (winners are added)
    phases:
      - name: baseline
        title: Baseline DDP throughput
        steps:
          - {name: baseline, kind: train, env: {NSA_DDP_COMPRESS: bf16}, args: {ddp: 1, steps: 300}}
    acceptance:
      - {name: throughput, expr: "baseline.toks_per_s.mean >= 39", target: ">= 39 tokens/s", severity: fail}

Step kinds and their own keys:
    snapshot   (none)                        git sha, collect_env, GPU inventory, package versions
    train      env, args, config, nproc_per_node, window, warmup_steps, ...
    sweep      + matrix: {"env.NSA_DDP_BUCKET_MB": ["25", "50", "100"]}, select: {metric, goal}
    ab         + baseline: {env, args}, variants: {label: {env, args}}, repeats, metric, recommend
    pytest     tests: [paths or node ids], pytest_args: [...]
    bench      command: [argv after the python executable], (the script writes JSON given --json PATH)
    profile    + profile_steps (torch profiler; nsys wraps the launch when present and profiler: nsys|auto)
    longrun    train keys; the verdict adds stalls, .HALT, throughput stability and a memory plateau

Every step kind also takes `on_failure: continue | stop` (default from defaults, else continue): with stop, a step
that ends failed, timeout, hang or error ends the run there and the remaining steps are recorded as skipped.

Values may reference an earlier sweep's winner: "${bucket_sweep.winner.env.NSA_DDP_BUCKET_MB}".
Nothing in a runbook chooses where files are written: every output goes under RUN_DIR/<step name> (names are
identifiers, so never `..` or an absolute path), the trainer's --out-dir/--resume cannot be set (args or a sweep
matrix), and pytest_args cannot redirect pytest's own output files.
Every error names the file, the key path and the line, e.g.
    runbooks/x.yaml:14: phases[1].steps[0].kind: 'trian' is not one of snapshot, train, ...
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from nsa.training.config import YAML_ERRORS
from validation.slurm import validate_sbatch_line
from nsa.training.config import brief as _brief
from validation.expressions import Expression, ExpressionError, compile_expression

STEP_KINDS = ("snapshot", "train", "sweep", "ab", "pytest", "bench", "profile", "longrun")
TRAIN_KINDS = ("train", "sweep", "ab", "profile", "longrun")
SEVERITIES = ("fail", "warn")
ON_FAILURE = ("continue", "stop")
BACKENDS = ("nccl", "gloo")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
REF_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\.winner\.(env|args)\.([A-Za-z0-9_.-]+)\}")


class RunbookError(ValueError):
    """A runbook problem; the message names the file, line and key path."""


# ---------------------------------------------------------------------- model
@dataclass(frozen=True)
class Requirements:
    gpus: int = 0
    min_cuda_capability: float | None = None
    min_gpu_memory_gb: float | None = None
    backend: str | None = None


LAUNCHERS = ("torchrun", "slurm")
RDZV_BACKENDS = ("c10d", "static")
LAUNCHER_KEYS = ("type", "rdzv_backend", "rdzv_endpoint", "partition", "account", "time_limit", "gpus_per_node",
                 "cpus_per_task", "sbatch")
_ENDPOINT_RE = re.compile(r"[A-Za-z0-9_.-]+:\d{1,5}")
_TIME_LIMIT_RE = re.compile(r"\d+|\d+:\d\d(:\d\d)?|\d+-\d+(:\d\d(:\d\d)?)?")
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.,-]+")


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
class Launch:
    """Launch settings a step inherits from defaults and may override."""

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


@dataclass(frozen=True)
class Variant:
    env: dict[str, str] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    name: str
    kind: str
    phase: str
    title: str
    description: str
    launch: Launch
    requires: Requirements
    optional: bool = False
    on_failure: str = "continue"     # "stop": a failed/timeout/hang/error end of this step ends the run
    # sweep
    matrix: dict[str, list[Any]] = field(default_factory=dict)
    select_metric: str = "toks_per_s"
    select_goal: str = "max"
    # ab
    baseline: Variant = field(default_factory=Variant)
    variants: dict[str, Variant] = field(default_factory=dict)
    repeats: int = 1
    metric: str = "toks_per_s"
    recommend: bool = False
    # train: scaling efficiency against an earlier train step (e.g. the same config on one node)
    scaling_baseline: str | None = None
    # pytest / bench
    tests: list[str] = field(default_factory=list)
    pytest_args: list[str] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    # profile
    profile_steps: int = 3
    profiler: str = "auto"

    @property
    def is_training(self) -> bool:
        return self.kind in TRAIN_KINDS

    def sweep_points(self) -> list[tuple[str, dict[str, Any]]]:
        """(label, {"env.X": v, "args.y": w}) for every point of the matrix, in order."""
        keys = list(self.matrix)
        points = []
        for values in itertools.product(*(self.matrix[k] for k in keys)):
            params = dict(zip(keys, values))
            label = ",".join(f"{k.split('.', 1)[1]}={v}" for k, v in params.items())
            points.append((label, params))
        return points


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
    defaults: Launch
    phases: list[Phase]
    acceptance: list[Criterion]
    recommend_env: dict[str, str]

    def steps(self) -> list[Step]:
        return [s for p in self.phases for s in p.steps]

    def step(self, name: str) -> Step:
        for s in self.steps():
            if s.name == name:
                return s
        raise KeyError(name)


# ---------------------------------------------------------------------- YAML with line numbers
def _compose_lines(node, path=(), lines=None, seen=None) -> dict[tuple, int]:
    """Map every key path in a composed YAML node tree to its 1-based line. A node reached again through an
    alias is not walked again (aliases may form cycles or expand exponentially); only scalar keys are mapped."""
    lines = {} if lines is None else lines
    seen = set() if seen is None else seen
    lines.setdefault(path, node.start_mark.line + 1)
    if id(node) in seen:
        return lines
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue
            key = key_node.value
            lines[path + (key,)] = key_node.start_mark.line + 1
            _compose_lines(value_node, path + (key,), lines, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _compose_lines(item, path + (i,), lines, seen)
    return lines


class _Ctx:
    """Where we are in the file, for error messages."""

    def __init__(self, where: str, lines: dict[tuple, int]):
        self.where, self.lines = where, lines

    def error(self, path: tuple, message: str) -> RunbookError:
        line = None
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                line = self.lines[path[:n]]
                break
        shown = _show(path) or "(top level)"
        return RunbookError(f"{self.where}:{line if line is not None else '?'}: {shown}: {message}")


def _show(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{_printable(part)}" if out else _printable(part))
    return out


def _printable(part: Any) -> str:
    """str(part), or its repr when it holds a newline or another control character (messages are one line)."""
    return str(part) if str(part).isprintable() else repr(part)


def load_runbook(path: str | Path, overrides: list[str] | None = None) -> Runbook:
    """Read, override (--set key=value) and validate a runbook file."""
    path = Path(path)
    if not path.is_file():
        raise RunbookError(f"{path}: runbook file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RunbookError(f"{path}: cannot read ({exc})") from None
    try:
        node = yaml.compose(text)
        raw = yaml.safe_load(text)
    except YAML_ERRORS as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else "?"
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise RunbookError(f"{path}:{line}: not valid YAML ({problem})") from None
    lines = _compose_lines(node) if node is not None else {}
    ctx = _Ctx(str(path), lines)
    for item in overrides or []:
        raw = _apply_override(raw, item, ctx)
    # surrogatepass: a --set value from a non-UTF-8 command line holds lone surrogates
    sha = hashlib.sha256(text.encode() + "\n".join(overrides or []).encode(errors="surrogatepass")).hexdigest()
    return _build_runbook(raw, ctx, str(path), sha)


def _apply_override(raw: Any, item: str, ctx: _Ctx) -> Any:
    """--set a.b.c=value: a dotted path into the YAML (list items of phases/steps by their name)."""
    key, sep, value_text = item.partition("=")
    if not sep or not key:
        raise RunbookError(f"--set {item!r}: expected KEY=VALUE, e.g. defaults.args.steps=20")
    shown = _printable(key)
    try:
        value = yaml.safe_load(value_text)
    except YAML_ERRORS:
        value = value_text
    if not isinstance(raw, dict):
        raise ctx.error((), "expected a mapping at the top level")
    node, parts = raw, key.split(".")
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            match = [x for x in node if isinstance(x, dict) and x.get("name") == part]
            if not match:
                raise RunbookError(f"--set {shown}: no item named {part!r} under "
                                   f"{_printable('.'.join(parts[:i])) or 'top'}")
            node = match[0]
        elif isinstance(node, dict):
            node = node.setdefault(part, {})
        else:
            raise RunbookError(f"--set {shown}: {_printable('.'.join(parts[:i]))} is not a mapping")
    if not isinstance(node, dict):
        raise RunbookError(f"--set {shown}: {_printable('.'.join(parts[:-1]))} is not a mapping")
    node[parts[-1]] = value
    return raw


# ---------------------------------------------------------------------- validation helpers
def _mapping(value: Any, path: tuple, ctx: _Ctx, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ctx.error(path, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            raise ctx.error(path + (key,), f"unknown key (expected one of: {', '.join(allowed)})")
    for key in required:
        if key not in value:
            raise ctx.error(path, f"missing required key {key!r}")
    return value


def _typed(value: Any, kind, path: tuple, ctx: _Ctx, *, minimum=None, choices=None, optional=False):
    if value is None and optional:
        return None
    ok = {
        int: isinstance(value, int) and not isinstance(value, bool),
        float: isinstance(value, (int, float)) and not isinstance(value, bool),
        str: isinstance(value, str),
        bool: isinstance(value, bool),
    }[kind]
    if not ok:
        expected = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}[kind]
        raise ctx.error(path, f"must be {expected}, got {_brief(value)}")
    if choices is not None and value not in choices:
        raise ctx.error(path, f"{value!r} is not one of {', '.join(map(str, choices))}")
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ctx.error(path, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ctx.error(path, f"must be >= {minimum}, got {value!r}")
    if kind is float:
        try:
            return float(value)
        except OverflowError:
            raise ctx.error(path, f"number too large, got {_brief(value)}") from None
    return value


def _env(value: Any, path: tuple, ctx: _Ctx) -> dict[str, str]:
    value = _mapping(value, path, ctx, tuple(value.keys()) if isinstance(value, dict) else ())
    out = {}
    for key, v in value.items():
        if not isinstance(key, str) or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", key):
            raise ctx.error(path + (key,), "not a valid environment variable name")
        if isinstance(v, bool):
            v = "1" if v else "0"
        if not isinstance(v, (str, int, float)):
            raise ctx.error(path + (key,), f"environment values must be strings or numbers, got {_brief(v)}")
        out[key] = str(v)
    return out


def _args(value: Any, path: tuple, ctx: _Ctx) -> dict[str, Any]:
    value = _mapping(value, path, ctx, tuple(value.keys()) if isinstance(value, dict) else ())
    for key, v in value.items():
        if not isinstance(key, str) or not re.match(r"^[a-z][a-z0-9_-]*$", key):
            raise ctx.error(path + (key,), "trainer argument names are lower-case flags without '--', e.g. steps")
        if _reserved_arg(key):
            raise ctx.error(path + (key,), f"set by nsa-validate itself ({_reserved_arg(key)})")
        if not isinstance(v, (str, int, float, bool)) or v is None:
            raise ctx.error(path + (key,), f"argument values must be scalars, got {_brief(v)}")
    return dict(value)


def _reserved_arg(key: str) -> str | None:
    """Why nsa-validate itself owns trainer flag `key` (e.g. out_dir, out-dir), or None."""
    return RESERVED_ARGS.get(key.replace("_", "-"))


# pytest options that choose where pytest writes: nsa-validate puts pytest.xml under RUN_DIR/<step> itself, and
# --basetemp would even let pytest empty a directory outside it (pytest refuses abbreviated options).
RESERVED_PYTEST_ARGS = ("--junitxml", "--junit-xml", "--basetemp", "--result-log", "--resultlog", "--debug")


def _pytest_args(value: Any, path: tuple, ctx: _Ctx) -> list[str]:
    args = _str_list(value, path, ctx)
    for i, arg in enumerate(args):
        if arg.split("=", 1)[0] in RESERVED_PYTEST_ARGS:
            raise ctx.error(path + (i,), f"{arg!r}: pytest options that choose output files or directories are "
                                         "set by nsa-validate itself (outputs go under RUN_DIR/<step>)")
    return args


def _str_list(value: Any, path: tuple, ctx: _Ctx) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, (str, int, float)) for x in value):
        raise ctx.error(path, "expected a list of strings")
    return [str(x) for x in value]


# Trainer flags a runbook may not set: every launch writes inside RUN_DIR, and a step decides nothing about resume.
RESERVED_ARGS = {"out-dir": "every launch writes into its own directory under RUN_DIR",
                 "resume": "use nsa-validate run --resume RUN_DIR"}

LAUNCH_KEYS = ("config", "env", "args", "nproc_per_node", "master_port", "port_retries", "timeout_s",
               "stall_timeout_s", "window", "warmup_steps", "launcher", "nnodes")


def _launcher(value: Any, path: tuple, ctx: _Ctx, base: Launcher) -> Launcher:
    """`launcher: slurm` or `launcher: {type: slurm, partition: ..., ...}`; keys not given are inherited."""
    if value is None:
        return base
    if isinstance(value, str):
        value = {"type": value}
    raw = _mapping(value, path, ctx, LAUNCHER_KEYS)

    def get(key, kind, **kw):
        return _typed(raw[key], kind, path + (key,), ctx, **kw) if key in raw else getattr(base, key)

    def name(key):
        v = get(key, str, optional=True)
        if v is not None and not _SLURM_NAME_RE.fullmatch(v):
            raise ctx.error(path + (key,), f"{_brief(v)}: letters, digits and _.,- only")
        return v

    endpoint = get("rdzv_endpoint", str, optional=True)
    if endpoint is not None and not _ENDPOINT_RE.fullmatch(endpoint):
        raise ctx.error(path + ("rdzv_endpoint",), f"expected host:port, got {_brief(endpoint)}")
    if isinstance(raw.get("time_limit"), (int, float)) and not isinstance(raw.get("time_limit"), bool):
        raise ctx.error(path + ("time_limit",), f"quote it, e.g. \"30\" (minutes) or \"01:30:00\": YAML reads an "
                                                f"unquoted 1:30:00 as the number 5400, got {_brief(raw['time_limit'])}")
    time_limit = get("time_limit", str, optional=True)
    if time_limit is not None and not _TIME_LIMIT_RE.fullmatch(time_limit):
        raise ctx.error(path + ("time_limit",), f"{_brief(time_limit)}: Slurm's format, e.g. 30, 01:30:00 or "
                                                "1-00:00:00")
    sbatch = tuple(_str_list(raw["sbatch"], path + ("sbatch",), ctx)) if "sbatch" in raw else base.sbatch
    for i, line in enumerate(sbatch):
        problem = validate_sbatch_line(line)
        if problem:
            raise ctx.error(path + ("sbatch", i), f"{_brief(line)}: {problem}")
    return Launcher(type=get("type", str, choices=LAUNCHERS), rdzv_backend=get("rdzv_backend", str,
                                                                                 choices=RDZV_BACKENDS),
                    rdzv_endpoint=endpoint, partition=name("partition"), account=name("account"),
                    time_limit=time_limit, gpus_per_node=get("gpus_per_node", int, minimum=0),
                    cpus_per_task=get("cpus_per_task", int, minimum=1, optional=True), sbatch=sbatch)


def _launch(raw: dict, path: tuple, ctx: _Ctx, base: Launch) -> Launch:
    def get(key, kind, **kw):
        return _typed(raw[key], kind, path + (key,), ctx, **kw) if key in raw else getattr(base, key)

    master_port = raw.get("master_port", base.master_port)
    if master_port != "auto" and (isinstance(master_port, bool) or not isinstance(master_port, int)
                                  or not 1024 <= master_port <= 65535):
        raise ctx.error(path + ("master_port",), f"must be 'auto' or a port number 1024-65535, "
                                                 f"got {_brief(master_port)}")
    return Launch(
        config=get("config", str, optional=True),
        env={**base.env, **_env(raw.get("env"), path + ("env",), ctx)},
        args={**base.args, **_args(raw.get("args"), path + ("args",), ctx)},
        nproc_per_node=get("nproc_per_node", int, minimum=1),
        master_port=master_port,
        port_retries=get("port_retries", int, minimum=0),
        timeout_s=get("timeout_s", float, minimum=1),
        stall_timeout_s=get("stall_timeout_s", float, minimum=1),
        window=get("window", int, minimum=1),
        warmup_steps=get("warmup_steps", int, minimum=0),
        launcher=_launcher(raw.get("launcher"), path + ("launcher",), ctx, base.launcher),
        nnodes=get("nnodes", int, minimum=1),
    )


def _requirements(raw: Any, path: tuple, ctx: _Ctx, base: Requirements | None = None) -> Requirements:
    raw = _mapping(raw, path, ctx, ("gpus", "min_cuda_capability", "min_gpu_memory_gb", "backend"))
    base = base or Requirements()

    def get(key, kind, **kw):
        return _typed(raw[key], kind, path + (key,), ctx, **kw) if key in raw else getattr(base, key)

    return Requirements(gpus=get("gpus", int, minimum=0),
                        min_cuda_capability=get("min_cuda_capability", float, minimum=0, optional=True),
                        min_gpu_memory_gb=get("min_gpu_memory_gb", float, minimum=0, optional=True),
                        backend=get("backend", str, choices=BACKENDS, optional=True))


STEP_COMMON = ("name", "kind", "title", "description", "requires", "optional", "on_failure") + LAUNCH_KEYS
STEP_KEYS = {
    "snapshot": ("name", "kind", "title", "description", "requires", "optional", "launcher", "nnodes", "on_failure", "timeout_s"),
    "train": STEP_COMMON + ("scaling_baseline",),
    "longrun": STEP_COMMON,
    "profile": STEP_COMMON + ("profile_steps", "profiler"),
    "sweep": STEP_COMMON + ("matrix", "select"),
    "ab": STEP_COMMON + ("baseline", "variants", "repeats", "metric", "recommend"),
    "pytest": ("name", "kind", "title", "description", "requires", "optional", "on_failure", "tests",
               "pytest_args", "env", "timeout_s", "launcher"),
    "bench": ("name", "kind", "title", "description", "requires", "optional", "on_failure", "command", "env",
              "timeout_s", "launcher"),
}


def _step(raw: Any, path: tuple, ctx: _Ctx, phase: str, defaults: Launch, reqs: Requirements,
          on_failure: str = "continue") -> Step:
    if not isinstance(raw, dict):
        raise ctx.error(path, "a step must be a mapping with at least name and kind")
    kind = raw.get("kind")
    if kind not in STEP_KINDS:
        raise ctx.error(path + ("kind",), f"{_brief(kind)} is not one of {', '.join(STEP_KINDS)}")
    _mapping(raw, path, ctx, STEP_KEYS[kind], required=("name", "kind"))
    name = _typed(raw["name"], str, path + ("name",), ctx)
    if not NAME_RE.fullmatch(name):
        raise ctx.error(path + ("name",), f"{name!r}: step names are identifiers (letters, digits, _) so "
                                          "acceptance expressions can use them")
    common = dict(name=name, kind=kind, phase=phase,
                  title=_typed(raw.get("title", name), str, path + ("title",), ctx),
                  description=_typed(raw.get("description", ""), str, path + ("description",), ctx),
                  launch=_launch(raw, path, ctx, defaults),
                  requires=_requirements(raw.get("requires"), path + ("requires",), ctx, reqs),
                  optional=_typed(raw.get("optional", False), bool, path + ("optional",), ctx),
                  on_failure=_typed(raw.get("on_failure", on_failure), str, path + ("on_failure",), ctx,
                                    choices=ON_FAILURE))
    extra: dict[str, Any] = {}
    if kind == "train" and raw.get("scaling_baseline") is not None:
        base_name = _typed(raw["scaling_baseline"], str, path + ("scaling_baseline",), ctx)
        if not NAME_RE.fullmatch(base_name):
            raise ctx.error(path + ("scaling_baseline",), f"{_brief(base_name)}: a step name")
        extra["scaling_baseline"] = base_name
    if kind == "sweep":
        matrix = _mapping(raw.get("matrix"), path + ("matrix",), ctx,
                          tuple(raw["matrix"].keys()) if isinstance(raw.get("matrix"), dict) else ())
        if not matrix:
            raise ctx.error(path + ("matrix",), "a sweep needs a matrix, e.g. {env.NSA_DDP_BUCKET_MB: [25, 50]}")
        clean = {}
        for key, values in matrix.items():
            if not isinstance(key, str) or not re.match(r"^(env|args)\.[A-Za-z0-9_-]+$", key):
                raise ctx.error(path + ("matrix", key), "matrix keys are env.VARIABLE or args.flag")
            if key.startswith("args.") and _reserved_arg(key[5:]):
                raise ctx.error(path + ("matrix", key), f"set by nsa-validate itself ({_reserved_arg(key[5:])})")
            if not isinstance(values, list) or not values:
                raise ctx.error(path + ("matrix", key), "expected a non-empty list of values")
            clean[key] = [str(v) if key.startswith("env.") else v for v in values]
        select = _mapping(raw.get("select"), path + ("select",), ctx, ("metric", "goal"))
        extra.update(matrix=clean,
                     select_metric=_typed(select.get("metric", "toks_per_s"), str, path + ("select", "metric"), ctx),
                     select_goal=_typed(select.get("goal", "max"), str, path + ("select", "goal"), ctx,
                                        choices=("max", "min")))
    if kind == "ab":
        def variant(value, vpath):
            v = _mapping(value, vpath, ctx, ("env", "args"))
            return Variant(env=_env(v.get("env"), vpath + ("env",), ctx), args=_args(v.get("args"), vpath + ("args",),
                                                                                      ctx))

        variants_raw = raw.get("variants")
        if not isinstance(variants_raw, dict) or not variants_raw:
            raise ctx.error(path + ("variants",), "an ab step needs variants: {label: {env: ..., args: ...}}")
        for label in variants_raw:
            if not isinstance(label, str) or not NAME_RE.fullmatch(label):
                raise ctx.error(path + ("variants", label), "variant labels are identifiers")
        extra.update(baseline=variant(raw.get("baseline"), path + ("baseline",)),
                     variants={k: variant(v, path + ("variants", k)) for k, v in variants_raw.items()},
                     repeats=_typed(raw.get("repeats", 1), int, path + ("repeats",), ctx, minimum=1),
                     metric=_typed(raw.get("metric", "toks_per_s"), str, path + ("metric",), ctx),
                     recommend=_typed(raw.get("recommend", False), bool, path + ("recommend",), ctx))
    if kind == "pytest":
        extra.update(tests=_str_list(raw.get("tests"), path + ("tests",), ctx),
                     pytest_args=_pytest_args(raw.get("pytest_args"), path + ("pytest_args",), ctx))
        if not extra["tests"]:
            raise ctx.error(path + ("tests",), "a pytest step needs tests: [paths or node ids]")
    if kind == "bench":
        extra["command"] = _str_list(raw.get("command"), path + ("command",), ctx)
        if not extra["command"]:
            raise ctx.error(path + ("command",), "a bench step needs command: [script, args...]")
    if kind == "profile":
        extra.update(profile_steps=_typed(raw.get("profile_steps", 3), int, path + ("profile_steps",), ctx, minimum=1),
                     profiler=_typed(raw.get("profiler", "auto"), str, path + ("profiler",), ctx,
                                     choices=("auto", "torch", "nsys")))
    return Step(**common, **extra)


def _build_runbook(raw: Any, ctx: _Ctx, path: str, sha: str) -> Runbook:
    raw = _mapping(raw, (), ctx, ("name", "description", "requirements", "defaults", "phases", "acceptance",
                                  "recommend"), required=("name", "phases"))
    name = _typed(raw["name"], str, ("name",), ctx)
    reqs = _requirements(raw.get("requirements"), ("requirements",), ctx)
    defaults_raw = _mapping(raw.get("defaults"), ("defaults",), ctx, LAUNCH_KEYS + ("on_failure",))
    defaults = _launch(defaults_raw, ("defaults",), ctx, Launch())
    on_failure = _typed(defaults_raw.get("on_failure", "continue"), str, ("defaults", "on_failure"), ctx,
                        choices=ON_FAILURE)
    recommend = _mapping(raw.get("recommend"), ("recommend",), ctx, ("env",))
    phases_raw = raw["phases"]
    if not isinstance(phases_raw, list) or not phases_raw:
        raise ctx.error(("phases",), "expected a non-empty list of phases")
    phases, seen = [], {}
    for i, praw in enumerate(phases_raw):
        ppath = ("phases", i)
        p = _mapping(praw, ppath, ctx, ("name", "title", "description", "steps"), required=("name", "steps"))
        pname = _typed(p["name"], str, ppath + ("name",), ctx)
        if not NAME_RE.fullmatch(pname):
            raise ctx.error(ppath + ("name",), f"{pname!r}: phase names are identifiers")
        if not isinstance(p["steps"], list) or not p["steps"]:
            raise ctx.error(ppath + ("steps",), "expected a non-empty list of steps")
        steps = []
        for j, sraw in enumerate(p["steps"]):
            step = _step(sraw, ppath + ("steps", j), ctx, pname, defaults, reqs, on_failure)
            if step.name in seen:
                raise ctx.error(ppath + ("steps", j, "name"), f"duplicate step name {step.name!r} "
                                                              f"(first at {_show(seen[step.name])})")
            seen[step.name] = ppath + ("steps", j)
            steps.append(step)
        phases.append(Phase(pname, _typed(p.get("title", pname), str, ppath + ("title",), ctx),
                            _typed(p.get("description", ""), str, ppath + ("description",), ctx), steps))
    if len({p.name for p in phases}) != len(phases):
        raise ctx.error(("phases",), "phase names must be unique")
    _check_references(phases, ctx, seen)
    acceptance = []
    if not isinstance(raw.get("acceptance") or [], list):
        raise ctx.error(("acceptance",), f"expected a list of criteria, got {type(raw['acceptance']).__name__}")
    for i, craw in enumerate(raw.get("acceptance") or []):
        cpath = ("acceptance", i)
        c = _mapping(craw, cpath, ctx, ("name", "expr", "target", "severity", "description"),
                     required=("name", "expr"))
        expr_text = _typed(c["expr"], str, cpath + ("expr",), ctx)
        try:
            expr = compile_expression(expr_text)
        except ExpressionError as exc:
            raise ctx.error(cpath + ("expr",), str(exc)) from None
        unknown = sorted(n for n in expr.names if n not in seen)
        if unknown:
            raise ctx.error(cpath + ("expr",), f"refers to unknown step(s) {', '.join(unknown)} "
                                               f"(steps: {', '.join(seen)})")
        acceptance.append(Criterion(
            name=_typed(c["name"], str, cpath + ("name",), ctx), expr=expr,
            target=_typed(c.get("target", expr_text), str, cpath + ("target",), ctx),
            severity=_typed(c.get("severity", "fail"), str, cpath + ("severity",), ctx, choices=SEVERITIES),
            description=_typed(c.get("description", ""), str, cpath + ("description",), ctx)))
    return Runbook(name=name, description=_typed(raw.get("description", ""), str, ("description",), ctx),
                   path=path, sha256=sha, requirements=reqs, defaults=defaults, phases=phases,
                   acceptance=acceptance, recommend_env=_env(recommend.get("env"), ("recommend", "env"), ctx))


def _check_references(phases: list[Phase], ctx: _Ctx, steps_at: dict[str, str]) -> None:
    """${step.winner.env.X} must name an earlier sweep step whose matrix has that key."""
    order = [s for p in phases for s in p.steps]
    position = {s.name: i for i, s in enumerate(order)}
    for i, step in enumerate(order):
        if step.scaling_baseline is not None:
            base = next((s for s in order if s.name == step.scaling_baseline), None)
            if base is None or base.kind != "train" or position[base.name] >= i:
                where = str(ctx.error(steps_at[step.name], ""))[:-2]
                raise RunbookError(f"{where}: scaling_baseline {step.scaling_baseline!r} must name an earlier "
                                   "train step")
        values = list(step.launch.env.values()) + [v for v in step.launch.args.values() if isinstance(v, str)]
        for value in values:
            for ref, section, key in REF_RE.findall(value):
                target = next((s for s in order if s.name == ref), None)
                path = steps_at[step.name]
                err = ctx.error(path, "")
                where = str(err)[:-2]  # "file:line: phases[i].steps[j]"
                if target is None or target.kind != "sweep":
                    raise RunbookError(f"{where}: ${{{ref}.winner...}} must name a sweep step")
                if position[ref] >= i:
                    raise RunbookError(f"{where}: refers to {ref}, which runs later")
                if f"{section}.{key}" not in target.matrix:
                    raise RunbookError(f"{where}: {ref} does not sweep {section}.{key}")


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
