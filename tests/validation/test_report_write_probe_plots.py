"""`report --write` of a run recorded before the plots of steps "x" and "_x" got distinct files (both were saved as
plots/toks_per_s_x.png, the later replacing the earlier): each path is listed once, so no step's section shows
another step's plot."""

from __future__ import annotations

from validation.run import kept_plots


def _png(run_dir, rel):
    path = run_dir / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\x89PNG\r\n\x1a\n")


def _entry(step, path, title=None):
    return {"title": title or f"Tokens/s per step: {step}", "path": path, "step": step}


def test_a_path_recorded_twice_and_drawn_again_is_listed_once(tmp_path):
    previous = [_entry("x", "plots/toks_per_s_x.png"), _entry("_x", "plots/toks_per_s_x.png")]
    drawn = [_entry("x", "plots/toks_per_s_x.png", "new x"), _entry("_x", "plots/toks_per_s_x-2.png", "new _x")]
    for p in drawn:
        _png(tmp_path, p["path"])
    kept = kept_plots(previous, drawn, tmp_path)
    assert kept == drawn  # not the stale "_x" entry pointing at x's file
    assert [p["path"] for p in kept if p["step"] == "_x"] == ["plots/toks_per_s_x-2.png"]


def test_a_path_recorded_twice_not_drawn_again_keeps_the_entry_saved_last(tmp_path):
    previous = [_entry("a", "plots/ab.png"), _entry("x", "plots/toks_per_s_x.png"),
                _entry("_x", "plots/toks_per_s_x.png")]
    _png(tmp_path, "plots/ab.png")
    _png(tmp_path, "plots/toks_per_s_x.png")  # holds _x's plot: saved last, it replaced x's
    assert kept_plots(previous, [], tmp_path) == [previous[0], previous[2]]
