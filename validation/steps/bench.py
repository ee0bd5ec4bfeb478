"""`bench`: a benchmark script run with this Python, given `--json PATH`; the JSON it writes is the step's metrics
(e.g. benchmarks/bench_selection.py: ranges_speedup_min, forward_speedup_min, ...), usable in criteria.

Own key: `command: [script, args...]` (the argv after the python executable; required). Launch keys: env,
timeout_s, launcher. A benchmark that writes no JSON fails.
Report: its scalar figures, and a table per list of records (e.g. by_seq_len).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from validation import steps
from validation.report.format import as_dict, as_list, fmt_num
from validation.schema import str_list
from validation.steps.base import COMMAND_LAUNCH_KEYS, StepKind, command_launch, run_path


class Bench(StepKind):
    name = "bench"
    summary = "a benchmark script that writes JSON (`--json`); e.g. selection v2 vs v1 speed"
    keys = ("command",)
    metrics = ("*",)  # whatever JSON the benchmark writes
    launch_keys = COMMAND_LAUNCH_KEYS

    def parse(self, raw: dict, path: tuple, ctx) -> dict[str, Any]:
        command = str_list(raw.get("command"), path + ("command",), ctx)
        if not command:
            raise ctx.error(path + ("command",), "a bench step needs command: [script, args...]")
        return {"command": command}

    def input_files(self, step):
        script = step.command[0]  # `python SCRIPT ...`; an interpreter option (-m module, -c code) is no file
        return [] if script.startswith("-") else [(("command", 0), script)]

    def launches(self, step, winners, run_dir):
        argv = [sys.executable, *step.command, "--json", run_path(run_dir, f"{step.name}/bench.json")]
        return [command_launch(step, argv, run_dir)]

    def run(self, step, launches, result, ctx) -> None:
        spec = launches[0]
        lr = ctx.launch(spec, 0, 1)
        ctx.record(result, spec, lr)
        try:
            data = json.loads((ctx.run_dir / spec.dir / "bench.json").read_text())
        except (OSError, ValueError):
            data = {}
        result["metrics"] = data if isinstance(data, dict) else {"results": data}
        if lr.status != "ok":
            result.update(status=lr.status, reason=lr.reason)
        elif not data:
            result.update(status="failed", reason="the benchmark wrote no JSON")
        else:
            result["artifacts"].append(ctx.rel(ctx.run_dir / spec.dir / "bench.json"))
            result.update(status="passed", reason=None)

    def view(self, result: dict, view: dict) -> dict:
        """A benchmark's JSON: its scalar figures, and one table per list of records (e.g. by_seq_len)."""
        metrics = as_dict(result.get("metrics"))
        scalars, tables = [], []
        for key in sorted(metrics, key=str):
            value = metrics[key]
            records = [as_dict(v) for v in as_list(value)]
            if records and all(isinstance(v, dict) for v in as_list(value)):
                columns = sorted({str(k) for r in records for k in r})
                tables.append({"name": str(key), "columns": columns,
                               "rows": [[fmt_num(r.get(c)) for c in columns] for r in records]})
            else:
                scalars.append((str(key), fmt_num(value)))
        return {"bench": {"scalars": scalars, "tables": tables}}


steps.register(Bench())
