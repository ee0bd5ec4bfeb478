"""--set KEY=VALUE on a runbook: applied to the parsed YAML before it is validated (`apply_override`), and the
notes on `--set defaults.KEY=...` values that a step's own KEY overrides (`override_notes`). Precedence, highest
first: a --set of the step's own key, the step's own key in the file, a --set of a defaults key, the file's
defaults (env and args merge key by key).
"""

from __future__ import annotations

from typing import Any, Mapping

import yaml

from nsa.training.config import YAML_ERRORS, DuplicateKeyError
from nsa.training.config import brief as _brief
from validation.runbook.schema import (Ctx, EnvTextError, RunbookError, check_nodes,
                                       did_you_mean, env_text_problem, printable, show)
from validation.runbook.model import Overridden
from validation.kinds.base import LAUNCH_KEYS, StepKind



def apply_override(raw: Any, item: str, ctx: Ctx) -> Any:
    """--set a.b.c=value: a dotted path into the YAML, list items of phases and steps by their name
    (phases.baseline.steps.baseline.args.steps=30), or steps.NAME.... for a step wherever it is
    (steps.baseline.args.steps=30). The value is read as YAML (30 is a number, "30" a string). The path and
    the value are validated like the file's own text; an error names the --set (Ctx.overrides)."""
    key, sep, value_text = item.partition("=")
    if not sep or not key:
        raise RunbookError(f"--set {printable(item)}: expected KEY=VALUE, e.g. steps.baseline.args.steps=20")
    shown = printable(key)
    try:
        value = yaml.safe_load(value_text)
    except YAML_ERRORS:
        value = value_text
    parts = key.split(".")
    if len(parts) >= 2 and parts[-2] == "env" and env_text_problem(value_text, value):
        value = value_text.strip()  # an environment value as typed: 010 stays "010" (YAML would read 8), yes "yes"
    else:  # a mapping or list holding environment values ({NCCL_X: 010}): refused as in the file, naming the --set
        try:
            node = yaml.compose(value_text, Loader=yaml.SafeLoader)
            if node is not None:
                check_nodes(node, tuple(parts))
        except (DuplicateKeyError, EnvTextError) as exc:
            raise RunbookError(f"--set {printable(item)} ({ctx.where}): {show(exc.path)}: {exc}") from None
        except YAML_ERRORS:
            pass  # not YAML: the value is the text (above)
    if not isinstance(raw, dict):
        raise ctx.error((), "expected a mapping at the top level")
    if parts[0] == "steps" and "steps" not in raw:  # steps.NAME...: the step of that name, in whichever phase
        if len(parts) < 3:
            raise RunbookError(f"--set {shown}: expected steps.STEP.KEY=VALUE, e.g. steps.baseline.args.steps=20")
        where = [(p.get("name"), s.get("name")) for p in raw.get("phases") or [] if isinstance(p, dict)
                 for s in p.get("steps") or [] if isinstance(s, dict)]
        phase = next((ph for ph, st in where if st == parts[1]), None)
        if phase is None:
            raise RunbookError(f"--set {shown}: no step named {printable(parts[1])} ("
                               f"{did_you_mean(parts[1], [st for _, st in where])}steps: "
                               f"{', '.join(str(st) for _, st in where)})")
        parts = ["phases", str(phase), "steps"] + parts[1:]
    # Each mapping or list on the way down is copied before it is written to: a YAML alias (`env: *common`) gives
    # several keys one shared object, and a --set of one of them must not change the others.
    node, path = raw, ()
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            names = [x.get("name") if isinstance(x, dict) else None for x in node]
            match = [j for j, name in enumerate(names) if name == part]
            if not match:
                names = [name for name in names if name is not None]
                raise RunbookError(f"--set {shown}: no item named {part!r} under "
                                   f"{printable('.'.join(parts[:i])) or 'top'} ({did_you_mean(part, names)}items: "
                                   f"{', '.join(printable(n) for n in names) or 'none with a name'})")
            node[match[0]] = _unshared(node[match[0]])
            node, path = node[match[0]], path + (match[0],)
        elif isinstance(node, dict):
            path = path + (part,)
            if part not in node:
                node[part] = {}
                ctx.overrides.append((path, item))  # a key the file does not have: an error there names the --set
            node[part] = _unshared(node[part])
            node = node[part]
        else:
            raise RunbookError(f"--set {shown}: {printable('.'.join(parts[:i]))} is not a mapping")
    if not isinstance(node, dict):
        raise RunbookError(f"--set {shown}: {printable('.'.join(parts[:-1]))} is not a mapping")
    if len(path) >= 2 and isinstance(path[-1], int) and path[-2] in ("phases", "steps") and (
            parts[-1] == "name" or (parts[-1] == "kind" and path[-2] == "steps")):
        what = "phase" if path[-2] == "phases" else "step"
        why = ("every reference to it (criteria, winners, --only, --rerun, --reuse) uses its name"
               if parts[-1] == "name" else "its other keys are those of its kind")
        raise RunbookError(f"--set {shown}: a {what}'s {parts[-1]} cannot be set from the command line ({why}); "
                           "change it in the runbook file")
    node[parts[-1]] = value
    ctx.overrides.append((path + (parts[-1],), item))
    return raw


def override_notes(kinds: Mapping[str, StepKind], file_raw: Any, ctx: Ctx) -> tuple[Overridden, ...]:
    """Every `--set defaults.KEY=...` that a step's own KEY overrides. Precedence, highest first: a --set of the
    step's own key (steps.NAME.KEY=, phases.P.steps.NAME.KEY=), the step's own key in the file, a --set of a
    defaults key, the file's defaults. (env and args merge key by key: defaults.args.steps against a step's own
    args.steps.) `kinds`: each step's kind, by the step's name."""
    found = []
    set_paths = [where for where, _ in ctx.overrides]
    phases = file_raw.get("phases") if isinstance(file_raw, dict) else None
    for where, item in ctx.overrides:
        if len(where) < 2 or where[0] != "defaults" or where[1] not in LAUNCH_KEYS:
            continue
        sub = where[1:]
        given = _set_value(item) if len(sub) == 1 else _MISSING  # defaults.env={...}: merged key by key
        for i, phase in enumerate(phases if isinstance(phases, list) else []):
            steps = phase.get("steps") if isinstance(phase, dict) else None
            for j, raw_step in enumerate(steps if isinstance(steps, list) else []):
                own = _lookup(raw_step, sub)
                if own is _MISSING:
                    continue  # the step does not set the key
                name = raw_step.get("name")
                kind = kinds.get(name) if isinstance(name, str) else None
                if kind is None or sub[0] not in kind.launch_keys:
                    continue
                keys = [sub + (k,) for k in own if k in given] if isinstance(own, dict) and isinstance(
                    given, dict) else [sub]
                for key in keys:
                    if not _set_for_step(("phases", i, "steps", j) + key, set_paths):
                        found.append(Overridden(name, ".".join(map(str, key)), _brief(_lookup(raw_step, key)),
                                                printable(item)))
    return tuple(found)


def _set_value(item: str) -> Any:
    """The value of `--set KEY=VALUE` as YAML reads it (apply_override), _MISSING where it does not read."""
    try:
        return yaml.safe_load(item.partition("=")[2])
    except YAML_ERRORS:
        return _MISSING


def _set_for_step(target: tuple, set_paths: list[tuple]) -> bool:
    """Whether a --set decides the step's key at `target` (a path into the runbook): one of that key or below it
    (steps.NAME.args.steps=7), or one that replaced a mapping or list holding it (steps.NAME.args={}, phases.P.steps=
    [...]): the file's own value is then not what runs."""
    return any(p[:len(target)] == target or (len(p) < len(target) and target[:len(p)] == p) for p in set_paths)


def _unshared(node: Any) -> Any:
    """A copy of one mapping or list (its values still shared), to write to; any other value as it is."""
    return dict(node) if isinstance(node, dict) else list(node) if isinstance(node, list) else node


_MISSING = object()


def _lookup(raw: Any, path: tuple) -> Any:
    for part in path:
        if not isinstance(raw, dict) or part not in raw:
            return _MISSING
        raw = raw[part]
    return raw
