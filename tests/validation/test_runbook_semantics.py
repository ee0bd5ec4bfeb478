"""What a runbook file means once loaded: values from the file and from --set in their documented precedence,
YAML that PyYAML would read silently wrong (a key given twice, a shared alias), includes and the file and line their
errors name."""

from __future__ import annotations

import re

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


def test_environment_numbers_that_print_as_written_stay_numbers(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("name: envok\nphases:\n  - name: p\n    steps:\n      - name: s\n        kind: bench\n"
                    "        command: [benchmarks/bench_ops.py]\n        env: {NSA_DDP_BUCKET_MB: 50, RATIO: 0.5}\n")
    assert load_runbook(path).steps()[0].launch.env == {"NSA_DDP_BUCKET_MB": "50", "RATIO": "0.5"}
