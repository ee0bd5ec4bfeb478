"""The order in which the README's test command hands test files to its two pytest-xdist workers: longest first.

`--dist loadfile` gives a worker a whole file at a time. pytest-xdist hands them out by number of tests, most first,
so the end-to-end files (a few tests each, minutes of runs) went out last, and one worker still ran one of them
minutes after the other had finished. Handed out longest first (the longest-processing-time rule), the last files
are short ones and the two workers end together. tests/conftest.py orders the collected files by the seconds each
took (FILE_SECONDS, file_durations.json beside this module) and turns xdist's own reordering off; a file not listed
goes after the listed ones, in collection order.

    python tests/file_order.py LOG [NOTE]    # file_durations.json from a `pytest --durations=0` log (setup, call
                                             # and teardown of every test, summed per file; a quiet run of
                                             # `.ci/run`); NOTE says which run it was
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from pathlib import Path

DURATIONS = Path(__file__).resolve().parent / "file_durations.json"
_LINE = re.compile(r"^([\d.]+)s (?:setup|call|teardown)\s+([^:\s]+)::")


def file_seconds(path: Path = DURATIONS) -> dict[str, float]:
    """{test file relative to the repository root: seconds}; {} when the file is missing or unreadable (no order)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    seconds = data.get("seconds") if isinstance(data, dict) else None
    return {k: float(v) for k, v in (seconds or {}).items() if isinstance(v, (int, float))}


def from_log(text: str) -> dict[str, float]:
    """Seconds per test file summed over a `pytest --durations=0` log's lines."""
    found: Counter = Counter()
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            found[m.group(2)] += float(m.group(1))
    return {k: round(v, 1) for k, v in sorted(found.items(), key=lambda kv: -kv[1])}


def ordered(paths: list[str], seconds: dict[str, float]) -> list[str]:
    """`paths` (each once, in collection order) with the listed ones first, longest first; the others after them,
    in their order."""
    position = {p: i for i, p in enumerate(paths)}
    return sorted(paths, key=lambda p: (p not in seconds, -seconds.get(p, 0.0), position[p]))


def main(argv: list[str]) -> int:
    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    seconds = from_log(Path(argv[0]).read_text(errors="replace"))
    if not seconds:
        print(f"{argv[0]}: no `--durations=0` lines (e.g. '12.34s call tests/x.py::test_y')", file=sys.stderr)
        return 1
    note = argv[1] if len(argv) == 2 else Path(argv[0]).name
    DURATIONS.write_text(json.dumps({"source": note, "seconds": seconds}, indent=1) + "\n")
    print(f"{DURATIONS}: {len(seconds)} files, {sum(seconds.values()):,.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
