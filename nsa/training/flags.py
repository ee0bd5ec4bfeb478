"""The trainer's command-line flags (`nsa-train --help`), in a module that imports no torch.

nsa.training.cli parses its command line with ``build_parser``; nsa-validate checks a runbook's trainer ``args``
against the same parser (``flag_specs``, ``check_flag``) before anything runs, so a flag the trainer does not have,
or a value of the wrong type, is an error naming the runbook key instead of a failed launch.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from nsa.training.config import DATASETS

DEFAULT_CONFIG = "configs/m7c_125m_2xa100_production.yaml"
EXIT_USAGE = 2  # nsa.training.trainer.EXIT_USAGE: a bad command line


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2, like argparse but naming the tool
        self.exit(EXIT_USAGE, f"nsa-train: error: {message} (see nsa-train --help)\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="nsa-train", allow_abbrev=False,
                description="Train an NSA language model (single process, or DDP/FSDP2 under torchrun). "
                            "Subcommand: `nsa-train watchdog --dir OUT` (see `nsa-train watchdog --help`).")
    a = p.add_argument
    a("--config", help=f"run config YAML (default: $CONFIG, else {DEFAULT_CONFIG})")
    a("--dataset", choices=DATASETS, help="data source (data.dataset)")
    a("--data-path", help="file, directory or glob of local data (data.path)")
    a("--loader-timeout", type=float, metavar="S", help="seconds to wait for one batch (data.loader_timeout_s)")
    a("--ddp", type=int, choices=(0, 1), help="1: DistributedDataParallel; 0: single process (train.parallel)")
    a("--fsdp", action="store_true", help="FSDP2 (fully_shard per block) instead of DDP")
    a("--fsdp-no-reshard", action="store_true",
      help="FSDP2 keeping each block's parameters gathered from forward to backward (reshard_after_forward=False, "
           "the SHARD_GRAD_OP equivalent: no all-gather in backward); implies --fsdp (train.fsdp_reshard: false)")
    a("--steps", type=int, help="optimizer steps in total (train.steps)")
    a("--seq-len", type=int, help="tokens per sequence (train.seq_len)")
    a("--batch-size", type=int, help="sequences per rank per micro-batch (train.batch_size)")
    a("--accum", type=int, help="micro-batches per optimizer step (train.accum)")
    a("--precision", choices=("fp32", "bf16", "fp16"), help="autocast precision; weights stay fp32")
    a("--lr", type=float, help="peak learning rate (train.lr)")
    a("--seed", type=int, help="seed for weights and data (train.seed)")
    a("--out-dir", help="output directory (train.out_dir)")
    a("--resume", action="store_true", help="continue from the latest checkpoint in out_dir")
    a("--compile", action="store_true", help="torch.compile the model")
    a("--cuda-graphs", action="store_true",
      help="capture the whole train step (forward, backward, clipping, optimizer) in CUDA graphs and replay it "
           "each step: a GPU, NSA's Triton kernels or the dense twin; not with FSDP2, fp16 or --compile "
           "(train.cuda_graphs)")
    a("--device", choices=("auto", "cpu", "cuda"), help="train.device")
    a("--log-every", type=int, help="console/aux-stat interval in steps (train.log_every)")
    a("--save-every", type=int, help="checkpoint interval in steps (train.save_every)")
    a("--eval-every", type=int, help="evaluation interval in steps, 0 = none (train.eval_every)")
    a("--profile-steps", type=int, help="torch profiler trace of this many steps (train.profile_steps)")
    a("--activation-checkpointing", type=int, choices=(0, 1), help="model.activation_checkpointing")
    a("--attention", choices=("nsa", "dense"), help="model.attention: nsa, or dense (the dense twin: causal SDPA)")
    a("--pg-timeout", type=float, metavar="S", help="process-group timeout in seconds (train.pg_timeout_s)")
    return p


@dataclass(frozen=True)
class FlagSpec:
    """One trainer flag as a runbook `args` key sees it: `--name VALUE` of `type` (int, float or str) and
    `choices`, or a `switch` (store_true: `name: true` adds it, `false` leaves it out)."""

    name: str  # "pg-timeout"
    type: type
    choices: tuple | None
    switch: bool
    help: str

    @property
    def expected(self) -> str:
        if self.switch:
            return "true or false (a switch)"
        if self.choices:
            return "one of " + ", ".join(map(str, self.choices))
        return {int: "an integer", float: "a number"}.get(self.type, "a string")


def flag_specs() -> dict[str, FlagSpec]:
    """{"steps": FlagSpec, "pg-timeout": FlagSpec, ...}: every flag of the trainer's parser (not --help)."""
    specs = {}
    for action in build_parser()._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or isinstance(action, argparse._HelpAction):
            continue
        name = longs[0][2:]
        switch = isinstance(action, argparse._StoreTrueAction)
        specs[name] = FlagSpec(name=name, type=action.type or str, switch=switch, help=action.help or "",
                               choices=tuple(action.choices) if action.choices is not None else None)
    return specs


def check_flag(key: str, value: Any, specs: dict[str, FlagSpec] | None = None) -> str | None:
    """Why `key: value` in a runbook's trainer `args` would not parse (`steps: abc`, `stepz: 3`, `fsdp: 1`), or
    None. `key` may use _ or - (save_every, pg-timeout); a value holding a ${step.winner...} reference is checked
    once it is resolved, not here."""
    specs = flag_specs() if specs is None else specs
    spec = specs.get(key.replace("_", "-"))
    if spec is None:
        return f"the trainer has no flag --{key.replace('_', '-')} (its flags: {', '.join(sorted(specs))})"
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

