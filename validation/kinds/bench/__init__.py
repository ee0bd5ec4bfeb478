"""`bench`: a benchmark script run with this Python, given `--json PATH`; the JSON it writes is the step's metrics
(e.g. benchmarks/bench_selection.py: ranges_speedup_min, forward_speedup_min, ...), usable in criteria.

Own keys: `command: [script, args...]` (the argv after the python executable; required); `best: {by: FIELD, max:
FIELD}` (or `min: FIELD`), for a benchmark whose JSON is a list of records (metrics "results", e.g.
benchmarks/bench_train.py's: one row per case with "model", "mode", "toks_per_s", or "error" for a case that failed):
metrics "best" maps each value of the `by` field to its record with the largest (smallest) number in FIELD, among
the records that have both fields and no "error"; criteria read it by name, whatever the order or number of rows, e.g.
`train_bench.best.nsa.toks_per_s >= 0.55 * train_bench.best.dense.toks_per_s`. Launch keys: env, timeout_s,
launcher. A benchmark that writes no JSON, an empty or unparseable file (cut off, not UTF-8 text), a value that is
no record (a number, a string), an empty record, or one nested deeper than MAX_NESTING (100) levels of lists and
objects fails, saying which. Python's json writes a NaN or an infinity as the bare word NaN / Infinity (not JSON,
which has none; results.json holds none either): such a figure is recorded as null, a criterion reading it is an
error, and a note names each one; so is an integer past a float's range (which Python's json reads exactly, but which
no figure can be compared with).
Its launch is sampled like a trainer's (telemetry.csv): what else used the machine while it ran is judged over the
whole launch (results.json step "interference").
Report (blocks): its scalar figures, and a table per list of records (e.g. by_seq_len) and for "best".

Options: the keys above. Result: the step record, its metrics the benchmark's JSON as written (a mapping; a list of
records becomes {"results": [...]}, with "best" beside it).
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from pathlib import Path
from typing import Any

from validation import contracts
from validation import kinds
from validation.analysis.interference import launch_record
from validation.launch import telemetry
from validation.launch.local import set_aside
from validation.launch.telemetry import INTERVAL_S as TELEMETRY_INTERVAL_S
from validation.formatting import as_dict, as_list, finite, first_of, fmt_num, plural
from validation.runbook.schema import mapping, str_list, typed
from validation.kinds.base import COMMAND_LAUNCH_KEYS, StepKind, command_launch, run_path
from validation.kinds.blocks import Block, Column, Paragraph, Table, code
from validation.results.run import Step as StepRecord


@dataclasses.dataclass(frozen=True)
class Best:
    """`best: {by: FIELD, max: FIELD}` (or min): per value of `by`, the record with the largest (smallest) `field`."""
    by: str
    field: str
    largest: bool = True


@dataclasses.dataclass(frozen=True)
class Options:
    command: list[str]  # the argv after the python executable
    best: Best | None = None


@dataclasses.dataclass(frozen=True)
class Result(StepRecord):
    """A bench step's record: its metrics are the benchmark's own JSON (free form: metrics "*")."""


class Bench(StepKind):
    name = "bench"
    listing = 60
    summary = "a benchmark script that writes JSON (`--json`); e.g. selection v2 vs v1 speed"
    keys = ("command", "best")
    metrics = ("*",)  # whatever JSON the benchmark writes
    performance = ("*",)  # a benchmark measures speed
    launch_keys = COMMAND_LAUNCH_KEYS
    result_type = Result

    def parse(self, raw: dict, path: tuple, ctx) -> Options:
        command = str_list(raw.get("command"), path + ("command",), ctx)
        if not command:
            raise ctx.error(path + ("command",), "a bench step needs command: [script, args...]")
        best = None
        if raw.get("best") is not None:
            spec = mapping(raw["best"], path + ("best",), ctx, ("by", "max", "min"), required=("by",))
            if ("max" in spec) == ("min" in spec):
                raise ctx.error(path + ("best",), "expected {by: FIELD, max: FIELD} or {by: FIELD, min: FIELD}")
            order = "max" if "max" in spec else "min"
            best = Best(by=typed(spec["by"], str, path + ("best", "by"), ctx),
                        field=typed(spec[order], str, path + ("best", order), ctx), largest=order == "max")
        return Options(command=command, best=best)

    def input_files(self, step):
        script = step.command[0]  # `python SCRIPT ...`; an interpreter option (-m module, -c code) is no file
        return [] if script.startswith("-") else [(("command", 0), script)]

    def launches(self, step, winners, run_dir):
        argv = [sys.executable, *step.command, "--json", run_path(run_dir, f"{step.name}/bench.json")]
        # sampled like a trainer launch: what else used the machine while the benchmark measured
        return [dataclasses.replace(command_launch(step, argv, run_dir), telemetry_s=TELEMETRY_INTERVAL_S)]

    def run(self, options: Options, ctx) -> Result:
        spec = ctx.launches[0]
        written = ctx.run_dir / spec.dir / "bench.json"
        set_aside(written, "prev")  # an earlier attempt's figures (--resume, --rerun) are never this launch's
        lr = ctx.launch(spec, 0, 1)
        interference = launch_record(telemetry.interference(contracts.read_telemetry(ctx.run_dir / spec.dir)))
        data, problem = read_bench_json(written)
        metrics, not_finite = finite_figures(data if isinstance(data, dict) else {"results": data})
        if options.best and isinstance(metrics.get("results"), list):
            metrics["best"] = best_records(metrics["results"], options.best)
        if lr.status != "ok":
            status, reason = lr.status, lr.reason
        elif problem is not None:
            status, reason = "failed", problem
        else:
            status, reason = "passed", None
        notes = None
        if not_finite:  # a criterion reading one is an error (None is no number), never a pass
            verb = "is" if len(not_finite) == 1 else "are"
            notes = [f"{written.name} holds {plural(len(not_finite), 'figure')} that {verb} not a finite number, "
                     f"recorded as null: {first_of(not_finite, 6, sep=', ')}"]
        # the file the figures came from, whatever the launch's outcome (a failed case's record is in it)
        return Result(status=status, reason=reason, metrics=metrics, interference=interference, notes=notes,
                      artifacts=[ctx.rel(written)] if problem is None else [])

    def blocks(self, result: Result) -> list[Block]:
        """A benchmark's JSON: its scalar figures, and one table per list of records (e.g. by_seq_len)."""
        metrics = as_dict(result.metrics)
        scalars: list[tuple[str, str]] = []
        tables: list[Block] = []
        for key in sorted(metrics, key=str):
            value = metrics[key]
            if key == "best" and isinstance(value, dict):  # {group: record}: one row per group
                value = [{"best of": group, **as_dict(record)} for group, record in value.items()]
            records = [as_dict(v) for v in as_list(value)]
            if records and all(isinstance(v, dict) for v in as_list(value)):
                columns = sorted({str(k) for r in records for k in r})
                tables += [Paragraph(f"{code(key)}:"),
                           Table(tuple(Column(c, numeric=True) for c in columns),
                                 tuple(tuple(fmt_num(r.get(c)) for c in columns) for r in records))]
            else:
                scalars.append((code(key), fmt_num(value)))
        head = [Table((Column("Figure"), Column("Value", numeric=True)), tuple(scalars))] if scalars else []
        return head + tables


# How deep a benchmark's JSON may nest (lists and objects): far beyond any benchmark's record (a few levels), and
# within what every reader of a step's metrics recurses through (finite_figures, results.json's writer and checker,
# criteria, the report's tables), so that a deeper record fails its step instead of ending the run.
MAX_NESTING = 100


def read_bench_json(path: Path) -> tuple[Any, str | None]:
    """(the benchmark's JSON, None) or ({}, what is wrong with its file: missing, not JSON (where; bytes that are not
    UTF-8 text, e.g. a file cut inside a character, are not JSON either), nested deeper than MAX_NESTING levels, no
    record, or empty)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}, "the benchmark wrote no JSON"
    except OSError as exc:
        return {}, f"{path.name} cannot be read: {exc.strerror or exc}"
    text = raw.decode("utf-8", errors="replace")
    try:
        data = json.loads(raw)  # bytes: JSON is UTF-8 text (RFC 8259); a decoding error is a ValueError here
    except RecursionError:  # deeper than Python's parser goes
        return {}, f"the benchmark's {path.name} is nested deeper than {MAX_NESTING} levels (lists and objects)"
    except ValueError as exc:
        what = "empty" if not text.strip() else f"not valid JSON ({exc})"
        return {}, f"the benchmark's {path.name} is {what}"
    if nesting(data) > MAX_NESTING:
        return {}, f"the benchmark's {path.name} is nested deeper than {MAX_NESTING} levels (lists and objects)"
    if data and not isinstance(data, (dict, list)):
        return {}, f"the benchmark's {path.name} is no record (a JSON object or list of records): {text.strip()[:20]}"
    if not data:
        return {}, f"the benchmark's {path.name} holds no figures ({text.strip()[:20]})"
    return data, None


def nesting(data: Any) -> int:
    """How many levels of lists and objects `data` nests (a number 0, [] or {} 1, [[1]] 2), counted without recursion
    and only up to MAX_NESTING + 1."""
    deepest, stack = 0, [(data, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, (dict, list)):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= MAX_NESTING:
                stack.extend((v, depth) for v in (value.values() if isinstance(value, dict) else value))
    return deepest


def finite_figures(data: Any, at: str = "") -> tuple[Any, list[str]]:
    """`data` with every number that is not finite (Python's json reads the words NaN, Infinity, -Infinity and a
    literal beyond a float's range such as 1e999 as one), and every integer past a float's range (which it reads
    exactly), replaced by None, and "where (value)" of each, in the order written:
    "by_seq_len[0].ranges_speedup (Infinity)"."""
    if isinstance(data, dict):
        out, found = {}, []
        for key, value in data.items():
            out[key], inner = finite_figures(value, f"{at}.{key}" if at else str(key))
            found += inner
        return out, found
    if isinstance(data, list):
        items = [finite_figures(value, f"{at}[{i}]") for i, value in enumerate(data)]
        return [v for v, _ in items], [w for _, inner in items for w in inner]
    if isinstance(data, float) and not math.isfinite(data):
        return None, [f"{at or 'the value'} ({'NaN' if math.isnan(data) else '-Infinity' if data < 0 else 'Infinity'})"]
    if isinstance(data, int) and not isinstance(data, bool) and finite(data) is None:
        # an integer literal past a float's range (Python's json reads it exactly): no figure can be compared with it
        # (0.55 * it raises) and no range checked on it (formatting.finite: no number)
        return None, [f"{at or 'the value'} (an integer past a float's range)"]
    return data, []


def best_records(rows: list, best: Best) -> dict[str, dict]:
    """{value of best.by: the row with the largest (best.largest) or smallest finite number in best.field}, over the
    rows that are records with the `by` field, such a number and no "error"; groups in the order first seen."""
    field = best.field
    chosen: dict[str, dict] = {}
    for row in rows:
        value = finite(row.get(field)) if isinstance(row, dict) else None
        if not isinstance(row, dict) or "error" in row or best.by not in row or value is None:
            continue
        group = str(row.get(best.by))
        current = chosen.get(group)
        if current is None or (value > float(current[field]) if best.largest else value < float(current[field])):
            chosen[group] = row
    return chosen


kinds.register(Bench())
