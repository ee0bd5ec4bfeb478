"""The trainer's command-line flags (`nsa-train --help`), in a module that imports no torch.

One table, ``flag_specs``, read from the config dataclasses: a field that a flag sets declares it where it is
defined (``setting(..., flags=Flag(...))`` in nsa.config and nsa.training.config), with its help; the flag's type
and choices are the field's own unless the flag maps its values (``--ddp 0|1`` -> train.parallel none|ddp). Two
flags belong to the run, not to the config: --config and --resume (``RUN_FLAGS``).

Everything else reads that table: ``build_parser`` (nsa.training.cli parses its command line with it, and `--help`
prints it), ``overrides`` (the dotted config keys a parsed command line sets) and ``check_flag`` (nsa-validate checks
a runbook's trainer ``args`` before anything runs, so a flag the trainer does not have, or a value of the wrong
type, is an error naming the runbook key instead of a failed launch).
"""

from __future__ import annotations

import argparse
import difflib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Mapping

from nsa.config import CHOICES, FLAGS
from nsa.training import config

DEFAULT_CONFIG = "configs/m7c_125m_2xa100_production.yaml"
EXIT_USAGE = 2  # nsa.training.trainer.EXIT_USAGE: a bad command line


@dataclass(frozen=True)
class FlagSpec:
    """One trainer flag as the parser and a runbook `args` key see it: `--name VALUE` of `type` (int, float or str)
    and `choices`, or a `switch` (store_true: `name: true` adds it, `false` leaves it out). `key`: the dotted config
    key it sets (None: a flag of the run, not of the config); `values`: flag value -> config value (None: the same);
    `implies`: other keys it sets."""

    name: str  # "pg-timeout"
    type: type
    choices: tuple | None
    switch: bool
    help: str
    key: str | None = None  # "train.pg_timeout_s"
    values: Mapping[Any, Any] | None = None
    implies: Mapping[str, Any] = field(default_factory=dict)
    metavar: str | None = None

    @property
    def dest(self) -> str:
        return self.name.replace("-", "_")

    @property
    def expected(self) -> str:
        if self.switch:
            return "true or false (a switch)"
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        return {int: "an integer", float: "a number"}.get(self.type, "a string")


RUN_FLAGS = {  # the run's own flags, before and after the config's
    "config": FlagSpec("config", str, None, False, f"run config YAML (default: $CONFIG, else {DEFAULT_CONFIG})"),
    "resume": FlagSpec("resume", bool, None, True, "continue from the latest checkpoint in out_dir"),
}


def flag_specs(sections: Mapping[str, type] | None = None) -> dict[str, FlagSpec]:
    """{"config": FlagSpec, "attention": ..., "steps": ..., "resume": ...}: every flag of the trainer, in `--help`
    order: --config, the flags the fields of `sections` declare (default: the run config's, nsa.training.config
    SECTIONS), in field order, then --resume."""
    sections = config.SECTIONS if sections is None else sections
    specs = {"config": RUN_FLAGS["config"]}
    for section, cls in sections.items():
        known, hints = config.section_fields(cls)
        for name, f in known.items():
            for flag in f.metadata.get(FLAGS, ()):
                spec = _spec(flag, f"{section}.{name}", hints[name], f.metadata.get(CHOICES))
                if spec.name in specs or spec.name in RUN_FLAGS:
                    raise ValueError(f"two config fields declare the flag --{spec.name}")
                specs[spec.name] = spec
    specs["resume"] = RUN_FLAGS["resume"]
    return specs


def _spec(flag, key: str, hint: Any, choices: tuple | None) -> FlagSpec:
    """The FlagSpec of `flag` (nsa.config.Flag) on the field `key` of type `hint`."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    base = next(t for t in options if t is not type(None))
    help_text = f"{flag.help} ({key})"
    if flag.switch:
        return FlagSpec(flag.name, bool, None, True, help_text, key, flag.values, dict(flag.implies))
    if flag.values is not None:
        flag_type = type(next(iter(flag.values)))
        return FlagSpec(flag.name, flag_type, tuple(flag.values), False, help_text, key, flag.values,
                        dict(flag.implies), flag.metavar)
    if base is bool:
        raise ValueError(f"the flag --{flag.name} of {key} (true or false) must be a switch or map its values")
    return FlagSpec(flag.name, base, tuple(choices) if choices else None, False, help_text, key, None,
                    dict(flag.implies), flag.metavar)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like argparse but naming the tool
        self.exit(EXIT_USAGE, f"nsa-train: error: {message} (see nsa-train --help)\n")

    def parse_args(self, args=None, namespace=None):
        """argparse's, with the closest flag named for each unrecognized one (`--stepz`: did you mean --steps?)."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            names = [option for action in self._actions for option in action.option_strings]
            hints = [f"{extra.split('=', 1)[0]}: did you mean {near[0]}?" for extra in extras if extra.startswith("--")
                     for near in [difflib.get_close_matches(extra.split("=", 1)[0], names, n=1)] if near]
            self.error(f"unrecognized arguments: {' '.join(extras)}" + (f" ({'; '.join(hints)})" if hints else ""))
        return parsed


def build_parser(specs: Mapping[str, FlagSpec] | None = None) -> argparse.ArgumentParser:
    """The trainer's parser: one option per flag of the table (`specs`, default flag_specs())."""
    specs = flag_specs() if specs is None else specs
    p = _Parser(prog="nsa-train", allow_abbrev=False,
                description="Train an NSA language model (single process, or DDP/FSDP2 under torchrun). "
                            "Subcommand: `nsa-train watchdog --dir OUT` (see `nsa-train watchdog --help`). "
                            "Flags override the config file's keys (named in each flag's help).")
    for spec in specs.values():
        if spec.switch:
            p.add_argument(f"--{spec.name}", action="store_true", help=spec.help)
        else:
            p.add_argument(f"--{spec.name}", type=spec.type, choices=spec.choices, metavar=spec.metavar,
                           help=spec.help)
    return p


def overrides(args: argparse.Namespace, specs: Mapping[str, FlagSpec] | None = None) -> dict[str, Any]:
    """{dotted config key: value} that the flags given in `args` (parsed by build_parser) set. Two flags that set
    one key to different values are a UsageError (`--fsdp and --ddp 1 are exclusive`)."""
    specs = flag_specs() if specs is None else specs
    out: dict[str, Any] = {}
    given_by: dict[str, str] = {}
    for spec in specs.values():
        raw = getattr(args, spec.dest, None)
        if spec.key is None or raw is None or raw is False:
            continue
        value = spec.values[raw] if spec.values is not None else raw
        given = f"--{spec.name}" if spec.switch else f"--{spec.name} {raw}"
        for key, v in ((spec.key, value), *spec.implies.items()):
            if key in out and out[key] != v:
                raise config.UsageError(f"{given} and {given_by[key]} are exclusive")
            out[key] = v
            given_by.setdefault(key, given)
    return out


def tokens(key: str, value: Any) -> list[str]:
    """The command-line tokens that give the trainer `key: value` (a runbook's trainer `args` entry; _ or - in
    `key`): ["--key", "value"], a switch as ["--key"] for True, nothing for False or None (the flag's default).
    nsa-validate builds a launch's flags with it and rewrites the report's validated command with it."""
    flag = "--" + key.lstrip("-").replace("_", "-")
    if value is True:
        return [flag]
    if value is False or value is None:
        return []
    return [flag, str(value)]


def check_flag(key: str, value: Any, specs: dict[str, FlagSpec] | None = None) -> str | None:
    """Why `key: value` in a runbook's trainer `args` would not parse (`steps: abc`, `stepz: 3`, `fsdp: 1`), or
    None. `key` may use _ or - (save_every, pg-timeout); a value holding a ${step.winner...} reference is checked
    once it is resolved, not here."""
    specs = flag_specs() if specs is None else specs
    spec = specs.get(key.replace("_", "-"))
    if spec is None:
        flag = key.replace("_", "-")
        near = difflib.get_close_matches(flag, list(specs), n=1)
        hint = f"did you mean --{near[0]}? " if near else ""
        return f"the trainer has no flag --{flag} ({hint}its flags: {', '.join(sorted(specs))})"
    if isinstance(value, str) and "${" in value:
        return None
    if spec.switch:
        return None if isinstance(value, bool) else \
            f"the trainer's --{spec.name} is a switch: expected true or false, got {value!r}"
    if isinstance(value, bool) or value is None:
        return f"the trainer's --{spec.name} takes {spec.expected}, got {value!r}"
    if spec.type is int and isinstance(value, float):  # passed as "30.0", which argparse's int() refuses
        return f"the trainer's --{spec.name} takes {spec.expected}, got {value!r}"
    try:
        parsed = spec.type(value)
    except (TypeError, ValueError, OverflowError):
        return f"the trainer's --{spec.name} takes {spec.expected}, got {value!r}"
    if spec.choices is not None and parsed not in spec.choices:
        return f"the trainer's --{spec.name} takes {spec.expected}, got {value!r}"
    return None
