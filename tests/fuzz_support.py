"""What the two fuzz suites (tests/nsa/training/test_fuzz_config.py, tests/validation/test_fuzz_inputs.py) share:
walking a generated document's entries, and reporting how many examples each parser was given."""

from __future__ import annotations

import json
import os
from pathlib import Path


def entries(node, out=None) -> list[tuple]:
    """(container, key) for every entry of every mapping and list in a document."""
    out = [] if out is None else out
    if isinstance(node, dict):
        for k in list(node):
            out.append((node, k))
            entries(node[k], out)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            out.append((node, i))
            entries(item, out)
    return out


def report_counts(counts: dict[str, int], reliability, source: str) -> None:
    """Examples tried per parser ("<parser>_ok": those that loaded) into the reliability figures, printed, and
    merged into the JSON file $NSA_FUZZ_COUNTS_OUT names, if any."""
    counts = dict(sorted(counts.items()))
    for parser, n in counts.items():
        if not parser.endswith("_ok"):
            reliability.record_inputs(parser, n)
    print(f"\nfuzz examples tried ({source}): {json.dumps(counts)}")
    out = os.environ.get("NSA_FUZZ_COUNTS_OUT")
    if out:
        path = Path(out)
        merged = json.loads(path.read_text()) if path.is_file() else {}
        merged.update(counts)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
