"""RUN_DIR/results.json: everything a validation run found, the one input of every report.

Schema (version SCHEMA_VERSION; plain JSON types only, no NaN):

    {
      "schema_version": 1,
      "tool": {"name": "nsa-validate", "version": "0.1.0"},
      "runbook": {"name", "description", "path", "sha256"},
      "run_dir": "artifacts/validate/<runbook>-<time>",
      "started": ISO time, "finished": ISO time or null, "duration_s": float or null,
      "verdict": "GO" | "NO-GO" | "INCOMPLETE",     # INCOMPLETE: interrupted, steps still pending, or a required
                                                    # criterion not evaluated (its step did not run); CLI exit 0/1/3
      "verdict_reason": one sentence,
      "interrupted_by": "SIGINT" | "SIGTERM" | "SIGHUP" | "Ctrl-C" | null,   # the signal that ended the run
      "resumes": [                         # absent until the run is continued with --resume; one entry each time
        {"at": ISO time of the resume, "previous_end": ISO time the earlier attempt ended (its "finished", or the
         last write of results.json when it was killed), "previous_state": "interrupted by SIGINT" |
         "finished (GO)" | "stopped without finishing (...)", "steps": [the steps this attempt set out to run],
         "rerun": [those of them run again by --rerun], "replaced": {step: {"status", "reason", "started",
         "duration_s"} it held before --rerun}, "runbook_changed": bool}
      ],
      "environment": {"git_sha", "host", "python", "torch", "cuda", "nccl", "gpus": [{"index", "name",
                      "memory_gb", "capability"}], "gpu_count", "cpu_count", "packages": {name: version}},
      "options": {"only": [...], "skip": [...], "set": ["key=value", ...]},
      "phases": [{"name", "title", "description", "steps": [step names in order]}],
      "steps": {
        "<step name>": {
          "name", "phase", "kind",         # a registered step kind (validation.steps)
          "title", "description",
          "status": "passed" | "failed" | "skipped" | "hang" | "timeout" | "error" | "pending" | "interrupted",
          "reason": one sentence or null,
          "started", "duration_s",
          "dir": step directory relative to run_dir,
          "command": [argv] or null, "env": {the NSA_/NCCL_/TORCH_/CONFIG variables set for it},
          "metrics": {...},                # kind-specific, see below
          "runs": [                        # a multi-launch step (sweep, ab): one entry per launch
            {"label", "params": {"env.NSA_DDP_BUCKET_MB": "25", ...}, "status", "reason", "dir", "command",
             "metrics": {...}, "repeat": int}
          ],
          "decision": {...} or absent,     # a step that decides (sweep, ab with recommend): the decision of
                                           # validation.significance.decide (winner, choice, significant,
                                           # comparison with CI and p, noise_floor, recommended_repeats, reason)
                                           # plus "order_seed" and "order" (the random run order's seed, labels)
          "choice": {"label", "params", "explanation", "significant", "kept_default"} or null,  # what
                                           # ${step.winner.env.X} resolves to: the winner, or the point kept
          "winner": the choice when it rests on a significant difference, else null (written before decisions:
                    {"label", "params", "explanation"}),
          "comparison": [{"baseline", "variant", "metric", "method", "mean_a", "mean_b", "rel", "ci_low",
                          "ci_high", "p_value", "noise_floor", "significant", "verdict", "delta", "rel_delta",
                          ...}],           # a step that compares (ab): validation.significance.Comparison
          "artifacts": [paths relative to run_dir],
          "excerpt": failing rank's traceback excerpt or null,
          "stack_dumps": [paths relative to run_dir]
        }
      },
      "acceptance": [{"name", "expr", "target", "severity": "fail" | "warn", "status": "pass" | "fail" | "warn" |
                      "error" | "skipped", "actual", "detail"}],
      "recommendations": {"env": {"NSA_DDP_BUCKET_MB": "25", ...}, "notes": [sentences]},  # significant only
      "performance_analysis": {...},       # with run/report --against: validation.compare.performance_analysis
      "plots": [{"title", "path"}]
    }

Step metrics by kind: each step kind documents its own "metrics" (and "runs", "winner", "comparison") in its
module, validation/steps/<kind>.py (`nsa-validate kinds` lists the kinds); every trainer launch's metrics are
described in validation/steps/trainer.py.

Writes are atomic (temp file, fsync, rename: nsa.training.outputs.atomic_write) and happen after every step, so an
interrupted run keeps every finished step and `nsa-validate run --resume RUN_DIR` continues from it. A write that
fails (disk full, permission denied, RUN_DIR not a directory) raises RunDirError naming the path and the OS error;
the previous results.json stays as it was and no temp file is left behind.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path
from typing import Any

from nsa.training.outputs import atomic_write

SCHEMA_VERSION = 1
RESULTS_JSON = "results.json"
DEFAULT_RUNS = Path("artifacts/validate")  # where a run's directory goes without --out (<runbook>-<time>)
STEP_STATUSES = ("passed", "failed", "skipped", "hang", "timeout", "error", "pending", "interrupted")
FINAL_STEP_STATUSES = ("passed", "failed", "skipped", "hang", "timeout", "error")
FAILED_STEP_STATUSES = ("failed", "hang", "timeout", "error")  # a step that ran and did not pass
VERDICTS = ("GO", "NO-GO", "INCOMPLETE")
CRITERION_STATUSES = ("pass", "fail", "warn", "error", "skipped")


class ResultsError(ValueError):
    """results.json is missing, unreadable or of another schema version."""


class RunDirError(RuntimeError):
    """The run directory cannot be written (disk full, permission denied, not a directory), or a path in it
    leads outside it. The message is one line naming the path and the reason."""


def os_error_text(exc: OSError) -> str:
    """"No space left on device [ENOSPC]" for an OSError (its strerror and errno name), else str(exc)."""
    name = errno.errorcode.get(exc.errno) if isinstance(exc.errno, int) else None
    text = exc.strerror or str(exc) or type(exc).__name__
    return f"{text} [{name}]" if name else text


def cannot_write(path: Path | str, exc: OSError) -> RunDirError:
    """A RunDirError for a failed write of `path` (the OSError's own filename when it names another one)."""
    where = exc.filename if isinstance(exc.filename, str) and exc.filename else str(path)
    return RunDirError(f"cannot write {where}: {os_error_text(exc)}")


def write_results(run_dir: Path, results: dict[str, Any]) -> Path:
    """Write RUN_DIR/results.json atomically. Raises RunDirError (the old file intact) when it cannot."""
    path = Path(run_dir) / RESULTS_JSON
    text = json.dumps(results, indent=2, sort_keys=False, allow_nan=False) + "\n"
    try:
        return atomic_write(path, text)
    except OSError as exc:
        raise RunDirError(f"cannot write {path}: {os_error_text(exc)} (the previous {RESULTS_JSON}, if any, is "
                          "unchanged)") from None


def read_results(run_dir: Path) -> dict[str, Any]:
    path = Path(run_dir) / RESULTS_JSON
    if not path.is_file():
        raise ResultsError(f"{path}: not found (is {run_dir} a validation run directory?)")
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{path}: unreadable ({exc})") from None
    version = data.get("schema_version") if isinstance(data, dict) else None
    if version != SCHEMA_VERSION:
        raise ResultsError(f"{path}: schema_version {version!r}, this nsa-validate reads {SCHEMA_VERSION}")
    return data


def resume_note(results: dict[str, Any]) -> str | None:
    """One line on how the run was interrupted and continued (results["resumes"]), e.g. "interrupted by SIGINT
    at T1, resumed at T2 with step second"; None for a run never resumed. The report's header and the console show
    it."""
    entries = [r for r in results.get("resumes") or [] if isinstance(r, dict)]
    parts = []
    for r in entries:
        steps = [str(n) for n in r.get("steps") or []]
        rerun = {str(n) for n in r.get("rerun") or []}
        replaced = r.get("replaced") if isinstance(r.get("replaced"), dict) else {}
        named = [f"{n} run again (it had {(replaced.get(n) or {}).get('status') or 'no result'})" if n in rerun else n
                 for n in steps]
        what = (f"with step{'s' if len(named) > 1 else ''} {', '.join(named)}" if named
                else "with no step left to run (its verdict computed)")
        changed = "; the runbook had changed since the run started" if r.get("runbook_changed") else ""
        parts.append(f"{r.get('previous_state') or 'stopped'} at {r.get('previous_end') or 'an unknown time'}, "
                     f"resumed at {r.get('at') or 'an unknown time'} {what}{changed}")
    return "; then ".join(parts) or None
