"""Figures README.md states about what its own commands and committed runs show, checked against those runs and
runbooks: the parallelism example's predicted and ranks-aligned collective times, cpu_smoke's prefill A/B (its
repeats and its effect, as reports/examples/cpu_smoke measured it) and sweep repeats, and the trainer's flag list
beside the parser `nsa-train --help` prints. Each reads files only (no subprocess)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from nsa.training.flags import build_parser

REPO = Path(__file__).resolve().parents[1]
WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine ten".split())}


def _prose() -> str:
    """README.md with every run of whitespace one space, so that a sentence can be matched across its line breaks."""
    return " ".join((REPO / "README.md").read_text(encoding="utf-8").split())


def _results(name: str) -> dict:
    return json.loads((REPO / "reports" / "examples" / name / "results.json").read_text(encoding="utf-8"))


def _step(runbook: str, name: str) -> dict:
    data = yaml.safe_load((REPO / "runbooks" / runbook).read_text(encoding="utf-8"))
    steps = [s for phase in data["phases"] for s in phase.get("steps", []) if s.get("name") == name]
    assert len(steps) == 1, (runbook, name, steps)
    return steps[0]


def test_the_parallelism_example_comm_times_quoted_in_the_readme_are_the_examples():
    m = re.search(r"predicted/aligned was ([\d.]+)/([\d.]+) ms DDP, ([\d.]+)/([\d.]+) ms FSDP, ([\d.]+)/([\d.]+) ms "
                  r"no-reshard per step on the 2-core CPU of \[reports/examples/parallelism_cpu/\]", _prose())
    assert m, "README.md no longer quotes the parallelism example's predicted/aligned collective times"
    quoted = [float(x) for x in m.groups()]
    strategies = _results("parallelism_cpu")["steps"]["parallelism"]["metrics"]["strategies"]
    measured = []
    for name in ("ddp", "fsdp", "fsdp_no_reshard"):
        measured += [strategies[name]["comm_predicted_s"] * 1e3, strategies[name]["aligned_comm_s"] * 1e3]
    # each quoted to 0.1 ms: within half of that of the example's own figure
    for q, v in zip(quoted, measured):
        assert abs(q - v) <= 0.05 + 1e-9, (quoted, [round(x, 2) for x in measured])


def test_the_readme_states_cpu_smoke_prefill_ab_and_sweep_repeats_as_the_runbook_runs_them():
    prose = _prose()
    m = re.search(r"cpu_smoke's prefill A/B \((\w+) interleaved repeats, batched prefill about (\d+)x faster on CPU",
                  prose)
    assert m, "README.md no longer states cpu_smoke's prefill A/B repeats and effect"
    repeats, ratio = WORDS[m.group(1)], int(m.group(2))
    assert repeats == _step("cpu_smoke.yaml", "prefill")["repeats"]
    # "about N x": the committed example's batched/sequential tokens/s, 1 + its relative effect, within 1 of N
    decision = _results("cpu_smoke")["steps"]["prefill"]["decision"]["comparison"]
    assert decision["variant"] == "batched" and decision["baseline"] == "baseline"
    assert abs(ratio - (1 + decision["rel"])) < 1, (ratio, 1 + decision["rel"])
    sweep = re.search(r"its sweep \((\d+) repeats\) honestly ends", prose)
    assert sweep, "README.md no longer states cpu_smoke's sweep repeats"
    assert int(sweep.group(1)) == _step("cpu_smoke.yaml", "bucket_sweep")["repeats"]


def test_the_readme_flag_list_is_the_flags_nsa_train_takes():
    m = re.search(r"\*\*Flags\*\* \(`nsa-train --help`; an unknown flag is an error\): (.*?)\. Each is declared",
                  _prose())
    assert m, "README.md no longer lists nsa-train's flags"
    listed = re.findall(r"`(--[a-z-]+)", m.group(1))
    assert len(listed) == len(set(listed)), listed
    parser_flags = {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")} - {"--help"}
    assert set(listed) == parser_flags, (sorted(set(listed) - parser_flags), sorted(parser_flags - set(listed)))


def _layout() -> list[tuple[str, str]]:
    """README.md's Layout block as (folder, its description) pairs: a folder at the margin (nsa/, validation/, ...) or
    two spaces in (nsa/attention/, validation/report/, ...), with its continuation lines joined."""
    text = (REPO / "README.md").read_text(encoding="utf-8").split("## Layout", 1)[1]
    block = text.split("```", 2)[1].split("\n", 1)[1]
    entries: list[list[str]] = []
    top = ""
    for line in block.splitlines():
        m = re.match(r"^( {0,2})(\S+/)\s+(.*)$", line)
        if m and not line.startswith(" " * 3):
            top = m.group(2) if not m.group(1) else top
            entries.append([m.group(2) if not m.group(1) else top + m.group(2), m.group(3)])
        elif entries:
            entries[-1][1] += " " + line.strip()
    return [(folder, desc) for folder, desc in entries]


def _names(description: str) -> list[str]:
    """The bare module names a description lists: its parenthesised remarks dropped, the rest split at commas,
    semicolons, colons, `+` and "and"."""
    while re.search(r"\([^()]*\)", description):
        description = re.sub(r"\([^()]*\)", "", description)
    chunks = re.split(r"[,;:+]| and ", description)
    return [c.strip() for c in chunks if re.fullmatch(r"[a-z][a-z0-9_]*/?", c.strip())]


def test_every_module_the_readme_layout_places_in_a_folder_is_there():
    missing = []
    checked = 0
    for folder, description in _layout():
        if not folder.startswith(("nsa/", "validation/")):
            continue
        for name in _names(description):
            checked += 1
            base = REPO / folder / name.rstrip("/")
            if not (base.with_suffix(".py").is_file() or (base.is_dir() and (base / "__init__.py").is_file())):
                missing.append(f"{folder}{name}")
    assert checked > 60, checked  # the parser still reads the block
    assert not missing, missing


def test_the_readme_layout_lists_every_runbook():
    (description,) = [d for folder, d in _layout() if folder == "runbooks/"]
    listed = set(_names(description.split(":", 1)[1]))
    assert listed == {p.stem for p in (REPO / "runbooks").glob("*.yaml")}
