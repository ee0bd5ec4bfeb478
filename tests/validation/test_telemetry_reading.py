"""validation.contracts.read_telemetry keeps every row it can read: a line csv refuses (a field past csv's size
limit; a NUL byte on Python 3.10) is left out like a row a killed writer cut off, and the rows around it stay."""

from __future__ import annotations

import csv

from validation.contracts import TELEMETRY_COLUMNS, read_telemetry


def test_a_line_csv_cannot_read_is_left_out_and_the_rows_around_it_kept(tmp_path):
    cols = list(TELEMETRY_COLUMNS)

    def row(time: str, **cells: str) -> list[str]:
        out = [""] * len(cols)
        out[cols.index("time")] = time
        for key, value in cells.items():
            out[cols.index(key)] = value
        return out

    with open(tmp_path / "telemetry.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        w.writerow(row("1000.0", node="a"))
        w.writerow(row("1001.0", node="x" * (csv.field_size_limit() + 1)))  # csv.Error: field larger than limit
        w.writerow(row("1002.0", node="a"))
    assert [(r["time"], r["node"]) for r in read_telemetry(tmp_path)] == [(1000.0, "a"), (1002.0, "a")]
