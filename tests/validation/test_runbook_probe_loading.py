"""Loading a runbook file: includes checked once each, a directory that cannot be searched, YAML errors PyYAML
gives without a position, numbers past a float's range, NUL characters no launch can carry, and a criterion name
clashing with one an include brought: each an error naming the file and line (never a traceback, a `?` or a
runbook that fails only once it runs)."""

from __future__ import annotations

import errno
import pathlib
import re
import subprocess
import sys
from collections import Counter

import pytest

import validation.runbook.loader as loader
from validation.runbook.loader import RunbookError, load_runbook


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


ONE_STEP = "name: {name}\nphases:\n  - {{name: p{i}, steps: [{{name: s{i}, kind: snapshot}}]}}\n"


def test_a_chain_of_includes_checks_each_runbook_once(tmp_path, monkeypatch):
    """r0 includes r1 includes ... r7: each is read and checked on its own once (the checks of r1 check r2 ... as
    they go), not once for every runbook above it (2**depth loads: a chain of 20 took minutes)."""
    depth = 8
    for i in range(depth):
        nested = f"  - include: r{i + 1}.yaml\n" if i + 1 < depth else ""
        write(tmp_path / f"r{i}.yaml", ONE_STEP.format(name=f"r{i}", i=i) + nested)
    loads: Counter = Counter()
    real = loader.load_runbook

    def counted(path, *args, **kwargs):
        loads[pathlib.Path(path).resolve().name] += 1
        return real(path, *args, **kwargs)

    monkeypatch.setattr(loader, "load_runbook", counted)
    rb = loader.load_runbook(tmp_path / "r0.yaml")
    assert [s.name for s in rb.steps()] == [f"s{i}" for i in range(depth)]
    assert loads == Counter({f"r{i}.yaml": 1 for i in range(depth)})
    # the next load checks them again (a file may have changed in between)
    loads.clear()
    loader.load_runbook(tmp_path / "r2.yaml")
    assert loads == Counter({f"r{i}.yaml": 1 for i in range(2, depth)})


def test_a_directory_that_cannot_be_searched_is_an_error_naming_the_runbook(tmp_path, monkeypatch):
    """stat of a file in a directory without search permission raises PermissionError (pathlib's is_file passes it
    on): the error names the file, and for an include the item's line. (Simulated: root searches any directory.)"""
    write(tmp_path / "locked" / "inner.yaml", ONE_STEP.format(name="inner", i=0))
    outer = write(tmp_path / "outer.yaml", "name: outer\nphases:\n  - include: locked/inner.yaml\n")
    real = pathlib.Path.stat

    def stat(self, *args, **kwargs):
        if "locked" in self.parts:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "stat", stat)
    with pytest.raises(RunbookError, match=re.escape(f"{outer}:3: phases[0].include: locked/inner.yaml: cannot "
                                                     "read ([Errno 13] Permission denied")):
        load_runbook(outer)
    with pytest.raises(RunbookError, match=re.escape(f"{tmp_path / 'locked' / 'inner.yaml'}: cannot read ([Errno 13]")):
        load_runbook(tmp_path / "locked" / "inner.yaml")


BASE = "name: t\nphases:\n  - {name: p, steps: [{name: s, kind: snapshot}]}\n"


@pytest.mark.parametrize("tail, problem", [
    ("description: a\x01b\n", "unacceptable character #x0001"),  # the reader refuses it: a position, no mark
    ("defaults:\n  timeout_s: 5\n  window: " + "1" * 4400 + "\n", "Exceeds the limit (4300 digits)"),
    ("defaults:\n  timeout_s: 5\n  env: {X: 2024-02-30}\n", "day is out of range for month"),  # a date, read
    ("description: 2024-13-45\n", "month must be in 1..12"),
], ids=["control-character", "long-integer", "date-in-env", "date"])
def test_a_yaml_error_without_a_mark_names_its_line(tmp_path, tail, problem):
    """PyYAML builds dates and integers after the document is read, and says only what failed, not where; the
    reader gives a character's position, not its line. The error names the line all the same."""
    path = write(tmp_path / "rb.yaml", BASE + tail)
    line = (BASE + tail).rstrip("\n").count("\n") + 1  # each tail's bad value is on its last line
    with pytest.raises(RunbookError, match=re.escape(f"{path}:{line}: not valid YAML (") + ".*" + re.escape(problem)):
        load_runbook(path)


def test_compare_pairs_past_a_floats_range_is_an_error_naming_its_line(tmp_path):
    path = write(tmp_path / "rb.yaml", BASE + "compare: {run_sd: 0.1, pairs: " + "9" * 400 + "}\n")
    with pytest.raises(RunbookError, match=re.escape(f"{path}:4: compare.pairs: number too large, got 9999")):
        load_runbook(path)
    path = write(tmp_path / "rb.yaml", BASE + "compare: {run_sd: 0.1, pairs: 30}\n")
    assert load_runbook(path).compare_noise == {"run_sd": 0.1, "pairs": 30.0}


NUL_STEP = "name: t\nphases:\n  - name: p\n    steps:\n      - {{name: s, kind: {kind}, {keys}}}\n"


@pytest.mark.parametrize("kind, keys, key", [
    ("bench", 'command: [x.py], env: {NCCL_X: "a\\0b"}', "env.NCCL_X"),
    ("train", 'args: {dataset: text, data-path: "a\\0b"}', "args.data-path"),
], ids=["env", "args"])
def test_a_nul_in_a_launch_is_refused_before_anything_runs(tmp_path, kind, keys, key):
    """No process can be started with a NUL in its environment or command line (the launch would raise as the step
    starts, after the steps before it ran): refused when the runbook is loaded, naming the key."""
    with pytest.raises(ValueError, match="embedded null byte"):  # what a launch would meet
        subprocess.Popen([sys.executable, "-c", ""], env={"NCCL_X": "a\0b"})
    path = write(tmp_path / "rb.yaml", NUL_STEP.format(kind=kind, keys=keys))
    with pytest.raises(RunbookError, match=re.escape(f"{path}:5: phases[0].steps[0].{key}: holds a NUL")):
        load_runbook(path)
    assert load_runbook(write(path, NUL_STEP.format(kind=kind, keys=keys.replace("\\0", "")))).step("s")


def test_a_criterion_name_clashing_with_an_included_one_names_its_file_and_line(tmp_path):
    inner = write(tmp_path / "inner.yaml", "name: inner\nphases:\n  - name: ip\n    steps:\n"
                                           "      - {name: t, kind: snapshot}\nacceptance:\n"
                                           "  - {name: c1, expr: \"t.status == 'passed'\"}\n")
    outer = write(tmp_path / "outer.yaml", "name: outer\nphases:\n  - include: inner.yaml\n"
                                           "  - {name: op, steps: [{name: o, kind: snapshot}]}\nacceptance:\n"
                                           "  - {name: c1, expr: \"o.status == 'passed'\"}\n")
    with pytest.raises(RunbookError) as info:
        load_runbook(outer)
    # outer's own acceptance[0] is this very criterion: the other one is inner's, on its line 7
    assert str(info.value).endswith(f"duplicate criterion name 'c1' (also at {inner}:7: acceptance[0] "
                                    f"(included at {outer}:3))"), str(info.value)
    assert str(info.value).startswith(f"{outer}:6: ")


def test_a_rendezvous_port_outside_1_to_65535_is_refused_at_load(tmp_path):
    # 'host:99999' passed the host:port pattern; torch's TCPStore then refused it mid-run
    for port, ok in (("99999", False), ("0", False), ("29400", True)):
        rb = tmp_path / f"rb{port}.yaml"
        rb.write_text("name: t\nphases:\n  - name: p\n    steps:\n"
                      f"      - {{name: b, kind: bench, command: [x.py], launcher: {{type: torchrun, "
                      f"rdzv_endpoint: 'node1:{port}'}}}}\n")
        if ok:
            load_runbook(rb)
        else:
            with pytest.raises(RunbookError, match="a port from 1 to 65535"):
                load_runbook(rb)
    from validation.launch.spec import LaunchSpec, validate
    with pytest.raises(ValueError, match="a port from 1 to 65535"):
        validate(LaunchSpec(argv=["true"], env={}, rdzv_endpoint="node1:70000"))
