"""Runbook YAML: the declarative form of a validation runbook, validated completely before anything runs.

    name: ddp_2xa100
    description: ...
    requirements: {gpus: 2, min_cuda_capability: 8.0, min_gpu_memory_gb: 70, backend: nccl}  # memory in GiB
    defaults:                      # every step inherits these (a step's own values win; env/args are merged)
      config: configs/m7c_125m_2xa100_production.yaml
      env: {NSA_PREFILL_BATCHED: "1"}
      args: {dataset: synthetic}
      nproc_per_node: 2
      master_port: auto            # auto (a free port, retried on a clash) or a number
      timeout_s: 3600
      stall_timeout_s: 600         # heartbeat silence that makes a step a HANG (3x inside one long call: a
                                   # checkpoint load or save, a compilation, a graph capture)
      window: 50                   # statistics over the last N steps ...
      warmup_steps: 5              # ... after excluding the first ones
      on_failure: continue         # continue (default) or stop: a failed step ends the run, the rest are skipped
      retry_disturbed: 1           # ab, sweep, triage: a repeat other work disturbed is run again (0: never)
    recommend: {env: {NSA_PREFILL_BATCHED: "1"}}   # settings always recommended (winners are added)
    compare: {run_sd: 0.06, launch_sd: 0.12, pairs: 30}   # how two runs of it differ when nothing changed
    phases:
      - name: baseline
        title: Baseline DDP throughput
        steps:
          - {name: baseline, kind: train, env: {NSA_DDP_COMPRESS: bf16}, args: {ddp: 1, steps: 300}}
    acceptance:
      - {name: throughput, expr: "baseline.toks_per_s.mean >= 39", target: ">= 39 tokens/s", severity: fail}

Step kinds and their own keys come from the step registry (validation.kinds; `nsa-validate kinds` prints the
table): each kind module validates its own keys into `step.options` (read as attributes: `step.matrix`).

Every step kind also takes `on_failure: continue | stop` (default from defaults, else continue): with stop, a step
that ends failed, timeout, hang or error ends the run there and the remaining steps are recorded as skipped.

Values may reference an earlier sweep's winner: "${bucket_sweep.winner.env.NSA_DDP_BUCKET_MB}".
Nothing in a runbook chooses where files are written: the run directory is DEFAULT_RUNS/<name>-<time> (the runbook's
name is one file name: letters, digits, _, - and ., not starting with .), every output goes under RUN_DIR/<step name>
(names are identifiers, so never `..` or an absolute path), the trainer's --out-dir/--resume cannot be set (args or a
sweep matrix), and pytest_args cannot redirect pytest's own output files.
Before anything runs (`plan` and `run`, load_runbook), beyond each key's type: every NSA_* environment name and value
against nsa.toggles (in env mappings and in every planned launch: sweep and scan values of env.X too), every metric
a criterion reads against the names its step's kind declares (StepKind.metrics), a step status it compares with a
string against the statuses a step can have, criterion names unique, and every ${...} reference to a step
(reference_problem). Where the files are (`cwd`: plan and run), every trainer launch's values as nsa-train
would resolve them against its config file (check_trainer_values: `steps: -5`, a warm-up longer than the run).
Environment values are text, passed as written: an unquoted value that YAML reads as anything else (010 as 8, 1.10
as 1.1, yes/on/true as a boolean, nothing/~/null as null, 2024-01-01 as a date), in an env mapping or as a sweep's
or scan's value of env.X, is an error naming its line (quote it); `--set KEY.env.X=VALUE` passes VALUE as typed.
Every error names the file, the key path and the line (validation.runbook.schema), e.g.
    runbooks/x.yaml:14: phases[1].steps[0].kind: 'trian' is not one of snapshot, train, ...
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import hashlib
import re
from pathlib import Path
from typing import Any

import yaml

from nsa.training.config import (YAML_ERRORS, ConfigError, DuplicateKeyError, RunConfig, UsageError, apply_overrides,
                                 load_config)
from nsa.training.config import brief as _brief
from nsa.training.flags import flag_specs, overrides as flag_overrides
from nsa import toggles
from validation import kinds as step_kinds
from validation.runbook.expressions import ExpressionError, compile_expression
from validation.runbook.includes import expand_includes
from validation.launch.slurm import validate_sbatch_line
from validation.runbook.overrides import apply_override, override_notes
from validation.results.model import SEVERITIES, STEP_STATUSES
from validation.runbook.model import (REF_RE, Criterion, LaunchSettings, Launcher, Overridden, Phase, Requirements,
                                      Runbook, Step, references, resolve_references)
from validation.runbook.schema import (NAME_RE, Ctx, EnvTextError, Included, RunbookError, env_problem, env_vars,
                                       mapping, parse_yaml, printable, show, str_list, trainer_flags, typed)
from validation.kinds.base import BASE_KEYS, LAUNCH_KEYS, check_metric_reference, mapping_reference

ON_FAILURE = ("continue", "stop")
BACKENDS = ("nccl", "gloo")
# Anything that looks like a reference to a step (${name. ...}), well formed or not: checked before anything runs.
# A shell-style ${HOME} (no dot) is left alone.
REF_LIKE_RE = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\.[^}\s]*\}?")

__all__ = ["RunbookError", "load_runbook", "apply_override", "check_inputs", "Runbook", "Overridden", "Step", "Phase", "Criterion", "Requirements", "Launcher",
           "LaunchSettings", "resolve_references", "references"]


# ---------------------------------------------------------------------- the model's values (its types: runbook_model)
LAUNCHERS = ("torchrun", "slurm")
RDZV_BACKENDS = ("c10d", "static")
LAUNCHER_KEYS = ("type", "rdzv_backend", "rdzv_endpoint", "partition", "account", "time_limit", "gpus_per_node",
                 "cpus_per_task", "sbatch")
_ENDPOINT_RE = re.compile(r"[A-Za-z0-9_.-]+:[0-9]{1,5}")
_TIME_LIMIT_RE = re.compile(r"\d+|\d+:\d\d(:\d\d)?|\d+-\d+(:\d\d(:\d\d)?)?")
_SLURM_NAME_RE = re.compile(r"[A-Za-z0-9_.,-]+")
# A runbook's name names its run directory (DEFAULT_RUNS/<name>-<time>): one path component, never `.`, `..` or hidden
RUNBOOK_NAME_MAX = 200  # + "-YYYYmmdd-HHMMSS" stays within a file name's 255 bytes
STEP_NAME_MAX = 100  # RUN_DIR/<step>/...: with its launches' suffixes, within a file name's 255 bytes
# timeout_s and stall_timeout_s at most: a wait on a launch's processes through poll() takes at most 2**31 - 1 ms
# (subprocess.run(timeout=...) raises OverflowError beyond it, and 1e50 past any clock); about 24.8 days
TIMEOUT_MAX_S = (2**31 - 1) // 1000
COMPARE_SD_MAX = 1.0  # compare.run_sd / launch_sd: sds of log-ratios; 1.0 (a factor e) already resolves nothing
RUNBOOK_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


# ---------------------------------------------------------------------- reading
def load_runbook(path: str | Path, overrides: list[str] | None = None, cwd: str | Path | None = None) -> Runbook:
    """Read, override (--set key=value, see ``apply_override``) and validate a runbook file. With `cwd` (the
    directory the run starts in), every file the runbook names is checked to exist there too: trainer configs
    (which must also parse), test paths, benchmark scripts (``check_inputs``)."""
    path = Path(path)
    try:  # is_file raises too: PermissionError for a directory on the way that may not be searched
        text = path.read_text(encoding="utf-8") if path.is_file() else None
    except (OSError, UnicodeDecodeError) as exc:
        raise RunbookError(f"{path}: cannot read ({exc})") from None
    if text is None:
        raise RunbookError(f"{path}: runbook file not found")
    try:
        raw, lines = parse_yaml(text)
    except (DuplicateKeyError, EnvTextError) as exc:
        raise RunbookError(f"{path}:{exc.line}: {show(exc.path) or '(top level)'}: {exc}") from None
    except YAML_ERRORS as exc:
        problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
        raise RunbookError(f"{path}:{_yaml_error_line(exc, text)}: not valid YAML ({problem})") from None
    if raw is None:  # no document, or only comments
        raise RunbookError(f"{path}:1: (top level): the runbook is empty (expected a mapping with name and phases)")
    raw, lines, included = expand_includes(raw, lines, path, load_runbook)  # `- include: FILE` phase items
    ctx = Ctx(str(path), lines)
    file_raw = copy.deepcopy(raw)  # the file's own values, before any --set
    for item in overrides or []:
        raw = apply_override(raw, item, ctx)
    # surrogatepass: a --set value from a non-UTF-8 command line holds lone surrogates
    sha = hashlib.sha256(text.encode() + "".join(included).encode()
                         + "\n".join(overrides or []).encode(errors="surrogatepass")).hexdigest()
    rb = _build_runbook(raw, ctx, str(path), sha)
    if cwd is not None:
        check_inputs(rb, Path(cwd), ctx, raw)
    kinds = {s.name: s.kind_impl for s in rb.steps()}
    return dataclasses.replace(rb, overridden=override_notes(kinds, file_raw, ctx))


_LINE_BREAK_RE = re.compile("\r\n|[\r\n\x85\u2028\u2029]")  # YAML's line breaks, as PyYAML's marks count them


def _yaml_error_line(exc: BaseException, text: str) -> int | str:
    """The 1-based line of `text` that a PyYAML error is about: its mark; for a character YAML refuses (a control
    character), its position; for a value PyYAML reads but cannot build (an integer past Python's 4,300 digits, the
    date 2024-13-45: a ValueError with no mark), the first scalar that fails to build. "?" when none is known."""
    mark = getattr(exc, "problem_mark", None)
    if mark is not None:
        return mark.line + 1
    if isinstance(exc, yaml.reader.ReaderError) and isinstance(exc.position, int):
        return len(_LINE_BREAK_RE.findall(text[:exc.position])) + 1
    loader = yaml.SafeLoader(text)
    try:
        stack, seen = [loader.get_single_node()], set()
        while stack:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            if isinstance(node, yaml.ScalarNode):
                try:
                    loader.construct_object(node)
                except YAML_ERRORS:
                    return node.start_mark.line + 1
            elif isinstance(node, yaml.MappingNode):
                stack.extend(reversed([part for pair in node.value for part in pair]))
            elif isinstance(node, yaml.SequenceNode):
                stack.extend(reversed(node.value))
    except YAML_ERRORS:
        pass
    finally:
        loader.dispose()
    return "?"


def _launcher(value: Any, path: tuple, ctx: Ctx, base: Launcher) -> Launcher:
    """`launcher: slurm` or `launcher: {type: slurm, partition: ..., ...}`; keys not given are inherited."""
    if value is None:
        return base
    if isinstance(value, str):
        value = {"type": value}
    raw = mapping(value, path, ctx, LAUNCHER_KEYS)

    def get(key, kind, **kw):
        return typed(raw[key], kind, path + (key,), ctx, **kw) if key in raw else getattr(base, key)

    def name(key):
        v = get(key, str, optional=True)
        if v is not None and not _SLURM_NAME_RE.fullmatch(v):
            raise ctx.error(path + (key,), f"{_brief(v)}: letters, digits and _.,- only")
        return v

    endpoint = get("rdzv_endpoint", str, optional=True)
    if endpoint is not None and not (_ENDPOINT_RE.fullmatch(endpoint)
                                     and 1 <= int(endpoint.rsplit(":", 1)[1]) <= 65535):
        raise ctx.error(path + ("rdzv_endpoint",),
                        f"expected host:port (a port from 1 to 65535), got {_brief(endpoint)}")
    if isinstance(raw.get("time_limit"), (int, float)) and not isinstance(raw.get("time_limit"), bool):
        raise ctx.error(path + ("time_limit",), f"quote it, e.g. \"30\" (minutes) or \"01:30:00\": YAML reads an "
                                                f"unquoted 1:30:00 as the number 5400, got {_brief(raw['time_limit'])}")
    time_limit = get("time_limit", str, optional=True)
    if time_limit is not None and not _TIME_LIMIT_RE.fullmatch(time_limit):
        raise ctx.error(path + ("time_limit",), f"{_brief(time_limit)}: Slurm's format, e.g. 30, 01:30:00 or "
                                                "1-00:00:00")
    sbatch = tuple(str_list(raw["sbatch"], path + ("sbatch",), ctx)) if "sbatch" in raw else base.sbatch
    for i, line in enumerate(sbatch):
        problem = validate_sbatch_line(line)
        if problem:
            raise ctx.error(path + ("sbatch", i), f"{_brief(line)}: {problem}")
    return Launcher(type=get("type", str, choices=LAUNCHERS), rdzv_backend=get("rdzv_backend", str,
                                                                                 choices=RDZV_BACKENDS),
                    rdzv_endpoint=endpoint, partition=name("partition"), account=name("account"),
                    time_limit=time_limit, gpus_per_node=get("gpus_per_node", int, minimum=0),
                    cpus_per_task=get("cpus_per_task", int, minimum=1, optional=True), sbatch=sbatch)


def _launch(raw: dict, path: tuple, ctx: Ctx, base: LaunchSettings) -> LaunchSettings:
    def get(key, kind, **kw):
        return typed(raw[key], kind, path + (key,), ctx, **kw) if key in raw else getattr(base, key)

    master_port = raw.get("master_port", base.master_port)
    if master_port != "auto" and (isinstance(master_port, bool) or not isinstance(master_port, int)
                                  or not 1024 <= master_port <= 65535):
        raise ctx.error(path + ("master_port",), f"must be 'auto' or a port number 1024-65535, "
                                                 f"got {_brief(master_port)}")
    return LaunchSettings(
        config=get("config", str, optional=True),
        env={**base.env, **env_vars(raw.get("env"), path + ("env",), ctx)},
        args={**base.args, **trainer_flags(raw.get("args"), path + ("args",), ctx)},
        nproc_per_node=get("nproc_per_node", int, minimum=1),
        master_port=master_port,
        port_retries=get("port_retries", int, minimum=0),
        timeout_s=_seconds(get("timeout_s", float, minimum=1), path + ("timeout_s",), ctx),
        stall_timeout_s=_seconds(get("stall_timeout_s", float, minimum=1), path + ("stall_timeout_s",), ctx),
        window=get("window", int, minimum=1),
        warmup_steps=get("warmup_steps", int, minimum=0),
        launcher=_launcher(raw.get("launcher"), path + ("launcher",), ctx, base.launcher),
        nnodes=get("nnodes", int, minimum=1),
        retry_disturbed=get("retry_disturbed", int, minimum=0),
    )


def _seconds(value: float, path: tuple, ctx: Ctx) -> float:
    """A launch's timeout_s or stall_timeout_s, at most TIMEOUT_MAX_S: a longer one is a RunbookError (a launch
    waits on its processes with it: a snapshot's tools through subprocess.run, which cannot wait longer)."""
    if value > TIMEOUT_MAX_S:
        raise ctx.error(path, f"must be at most {TIMEOUT_MAX_S:,} s (about 24.8 days, the longest wait a launch "
                              f"can make), got {_brief(value)}")
    return value


def _requirements(raw: Any, path: tuple, ctx: Ctx, base: Requirements | None = None) -> Requirements:
    raw = mapping(raw, path, ctx, ("gpus", "min_cuda_capability", "min_gpu_memory_gb", "backend"))
    base = base or Requirements()

    def get(key, kind, **kw):
        return typed(raw[key], kind, path + (key,), ctx, **kw) if key in raw else getattr(base, key)

    return Requirements(gpus=get("gpus", int, minimum=0),
                        min_cuda_capability=get("min_cuda_capability", float, minimum=0, optional=True),
                        min_gpu_memory_gb=get("min_gpu_memory_gb", float, minimum=0, optional=True),
                        backend=get("backend", str, choices=BACKENDS, optional=True))




def _step(raw: Any, path: tuple, ctx: Ctx, phase: str, defaults: LaunchSettings, reqs: Requirements,
          on_failure: str = "continue") -> Step:
    if not isinstance(raw, dict):
        raise ctx.error(path, "a step must be a mapping with at least name and kind")
    if "kind" not in raw:
        raise ctx.error(path, f"missing required key 'kind' (one of {', '.join(step_kinds.names())})")
    kind = step_kinds.find(raw.get("kind"))
    if kind is None:
        broken = step_kinds.load_errors().get(raw.get("kind")) if isinstance(raw.get("kind"), str) else None
        raise ctx.error(path + ("kind",), f"{_brief(raw.get('kind'))} is not one of {', '.join(step_kinds.names())}"
                        + (f" (a kind of that name did not load: {broken})" if broken else ""))
    mapping(raw, path, ctx, kind.allowed_keys(), required=("name", "kind"))
    name = typed(raw["name"], str, path + ("name",), ctx)
    if not NAME_RE.fullmatch(name) or len(name) > STEP_NAME_MAX:
        raise ctx.error(path + ("name",), f"{_brief(name)}: step names are identifiers (letters, digits, _) so "
                                          f"acceptance expressions can use them, of at most {STEP_NAME_MAX} "
                                          "characters: a step's name names its directory in the run")
    own = {k: v for k, v in raw.items() if k not in BASE_KEYS and k not in LAUNCH_KEYS}
    return Step(name=name, kind=kind.name, phase=phase,
                title=typed(raw.get("title", name), str, path + ("title",), ctx),
                description=typed(raw.get("description", ""), str, path + ("description",), ctx),
                launch=_launch(raw, path, ctx, defaults),
                # a host-only kind (snapshot, tests) needs none of the runbook's devices: only its own `requires`
                requires=_requirements(raw.get("requires"), path + ("requires",), ctx,
                                       Requirements() if kind.host_only else reqs),
                optional=typed(raw.get("optional", False), bool, path + ("optional",), ctx),
                on_failure=typed(raw.get("on_failure", on_failure), str, path + ("on_failure",), ctx,
                                 choices=ON_FAILURE),
                options=kind.parse(own, path, ctx), kind_impl=kind)


def _compare_noise(value: Any, ctx: Ctx) -> dict[str, float] | None:
    """The runbook's `compare` mapping: how two runs of it on its machine differ when nothing changed, measured with
    benchmarks/bench_aa_compare.py: run_sd (the sd of the change common to every step, log(B/A)), launch_sd (the sd
    of one launch's log(B/A)), pairs (the A/A pairs they come from, at least 2). `compare` holds its noise to at
    least these (validation.report.compare.declared_noise). None when absent."""
    if value is None:
        return None
    raw = mapping(value, ("compare",), ctx, ("run_sd", "launch_sd", "pairs"), required=("pairs",))
    if "run_sd" not in raw and "launch_sd" not in raw:
        raise ctx.error(("compare",), "expected run_sd, launch_sd or both (with pairs)")
    pairs = typed(raw["pairs"], int, ("compare", "pairs"), ctx, minimum=2)
    try:
        out: dict[str, float] = {"pairs": float(pairs)}
    except OverflowError:  # an integer past a float's range (10**400)
        raise ctx.error(("compare", "pairs"), f"number too large, got {_brief(pairs)}") from None
    for key in ("run_sd", "launch_sd"):
        if key in raw:
            sd = typed(raw[key], float, ("compare", key), ctx, minimum=0.0)
            if sd >= COMPARE_SD_MAX:
                raise ctx.error(("compare", key), f"must be below {COMPARE_SD_MAX:g} (the sd of a log-ratio: 0.06 = "
                                                  f"6%), got {sd:g}")
            out[key] = sd
    return out


def _build_runbook(raw: Any, ctx: Ctx, path: str, sha: str) -> Runbook:
    raw = mapping(raw, (), ctx, ("name", "description", "requirements", "defaults", "phases", "acceptance",
                                  "recommend", "compare"), required=("name", "phases"))
    name = typed(raw["name"], str, ("name",), ctx)
    if not RUNBOOK_NAME_RE.fullmatch(name) or len(name) > RUNBOOK_NAME_MAX:
        raise ctx.error(("name",), f"{_brief(name)}: runbook names are one file name (letters, digits, _, - and ., "
                                   f"not starting with ., at most {RUNBOOK_NAME_MAX} characters): it names the run "
                                   "directory, <name>-<time>")
    reqs = _requirements(raw.get("requirements"), ("requirements",), ctx)
    defaults_raw = mapping(raw.get("defaults"), ("defaults",), ctx, LAUNCH_KEYS + ("on_failure",))
    defaults = _launch(defaults_raw, ("defaults",), ctx, LaunchSettings())
    on_failure = typed(defaults_raw.get("on_failure", "continue"), str, ("defaults", "on_failure"), ctx,
                        choices=ON_FAILURE)
    recommend = mapping(raw.get("recommend"), ("recommend",), ctx, ("env",))
    compare_noise = _compare_noise(raw.get("compare"), ctx)
    phases_raw = raw["phases"]
    if not isinstance(phases_raw, list) or not phases_raw:
        raise ctx.error(("phases",), "expected a non-empty list of phases")
    phases, seen = [], {}
    for i, praw in enumerate(phases_raw):
        ppath = ("phases", i)
        p = mapping(praw, ppath, ctx, ("name", "title", "description", "steps"), required=("name", "steps"))
        pname = typed(p["name"], str, ppath + ("name",), ctx)
        if not NAME_RE.fullmatch(pname):
            raise ctx.error(ppath + ("name",), f"{pname!r}: phase names are identifiers")
        first = next((k for k, other in enumerate(phases) if other.name == pname), None)
        if first is not None:  # --only, --skip, --reuse and --set phases.NAME name phases by name
            raise ctx.error(ppath + ("name",), f"duplicate phase name {pname!r} (first at "
                                               f"{ctx.position(('phases', first, 'name'))})")
        if not isinstance(p["steps"], list) or not p["steps"]:
            raise ctx.error(ppath + ("steps",), "expected a non-empty list of steps")
        steps = []
        for j, sraw in enumerate(p["steps"]):
            step = _step(sraw, ppath + ("steps", j), ctx, pname, defaults, reqs, on_failure)
            if step.name in seen:
                raise ctx.error(ppath + ("steps", j, "name"), f"duplicate step name {step.name!r} "
                                                              f"(first at {ctx.position(seen[step.name] + ('name',))})")
            seen[step.name] = ppath + ("steps", j)
            steps.append(step)
        phases.append(Phase(pname, typed(p.get("title", pname), str, ppath + ("title",), ctx),
                            typed(p.get("description", ""), str, ppath + ("description",), ctx), steps))
    _check_references(phases, ctx, seen)
    _check_launches(phases, ctx, seen, raw)
    steps_by_name = {s.name: s for p in phases for s in p.steps}
    acceptance: list[Criterion] = []
    if not isinstance(raw.get("acceptance") or [], list):
        raise ctx.error(("acceptance",), f"expected a list of criteria, got {type(raw['acceptance']).__name__}")
    for i, craw in enumerate(raw.get("acceptance") or []):
        cpath = ("acceptance", i)
        c = mapping(craw, cpath, ctx, ("name", "expr", "target", "severity", "description"),
                     required=("name", "expr"))
        expr_text = typed(c["expr"], str, cpath + ("expr",), ctx)
        try:
            expr = compile_expression(expr_text)
        except ExpressionError as exc:
            raise ctx.error(cpath + ("expr",), str(exc)) from None
        unknown = sorted(n for n in expr.names if n not in seen)
        if unknown:
            raise ctx.error(cpath + ("expr",), f"refers to unknown step(s) {', '.join(unknown)} "
                                               f"(steps: {', '.join(seen)})")
        for step_name, key_path in expr.paths:  # each metric it reads is one its step's kind produces
            problem = check_metric_reference(steps_by_name[step_name], key_path)
            if problem:
                raise ctx.error(cpath + ("expr",), problem)
        for step_name, key_path in expr.numeric_paths:  # a number, not a mapping of figures: known before any run
            below = mapping_reference(steps_by_name[step_name], key_path)
            if below:
                shown = ".".join([step_name, *(f"[{k}]" if isinstance(k, int) else str(k) for k in key_path)])
                raise ctx.error(cpath + ("expr",), f"{shown.replace('.[', '[')} is not a figure but a mapping of "
                                                   f"{', '.join(below)}: compare one of them, e.g. "
                                                   f"{shown.replace('.[', '[')}."
                                                   f"{'mean' if 'mean' in below else below[0]}")
        for step_name, key_path, text in expr.compared_strings:  # `crash.status != 'faild'` would always hold
            if key_path == ("status",) and text not in STEP_STATUSES:
                raise ctx.error(cpath + ("expr",), f"{step_name}.status is never {text!r} (a step's status is one "
                                                   f"of {', '.join(STEP_STATUSES)})")
        cname = typed(c["name"], str, cpath + ("name",), ctx)
        first = next((j for j, other in enumerate(acceptance) if other.name == cname), None)
        if first is not None:  # the verdict, the report, JUnit and --set acceptance.NAME name criteria by name
            where, other = cpath + ("name",), ("acceptance", first, "name")
            if ctx.override_for(other) is not None and ctx.override_for(where) is None:  # the --set made it
                where, other = other, where
            # one an include brought is in another file: named there ("inner.yaml:7: acceptance[0] (included at ...)")
            also = (ctx.position(other[:2]) if isinstance(ctx.lines.get(other[:2]), Included)
                    else show(ctx.own_path(other[:2])))
            raise ctx.error(where, f"duplicate criterion name {cname!r} (also at {also})")
        acceptance.append(Criterion(
            name=cname, expr=expr,
            target=typed(c.get("target", expr_text), str, cpath + ("target",), ctx),
            severity=typed(c.get("severity", "fail"), str, cpath + ("severity",), ctx, choices=SEVERITIES),
            description=typed(c.get("description", ""), str, cpath + ("description",), ctx)))
    return Runbook(name=name, description=typed(raw.get("description", ""), str, ("description",), ctx),
                   path=path, sha256=sha, requirements=reqs, defaults=defaults, phases=phases,
                   acceptance=acceptance, recommend_env=env_vars(recommend.get("env"), ("recommend", "env"), ctx),
                   compare_noise=compare_noise)


def check_inputs(rb: Runbook, cwd: Path, ctx: Ctx, raw: dict) -> None:
    """Before anything runs: every file the runbook names exists relative to `cwd` (the run's working directory):
    each trainer config (and it parses: nsa.training.config), each file a kind's own keys name
    (StepKind.input_files: test paths, benchmark scripts); then every trainer launch's values as nsa-train would
    resolve them (check_trainer_values). Raises RunbookError naming file, line and key."""
    configs: dict[str, RunConfig] = {}
    for i, phase in enumerate(rb.phases):
        for j, step in enumerate(phase.steps):
            spath = ("phases", i, "steps", j)
            own = raw["phases"][i]["steps"][j]
            if "config" in step.kind_impl.launch_keys and step.launch.config and step.launch.config not in configs:
                where = spath + ("config",) if "config" in own else ("defaults", "config")
                config = Path(step.launch.config)
                full = config if config.is_absolute() else Path(cwd) / config
                if not full.is_file():
                    raise ctx.error(where, f"config file {step.launch.config} not found (in {cwd})")
                try:
                    configs[step.launch.config] = load_config(full)
                except (ConfigError, OSError, ValueError) as exc:
                    raise ctx.error(where, f"config file {step.launch.config} is invalid: {exc}") from None
            if step.launch.config in configs:
                check_trainer_values(step, configs[step.launch.config], ctx, raw, spath)
            for key_path, name in step.kind_impl.input_files(step):
                file = Path(name)
                if not (file if file.is_absolute() else Path(cwd) / file).exists():
                    raise ctx.error(spath + tuple(key_path), f"{name}: no such file or directory (in {cwd})")


TRAINER_MODULE = ("-m", "nsa.training")  # a trainer launch's argv: [python, -m, nsa.training, --config, ...]


def check_trainer_values(step: Step, config: RunConfig, ctx: Ctx, raw: dict, spath: tuple) -> None:
    """Every trainer launch of `step` (its plan: sweep points, A/B variants, scan values, ...) with its flags applied
    to its config file (`config`, read already) as nsa-train applies them (nsa.training.cli.resolve_config: the flags'
    config keys, then the config's own validation): a value the trainer would refuse (`steps: -5`, `lr: 0`, two
    exclusive flags) is a RunbookError naming the runbook key that gives it, not a launch that fails. Then the
    statistics window: `warmup_steps` must leave at least one of the trainer's steps to measure (a window longer
    than the steps left is measured short, as the report says). A flag holding a ${step.winner...} reference is
    left out (its value is known only when the run gets there)."""
    specs = flag_specs()
    for spec in step.kind_impl.launches(step, None, None):
        argv = [str(a) for a in spec.argv]
        at = next((k for k in range(len(argv) - 1) if tuple(argv[k:k + 2]) == TRAINER_MODULE), None)
        if at is None:
            continue
        given = _trainer_flags(argv[at + 2:], specs)
        if given.get("config") != step.launch.config:
            continue  # not the step's config file (a kind's own): nothing read to check against
        launch = f"launch {spec.label}: " if spec.label else ""
        try:
            cfg = apply_overrides(config, flag_overrides(argparse.Namespace(**given), specs), "nsa-train")
        except (ConfigError, UsageError, ValueError) as exc:
            problem = str(exc).removeprefix("nsa-train: ")
            flag = _named_flag(problem, given, specs)
            where = _locate(raw, spath, _arg_key(flag)) if flag else _locate(raw, spath, _arg_key(None))
            raise ctx.error(where, f"{launch}nsa-train would refuse this (with {step.launch.config}): {problem}"
                            ) from None
        if "window" in step.kind_impl.launch_keys and step.launch.warmup_steps >= cfg.train.steps:
            source = (f"{show(_locate(raw, spath, _arg_key('steps')))}: {given['steps']}" if "steps" in given else
                      f"train.steps of {step.launch.config}")
            where = _locate(raw, spath, lambda path, node: path[-1:] == ("warmup_steps",))
            raise ctx.error(where, f"{launch}warmup_steps {step.launch.warmup_steps} leaves no step to measure: the "
                                   f"trainer runs {cfg.train.steps} steps ({source}); warmup_steps must be below "
                                   f"{cfg.train.steps}")


def _trainer_flags(tokens: list[str], specs: dict) -> dict[str, Any]:
    """{flag dest: value} of a trainer launch's argv after `-m nsa.training`, as nsa-train's parser reads it; a
    value holding a ${...} reference, or one that does not parse (trainer_flags has said so already), left out."""
    out: dict[str, Any] = {}
    k = 0
    while k < len(tokens):
        spec = specs.get(tokens[k][2:]) if tokens[k].startswith("--") else None
        k += 1
        if spec is None:
            continue
        if spec.switch:
            out[spec.dest] = True
            continue
        if k >= len(tokens):
            break
        value, k = tokens[k], k + 1
        if "${" in value:
            continue
        try:
            out[spec.dest] = spec.type(value)
        except (TypeError, ValueError, OverflowError):
            continue
    return out


def _named_flag(problem: str, given: dict[str, Any], specs: dict) -> str | None:
    """The flag of `given` (by dest) that `problem` (nsa-train's refusal of the resolved config) names first: by its
    config key ("train.steps must be positive" -> steps) or as a flag ("--fsdp and --ddp 1 are exclusive" -> fsdp);
    None when it names none of them (the config file's own value)."""
    found = []
    for dest in given:
        spec = specs.get(dest.replace("_", "-"))
        if spec is None:
            continue
        patterns = [rf"--{re.escape(spec.name)}(?![\w-])"]
        for key in ((spec.key,) if spec.key else ()) + tuple(spec.implies):
            section, _, field = key.partition(".")  # named as "section.field" or "SomeConfig.field"
            patterns.append(rf"(?<![\w.])(?:{re.escape(section)}|\w*Config)\.{re.escape(field)}(?!\w)")
        hits = [m.start() for p in patterns for m in [re.search(p, problem)] if m]
        if hits:
            found.append((min(hits), dest))
    return min(found)[1] if found else None


def _arg_key(dest: str | None):
    """A _locate test for the runbook key that gives trainer flag `dest` (args.x, a sweep's or scan's args.x, a
    variant's x under args); with None, the step's args (or its own key, when none)."""
    if dest is None:
        return lambda path, node: path[-1:] == ("args",)
    names = {dest, dest.replace("_", "-"), f"args.{dest}", f"args.{dest.replace('_', '-')}"}
    return lambda path, node: bool(path) and path[-1] in names and (path[-1].startswith("args.")
                                                                     or "args" in path[:-1])


def _check_references(phases: list[Phase], ctx: Ctx, steps_at: dict[str, tuple]) -> None:
    """Each kind's own cross-step checks (e.g. a train step's scaling_baseline), once every step is read; the
    ${step.winner...} references are checked with the launches (_check_launches)."""
    order = [s for p in phases for s in p.steps]
    for step in order:
        where = str(ctx.error(steps_at[step.name], ""))[:-2]  # "file:line: phases[i].steps[j]"
        step.kind_impl.check(step, order, lambda message: RunbookError(f"{where}: {message}"))


def reference_problem(text: str, step: Step, order: list[Step]) -> str | None:
    """Why `text` (one "${...}" of a value of `step`) cannot be resolved when the step launches, or None: it must
    read ${STEP.winner.env.VARIABLE} or ${STEP.winner.args.flag} of an earlier step whose winner carries that key."""
    match = REF_RE.fullmatch(text)
    if match is None:
        parts = text[2:].rstrip("}").split(".")
        names = [s.name for s in order]
        if not text.endswith("}"):
            hint = "it has no closing }"
        elif parts[0] not in names:
            near = difflib.get_close_matches(parts[0], names, n=3)
            hint = f"no step is named {parts[0]}" + (f" (did you mean {' or '.join(near)}?)" if near else "")
        elif len(parts) < 2 or parts[1] != "winner":
            hint = f"{parts[1] if len(parts) > 1 else 'nothing'} after the step name, where winner belongs"
        else:
            hint = "after winner comes env.VARIABLE or args.flag"
        return (f"{text} is not a reference nsa-validate can resolve ({hint}); references read "
                "${STEP.winner.env.VARIABLE} or ${STEP.winner.args.flag}")
    ref, section, key = match.groups()
    position = {s.name: i for i, s in enumerate(order)}
    target = next((s for s in order if s.name == ref), None)
    winner_keys = target.kind_impl.winner_params(target) if target is not None else None
    if target is None:
        near = difflib.get_close_matches(ref, list(position), n=3)
        return (f"${{{ref}.winner...}} must name a sweep step: no step is named {ref}"
                + (f" (did you mean {' or '.join(near)}?)" if near else ""))
    if winner_keys is None:
        return f"${{{ref}.winner...}} must name a sweep step ({ref} is a {target.kind} step)"
    if ref == step.name:
        return f"refers to {ref}'s own winner, which is known only once {ref} has run"
    if position[ref] > position[step.name]:
        return f"refers to {ref}, which runs later"
    if f"{section}.{key}" not in winner_keys:
        return f"{ref} does not sweep {section}.{key}"
    return None


def _check_launches(phases: list[Phase], ctx: Ctx, steps_at: dict[str, tuple], raw: dict) -> None:
    """Before anything runs, every launch of every step as the plan builds it (what runs): first that no environment
    value or argument holds a NUL (a launch holding one cannot start), then each environment variable (an NSA_* name
    and its value against nsa.toggles, so also a sweep's or a scan's values of env.X and what a kind sets), then
    each ${...} reference to a step in a launch's environment and command line: it must read ${STEP.winner.env.X}
    of an earlier sweep that sweeps X (reference_problem). The error names the runbook key the value comes from."""
    order = [s for p in phases for s in p.steps]
    launches = [(step, spec) for step in order for spec in step.kind_impl.launches(step, None, None)]
    for step, spec in launches:  # no environment or command line can carry a NUL: the launch would fail to start
        if any("\0" in str(value) for value in [*spec.env.values(), *spec.argv]):
            where = _locate(raw, steps_at[step.name], lambda path, node: isinstance(node, str) and "\0" in node)
            raise ctx.error(where, (f"launch {printable(spec.label)}: " if spec.label else "") + "holds a NUL (\\0), "
                            "which no process's environment or command line can carry")
        for name, value in spec.env.items():
            problem = env_problem(name, value)
            if problem:
                where = _locate(raw, steps_at[step.name],
                                lambda path, node: bool(path) and path[-1] in (name, f"env.{name}"))
                raise ctx.error(where, (f"launch {spec.label}: " if spec.label else "") + problem)
        # each variable parses: the launch's whole environment must too (a pair may contradict); a value still to
        # come from a winner is left out
        problem = toggles.combination_problem({k: v for k, v in spec.env.items() if "${" not in str(v)})
        if problem:
            names = [n for n in spec.env if n in problem]
            where = _locate(raw, steps_at[step.name], lambda path, node: bool(path) and path[-1] in (
                *names, *(f"env.{n}" for n in names)))
            raise ctx.error(where, (f"launch {spec.label}: " if spec.label else "") + problem)
    for step, spec in launches:
        for value in [*spec.env.values(), *spec.argv]:
            for ref in REF_LIKE_RE.findall(str(value)):
                problem = reference_problem(ref, step, order)
                if problem:
                    where = _locate(raw, steps_at[step.name], lambda path, node: isinstance(node, str) and ref in node)
                    raise ctx.error(where, problem)


def _locate(raw: dict, spath: tuple, wanted) -> tuple:
    """The key path of the first value under step `spath` (then under `defaults`) that `wanted(path, value)`
    accepts; the step's own path when none does."""
    def walk(node, path):
        if wanted(path, node):
            return path
        items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
        for key, value in items:
            found = walk(value, path + (key,))
            if found is not None:
                return found
        return None

    for base in (spath, ("defaults",)):
        node = raw
        try:
            for key in base:
                node = node[key]
        except (KeyError, IndexError, TypeError):
            continue
        found = walk(node, ())
        if found is not None:
            return base + found
    return spath
