"""What a runbook file means once loaded: values from the file and from --set in their documented precedence,
YAML that PyYAML would read silently wrong (a key given twice, a shared alias), includes and the file and line their
errors name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from validation.runbook.loader import RunbookError, load_runbook


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


BASE = """\
name: base
defaults:
  env: {NSA_PREFILL_BATCHED: "1", NCCL_ALGO: Ring}
  args: {steps: 10, dataset: synthetic}
  timeout_s: 100
phases:
  - name: p1
    steps:
      - {name: a, kind: train, args: {steps: 20}, env: {NCCL_ALGO: Tree}}
      - {name: b, kind: train, timeout_s: 50}
"""


def test_precedence_of_set_file_and_defaults(tmp_path):
    path = write(tmp_path / "base.yaml", BASE)
    rb = load_runbook(path, ["defaults.args.steps=30", "defaults.timeout_s=70", "steps.b.timeout_s=80"])
    a, b = rb.step("a"), rb.step("b")
    # a: its own args.steps (20) beats --set defaults.args.steps; env merged key by key; timeout from the --set default
    assert (a.launch.args, a.launch.env, a.launch.timeout_s) == (
        {"steps": 20, "dataset": "synthetic"}, {"NSA_PREFILL_BATCHED": "1", "NCCL_ALGO": "Tree"}, 70.0)
    # b: --set of its own key beats its own key in the file; --set defaults.args.steps reaches it
    assert (b.launch.args, b.launch.timeout_s) == ({"steps": 30, "dataset": "synthetic"}, 80.0)
    assert rb.step_notes("a") and "args.steps = 20" in rb.step_notes("a")[0] and not rb.step_notes("b")
    a = load_runbook(path, ["defaults.args.steps=30", "steps.a.args.steps=40"]).step("a")
    assert a.launch.args["steps"] == 40


@pytest.mark.parametrize("value, expected", [("30", 30.0), ("30.0", 30.0), ('"30"', "must be a number, got '30'"),
                                             ("true", "must be a number, got True"),
                                             ("null", "must be a number, got None")])
def test_set_values_are_read_as_yaml(tmp_path, value, expected):
    path = write(tmp_path / "base.yaml", BASE)
    if isinstance(expected, float):
        assert load_runbook(path, [f"steps.b.timeout_s={value}"]).step("b").launch.timeout_s == expected
    else:
        with pytest.raises(RunbookError, match=re.escape(f"--set steps.b.timeout_s={value} ({path}): "
                                                         f"phases[0].steps[1].timeout_s: {expected}")):
            load_runbook(path, [f"steps.b.timeout_s={value}"])


def test_a_key_given_twice_is_an_error_naming_both_lines(tmp_path):
    path = write(tmp_path / "dup.yaml", BASE.replace("  timeout_s: 100\n", "  timeout_s: 100\n  timeout_s: 200\n"))
    with pytest.raises(RunbookError, match=re.escape(f"{path}:6: defaults.timeout_s: duplicate key (first at line 5)")):
        load_runbook(path)
    path = write(tmp_path / "dup.yaml", BASE.replace("args: {steps: 20}", "args: {steps: 20, steps: 30}"))
    with pytest.raises(RunbookError, match=re.escape(f"{path}:9: phases[0].steps[0].args.steps: duplicate key")):
        load_runbook(path)
    path = write(tmp_path / "dup.yaml", BASE + "phases:\n  - {name: p2, steps: [{name: c, kind: train}]}\n")
    with pytest.raises(RunbookError, match=re.escape(f"{path}:11: phases: duplicate key (first at line 6)")):
        load_runbook(path)


def test_a_merge_key_beside_its_own_keys_is_no_duplicate(tmp_path):
    path = write(tmp_path / "merge.yaml", BASE.replace("env: {NCCL_ALGO: Tree}", "env: {<<: *e, NCCL_ALGO: Tree}")
                 .replace('env: {NSA_PREFILL', 'env: &e {NSA_PREFILL'))
    assert load_runbook(path).step("a").launch.env == {"NSA_PREFILL_BATCHED": "1", "NCCL_ALGO": "Tree"}


ALIASED = """\
name: aliased
defaults:
  env: &common {NCCL_ALGO: Ring}
phases:
  - name: p1
    steps:
      - {name: a, kind: train, env: *common}
      - {name: c, kind: train, env: *common}
"""


def test_a_set_through_an_alias_changes_only_the_key_it_names(tmp_path):
    path = write(tmp_path / "aliased.yaml", ALIASED)
    rb = load_runbook(path, ["steps.a.env.NCCL_ALGO=X"])
    assert [rb.step(s).launch.env["NCCL_ALGO"] for s in ("a", "c")] == ["X", "Ring"]
    assert rb.defaults.env == {"NCCL_ALGO": "Ring"}
    rb = load_runbook(path, ["defaults.env.NCCL_ALGO=X"])  # a and c set it themselves (through the alias)
    assert [rb.step(s).launch.env["NCCL_ALGO"] for s in ("a", "c")] == ["Ring", "Ring"]
    assert rb.defaults.env == {"NCCL_ALGO": "X"}


@pytest.mark.parametrize("text", ["", "# nothing here\n", "---\n...\n"])
def test_an_empty_runbook_names_its_line(tmp_path, text):
    path = write(tmp_path / "empty.yaml", text)
    with pytest.raises(RunbookError, match=re.escape(f"{path}:1: (top level): the runbook is empty")):
        load_runbook(path)


CHILD = """\
name: child
defaults:
  config: configs/tiny_cpu.yaml
phases:
  - name: cp
    steps:
      - {name: c0, kind: snapshot}
      - name: c1
        kind: train
        config: configs/nope.yaml
"""


def test_an_error_in_an_included_step_names_its_own_file_and_line(tmp_path):
    write(tmp_path / "sub" / "child.yaml", CHILD)
    write(tmp_path / "sub" / "mid.yaml", "name: mid\nphases:\n  - {name: mp, steps: [{name: m1, kind: snapshot}]}\n"
                                         "  - include: child.yaml\n")
    outer = write(tmp_path / "outer.yaml", "name: outer\nphases:\n  - include: sub/mid.yaml\n")
    # the config exists nowhere: only the check against the working directory finds it, on the expanded runbook
    with pytest.raises(RunbookError, match=re.escape(
            f"{tmp_path / 'sub' / 'child.yaml'}:10: phases[0].steps[1].config (included at {tmp_path / 'sub'}/"
            f"mid.yaml:4) (included at {outer}:3): config file configs/nope.yaml not found")):
        load_runbook(outer, cwd=tmp_path)


def test_names_clashing_across_an_include_name_both_places(tmp_path):
    write(tmp_path / "child.yaml", CHILD)
    outer = write(tmp_path / "outer.yaml", "name: outer\nphases:\n  - include: child.yaml\n"
                                           "  - {name: cp, steps: [{name: o1, kind: snapshot}]}\n")
    with pytest.raises(RunbookError, match=re.escape(
            f"{outer}:4: phases[1].name: duplicate phase name 'cp' (first at {tmp_path / 'child.yaml'}:5: "
            f"phases[0].name (included at {outer}:3))")):
        load_runbook(outer)
    write(outer, "name: outer\nphases:\n  - include: child.yaml\n  - {name: op, steps: [{name: c1, kind: snapshot}]}\n")
    with pytest.raises(RunbookError, match=re.escape(
            f"{outer}:4: phases[1].steps[0].name: duplicate step name 'c1' (first at {tmp_path / 'child.yaml'}:8: "
            f"phases[0].steps[1].name (included at {outer}:3))")):
        load_runbook(outer)


INNER = """\
name: inner
requirements: {gpus: 0}
defaults:
  config: configs/tiny_cpu.yaml
  args: {steps: 12, dataset: synthetic}
  env: {NCCL_ALGO: Tree}
  timeout_s: 77
phases:
  - name: ip
    steps:
      - {name: t, kind: train, args: {seq_len: 64}}
"""
OUTER = """\
name: outer
defaults:
  config: configs/other.yaml
  args: {steps: 50, ddp: 0}
  env: {NCCL_ALGO: Ring, NCCL_PROTO: Simple}
  nproc_per_node: 2
phases:
  - include: sub/inner.yaml
  - {name: op, steps: [{name: o, kind: train}]}
"""


def test_an_included_step_keeps_its_own_runbooks_defaults(tmp_path):
    """Its runbook's defaults win key by key over the including runbook's (args, env, config, timeout), as they
    do in its own runbook; what its runbook leaves unset comes from the including runbook's defaults."""
    write(tmp_path / "sub" / "inner.yaml", INNER)
    outer = write(tmp_path / "outer.yaml", OUTER)
    alone = load_runbook(tmp_path / "sub" / "inner.yaml").step("t").launch
    rb = load_runbook(outer, ["defaults.args.steps=30"])
    t, o = rb.step("t").launch, rb.step("o").launch
    assert (t.config, t.timeout_s, t.args, t.env) == (
        alone.config, alone.timeout_s, {**alone.args, "ddp": 0}, {**alone.env, "NCCL_PROTO": "Simple"})
    assert t.nproc_per_node == 2 and (o.config, o.args["steps"]) == ("configs/other.yaml", 30)
    assert "args.steps = 12" in rb.step_notes("t")[0]  # the --set default does not reach it: the plan says so


def test_an_error_in_a_value_an_included_step_carries_names_its_runbooks_defaults(tmp_path):
    """A value from the included runbook's defaults found wrong only in the expanded runbook (against the working
    directory) is named where that runbook writes it, not at the step, which does not write it."""
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "tiny_cpu.yaml").write_text(
        (Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml").read_text())
    inner = write(tmp_path / "sub" / "inner.yaml", INNER.replace("steps: 12", "steps: -5"))
    outer = write(tmp_path / "outer.yaml", OUTER)
    with pytest.raises(RunbookError, match=re.escape(f"{inner}:5: defaults.args.steps (included at {outer}:8): "
                                                     "nsa-train would refuse this")):
        load_runbook(outer, cwd=tmp_path)
    write(inner, INNER.replace("configs/tiny_cpu.yaml", "configs/nope.yaml"))
    with pytest.raises(RunbookError, match=re.escape(f"{inner}:4: defaults.config (included at {outer}:8): "
                                                     "config file configs/nope.yaml not found")):
        load_runbook(outer, cwd=tmp_path)
    # the step's own value keeps its own line
    write(inner, INNER.replace("args: {seq_len: 64}", "args: {seq_len: 64, steps: -5}"))
    with pytest.raises(RunbookError, match=re.escape(f"{inner}:11: phases[0].steps[0].args.steps (included at "
                                                     f"{outer}:8): nsa-train would refuse this")):
        load_runbook(outer, cwd=tmp_path)


def test_an_include_path_is_relative_to_the_including_file(tmp_path, monkeypatch):
    write(tmp_path / "sub" / "inner.yaml", INNER)
    outer = write(tmp_path / "outer.yaml", OUTER)
    monkeypatch.chdir(tmp_path / "sub")  # not the working directory: the same runbook from anywhere
    assert [s.name for s in load_runbook(outer).steps()] == ["t", "o"]
    (tmp_path / "dir.yaml").mkdir()
    write(outer, OUTER.replace("sub/inner.yaml", "dir.yaml"))
    with pytest.raises(RunbookError, match=re.escape(f"{outer}:8: phases[0].include: dir.yaml: is a directory, not a "
                                                     f"runbook file (looked for {tmp_path / 'dir.yaml'})")):
        load_runbook(outer)
    write(outer, OUTER.replace("sub/inner.yaml", "inner.yaml"))  # next to the outer file: not there
    with pytest.raises(RunbookError, match=re.escape(f"{outer}:8: phases[0].include: inner.yaml: no such runbook")):
        load_runbook(outer)


def test_an_include_cycle_names_the_include_that_closes_it(tmp_path):
    a = write(tmp_path / "a.yaml", "name: a\nphases:\n  - include: b.yaml\n")
    b = write(tmp_path / "b.yaml", "name: b\nphases:\n  - {name: bp, steps: [{name: s, kind: snapshot}]}\n"
                                   "  - include: a.yaml\n")
    with pytest.raises(RunbookError, match=re.escape(f"{b}:4: phases[1].include: a.yaml: runbooks include each other "
                                                     f"in a cycle: {a.resolve()} -> {b.resolve()} -> {a.resolve()}")):
        load_runbook(a)


def test_a_step_referring_to_its_own_winner_is_told_so(tmp_path):
    path = write(tmp_path / "self.yaml", "name: s\nphases:\n  - name: p\n    steps:\n      - {name: sw, kind: sweep, "
                 "matrix: {env.NSA_DDP_BUCKET_MB: [25, 50]}, env: {NCCL_X: '${sw.winner.env.NSA_DDP_BUCKET_MB}'}}\n")
    with pytest.raises(RunbookError, match=re.escape(f"{path}:5: phases[0].steps[0].env.NCCL_X: refers to sw's own "
                                                     "winner")):
        load_runbook(path)


@pytest.mark.parametrize("written, read", [("010", "8"), ("0x10", "16"), ("1_000", "1000"), ("8.90", "8.9")])
def test_an_environment_number_yaml_would_read_as_another_text_is_refused(tmp_path, written, read):
    """NCCL_X: 010 would reach the process as "8": an error naming the line, and the quoted text is accepted."""
    body = ("name: envtext\nphases:\n  - name: p\n    steps:\n      - name: s\n        kind: bench\n"
            "        command: [benchmarks/bench_ops.py]\n        env:\n          NCCL_X: {}\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text(body.format(written))
    with pytest.raises(RunbookError, match=rf"bad.yaml:9: .*NCCL_X: YAML reads {written} as the number"):
        load_runbook(bad)
    good = tmp_path / "good.yaml"
    good.write_text(body.format(f"'{written}'"))
    assert load_runbook(good).steps()[0].launch.env["NCCL_X"] == written
    # a --set of an environment value passes the text as typed
    rb = load_runbook(good, [f"steps.s.env.NCCL_X={written}"])
    assert rb.steps()[0].launch.env["NCCL_X"] == written and written != read


@pytest.mark.parametrize("written, read", [("yes", "the boolean true"), ("off", "the boolean false"),
                                           ("True", "the boolean true"), ("~", "null"), ("null", "null"),
                                           ("", "null"), ("1.0e+3", "the number 1000.0"), ("2024-01-01", "a date")])
def test_an_environment_value_yaml_would_read_as_no_text_is_refused(tmp_path, written, read):
    """NCCL_X: yes would reach the process as "1" (and a sweep's [yes, no] as "True"/"False"), NCCL_X: ~ as no value:
    an error naming the line, as for 010; the quoted text is accepted, and a --set passes the text as typed."""
    body = ("name: envtext\nphases:\n  - name: p\n    steps:\n      - name: s\n        kind: bench\n"
            "        command: [benchmarks/bench_ops.py]\n        env:\n          NCCL_X: {}\n")
    bad = write(tmp_path / "bad.yaml", body.format(written))
    shown = written or "an empty value"
    with pytest.raises(RunbookError, match=re.escape(f"bad.yaml:9: phases[0].steps[0].env.NCCL_X: YAML reads {shown} "
                                                     f"as {read}")):
        load_runbook(bad)
    good = write(tmp_path / "good.yaml", body.format(f"'{written}'"))
    assert load_runbook(good).steps()[0].launch.env["NCCL_X"] == written
    assert load_runbook(good, [f"steps.s.env.NCCL_X={written}"]).steps()[0].launch.env["NCCL_X"] == written
    # a --set of the whole mapping is read as YAML, and refused as the file's text is
    with pytest.raises(RunbookError, match=re.escape(f"--set steps.s.env={{NCCL_X: {written}}} ({good}): "
                                                     f"steps.s.env.NCCL_X: YAML reads {shown} as {read}")):
        load_runbook(good, [f"steps.s.env={{NCCL_X: {written}}}"])


def test_a_sweep_value_of_an_environment_variable_is_text_as_written(tmp_path):
    """matrix: {env.NCCL_X: [yes, 010]} would launch NCCL_X=True and NCCL_X=8: refused naming the item's line."""
    body = ("name: sweeptext\ndefaults: {{config: configs/tiny_cpu.yaml}}\nphases:\n  - name: p\n    steps:\n"
            "      - name: sw\n        kind: sweep\n        select: {{metric: toks_per_s, goal: max}}\n"
            "        matrix:\n          env.NCCL_X:\n            - '5'\n            - {}\n")
    for written, read in (("yes", "the boolean true"), ("010", "the number 8"), ("1.10", "the number 1.1")):
        bad = write(tmp_path / "bad.yaml", body.format(written))
        with pytest.raises(RunbookError, match=re.escape(f"bad.yaml:12: phases[0].steps[0].matrix.env.NCCL_X[1]: "
                                                         f"YAML reads {written} as {read}")):
            load_runbook(bad)
        good = write(tmp_path / "good.yaml", body.format(f"'{written}'"))
        sweep = load_runbook(good).step("sw")
        assert [spec.env["NCCL_X"] for spec in sweep.kind_impl.launches(sweep, None, None)] == ["5", written]


def test_environment_numbers_that_print_as_written_stay_numbers(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("name: envok\nphases:\n  - name: p\n    steps:\n      - name: s\n        kind: bench\n"
                    "        command: [benchmarks/bench_ops.py]\n        env: {NSA_DDP_BUCKET_MB: 50, RATIO: 0.5}\n")
    assert load_runbook(path).steps()[0].launch.env == {"NSA_DDP_BUCKET_MB": "50", "RATIO": "0.5"}
