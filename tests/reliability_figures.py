"""The reliability figures of issue 5, measured by the tests that exercise them and printed at the end of a pytest
session (tests/conftest.py): `python -m pytest -m reliability` runs exactly those tests.

    faults      injected on purpose (NSA_FAULT, a taken port, a timeout, SIGINT/SIGKILL of nsa-validate, a full
                disk, a path leading outside RUN_DIR, ...), each with the verdict expected and the one nsa-validate
                gave; correctly classified = the two agree
    inputs      generated inputs tried per parser by the hypothesis fuzz tests
    orphans     processes (PIDs or process groups of a launch, or anything whose command line still names the
                run directory) alive after the launch ended, out of those checked (tests/process_checks.py)
    results     finished results checked to be on disk and unchanged after a fault, and those lost

Nothing here is a constant: a test records what it saw, before asserting, so a failing check shows in the figures
as well as in the test result.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field


@dataclass
class Recorder:
    faults: list[tuple[str, str, str]] = field(default_factory=list)  # (fault, expected, got)
    inputs: collections.Counter = field(default_factory=collections.Counter)  # parser -> examples tried
    orphans_found: int = 0
    orphans_checked: int = 0
    orphan_scans: int = 0  # searches of the whole process table for anything still naming a run
    results_lost: int = 0
    results_checked: int = 0

    def record_fault(self, kind: str, expected: str, got: str) -> bool:
        """One injected fault: what nsa-validate should have reported and what it did. True when they agree."""
        self.faults.append((kind, str(expected), str(got)))
        return str(expected) == str(got)

    def record_inputs(self, parser: str, n: int) -> None:
        self.inputs[parser] += int(n)

    def record_orphans(self, found: int, checked: int, scans: int = 0) -> None:
        self.orphans_found += int(found)
        self.orphans_checked += int(checked)
        self.orphan_scans += int(scans)

    def record_results(self, lost: int, checked: int) -> None:
        """`checked` finished results (steps, files) were looked for after a fault; `lost` were missing/changed."""
        self.results_lost += int(lost)
        self.results_checked += int(checked)

    def to_json(self) -> dict:
        """What a pytest-xdist worker sends its controller at the end of its session (tests/conftest.py)."""
        return {"faults": [list(f) for f in self.faults], "inputs": dict(self.inputs),
                "orphans_found": self.orphans_found, "orphans_checked": self.orphans_checked,
                "orphan_scans": self.orphan_scans, "results_lost": self.results_lost,
                "results_checked": self.results_checked}

    def merge(self, data: dict) -> None:
        """Add a worker's figures (to_json) to these: the controller prints the figures of every worker."""
        self.faults += [tuple(f) for f in data.get("faults", [])]
        self.inputs.update(data.get("inputs", {}))
        for name in ("orphans_found", "orphans_checked", "orphan_scans", "results_lost", "results_checked"):
            setattr(self, name, getattr(self, name) + int(data.get(name, 0)))

    def any(self) -> bool:
        return bool(self.faults or self.inputs or self.orphans_checked or self.orphan_scans or self.results_checked)

    def classified(self) -> int:
        return sum(expected == got for _, expected, got in self.faults)

    def lines(self) -> list[str]:
        """The figures as printed at the end of the session."""
        out = []
        if self.faults:
            kinds = collections.Counter(kind for kind, _, _ in self.faults)
            out.append(f"faults injected: {len(self.faults)}, correctly classified: {self.classified()} "
                       f"({', '.join(f'{k} x{n}' if n > 1 else k for k, n in sorted(kinds.items()))})")
            out += [f"  MISCLASSIFIED {kind}: expected {expected}, got {got}"
                    for kind, expected, got in self.faults if expected != got]
        if self.inputs:
            total = sum(self.inputs.values())
            out.append(f"generated inputs tried: {total:,} "
                       f"({', '.join(f'{p} {n:,}' for p, n in sorted(self.inputs.items()))})")
        if self.orphans_checked or self.orphan_scans:
            scans = (f", and {self.orphan_scans} searches of the process table for anything still naming a run"
                     if self.orphan_scans else "")
            out.append(f"orphans found: {self.orphans_found} (of {self.orphans_checked} processes and process "
                       f"groups checked{scans})")
        if self.results_checked:
            out.append(f"results lost: {self.results_lost} (of {self.results_checked} finished results checked "
                       "after a fault)")
        return out


RECORDER = Recorder()
