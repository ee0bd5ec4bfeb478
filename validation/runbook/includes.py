"""Runbook includes: a phase list item `- include: FILE` stands for every phase of another runbook, so that one
runbook can be the first phase of another from one source (runbooks/gpu_kernels.yaml in h100_single.yaml).

    phases:
      - include: gpu_kernels.yaml      # a path relative to this runbook's directory (a symlink's target's)
      - name: throughput
        steps: [...]

The included runbook is read and validated on its own first (an error in it names its own file and line; so does
one found later in the expanded runbook, e.g. a config missing from the working directory, with the include item
that brought it: `inner.yaml:8: phases[0].steps[1].config (included at outer.yaml:4): ...`). Then,
before any --set is applied (so --set steps.NAME... reaches its steps too):
- its phases take the item's place, in order;
- its acceptance criteria come first, before this runbook's own; its `recommend.env` is added under this one's;
- each of its steps carries what its own runbook gave it: every launch setting of its `defaults` that the step
  does not set and its kind takes (env and args merged key by key, the step's own keys winning), and, for a kind
  that uses the runbook's devices (not host_only), its runbook's `requirements` as the step's `requires`. So a
  step runs with its own runbook's values wherever that runbook gives them (the same command, timeout and
  requirements in both runbooks); only what its own runbook leaves unset (a launch setting its defaults do not
  give, an env variable or trainer arg they do not name) comes from the including runbook's defaults, as for that
  runbook's own steps, and only there does a `--set defaults.KEY` of the including runbook reach it (the plan notes
  where it does not). gpu_kernels.yaml in h100_single.yaml differs only by h100_single's env variables, added:
  tests/validation/kinds/test_gpu_kernels.py checks that this is the only difference. An error about a value a step
  carries names the line of its own runbook's defaults that gives it (schema.Carried).
Its name, description and any key but phases, acceptance, recommend, defaults and requirements are not used.
Includes nest; a runbook that includes itself, directly or not (through a symlink too), is an error. A relative
include is read beside the runbook file itself: for a runbook reached through a symlink (the command line's, or an
include's), beside the link's target, so that one file means the same wherever a link to it lies.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Callable

from nsa.training.config import YAML_ERRORS
from validation import kinds as step_kinds
from validation.runbook.schema import Carried, Ctx, Included, RunbookError, parse_yaml, printable
from validation.kinds.base import LAUNCH_KEYS

KEY = "include"
REQUIREMENT_KEYS = ("gpus", "min_cuda_capability", "min_gpu_memory_gb", "backend")
_loading: list[Path] = []  # the runbooks being expanded, outermost first (a cycle check across nested loads)
# The included runbooks validate() has passed while the outermost one is expanded: each is checked on its own once.
# (Checking one expands its own includes, checking them; without this, a chain of n includes took 2**n checks.)
_validated: set[Path] = set()


def expand_includes(raw: Any, lines: dict[tuple, int], path: str | Path,
                    validate: Callable[[Path], Any]) -> tuple[Any, dict[tuple, int], list[str]]:
    """(raw with every `- include: FILE` phase item replaced, the key-path -> line map moved to match, the texts
    of the files included, for the runbook's hash). `validate(file)` reads and checks an included runbook on its
    own (validation.runbook.loader.load_runbook); `lines` maps key paths of `raw` to lines of `path`."""
    if not isinstance(raw, dict) or not isinstance(raw.get("phases"), list) \
            or not any(_is_include(p) for p in raw["phases"]):
        return raw, lines, []
    here = Path(path).resolve()
    if here in _loading:
        chain = " -> ".join(str(p) for p in [*_loading[_loading.index(here):], here])
        raise RunbookError(f"{path}: runbooks include each other in a cycle: {chain}")
    _loading.append(here)
    try:
        return _expand(raw, lines, path, validate)
    finally:
        _loading.pop()
        if not _loading:
            _validated.clear()


def _folder(path: str | Path) -> Path:
    """The directory an include of runbook `path` is relative to: the one the runbook file is in, a symlink to it
    followed (a runbook is its target, as the cycle check and the once-only validation take it: its includes mean
    the same wherever a link to it lies)."""
    path = Path(path)
    return path.resolve().parent if path.is_symlink() else path.parent


def _is_include(item: Any) -> bool:
    return isinstance(item, dict) and KEY in item


def _expand(raw: dict, lines: dict[tuple, int], path: str | Path, validate) -> tuple[dict, dict, list[str]]:
    ctx = Ctx(str(path), lines)
    raw = dict(raw)
    phases, criteria, texts, recommend = [], [], [], {}
    # (old phase index, new index, phases it became, for an include: its Ctx and the line of the item)
    moves: list[tuple[int, int, int, Ctx | None, str]] = []
    origins: list[tuple[Ctx, int, int, str]] = []  # criteria an include brought: (its Ctx, first, count, item)
    for i, item in enumerate(raw["phases"]):
        if not _is_include(item):
            moves.append((i, len(phases), 1, None, ""))
            phases.append(item)
            continue
        where = ("phases", i, KEY)
        extra = sorted(str(k) for k in item if k != KEY)
        if extra:
            raise ctx.error(("phases", i, extra[0]), f"an include item has only `{KEY}: FILE`")
        name = item[KEY]
        if not isinstance(name, str) or not name:
            raise ctx.error(where, "expected the path of a runbook, relative to this one's directory")
        file = Path(name) if Path(name).is_absolute() else _folder(path) / name
        shown = printable(name)  # messages are one line: a newline or a NUL in the name is shown escaped
        try:
            found = file.is_file()
            what = ("is a directory, not a runbook file" if not found and file.is_dir() else
                    "not a regular file (a device, pipe or socket); a runbook is a YAML file"
                    if not found and file.exists() else "no such runbook")
        except OSError as exc:  # a directory on the way it may not search (PermissionError)
            raise ctx.error(where, f"{shown}: cannot read ({exc})") from None
        if not found:
            raise ctx.error(where, f"{shown}: {what} (looked for {printable(str(file))})")
        if file.resolve() in _loading:
            chain = [*_loading[_loading.index(file.resolve()):], file.resolve()]
            raise ctx.error(where, f"{shown}: runbooks include each other in a cycle: "
                                   + " -> ".join(printable(str(p)) for p in chain))
        if file.resolve() not in _validated:
            validate(file)  # its own errors name its own file and line
            _validated.add(file.resolve())
        text, included, included_lines = _read(file)
        included, included_lines, nested = expand_includes(included, included_lines, file, validate)
        texts += [text, *nested]
        own = included.get("phases") or []
        at = f"{path}:{lines.get(('phases', i), '?')}"
        carried = [_carry_defaults(p, included, included_lines, ("phases", j))
                   for j, p in enumerate(copy.deepcopy(own))]
        moves.append((i, len(phases), len(own), Ctx(str(file), included_lines), at))
        phases += carried
        theirs = included.get("acceptance") or []
        origins.append((Ctx(str(file), included_lines), len(criteria), len(theirs), at))
        criteria += copy.deepcopy(theirs)
        recommend.update((included.get("recommend") or {}).get("env") or {})
    raw["phases"] = phases
    own_criteria, own_recommend = raw.get("acceptance") or [], raw.get("recommend") or {}
    if not isinstance(own_criteria, list):  # left for the runbook's own check to report
        criteria = []
    if criteria:
        raw["acceptance"] = criteria + own_criteria
    if recommend and isinstance(own_recommend, dict) and isinstance(own_recommend.get("env") or {}, dict):
        raw["recommend"] = {**own_recommend, "env": {**recommend, **(own_recommend.get("env") or {})}}
    return raw, _move_lines(lines, moves, len(criteria), origins), texts


def _read(file: Path) -> tuple[str, Any, dict[tuple, int]]:
    try:
        text = file.read_text(encoding="utf-8")
        data, lines = parse_yaml(text)
    except (OSError, UnicodeDecodeError, *YAML_ERRORS) as exc:  # validate() has read it: only a race gets here
        raise RunbookError(f"{file}: cannot read ({exc})") from None
    return text, data, lines


def _carry_defaults(phase: Any, included: dict, lines: dict[tuple, Any], ppath: tuple) -> Any:
    """The phase with each step carrying its own runbook's defaults and requirements (see the module docstring).
    `lines` (that runbook's line map) gets a schema.Carried entry for each key carried, at the step's key path
    `ppath` + ("steps", k, key...), so that an error about the value names the line its runbook gives it on."""
    defaults = included.get("defaults") or {}
    requirements = included.get("requirements") or {}
    if not isinstance(phase, dict) or not isinstance(phase.get("steps"), list):
        return phase
    for k, step in enumerate(phase["steps"]):
        kind = step_kinds.find(step.get("kind")) if isinstance(step, dict) else None
        if kind is None:
            continue
        spath = ppath + ("steps", k)
        for key in (*LAUNCH_KEYS, "on_failure"):
            if key not in defaults or key not in kind.allowed_keys():
                continue
            own = step.get(key)
            if key in ("env", "args") and isinstance(defaults[key], dict):
                step[key] = {**defaults[key], **(own or {})}
                lines.update({spath + (key, sub): Carried(("defaults", key, sub)) for sub in defaults[key]
                              if not (isinstance(own, dict) and sub in own)})
            elif key not in step:
                step[key] = copy.deepcopy(defaults[key])
            else:
                continue
            if own is None:  # the whole key came from the defaults
                lines[spath + (key,)] = Carried(("defaults", key))
        if not kind.host_only and isinstance(requirements, dict):
            own = step.get("requires") or {}
            step["requires"] = {**{k: requirements.get(k, 0 if k == "gpus" else None) for k in REQUIREMENT_KEYS},
                                **(own if isinstance(own, dict) else {})}
            lines.update({spath + ("requires", k): Carried(("requirements", k)) for k in requirements
                          if k in REQUIREMENT_KEYS and not (isinstance(own, dict) and k in own)})
    return phase


def _move_lines(lines: dict[tuple, Any], moves: list[tuple[int, int, int, Ctx | None, str]], n_criteria: int,
                origins: list[tuple[Ctx, int, int, str]]) -> dict[tuple, Any]:
    """The line map of the expanded document: a phase of this runbook keeps its lines at its new index; a phase an
    include item became (and everything in it), and a criterion it brought, maps to its place in its own file
    (schema.Included, which names the item too); this runbook's criteria move down past the included ones."""
    where = {old: (new, count, ctx, at) for old, new, count, ctx, at in moves}
    out: dict[tuple, Any] = {}
    for key, line in lines.items():
        if len(key) >= 2 and key[0] == "phases" and key[1] in where:
            new, count, ctx, at = where[key[1]]
            if ctx is None:
                out[("phases", new) + key[2:]] = line
            elif len(key) == 2:
                out.update({("phases", new + j): Included(ctx, ("phases", j), at) for j in range(count)})
        elif len(key) >= 2 and key[0] == "acceptance" and isinstance(key[1], int):
            out[("acceptance", key[1] + n_criteria) + key[2:]] = line
        else:
            out[key] = line
    for ctx, first, count, at in origins:
        out.update({("acceptance", first + j): Included(ctx, ("acceptance", j), at) for j in range(count)})
    return out
