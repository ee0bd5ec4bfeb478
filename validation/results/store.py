"""RUN_DIR/results.json: everything a validation run found, the one input of every report. Its schema (version
SCHEMA_VERSION) is written as typed records in validation.results.model, key by key; every write and every read
goes through results_model.check_results.

Writes are atomic (temp file, fsync, rename: nsa.training.outputs.atomic_write) and happen after every step, so an
interrupted run keeps every finished step and `nsa-validate run --resume RUN_DIR` continues from it. A record that
does not hold to the schema is not written: write_results raises ResultsError naming the key path and what is
wrong, and the previous results.json stays as it was. A write that fails (disk full, permission denied, RUN_DIR
not a directory) raises RunDirError naming the path and the OS error; the previous results.json stays as it was and
no temp file is left behind. held_run_dir locks RUN_DIR for the process that writes it: a second one is refused.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

from nsa.training.outputs import atomic_write
from validation.results.model import (CRITERION_STATUSES, FAILED_STEP_STATUSES, FINAL_STEP_STATUSES, SCHEMA_VERSION,
                                      RUN_KEY_ORDER, STEP_KEY_ORDER, STEP_STATUSES, VERDICTS, ResultsError, RunResults,
                                      check_results)
from validation.results.codec import given
from validation.results.run import ReplacedStep, Resume, ReusedRecord, Run, read_run

__all__ = ["CRITERION_STATUSES", "DEFAULT_RUNS", "FAILED_STEP_STATUSES", "FINAL_STEP_STATUSES", "RESULTS_JSON",
           "SCHEMA_VERSION", "STEP_STATUSES", "VERDICTS", "ResultsError", "RunDirError", "RunResults",
           "cannot_write", "held_run_dir", "inside_run_dir", "load_json", "os_error_text", "read_results",
           "resume_note", "write_results"]

RESULTS_JSON = "results.json"
DEFAULT_RUNS = Path("artifacts/validate")  # where a run's directory goes without --out (<runbook>-<time>)


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


@contextlib.contextmanager
def held_run_dir(run_dir: Path | str) -> Iterator[Path]:
    """Hold the existing directory RUN_DIR for this block: an exclusive advisory lock (flock) on the directory
    itself, so that a second nsa-validate writing the same run (two `run --resume RUN_DIR`, or two runs given one
    --out) is refused before it writes or ends anything, instead of both running its steps and each overwriting the
    other's results.json. Raises RunDirError naming RUN_DIR when another open of it holds the lock (another
    process, or another block of this one). The lock goes with its descriptor: at the end of the block, or when the
    process dies (a killed run leaves no stale lock behind); nothing is written into RUN_DIR."""
    path = Path(run_dir)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise RunDirError(f"cannot open the run directory {path}: {os_error_text(exc)}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirError(f"{path} is in use by another nsa-validate run (it holds the run directory's lock): "
                              "wait for it to end, or give another --out") from None
        except OSError:  # a file system without flock (some network mounts): run unguarded, as before
            pass
        yield path
    finally:
        os.close(fd)


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def inside_run_dir(run_dir: Path | str, rel: str | Path) -> Path:
    """RUN_DIR/rel, once it is known to stay inside RUN_DIR: the one check of every path the suite derives from
    runbook content (the run directory under DEFAULT_RUNS, step, launch and trainer directories, plots). `rel` is
    relative and has no `..`, no existing symlink along it leads outside RUN_DIR, and neither does any symlink under
    it when it is an existing directory (e.g. the files a resumed step would overwrite). Raises RunDirError naming
    the path; RUN_DIR itself (--out, --resume) is the user's choice and may be anywhere, a link included."""
    rel_path = Path(rel)
    if not str(rel) or rel_path.is_absolute() or ".." in rel_path.parts:
        raise RunDirError(f"output path {str(rel)!r}: must be relative to the run directory {run_dir}, "
                          "without '..'")
    root = Path(run_dir).resolve()

    def check(path: Path) -> None:
        try:
            if not path.is_symlink():
                return
        except OSError as exc:  # a name longer than the file system takes (ENAMETOOLONG), a component not a directory
            raise RunDirError(f"output path {str(rel)!r} in the run directory {run_dir}: {exc.strerror or exc}") \
                from None
        try:
            target = path.resolve()
        except (OSError, RuntimeError):  # a link loop: nowhere safe
            target = None
        if target is None or not _within(target, root):
            raise RunDirError(f"{path} is a symlink to {os.readlink(path)}, outside the run directory {run_dir}: "
                              "refusing to write through it")

    current = Path(run_dir)
    for part in rel_path.parts:
        current = current / part
        check(current)
    if current.is_dir():
        for dirpath, dirnames, filenames in os.walk(current):  # links are not followed, only checked
            for name in dirnames + filenames:
                check(Path(dirpath) / name)
    return current


def in_documented_order(results: RunResults | dict[str, Any]) -> dict[str, Any]:
    """`results` with its top-level keys, and each step record's, in the schema's order (RUN_KEY_ORDER,
    STEP_KEY_ORDER; a key it does not list after them, in its own order), whatever order they were added in."""
    out = _ordered(results, RUN_KEY_ORDER)
    steps = out.get("steps")
    if isinstance(steps, dict):
        out["steps"] = {name: _ordered(step, STEP_KEY_ORDER) if isinstance(step, dict) else step
                        for name, step in steps.items()}
    return out


def _ordered(record: dict[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    rank = {key: i for i, key in enumerate(order)}
    return dict(sorted(record.items(), key=lambda item: rank.get(item[0], len(rank))))


def write_results(run_dir: Path, results: RunResults | dict[str, Any]) -> Path:
    """Write RUN_DIR/results.json atomically, once `results` holds to the schema (check_results). Raises
    ResultsError for a malformed record (naming the key path; nothing is written) and RunDirError when the file
    cannot be written; either way the old file stays intact."""
    path = Path(run_dir) / RESULTS_JSON
    try:
        check_results(results, str(path))
    except ResultsError as exc:
        raise ResultsError(f"{exc}; not written (the previous {RESULTS_JSON}, if any, is unchanged)") from None
    text = json.dumps(in_documented_order(results), indent=2, sort_keys=False, allow_nan=False) + "\n"
    try:
        return atomic_write(path, text)
    except OSError as exc:
        raise RunDirError(f"cannot write {path}: {os_error_text(exc)} (the previous {RESULTS_JSON}, if any, is "
                          "unchanged)") from None


def read_results(run_dir: Path) -> RunResults:
    """RUN_DIR/results.json, checked (check_results). Raises ResultsError naming the file (and the key path)."""
    path = Path(run_dir) / RESULTS_JSON
    if not path.is_file():
        odd = not_regular_file(path)
        raise ResultsError(f"{path}: unreadable ({odd})" if odd else
                           f"{path}: not found (is {run_dir} a validation run directory?)")
    return check_results(load_json(path), str(path))


class _DuplicateKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def not_regular_file(path: Path) -> str | None:
    """"a FIFO, not a regular file" for a path that is there but is no regular file (a symbolic link: what it leads
    to), which a reader must not open (a FIFO waits for a writer, a device may never end); None for a regular file
    or a path stat cannot see (reading it then says why)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    what = next((name for test, name in _NOT_REGULAR if test(mode)), None)
    return f"{what}, not a regular file" if what else "not a regular file"


def load_json(path: Path) -> Any:
    """The JSON value in the file at `path` (a results.json), parsed strictly: UTF-8 text holding one JSON value in
    which no object has a key twice (which of two values holds is not known). Raises ResultsError "PATH: unreadable
    (what is wrong)" for a file that cannot be read, is empty, is not UTF-8, is not JSON (cut off, garbled), repeats
    a key, or holds a number or a nesting Python cannot read, and, without opening it, for a path that is not a
    regular file (not_regular_file). NaN and Infinity are parsed; check_results refuses them naming their key path."""
    odd = not_regular_file(path)
    if odd:
        raise ResultsError(f"{path}: unreadable ({odd})")
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise ResultsError(f"{path}: unreadable ({os_error_text(exc)})") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ResultsError(f"{path}: unreadable (not UTF-8 text: byte 0x{raw[exc.start]:02x} at offset "
                           f"{exc.start})") from None
    if not text.strip():
        raise ResultsError(f"{path}: unreadable (empty: no JSON in it)")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _DuplicateKey as exc:
        raise ResultsError(f"{path}: unreadable (the key {exc.args[0]!r} appears twice in one object: which value "
                           "holds is not known)") from None
    except json.JSONDecodeError as exc:
        ends = exc.pos >= len(text.rstrip()) or exc.msg.startswith("Unterminated string")
        cut = "; the file ends inside its JSON: cut off?" if ends else ""
        raise ResultsError(f"{path}: unreadable (not JSON: {exc.msg}, line {exc.lineno} column {exc.colno}{cut})") \
            from None
    except ValueError as exc:  # an integer of more digits than int() reads (sys.get_int_max_str_digits)
        raise ResultsError(f"{path}: unreadable (a number too long to read: {str(exc).split(';')[0]})") from None
    except RecursionError:
        raise ResultsError(f"{path}: unreadable (its JSON is nested deeper than can be read)") from None


def resume_note(results: RunResults | dict[str, Any]) -> str | None:
    """One line on how the run was interrupted and continued (results["resumes"]), e.g. "interrupted by SIGINT
    at T1, resumed at T2 with step second"; None for a run never resumed. The report's header and the console show
    it."""
    entries = [r for r in read_run(results).resumes if r != Resume()]  # an entry that is not an object: none
    parts = []
    for r in entries:
        steps = [str(n) for n in r.steps]
        rerun = {str(n) for n in r.rerun}
        named = [f"{n} not run again ({r.not_rerun[n]}): its earlier result ({r.replaced[n].status}) kept"
                 if n in r.not_rerun and n in r.replaced else
                 f"{n} run again (it had {(r.replaced.get(n) or ReplacedStep()).status or 'no result'})"
                 if n in rerun else n for n in steps]
        what = (f"with step{'s' if len(named) > 1 else ''} {', '.join(named)}" if named
                else "with no step left to run (its verdict computed)")
        changed = "; the runbook had changed since the run started" if r.runbook_changed else ""
        if r.kept_changed:
            changed += ("; kept as measured under other settings than the runbook now gives them: "
                        + "; ".join(f"{n} ({why})" for n, why in r.kept_changed.items())
                        + " (--rerun runs them again)")
        if r.source_changed is not None:
            changed += (f"; the source had changed since the earlier attempt ({r.source_changed.before.text()} -> "
                        f"{r.source_changed.now.text()}): the steps it finished ran the earlier source")
        parts.append(f"{r.previous_state or 'stopped'} at {r.previous_end or 'an unknown time'}, "
                     f"resumed at {r.at or 'an unknown time'} {what}{changed}")
    return "; then ".join(parts) or None


def reused_note(record: ReusedRecord) -> str:
    """One line on a phase taken from an earlier run (a results.json `reused` record, validation.results.reuse)."""
    digest = str(record.source_digest or "?")[:12]
    differences = [str(d) for d in record.differences or []]
    without = (f"; its steps ran without {', '.join(differences)}, which this runbook's defaults.env adds"
               if differences else "")
    return (f"phase {record.phase}: its results are those of {record.source or 'an earlier run'} "
            f"({record.runbook or 'its runbook not recorded'} "
            f"run finished {record.finished or 'at an unknown time'} on {record.device or 'an unknown device'}; "
            f"the same source, digest {digest}{without}); nothing of it ran here")


def reused_notes(results: Run | RunResults | dict[str, Any]) -> list[str]:
    """reused_note of every phase the run took from an earlier run (the report's header shows them); an entry that
    is not an object, or an empty one, names nothing, and neither does the entry of a phase a step of which ran
    here after all (a record of its own, not pending: the run was resumed without --reuse before the phase was
    reached), where "nothing of it ran here" would not hold."""
    run = read_run(results)
    ran_here = {str(step.phase) for step in run.steps.values()
                if step is not None and given(step.reused) is None and step.status not in (None, "pending")}
    return [reused_note(r) for r in run.reused or [] if given(r) is not None and str(r.phase) not in ran_here]
