"""Training run configuration: YAML files with `model`, `train` and `data` sections, validated key by key.

    model:  ModelConfig's flat form: its own fields and NSAConfig's (nsa.config)
    train:  TrainConfig fields (below)
    data:   DataConfig fields (below; the sources are in nsa.training.data)

Every key is checked: an unknown key, a key given twice in one mapping or a value of the wrong type is a
ConfigError naming the file and the dotted key (an unknown one with the closest known key); so is a number that is
not finite, a plain number that YAML 1.1 reads otherwise than in decimal (`010` as 8, `1:30` as 90), and a value
that the trainer would refuse beside another section's (train.seq_len shorter than model.l, a model.vocab_size below
the data's token ids). Missing keys take the dataclass defaults. Command-line flags override keys
(`apply_overrides`), and the resolved config is written back to the run's out_dir (config.yaml) so a run says exactly
what it ran.

A field that an nsa-train flag sets declares the flag where it is defined (`setting(..., flags=Flag(...))`,
nsa.config): nsa.training.flags reads the sections below (SECTIONS) for the trainer's parser, its `--help` and the
runbook checker's table of flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
import reprlib
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping

import yaml

from nsa.config import CHOICES, Flag, ModelConfig, NSAConfig, setting
from nsa.training.outputs import atomic_write

DATASETS = ("synthetic", "text", "fineweb_edu")
PRECISIONS = ("fp32", "bf16", "fp16")
PARALLEL = ("auto", "none", "ddp", "fsdp")
LR_SCHEDULES = ("cosine", "constant")
DEVICES = ("auto", "cpu", "cuda")
# torch.compile's backend: inductor (generated kernels), aot_eager (Dynamo's graphs and AOTAutograd's forward and
# backward, run by eager kernels: what traces, without code generation) or eager (Dynamo's graphs alone)
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")


class ConfigError(ValueError):
    """A user-caused configuration problem; the message is one line naming the file and key."""


class UsageError(ValueError):
    """A bad combination of flags or launch settings."""


# What PyYAML raises for text it cannot read: YAMLError for bad syntax; the others from its constructors for a
# well-formed but impossible value (`2020-13-45`, `!!int ''`, `!!bool maybe`), RecursionError for deep nesting.
YAML_ERRORS = (yaml.YAMLError, ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError,
               RecursionError)

_brief_repr = reprlib.Repr()
_brief_repr.maxlevel, _brief_repr.maxstring, _brief_repr.maxother = 2, 60, 60
_brief_repr.maxlist = _brief_repr.maxtuple = _brief_repr.maxdict = _brief_repr.maxset = 4


def brief(value: Any) -> str:
    """repr(value) for an error message: bounded (a value may be huge, self-referencing or an alias bomb)."""
    try:
        text = _brief_repr.repr(value)
    except ValueError:  # an int too long for str()
        return f"<a very large {type(value).__name__}>"
    return text if len(text) <= 100 else text[:97] + "..."


# what the data sources need of model.vocab_size: every id of the byte tokenizer (text, fineweb_edu; the same as
# nsa.training.corpus.BYTE_VOCAB) and the synthetic process's smallest vocabulary (SyntheticSource.MIN_VOCAB)
BYTE_VOCAB = 256
SYNTHETIC_MIN_VOCAB = 16


class DataError(ValueError):
    """A data problem the user caused (path, file contents, config value, hub access); one-line message."""


@dataclass(frozen=True)
class DataConfig:
    """Where training tokens come from.

    dataset           one of DATASETS: "synthetic" | "text" | "fineweb_edu"
    path              "text": a file, directory or glob (required); "fineweb_edu": local parquet file, directory
                      or glob for offline use (None: stream from the hub); ignored by "synthetic"
    loader_timeout_s  longest wait, in seconds, for a streaming source to open and for each batch from it
                      (--loader-timeout)
    text_key          JSONL field / parquet column holding the document text
    """

    dataset: str = setting("synthetic", choices=DATASETS, flags=Flag("dataset", "data source"))
    path: str | None = setting(None, flags=Flag("data-path", "file, directory or glob of local data"))
    loader_timeout_s: float = setting(120.0, flags=Flag("loader-timeout", "seconds to wait for one batch",
                                                        metavar="S"))
    text_key: str = "text"

    def __post_init__(self) -> None:
        if self.dataset not in DATASETS:
            raise DataError(f"DataConfig.dataset must be one of {' | '.join(DATASETS)}, got {self.dataset!r}")
        if self.path is not None:
            if isinstance(self.path, os.PathLike):
                object.__setattr__(self, "path", os.fspath(self.path))
            if not isinstance(self.path, str) or not self.path.strip():
                raise DataError(f"DataConfig.path must be a non-empty path string or None, got {self.path!r}")
        if self.dataset == "text" and self.path is None:
            raise DataError("DataConfig.path is required for dataset 'text' (a file, directory or glob; --data-path)")
        t = self.loader_timeout_s
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            raise DataError(f"DataConfig.loader_timeout_s must be a positive number of seconds, got {t!r}")
        if not isinstance(self.text_key, str) or not self.text_key:
            raise DataError(f"DataConfig.text_key must be a non-empty string, got {self.text_key!r}")


# train.seed: the range torch.manual_seed takes
SEED_MIN, SEED_MAX = -(1 << 63), (1 << 64) - 1
# every other integer of train at most: a 64-bit integer, as torch takes it (a larger train.accum failed in the first
# step's loss / accum with an OverflowError, after start-up)
TRAIN_INT_MAX = (1 << 63) - 1
# train.pg_timeout_s at most: a week (a hang would go unnoticed for longer; 1e300 overflowed torch's timedelta)
PG_TIMEOUT_MAX_S = 7 * 24 * 3600


@dataclass(frozen=True)
class TrainConfig:
    """How to train. Step counts are optimizer steps; batch_size is per rank and per micro-batch, so one step
    consumes world_size * batch_size * accum sequences of seq_len tokens."""

    steps: int = setting(1000, flags=Flag("steps", "optimizer steps in total"))
    seq_len: int = setting(2048, flags=Flag("seq-len", "tokens per sequence"))
    batch_size: int = setting(2, flags=Flag("batch-size", "sequences per rank per micro-batch"))
    accum: int = setting(1, flags=Flag("accum", "micro-batches per optimizer step"))
    lr: float = setting(3e-4, flags=Flag("lr", "peak learning rate"))
    warmup_steps: int = 0
    lr_schedule: str = setting("cosine", choices=LR_SCHEDULES)
    decay_steps: int | None = None  # cosine length (after warmup); None: the rest of the run, steps - warmup_steps
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0  # 0 disables clipping (the norm is still measured and logged)
    precision: str = setting("bf16", choices=PRECISIONS,
                             flags=Flag("precision", "autocast precision; weights stay fp32"))
    # auto: DDP when launched with more than one rank, else a single process
    parallel: str = setting("auto", choices=PARALLEL, flags=(
        Flag("ddp", "1: DistributedDataParallel; 0: single process", values={0: "none", 1: "ddp"}),
        Flag("fsdp", "FSDP2 (fully_shard per block) instead of DDP", switch=True, values={True: "fsdp"})))
    # FSDP2 reshard_after_forward; false: the SHARD_GRAD_OP equivalent
    fsdp_reshard: bool = setting(True, flags=Flag(
        "fsdp-no-reshard", "FSDP2 keeping each block's parameters gathered from forward to backward "
        "(reshard_after_forward=False, the SHARD_GRAD_OP equivalent: no all-gather in backward); implies --fsdp",
        switch=True, values={True: False}, implies={"train.parallel": "fsdp"}))
    device: str = setting("auto", choices=DEVICES, flags=Flag(
        "device", "where to train: auto (CUDA when there is a GPU, else the CPU), cpu or cuda"))
    compile: bool = setting(False, flags=Flag("compile", "torch.compile the model", switch=True))
    compile_backend: str = setting("inductor", choices=COMPILE_BACKENDS, flags=Flag(
        "compile-backend", "torch.compile's backend with --compile: inductor (generated kernels), aot_eager (the "
        "traced forward and backward graphs run by eager kernels: the tracing without code generation) or eager"))
    # the whole train step captured in CUDA graphs (nsa.training.graphs)
    cuda_graphs: bool = setting(False, flags=Flag(
        "cuda-graphs", "capture the whole train step (forward, backward, clipping, optimizer) in CUDA graphs and "
        "replay it each step: a GPU, NSA's Triton kernels or the dense twin; not with FSDP2 or fp16 (with --compile, "
        "the compiled model is captured after its warm-up steps)",
        switch=True))
    seed: int = setting(1337, flags=Flag("seed", "seed for weights and data"))
    log_every: int = setting(20, flags=Flag("log-every", "console/aux-stat interval in steps"))
    save_every: int = setting(5000, flags=Flag("save-every", "checkpoint interval in steps"))
    keep_checkpoints: int = 2
    eval_every: int = setting(0, flags=Flag("eval-every", "evaluation interval in steps, 0 = none"))
    eval_batches: int = 4
    # >0: torch profiler trace of that many steps after profile_start
    profile_steps: int = setting(0, flags=Flag("profile-steps", "torch profiler trace of this many steps"))
    profile_start: int = 5
    pg_timeout_s: float = setting(600.0, flags=Flag("pg-timeout", "process-group timeout in seconds", metavar="S"))
    peak_tflops: float | None = None  # per-device peak for MFU; None: looked up from the device name
    out_dir: str = setting("artifacts/run", flags=Flag("out-dir", "output directory"))

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"train.{f.name} must be a finite number, got {value}")
        positive = ("steps", "seq_len", "batch_size", "accum", "log_every", "save_every", "keep_checkpoints",
                    "eval_batches", "profile_start")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"train.{name} must be positive, got {getattr(self, name)}")
        for f in fields(self):
            value = getattr(self, f.name)
            if (f.name != "seed" and isinstance(value, int) and not isinstance(value, bool)
                    and value > TRAIN_INT_MAX):
                raise ValueError(f"train.{f.name} must be at most 2**63 - 1 (a 64-bit integer), got {brief(value)}")
        for name in ("warmup_steps", "eval_every", "profile_steps", "weight_decay", "grad_clip", "min_lr_ratio"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0, got {getattr(self, name)}")
        for name in ("lr", "pg_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"train.{name} must be positive, got {getattr(self, name)}")
        if self.min_lr_ratio > 1:
            raise ValueError(f"train.min_lr_ratio must be at most 1 (the floor of the decay, as a share of train.lr), "
                             f"got {self.min_lr_ratio}")
        if self.pg_timeout_s > PG_TIMEOUT_MAX_S:
            raise ValueError(f"train.pg_timeout_s must be at most {PG_TIMEOUT_MAX_S:,} (a week), "
                             f"got {self.pg_timeout_s}")
        if not str(self.out_dir).strip():
            raise ValueError("train.out_dir must name a directory, got an empty string")
        if "\0" in str(self.out_dir):  # no path holds one: creating it failed at start-up with a traceback
            raise ValueError(f"train.out_dir must not contain a NUL character, got {brief(self.out_dir)}")
        if self.decay_steps is not None and self.decay_steps <= 0:
            raise ValueError(f"train.decay_steps must be positive or null, got {self.decay_steps}")
        if self.peak_tflops is not None and not self.peak_tflops > 0:
            raise ValueError(f"train.peak_tflops must be positive or null, got {self.peak_tflops}")
        if not SEED_MIN <= self.seed <= SEED_MAX:  # torch.manual_seed refuses anything else, steps later
            raise ValueError(f"train.seed must be an integer from -2**63 to 2**64 - 1, got {brief(self.seed)}")
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1):
            raise ValueError(f"train.beta1/beta2 must be in [0, 1), got {self.beta1}, {self.beta2}")
        if self.cuda_graphs:
            _check_cuda_graphs(self)
        for f in fields(self):
            choices = f.metadata.get(CHOICES)
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"train.{f.name} must be one of {' | '.join(choices)}, got {getattr(self, f.name)!r}")


def _check_cuda_graphs(tc: TrainConfig) -> None:
    """The settings train.cuda_graphs cannot be combined with, each refused with its reason (the device and the
    attention kernels are checked when the trainer starts: nsa.training.graphs.check_supported)."""
    if tc.device == "cpu":
        raise ValueError("train.cuda_graphs needs a CUDA device, but train.device is 'cpu'")
    if tc.parallel == "fsdp":
        raise ValueError("train.cuda_graphs cannot be combined with FSDP2 (train.parallel: fsdp): FSDP2 gathers and "
                         "frees parameters on its own streams with host-side waits, which a CUDA graph cannot replay; "
                         "use DDP (--ddp 1) or a single process")
    if tc.precision == "fp16":
        raise ValueError("train.cuda_graphs cannot be combined with precision fp16: the GradScaler decides on the host "
                         "whether to skip each step; use bf16 or fp32")


@dataclass(frozen=True)
class RunConfig:
    model: ModelConfig
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model.flat(), "train": dataclasses.asdict(self.train),
                "data": dataclasses.asdict(self.data)}


SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a YAML run config; ConfigError names the file and key of any problem."""
    path = Path(path)
    try:  # is_file raises for a name the system refuses (too long: ENAMETOOLONG) or a directory it may not search
        found = path.is_file()
    except (OSError, ValueError) as exc:  # ValueError: an embedded NUL byte
        raise ConfigError(f"{path}: cannot read the config file ({getattr(exc, 'strerror', None) or exc})") from None
    if not found:
        raise ConfigError(f"{path}: " + ("a directory, not a config file" if path.is_dir()
                                         else "config file not found"))
    try:
        raw = _read_yaml(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:  # a file there but unreadable (permissions, an I/O error): one line, not a traceback
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror or exc})") from None
    except DuplicateKeyError as exc:
        key = ".".join(str(part) for part in exc.path)
        raise ConfigError(f"{path}: duplicate key {brief(key)} at line {exc.line} (first at line {exc.first}): one "
                          "of the two values would be ignored") from None
    except NumberTextError as exc:
        key = ".".join(str(part) for part in exc.path)
        raise ConfigError(f"{path}: {brief(key)} at line {exc.line}: {brief(exc.text)} reads as {brief(exc.value)} "
                          f"in YAML 1.1 ({exc.why}); write a number in decimal without a leading 0 or a ':', "
                          "a text in quotes") from None
    except YAML_ERRORS as exc:
        raise ConfigError(f"{path}: not valid YAML ({_yaml_problem(exc)})") from None
    return config_from_dict(raw, str(path))


def _yaml_problem(exc: BaseException) -> str:
    """What a PyYAML error says is wrong, with the line where it has one: its `problem` ("found character '\\t' that
    cannot start any token"), not the first line of its text, which is the context ("while scanning for the next
    token") and names neither what is wrong nor where."""
    problem = getattr(exc, "problem", None) or (str(exc).splitlines() or [type(exc).__name__])[0]
    mark = getattr(exc, "problem_mark", None)
    return f"line {mark.line + 1}: {problem}" if mark is not None else problem


class DuplicateKeyError(yaml.YAMLError):
    """A mapping of a YAML document gives one key twice: PyYAML keeps the last value and drops the other without a
    word (a second `train:` section replaced the whole first one, every key of it back to its default). `path` the
    key's path, `line` where it is given again, `first` where it was given first (1-based). Raised by mapping_entries,
    for the trainer's configs and the suite's runbooks alike."""

    def __init__(self, path: tuple, line: int, first: int):
        super().__init__(f"duplicate key (first at line {first}): one of the two values would be ignored")
        self.path, self.line, self.first = path, line, first


_MERGE_TAG = "tag:yaml.org,2002:merge"


def mapping_entries(node: yaml.MappingNode, path: tuple = ()) -> list[tuple[Any, Any, tuple, int | None]]:
    """(key node, value node, the value's path, the key's 1-based line) of each entry of a composed mapping, in
    order; DuplicateKeyError for the first scalar key given twice (the same tag and text). A merge key (`<<: *anchor`)
    may stand beside the keys it merges: its value's path is the mapping's own, its line None."""
    first: dict[tuple, int] = {}
    out = []
    for key_node, value_node in node.value:
        if isinstance(key_node, yaml.ScalarNode) and key_node.tag != _MERGE_TAG:
            key, line = (key_node.tag, key_node.value), key_node.start_mark.line + 1
            if key in first:
                raise DuplicateKeyError(path + (key_node.value,), line, first[key])
            first[key] = line
            out.append((key_node, value_node, path + (key_node.value,), line))
        else:
            out.append((key_node, value_node, path, None))
    return out


def _read_yaml(text: str) -> Any:
    """The YAML document in `text` (None for no document), as yaml.safe_load reads it, but DuplicateKeyError for a
    mapping that gives a key twice. Raises what PyYAML raises (YAML_ERRORS)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_unique_keys(node)
        _check_numbers(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _nodes(root):
    """(node, key path) of every node of a composed node tree, in document order, each once (an alias is the node it
    names), walked without recursion; a mapping's entries are read through mapping_entries, which raises
    DuplicateKeyError for a scalar key given twice."""
    stack, seen = [(root, ())], set()
    while stack:
        node, path = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node, path
        if isinstance(node, yaml.MappingNode):
            stack.extend(reversed([(value_node, where) for _, value_node, where, _ in mapping_entries(node, path)]))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(reversed([(item, path + (i,)) for i, item in enumerate(node.value)]))


def _check_unique_keys(root) -> None:
    """DuplicateKeyError for the first mapping of a composed node tree that gives one scalar key twice (the same tag
    and text; a merge key, `<<: *anchor`, may stand beside the keys it merges)."""
    for _ in _nodes(root):
        pass


class NumberTextError(yaml.YAMLError):
    """A plain number that YAML 1.1 (PyYAML) reads otherwise than it reads in decimal: a leading 0 makes it octal
    (`steps: 010` is 8, `seq_len: 0512` is 330), a colon base 60 (`steps: 1:30` is 90). `path` the value's key path,
    `line` its 1-based line, `text` as written, `value` as read, `why` the rule that reads it so."""

    def __init__(self, path: tuple, line: int, text: str, value: Any, why: str):
        super().__init__(f"{brief(text)} reads as {brief(value)} ({why})")
        self.path, self.line, self.text, self.value, self.why = path, line, text, value, why


_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_OCTAL_RE = re.compile(r"[-+]?0_*[0-7][0-7_]*")


def _check_numbers(root) -> None:
    """NumberTextError for the first plain scalar of a composed node tree that YAML 1.1 reads as an octal or a
    base-60 number (no setting is written so on purpose, and the run took the other figure without a word); a
    quoted one is a string, a decimal number is read as written."""
    for node, path in _nodes(root):
        if isinstance(node, yaml.ScalarNode) and node.style is None and node.tag in (_INT_TAG, _FLOAT_TAG):
            text = node.value
            if node.tag == _INT_TAG and _OCTAL_RE.fullmatch(text):
                digits = text.replace("_", "").lstrip("+-")
                if len(digits.lstrip("0")) > 1:  # 00 to 07 read the same in either base
                    value = int(digits, 8) * (-1 if text.startswith("-") else 1)  # base 8: no limit on its digits
                    raise NumberTextError(path, node.start_mark.line + 1, text, value, "a leading 0 makes it octal")
            elif ":" in text:
                value = yaml.safe_load(text)  # a few base-60 digits
                raise NumberTextError(path, node.start_mark.line + 1, text, value, "a ':' makes it base 60")


def config_from_dict(raw: Any, where: str = "<config>") -> RunConfig:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping with sections {', '.join(SECTIONS)}")
    unknown = [k for k in raw if k not in SECTIONS]
    if unknown:
        raise ConfigError(f"{where}: unknown section {brief(unknown[0])} "
                          f"({_did_you_mean(unknown[0], SECTIONS, 'did you mean ', '? ')}"
                          f"expected one of: {', '.join(SECTIONS)})")
    if "model" not in raw:
        raise ConfigError(f"{where}: missing section 'model'")
    # an absent or empty section (`train:` alone reads as null) takes the defaults; anything else must be a mapping
    built = {name: _build(cls, {} if raw.get(name) is None else raw[name], name, where)
             for name, cls in SECTIONS.items()}
    run = RunConfig(**built)
    _check_sections_together(run, where)
    return run


def _check_sections_together(cfg: RunConfig, where: str) -> None:
    """ConfigError for values of different sections that the trainer refuses together: a train.seq_len shorter than
    one compression block (model.l; nsa.training.trainer), and a model.vocab_size below the ids of the data source's
    tokens (nsa.training.data). Refused here, when the file and flags are read (and when nsa-validate checks a
    runbook's launches), not after the trainer has imported torch and moved out_dir's earlier run aside."""
    tc, model, data = cfg.train, cfg.model, cfg.data
    if tc.seq_len < model.nsa.l:
        raise ConfigError(f"{where}: train.seq_len={tc.seq_len} is shorter than one compression block "
                          f"(model.l={model.nsa.l})")
    if data.dataset == "synthetic":
        if model.vocab_size < SYNTHETIC_MIN_VOCAB:
            raise ConfigError(f"{where}: data.dataset 'synthetic' needs model.vocab_size >= {SYNTHETIC_MIN_VOCAB}, "
                              f"got {model.vocab_size}")
    elif model.vocab_size < BYTE_VOCAB:
        raise ConfigError(f"{where}: data.dataset {data.dataset!r} uses the byte tokenizer ({BYTE_VOCAB} token ids) "
                          f"but model.vocab_size={model.vocab_size}; expected model.vocab_size >= {BYTE_VOCAB}")


def apply_overrides(cfg: RunConfig, overrides: Mapping[str, Any], where: str = "command line") -> RunConfig:
    """cfg with dotted keys replaced ({"train.steps": 10, "data.dataset": "text"}), validated again."""
    merged = cfg.to_dict()
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if section not in merged or key not in merged[section]:
            hint = (_did_you_mean(key, merged[section], f" (did you mean {section}.", "?)") if section in merged
                    else _did_you_mean(dotted, [f"{name}.{k}" for name, keys in merged.items() for k in keys],
                                       " (did you mean ", "?)"))
            raise ConfigError(f"{where}: unknown key {brief(dotted)}{hint}")
        merged[section][key] = value
    return config_from_dict(merged, where)


def _did_you_mean(name: Any, names, before: str, after: str) -> str:
    """before + the closest of `names` to a misspelt `name` (difflib) + after, or "" when none is close."""
    near = difflib.get_close_matches(str(name), [str(n) for n in names], n=1)
    return f"{before}{near[0]}{after}" if near else ""


def save_config(cfg: RunConfig, path: str | Path) -> None:
    """The resolved config as YAML, written atomically (nsa.training.outputs.atomic_write)."""
    atomic_write(Path(path), yaml.safe_dump(cfg.to_dict(), sort_keys=False))


def section_fields(cls) -> tuple[dict, dict]:
    """({key: dataclass field}, {key: type hint}) of a section; the model section is ModelConfig's flat form."""
    if cls is ModelConfig:
        flat = ModelConfig.flat_fields()
        hints = {**typing.get_type_hints(NSAConfig), **typing.get_type_hints(ModelConfig)}
        return flat, hints
    return {f.name: f for f in fields(cls)}, typing.get_type_hints(cls)


def _build(cls, values: Any, section: str, where: str):
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where}: section '{section}' must be a mapping, got {type(values).__name__}")
    known, hints = section_fields(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{where}: unknown key {brief(f'{section}.{key}')} "
                              f"({_did_you_mean(key, known, f'did you mean {section}.', '? ')}"
                              f"known keys: {', '.join(known)})")
        kwargs[key] = _coerce(value, hints[key], f"{section}.{key}", where)
    missing = [name for name, f in known.items() if f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING and name not in kwargs]
    if missing:
        raise ConfigError(f"{where}: missing key '{section}.{missing[0]}'")
    try:
        return ModelConfig.from_flat(kwargs) if cls is ModelConfig else cls(**kwargs)
    except ValueError as exc:
        raise ConfigError(f"{where}: section '{section}': {exc}") from None


def _coerce(value: Any, hint: Any, key: str, where: str) -> Any:
    """value checked against a field type (int, float, str, bool, or X | None)."""
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union \
        else (hint,)
    if value is None:
        if type(None) in options:
            return None
        raise ConfigError(f"{where}: '{key}' must not be null")
    base = next(t for t in options if t is not type(None))
    if base is bool and isinstance(value, bool):
        return value
    if base is int and isinstance(value, int) and not isinstance(value, bool):
        return value
    if base is float and not isinstance(value, bool):
        number = None
        if isinstance(value, (int, float)):
            try:
                number = float(value)
            except OverflowError:
                raise ConfigError(f"{where}: '{key}' is too large for a number "
                                  f"(about 2**{value.bit_length()})") from None
        elif isinstance(value, str):  # YAML 1.1 reads "2e-4" (no dot) as a string
            try:
                number = float(value)
            except ValueError:
                pass
        if number is not None:
            # no setting takes an infinity or a NaN (model.norm_eps: .inf zeroed every normalised activation, and
            # model.init_std: .inf every weight, both accepted by the model's `> 0` checks)
            if not math.isfinite(number):
                raise ConfigError(f"{where}: '{key}' must be a finite number, got {brief(value)}")
            return number
    if base is str and isinstance(value, str):
        return value
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[base]
    raise ConfigError(f"{where}: '{key}' must be {expected}, got {brief(value)}")
