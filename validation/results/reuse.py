"""A phase taken from an earlier run of the same source instead of being run again: `nsa-validate run RUNBOOK
--reuse PHASE` (the newest matching run under reports/, where runs are committed) or `--reuse PHASE=RUN_DIR`.

What it is for: h100_single.yaml includes gpu_kernels.yaml's kernel qualification (about 7 minutes on one H100).
Where a run of that phase at the same source is committed, the rest of the runbook can run without it, and the
report says whose results the phase shows.

An earlier run matches a phase when (and the error names, for each run looked at, the first of these it fails):
- it recorded the digest of its source tree (validation.version.source_digest: the code, tests, benchmarks,
  runbooks and configs, not reports/ or the docs) and that digest is this tree's: the same code ran the same steps.
  Committing a run's report into reports/ leaves the digest as it was, so a run at commit C matches at C + its
  report;
- it has a phase of that name with the same steps (names and kinds, in order), each of which passed;
- each of those steps recorded its definition (validation.runbook.plan.step_definition: what it ran, every launch's
  argv, environment and limits) and it is the one the step has here. The source digest covers the runbooks under
  runbooks/, not a runbook file elsewhere, and another runbook may hold a phase of the same name and steps: the same
  source does not make the same steps. One difference is allowed and stated: environment variables a step has here
  from this runbook's `defaults.env` that it did not have there (h100_single.yaml's defaults on the steps it
  includes from gpu_kernels.yaml; validation.runbook.includes);
- the `--set` overrides that reach those steps (steps.<one of them>.*, phases.<phase>.steps.<one of them>.*,
  defaults.*, requirements.*), as the attempt that ran them had them (a --resume runs with its own), are the same.
The phase's steps are then recorded with the earlier run's status, metrics and decisions (acceptance criteria read
them as if they had run here), under a `reused` record naming the run, its runbook, when it finished, on which
device and any environment its steps ran without; the files they wrote stay in that run's directory. Nothing of a
reused phase is launched.
"""

from __future__ import annotations

import copy
import datetime
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from validation.formatting import first_of
from validation.results.codec import decode, encode, given
from validation.results.run import ReusedRecord, Run, Step, read_run
from validation.results.model import ResultsError, check_results
from validation.results.store import RESULTS_JSON, load_json, reused_note
from validation.runbook.model import Runbook, step_definition
from validation.version import source_digest

SEARCH_DIR = Path("reports")  # where `--reuse PHASE` looks for runs (relative to the working directory)
# What a reused step keeps of the earlier run's record: its outcome and figures, not the files it wrote there.
KEPT_KEYS = ("status", "reason", "duration_s", "metrics", "runs", "winner", "comparison", "excerpt", "decision",
             "choice", "order_seed", "order", "notes", "interference", "env", "command")


class ReuseError(ValueError):
    """A --reuse that cannot be honoured; the message names the phase and, for each run looked at, why not."""


@dataclass(frozen=True)
class Reuse:
    """Phase `phase`, taken from the run whose results.json is `source`."""

    phase: str
    source: Path
    results: Mapping[str, Any]
    differences: tuple[str, ...] = ()  # what the steps ran without that they have here (definition_differences)

    @functools.cached_property
    def run(self) -> Run:
        """The earlier run as a record (read leniently: a results.json of another run)."""
        return read_run(self.results)

    @property
    def device(self) -> str:
        gpus = [g.name for g in self.run.environment.gpus or [] if g.name]
        return (f"{len(gpus)} x {gpus[0]}" if len(gpus) > 1 else gpus[0]) if gpus else "no GPU"

    def entry(self) -> ReusedRecord:
        """What results.json keeps of the reuse: run-level `reused` entries and each step's `reused`."""
        run = self.run
        return ReusedRecord(phase=self.phase, source=str(self.source), runbook=run.runbook.name,
                            finished=run.finished, device=self.device, source_digest=run.environment.source_digest,
                            differences=list(self.differences) if self.differences else None)

    def record(self) -> dict[str, Any]:
        """entry() as results.json holds it: phase, from, runbook, finished, device, source_digest and, when there
        are some, differences."""
        return encode(self.entry())

    def note(self) -> str:
        return reused_note(self.entry())

    def step_result(self, pending: dict[str, Any]) -> dict[str, Any]:
        """`pending` (this run's empty record of the step) with the earlier run's outcome and figures."""
        name = str(decode(Step, pending, "step").name)
        earlier = self.results["steps"][name]  # copied as written
        out = dict(pending)
        for key in KEPT_KEYS:
            if key in earlier:
                out[key] = copy.deepcopy(earlier[key])
        reason = (self.run.steps.get(name) or Step()).reason
        out["reason"] = "; ".join(x for x in (reason, f"not run here: {self.note()}") if x)
        out["reused"] = self.record()
        _drop_files(out)
        return out


def _drop_files(result: dict[str, Any]) -> None:
    """The paths a reused record would carry into this run's directory, where those files are not: the
    training.csv of its metrics and runs (relative to the earlier run's directory)."""
    for metrics in [result.get("metrics")] + [r.get("metrics") for r in result.get("runs") or []
                                              if isinstance(r, dict)]:
        if isinstance(metrics, dict) and "csv" in metrics:
            metrics["csv"] = None


def parse(values: list[str] | tuple[str, ...]) -> dict[str, Path | None]:
    """--reuse values -> {phase: run directory or results.json, or None to search SEARCH_DIR}."""
    out: dict[str, Path | None] = {}
    for value in values:
        phase, _, where = str(value).partition("=")
        phase = phase.strip()
        if not phase:
            raise ReuseError(f"--reuse {value!r}: expected PHASE or PHASE=RUN_DIR")
        if phase in out:
            raise ReuseError(f"--reuse {phase}: given twice")
        out[phase] = Path(where) if where else None
    return out


def _relevant(overrides, phase: str, steps: list[str]) -> list[str]:
    """The --set items that can change steps `steps` of phase `phase`: their own keys (steps.STEP.KEY, or the full
    path phases.PHASE.steps.STEP.KEY, written here as steps.STEP.KEY), defaults and requirements."""
    heads = tuple(f"steps.{s}." for s in steps) + ("defaults.", "requirements.")
    full = f"phases.{phase}."
    out = []
    for item in overrides or []:
        key, sep, value = str(item).partition("=")
        key = key.strip()
        if key.startswith(full + "steps."):
            key = key[len(full):]
        if key.startswith(heads):
            out.append(f"{key}{sep}{value}")
    return sorted(out)


def _flat(value: Any, path: str = "") -> dict[str, Any]:
    """A step definition as {dotted path: leaf value}: list items by index, beside the list's length
    ("launches[0].argv[3]", "launches[0].argv.length")."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flat(item, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(value, list):
        out = {f"{path}.length": len(value)}
        for i, item in enumerate(value):
            out.update(_flat(item, f"{path}[{i}]"))
        return out
    return {path: value}


def definition_differences(here: Mapping[str, Any], there: Mapping[str, Any], defaults_env: Mapping[str, str],
                           names: tuple[str, str] = ("here", "there")) -> tuple[list[str], list[str]]:
    """(differences that make a step another step, differences allowed and stated) between a step's definition here
    and the one it ran with there (validation.runbook.plan.step_definition), each "KEY: VALUE here, VALUE there"
    (`names`: the two sides' words, e.g. "in B", "in A").
    Allowed: an environment variable of a launch here, absent there, whose value is this runbook's defaults.env's
    (what an including runbook adds to the steps it includes)."""
    ours, theirs = _flat(dict(here)), _flat(dict(there))
    refused, stated = [], []
    for key in sorted(set(ours) | set(theirs), key=lambda k: (k not in ours or k not in theirs, k)):
        mine, other = ours.get(key, _MISSING), theirs.get(key, _MISSING)
        if mine == other:
            continue
        text = f"{key}: {_shown(mine)} {names[0]}, {_shown(other)} {names[1]}"
        var = key.rpartition(".env.")[2] if ".env." in key else None
        if var is not None and other is _MISSING and defaults_env.get(var) == mine:
            stated.append(f"{var}={mine}")
        else:
            refused.append(text)
    return refused, sorted(set(stated))


_MISSING = object()


def _shown(value: Any) -> str:
    if value is _MISSING:
        return "absent"
    text = json.dumps(value, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _stated(run: Run, rb: Runbook, phase: str) -> tuple[str | None, tuple[str, ...]]:
    """(why the steps of `phase` that `run` recorded are not the steps of `rb`, or None; the environment they ran
    without that they have here)."""
    mine = next(p for p in rb.phases if p.name == phase)
    stated: list[str] = []
    for step in mine.steps:
        there = (run.steps.get(step.name) or Step()).definition
        if not isinstance(there, dict) or not there:
            return (f"its step {step.name} recorded no definition (a run of a version before steps recorded what "
                    "they ran)"), ()
        refused, allowed = definition_differences(step_definition(step), there, rb.defaults.env)
        if refused:
            more = f" (and {len(refused) - 2} more)" if len(refused) > 2 else ""
            return f"its step {step.name} ran something else: {'; '.join(refused[:2])}{more}", ()
        stated += [x for x in allowed if x not in stated]
    return None, tuple(sorted(stated))


def refusal(results: Mapping[str, Any] | Run, rb: Runbook, phase: str, overrides, digest: str) -> str | None:
    """Why the run of `results` cannot stand for phase `phase` of `rb` (None: it can)."""
    return _match(results, rb, phase, overrides, digest)[0]


def _match(results: Mapping[str, Any] | Run, rb: Runbook, phase: str, overrides, digest: str
           ) -> tuple[str | None, tuple[str, ...]]:
    """(refusal's reason or None, the environment the phase's steps ran without that they have here)."""
    run = read_run(results)
    why = _refusal(run, rb, phase, overrides, digest)
    return (why, ()) if why is not None else _stated(run, rb, phase)


def _refusal(run: Run, rb: Runbook, phase: str, overrides, digest: str) -> str | None:
    theirs = run.environment.source_digest
    if not theirs:
        return "it recorded no source digest (a run of a version before --reuse)"
    if theirs != digest:
        return f"it ran another source (digest {theirs[:12]}, this tree {digest[:12]})"
    mine = next(p for p in rb.phases if p.name == phase)
    recorded = {p.name: p for p in run.phases}
    if phase not in recorded:
        return f"it has no phase {phase} (its phases: {', '.join(map(str, recorded)) or 'none'})"
    names = [s.name for s in mine.steps]
    if list(recorded[phase].steps) != names:
        return f"its phase {phase} has other steps ({', '.join(map(str, recorded[phase].steps))})"
    for step in mine.steps:
        theirs_step = run.steps.get(step.name) or Step()
        taken = given(theirs_step.reused)
        if taken is not None:  # its figures, device and time are another run's: name that one
            return f"its step {step.name} was itself taken from {taken.source} (--reuse): reuse that run"
        if theirs_step.kind != step.kind:
            return f"its step {step.name} is a {theirs_step.kind} step, here a {step.kind} step"
        if theirs_step.status != "passed":
            return f"its step {step.name} ended {theirs_step.status}"
    for i, resume in enumerate(run.resumes):
        if resume.source_changed is None:
            continue
        # the steps this resume or a later one ran: those it set out to run, but for a step --rerun named that did
        # not run again (not_rerun: its earlier result, of the earlier source, kept)
        later = {str(n) for r in run.resumes[i:] for n in r.steps if str(n) not in r.not_rerun}
        earlier_source = [n for n in names if n not in later]
        if earlier_source:  # the environment's digest is the last attempt's
            return (f"its step {earlier_source[0]} ran before the run was resumed at {resume.at} with another "
                    "source: it did not run this one")
    ours, recorded_set = _relevant(overrides, phase, names), _relevant(run.overrides(names), phase, names)
    if ours != recorded_set:
        return f"other --set for its steps ({', '.join(recorded_set) or 'none'}; here {', '.join(ours) or 'none'})"
    return None


def _candidates(where: Path | None, cwd: Path) -> list[tuple[Path, Any]]:
    """(results.json path, its content or the ResultsError reading it raised: a file that is not a sound results.json,
    validation.results.store.load_json and check_results) of every run to look at: `where` (a run directory or its
    results.json), or every one under SEARCH_DIR, newest first (by the instant its run finished). Each file is read
    once."""
    if where is not None:
        where = where if where.is_absolute() else cwd / where
        path = where / RESULTS_JSON if where.is_dir() else where
        if not path.is_file():
            raise ReuseError(f"{where}: no {RESULTS_JSON} (expected a run directory)")
        paths = [path]
    else:
        paths = sorted((cwd / SEARCH_DIR).rglob(RESULTS_JSON)) if (cwd / SEARCH_DIR).is_dir() else []
    found = []
    for path in paths:
        try:
            data = check_results(load_json(path), str(path))
        except ResultsError as exc:  # its message names the file and what is wrong
            data = exc
        found.append((path, data))
    return sorted(found, key=lambda pd: _finished_at(pd[1]), reverse=True)


def _finished_at(results: Any) -> float:
    """When the run of `results` finished, as a POSIX time, so that runs written with different UTC offsets order
    by the instant ("10:00+0100" before "09:30+0000"); -inf for a run with no such time (unfinished, unreadable)."""
    finished = read_run(results).finished if isinstance(results, dict) else None
    try:  # the runner's format ("+0000": Python 3.10's fromisoformat reads only "+00:00"), else any ISO time
        when = datetime.datetime.strptime(str(finished), "%Y-%m-%dT%H:%M:%S%z")
    except ValueError:
        try:
            when = datetime.datetime.fromisoformat(str(finished))
        except ValueError:
            return -math.inf
    if when.tzinfo is None:  # no offset recorded: read as UTC
        when = when.replace(tzinfo=datetime.timezone.utc)
    return when.timestamp()


def resolve(rb: Runbook, requests: Mapping[str, Path | None], overrides, cwd: Path, digest: str | None = None
            ) -> dict[str, Reuse]:
    """{phase: Reuse} for every --reuse request (`overrides`: this run's --set items); ReuseError naming the phase
    and why each run looked at does not match when one has none."""
    if not requests:
        return {}
    digest = digest or source_digest()
    phases = [p.name for p in rb.phases]
    out = {}
    for phase, where in requests.items():
        if phase not in phases:
            raise ReuseError(f"--reuse {phase}: no phase {phase!r} in {rb.path} (phases: {', '.join(phases)})")
        why = []
        for path, results in _candidates(where, cwd):
            if isinstance(results, ResultsError):
                reason = str(results).removeprefix(f"{path}: ")
            else:
                reason, differences = _match(results, rb, phase, overrides, digest)
            if reason is None:
                out[phase] = Reuse(phase, path, results, differences)
                break
            why.append(f"{path}: {reason}")
        else:
            looked = first_of(why, 6) if why else \
                f"no {RESULTS_JSON} under {cwd / SEARCH_DIR}"
            raise ReuseError(f"--reuse {phase}: no run of this source's phase {phase} to take its results from "
                             f"({looked}); run it, or leave --reuse out")
    return out
