"""Criteria checked when the runbook is loaded (plan and run, exit 2): a criterion name used twice, and a step
status compared with a value no step ever has, are errors naming the key (or the --set), not a late verdict."""

from __future__ import annotations

import pytest

from validation.runbook.loader import RunbookError, load_runbook

RUNBOOK = """\
name: r
phases:
  - name: p
    steps:
      - {name: crash, kind: bench, command: [x.py]}
acceptance:
  - {name: first, expr: "crash.status == 'failed'"}
  - {name: second, expr: "crash.status in ('failed', 'hang')"}
"""


def load(tmp_path, text: str = RUNBOOK, sets=()):
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    return load_runbook(path, list(sets))


def test_the_example_loads(tmp_path):
    assert [c.name for c in load(tmp_path).acceptance] == ["first", "second"]


def test_a_criterion_name_used_twice_is_an_error(tmp_path):
    # the verdict ("criteria failed: first"), the report, JUnit and --set acceptance.NAME name criteria by name
    with pytest.raises(RunbookError) as info:
        load(tmp_path, RUNBOOK.replace("name: second", "name: first"))
    assert str(info.value).endswith("rb.yaml:8: acceptance[1].name: duplicate criterion name 'first' "
                                    "(also at acceptance[0])")


def test_a_set_that_makes_a_name_twice_is_named(tmp_path):
    with pytest.raises(RunbookError) as info:
        load(tmp_path, sets=["acceptance.first.name=second"])
    assert str(info.value).startswith("--set acceptance.first.name=second (")
    assert str(info.value).endswith("acceptance[0].name: duplicate criterion name 'second' (also at acceptance[1])")


@pytest.mark.parametrize("expr", ["crash.status != 'faild'", "crash.status in ('failed', 'hung')",
                                  "'pased' == crash.status"])
def test_a_status_no_step_ever_has_is_an_error(tmp_path, expr):
    # `crash.status != 'faild'` held whatever the step did; `== 'pased'` made a late NO-GO
    with pytest.raises(RunbookError, match=r"acceptance\[0\]\.expr: crash\.status is never '(faild|hung|pased)' "
                                           r"\(a step's status is one of passed, failed, "):
        load(tmp_path, sets=[f"acceptance.first.expr={expr}"])
