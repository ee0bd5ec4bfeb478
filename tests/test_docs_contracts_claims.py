"""What docs/architecture.md and docs/scaling.md state about the code, checked against the code: the StepKind hooks the
data-flow picture calls, the imports between the kernels' op modules, the sbatch lines the Slurm launcher refuses or
passes, the refusal of a time limit YAML reads as a number, and which requirements a snapshot step under Slurm is
checked against."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ARCHITECTURE = REPO / "docs" / "architecture.md"
SCALING = REPO / "docs" / "scaling.md"
KERNELS = REPO / "nsa" / "attention" / "kernels"


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    start = text.index(heading)
    end = text.find("\n#", start + len(heading))
    return text[start:] if end < 0 else text[start:end]


def _paragraph(text: str, needle: str) -> str:
    """The blank-line separated paragraph (or list item) of `text` holding `needle`, joined on one line."""
    at = text.index(needle)
    start = max(text.rfind("\n\n", 0, at), text.rfind("\n- ", 0, at))
    end = min(i for i in (text.find("\n\n", at), text.find("\n- ", at), len(text)) if i >= 0)
    return " ".join(text[start:end].split())


# ---------------------------------------------------------------------------------------------------------------
# docs/architecture.md


def test_the_step_kind_hooks_the_data_flow_picture_calls_take_the_arguments_it_gives():
    from validation.kinds.base import StepKind

    picture = _section(_text(ARCHITECTURE), "## Data flow")
    calls = re.findall(r"StepKind\.(\w+)\(([^)]*)\)", picture)
    assert calls, "the data-flow picture names no StepKind call"
    for hook, args in calls:
        given = [a for a in (x.strip() for x in args.split(",")) if a]
        params = [p for p in inspect.signature(getattr(StepKind, hook)).parameters if p != "self"]
        assert len(given) == len(params), (f"docs/architecture.md: StepKind.{hook}({args}), the hook takes "
                                           f"({', '.join(params)})")


def _kernel_imports(path: Path) -> set[str]:
    """The nsa modules `path` imports (from a.b import c: a.b.c when that is a module of the tree, else a.b)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("nsa"):
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                as_file = REPO / (full.replace(".", "/") + ".py")
                out.add(full if as_file.exists() else node.module)
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("nsa")}
    return out


def test_the_kernels_paragraph_names_what_each_op_module_imports_outside_its_own_package():
    """An op's host.py or naive.py that imports another op's module, or a module outside the kernels' and attention
    parts' shared ones, is named in "Inside the kernels layer"."""
    paragraph = " ".join(_section(_text(ARCHITECTURE), "### Inside the kernels layer").split())
    unnamed = []
    for path in sorted(KERNELS.glob("*/host.py")) + sorted(KERNELS.glob("*/naive.py")):
        op = path.parent.name
        for module in sorted(_kernel_imports(path)):
            parts = module.split(".")
            if parts[:3] == ["nsa", "attention", "kernels"] and len(parts) == 5 and parts[3] != op:
                named = f"{parts[3]}/{parts[4]}.py"  # another op's module
            elif parts[0] == "nsa" and parts[1] not in ("attention", "config", "toggles"):
                named = module  # beyond the attention parts and the configuration below the kernels
            else:
                continue
            if named not in paragraph:
                unnamed.append(f"{op}/{path.name} imports {module}")
    assert not unnamed, f"docs/architecture.md, 'Inside the kernels layer', does not say: {unnamed}"


# ---------------------------------------------------------------------------------------------------------------
# docs/scaling.md

# sbatch options that put GPUs in a job or bind tasks to them, and those that only size or tune what it has (Slurm's
# sbatch manual), each with a value
GPU_LINES = ("--gpus=2", "--gpus-per-node=2", "--gpus-per-task=1", "--gpus-per-socket=1", "--ntasks-per-gpu=1",
             "--ntasks-per-tres=1", "--gres=gpu:2", "--tres-per-task=gres/gpu=1", "--gpu-bind=closest",
             "--tres-bind=gres/gpu:closest", "--cpus-per-gpu=4", "--mem-per-gpu=10G", "--gpu-freq=high",
             "--gres-flags=enforce-binding")


def test_every_gpu_sbatch_line_the_launcher_refuses_is_named_in_the_refused_list_and_no_passing_one_is():
    from validation.launch.sbatch import validate_sbatch_line

    item = _paragraph(_text(SCALING), "`--kill-on-bad-exit=1`")
    refused_part, _, passing_part = item.partition("other GRES")
    assert passing_part, "docs/scaling.md: the list of extra sbatch lines that pass is gone"
    wrong = []
    for line in GPU_LINES:
        option = line.split("=", 1)[0]
        mentioned = re.compile(rf"`{re.escape(option)}(?![\w-])")
        refused = validate_sbatch_line(line) is not None
        if refused and not mentioned.search(refused_part):
            wrong.append(f"{line} is refused but not named among the refused lines")
        if not refused and mentioned.search(refused_part) and not mentioned.search(passing_part):
            wrong.append(f"{line} passes but is named among the refused lines only")
    assert not wrong, "docs/scaling.md: " + "; ".join(wrong)


def _slurm_runbook(tmp_path: Path, launcher: str, step: str, requirements: str = "") -> Path:
    path = tmp_path / "slurm.yaml"
    path.write_text(f"name: t\n{requirements}defaults:\n  config: configs/tiny_cpu.yaml\n  launcher: {launcher}\n"
                    f"phases:\n  - name: p\n    steps:\n{step}", encoding="utf-8")
    return path


def test_a_time_limit_yaml_reads_as_a_number_is_refused_as_the_scaling_page_says(tmp_path):
    from validation.runbook.loader import load_runbook

    train = "      - {name: tr, kind: train, args: {steps: 2}}\n"
    for limit in ("1:30:00", "30"):
        path = _slurm_runbook(tmp_path, f"{{type: slurm, time_limit: {limit}}}", train)
        with pytest.raises(ValueError, match="time_limit: quote it"):
            load_runbook(path)
    quoted = load_runbook(_slurm_runbook(tmp_path, '{type: slurm, time_limit: "1:30:00"}', train))
    assert quoted.phases[0].steps[0].launch.launcher.time_limit == "1:30:00"
    claim = _paragraph(_text(SCALING), "sexagesimal")
    assert "refused" in claim and "which becomes `--time=5400`" not in claim, (
        f"docs/scaling.md says of an unquoted time limit: {claim}")


def test_a_snapshot_step_under_slurm_is_checked_against_its_own_requires_and_the_jobs_gpus(tmp_path, monkeypatch):
    """Host-only: the runbook's requirements do not apply; under Slurm its own `requires` meets gpus_per_node, and the
    submitting machine's GPUs are never looked at."""
    from validation.launch import environment, slurm
    from validation.runbook.loader import load_runbook

    monkeypatch.setattr(slurm, "available", lambda: True)

    def no_machine():
        raise AssertionError("the submitting machine's record was read for a Slurm step")

    steps = "      - {name: snap, kind: snapshot}\n      - {name: tr, kind: train, args: {steps: 2}}\n"
    book = load_runbook(_slurm_runbook(tmp_path, "{type: slurm, gpus_per_node: 0}", steps,
                                       requirements="requirements: {gpus: 4, backend: nccl}\n"))
    snap, train = book.phases[0].steps
    assert snap.requires.gpus == 0 and train.requires.gpus == 4
    assert environment.unmet_for(snap, no_machine) is None
    assert "gpus_per_node=0" in environment.unmet_for(train, no_machine)
    own = "      - {name: snap, kind: snapshot, requires: {gpus: 2}}\n"
    snap = load_runbook(_slurm_runbook(tmp_path, "{type: slurm, gpus_per_node: 2}", own)
                        ).phases[0].steps[0]
    assert environment.unmet_for(snap, no_machine) is None
    claim = _paragraph(_text(SCALING), "GPU requirements of a Slurm step")
    assert "step is checked against the submitting machine" not in claim and "host-only" in claim, (
        f"docs/scaling.md says of the snapshot step's requirements: {claim}")
