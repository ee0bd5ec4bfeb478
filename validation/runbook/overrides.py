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
from nsa.training.flags import flag_specs
from validation.runbook.schema import (Ctx, EnvTextError, RunbookError, check_nodes,
                                       did_you_mean, env_text_problem, printable, show)
from validation.runbook.model import Overridden
from validation.kinds.base import LAUNCH_KEYS, StepKind



def apply_override(raw: Any, item: str, ctx: Ctx) -> Any:
    """--set a.b.c=value: a dotted path into the YAML, list items of phases and steps by their name
    (phases.baseline.steps.baseline.args.steps=30), or steps.NAME.... for a step wherever it is
    (steps.baseline.args.steps=30). A key that holds a dot itself, a sweep's or scan's setting, is one key of the
    path: steps.bucket_sweep.matrix.env.NSA_DDP_BUCKET_MB=[25, 50] (the matrix's key env.NSA_DDP_BUCKET_MB, or a
    new env.X or args.y in a mapping of such keys). The value is read as YAML (30 is a number, "30" a string); an
    environment value, or a trainer flag's free text (args.data_path), is the text as typed where YAML would read
    another (010, on, ~). The path and the value are validated like the file's own text; an error names the --set
    (Ctx.overrides)."""
    key, sep, value_text = item.partition("=")
    if not sep or not key:
        raise RunbookError(f"--set {printable(item)}: expected KEY=VALUE, e.g. steps.baseline.args.steps=20")
    shown = printable(key)
    parts = key.split(".")
    if not isinstance(raw, dict):
        raise ctx.error((), "expected a mapping at the top level")
    if parts[0] == "steps" and "steps" not in raw:  # steps.NAME...: the step of that name, in whichever phase
        if len(parts) < 3:
            raise RunbookError(f"--set {shown}: expected steps.STEP.KEY=VALUE, e.g. steps.baseline.args.steps=20")
        phases = raw.get("phases") or []
        if not isinstance(phases, list):  # the runbook's own error, as its validation would give it
            raise ctx.error(("phases",), "expected a non-empty list of phases")
        where = []
        for i, p in enumerate(phases):
            if not isinstance(p, dict):
                continue
            steps = p.get("steps") or []
            if not isinstance(steps, list):
                raise ctx.error(("phases", i, "steps"), "expected a non-empty list of steps")
            where += [(p.get("name"), s.get("name")) for s in steps if isinstance(s, dict)]
        phase = next((ph for ph, st in where if st == parts[1]), None)
        if phase is None:
            raise RunbookError(f"--set {shown}: no step named {printable(parts[1])} ("
                               f"{did_you_mean(parts[1], [st for _, st in where])}steps: "
                               f"{', '.join(str(st) for _, st in where)})")
        parts = ["phases", str(phase), "steps"] + parts[1:]
    # Each mapping or list on the way down is copied before it is written to: a YAML alias (`env: *common`) gives
    # several keys one shared object, and a --set of one of them must not change the others.
    node, path, i = raw, (), 0
    while True:
        width = _key_width(node, parts, i) if isinstance(node, dict) else 1
        part = ".".join(parts[i:i + width])
        if i + width == len(parts):
            break
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
        i += width
    if not isinstance(node, dict):
        raise RunbookError(f"--set {shown}: {printable('.'.join(parts[:i]))} is not a mapping")
    if len(path) >= 2 and isinstance(path[-1], int) and path[-2] in ("phases", "steps") and (
            part == "name" or (part == "kind" and path[-2] == "steps")):
        what = "phase" if path[-2] == "phases" else "step"
        why = ("every reference to it (criteria, winners, --only, --rerun, --reuse) uses its name"
               if part == "name" else "its other keys are those of its kind")
        raise RunbookError(f"--set {shown}: a {what}'s {part} cannot be set from the command line ({why}); "
                           "change it in the runbook file")
    typed = key.split(".")  # the key as written (steps.NAME... unexpanded), its last key `part`
    node[part] = _value(value_text, item, tuple(typed[:len(typed) - (len(parts) - i)]) + (part,), ctx,
                        env=path[-1:] == ("env",) or part.startswith("env."),
                        text_flag=path[-1:] == ("args",) and _text_flag(part))
    ctx.overrides.append((path + (part,), item))
    ctx.set_keys.append((path + (part,), item))
    return raw


def _key_width(node: dict, parts: list[str], i: int) -> int:
    """How many of `parts`, from the i-th, name one key of mapping `node`: 1, or more for a key holding dots that
    the mapping has (a matrix's env.NSA_DDP_BUCKET_MB; the longest), or env.X / args.y to be added to a mapping
    whose keys are such settings (a sweep's matrix, a scan's values, a sweep's prefer)."""
    if parts[i] in node:
        return 1
    # only a key holding w - 1 dots can be w parts: those widths alone are tried (every width from the longest was
    # a join and a look-up per width, at each key of the path: a --set key of 5,000 parts took minutes)
    widths = {k.count(".") + 1 for k in node if isinstance(k, str) and "." in k}
    for width in sorted((w for w in widths if w <= len(parts) - i), reverse=True):
        if ".".join(parts[i:i + width]) in node:
            return width
    if parts[i] in ("env", "args") and i + 1 < len(parts) and any(
            isinstance(k, str) and k.startswith(("env.", "args.")) for k in node):
        return 2
    return 1


def _value(value_text: str, item: str, typed_path: tuple, ctx: Ctx, env: bool, text_flag: bool = False) -> Any:
    """The value of a --set, read as YAML. An environment value (`env` true: a key of an env mapping, or an env.X
    setting) that YAML would read as another text is the text as typed (010 stays "010", yes "yes"), and so is a
    trainer argument whose flag takes free text (`text_flag`: args.data_path=010 stays "010", not the path "8"); a
    mapping or list holding environment values that YAML reads so ({NCCL_X: 010}, a matrix's [010, 20]) is refused
    as in the file, naming the --set (`typed_path`: the key as written, for the message)."""
    try:
        value = yaml.safe_load(value_text)
    except YAML_ERRORS:
        value = value_text
    setting = typed_path[-1].startswith("env.")  # a sweep's or scan's env.X: a value or a list of values
    if env and env_text_problem(value_text, value) and not (setting and isinstance(value, list)):
        return value_text.strip()  # an environment value as typed: 010 stays "010" (YAML would read 8), yes "yes"
    if text_flag and not isinstance(value, (list, dict)) and env_text_problem(value_text, value):
        return value_text.strip()  # a path flag's value as typed: 010 stays "010"
    try:  # a mapping or list holding environment values ({NCCL_X: 010}): refused as in the file, naming the --set
        node = yaml.compose(value_text, Loader=yaml.SafeLoader)
        if node is not None:
            check_nodes(node, typed_path)
            if setting and isinstance(node, yaml.SequenceNode):  # its values, as check_nodes checks them in a file
                check_nodes(yaml.MappingNode("tag:yaml.org,2002:map", [(
                    yaml.ScalarNode("tag:yaml.org,2002:str", typed_path[-1], node.start_mark), node)]),
                    typed_path[:-1])
    except (DuplicateKeyError, EnvTextError) as exc:
        raise RunbookError(f"--set {printable(item)} ({ctx.where}): {show(exc.path)}: {exc}") from None
    except YAML_ERRORS:
        pass  # not YAML: the value is the text (above)
    return value


def _text_flag(key: str) -> bool:
    """Whether trainer flag `key` (an args key: data_path or data-path) takes free text (a path): no choices."""
    spec = flag_specs().get(key.replace("_", "-"))
    return spec is not None and spec.type is str and not spec.switch and spec.choices is None


def override_notes(kinds: Mapping[str, StepKind], file_raw: Any, ctx: Ctx) -> tuple[Overridden, ...]:
    """Every `--set defaults.KEY=...` that a step's own KEY overrides. Precedence, highest first: a --set of the
    step's own key (steps.NAME.KEY=, phases.P.steps.NAME.KEY=), the step's own key in the file, a --set of a
    defaults key, the file's defaults. (env and args merge key by key: defaults.args.steps against a step's own
    args.steps.) A --set that a later one replaces (the same key, or a mapping holding it) is in effect nowhere: no
    note. `kinds`: each step's kind, by the step's name."""
    found = []
    set_paths = [where for where, _ in ctx.set_keys]  # the keys written, not the mappings created on the way
    phases = file_raw.get("phases") if isinstance(file_raw, dict) else None
    for n, (where, item) in enumerate(ctx.set_keys):
        if len(where) < 2 or where[0] != "defaults" or where[1] not in LAUNCH_KEYS:
            continue
        later = set_paths[n + 1:]
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
                    if any(("defaults",) + key[:len(p) - 1] == p for p in later):
                        continue  # a later --set replaced this one's value of the key
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
