"""Property-based fuzzing of three input parsers: every input either loads or ends in the module's own error.

    validation.runbook.loader.load_runbook          -> a Runbook or RunbookError ("FILE:LINE: ..." / "FILE:?: ...", one line)
    validation.runbook.expressions.compile_expression -> an Expression or ExpressionError; Expression.evaluate never raises
    validation.analysis.metrics.read_training_csv + summarize -> never raise; the summary is strict JSON (no NaN/inf)

and of the paths a runbook's values become (4.): whatever its name, step names, matrix values, variant and suspect
labels and test files, every file a run would make lies in its run directory, inside the runs directory, and
nothing appears outside it (a snapshot of the directory around the run root before and after).

Inputs: random YAML documents shaped like the runbook schema, mutations of the shipped runbooks (structure and
text), random bytes and YAML syntax soup, random --set overrides; random strings, token soups and random syntax
trees of the allowed constructs evaluated against random data; random bytes and random CSVs.

Hypothesis runs derandomized (the same examples every run) without an example database, so CI is deterministic
and writes nothing. The number of examples tried per parser is printed at the end of the module (visible with
-s) and merged into the JSON file named by NSA_FUZZ_COUNTS_OUT when that variable is set. The plain regression
tests at the end pin the exact inputs that once escaped.
"""

from __future__ import annotations

import collections
import copy
import errno
import json
import math
import random
import re
import time
import warnings
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fuzz_support import entries as doc_entries, report_counts  # tests/fuzz_support.py
from nsa.training.outputs import MFU_COLUMN, TRAINING_COLUMNS
from validation.runbook.expressions import (FUNCTIONS, MAX_DEPTH, MAX_INT_BITS, STATUSES, EvalResult, Expression,
                                    ExpressionError, compile_expression, fmt_value)
from validation.analysis.metrics import STATUSES as SUMMARY_STATUSES
from validation.analysis.metrics import CsvRead, Window, read_training_csv, summarize, window_values
from validation.formatting import file_name
from validation.launch.spec import LOG_NAME
from validation.runbook.plan import step_launches
from validation import kinds as step_kinds
from validation.results.store import inside_run_dir
from validation.run import default_run_dir
from validation.runbook.loader import Runbook, RunbookError, load_runbook

REPO = Path(__file__).resolve().parents[2]
RUNBOOK_TEXTS = {p.name: p.read_text(encoding="utf-8") for p in sorted((REPO / "runbooks").glob("*.yaml"))}
RUNBOOK_DOCS = {name: yaml.safe_load(text) for name, text in RUNBOOK_TEXTS.items()}

COUNTS: collections.Counter[str] = collections.Counter()  # examples tried per parser ("<parser>_ok": loaded)

# derandomize: the same examples on every run; database=None: nothing written under .hypothesis/.
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=200)
# Expressions are evaluated with a per-example deadline: a runaway ** or round() would blow it.
EXPR_FUZZ = settings(FUZZ, deadline=2000)


pytestmark = pytest.mark.reliability  # the generated-inputs figure


@pytest.fixture(scope="module", autouse=True)
def _report_counts(reliability):
    yield
    report_counts(COUNTS, reliability, Path(__file__).name)


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


# ============================================================================ shared value strategies
SCHEMA_KEYS = ("name", "description", "requirements", "defaults", "phases", "acceptance", "recommend", "title",
               "steps", "kind", "env", "args", "matrix", "select", "baseline", "variants", "repeats", "metric",
               "tests", "pytest_args", "command", "profile_steps", "profiler", "config", "nproc_per_node",
               "master_port", "port_retries", "timeout_s", "stall_timeout_s", "window", "warmup_steps", "gpus",
               "min_cuda_capability", "min_gpu_memory_gb", "backend", "expr", "target", "severity", "optional",
               "requires", "goal", "recommend", "on_failure")
STEP_KINDS = step_kinds.names()
WORDS = STEP_KINDS + ("auto", "nccl", "gloo", "fail", "warn", "max", "min", "toks_per_s", "torch", "nsys", "s1",
                      "stop", "continue", "../x", "/tmp/x", "--junitxml=/tmp/x",
                      "p1", "sw", "baseline", "env.NSA_DDP_BUCKET_MB", "args.steps", "NSA_DDP_BUCKET_MB",
                      "${sw.winner.env.NSA_DDP_BUCKET_MB}", "${s1.winner.args.steps}", "${nope.winner.env.X}",
                      "baseline.toks_per_s.mean >= 1", "s1.failed == 0", "import os", "2020-13-45", "")
HUGE_INTS = (2**63, -(2**63) - 1, 10**400, -(10**400))  # YAML can hold these (not more than 4300 digits)
# ints str() refuses (> 4300 digits); .map: hypothesis repr()s the strategy
HUGER_INTS = st.sampled_from((5000, 20000)).map(lambda digits: 10**digits)

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-2**70, 2**70), st.sampled_from(HUGE_INTS), st.floats(),
    st.text(max_size=12), st.sampled_from(WORDS), st.binary(max_size=4))
keys = st.one_of(st.sampled_from(SCHEMA_KEYS), st.text(max_size=8), st.integers(-3, 3), st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=12)


def either(plausible):
    """A plausible value for a slot most of the time, anything at all otherwise."""
    return st.one_of(plausible, plausible, plausible, plausible, values)


def dump(doc) -> str:
    """YAML text of a generated document (non-string keys, NaN, bytes and all)."""
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=120)


def one_line(message: str) -> None:
    assert message and "\n" not in message and "\r" not in message, message


# ============================================================================ 1. runbooks
# YAML that safe_dump never writes: impossible timestamps and tagged scalars, aliases, merge keys, deep nesting.
YAML_SNIPPETS = (
    "2020-13-45", "0000-01-01", "2001-02-30 12:00:00", "!!int ''", "!!int x", "!!float ''", "!!float abc",
    "!!bool maybe", "!!timestamp abc", "!!binary ~~~", "!!binary aGVsbG8=", "!!null x", "!!str", "!!set [a]",
    "!!omap [{[a]: b}]", "!!pairs [{[a]: b}]", "!!omap x", "!!map [1]", "!!seq {a: 1}", "!!python/object:os.system",
    "&a [*a]", "&b {k: *b}", "*undefined", "{<<: 5}", "{<<: [1]}", "{a: 1, a: 2}", "? [a]\n: b", "0x", "0o9",
    "1_000", ".inf", "-.inf", ".nan", "~", "1e999", "1" * 5000, "[" * 800, "{a: " * 400, "- " * 300 + "x", "'",
    '"\\x"', '"\\ud800"', "|\n  text", ">-", "%YAML 1.1\n---\na: 1", "---\n---", "\t", "\x00", "\ufeff", "@x",
    "`", "!<tag:yaml.org,2002:int> 7", "!local x", "a: b: c", "- a\nb: c", "[a, b", "{a", "a: |\n b\nc",
)
YAML_BOMB = ("a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
             + "".join(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9)))


def runbook_problem(path: Path, overrides: list[str] | None = None) -> str | None:
    """None when the file loads; the message when it is a RunbookError; anything else fails the test."""
    COUNTS["runbook"] += 1
    try:
        runbook = load_runbook(path, overrides)
    except RunbookError as exc:
        message = str(exc)
        one_line(message)
        assert (re.match(rf"{re.escape(str(path))}:(\d+|\?): ", message)
                or message.startswith((f"{path}: cannot read", "--set "))), message
        return message
    assert isinstance(runbook, Runbook)
    COUNTS["runbook_ok"] += 1
    for step in runbook.steps():
        step_launches(step)  # every kind's launches derive from a valid step (a sweep: its matrix points)
    return None


def write_runbook(work_dir: Path, content: str | bytes) -> Path:
    path = work_dir / "runbook.yaml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_bytes(content.encode("utf-8", errors="surrogatepass"))
    return path


def mapping_of(required: dict, optional: dict):
    return st.fixed_dictionaries({k: either(v) for k, v in required.items()},
                                 optional={k: either(v) for k, v in optional.items()})


env_maps = st.dictionaries(st.sampled_from(("NSA_DDP_BUCKET_MB", "NCCL_ALGO", "X", "bad name", "1X", "")),
                           st.one_of(scalars, st.sampled_from(WORDS)), max_size=3)
arg_maps = st.dictionaries(st.sampled_from(("steps", "ddp", "dataset", "Bad", "--x", "a-b")), scalars, max_size=3)
launch = dict(config=st.sampled_from(("configs/tiny_cpu.yaml", "nope.yaml")), env=env_maps, args=arg_maps,
              nproc_per_node=st.integers(-1, 4), master_port=st.sampled_from(("auto", 29500, 80, 70000, "29500")),
              port_retries=st.integers(-1, 3), timeout_s=st.floats(), stall_timeout_s=st.integers(-1, 100),
              window=st.integers(-1, 60), warmup_steps=st.integers(-1, 5))
requirements = dict(gpus=st.integers(-1, 8), min_cuda_capability=st.floats(), min_gpu_memory_gb=st.floats(),
                    backend=st.sampled_from(("nccl", "gloo", "mpi")))
step_names = st.sampled_from(("s1", "s2", "sw", "baseline", "1bad", "s 1"))
steps = mapping_of(
    dict(name=step_names, kind=st.sampled_from(STEP_KINDS + ("trian",))),
    dict(title=st.text(max_size=8), optional=st.booleans(), requires=mapping_of({}, requirements),
         matrix=st.dictionaries(st.sampled_from(("env.NSA_DDP_BUCKET_MB", "args.steps", "bad", "env.")),
                                st.lists(scalars, max_size=3), max_size=2),
         select=mapping_of({}, dict(metric=st.sampled_from(("toks_per_s", "loss")),
                                    goal=st.sampled_from(("max", "min", "mid")))),
         baseline=mapping_of({}, dict(env=env_maps, args=arg_maps)),
         variants=st.dictionaries(st.sampled_from(("fused", "plain", "1x")),
                                  mapping_of({}, dict(env=env_maps, args=arg_maps)), max_size=2),
         repeats=st.integers(-1, 3), metric=st.sampled_from(("toks_per_s",)), recommend=st.booleans(),
         tests=st.lists(st.sampled_from(("tests/x.py", "tests/y.py::t")), max_size=2),
         pytest_args=st.lists(st.sampled_from(("-x", "-q")), max_size=2),
         command=st.lists(st.sampled_from(("benchmarks/x.py", "--n", "3")), max_size=3),
         profile_steps=st.integers(-1, 5), profiler=st.sampled_from(("auto", "torch", "nsys", "perf")), **launch))
phases = mapping_of(dict(name=st.sampled_from(("p1", "p2", "bad phase")), steps=st.lists(steps, max_size=3)),
                    dict(title=st.text(max_size=8), description=st.text(max_size=8)))
criteria = mapping_of(
    dict(name=st.sampled_from(("c1", "c2")),
         expr=st.sampled_from(("s1.toks_per_s.mean >= 1", "sw.winner is not None", "nope.x > 1", "__import__('os')",
                               "s1 +", "log_contains(s1, 'x')", "between(s1.loss.mean, 0, 1)", ""))),
    dict(target=st.text(max_size=8), severity=st.sampled_from(("fail", "warn", "fatal")),
         description=st.text(max_size=8)))
runbook_docs = mapping_of(
    dict(name=st.one_of(st.sampled_from(("t", "ddp-2xa100", "v1.2", "../x", "..", ".t", "a/b")), st.text(max_size=10)),
         phases=st.lists(phases, max_size=3)),
    dict(description=st.text(max_size=10), requirements=mapping_of({}, requirements),
         defaults=mapping_of({}, launch), acceptance=st.lists(criteria, max_size=3),
         recommend=mapping_of({}, dict(env=env_maps))))


@FUZZ
@given(doc=runbook_docs)
def test_runbook_random_documents(work_dir, doc):
    runbook_problem(write_runbook(work_dir, dump(doc)))


@FUZZ
@given(doc=values)
def test_runbook_random_values(work_dir, doc):
    runbook_problem(write_runbook(work_dir, dump(doc)))




@st.composite
def mutated(draw, docs: dict):
    """A shipped document with 1 to 4 structural mutations: delete, replace, rename, insert, wrap."""
    doc = copy.deepcopy(docs[draw(st.sampled_from(sorted(docs)))])
    for _ in range(draw(st.integers(1, 4))):
        entries = doc_entries(doc)
        if not entries:
            break
        if draw(st.booleans()):  # half the time a top-level key, else anywhere
            entries = [(doc, k) for k in doc] if isinstance(doc, dict) and doc else entries
        parent, key = draw(st.sampled_from(entries))
        op = draw(st.sampled_from(("delete", "replace", "replace", "rename", "insert", "wrap")))
        if op == "delete":
            del parent[key]
        elif op == "replace":
            parent[key] = draw(values)
        elif op == "wrap":
            parent[key] = draw(st.sampled_from(([parent[key]], {"x": parent[key]})))
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(keys)] = parent.pop(key)
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
        else:
            parent.insert(draw(st.integers(0, len(parent))), draw(values))
    return doc


@FUZZ
@given(doc=mutated(RUNBOOK_DOCS))
def test_runbook_structural_mutations(work_dir, doc):
    runbook_problem(write_runbook(work_dir, dump(doc)))


@st.composite
def text_mutated(draw, texts: dict):
    """A shipped file's text with 1 to 3 line edits: delete, duplicate, cut, re-indent, insert YAML or junk."""
    lines = texts[draw(st.sampled_from(sorted(texts)))].splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, max(len(lines) - 1, 0)))
        op = draw(st.sampled_from(("delete", "duplicate", "cut", "indent", "snippet", "junk")))
        if not lines:
            lines = [""]
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
        elif op == "indent":
            lines[i] = draw(st.sampled_from(("", " ", "  ", "\t", "      "))) + lines[i].lstrip(" ")
        elif op == "snippet":
            line = lines[i]
            head = line[:line.index(":") + 1] if ":" in line else line.rstrip("\n") + ":"
            lines[i] = f"{head} {draw(st.sampled_from(YAML_SNIPPETS))}\n"
        else:
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(st.text(max_size=6)) + lines[i][pos:]
    text = "".join(lines)
    if draw(st.booleans()):  # truncated mid-file, e.g. by an editor crash
        text = text[:draw(st.integers(0, len(text)))]
    return text


@FUZZ
@given(text=text_mutated(RUNBOOK_TEXTS))
def test_runbook_text_mutations(work_dir, text):
    runbook_problem(write_runbook(work_dir, text))


yaml_soup = st.lists(st.one_of(st.sampled_from(YAML_SNIPPETS), st.sampled_from(SCHEMA_KEYS + WORDS),
                               st.sampled_from(list("[]{}:-&*!|>'\"#%@`,? \n\t\r")), st.text(max_size=4)),
                     max_size=25).map("".join)


@FUZZ
@given(content=st.one_of(st.binary(max_size=300), yaml_soup,
                         st.builds(lambda k, s: f"{k}: {s}\n", st.sampled_from(SCHEMA_KEYS), yaml_soup)))
@example(content=b"\xff\xfe\x00")
@example(content=b"\xef\xbb\xbfname: x\n")
@example(content=YAML_BOMB + "name: *a8\nphases: *a8\n")
@example(content="[" * 2000)
def test_runbook_bytes_and_yaml_soup(work_dir, content):
    runbook_problem(write_runbook(work_dir, content))


override_keys = st.lists(st.one_of(st.sampled_from(SCHEMA_KEYS + WORDS + ("preflight", "baseline", "snapshot",
                                                                           "Z", "NSA_X", "0", "")),
                                   st.text(max_size=4)), max_size=7).map(".".join)
override_values = st.one_of(st.sampled_from(YAML_SNIPPETS + WORDS), st.text(max_size=10), yaml_soup)
overrides = st.one_of(
    st.builds(lambda k, v: f"{k}={v}", override_keys, override_values),
    st.sampled_from(("=", "..=", "a=[1", "a.b=c", "phases.x.steps.y.env.Z=1", "phases.baseline.steps.baseline."
                     "env.Z=1", "phases=1", "phases.baseline=2", "name", "name=", "defaults.args.steps=20",
                     "phases.baseline.steps.baseline.kind=trian", "acceptance=5", "a=\udcff", "a.\udcff=1",
                     "phases.baseline.steps.baseline.title=\ud800")),
    st.text(alphabet=st.characters(codec=None, categories=None), max_size=12))


@FUZZ
@given(name=st.sampled_from(sorted(RUNBOOK_TEXTS)), items=st.lists(overrides, max_size=4))
@example(name="cpu_smoke.yaml", items=["a=" + "1" * 5000])
@example(name="cpu_smoke.yaml", items=["a=\udcff"])
def test_runbook_overrides(work_dir, name, items):
    runbook_problem(write_runbook(work_dir, RUNBOOK_TEXTS[name]), items)


# ---------------------------------------------------------------------------- runbook regressions
MINIMAL = "name: t\nphases: [{name: p, steps: [{name: s1, kind: train}]}]\n"


@pytest.mark.parametrize("text", [
    "name: t\nwhen: 2020-13-45\n",            # ValueError from the timestamp constructor
    "name: !!timestamp abc\n",                # AttributeError
    "name: !!bool maybe\n",                   # KeyError
    "name: !!int ''\n",                       # IndexError
    "[" * 50_000 + "]" * 50_000,              # RecursionError in the composer (deeper than any recursion limit:
                                              # torch.compile, run by earlier tests, raises it to 2,000)
    "name: " + "1" * 5000 + "\n",             # ValueError: int longer than 4300 digits
], ids=["date", "timestamp", "bool", "int", "deep", "long-int"])
def test_runbook_yaml_constructor_errors_are_runbook_errors(tmp_path, text):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RunbookError, match=rf"^{re.escape(str(path))}:(\d+|\?): not valid YAML"):
        load_runbook(path)


@pytest.mark.parametrize("text", ["a: &a [*a]\nname: t\nphases: *a\n", "!!omap [{[a]: b}]\n"])
def test_runbook_cyclic_alias_and_sequence_key(tmp_path, text):
    """Line mapping once recursed forever through a cyclic alias and hashed a list key (!!omap keeps it)."""
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RunbookError, match=rf"^{re.escape(str(path))}:\d+: "):
        load_runbook(path)


def test_runbook_alias_bomb_is_fast(tmp_path):
    """9**9 key paths through aliases: line mapping once walked every one (minutes)."""
    path = tmp_path / "r.yaml"
    path.write_text(YAML_BOMB + MINIMAL)
    start = time.perf_counter()
    with pytest.raises(RunbookError, match=r":1: a0: unknown key"):
        load_runbook(path)
    assert time.perf_counter() - start < 5


def test_runbook_alias_bomb_in_an_error_message_is_bounded(tmp_path):
    """Error messages once repr'd the whole value: 9**8 strings for this `name`."""
    bomb = "".join(f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]\n" for i in range(1, 9))
    path = tmp_path / "r.yaml"
    path.write_text("description:\n  - &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + bomb
                    + "name: *a8\nphases: []\n")
    start = time.perf_counter()
    with pytest.raises(RunbookError, match=r":11: name: must be a string, got \[\[") as info:
        load_runbook(path)
    assert len(str(info.value)) < 300 and time.perf_counter() - start < 5


def test_runbook_acceptance_must_be_a_list(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(MINIMAL + "acceptance: 5\n")
    with pytest.raises(RunbookError, match=r":3: acceptance: expected a list of criteria, got int$"):
        load_runbook(path)


def test_runbook_number_too_large_for_a_float(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(MINIMAL + "defaults: {timeout_s: 1" + "0" * 400 + "}\n")
    with pytest.raises(RunbookError, match=r":3: defaults.timeout_s: number too large"):
        load_runbook(path)


@pytest.mark.parametrize("item", ["a=" + "1" * 5000, "a=2020-13-45", "a=!!bool maybe"], ids=["long", "date", "bool"])
def test_runbook_override_value_yaml_cannot_construct_is_a_string(tmp_path, item):
    """The value of a --set is YAML; one PyYAML cannot construct once escaped as ValueError/KeyError."""
    path = tmp_path / "r.yaml"
    path.write_text(MINIMAL)
    with pytest.raises(RunbookError, match=r"^--set a=.{1,78} \(.*r\.yaml\): a: unknown key"):  # names the --set
        load_runbook(path, [item])


def test_runbook_override_with_surrogates(tmp_path):
    """A --set from a non-UTF-8 command line (surrogate-escaped by Python) once crashed the sha256."""
    path = tmp_path / "r.yaml"
    path.write_text(MINIMAL)
    assert load_runbook(path, ["phases.p.steps.s1.title=\udcff"]).step("s1").title == "\udcff"


def test_runbook_key_with_newline_stays_on_one_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text('name: t\n"a\\nb": 1\nphases: []\n')
    with pytest.raises(RunbookError, match=r"^\S+:2: 'a\\nb': unknown key"):
        load_runbook(path)


def test_runbook_override_key_with_newline_stays_on_one_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(MINIMAL)
    with pytest.raises(RunbookError, match=r"^--set 'name.name.\\r': name is not a mapping$"):
        load_runbook(path, ["name.name.\r=1"])


# ============================================================================ 2. expressions
NAMES = ("a", "b", "x", "baseline", "sweep")
ATTRS = ("toks_per_s", "mean", "runs", "winner", "n", "failed", "b", "x")
FUNCS = tuple(FUNCTIONS) + ("__import__", "eval", "open", "exec", "getattr", "print")
BINOPS = ("+", "-", "*", "/", "//", "%", "**", "@", "&", "|", "^", "<<", ">>")
CMPOPS = ("==", "!=", "<", "<=", ">", ">=", "is", "is not", "in", "not in", "and", "or")
TOKENS = (NAMES + ATTRS + FUNCS + BINOPS + CMPOPS
          + ("(", ")", "[", "]", "{", "}", ",", ".", ":", ";", "'", '"', "\\", "=", ":=", "not", "-", "~", "lambda",
             "for", "in", "if", "else", "x for x in", "yield", "await", "*", "**", "...", "1", "0", "-1", "1.5",
             "1e308", "1e999", "0x1f", "1j", "10**10**10", "9**99", "'a'", '"abc"', "b''", "f'{a}'", "True", "False",
             "None", "_x", "__class__", "__subclasses__", "#", "\n", "\t", " ", "\x00", "\u2028", "é"))

expr_leaves = st.one_of(
    st.sampled_from(NAMES), st.integers(-10**30, 10**30).map(str), st.floats(allow_nan=False).map(repr),
    st.text(max_size=5).map(repr), st.sampled_from(("True", "False", "None", "0", "1", "99", "100", "101",
                                                    "1e308", "-1")))
expr_trees = st.recursive(expr_leaves, lambda inner: st.one_of(
    st.tuples(inner, st.sampled_from(ATTRS)).map(lambda t: f"{t[0]}.{t[1]}"),
    st.tuples(inner, st.one_of(st.text(max_size=4).map(repr), st.integers(-3, 3).map(str),
                               st.sampled_from(("'²'", "'--5'", "'-1'", "'0'", "1.5", "a", "1:2")))
              ).map(lambda t: f"{t[0]}[{t[1]}]"),
    st.tuples(st.sampled_from(("-", "not ", "+", "~")), inner).map(lambda t: f"{t[0]}({t[1]})"),
    st.tuples(inner, st.sampled_from(BINOPS + CMPOPS), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
    st.tuples(st.sampled_from(FUNCS), st.lists(inner, max_size=4)).map(lambda t: f"{t[0]}({', '.join(t[1])})"),
    st.tuples(st.sampled_from(("log_contains", "log_count")), st.sampled_from(NAMES + ("1",)), st.text(max_size=5)
              ).map(lambda t: f"{t[0]}({t[1]}, {t[2]!r})"),
    st.lists(inner, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
    st.lists(inner, max_size=3).map(lambda xs: "(" + ", ".join(xs) + ",)"),
), max_leaves=15)

data_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(HUGE_INTS), HUGER_INTS, st.floats(),
                         st.text(max_size=20))
data = st.recursive(data_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(ATTRS), st.integers(-2, 2), st.text(max_size=3)), inner, max_size=5)),
    max_leaves=15)
namespaces = st.dictionaries(st.sampled_from(NAMES), data, max_size=5)


def _logs(kind: str):
    def logs(step: str):
        if kind == "raise":
            raise OSError(f"log of {step} is gone")
        if kind == "missing":
            raise KeyError(step)
        return None if kind == "none" else f"step {step}: Traceback\nok\n" * 3
    return logs


log_sources = st.sampled_from(("text", "none", "raise", "missing", None)).map(lambda k: None if k is None else
                                                                              _logs(k))


def expression_outcome(text: str, namespace=None, logs=None) -> EvalResult | str:
    """The EvalResult, or the ExpressionError message; anything else escaping fails the test."""
    COUNTS["expression"] += 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escape sequences in string literals warn while parsing
        try:
            expr = compile_expression(text)
        except ExpressionError as exc:
            one_line(str(exc))
            return str(exc)
    assert isinstance(expr, Expression)
    COUNTS["expression_ok"] += 1
    result = expr.evaluate(namespace or {}, logs)
    assert isinstance(result, EvalResult) and result.status in STATUSES
    assert isinstance(result.actual, str)
    if result.status == "error":
        assert result.value is None and isinstance(result.detail, str) and result.detail
    else:
        assert result.detail is None
        fmt_value(result.value)
    return result


@EXPR_FUZZ
@given(text=st.text(max_size=60), namespace=namespaces)
def test_expression_random_text(text, namespace):
    expression_outcome(text, namespace, _logs("text"))


@EXPR_FUZZ
@given(tokens=st.lists(st.sampled_from(TOKENS), max_size=30), sep=st.sampled_from(("", " ")), namespace=namespaces,
       logs=log_sources)
def test_expression_token_soup(tokens, sep, namespace, logs):
    expression_outcome(sep.join(tokens), namespace, logs)


@settings(EXPR_FUZZ, max_examples=400)
@given(text=expr_trees, namespace=namespaces, logs=log_sources)
@example(text="10**10**10", namespace={}, logs=None)
@example(text="((((9**99)**99)**99)**99) > 0", namespace={}, logs=None)
@example(text="round(5, -1000000000) == 0", namespace={}, logs=None)
@example(text='"a" * 1000000000', namespace={}, logs=None)
@example(text="x * 1000000000", namespace={"x": "a"}, logs=None)
@example(text="x == 1", namespace={"x": 10**5000}, logs=None)
@example(text='x["²"] or x["--5"]', namespace={"x": {}}, logs=None)
@example(text="x.a", namespace={"x": {"b": [[[[[[[[[[]]]]]]]]]]}}, logs=None)
def test_expression_random_trees(text, namespace, logs):
    expression_outcome(text, namespace, logs)


@EXPR_FUZZ
@given(depth=st.integers(1, 3000), opener=st.sampled_from(("(", "[", "-", "not ", "x.", "abs(", "-(", "1**", "x[0]")),
       x=st.sampled_from((1, -2.5, [[1]] * 3, {"0": [1]})))
@example(depth=10000, opener="-", x=1)
@example(depth=50, opener="**9", x=1)
def test_expression_deep_and_long(depth, opener, x):
    closer = {"(": ")", "[": "]", "abs(": ")", "-(": ")"}.get(opener, "")
    body = (opener * depth + "x" + closer * depth) if opener != "**9" else "1" + "**9" * depth
    if opener in ("x.", "1**", "x[0]"):
        body = "x" + opener[1:] * depth if opener != "1**" else "1" + "**1" * depth
    expression_outcome(body, {"x": x}, None)


# ---------------------------------------------------------------------------- expression regressions
def _evaluate(text: str, namespace=None) -> EvalResult:
    return compile_expression(text).evaluate(namespace or {})


def test_expression_nested_deeper_than_max_depth_is_rejected_at_compile_time():
    """'-' * 400 + 'x' compiled, evaluated, then crashed with RecursionError formatting the report's Actual."""
    with pytest.raises(ExpressionError, match="nested too deeply"):
        compile_expression("-" * 400 + "x")
    assert _evaluate("-" * (MAX_DEPTH // 2) + "x", {"x": 1}).status == "pass"


@pytest.mark.parametrize("text", ["(9**99)**99 > 1", "((((9**99)**99)**99)**99) > 1", "2**100 * 2**100 ** 1 > 0",
                                  "x + 1 > 0"])
def test_expression_integer_results_are_bounded(text):
    """(9**99)**99 once crashed formatting a 9306-digit int; each further **99 took 99x longer (a hang)."""
    start = time.perf_counter()
    result = _evaluate(text, {"x": 10**5000})
    assert time.perf_counter() - start < 1
    assert result.status in ("error", "pass")
    if result.status == "error":
        assert f"larger than {MAX_INT_BITS} bits" in result.detail


def test_expression_huge_int_in_data_is_shown_briefly():
    result = _evaluate("x == 1", {"x": 10**5000})
    assert result.status == "fail" and result.actual == "x = <integer of 16610 bits>"


def test_expression_round_digits_are_bounded():
    """round(5, -10**9) computed 10**(10**9)."""
    start = time.perf_counter()
    result = _evaluate("round(5, -1000000000) == 0")
    assert time.perf_counter() - start < 1
    assert result.status == "error" and "round() digits must be an integer from -100 to 100" in result.detail


@pytest.mark.parametrize("key", ["²", "--5", "1" * 200])
def test_expression_subscript_with_a_digit_like_key(key):
    """'²'.isdigit() is True, and int('--5') fails: both once escaped as ValueError."""
    result = _evaluate(f"x[{key!r}] > 0", {"x": {}})
    assert result.status == "error" and "no such key" in result.detail


def test_expression_deep_data_is_shown_briefly():
    deep: list = []
    for _ in range(2000):
        deep = [deep]
    # a list compared with a number is a type mismatch (an error, never a pass), its detail brief
    result = _evaluate("x == 1", {"x": deep})
    assert result.status == "error" and len(result.detail) < 300


# ============================================================================ 3. training.csv
HEADER = list(TRAINING_COLUMNS)
CELLS = ("", " ", "nan", "NaN", "inf", "-inf", "Infinity", "1e308", "-1e308", "1e999", "abc", "1,2", '"1"', '"',
         "1_000", "0x10", "１", "9" * 400, "1.5", "-0", "1e-320", "9223372036854775807", "9223372036854775808",
         "1e19", "-1e19", "18446744073709551616", "\x00", "é")
cells = st.one_of(st.sampled_from(CELLS), st.integers(-10**6, 10**6).map(str), st.floats().map(repr),
                  st.text(max_size=4))


# A well-formed row's values: a third of them values a reader must cope with, the others numbers, a few of them at the
# edges of their range. From one generator per file, seeded by hypothesis: drawing each of these cells through
# hypothesis took 80% of test_csv_random_files' time (94 of 114 s), for values no reader looks at one by one.
GOOD_SPECIALS = ("", "nan", "inf", "1e308", "-1.7e308")
GOOD_EDGES = (0.0, 1.0, 0.5, 1e6, 999999.9999999999, 5e-324, 2.2250738585072014e-308)


def good_cell(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 1 / 3:
        return rng.choice(GOOD_SPECIALS)
    return repr(rng.choice(GOOD_EDGES) if pick < 0.45 else rng.uniform(0, 1e6))


@st.composite
def csv_files(draw) -> bytes:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    header = list(HEADER)
    for _ in range(draw(st.sampled_from((0, 0, 0, 1, 2)))):
        op = draw(st.sampled_from(("drop", "extra", "mfu", "dup", "shuffle", "rename")))
        if op == "drop" and header:
            header.pop(draw(st.integers(0, len(header) - 1)))
        elif op == "extra":
            header.append(draw(st.sampled_from(("note", "gpu", "", "step "))))
        elif op == "mfu":
            header.append(MFU_COLUMN[0])
        elif op == "dup" and header:
            header.append(draw(st.sampled_from(header)))
        elif op == "shuffle":
            header = draw(st.permutations(header))
        elif op == "rename" and header:
            header[draw(st.integers(0, len(header) - 1))] = draw(st.text(max_size=5))
    lines = [",".join(header)]
    step = draw(st.integers(-3, 5))
    for _ in range(draw(st.integers(0, 30))):
        kind = draw(st.sampled_from(("good", "good", "good", "good", "cells", "short", "blank", "dup")))
        if kind == "good":
            step += draw(st.sampled_from((1, 1, 1, 0, -1, 10)))
            row = [str(step)] + [good_cell(rng) for _ in header[1:]]
        elif kind == "cells":
            row = [draw(cells) for _ in header]
        elif kind == "short":
            row = [draw(cells) for _ in range(draw(st.integers(0, len(header) + 2)))]
        elif kind == "blank":
            row = []
        else:
            lines.append(lines[-1])
            continue
        lines.append(",".join(row))
    newline = draw(st.sampled_from(("\n", "\r\n", "\r")))
    text = newline.join(lines) + (newline if draw(st.booleans()) else "")
    raw = text.encode("utf-8", errors="surrogatepass")
    if draw(st.booleans()):
        raw = raw[:draw(st.integers(0, len(raw)))]  # killed mid-write
    if draw(st.integers(0, 4)) == 0:
        raw = b"\xef\xbb\xbf" + raw
    return raw


windows = st.builds(Window, last=st.integers(1, 60), warmup=st.integers(0, 10))


def check_csv(path: Path, content: bytes, window: Window, world_size: int) -> dict:
    COUNTS["csv"] += 1
    path.write_bytes(content)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # not even a numpy overflow/cast warning: those values end up wrong
        read = read_training_csv(path)
        summary = summarize(read, window, world_size)
    assert isinstance(read, CsvRead)
    json.dumps(summary, allow_nan=False)
    assert summary["status"] in SUMMARY_STATUSES
    for column in ("toks_per_s", "loss"):
        values = window_values(read, column, window)
        assert all(isinstance(v, float) and math.isfinite(v) for v in values)
    if read.problem is None:
        COUNTS["csv_ok"] += 1
        assert read.frame["step"].is_monotonic_increasing and read.frame["step"].is_unique
    return summary


@settings(FUZZ, max_examples=650)
@given(content=csv_files(), window=windows, world_size=st.integers(1, 8))
def test_csv_random_files(work_dir, content, window, world_size):
    check_csv(work_dir / "training.csv", content, window, world_size)


@settings(FUZZ, max_examples=350)
@given(content=st.one_of(st.binary(max_size=400),
                         st.text(max_size=200).map(lambda t: t.encode("utf-8", errors="surrogatepass")),
                         st.lists(st.sampled_from(CELLS + (",", "\n", "\r\n", ",".join(HEADER) + "\n")),
                                  max_size=30).map(lambda xs: "".join(xs).encode())),
       window=windows, world_size=st.integers(1, 8))
@example(content=b"", window=Window(), world_size=1)
@example(content=(",".join(HEADER) + "\n").encode(), window=Window(), world_size=1)
def test_csv_random_bytes(work_dir, content, window, world_size):
    check_csv(work_dir / "training.csv", content, window, world_size)


# ---------------------------------------------------------------------------- csv regressions
def _csv(tmp_path: Path, *rows: str, prefix: bytes = b"") -> Path:
    path = tmp_path / "training.csv"
    path.write_bytes(prefix + ("\n".join((",".join(HEADER),) + rows) + "\n").encode())
    return path


def test_csv_loss_drop_overflow_is_none(tmp_path):
    """first_loss 1e308 and final_loss -1e308 once gave loss_drop = inf, which strict JSON refuses."""
    path = _csv(tmp_path, "1,1e308,0,1,1,1,1,1", "2,-1e308,0,1,1,1,1,1")
    summary = summarize(read_training_csv(path), Window(5), 1)
    assert summary["first_loss"] == 1e308 and summary["loss_drop"] is None
    json.dumps(summary, allow_nan=False)


def test_csv_step_beyond_int64_is_dropped(tmp_path):
    """step 1e19 once became -9223372036854775808 (a silent int64 overflow)."""
    read = read_training_csv(_csv(tmp_path, "1,1,0,1,1,1,1,1", "1e19,1,0,1,1,1,1,1", "3,1,0,1,1,1,1,1"))
    assert read.frame["step"].tolist() == [1, 3] and read.dropped_rows == 1


def test_csv_with_byte_order_mark(tmp_path):
    """A BOM (a spreadsheet's export) once made the first column '\\ufeffstep': "missing columns: step"."""
    read = read_training_csv(_csv(tmp_path, "1,1,0,1,1,1,1,1", prefix=b"\xef\xbb\xbf"))
    assert read.problem is None and read.frame["step"].tolist() == [1]


# ============================================================================ 4. paths: nothing outside the run root
# What a runbook value may hold that a path must not: separators, `..`, `.`, hidden and absolute names, NUL, a
# Windows separator, look-alikes of dots; plus random text. Plausible names keep most examples loading.
PATH_TEXTS = ("..", ".", "../x", "../../escaped", "/tmp/x", "/", "a/b", "a/../../b", ".hidden", "~", "-x", "", " ",
              "x\x00y", "a\\..\\b", "...", "%2e%2e", "\u2024\u2024", "x" * 300)
path_texts = st.one_of(st.sampled_from(PATH_TEXTS), st.text(max_size=12))


def mostly(plausible: tuple, anything=path_texts):
    """A plausible name four times in five (so most runbooks load and their launches are made), else any text."""
    return st.integers(0, 4).flatmap(lambda i: anything if i == 4 else st.sampled_from(plausible))


path_names = mostly(("s1", "s2", "sw", "ab1", "_x", "p"))
runbook_names = mostly(("paths", "ddp-2xa100", "v1.2", "_x"))
one_change = st.just({"env": {"SOME_VAR": "1"}})
path_steps = st.one_of(
    st.fixed_dictionaries({"name": path_names, "kind": st.just("sweep"),
                           "matrix": st.dictionaries(st.one_of(st.sampled_from(("env.SWEPT", "args.dataset")),
                                                               path_texts.map("env.{}".format)),
                                                     st.lists(path_texts, min_size=1, max_size=3, unique=True),
                                                     min_size=1, max_size=2)}),
    st.fixed_dictionaries({"name": path_names, "kind": st.just("ab"),
                           "variants": st.dictionaries(path_names, one_change, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"name": path_names, "kind": st.just("triage"),
                           "suspects": st.dictionaries(path_names, one_change, min_size=1, max_size=2)}),
    st.fixed_dictionaries({"name": path_names, "kind": st.just("pytest"), "isolate": st.sampled_from(("file", "none")),
                           # "::t": a node id, never a directory to search for test files
                           "tests": st.lists(path_texts.map("{}::t".format), min_size=1, max_size=3)}),
    st.fixed_dictionaries({"name": path_names, "kind": st.sampled_from(("train", "profile", "longrun"))}),
)
path_runbooks = st.fixed_dictionaries({
    "name": runbook_names,
    "defaults": st.just({"config": "configs/tiny_cpu.yaml", "args": {"steps": 3}}),
    "phases": st.lists(st.fixed_dictionaries({"name": path_names, "steps": st.lists(path_steps, min_size=1,
                                                                                      max_size=3)}),
                       min_size=1, max_size=2)})
path_overrides = mostly(([],), path_texts.map(lambda text: [f"name={text}"]))  # now and then a --set name=...


def tree(root: Path) -> set[str]:
    """Every path under `root`, recursively (links not followed), relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def write_inside(run_dir: Path, path: Path | str, directory: bool = False) -> None:
    """Make `path` as a run would, once it is known to lie inside `run_dir` (so a failure writes nothing outside).
    A name too long for the file system is refused there, as a run's "cannot write" (exit 2) would be."""
    path = Path(path)
    assert run_dir.resolve() in path.resolve().parents, (run_dir, path)
    try:
        if directory:
            path.mkdir(parents=True, exist_ok=True)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.touch()
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise


@settings(FUZZ, max_examples=300)
@given(doc=path_runbooks, overrides=path_overrides)
@example(doc={"name": "../../escaped", "phases": [{"name": "p", "steps": [{"name": "s1", "kind": "train"}]}]},
         overrides=[])
@example(doc={"name": "ok", "defaults": {"config": "configs/tiny_cpu.yaml"}, "phases": [{"name": "p", "steps": [
    {"name": "sw", "kind": "sweep", "matrix": {"env.SWEPT": ["..", "../../x", "/tmp/x", ".hidden"]}},
    {"name": "t1", "kind": "pytest", "isolate": "file", "tests": ["..::t", ".::t", "/etc/x.py::t"]}]}]},
    overrides=[])
@example(doc={"name": "paths", "defaults": {"config": "configs/tiny_cpu.yaml"}, "phases": [
    {"name": "A", "steps": [{"name": "x" * 300, "kind": "train"}]}]},
    overrides=[])  # found by a run: a 300-character step name raised "File name too long" (now refused, exit 2)
@example(doc={"name": "paths", "defaults": {"config": "configs/tiny_cpu.yaml"}, "phases": [{"name": "A", "steps": [
    {"name": "y" * 100, "kind": "sweep", "matrix": {"env.SWEPT": ["..", "v" * 300, "v" * 299 + "w"]}}]}]},
    overrides=[])  # the longest step name, and matrix values that make names longer than a file system takes
def test_runbook_values_write_nothing_outside_the_run_root(work_dir, doc, overrides):
    """Load the runbook (plan and run read it so), then make what a run makes from it: the run directory under the
    runs directory (default_run_dir), each launch's directory, trainer output directory, log and every file its
    command line names under the run directory, and each step's plot. Nothing may appear outside the run
    directory, and nothing at all when the runbook is refused."""
    COUNTS["paths"] += 1
    outer = work_dir / "paths" / f"example{COUNTS['paths']}"  # the parent of the run root, snapshot before and after
    runs = outer / "runs"  # the run root of the runbook's own name (DEFAULT_RUNS)
    runs.mkdir(parents=True)
    path = work_dir / "paths.yaml"
    path.write_text(dump(doc), encoding="utf-8")
    before = tree(outer)
    try:
        rb = load_runbook(path, overrides)
    except RunbookError as exc:
        one_line(str(exc))
        assert tree(outer) == before
        return
    COUNTS["paths_ok"] += 1
    run_dir = default_run_dir(rb.name, runs)  # a valid runbook's name always gives one directory in runs/
    assert run_dir.parent == runs
    write_inside(runs, run_dir, directory=True)
    for step in rb.steps():
        specs = step_launches(step, None, run_dir)  # each path checked as it is made (inside_run_dir): none refused
        write_inside(run_dir, inside_run_dir(run_dir, step.name), directory=True)
        for spec in specs:
            write_inside(run_dir, spec.step_dir, directory=True)
            write_inside(run_dir, Path(spec.step_dir) / LOG_NAME)
            if spec.trainer_out_dir is not None:
                write_inside(run_dir, spec.trainer_out_dir, directory=True)
            for arg in spec.argv:
                if arg.startswith(f"{run_dir}/"):
                    write_inside(run_dir, arg)
        write_inside(run_dir, inside_run_dir(run_dir, f"plots/{step.kind}_{file_name(step.name)}.png"))
    made = tree(outer) - before
    prefix = str(run_dir.relative_to(outer))
    assert made and all(p == prefix or p.startswith(f"{prefix}/") for p in made), sorted(made)

