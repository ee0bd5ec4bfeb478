"""Formatting for reports: every helper accepts anything (results.json may be damaged or from another version)
and returns a string or a plain container, never raises. Step kinds format their report views with these."""

from __future__ import annotations

import math
import re
import shlex
from typing import Any, Iterable

NA = "n/a"
FAILED_STATUSES = ("failed", "hang", "timeout", "error")
STATUS_LABELS = {
    "passed": ("✅", "PASSED", "pass"),
    "failed": ("❌", "FAILED", "fail"),
    "error": ("❗", "ERROR", "error"),
    "hang": ("❌", "HANG", "fail"),
    "timeout": ("⏱", "TIMEOUT", "fail"),
    "skipped": ("⏭", "SKIPPED", "skip"),
    "pending": ("⏳", "PENDING", "warn"),
    "interrupted": ("⚠️", "INTERRUPTED", "warn"),
    "running": ("⏳", "RUNNING", "warn"),
}
CRITERION_LABELS = {
    "pass": ("✅", "PASS", "pass"),
    "fail": ("❌", "FAIL", "fail"),
    "warn": ("⚠️", "WARN", "warn"),
    "skipped": ("⏭", "SKIPPED", "skip"),
    "error": ("❗", "ERROR", "error"),
}
VERDICT_LABELS = {
    "GO": ("✅", "go"),
    "NO-GO": ("❌", "nogo"),
    "INCOMPLETE": ("⚠️", "incomplete"),
}



def as_dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list:
    return list(value) if isinstance(value, (list, tuple)) else []


def finite(value: Any) -> float | None:
    """A real number as float, or None (bools, strings, NaN and inf are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def fmt_num(value: Any) -> str:
    """A value as a short human-readable string: 5843.2 -> '5,843.2', 0.62 -> '0.62', None -> 'n/a'."""
    if value is None:
        return NA
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if not math.isfinite(value):
            return NA
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
    """Tokens per second: thousands separators, one decimal."""
    v = finite(value)
    return NA if v is None else f"{v:,.1f}"


def fmt_pct(fraction: Any, signed: bool = False) -> str:
    v = finite(fraction)
    if v is None:
        return NA
    return f"{v * 100:+.1f}%" if signed else f"{v * 100:.1f}%"


def fmt_gb(value: Any) -> str:
    v = finite(value)
    return NA if v is None else f"{v:.2f} GB"


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
        return f"{text} (−{drop * 100:.1f}%)" if drop is not None and drop >= 0 else (
            f"{text} (+{-drop * 100:.1f}%)" if drop is not None else text)
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
    key = str(status) if status is not None else "unknown"
    icon, word, css = table.get(key, ("❔", key.upper(), "unknown"))
    return {"value": key, "icon": icon, "word": word, "label": f"{icon} {word}", "css": css}


def fence(text: str) -> str:
    """A Markdown code fence longer than any backtick run inside text."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def command_text(argv: Any) -> str:
    argv = as_list(argv)
    return shlex.join(str(a) for a in argv) if argv else ""


def env_text(env: Any, skip: Iterable[str] = ("CONFIG",)) -> str:
    env = as_dict(env)
    items = [f"{k}={env[k]}" for k in sorted(env, key=str) if k not in skip]
    return ", ".join(items) if items else "—"


def file_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._") or "step"

