"""Everything a runbook says that can be checked is checked before anything runs (`plan` and `run`, exit 2, the
message naming the key): NSA_* environment names and values against the typed table (nsa.toggles), acceptance
expressions against the metric names each step's kind declares (StepKind.metrics), and ${step.winner...}
references against the steps. Each check has a failing and a passing case, through the library and the CLI."""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from nsa import toggles
from validation import kinds
from validation.execution.acceptance import _namespace
from validation.cli import app
from validation.runbook.expressions import compile_expression
from validation.runbook.loader import RunbookError, load_runbook
from validation.kinds.base import STEP_FIELDS, metric_declared, readable_names

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = sorted((REPO / "runbooks").glob("*.yaml"))
EXAMPLES = sorted((REPO / "reports" / "examples").glob("*/results.json"))
CPU_SMOKE = REPO / "runbooks" / "cpu_smoke.yaml"


@pytest.fixture
def in_repo(monkeypatch):
    monkeypatch.chdir(REPO)  # plan checks the files a runbook names relative to the working directory


def cli(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.output


def edited(tmp_path: Path, edit, source: Path = CPU_SMOKE) -> Path:
    """A copy of a runbook with `edit(raw)` applied (configs and files still resolve from the repository)."""
    raw = yaml.safe_load(source.read_text())
    edit(raw)
    path = tmp_path / "edited.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def step_of(raw: dict, name: str) -> dict:
    return next(s for p in raw["phases"] for s in p["steps"] if s["name"] == name)


def one_error(output: str) -> str:
    lines = [line for line in output.splitlines() if line.startswith("nsa-validate: error:")]
    assert len(lines) == 1 and "Traceback" not in output, output
    return lines[0]


# ---------------------------------------------------------------------- the runbooks we ship
@pytest.mark.parametrize("path", RUNBOOKS, ids=lambda p: p.name)
def test_every_runbook_passes_every_check(path):
    rb = load_runbook(path)
    assert rb.steps() and all(c.expr.paths or c.expr.log_names for c in rb.acceptance)


def test_plan_of_the_default_runbook_exits_0(in_repo):
    code, output = cli("plan", CPU_SMOKE, "--set", "defaults.env.NCCL_DEBUG=INFO", "--set",
                       "defaults.env.TORCH_SHOW_CPP_STACKTRACES=1")
    assert code == 0 and "NCCL_DEBUG" in output, output  # other variables pass through, unchecked


# ---------------------------------------------------------------------- 1. environment variables
def string_literals(text: str) -> list[str]:
    """The values of the plain string literals of a Python source (not the text inside docstrings' examples)."""
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and re.fullmatch(r"[\"'][A-Z0-9_]+[\"']", tok.string):
            out.append(tok.string[1:-1])
    return out


def test_the_toggle_table_lists_every_nsa_variable_the_code_reads():
    read = re.compile(r"(?:environ\.get|environ\[|getenv)\(?\s*[\"'](NSA_[A-Z0-9_]+)")
    found: dict[str, str] = {}
    for folder in ("nsa", "validation", "benchmarks", "tests"):
        for file in (REPO / folder).rglob("*.py"):
            text = file.read_text(encoding="utf-8")
            # in the library and tools every "NSA_..." literal is a variable (read, set for a child, listed);
            # tests also name made-up ones as data: there only what is read from the environment counts
            names = ([n for n in string_literals(text) if n.startswith("NSA_") and n != "NSA_"] if folder != "tests"
                     else read.findall(text))
            for name in names:
                found.setdefault(name, str(file.relative_to(REPO)))
    missing = {n: f for n, f in found.items() if n not in toggles.TOGGLES}
    assert not missing, f"NSA_* variables read but not in nsa/toggles.py: {missing}"
    assert {"NSA_NODE_NAME", "NSA_AOT_FULL"} <= set(found)


@pytest.mark.parametrize("name, value, needle", [
    ("NSA_PREFIL_BATCHED", "1", "did you mean NSA_PREFILL_BATCHED?"),
    ("NSA_DDP_BUCKET_MB", "[1,2", "NSA_DDP_BUCKET_MB='[1,2' is invalid: expected a positive integer"),
    # accepted before, then a TypeError from DDP's constructor in every rank
    ("NSA_DDP_BUCKET_MB", "9" * 23, "expected a positive integer (at most 1,048,576)"),
    ("NSA_DDP_COMPRESS", "bf17", "expected none | bf16 | fp16"),
    ("NSA_AOT_FULL", "yes please", "expected 0 or 1"),
    ("NSA_FAULT", "crash@", "NSA_FAULT='crash@' is invalid"),
    ("NSA_NOT_A_THING", "1", "not a known NSA_* variable"),
])
def test_toggle_check_names_the_variable_and_what_it_takes(name, value, needle):
    assert needle in (toggles.check(name, value) or "")


@pytest.mark.parametrize("name, value", [("NSA_DDP_BUCKET_MB", "50"), ("NSA_NODE_NAME", "node0"),
                                         ("NSA_PREFILL_BATCHED", ""), ("NCCL_DEBUG", "INFO"),
                                         ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"), ("NSAX", "1")])
def test_toggle_check_passes_good_values_and_other_variables(name, value):
    assert toggles.check(name, value) is None


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("item, needle", [
    ("defaults.env.NSA_DDP_BUCKET_MB=[1,2", "defaults.env.NSA_DDP_BUCKET_MB: NSA_DDP_BUCKET_MB='[1,2' is invalid: "
                                            "expected a positive integer"),
    ("defaults.env.NSA_PREFIL_BATCHED=1", "defaults.env.NSA_PREFIL_BATCHED: NSA_PREFIL_BATCHED is not a known NSA_* "
                                          "variable (did you mean NSA_PREFILL_BATCHED?)"),
    ("steps.baseline.env.NSA_KERNEL=cuda", ".env.NSA_KERNEL: NSA_KERNEL='cuda' is invalid"),
])
def test_a_bad_variable_exits_2_before_anything_runs(in_repo, tmp_path, command, item, needle):
    out = tmp_path / "run"
    extra = ["--out", out] if command == "run" else []
    code, output = cli(command, CPU_SMOKE, "--set", item, *extra)
    assert code == 2 and needle in one_error(output), output
    assert not out.exists()  # nothing ran, nothing was written


@pytest.mark.parametrize("edit, needle", [
    (lambda r: step_of(r, "bucket_sweep").update(matrix={"env.NSA_DDP_BUCKET_MB": [25, "abc"]}, prefer=None),
     "matrix.env.NSA_DDP_BUCKET_MB: launch NSA_DDP_BUCKET_MB=abc: NSA_DDP_BUCKET_MB='abc' is invalid: expected a "
     "positive integer"),
    (lambda r: step_of(r, "bucket_sweep").update(matrix={"env.NSA_DDP_BUKET_MB": [25, 50]}, prefer=None),
     "matrix.env.NSA_DDP_BUKET_MB: launch NSA_DDP_BUKET_MB=25: NSA_DDP_BUKET_MB is not a known NSA_* variable (did "
     "you mean NSA_DDP_BUCKET_MB?)"),
    (lambda r: step_of(r, "fused_adamw")["variants"]["fused"]["env"].update(NSA_OPT_FUSD="1"),
     "variants.fused.env.NSA_OPT_FUSD: NSA_OPT_FUSD is not a known NSA_* variable (did you mean NSA_OPT_FUSED?)"),
    (lambda r: r["recommend"]["env"].update(NSA_PREFILL_BATCHED="maybe"),
     "recommend.env.NSA_PREFILL_BATCHED: NSA_PREFILL_BATCHED='maybe' is invalid: expected 0 or 1"),
])
def test_a_bad_variable_anywhere_in_a_runbook_is_an_error_naming_its_key(tmp_path, edit, needle):
    with pytest.raises(RunbookError) as info:
        load_runbook(edited(tmp_path, edit))
    assert needle in str(info.value)
    assert re.match(rf"{re.escape(str(tmp_path / 'edited.yaml'))}:\d+: ", str(info.value))  # the file and line


def test_variables_that_contradict_each_other_in_one_launch_are_an_error_naming_the_launch(tmp_path):
    """Each value parses, the pair does not (the trainer refuses it at start-up, after the steps before it ran):
    the variant's launch that sets NSA_SDPA_NO_FLASH beside the runbook's NSA_SDPA_FLASH_ONLY is refused when
    the runbook is loaded; the baseline launch, without it, would have run."""
    def edit(raw):
        raw.setdefault("defaults", {}).setdefault("env", {})["NSA_SDPA_FLASH_ONLY"] = "1"
        step_of(raw, "fused_adamw")["variants"]["fused"]["env"]["NSA_SDPA_NO_FLASH"] = "1"

    with pytest.raises(RunbookError) as info:
        load_runbook(edited(tmp_path, edit))
    assert "variants.fused.env.NSA_SDPA_NO_FLASH: launch fused: NSA_SDPA_FLASH_ONLY=1 and NSA_SDPA_NO_FLASH=1 " \
           "contradict each other" in str(info.value), str(info.value)

    def apart(raw):  # the same two, never in one launch: no error
        step_of(raw, "baseline").setdefault("env", {})["NSA_SDPA_FLASH_ONLY"] = "1"
        step_of(raw, "fused_adamw")["variants"]["fused"]["env"]["NSA_SDPA_NO_FLASH"] = "1"

    load_runbook(edited(tmp_path, apart))


def test_a_scanned_variable_out_of_its_range_is_an_error(tmp_path):
    def scan_env(raw):
        step_of(raw, "seq_scan")["values"] = {"env.NSA_PREFILL_BATCHED": [1, 2]}

    with pytest.raises(RunbookError, match=r"values\.env\.NSA_PREFILL_BATCHED: .*NSA_PREFILL_BATCHED='2' is invalid: "
                                           r"expected 0 or 1"):
        load_runbook(edited(tmp_path, scan_env, REPO / "runbooks" / "triage_cpu.yaml"))


# ---------------------------------------------------------------------- 2. metric names in criteria
def criterion(expr: str):
    def edit(raw):
        raw["acceptance"] = [{"name": "probe", "expr": expr}]
    return edit


@pytest.mark.parametrize("expr", [
    "baseline.toks_per_s.mean >= 1", "baseline.toks_per_s_per_gpu > 0 and baseline.context.seq_len == 256",
    "bucket_sweep.runs['NSA_DDP_BUCKET_MB=50'].toks_per_s.mean > 0", "bucket_sweep.decided",
    "fused_adamw.runs['fused'].loss.min > 0",
    "fused_adamw.fused.toks_per_s.mean > fused_adamw.baseline.toks_per_s.mean",
    "fused_adamw.variants.fused.p_value < 0.05", "fused_adamw.comparison.fused.significant",
    "len(longrun.nodes) == 1 and longrun.stalls == 0 and longrun.stack_dumps == 0",
    "'nsa.sel' in profiling.profile.nvtx_ranges", "sel_perf.anything_the_benchmark_writes > 1",
    "sanity_tests.failed == 0", "len(snapshot.problems) == 0 and snapshot.status == 'passed'",
    "baseline.summary.tokens_per_s > 0", "not log_contains(longrun, 'Traceback')",
])
def test_a_criterion_on_declared_metrics_passes(tmp_path, expr):
    load_runbook(edited(tmp_path, criterion(expr)))


@pytest.mark.parametrize("expr, needle", [
    ("baseline.toks_per_sec >= 1", "baseline.toks_per_sec: the train step baseline produces no such metric "
                                   "(close: baseline.toks_per_s, "),
    ("baseline.toks_per_s.maen >= 1", "baseline.toks_per_s.maen: the train step baseline produces no such metric "
                                      "(close: baseline.toks_per_s.mean, "),
    ("bucket_sweep.runs['NSA_DDP_BUCKET_MB=50'].toks_per_s.avg > 0", "close: bucket_sweep.runs.NSA_DDP_BUCKET_MB=50."
                                                                    "toks_per_s.mean"),
    ("bucket_sweep.runs['50'].toks_per_s.mean > 0", "bucket_sweep.runs.50.toks_per_s.mean: the sweep step bucket_sweep "
                                                    "produces no such metric (close: bucket_sweep.runs.NSA_DDP_BUCKET_MB="),
    ("fused_adamw.runs.fusd.loss.min > 0", "(close: fused_adamw.runs.fused)"),
    ("bucket_sweep.toks_per_s.mean > 0", "the sweep step bucket_sweep produces no such metric"),
    ("fused_adamw.fusd.toks_per_s.mean > 0", "(close: fused_adamw.fused"),
    ("sanity_tests.fails == 0", "sanity_tests.failed)"),
    ("max(baseline.loss.mean, longrun.loss.meen) < 9", "longrun.loss.meen"),
])
def test_a_criterion_on_a_metric_no_kind_produces_is_an_error(tmp_path, expr, needle):
    with pytest.raises(RunbookError) as info:
        load_runbook(edited(tmp_path, criterion(expr)))
    assert "acceptance[0].expr: " in str(info.value) and needle in str(info.value)


def test_collectives_and_strategies_are_points_of_their_names(tmp_path):
    source = REPO / "runbooks" / "parallelism_cpu.yaml"
    for good in ("comm.all_reduce.busbw_gbps.max >= 0", "parallelism.strategies['fsdp'].peak_alloc_gb > 0",
                 "scaling.strong.efficiency.min > 0"):
        load_runbook(edited(tmp_path, criterion(good), source))
    for bad, needle in (("comm.all_reduce.busbw.max >= 0", "close: comm.all_reduce.busbw_gbps"),
                        ("comm.allreduce.busbw_gbps.max >= 0", "close: comm.all_reduce"),
                        ("parallelism.strategies['fsdp'].peak_gb > 0", "close: parallelism.strategies.fsdp.peak_"),
                        ("scaling.strong.eficiency.min > 0", "close: scaling.strong.efficiency")):
        with pytest.raises(RunbookError, match=re.escape(needle)):
            load_runbook(edited(tmp_path, criterion(bad), source))


def test_triage_runs_are_named_by_their_suspects(tmp_path):
    source = REPO / "runbooks" / "triage_cpu.yaml"
    load_runbook(edited(tmp_path, criterion("triage.runs.config.toks_per_s.mean > 0 and triage.culprit is None and "
                                            "triage.suspects.sel_v2.p < 0.05 and seq_scan.points[0].passed"), source))
    with pytest.raises(RunbookError, match=r"triage\.runs\.sel_v3\.toks_per_s\.mean: .*\(close: triage\.runs\.sel_v2"):
        load_runbook(edited(tmp_path, criterion("triage.runs.sel_v3.toks_per_s.mean > 0"), source))


def test_plan_and_run_exit_2_on_a_wrong_metric_name(in_repo, tmp_path):
    path = edited(tmp_path, criterion("baseline.toks_per_sec >= 2000"))
    for command in (["plan"], ["run", "--out", tmp_path / "run"]):
        code, output = cli(command[0], path, *command[1:])
        assert code == 2 and "acceptance[0].expr: baseline.toks_per_sec" in one_error(output), output
    assert not (tmp_path / "run").exists()


def test_every_kind_declares_its_metrics():
    undeclared = [k.name for k in kinds.kinds() if k.metric_names(None) is None]
    assert not undeclared, (f"step kinds without metric names (StepKind.metrics): {undeclared}; criteria on their "
                            "steps cannot be checked before a run")


def leaves(value, path=()):
    """Every key path of a metrics record down to its values (a list or an empty mapping is a value)."""
    if isinstance(value, dict) and value:
        for key, item in value.items():
            yield from leaves(item, path + (key,))
    else:
        yield path


# the GPU runs too (gpu_kernels.yaml on an H200 and an H100: the pytest, sanitizer and bench kinds with GPU figures)
GPU_RUNS = sorted((REPO / "reports" / "gpu").glob("*/*/results.json"))


@pytest.mark.parametrize("results", EXAMPLES + GPU_RUNS + [REPO / "tests/validation/fixtures/results_example.json"],
                         ids=lambda p: p.parent.name if p.name == "results.json" else p.name)
def test_every_metric_a_real_run_produced_is_declared(results):
    """The declarations are true: each metric of each step (and of each of its runs) in a real run's results.json
    is a name its kind declares; and a criterion may read each of them."""
    data = json.loads(results.read_text())
    kinds_seen = set()
    for name, step in data["steps"].items():
        kind = kinds.get(step["kind"])
        kinds_seen.add(kind.name)
        names = readable_names(kind)
        produced = list(leaves(step.get("metrics") or {}))
        produced += [("runs", str(r.get("label"))) + p for r in step.get("runs") or []
                     for p in leaves(r.get("metrics") or {})]
        undeclared = [".".join(map(str, p)) for p in produced if not metric_declared(p, names)]
        assert not undeclared, f"{name} ({kind.name}) produced metrics its kind does not declare: {undeclared[:8]}"
        view = _namespace(data)[name]  # what a criterion reads: all of it declared too
        assert all(metric_declared(p, names) for p in leaves(view) if p and p[0] != "runs")
    assert kinds_seen


def test_step_fields_are_what_a_criterion_reads_of_every_step():
    data = json.loads(EXAMPLES[0].read_text())
    name, step = next(iter(data["steps"].items()))
    extra = set(_namespace(data)[name]) - set(step.get("metrics") or {})
    assert extra == {f.split(".")[0] for f in STEP_FIELDS}


def test_a_kind_without_declarations_is_not_checked_but_is_listed(tmp_path):
    class Quiet(kinds.StepKind):
        name = "quiet_probe"
        summary = "a kind that declares nothing"

    kinds.register(Quiet())
    try:
        def edit(raw):
            raw["phases"][0]["steps"].append({"name": "q", "kind": "quiet_probe"})
            raw["acceptance"] = [{"name": "probe", "expr": "q.anything > 0"}]
        load_runbook(edited(tmp_path, edit))
        assert "quiet_probe" in [k.name for k in kinds.kinds() if k.metric_names(None) is None]
    finally:
        kinds.unregister("quiet_probe")


def test_expression_paths_are_what_it_reads():
    expr = compile_expression("s.runs['50'].toks_per_s.mean / max(t.loss.min, 1) > 2 and not log_contains(u, 'x') "
                              "and len(v.nodes) == 2 and w.list[-1] > 0")
    assert expr.paths == [("s", ("runs", "50", "toks_per_s", "mean")), ("t", ("loss", "min")), ("v", ("nodes",)),
                          ("w", ("list", -1))]


# ---------------------------------------------------------------------- 3. ${step.winner...} references
@pytest.mark.parametrize("value, needle", [
    ("${bucket_sweep.winnr.env.NSA_DDP_BUCKET_MB}", "${bucket_sweep.winnr.env.NSA_DDP_BUCKET_MB} is not a reference "
                                                   "nsa-validate can resolve (winnr after the step name"),
    ("${bucket_swep.winner.env.NSA_DDP_BUCKET_MB}", "no step is named bucket_swep (did you mean bucket_sweep?)"),
    ("${bucket_sweep.winner.env.NSA_DDP_BUCKET_MB", "it has no closing }"),
    ("${bucket_sweep.winner.env.NSA_DDP_COMPRESS}", "bucket_sweep does not sweep env.NSA_DDP_COMPRESS"),
    ("${baseline.winner.env.NSA_DDP_BUCKET_MB}", "must name a sweep step (baseline is a train step)"),
])
def test_a_misspelt_reference_is_an_error_before_anything_launches(in_repo, tmp_path, value, needle):
    path = edited(tmp_path, lambda raw: step_of(raw, "sdpa_audit")["env"].update(NSA_DDP_BUCKET_MB=value))
    with pytest.raises(RunbookError) as info:
        load_runbook(path)
    assert needle in str(info.value)
    code, output = cli("plan", path)
    assert code == 2 and needle in one_error(output)


def test_a_reference_in_a_sweep_matrix_or_a_variant_is_checked_too(tmp_path):
    def in_variant(raw):
        step_of(raw, "fused_adamw")["variants"]["fused"]["env"]["NSA_DDP_BUCKET_MB"] = "${bucket_sweep.winer.env.X}"

    with pytest.raises(RunbookError, match=r"variants\.fused\.env\.NSA_DDP_BUCKET_MB: \$\{bucket_sweep\.winer"):
        load_runbook(edited(tmp_path, in_variant))


def test_a_good_reference_plans_as_text_and_a_shell_variable_is_left_alone(in_repo, tmp_path):
    path = edited(tmp_path, lambda raw: step_of(raw, "sdpa_audit")["env"].update(HOME_COPY="${HOME}"))
    code, output = cli("plan", path, "--json")
    assert code == 0, output
    rows = {r["step"]: r for r in json.loads(output)}
    env = rows["sdpa_audit"]["launches"][0]["env"]
    assert env["NSA_DDP_BUCKET_MB"] == "${bucket_sweep.winner.env.NSA_DDP_BUCKET_MB}" and env["HOME_COPY"] == "${HOME}"


def test_the_readme_shows_the_toggle_table():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert toggles.table_markdown() in readme, "README.md's toggle table is `python -m nsa.toggles`"
