"""Formatting for reports: every helper accepts anything (results.json may be damaged or from another version)
and returns a string or a plain container, never raises. Step kinds format their report views with these."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any, Iterable, Iterator

from validation.results.model import FAILED_STEP_STATUSES

NA = "n/a"
FAILED_STATUSES = FAILED_STEP_STATUSES  # a step that ran and did not pass
# Statuses in words (reports never rely on emoji, which need a font to appear): (word, css class).
STATUS_LABELS = {
    "passed": ("PASSED", "pass"),
    "failed": ("FAILED", "fail"),
    "error": ("ERROR", "error"),
    "hang": ("HANG", "fail"),
    "timeout": ("TIMEOUT", "fail"),
    "skipped": ("SKIPPED", "skip"),
    "pending": ("PENDING", "warn"),
    "interrupted": ("INTERRUPTED", "warn"),
    "running": ("RUNNING", "warn"),
}
CRITERION_LABELS = {
    "pass": ("PASS", "pass"),
    "fail": ("FAIL", "fail"),
    "warn": ("WARN", "warn"),
    "skipped": ("SKIPPED", "skip"),
    "error": ("ERROR", "error"),
    "inconclusive": ("INCONCLUSIVE", "warn"),
}
VERDICT_LABELS = {  # verdict -> css class
    "GO": "go",
    "NO-GO": "nogo",
    "INCOMPLETE": "incomplete",
}


def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def finite(value: Any) -> float | None:
    """A real number as float, or None (bools, strings, NaN and inf are not numbers here, nor an integer past a
    float's range)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        value = float(value)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None


def fmt_num(value: Any) -> str:
    """A value as a short human-readable string: 5843.2 -> '5,843.2', 0.62 -> '0.62', 1e308 -> '1e+308', None ->
    'n/a'."""
    if value is None:
        return NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return NA
        if abs(value) >= 1e15:  # past what a figure of ours reaches: 1e+308, not a 400-character number
            return f"{value:.4g}"
        if abs(value) >= 100:
            return f"{value:,.1f}"
        if value == int(value):
            return f"{int(value)}"
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(fmt_num(v) for v in value) if value else NA
    if isinstance(value, dict):
        return ", ".join(f"{k}={fmt_num(value[k])}" for k in sorted(value, key=str)) if value else NA
    text = str(value)
    return text if text.strip() else NA


def fmt_rate(value: Any) -> str:
    """Tokens per second: thousands separators, one decimal (past 1e15, an impossible figure, as fmt_num: 4.096e+18)."""
    v = finite(value)
    return NA if v is None else fmt_num(v) if abs(v) >= 1e15 else f"{v:,.1f}"


def against_one(low: float, high: float) -> str:
    """Whether an efficiency's interval [low, high] is resolved against 1.0 (perfect scaling), in words."""
    return "below 1.0" if high < 1.0 else "above 1.0" if low > 1.0 else "not resolved from 1.0"


def fmt_pct(fraction: Any, signed: bool = False, digits: int = 1) -> str:
    """A fraction as a percentage, the one way every report, console line and `compare` table prints one:
    thousands separators, `digits` decimals, never scientific notation. 14.228 -> '1,422.8%' ('+1,422.8%' signed),
    -0.05 -> '-5.0%', None / NaN / text -> 'n/a'."""
    v = finite(fraction)
    if v is None:
        return NA
    return f"{v * 100:{'+' if signed else ''},.{max(0, int(digits))}f}%"


def fmt_gb(value: Any) -> str:
    """A memory figure in GiB (1024**3 bytes: every *_gb figure the trainer and the telemetry write) with its unit:
    '3.25 GiB'."""
    v = finite(value)
    return NA if v is None else f"{v:.2f} GiB"


def fmt_p(value: Any) -> str:
    v = finite(value)
    if v is None:
        return NA
    return "< 0.001" if v < 0.001 else f"{v:.3f}"


def fmt_duration(seconds: Any) -> str:
    v = finite(seconds)
    if v is None or v < 0:
        return NA
    if v < 60:
        return f"{v:.1f} s"
    total = int(round(v))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m {secs:02d}s" if hours else f"{minutes}m {secs:02d}s"


def stat_of(metrics: dict, key: str) -> dict:
    """metrics[key] as a statistics dict ({mean, stdev, ...}); a bare number becomes {"mean": number}."""
    value = metrics.get(key)
    if isinstance(value, dict):
        return value
    if finite(value) is not None:
        return {"mean": value}
    return {}


def mean_pm(stat: dict) -> str:
    mean, stdev = finite(stat.get("mean")), finite(stat.get("stdev"))
    if mean is None:
        return NA
    return f"{mean:,.1f} ± {stdev:,.1f}" if stdev is not None else f"{mean:,.1f}"


def window_text(value: Any) -> str:
    if value is None:
        return NA
    if isinstance(value, str):
        return value or NA
    if isinstance(value, int) and not isinstance(value, bool):
        return f"last {value} steps"
    if isinstance(value, dict):
        for key in ("description", "label", "rule"):
            if isinstance(value.get(key), str) and value[key]:
                return value[key]
        first = next((value[k] for k in ("first_step", "start", "from") if k in value), None)
        last = next((value[k] for k in ("last_step", "end", "to") if k in value), None)
        n = value.get("n", value.get("steps"))
        if first is not None and last is not None:
            text = f"steps {fmt_num(first)}–{fmt_num(last)}"
            return f"{text} (n={fmt_num(n)})" if n is not None else text
        if n is not None:
            return f"last {fmt_num(n)} steps"
        return fmt_num(value)
    return fmt_num(value)


def loss_text(metrics: dict) -> str:
    first = next((metrics[k] for k in ("initial_loss", "first_loss", "loss_first", "loss_start")
                  if finite(metrics.get(k)) is not None), None)
    last = next((metrics[k] for k in ("final_loss", "last_loss", "loss_last", "loss_end")
                 if finite(metrics.get(k)) is not None), None)
    if first is not None and last is not None:
        drop = (first - last) / first if first else None
        text = f"{first:.3f} → {last:.3f}"
        return f"{text} (−{fmt_pct(drop)})" if drop is not None and drop >= 0 else (
            f"{text} ({fmt_pct(-drop, signed=True)})" if drop is not None else text)
    drop = finite(metrics.get("loss_drop"))
    if drop is not None:
        return f"drop {drop:.3f}"
    if last is not None:
        return f"final {last:.3f}"
    return NA


def param_name(key: str) -> str:
    return key[4:] if key.startswith("env.") else key


def params_text(params: Any) -> str:
    params = as_dict(params)
    return ", ".join(f"{param_name(str(k))}={fmt_num(params[k])}" for k in sorted(params, key=str)) or "—"


def status_view(status: Any, table: dict = STATUS_LABELS) -> dict:
    """{"value", "word", "label", "css"} of a step or criterion status: the word (PASSED, FAIL, ...) is the label."""
    key = str(status) if status is not None else "unknown"
    word, css = table.get(key, (key.upper(), "unknown"))
    return {"value": key, "word": word, "label": word, "css": css}


# A terminal's escape sequences (colours, cursor moves: CSI and OSC) in captured output, and the characters XML 1.0
# forbids (C0 controls but tab, newline and carriage return; lone surrogates; U+FFFE/U+FFFF), which HTML calls
# parse errors too; DEL and the C1 controls, which no report means to show, with them
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_NOT_TEXT = re.compile("[^\u0009\u000a\u000d\u0020-\u007e\u00a0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def printable(value: Any) -> str:
    """A value as text every report format can hold: a terminal's escape sequences removed (a coloured traceback
    reads as its text) and every other control character, or one XML 1.0 forbids, as U+FFFD (shown, not silently
    dropped). Tab, newline and carriage return stay."""
    text = "" if value is None else str(value)
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return _NOT_TEXT.sub("\ufffd", text)


def fence(text: str) -> str:
    """A Markdown code fence longer than any backtick run inside text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def command_text(argv: Any) -> str:
    argv = as_list(argv)
    return shlex.join(str(a) for a in argv) if argv else ""


def run_command(runbook: Any, *, out: Any = None, resume: Any = None, rerun: Iterable[Any] = (),
                only: Iterable[Any] = (), skip: Iterable[Any] = (), overrides: Iterable[Any] = (),
                reuse: Iterable[Any] = (), against: Any = None, no_report: bool = False) -> str:
    """The `nsa-validate run` command line a message or a report suggests, every word shell-quoted: RUNBOOK, then
    --out or --resume, --rerun, --only, --skip, --set, --reuse, --against and --no-report in that order (each
    repeated as given, duplicates of --rerun dropped). With the run's own --set (validation.results.run.Run.overrides)
    it runs what ran."""
    words = ["nsa-validate", "run", str(runbook)]
    if out is not None:
        words += ["--out", str(out)]
    if resume is not None:
        words += ["--resume", str(resume)]
    for flag, values in (("--rerun", dict.fromkeys(map(str, rerun))), ("--only", only), ("--skip", skip),
                         ("--set", overrides), ("--reuse", reuse)):
        for value in values:
            words += [flag, str(value)]
    if against is not None:
        words += ["--against", str(against)]
    return shlex.join(words + (["--no-report"] if no_report else []))


def env_text(env: Any, skip: Iterable[str] = ("CONFIG",)) -> str:
    env = as_dict(env)
    items = [f"{k}={env[k]}" for k in sorted(env, key=str) if k not in skip]
    return ", ".join(items) if items else "—"


def file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "step"



# --------------------------------------------------------------------------------------------------------------
# What a tokens/s figure means: the run's shape beside it (metrics "context" and "tflops_per_s", validation.kinds.trainer)

CONTEXT_FIELDS = ("seq_len", "micro_batch", "accum", "world_size", "global_batch_tokens", "n_params", "precision")


def fmt_count(value: Any) -> str:
    """A parameter count: 186296 -> '186.3K', 124_500_000 -> '124.5M', 1.3e9 -> '1.30B'."""
    v = finite(value)
    if v is None:
        return NA
    for scale, suffix, digits in ((1e9, "B", 2), (1e6, "M", 1), (1e3, "K", 1)):
        if abs(v) >= scale:
            return f"{v / scale:.{digits}f}{suffix}"
    return f"{v:.0f}"


def fmt_tflops(value: Any) -> str:
    """Achieved model TFLOP/s (all ranks): three significant digits, small CPU figures included."""
    v = finite(value)
    if v is None:
        return NA
    if abs(v) >= 100:
        return f"{v:,.1f}"
    if v == 0:
        return "0"
    # three significant digits in plain notation (0.0000539, never 5.39e-05)
    decimals = max(0, 2 - int(math.floor(math.log10(abs(v)))))
    return f"{v:.{decimals}f}"


def mfu_text(metrics: Any, why: bool = True) -> str:
    """The window's mean model FLOPs utilization (training.csv's mfu column), or n/a, with why when `why` and the
    run recorded no device peak."""
    metrics = as_dict(metrics)
    mean = finite(stat_of(metrics, "mfu").get("mean"))
    if mean is not None:
        return fmt_pct(mean)
    ctx = as_dict(metrics.get("context"))
    if why and ctx and finite(ctx.get("peak_flops")) is None:
        return f"{NA} (device peak unknown)"
    return NA


def rate_with_mfu(toks_per_s: Any, mfu: Any) -> str:
    """A tokens/s figure with its MFU beside it where one was recorded: '18,593.2 (MFU 29.5%)', else '18,593.2'."""
    return fmt_rate(toks_per_s) + (f" (MFU {fmt_pct(mfu)})" if finite(mfu) is not None else "")


def context_parts(metrics: Any) -> list[tuple[str, str]]:
    """(label, value) of the run shape beside a tokens/s figure: sequence length, micro-batch, accumulation, world
    size, global batch in tokens, model parameters, precision, TFLOP/s, MFU. Unknown fields are left out (results
    written before they existed); TFLOP/s and MFU say n/a when the others are known."""
    metrics = as_dict(metrics)
    ctx = as_dict(metrics.get("context"))
    parts = []
    for key, label in (("seq_len", "seq_len"), ("micro_batch", "micro-batch"), ("accum", "accum"),
                       ("world_size", "world size")):
        value = ctx.get(key, metrics.get(key) if key == "world_size" else None)
        if finite(value) is not None:
            parts.append((label, fmt_num(value)))
    if finite(ctx.get("global_batch_tokens")) is not None:
        parts.append(("global batch", f"{fmt_num(ctx['global_batch_tokens'])} tokens"))
    if finite(ctx.get("n_params")) is not None:
        parts.append(("params", fmt_count(ctx["n_params"])))
    if ctx.get("precision"):
        parts.append(("precision", str(ctx["precision"])))
    if ctx or finite(metrics.get("tflops_per_s")) is not None:
        parts.append(("TFLOP/s", fmt_tflops(metrics.get("tflops_per_s"))))
        parts.append(("MFU", mfu_text(metrics)))
    return parts


def context_text(metrics: Any) -> str:
    """context_parts as one line: 'seq_len 256, micro-batch 4, accum 1, world size 2, global batch 2,048 tokens,
    params 186.3K, precision fp32, TFLOP/s 0.0439, MFU n/a (device peak unknown)'; "" when nothing is known."""
    return ", ".join(f"{label} {value}" for label, value in context_parts(metrics))


def shared_context_text(metrics_list: Iterable[Any], per_row: Iterable[str] = ("TFLOP/s", "MFU")) -> str:
    """context_text of several runs of one step (a sweep's points, an A/B's variants), each field once: its value
    when the runs agree, 'a / b / c' in run order when they differ (e.g. a sweep over args.batch_size). Fields in
    `per_row` (TFLOP/s and MFU, which such tables show per run) appear only when every run has the same value
    (e.g. 'MFU n/a (device peak unknown)')."""
    values: dict[str, list[str]] = {}
    for metrics in metrics_list:
        for label, value in context_parts(metrics):
            seen = values.setdefault(label, [])
            if value not in seen:
                seen.append(value)
    skip = set(per_row)
    return ", ".join(f"{label} {' / '.join(vals)}" for label, vals in values.items()
                     if label not in skip or len(vals) == 1)


PLOT_CONTEXT_FIELDS = (("seq_len", "seq_len"), ("micro_batch", "micro-batch"), ("precision", ""),
                       ("world_size", "world size"), ("device", "device"))


def plot_context_text(metrics_list: Iterable[Any]) -> str:
    """What a plot of one step measured, for its title and caption: 'seq_len 256 · micro-batch 4 · fp32 · world size
    2 · device cpu' from the runs' metrics "context" (validation.contracts.run_context); a field whose runs differ
    shows its values 'a / b'; "" when nothing is known."""
    values: dict[str, list[str]] = {}
    for metrics in metrics_list:
        ctx = as_dict(as_dict(metrics).get("context"))
        for key, _ in PLOT_CONTEXT_FIELDS:
            value = ctx.get(key)
            if value is None or value == "":
                continue
            text = fmt_num(value) if finite(value) is not None else str(value)
            seen = values.setdefault(key, [])
            if text not in seen:
                seen.append(text)
    parts = []
    for key, label in PLOT_CONTEXT_FIELDS:
        if key in values:
            parts.append(f"{label} {' / '.join(values[key])}".strip())
    return " · ".join(parts)


def first_of(items: Iterable[Any], most: int, sep: str = "; ") -> str:
    """The first `most` items joined by `sep`, then "and N more" for the rest: "a; b; and 3 more"."""
    items = [str(i) for i in items]
    more = f"{sep}and {len(items) - most} more" if len(items) > most else ""
    return sep.join(items[:most]) + more


def plural(n: Any, word: str, many: str | None = None) -> str:
    """'1 sample', '2 samples', 'n/a samples' (many: the plural when it is not word + 's')."""
    v = finite(n)
    text = fmt_num(int(v)) if v is not None and v == int(v) else fmt_num(n)
    return f"{text} {word if v == 1 else (many or word + 's')}"


def steps_in_order(results: dict) -> Iterator[tuple[str, Any]]:
    """(step name, its record as results.json holds it, None when it has none) of every step in runbook order: the
    walk the report's plots, findings, open problems and validated command each make."""
    steps = as_dict(results.get("steps"))
    for _, names in ordered_steps(results):
        for name in names:
            yield name, steps.get(name)


def ordered_steps(results: dict) -> list[tuple[dict, list[str]]]:
    """(phase, [step names]) in runbook order, plus an 'other' phase for steps no phase lists."""
    steps = as_dict(results.get("steps"))
    phases = [as_dict(p) for p in as_list(results.get("phases"))]
    listed: set[str] = set()
    out = []
    for phase in phases:
        names = [str(n) for n in as_list(phase.get("steps"))]
        listed.update(names)
        out.append((phase, names))
    others = sorted(str(n) for n in steps if str(n) not in listed)
    if others:
        out.append(({"name": "other", "title": "Other steps", "description": None}, others))
    return out
