"""Property-based fuzzing of the run-config loader: every input either loads or is one ConfigError line.

    nsa.training.config.load_config(path)     -> a RunConfig or ConfigError ("FILE: ...", one line)
    nsa.training.config.config_from_dict(raw) -> a RunConfig or ConfigError ("<config>: ...", one line)

Inputs: mutations of the shipped configs/*.yaml (structure and text), random documents shaped like the three
sections, random Python values, random bytes and YAML syntax soup. Derandomized and without an example database
(deterministic, writes nothing); the number of examples tried is printed at the end of the module (visible with
-s) and merged into the JSON file named by NSA_FUZZ_COUNTS_OUT when that variable is set.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st

from fuzz_support import entries as doc_entries, report_counts  # tests/fuzz_support.py
from nsa.training.config import DATASETS, DataConfig
from nsa.model import ModelConfig
from nsa.training.config import DEVICES, LR_SCHEDULES, PARALLEL, PRECISIONS, ConfigError, RunConfig, TrainConfig, \
    config_from_dict, load_config

REPO = Path(__file__).resolve().parents[3]
CONFIG_TEXTS = {p.name: p.read_text(encoding="utf-8") for p in sorted((REPO / "configs").glob("*.yaml"))}
CONFIG_DOCS = {name: yaml.safe_load(text) for name, text in CONFIG_TEXTS.items()}
SECTIONS = {"model": ModelConfig, "train": TrainConfig, "data": DataConfig}

COUNTS: collections.Counter[str] = collections.Counter()  # examples tried per parser ("<parser>_ok": loaded)
FUZZ = settings(derandomize=True, database=None, deadline=None, max_examples=250)


pytestmark = pytest.mark.reliability  # the generated-inputs figure


@pytest.fixture(scope="module", autouse=True)
def _report_counts(reliability):
    yield
    report_counts(COUNTS, reliability, Path(__file__).name)


@pytest.fixture(scope="module")
def work_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz_config")


# ---------------------------------------------------------------------------- strategies
FIELD_NAMES = tuple(f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls))
WORDS = PRECISIONS + PARALLEL + LR_SCHEDULES + DEVICES + DATASETS + ("mlp", "avg", "sigmoid", "softmax", "2e-4",
                                                                      "1e999", "nan", "-inf", "", " ", "2020-13-45")
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(), st.text(max_size=10),
                    st.sampled_from(WORDS + (2**63, 10**400, -(10**400))), st.binary(max_size=3))
keys = st.one_of(st.sampled_from(tuple(SECTIONS) + FIELD_NAMES), st.text(max_size=8), st.integers(-2, 2),
                 st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=5)), max_leaves=12)


def plausible(hint) -> st.SearchStrategy:
    """Values near what a field takes: small and edge integers, numbers as numbers or strings, the choices."""
    return st.one_of(st.integers(-2, 4096), st.sampled_from((0, 1, 2, 3, 16, 32, 64, -1, 2**63)),
                     st.floats(-1e3, 1e3), st.sampled_from((0.0, float("nan"), float("inf"), 1e308)),
                     st.sampled_from(WORDS), st.none(), st.booleans(), st.just(str(hint)))


sections = {name: st.dictionaries(st.sampled_from(tuple(f.name for f in dataclasses.fields(cls)) + ("bogus",)),
                                  st.one_of(plausible(name), plausible(name), values), max_size=20)
            for name, cls in SECTIONS.items()}
documents = st.fixed_dictionaries({}, optional={name: st.one_of(s, s, s, values) for name, s in sections.items()}
                                  | {"extra": values})




@st.composite
def mutated_configs(draw):
    """A shipped config with 1 to 4 mutations: delete, replace (near or far), rename, insert, wrap."""
    doc = copy.deepcopy(CONFIG_DOCS[draw(st.sampled_from(sorted(CONFIG_DOCS)))])
    for _ in range(draw(st.integers(1, 4))):
        entries = doc_entries(doc)
        if not entries:
            break
        parent, key = draw(st.sampled_from(entries))
        op = draw(st.sampled_from(("delete", "near", "replace", "rename", "insert", "wrap")))
        if op == "delete":
            del parent[key]
        elif op == "near":
            parent[key] = draw(plausible(key))
        elif op == "replace":
            parent[key] = draw(values)
        elif op == "wrap":
            parent[key] = draw(st.sampled_from(([parent[key]], {"x": parent[key]})))
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(keys)] = parent.pop(key)
        elif isinstance(parent, dict):
            parent[draw(keys)] = draw(values)
    return doc


YAML_SNIPPETS = ("2020-13-45", "!!int ''", "!!float x", "!!bool maybe", "!!timestamp abc", "!!binary ~~~",
                 "!!omap [{[a]: b}]", "&a [*a]", "*undefined", "{<<: 5}", "1" * 5000, "1" + "0" * 400, "[" * 800,
                 "{a: 1, a: 2}", "? [a]\n: b", ".nan", ".inf", "~", "'", "\t", "\x00", "|\n x", "a: b: c", "[a, b")


@st.composite
def text_mutated_configs(draw):
    lines = CONFIG_TEXTS[draw(st.sampled_from(sorted(CONFIG_TEXTS)))].splitlines(keepends=True)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(("delete", "duplicate", "cut", "indent", "snippet", "junk")))
        if op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, lines[i])
        elif op == "cut":
            lines[i] = lines[i][:draw(st.integers(0, len(lines[i])))]
        elif op == "indent":
            lines[i] = draw(st.sampled_from(("", " ", "\t", "    "))) + lines[i].lstrip(" ")
        elif op == "snippet":
            head = lines[i][:lines[i].index(":") + 1] if ":" in lines[i] else "key:"
            lines[i] = f"{head} {draw(st.sampled_from(YAML_SNIPPETS))}\n"
        else:
            pos = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:pos] + draw(st.text(max_size=6)) + lines[i][pos:]
        if not lines:
            lines = [""]
    return "".join(lines)


# ---------------------------------------------------------------------------- checks
def outcome(call, where: str):
    """The RunConfig, or the ConfigError message (one line, naming `where`); anything else fails the test."""
    COUNTS["config"] += 1
    try:
        cfg = call()
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(f"{where}: ") and "\n" not in message and "\r" not in message, message
        return message
    assert isinstance(cfg, RunConfig)
    COUNTS["config_ok"] += 1
    json.dumps(cfg.to_dict())
    return cfg


def load_text(work_dir: Path, content: str | bytes):
    path = work_dir / "run.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8", errors="surrogatepass"))
    return outcome(lambda: load_config(path), str(path))


def dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)


@FUZZ
@given(doc=mutated_configs())
def test_config_structural_mutations(work_dir, doc):
    load_text(work_dir, dump(doc))


@FUZZ
@given(text=text_mutated_configs())
def test_config_text_mutations(work_dir, text):
    load_text(work_dir, text)


@FUZZ
@given(doc=st.one_of(documents, values))
def test_config_random_documents(work_dir, doc):
    load_text(work_dir, dump(doc))


@settings(FUZZ, max_examples=150)
@given(content=st.one_of(st.binary(max_size=300),
                         st.lists(st.one_of(st.sampled_from(YAML_SNIPPETS + tuple(SECTIONS) + FIELD_NAMES),
                                            st.sampled_from(list("[]{}:-&*!|>'\"#,? \n\t")), st.text(max_size=4)),
                                  max_size=25).map("".join)))
@example(content=b"\xff\xfe")
@example(content="model: {vocab_size: 2020-13-45}\n")
def test_config_bytes_and_yaml_soup(work_dir, content):
    load_text(work_dir, content)


@settings(FUZZ, max_examples=150)
@given(raw=st.one_of(documents, values, mutated_configs()))
@example(raw={"model": {**CONFIG_DOCS["tiny_cpu.yaml"]["model"], "rope_theta": 10**400}})
@example(raw={"model": {**CONFIG_DOCS["tiny_cpu.yaml"]["model"], "dim": [list(range(100))] * 100}})
def test_config_from_random_dicts(raw):
    outcome(lambda: config_from_dict(raw), "<config>")


# ---------------------------------------------------------------------------- regressions
TINY_MODEL = CONFIG_DOCS["tiny_cpu.yaml"]["model"]


@pytest.mark.parametrize("text", [
    "model: {vocab_size: 2020-13-45}\n",      # ValueError from the timestamp constructor
    "model: {vocab_size: !!int ''}\n",        # IndexError
    "model: {tie_embeddings: !!bool maybe}\n",  # KeyError
    "model: !!timestamp abc\n",               # AttributeError
    "[" * 600,                                # RecursionError in the composer
], ids=["date", "int", "bool", "timestamp", "deep"])
def test_config_yaml_constructor_errors_are_config_errors(tmp_path, text):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r": not valid YAML \(.+\)$") as info:
        load_config(path)
    assert str(info.value).startswith(f"{path}: ")


def test_config_number_too_large_for_a_float(tmp_path):
    """An integer past float range in a float field once escaped as OverflowError."""
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"model": TINY_MODEL, "train": {"lr": 10**400}}))
    with pytest.raises(ConfigError, match=r": 'train.lr' is too large for a number \(about 2\*\*1329\)$"):
        load_config(path)


def test_config_huge_value_in_an_error_message_is_bounded():
    with pytest.raises(ConfigError, match=r"^<config>: 'model.dim' must be an integer, got \[\[") as info:
        config_from_dict({"model": {**TINY_MODEL, "dim": [list(range(1000))] * 1000}})
    assert len(str(info.value)) < 200
