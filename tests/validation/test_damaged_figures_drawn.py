"""Damaged figures do not take a plot or a telemetry series with them: an infinite telemetry cell is no reading
(validation.contracts.read_telemetry), and a scan's cost-law fit too large to draw leaves the plot of its runs
(validation.kinds._plot_helpers.scan_loglog)."""

from __future__ import annotations

from validation import contracts
from validation.kinds._plot_helpers import scan_loglog
from validation.report.plots import Plotter


def test_an_infinite_telemetry_cell_is_no_reading(tmp_path):
    (tmp_path / "telemetry.csv").write_text(
        "time,node,sample,cpu_util_pct\n"
        "1000,n0,0,50\n"
        "inf,n0,1,60\n"
        "1002,n0,2,-inf\n"
        "1003,n0,3,70\n")
    rows = contracts.read_telemetry(tmp_path)
    assert [(r["time"], r["cpu_util_pct"]) for r in rows] == [(1000, 50), (1002, None), (1003, 70)]


def test_a_fit_too_large_to_draw_leaves_the_scan_plot(tmp_path):
    plotter = Plotter(tmp_path)
    scanned = [(1024.0, 0.1), (2048.0, 0.2), (4096.0, 0.45)]
    for fit in ((1.0, 1e308), (-3.0, 0.0), (2.0, -1e308)):
        scan_loglog(plotter, scanned, [], fit, [], title="scan", xlabel="seq_len", filename=f"scan{len(plotter.written)}.png")
    assert len(plotter.written) == 3
    assert all((tmp_path / w["path"]).is_file() for w in plotter.written)
