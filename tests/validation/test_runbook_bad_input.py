"""Reading a runbook and its --set overrides: bad values that were accepted (an integer past 64 bits, a timeout no
launch can wait for) or refused with a message that did not say what is wrong (a step without `kind`, a number in
exponent form that YAML reads as text) are errors naming the file, the line and the key before anything runs."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

import validation.kinds.sweep as sweep_kind
from validation.runbook.loader import RunbookError, load_runbook

SNAPSHOT = "name: t\n{defaults}phases:\n  - name: p\n    steps:\n      - {{name: s, kind: snapshot{own}}}\n"


def write(tmp_path, text: str):
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    return path


def test_a_step_without_kind_says_the_key_is_missing(tmp_path):
    for step, line in (("{name: a}", 5), ("name: a\n        title: A", 5)):
        path = write(tmp_path, f"name: t\nphases:\n  - name: p\n    steps:\n      - {step}\n")
        with pytest.raises(RunbookError) as info:
            load_runbook(path)
        assert str(info.value).startswith(f"{path}:{line}: phases[0].steps[0]: missing required key 'kind' (one of ")
        assert "snapshot" in str(info.value) and "None" not in str(info.value)


@pytest.mark.parametrize("key, text, expected", [("timeout_s", "1e3", "a number"), ("timeout_s", "1.0e3", "a number"),
                                                 ("timeout_s", "-2E+3", "a number"), ("window", "1e3", "an integer")])
def test_an_exponent_yaml_reads_as_text_says_so(tmp_path, key, text, expected):
    """YAML 1.1 reads a number in exponent form only with a dot and a signed exponent (1.0e+3): 1e3, 1.0e3 and
    -2E+3 are text, and `must be a number, got '1e3'` did not say why the number written was not one."""
    assert isinstance(yaml.safe_load(text), str)  # the premise: PyYAML reads it as text
    path = write(tmp_path, SNAPSHOT.format(defaults=f"defaults:\n  {key}: {text}\n", own=""))
    with pytest.raises(RunbookError, match=re.escape(f"{path}:3: defaults.{key}: must be {expected}, got {text!r} "
                                                     f"(YAML reads {text} as text")):
        load_runbook(path)
    with pytest.raises(RunbookError, match=re.escape(f"--set defaults.{key}={text} ({path}): defaults.{key}: must be "
                                                     f"{expected}, got {text!r} (YAML reads {text} as text")):
        load_runbook(write(tmp_path, SNAPSHOT.format(defaults="", own="")), [f"defaults.{key}={text}"])


def test_a_number_yaml_reads_as_a_number_loads(tmp_path):
    path = write(tmp_path, SNAPSHOT.format(defaults="defaults: {timeout_s: 1.0e+3}\n", own=""))
    assert load_runbook(path).step("s").launch.timeout_s == 1000.0


@pytest.mark.parametrize("where, key, line", [("defaults", "nproc_per_node", 3), ("defaults", "retry_disturbed", 3),
                                              ("defaults", "port_retries", 3), ("requirements", "gpus", 3),
                                              ("defaults", "window", 3)])
def test_an_integer_past_64_bits_is_refused_naming_the_key(tmp_path, where, key, line):
    """nproc_per_node: 10**30 and the like were accepted (a launch of that many ranks, a retry loop without end);
    2**63 - 1, the largest integer nsa.training.config takes too, is the most any key takes."""
    at_most = 2**63 - 1
    path = write(tmp_path, SNAPSHOT.format(defaults=f"{where}:\n  {key}: {at_most + 1}\n", own=""))
    with pytest.raises(RunbookError, match=re.escape(f"{path}:{line}: {where}.{key}: number too large, got ")):
        load_runbook(path)
    with pytest.raises(RunbookError, match=re.escape(f"--set {where}.{key}={10**30} ({path}): {where}.{key}: number "
                                                     "too large")):
        load_runbook(write(tmp_path, SNAPSHOT.format(defaults="", own="")), [f"{where}.{key}={10**30}"])
    rb = load_runbook(write(tmp_path, SNAPSHOT.format(defaults=f"{where}:\n  {key}: {at_most}\n", own="")))
    assert rb.name == "t"


@pytest.mark.parametrize("repeats", ["9" * 30, "1000000000", "1001"])
def test_a_huge_repeat_count_is_refused_before_any_launch_is_listed(tmp_path, monkeypatch, repeats):
    """A sweep's `repeats: 10**30` (or 10**9, within 64 bits) listed every (repeat, point) of its plan while the
    runbook was read: the loader never returned. It is refused where it is read, before the plan is built: a step
    repeats at most 1,000 times (each repeat a training launch per point)."""
    def listed(*args, **kwargs):
        raise AssertionError("the sweep's launches were listed")

    monkeypatch.setattr(sweep_kind.Sweep, "launches", listed)
    path = write(tmp_path, "name: t\ndefaults: {config: configs/tiny_cpu.yaml}\nphases:\n  - name: p\n    steps:\n"
                           "      - name: sw\n        kind: sweep\n        matrix: {env.NSA_DDP_BUCKET_MB: [25, 50]}\n"
                           "        select: {metric: toks_per_s, goal: max}\n        repeats: " + repeats + "\n")
    with pytest.raises(RunbookError, match=re.escape(f"{path}:10: phases[0].steps[0].repeats: must be <= 1,000")):
        load_runbook(path)


def test_a_timeout_no_launch_can_wait_for_is_refused(tmp_path):
    """A snapshot step with timeout_s 3000000 (or 1.0e+50) loaded, and `nsa-validate run` then ended in a raw
    OverflowError traceback from subprocess.run when the step ran: poll() waits at most 2**31 - 1 ms."""
    most = (2**31 - 1) // 1000
    with pytest.raises(OverflowError):  # the premise: what the snapshot's subprocess.run does with a longer one
        subprocess.run([sys.executable, "-c", ""], capture_output=True, timeout=most + 1)
    for key in ("timeout_s", "stall_timeout_s"):
        path = write(tmp_path, SNAPSHOT.format(defaults="", own=f", {key}: 3000000") if key == "timeout_s" else
                     SNAPSHOT.format(defaults=f"defaults: {{{key}: 1.0e+50}}\n", own=""))
        where = "phases[0].steps[0]" if key == "timeout_s" else "defaults"
        line = 5 if key == "timeout_s" else 2
        with pytest.raises(RunbookError, match=re.escape(f"{path}:{line}: {where}.{key}: must be at most 2,147,483 s")):
            load_runbook(path)
    with pytest.raises(RunbookError, match=re.escape(f"--set steps.s.timeout_s=2147484 ({path}): "
                                                     "phases[0].steps[0].timeout_s: must be at most 2,147,483 s")):
        load_runbook(write(tmp_path, SNAPSHOT.format(defaults="", own="")), ["steps.s.timeout_s=2147484"])
    rb = load_runbook(write(tmp_path, SNAPSHOT.format(defaults="", own=f", timeout_s: {most}")))
    assert rb.step("s").launch.timeout_s == most


def test_an_include_that_is_not_a_regular_file_says_so(tmp_path):
    """`- include: /dev/null` (or a pipe) was `no such runbook`, of a path that is there: it is named as what it is,
    as the runbook on the command line is (validation.run.load)."""
    path = write(tmp_path, "name: t\nphases:\n  - include: /dev/null\n")
    with pytest.raises(RunbookError, match=re.escape(f"{path}:3: phases[0].include: /dev/null: not a regular file (a "
                                                     "device, pipe or socket)")):
        load_runbook(path)


@pytest.mark.parametrize("name, shown", [("a\\nb.yaml", r"'a\nb.yaml'"), ("a\\0b.yaml", r"'a\x00b.yaml'")])
def test_an_include_name_with_a_control_character_is_shown_on_one_line(tmp_path, name, shown):
    path = write(tmp_path, f'name: t\nphases:\n  - include: "{name}"\n')
    with pytest.raises(RunbookError) as info:
        load_runbook(path)
    message = str(info.value)
    assert message.startswith(f"{path}:3: phases[0].include: {shown}: no such runbook (looked for '{tmp_path}/")
    assert message.isprintable()  # one line: no newline, NUL or other control character


@pytest.mark.parametrize("phases, line, where, message", [
    ("phases: 5\n", 2, "phases", "expected a non-empty list of phases"),
    ("phases: [{name: p, steps: 5}]\n", 2, "phases[0].steps", "expected a non-empty list of steps"),
    ("phases:\n  - {name: p, steps: [{name: a, kind: snapshot}]}\n  - {name: q, steps: true}\n", 4, "phases[1].steps",
     "expected a non-empty list of steps")])
def test_a_set_of_a_step_in_a_runbook_without_a_list_of_steps_names_the_file(tmp_path, phases, line, where, message):
    """`--set steps.a.timeout_s=30` on a runbook whose phases (or a phase's steps) are not a list ended in a raw
    TypeError ('int' object is not iterable): the runbook's own error, naming its line, as without the --set."""
    path = write(tmp_path, "name: t\n" + phases)
    expected = f"{path}:{line}: {where}: {message}"
    with pytest.raises(RunbookError) as without:
        load_runbook(path)
    with pytest.raises(RunbookError) as with_set:
        load_runbook(path, ["steps.a.timeout_s=30"])
    assert str(without.value) == str(with_set.value) == expected


class _CountingDict(dict):
    """A mapping that counts the keys looked up in it."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.lookups = 0

    def __contains__(self, key):
        self.lookups += 1
        return super().__contains__(key)


def test_a_set_key_of_many_parts_looks_up_only_the_widths_a_dotted_key_can_have():
    """A --set key's parts are matched to a mapping's keys, a key holding dots (a sweep's env.X) as several parts:
    every width from the longest was tried at each key of the path (a 5,000-part key took minutes). Only a key
    holding w - 1 dots can be w parts: here the one dotted key, env.NSA_DDP_BUCKET_MB, is 2."""
    from validation.runbook.overrides import _key_width

    node = _CountingDict({"env.NSA_DDP_BUCKET_MB": [25, 50], "select": {}})
    parts = ["x"] * 1000
    assert _key_width(node, parts, 0) == 1 and node.lookups <= 2  # "x", then "x.x" (width 2): not there
    assert _key_width(node, ["env", "NSA_DDP_BUCKET_MB"], 0) == 2  # a dotted key of the mapping: its parts
    assert _key_width(node, ["select", "metric"], 0) == 1


@pytest.mark.parametrize("kind, extra", [
    ("ab", "        baseline: {env: {NSA_PREFILL_BATCHED: '0'}}\n"
           "        variants: {b: {env: {NSA_PREFILL_BATCHED: '1'}}}\n"),
    ("sweep", "        matrix: {env.NSA_DDP_BUCKET_MB: [25, 50]}\n        select: {metric: toks_per_s, goal: max}\n"),
])
def test_a_thousand_repeats_still_load(tmp_path, kind, extra):
    """The limit is REPEATS_MAX itself, not below it."""
    path = write(tmp_path, "name: t\ndefaults: {config: configs/tiny_cpu.yaml}\nphases:\n  - name: p\n    steps:\n"
                           f"      - name: s\n        kind: {kind}\n" + extra + "        repeats: 1000\n")
    assert [s.name for s in load_runbook(path).steps()] == ["s"]


TRAIN_RB = ("name: t\ndefaults: {config: configs/tiny_cpu.yaml}\nphases:\n  - name: p\n    steps:\n"
            "      - {name: single, kind: train, args: {steps: 5}}\n"
            "      - name: sw\n        kind: sweep\n        matrix: {env.NSA_DDP_BUCKET_MB: [25, 50]}\n"
            "        select: {metric: toks_per_s, goal: max}\n"
            "acceptance:\n  - {name: c, expr: \"EXPR\"}\n")


@pytest.mark.parametrize("expr, shown", [
    ("single.toks_per_s >= 1", "single.toks_per_s"),
    ("2 * single.toks_per_s > 5", "single.toks_per_s"),
    ("-single.toks_per_s < 0", "single.toks_per_s"),
])
def test_a_criterion_ordering_a_mapping_of_figures_is_refused_before_the_run(tmp_path, expr, shown):
    """`single.toks_per_s >= 1` (its .mean forgotten) loaded and failed only once evaluated, after the whole run,
    as an error and a NO-GO; the kind's names say toks_per_s is a mapping of mean, median, ...: refused at once."""
    path = write(tmp_path, TRAIN_RB.replace("EXPR", expr))
    with pytest.raises(RunbookError) as err:
        load_runbook(path)
    message = str(err.value)
    assert f"{shown} is not a figure but a mapping of" in message and "mean" in message
    assert f"e.g. {shown}.mean" in message


@pytest.mark.parametrize("expr", [
    "single.toks_per_s.mean >= 1",
    "single.toks_per_s is not None",
    "'mean' in single.toks_per_s",
    "single.status == 'passed' and single.toks_per_s.cv <= 0.1",
])
def test_a_criterion_reading_a_figure_or_testing_a_mapping_loads(tmp_path, expr):
    path = write(tmp_path, TRAIN_RB.replace("EXPR", expr))
    assert [c.expr.text for c in load_runbook(path).acceptance] == [expr]
