"""Every NSA_* environment toggle, defined in one place.

Each toggle is read ONCE, at start-up (the trainer's ``Toggles.read``, never inside a hot path), parsed into a
typed value here and passed down; a value that cannot be parsed is an error naming the variable. The table below
is the documentation: `python -m nsa.toggles` prints it.

Toggles are the seed runbook's (../shared/seeds/004_*) and keep the meaning it gives them. A toggle is added
here together with the code that reads it, so this table never lists one that does nothing; and every NSA_*
variable the project reads is here (also those that change no training result: a launcher's node name, switches of
the test suite), so that `nsa-validate plan` can refuse a misspelt name or a value that does not parse before
anything runs (``check``).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
from dataclasses import dataclass, field, fields
from typing import Callable, Mapping


@dataclass(frozen=True)
class Toggle:
    name: str
    kind: str  # "bool", "int", "choice", "fault", "text" (any non-empty value)
    default: object
    consumer: str
    help: str
    choices: tuple[str, ...] = ()
    # False: it changes no result of training (a launcher's label, a switch of the test suite); the test suites
    # leave such a variable as the environment sets it, and reset every other toggle before each test
    affects_run: bool = True
    maximum: int | None = None  # an "int" toggle's largest value (a larger one is refused, naming it)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

TOGGLES: dict[str, Toggle] = {
    t.name: t
    for t in (
        Toggle("NSA_PREFILL_BATCHED", "bool", None, "trainer (model config)",
               "1: vectorized prefill (cfg.prefill='batched'); 0: per-token oracle loop ('sequential'). "
               "Unset: the config decides."),
        Toggle("NSA_SEL_RANGES_V2", "bool", None, "trainer (model config)",
               "1: vectorized selection-range builder (cfg.selection='v2'); 0: the simple loop ('v1'). "
               "Unset: the config decides."),
        Toggle("NSA_KERNEL", "choice", None, "trainer (model config)",
               "Kernels of the batched path: torch (PyTorch, CPU and CUDA; the reference), triton (the GPU kernels; "
               "an error where Triton cannot run), auto (triton on CUDA when importable, else torch). Unset: the "
               "config decides (model.kernel, default auto).",
               choices=("auto", "torch", "triton")),
        Toggle("NSA_INDEX_BUILD", "choice", None, "trainer (model config)",
               "Sets model.index_build, the Triton path's inverted index of the selected blocks: triton (a counting "
               "sort in 6 Triton launches), torch (53 aten ops, the same tensors) or auto (the config's default: "
               "triton, except under Triton's interpreter, whose tl.sort is slow); unset: the config decides.",
               choices=("auto", "torch", "triton")),
        Toggle("NSA_ROPE", "choice", None, "trainer (model config)",
               "Sets model.rope, the RoPE of the dense twin (and of callers of nsa.attention.rope.rope): reference "
               "(cat of the rotated half, fp32 multiplies, a cast), fused (on CUDA the Triton path's fused RoPE "
               "kernel, elsewhere torch ops on the halves in the input dtype with cached cos/sin) or auto (the "
               "reference until a GPU A/B shows the fused one faster); unset: the config decides.",
               choices=("auto", "reference", "fused")),
        Toggle("NSA_LOSS", "choice", None, "trainer (model config)",
               "Sets model.loss, the cross entropy of NSAModel(input_ids, targets): reference (the head's logits "
               "for the whole batch, then cross entropy on an fp32 copy), chunked (the head matmul fused with the "
               "cross entropy over chunks of tokens: neither the fp32 nor the full logits are kept), fused (chunked, "
               "each chunk's loss and logit gradient in one Triton kernel; an error where Triton cannot run) or auto "
               "(the reference until a GPU A/B shows another faster); unset: the config decides.",
               choices=("auto", "reference", "chunked", "fused")),
        Toggle("NSA_DDP_COMPRESS", "choice", "none", "trainer (DDP)",
               "Gradient all-reduce compression hook: bf16 or fp16 halves the bytes sent (gradients are cast, "
               "averaged, cast back); none: plain fp32 all-reduce. Ignored (with a message) without DDP.",
               choices=("none", "bf16", "fp16")),
        Toggle("NSA_DDP_BUCKET_MB", "int", 25, "trainer (DDP)",
               "DDP gradient bucket size in MB (MiB: 1,048,576 bytes, as torch's bucket_cap_mb).", maximum=1 << 20),
        Toggle("NSA_SDPA_AUDIT", "bool", False, "trainer",
               "1: record which SDPA backend (flash/efficient/cudnn/math) served each attention call site; "
               "rank 0 writes out_dir/sdpa_audit.json."),
        Toggle("NSA_SDPA_FLASH_ONLY", "bool", False, "trainer",
               "1: allow only the flash SDPA backend (a call flash cannot serve fails loudly)."),
        Toggle("NSA_SDPA_NO_FLASH", "bool", False, "trainer",
               "1: forbid the flash SDPA backend (efficient/cudnn/math remain)."),
        Toggle("NSA_NVTX", "bool", False, "trainer",
               "1: named ranges per branch and selection stage (nsa.cmp, nsa.sel, nsa.win, nsa.sel.importance, "
               "nsa.sel.topk, nsa.sel.ranges_v2) plus per step: NVTX on CUDA, profiler ranges everywhere."),
        Toggle("NSA_TB_DISABLE", "bool", False, "trainer", "1: do not write TensorBoard scalars."),
        Toggle("NSA_DISABLE_AUX_STATS", "bool", False, "trainer",
               "1: skip the gate and selection statistics logged with the heartbeats."),
        Toggle("NSA_OPT_FUSED", "bool", None, "trainer",
               "1: torch's fused AdamW (one kernel per step over all parameters; CUDA and, from torch 2.4, CPU); "
               "0: the unfused (foreach) AdamW. Unset: unfused, until a GPU A/B qualifies the fused one on CUDA "
               "(nsa.training.optim.FUSED_BY_DEFAULT_ON). "
               "Where this torch has no fused AdamW for the parameters' device or dtype, NSA_OPT_FUSED=1 is "
               "ignored with a message and AdamW runs unfused; env.json \"optimizer\" records which ran."),
        Toggle("NSA_FAULT", "fault", None, "trainer (testing aid)",
               "Deliberate failure for testing the validation suite: crash@STEP, hang@STEP or nan@STEP, "
               "optionally :RANK (default every rank); or rank 0 damages its own training.csv after writing "
               "that step's row: csv_missing@STEP (deletes it), csv_empty@STEP (truncates it to 0 bytes), "
               "csv_truncate@STEP (cuts it in the middle of that row) - after these three no more rows are "
               "written - or csv_garble@STEP (that row's numbers become text; later rows are written); or a model "
               "fault, a real suspect made super-linearly slow: sel_v1_quadratic@SEQ makes the selection v1 range "
               "builder (NSA_SEL_RANGES_V2=0, batched prefill, torch kernels) do O(S^2) redundant work - a pairwise "
               "comparison of every query's selected blocks with every other query's of the same sequence - when a "
               "forward's sequence is longer than SEQ tokens; its output is unchanged and v2 is unaffected; or a "
               "start-up stage held: wait@imports (python -m nsa.training, before it imports torch) or "
               "wait@pg_init (right before the process group is set up), optionally :RANK - the rank writes "
               "out_dir/fault_stage_rank{r}.json at every stage it reaches (stage, waiting, pid) and waits at the "
               "named one until a signal ends it; or a uniform slowdown: slow_step@SHARE (no step, no rank) makes "
               "every rank sleep SHARE times its step's own measured time (forward, backward, optimizer) at the end of "
               "each optimizer step, inside the timed step, so tokens/s drops by SHARE / (1 + SHARE) "
               "(slow_step@0.25: 20%; SHARE > 0, at most 10). Read once at start-up; the trainer installs a model "
               "fault around the model's selection (nsa.training.model_faults). Never set it in a real run."),
        Toggle("NSA_NODE_NAME", "text", None, "trainer (node records)",
               "The name the trainer records for its node (env.json \"nodes\"): set by the launcher "
               "(node<i> for emulated nodes, $SLURMD_NODENAME under Slurm); unset: $SLURMD_NODENAME, else the host "
               "name.", affects_run=False),
        Toggle("NSA_AOT_FULL", "bool", False, "nsa.attention.kernels.aot",
               "1: compile every Triton kernel configuration ahead of time (all head groups, head dims, selection "
               "blocks and dtypes), not only one of each axis value.", affects_run=False),
        Toggle("NSA_TEST_FUSED_SELECTION", "bool", False, "tests (kernels)",
               "1: on a GPU, the kernel tests also run the fused top-k selection (not the default path until a "
               "compute-sanitizer run qualifies it; runbooks/gpu_kernels.yaml runs them in processes of their own).",
               affects_run=False),
        Toggle("NSA_TEST_NO_BOUNDS", "bool", False, "tests (kernels)",
               "1: the interpreted kernel tests run without the address check (nsa.attention.kernels.interpreter_check), "
               "to tell a fault of the check from one of a kernel.", affects_run=False),
        Toggle("NSA_TEST_OVERFLOW_CHECK", "bool", False, "tests (kernels)",
               "1: the interpreted kernel tests keep the interpreter's integer-overflow check of every 32-bit add, "
               "sub and mul (tests/nsa/interpreter_speed.py: a third of an interpreted kernel's time, and asserted "
               "only in the interpreter's debug mode).", affects_run=False),
        Toggle("NSA_FUZZ_COUNTS_OUT", "text", None, "tests (fuzz)",
               "A JSON file the fuzz tests merge the number of examples they tried into.", affects_run=False),
    )
}

STEP_FAULT_KINDS = ("crash", "hang", "nan", "csv_missing", "csv_empty", "csv_truncate", "csv_garble")
CSV_FAULT_KINDS = tuple(k for k in STEP_FAULT_KINDS if k.startswith("csv_"))  # rank 0 only: it writes training.csv
MODEL_FAULT_KINDS = ("sel_v1_quadratic",)  # KIND@SEQ: the model itself slowed above SEQ tokens (no step, no rank)
WAIT_STAGES = ("imports", "pg_init")  # wait@STAGE[:RANK]: a start-up stage held (nsa.training.safety.wait_at)
# KIND@SHARE: every step made slower by a share of its own time (no step, no rank: every rank, every step)
SLOW_FAULT_KINDS = ("slow_step",)
SLOW_SHARE_MAX = 10.0
FAULT_KINDS = STEP_FAULT_KINDS + MODEL_FAULT_KINDS + ("wait",) + SLOW_FAULT_KINDS


@dataclass(frozen=True)
class Fault:
    """A deliberate failure (NSA_FAULT): `kind` at optimizer step `step` on `rank` (None: every rank); or a model
    fault (MODEL_FAULT_KINDS) that bites when a sequence is longer than `seq_len` tokens (step is then None); or
    "wait" at start-up stage `stage` (WAIT_STAGES) on `rank` (step is then None); or "slow_step", every step of
    every rank made slower by `share` of its own time (step is then None)."""

    kind: str
    step: int | None
    rank: int | None = None
    seq_len: int | None = None
    stage: str | None = None
    share: float | None = None

    def fires(self, step: int, rank: int) -> bool:
        """Whether a step fault fires at this step on this rank (never for a model fault)."""
        return self.step is not None and step == self.step and (self.rank is None or self.rank == rank)


def _digits(text: str) -> bool:
    """Whether `text` is an ASCII decimal number (str.isdigit also takes '٣' and '²')."""
    return text.isascii() and text.isdigit()


def _parse_fault(value: str) -> Fault:
    kind, at, rest = value.partition("@")
    number, colon, rank_text = rest.partition(":")
    if colon and not _digits(rank_text):  # "crash@3:" names no rank: an error, not every rank
        raise ValueError(value)
    if kind == "wait":
        if number not in WAIT_STAGES or rest.count(":") > 1:
            raise ValueError(value)
        return Fault("wait", None, int(rank_text) if rank_text else None, stage=number)
    if kind in SLOW_FAULT_KINDS:
        share = float(number) if at and rest == number and _digits(number.replace(".", "", 1)) else math.nan
        if not 0 < share <= SLOW_SHARE_MAX:  # also NaN: no share, a :RANK, or a share that is not a plain number
            raise ValueError(value)
        return Fault(kind, None, share=share)
    if kind not in FAULT_KINDS or not at or not _digits(number):
        raise ValueError(value)
    if kind in MODEL_FAULT_KINDS:
        if rank_text or rest != number:
            raise ValueError(value)  # a model fault is in every rank's model: no :RANK
        return Fault(kind, None, None, int(number))
    if int(number) < 1:
        raise ValueError(value)  # steps count from 1: a fault at step 0 would never fire
    rank = int(rank_text) if rank_text else None
    if kind in CSV_FAULT_KINDS and rank not in (None, 0):
        raise ValueError(value)  # only rank 0 writes training.csv
    return Fault(kind, int(number), rank)


def parse(name: str, environ: Mapping[str, str] | None = None):
    """The typed value of toggle `name` from `environ` (default: os.environ); its default when unset."""
    toggle = TOGGLES[name]
    env = os.environ if environ is None else environ
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return toggle.default
    value = raw.strip().lower()
    parsers: dict[str, Callable[[str], object]] = {
        "bool": _parse_bool,
        "int": lambda v: _parse_positive_int(v, toggle.maximum),
        "choice": lambda v: v if v in toggle.choices else _bad(v),
        "fault": _parse_fault,
        "text": lambda v: raw.strip(),
    }
    try:
        return parsers[toggle.kind](value)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is invalid: expected {expected(name)}") from None


def expected(name: str) -> str:
    """The values toggle `name` takes, in words (what an error about it says)."""
    toggle = TOGGLES[name]
    return {"bool": "0 or 1", "int": "a positive integer" + _at_most(toggle), "choice": " | ".join(toggle.choices),
            "fault": "crash@STEP, hang@STEP or nan@STEP (STEP from 1), optionally :RANK; or csv_missing@STEP, "
                     "csv_empty@STEP, csv_truncate@STEP or csv_garble@STEP (rank 0 only); or "
                     "sel_v1_quadratic@SEQ (no rank); or wait@imports or wait@pg_init, optionally :RANK; or "
                     f"slow_step@SHARE (a number > 0 and at most {SLOW_SHARE_MAX:g}, no rank)",
            "text": "any value"}[toggle.kind]


PREFIX = "NSA_"  # the project's variables; any other name (NCCL_*, TORCH_*, OMP_*, ...) is not checked here


def closest(name: str, n: int = 3) -> list[str]:
    """The known NSA_* names closest to `name` (difflib): the best and any as close (within 0.05 of its
    similarity), at most n; [] when none is close."""
    near = difflib.get_close_matches(name, list(TOGGLES), n=n, cutoff=0.6)
    ratio = {m: difflib.SequenceMatcher(None, name, m).ratio() for m in near}
    return [m for m in near if ratio[m] >= ratio[near[0]] - 0.05]


def check(name: str, value: str) -> str | None:
    """Why setting environment variable `name` to `value` is wrong, or None: an NSA_* name that is not in the
    table (with the closest known names) or a value that does not parse for the toggle's type. Names without the
    NSA_ prefix pass; so does an empty value (unset: the default)."""
    if not name.startswith(PREFIX):
        return None
    if name not in TOGGLES:
        near = closest(name)
        hint = f"did you mean {' or '.join(near)}?" if near else "`python -m nsa.toggles` lists them"
        return f"{name} is not a known NSA_* variable ({hint})"
    try:
        parse(name, {name: value})
    except ValueError:
        return f"{name}={value!r} is invalid: expected {expected(name)}"
    return None


def _parse_bool(value: str) -> bool:
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(value)


def _parse_positive_int(value: str, maximum: int | None = None) -> int:
    if not _digits(value):  # int() also takes '+5', '1_0', '٢٥' and '２５': not a count as written here
        raise ValueError(value)
    number = int(value)
    if number <= 0 or (maximum is not None and number > maximum):
        raise ValueError(value)
    return number


def _at_most(toggle: Toggle) -> str:
    return "" if toggle.maximum is None else f" (at most {toggle.maximum:,})"


def _bad(value: str):
    raise ValueError(value)


@dataclass
class Toggles:
    """The trainer's environment toggles, read once at start-up (``read``) and passed down: the model config takes
    the layer toggles from here (nsa.config.NSAConfig.with_toggles), nothing reads them again. env.json records
    them (``record``)."""

    ddp_compress: str
    ddp_bucket_mb: int
    sdpa_audit: bool
    sdpa_flash_only: bool
    sdpa_no_flash: bool
    nvtx: bool
    tb_disable: bool
    aux_stats_disable: bool
    opt_fused: bool | None  # None: the default of nsa.training.optim.use_fused_adamw
    fault: Fault | None
    kernel: str | None  # NSA_KERNEL as set (None: the config decides)
    # NSA_PREFILL_BATCHED / NSA_SEL_RANGES_V2 as set (None: the config decides). Not in env.json's "toggles", whose
    # keys stay those it has always had: env.json records these variables under "env", their effect in the kernel
    prefill_batched: bool | None = field(default=None, metadata={"recorded": False})
    sel_ranges_v2: bool | None = field(default=None, metadata={"recorded": False})
    index_build: str | None = field(default=None, metadata={"recorded": False})  # NSA_INDEX_BUILD as set
    rope: str | None = field(default=None, metadata={"recorded": False})  # NSA_ROPE as set
    loss: str | None = field(default=None, metadata={"recorded": False})  # NSA_LOSS as set
    # NSA_* names in the environment that are no toggle (a misspelling: NSA_DDP_COMPRES), each with the closest
    # known names; the trainer says each is ignored (env.json records every NSA_* variable under "env")
    unknown: tuple[str, ...] = field(default=(), metadata={"recorded": False})

    @classmethod
    def read(cls, environ=None) -> "Toggles":
        p = lambda name: parse(name, environ)  # noqa: E731
        t = cls(ddp_compress=p("NSA_DDP_COMPRESS"), ddp_bucket_mb=p("NSA_DDP_BUCKET_MB"),
                sdpa_audit=p("NSA_SDPA_AUDIT"), sdpa_flash_only=p("NSA_SDPA_FLASH_ONLY"),
                sdpa_no_flash=p("NSA_SDPA_NO_FLASH"), nvtx=p("NSA_NVTX"), tb_disable=p("NSA_TB_DISABLE"),
                aux_stats_disable=p("NSA_DISABLE_AUX_STATS"), opt_fused=p("NSA_OPT_FUSED"), fault=p("NSA_FAULT"),
                kernel=p("NSA_KERNEL"), prefill_batched=p("NSA_PREFILL_BATCHED"),
                sel_ranges_v2=p("NSA_SEL_RANGES_V2"), index_build=p("NSA_INDEX_BUILD"),
                rope=p("NSA_ROPE"), loss=p("NSA_LOSS"),
                unknown=tuple(sorted(filter(None, (check(name, "") for name in
                                                   (os.environ if environ is None else environ)
                                                   if name.startswith(PREFIX) and name not in TOGGLES)))))
        problem = combination_problem(environ)
        if problem:
            raise ValueError(problem)
        return t

    def record(self) -> dict[str, str]:
        """env.json's "toggles": {field: its value as text}, the fault as its fields' dict (its "share" only for a
        slow_step fault, so that the other faults keep the text they always had)."""
        recorded = {f.name for f in fields(self) if f.metadata.get("recorded", True)}
        out = dataclasses.asdict(self)
        if isinstance(out.get("fault"), dict) and out["fault"].get("share") is None:
            out["fault"].pop("share", None)
        return {k: str(v) for k, v in out.items() if k in recorded}


def combination_problem(environ=None) -> str | None:
    """Why the toggles of `environ` (default: os.environ) cannot be set together, or None: each may parse and the
    pair still contradict (the trainer refuses it at start-up; the runbook loader, before anything runs)."""
    if parse("NSA_SDPA_FLASH_ONLY", environ) and parse("NSA_SDPA_NO_FLASH", environ):
        return "NSA_SDPA_FLASH_ONLY=1 and NSA_SDPA_NO_FLASH=1 contradict each other"
    return None


def table_markdown() -> str:
    rows = ["| variable | values | default | used by | meaning |", "|---|---|---|---|---|"]
    for t in TOGGLES.values():
        values = {"bool": "0/1", "int": "positive integer" + _at_most(t), "choice": "/".join(t.choices),
                  "fault": "KIND@STEP[:RANK], KIND@SEQ, wait@STAGE[:RANK] or slow_step@SHARE", "text": "text"}[t.kind]
        default = "unset" if t.default is None else str(int(t.default)) if t.kind == "bool" else str(t.default)
        rows.append(f"| `{t.name}` | {values} | {default} | {t.consumer} | {t.help} |")
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover
    print(table_markdown())
