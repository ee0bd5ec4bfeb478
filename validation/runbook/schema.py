"""Validation helpers for YAML documents read with line numbers: every error names the file, the line and the key
path, e.g. ``runbooks/x.yaml:14: phases[1].steps[0].kind: 'trian' is not one of snapshot, train, ...``.

The runbook (validation.runbook.loader) and every step kind's own keys (validation.kinds) are checked with these, so a
kind's schema reads like the runbook's: ``mapping`` (known keys, required keys), ``typed`` (type, minimum,
choices), ``env_vars`` (NSA_* names and values against nsa.toggles), ``trainer_flags``, ``str_list``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
from typing import Any

import yaml

from nsa import toggles
from nsa.training.config import brief, mapping_entries
from nsa.training.flags import check_flag, flag_specs

NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Trainer flags a runbook may not set: every launch writes inside RUN_DIR, and a step decides nothing about resume.
RESERVED_ARGS = {"out-dir": "every launch writes into its own directory under RUN_DIR",
                 "resume": "use nsa-validate run --resume RUN_DIR"}


class RunbookError(ValueError):
    """A runbook problem; the message names the file, line and key path."""


_STR_TAG = "tag:yaml.org,2002:str"


def env_text_problem(text: str, value: Any) -> str | None:
    """Why an environment value written `text` in YAML (plain, unquoted) would not reach the process as written: YAML
    reads 010 as the number 8, 0x10 as 16, 1_000 as 1000, 8.90 as 8.9, yes/no/on/off/true/false as booleans,
    nothing, ~ and null as null, 2024-01-01 as a date; None when it is text or a number that prints as written."""
    shown = text.strip()
    if isinstance(value, str):
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if str(value) == shown:
            return None
        read = f"the number {value}, which the process would get as {str(value)!r}"
    elif isinstance(value, bool):
        read = f"the boolean {str(value).lower()}, not the text {shown!r}"
    elif value is None:
        read = "null (no value), not text"
    else:
        read = f"a {type(value).__name__}, not text"
    quote = "quote it ('') to pass an empty text" if not shown else f"quote it ('{shown}') to pass the text as written"
    return f"YAML reads {shown or 'an empty value'} as {read}; {quote}"


class EnvTextError(yaml.YAMLError):
    """An environment value YAML would read as another text (env_text_problem): `path`, `line`."""

    def __init__(self, path: tuple, line: int, problem: str):
        super().__init__(problem)
        self.path, self.line = path, line


def parse_yaml(text: str) -> tuple[Any, dict[tuple, int]]:
    """The YAML document in `text` and the 1-based line of every key path in it (compose_lines), from one parse:
    the node tree gives the lines, the same tree the values. Raises what PyYAML raises (YAML_ERRORS)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is not None:
            check_nodes(node)
        data = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    return data, compose_lines(node) if node is not None else {}


def check_nodes(node, path=(), seen=None) -> None:
    """Check a composed (not yet constructed) node tree in one walk: DuplicateKeyError for the first mapping that
    gives a key twice (a merge key, `<<: *anchor`, may be given beside the keys it merges), EnvTextError for the
    first unquoted environment value (in an `env` mapping, or a value or list of values of an `env.X` key) that
    YAML reads as anything but the text written (env_text_problem: 010, yes, ~). A merge key's value, one mapping
    (`<<: *a`) or a list of them (`<<: [*a, *b]`), is checked as part of the mapping it merges into. A node reached
    again through an alias is not walked again, unless it is reached as an environment mapping now and was not
    before (`args: &a {seq_len: 010}` ... `env: *a`: the same text is an environment value there)."""
    seen = set() if seen is None else seen
    env = bool(path) and path[-1] == "env"
    if (id(node), env) in seen:
        return
    seen.add((id(node), env))
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node, child, line in mapping_entries(node, path):  # DuplicateKeyError for a key twice
            if line is not None and env:  # an environment mapping: {NCCL_X: '010'}
                _check_env_text(value_node, child, line)
            elif line is not None and str(key_node.value).startswith("env."):  # a sweep's {env.X: [25, 50]}
                items = value_node.value if isinstance(value_node, yaml.SequenceNode) else None
                for i, item in enumerate(items if items is not None else [value_node]):
                    _check_env_text(item, child + ((i,) if items is not None else ()), item.start_mark.line + 1)
            if line is None and isinstance(value_node, yaml.SequenceNode):  # <<: [*a, *b]: each merged mapping
                for item in value_node.value:
                    check_nodes(item, child, seen)
            else:
                check_nodes(value_node, child, seen)  # a merge key's value: at the mapping's own path
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            check_nodes(item, path + (i,), seen)


def _check_env_text(node, path: tuple, line: int) -> None:
    """EnvTextError when `node` is a plain (unquoted) scalar that YAML reads as other than the text written."""
    if isinstance(node, yaml.ScalarNode) and node.style is None and node.tag != _STR_TAG:
        problem = env_text_problem(node.value, yaml.safe_load(node.value) if node.value.strip() else None)
        if problem:
            raise EnvTextError(path, line, problem)


def compose_lines(node, path=(), lines=None, seen=None) -> dict[tuple, int]:
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
            compose_lines(value_node, path + (key,), lines, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            compose_lines(item, path + (i,), lines, seen)
    return lines


class Ctx:
    """Where we are in the file, for error messages. `overrides` lists the key paths a `--set KEY=VALUE` wrote or
    created (path tuple with list indices, the --set text): an error about such a key, or inside it, names the
    --set, not a line of the file. `set_keys` lists only the key each --set wrote, in the order given (not the
    mappings it created on the way: `--set defaults.args.lr=0.1` writes defaults.args.lr, whether or not the file
    has defaults.args)."""

    def __init__(self, where: str, lines: dict[tuple, int]):
        self.where, self.lines = where, lines
        self.overrides: list[tuple[tuple, str]] = []
        self.set_keys: list[tuple[tuple, str]] = []

    def override_for(self, path: tuple) -> str | None:
        """The --set text that wrote or created `path` (or a key it lies in); None when the file is at fault."""
        for where, item in reversed(self.overrides):  # the last --set of a key is the one in effect
            if path[:len(where)] == where:
                return item
        return None

    def error(self, path: tuple, message: str) -> RunbookError:
        item = self.override_for(path)
        if item is not None:
            text = printable(item)
            text = text if len(text) <= 80 else text[:77] + "..."
            return RunbookError(f"--set {text} ({self.where}): {show(path) or '(top level)'}: {message}")
        return RunbookError(f"{self.position(path)}: {message}")

    def position(self, path: tuple) -> str:
        """"file:line: key.path" of `path`; a key in a phase that an include brought in is named in its own file
        ("inner.yaml:8: phases[0].steps[1].kind (included at outer.yaml:4)"), and one its step carries from that
        file's defaults where the defaults give it ("inner.yaml:3: defaults.config (included at outer.yaml:4)")."""
        line = None
        for n in range(len(path), -1, -1):
            if path[:n] in self.lines:
                found = self.lines[path[:n]]
                if isinstance(found, Included):
                    return f"{found.ctx.position(found.path + path[n:])} (included at {found.at})"
                if isinstance(found, Carried):
                    return self.position(found.path + path[n:])
                line = found
                break
        shown = show(self.own_path(path)) or "(top level)"
        return f"{self.where}:{line if line is not None else '?'}: {shown}"

    def own_path(self, path: tuple) -> tuple:
        """`path` (a key path of the expanded runbook) as this file numbers it. An include item that became n phases
        (schema.Included entries of the line map, one Ctx per item) puts this file's later phases n - 1 places
        further on, and the criteria includes bring come before this file's own: the file's first phase after an
        include of two phases is phases[2] expanded, phases[1] here; its first criterion after one included
        criterion is acceptance[1] expanded, acceptance[0] here. A key an include brought is returned as it is."""
        if len(path) < 2 or path[0] not in ("phases", "acceptance") or type(path[1]) is not int:
            return path
        before = [found for key, found in self.lines.items()
                  if len(key) == 2 and key[0] == path[0] and type(key[1]) is int and key[1] < path[1]
                  and isinstance(found, Included)]
        if not before or isinstance(self.lines.get(path[:2]), Included):
            return path
        # phases: each include item stands in this file as one item; criteria: none of them are this file's
        shift = len(before) - (len({id(found.ctx) for found in before}) if path[0] == "phases" else 0)
        return (path[0], path[1] - shift) + path[2:]


@dataclasses.dataclass(frozen=True)
class Included:
    """In a line map (Ctx.lines), the value of a key an include brought in: the included runbook's own Ctx, the
    key's path there, and the include item ("outer.yaml:4")."""

    ctx: Ctx
    path: tuple
    at: str


@dataclasses.dataclass(frozen=True)
class Carried:
    """In a line map (Ctx.lines), the value of a key an included step carries from its own runbook's `defaults` or
    `requirements` (validation.runbook.includes): `path`, where that runbook writes it (("defaults", "args",
    "steps")), so that an error about it names that line."""

    path: tuple


def show(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{printable(part)}" if out else printable(part))
    return out


def printable(part: Any) -> str:
    """str(part), or its repr when it holds a newline or another control character (messages are one line)."""
    return str(part) if str(part).isprintable() else repr(part)


def mapping(value: Any, path: tuple, ctx: Ctx, allowed: tuple[str, ...], required: tuple[str, ...] = ()) -> dict:
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ctx.error(path, f"expected a mapping, got {type(value).__name__}")
    for key in value:
        if key not in allowed:
            raise ctx.error(path + (key,), f"unknown key ({did_you_mean(key, allowed)}expected one of: "
                                           f"{', '.join(allowed)})")
    for key in required:
        if key not in value:
            raise ctx.error(path, f"missing required key {key!r}")
    return value


def did_you_mean(name: Any, names) -> str:
    """"did you mean X? " with the closest of `names` to `name` (a misspelt key or step name), or ""."""
    near = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f"did you mean {near[0]}? " if near else ""


INT_MAX = 2**63 - 1  # the largest integer a runbook key takes (as nsa.training.config's integers: 64 bits)
# a step's repeats at most: each repeat is a training launch per variant or point (a step of 1,000 is days of runs
# already), and a step lists its launches when the runbook is read (a repeats of 10**9 held the loader there)
REPEATS_MAX = 1000
# a number in exponent form that YAML 1.1 reads as text: without a dot (1e3) or without a sign (1.0e3)
_EXPONENT_TEXT_RE = re.compile(r"[-+]?([0-9][0-9_]*(\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+")


def typed(value: Any, kind, path: tuple, ctx: Ctx, *, minimum=None, maximum=None, choices=None, optional=False):
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
        hint = ""
        if kind in (int, float) and isinstance(value, str) and len(value) <= 40 \
                and _EXPONENT_TEXT_RE.fullmatch(value.strip()):
            # YAML 1.1 reads a number in exponent form only with a dot and a signed exponent: 1.0e+3, not 1e3
            hint = (f" (YAML reads {value.strip()} as text: " + ("write the integer in digits, e.g. 1000 for 1e3)"
                    if kind is int else "an exponent needs a dot and a sign, e.g. 1.0e+3, or write the number out, "
                    "1000)"))
        raise ctx.error(path, f"must be {expected}, got {brief(value)}{hint}")
    if choices is not None and value not in choices:
        raise ctx.error(path, f"{value!r} is not one of {', '.join(map(str, choices))}")
    if kind is float and isinstance(value, float) and not math.isfinite(value):
        raise ctx.error(path, f"must be a finite number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ctx.error(path, f"must be >= {minimum}, got {brief(value)}")
    if maximum is not None and value > maximum:
        raise ctx.error(path, f"must be <= {maximum:,}, got {brief(value)}")
    if kind is int and value > INT_MAX:  # no count a runbook gives (ranks, repeats, steps, bytes) is larger
        raise ctx.error(path, f"number too large, got {brief(value)} (an integer here is at most 2**63 - 1)")
    if kind is float:
        try:
            return float(value)
        except OverflowError:
            raise ctx.error(path, f"number too large, got {brief(value)}") from None
    return value


def env_vars(value: Any, path: tuple, ctx: Ctx) -> dict[str, str]:
    value = mapping(value, path, ctx, tuple(value.keys()) if isinstance(value, dict) else ())
    out = {}
    for key, v in value.items():
        if not isinstance(key, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):  # "$" lets a final \n by
            raise ctx.error(path + (key,), "not a valid environment variable name")
        if isinstance(v, bool) or v is None:  # the file's own text is refused earlier (check_nodes): e.g. an alias
            raise ctx.error(path + (key,), f"environment values are text, got {brief(v)}: quote it in YAML")
        if not isinstance(v, (str, int, float)):
            raise ctx.error(path + (key,), f"environment values must be strings or numbers, got {brief(v)}")
        out[key] = str(v)
        problem = env_problem(key, out[key])
        if problem:
            raise ctx.error(path + (key,), problem)
    return out


def env_problem(name: str, value: str) -> str | None:
    """Why `name=value` cannot be a launch's environment variable, or None: an NSA_* name that is not in the table
    of toggles (nsa.toggles, with the closest known names) or a value that does not parse for its type. Other names
    (NCCL_*, TORCH_*, ...) pass, and so does a value holding a ${step.winner...} reference (it is checked where
    the winner is measured)."""
    if "${" in value:
        value = ""  # the name is still checked; the value is the winner's
    return toggles.check(name, value)


def trainer_flags(value: Any, path: tuple, ctx: Ctx) -> dict[str, Any]:
    """A step's trainer `args`: each key one of the trainer's flags (nsa.training.flags, the parser nsa-train
    uses) and each value of that flag's type, e.g. `steps: abc` or `stepz: 3` is an error naming the key."""
    value = mapping(value, path, ctx, tuple(value.keys()) if isinstance(value, dict) else ())
    specs = flag_specs() if value else {}
    for key, v in value.items():
        if not isinstance(key, str) or not re.match(r"^[a-z][a-z0-9_-]*$", key):
            raise ctx.error(path + (key,), "trainer argument names are lower-case flags without '--', e.g. steps")
        if reserved_arg(key):
            raise ctx.error(path + (key,), f"set by nsa-validate itself ({reserved_arg(key)})")
        if key == "config":
            raise ctx.error(path + (key,), "the trainer's config file is the step's own `config` key, not an arg")
        if not isinstance(v, (str, int, float, bool)) or v is None:
            raise ctx.error(path + (key,), f"argument values must be scalars, got {brief(v)}")
        problem = check_flag(key, v, specs)
        if problem:
            raise ctx.error(path + (key,), problem)
    return dict(value)


def setting_key(key: Any, path: tuple, ctx: Ctx, what: str) -> str:
    """A trainer setting a sweep or scan varies: env.VARIABLE or args.flag, never a flag nsa-validate sets itself.
    `what` starts the error, e.g. "matrix keys are" -> "matrix keys are env.VARIABLE or args.flag"."""
    if not isinstance(key, str) or not re.match(r"^(env|args)\.[A-Za-z0-9_-]+$", key):
        raise ctx.error(path, f"{what} env.VARIABLE or args.flag")
    if key.startswith("args.") and reserved_arg(key[5:]):
        raise ctx.error(path, f"set by nsa-validate itself ({reserved_arg(key[5:])})")
    return key


def reserved_arg(key: str) -> str | None:
    """Why nsa-validate itself owns trainer flag `key` (e.g. out_dir, out-dir), or None."""
    return RESERVED_ARGS.get(key.replace("_", "-"))


def str_list(value: Any, path: tuple, ctx: Ctx) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(x, (str, int, float)) for x in value):
        raise ctx.error(path, "expected a list of strings")
    return [str(x) for x in value]


