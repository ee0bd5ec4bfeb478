"""What README.md and docs/*.md say about the code they describe, checked against the code: the toggle counts of the
Environment toggles section, the files and folders the documents name, the snapshot module's command line, and the
device-time limit quoted for reports/gpu/next_run.sh."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from nsa import toggles

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty".split())}
# the folders a path in the documents starts with when it names a file of this repository
TOP = ("nsa/", "validation/", "tests/", "runbooks/", "configs/", "benchmarks/", "reports/", "docs/", ".ci/")


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


class _Recording(dict):
    """An environment that remembers which names were looked up."""

    def __init__(self):
        super().__init__()
        self.asked: list[str] = []

    def get(self, key, default=None):
        self.asked.append(key)
        return super().get(key, default)


def test_the_toggle_counts_in_the_readme_are_those_of_the_table():
    prose = " ".join(_text(REPO / "README.md").split())
    m = re.search(r"The trainer reads the first (\w+) once \(`Toggles\.read`\) and passes them down: the first (\w+) "
                  r"change the model config.*?; the last (\w+) change no training result", prose)
    assert m, "README.md's Environment toggles section no longer says how many toggles the trainer reads"
    read, model, inert = (WORDS[w] for w in m.groups())
    names = list(toggles.TOGGLES)
    env = _Recording()
    toggles.Toggles.read(env)
    asked = [n for n in names if n in env.asked]
    # the trainer reads the table's first `read` rows, and no other
    assert asked == names[:read], (read, asked)
    consumers = [t.consumer for t in toggles.TOGGLES.values()]
    assert consumers[:model] == ["trainer (model config)"] * model
    assert "trainer (model config)" not in consumers[model:]
    flags = [t.affects_run for t in toggles.TOGGLES.values()]
    assert flags[len(flags) - inert:] == [False] * inert
    assert all(flags[:len(flags) - inert])


def _paths(text: str) -> list[str]:
    out = []
    # a path in backticks, or in parentheses (the data-flow picture of docs/architecture.md)
    for span in re.findall(r"`([^`\s]+)`", text) + re.findall(r"\(([a-z.]+/[^()\s`]*)\)", text):
        if span.startswith(TOP) and not any(c in span for c in "*{$|") and ".." not in span:
            out.append(span.rstrip(".,:;)"))
    return out


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_repository_path_a_document_names_exists(doc):
    kinds = sorted(p.name for p in (REPO / "validation" / "kinds").iterdir()
                   if p.is_dir() and (p / "__init__.py").exists())
    missing = []
    for path in _paths(_text(doc)):
        if "<" in path and path.count("<") == 1 and "<kind>" in path:
            candidates = [path.replace("<kind>", k) for k in kinds]
        elif "<" in path:
            continue  # a run's own name (RUN_DIR/<step>, artifacts/validate/<name>-<time>): not a repository file
        else:
            candidates = [path]
        missing += [c for c in candidates if not (REPO / c).exists()]
    assert not missing, f"{doc.name} names files that do not exist: {missing}"


def test_the_snapshot_module_is_documented_with_its_argument():
    from validation.launch import environment

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert environment.node_snapshot_main([]) == 2
    usage = err.getvalue().strip().removeprefix("usage: ")
    assert usage.startswith("python -m validation.launch.environment ")
    for doc in DOCS:
        for m in re.finditer(r"`(python -m validation\.launch\.environment[^`]*)`", _text(doc)):
            assert m.group(1) == usage, f"{doc.name}: `{m.group(1)}`, the module's usage is `{usage}`"


def test_the_gpu_script_call_limit_quoted_in_the_readme_holds_every_part():
    script = _text(REPO / "reports" / "gpu" / "next_run.sh")
    budgets = [int(b) for b in re.findall(r"^#\s+PART=\w+ BUDGET=(\d+) bash", script, flags=re.M)]
    assert len(budgets) >= 2
    prose = " ".join(_text(REPO / "README.md").split())
    m = re.search(r"one call of at most ([\d.]+) minutes each", prose)
    assert m, "README.md no longer quotes the next GPU session's per-call limit"
    assert max(budgets) / 60 <= float(m.group(1)) < max(budgets) / 60 + 0.5, (budgets, m.group(1))
