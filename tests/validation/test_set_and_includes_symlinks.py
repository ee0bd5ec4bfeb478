"""Runbook includes through symlinks: a relative include is read beside the runbook file itself, a symlink's target,
as the cycle check and the once-only validation identify a runbook (by its target), so that one file means the
same wherever a link to it lies; a cycle closed through a link is named."""

from __future__ import annotations

import os
import re

import pytest

from validation.runbook.loader import RunbookError, load_runbook

INNER = "name: inner\nphases:\n  - {name: ip, steps: [{name: s, kind: snapshot}]}\n"
OUTER = "name: outer\nphases:\n  - include: inner.yaml\n  - {name: op, steps: [{name: o, kind: snapshot}]}\n"


@pytest.fixture()
def real(tmp_path):
    """real/outer.yaml includes real/inner.yaml; a decoy inner.yaml elsewhere would be the wrong file."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "inner.yaml").write_text(INNER)
    (tmp_path / "real" / "outer.yaml").write_text(OUTER)
    return tmp_path / "real"


def test_a_runbook_run_through_a_symlink_includes_the_files_beside_its_target(tmp_path, real):
    (tmp_path / "mine").mkdir()
    link = tmp_path / "mine" / "outer.yaml"
    os.symlink(real / "outer.yaml", link)
    assert [s.name for s in load_runbook(link).steps()] == ["s", "o"]
    # a file of the same name beside the link is not the one the runbook's author meant
    (tmp_path / "mine" / "inner.yaml").write_text(INNER.replace("name: s,", "name: decoy,"))
    assert [s.name for s in load_runbook(link).steps()] == ["s", "o"]
    assert load_runbook(link).steps() == load_runbook(real / "outer.yaml").steps()


def test_an_include_that_is_a_symlink_reads_its_own_includes_beside_its_target(tmp_path, real):
    (tmp_path / "top").mkdir()
    (tmp_path / "top" / "top.yaml").write_text("name: top\nphases:\n  - include: middle.yaml\n"
                                               "  - {name: tp, steps: [{name: t, kind: snapshot}]}\n")
    os.symlink(real / "outer.yaml", tmp_path / "top" / "middle.yaml")
    assert [s.name for s in load_runbook(tmp_path / "top" / "top.yaml").steps()] == ["s", "o", "t"]


def test_a_cycle_closed_through_a_symlink_is_named(tmp_path):
    a = tmp_path / "a.yaml"
    a.write_text("name: a\nphases:\n  - include: b_link.yaml\n")
    (tmp_path / "b.yaml").write_text("name: b\nphases:\n  - {name: bp, steps: [{name: s, kind: snapshot}]}\n"
                                     "  - include: a.yaml\n")
    os.symlink(tmp_path / "b.yaml", tmp_path / "b_link.yaml")
    chain = f"{a.resolve()} -> {(tmp_path / 'b.yaml').resolve()} -> {a.resolve()}"
    with pytest.raises(RunbookError, match=re.escape(f"runbooks include each other in a cycle: {chain}")):
        load_runbook(a)
