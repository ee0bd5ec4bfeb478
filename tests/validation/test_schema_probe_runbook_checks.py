"""Runbook checks that YAML aliases, merge keys, includes and --set reach: an environment value reached through an
alias or merge key is held to the same text rule as one written in place; an error names the key path as the file
itself numbers it; a --set reaches a setting key that holds a dot (a sweep's env.X); the plan's notes on a --set
default speak only of a --set that is in effect and of keys a step really sets itself."""

from __future__ import annotations

import re

import pytest

from validation.runbook.loader import RunbookError, load_runbook


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


ENV_VIA_YAML = """\
name: t
phases:
  - name: p
    steps:
      - {{name: a, kind: train, args: &a {{seq_len: {value}}}}}
      - {{name: b, kind: bench, command: [x.py], env: {env}}}
"""


@pytest.mark.parametrize("env", ["*a", "{<<: *a}", "{<<: [*a]}"], ids=["alias", "merge", "merge-list"])
def test_an_env_value_reached_through_an_alias_or_merge_key_is_held_to_its_text(tmp_path, env):
    """`010` written under env is refused (YAML reads the number 8, the process would get '8'); the same text
    first written under a step's args and then used as the env mapping must be refused too, not passed as '8'."""
    path = write(tmp_path / "rb.yaml", ENV_VIA_YAML.format(value="010", env=env))
    with pytest.raises(RunbookError, match=re.escape(
            f"{path}:5: phases[0].steps[1].env.seq_len: YAML reads 010 as the number 8, which the process would get "
            "as '8'; quote it ('010') to pass the text as written")):
        load_runbook(path)
    # quoted, it is the text as written
    rb = load_runbook(write(path, ENV_VIA_YAML.format(value="'010'", env=env)))
    assert rb.step("b").launch.env == {"seq_len": "010"}


def test_a_merge_list_under_env_is_checked_where_it_is_written(tmp_path):
    """`<<: [...]` merges each mapping of the list into the env mapping: 0x10 there would reach the process as 16."""
    path = write(tmp_path / "rb.yaml", "name: t\nphases:\n  - name: p\n    steps:\n"
                                       "      - name: b\n        kind: bench\n        command: [x.py]\n"
                                       "        env: {<<: [{NCCL_X: 0x10}]}\n")
    with pytest.raises(RunbookError, match=re.escape(
            f"{path}:8: phases[0].steps[0].env.NCCL_X: YAML reads 0x10 as the number 16")):
        load_runbook(path)


INNER = """\
name: inner
phases:
  - {name: ip1, steps: [{name: t1, kind: snapshot}]}
  - {name: ip2, steps: [{name: t2, kind: snapshot}]}
acceptance:
  - {name: c1, expr: "t1.status == 'passed'"}
"""


def test_errors_after_an_include_name_the_files_own_key_path(tmp_path):
    """outer.yaml: phases[0] is the include (two phases), phases[1] its own; acceptance[0] its own criterion. The
    expanded runbook has them at phases[2] and acceptance[1]; the error names them as the file does."""
    write(tmp_path / "inner.yaml", INNER)
    outer = write(tmp_path / "outer.yaml", "name: outer\nphases:\n  - include: inner.yaml\n"
                                           "  - {name: op, steps: [{name: o, kind: snapshott}]}\n")
    with pytest.raises(RunbookError, match=re.escape(f"{outer}:4: phases[1].steps[0].kind: 'snapshott' is not one")):
        load_runbook(outer)
    write(outer, "name: outer\nphases:\n  - include: inner.yaml\n  - {name: op, steps: [{name: o, kind: snapshot}]}\n"
                 "acceptance:\n  - {name: c2, expr: \"o.status == 'pased'\"}\n")
    with pytest.raises(RunbookError, match=re.escape(f"{outer}:6: acceptance[0].expr: o.status is never 'pased'")):
        load_runbook(outer)
    # two includes before it, one of two phases and one of one; a phase of the file's own before them
    write(tmp_path / "one.yaml", "name: one\nphases:\n  - {name: q1, steps: [{name: u1, kind: snapshot}]}\n")
    write(outer, "name: outer\nphases:\n  - {name: op0, steps: [{name: o0, kind: snapshot}]}\n"
                 "  - include: inner.yaml\n  - include: one.yaml\n"
                 "  - {name: op, steps: [{name: o, kind: snapshot, bogus: 1}]}\n")
    with pytest.raises(RunbookError, match=re.escape(f"{outer}:6: phases[3].steps[0].bogus: unknown key")):
        load_runbook(outer)


def test_a_nested_include_names_the_middle_files_own_key_path(tmp_path):
    """mid.yaml includes a two-phase runbook, then has its own phase (its phases[1]); outer.yaml includes mid. A
    config missing from the working directory is found on the expanded runbook only."""
    write(tmp_path / "inner.yaml", INNER)
    mid = write(tmp_path / "mid.yaml", "name: mid\nphases:\n  - include: inner.yaml\n  - name: mp\n    steps:\n"
                                       "      - {name: m1, kind: train, config: configs/nope.yaml}\n")
    outer = write(tmp_path / "outer.yaml", "name: outer\nphases:\n  - include: mid.yaml\n")
    with pytest.raises(RunbookError, match=re.escape(
            f"{mid}:6: phases[1].steps[0].config (included at {outer}:3): config file configs/nope.yaml not found")):
        load_runbook(outer, cwd=tmp_path)


NO_DEFAULTS = """\
name: rb
phases:
  - name: main
    steps:
      - {name: a, kind: train, args: {steps: 20, dataset: synthetic}, env: {NCCL_ALGO: Ring}}
"""


def test_a_set_default_that_reaches_the_step_gets_no_note(tmp_path):
    """The file has no defaults: --set defaults.args.lr=0.1 reaches step a (which sets no lr), so no note may say
    that the step's own args override it; --set defaults.args.steps=30 is overridden by a's own steps only."""
    path = write(tmp_path / "rb.yaml", NO_DEFAULTS)
    rb = load_runbook(path, ["defaults.args.lr=0.1"])
    assert rb.step("a").launch.args == {"lr": 0.1, "steps": 20, "dataset": "synthetic"}
    assert rb.step_notes("a") == [] and rb.notes == []
    rb = load_runbook(path, ["defaults.args.steps=30"])
    assert rb.step_notes("a") == [
        "its own args.steps = 20 overrides --set defaults.args.steps=30 (a step's own value wins over defaults; "
        "change it with --set steps.a.args.steps=...)"]
    rb = load_runbook(path, ["defaults.env.NCCL_ALGO=Tree"])
    assert rb.step_notes("a") == [
        "its own env.NCCL_ALGO = 'Ring' overrides --set defaults.env.NCCL_ALGO=Tree (a step's own value wins over "
        "defaults; change it with --set steps.a.env.NCCL_ALGO=...)"]


@pytest.mark.parametrize("first", ["defaults.args.steps=30", "defaults.args={steps: 30}"])
def test_a_set_default_given_again_is_noted_once_with_the_value_in_effect(tmp_path, first):
    path = write(tmp_path / "rb.yaml", NO_DEFAULTS)
    rb = load_runbook(path, [first, "defaults.args.steps=40"])
    assert rb.step_notes("a") == [
        "its own args.steps = 20 overrides --set defaults.args.steps=40 (a step's own value wins over defaults; "
        "change it with --set steps.a.args.steps=...)"]


SWEEP = """\
name: rb
defaults: {args: {steps: 10, dataset: synthetic}}
phases:
  - name: main
    steps:
      - name: sw
        kind: sweep
        matrix: {env.NSA_DDP_BUCKET_MB: [25, 50]}
        select: {metric: toks_per_s, goal: max}
"""


def test_a_set_reaches_a_sweeps_dotted_setting_key(tmp_path):
    """A matrix key is `env.NSA_DDP_BUCKET_MB`, one key holding a dot: --set ...matrix.env.NSA_DDP_BUCKET_MB=[...]
    replaces its values (it is not a key `env` holding NSA_DDP_BUCKET_MB), and adds a new env.X beside it."""
    path = write(tmp_path / "rb.yaml", SWEEP)
    for item in ("steps.sw.matrix.env.NSA_DDP_BUCKET_MB=[25, 100]",
                 "phases.main.steps.sw.matrix.env.NSA_DDP_BUCKET_MB=[25, 100]"):
        assert load_runbook(path, [item]).step("sw").matrix == {"env.NSA_DDP_BUCKET_MB": ["25", "100"]}
    matrix = load_runbook(path, ["steps.sw.matrix.env.NSA_PREFILL_BATCHED=['0', '1']"]).step("sw").matrix
    assert matrix == {"env.NSA_DDP_BUCKET_MB": ["25", "50"], "env.NSA_PREFILL_BATCHED": ["0", "1"]}
    # its values are environment text, as in the file: 025 would reach the process as 21
    with pytest.raises(RunbookError, match=re.escape(
            f"--set steps.sw.matrix.env.NSA_DDP_BUCKET_MB=[025, 100] ({path}): steps.sw.matrix.env.NSA_DDP_BUCKET_MB"
            "[0]: YAML reads 025 as the number 21")):
        load_runbook(path, ["steps.sw.matrix.env.NSA_DDP_BUCKET_MB=[025, 100]"])


def test_an_env_name_ending_in_a_newline_is_refused(tmp_path):
    # `^...$` matches before a final newline: "ZZ_A\n" passed as a name, and the validated command's
    # "ZZ_A\n=1 \" line then ran ZZ_A as a command in bash
    rb = write(tmp_path / "rb.yaml", 'name: t\nphases:\n  - name: p\n    steps:\n'
                                     '      - {name: b, kind: bench, command: [x.py], env: {"ZZ_A\\n": "1"}}\n')
    with pytest.raises(RunbookError, match="not a valid environment variable name"):
        load_runbook(rb)
