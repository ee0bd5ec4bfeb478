"""validation.report: Markdown/HTML/JSON/JUnit reports and plots rendered from results.json alone."""

from __future__ import annotations

import base64
import copy
import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from validation.report import renderer
from validation.report import FORMATS, ReportError, make_plots, render, write_reports
from validation.results.store import write_results

FIXTURE = Path(__file__).parents[1] / "fixtures" / "results_example.json"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The status words the report must show (words, never emoji), written out here rather than imported from report.py.
CRITERION_WORDS = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "skipped": "SKIPPED", "error": "ERROR"}
EMOJI = re.compile("[\u2600-\u27bf\u2b00-\u2bff\u23e9-\u23ff\ufe0f\U0001f000-\U0001faff]")


@pytest.fixture
def results() -> dict:
    return json.loads(FIXTURE.read_text(encoding="utf-8"))


def _reversed_dicts(value):
    """The same data with every dict's insertion order reversed (lists keep their order)."""
    if isinstance(value, dict):
        return {k: _reversed_dicts(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reversed_dicts(v) for v in value]
    return value


def _failed_results(results: dict) -> dict:
    """The fixture with failing steps whose metrics are empty or missing."""
    res = copy.deepcopy(results)
    res["verdict"] = "NO-GO"
    res["verdict_reason"] = "step baseline failed: trainer exited with code 1 on rank 1"
    steps = res["steps"]
    steps["baseline"].update(status="failed", reason="trainer exited with code 1 on rank 1", metrics={},
                             excerpt="Traceback (most recent call last):\n  File \"nsa/train.py\", line 412\n"
                                     "RuntimeError: shape mismatch in ```selection``` branch",
                             stack_dumps=["steps/baseline/stackdump_rank1.txt"])
    sweep = steps["bucket_sweep"]
    sweep.update(status="failed", reason="2 of 3 runs failed", winner=None, metrics={})
    sweep["runs"][0].update(status="timeout", reason="no heartbeat for 300 s", metrics={})
    sweep["runs"][1].update(status="failed", reason="exit code 1", metrics=None)
    steps["fused_adamw"].update(status="error", reason="comparison needs 2 finished runs", comparison=[],
                                runs=[{"label": "baseline", "status": "hang"}])
    steps["longrun"].update(status="hang", reason="watchdog halted the run at step 412", excerpt=None,
                            metrics={"halted": True, "stalls": [412]},
                            stack_dumps=["steps/longrun/stackdump_rank0.txt", "steps/longrun/stackdump_rank1.txt"])
    steps["sanity_tests"].update(metrics={})
    steps["profiling"].update(status="timeout", reason="exceeded 600 s", metrics={})
    steps["sel_perf"].update(status="failed", reason="the benchmark wrote no JSON", metrics={})
    steps["snapshot"]["metrics"] = None
    del steps["single"]["metrics"]
    res["environment"] = {}
    res["acceptance"].append({"name": "broken_expr", "expr": "steps.nope.metrics.x > 1", "target": "> 1",
                              "severity": "fail", "status": "error", "actual": None,
                              "detail": "steps.nope: no such step"})
    return res


def _expected_junit_counts(results: dict) -> dict[str, dict[str, int]]:
    """tests/failures/errors/skipped per suite, counted from the results dict alone."""
    expected = {}
    for phase in results["phases"]:
        statuses = [results["steps"][n]["status"] for n in phase["steps"]]
        expected[phase["name"]] = {
            "tests": len(statuses),
            "failures": sum(s in ("failed", "hang", "timeout", "error") for s in statuses),
            "errors": 0,
            "skipped": sum(s in ("skipped", "pending", "interrupted") for s in statuses),
        }
    crit = [c["status"] for c in results["acceptance"]]
    expected["acceptance"] = {"tests": len(crit), "failures": crit.count("fail"), "errors": crit.count("error"),
                              "skipped": crit.count("skipped")}
    return expected


def _table_rows(md: str, first_cell: str) -> list[str]:
    return [line for line in md.splitlines() if line.startswith(f"| {first_cell} |")]


# ---------------------------------------------------------------------------------------------------------------
# Markdown

def test_markdown_has_the_v4_report_shape(results):
    md = render(results, "md")
    assert md.startswith("# cpu_smoke Validation Report\n")
    sections = ["## Executive Summary", "## Test Environment", "## Test Results Summary",
                "## Acceptance Criteria Assessment", "## Recommendations", "## Artifacts"]
    positions = [md.index(s) for s in sections]
    assert positions == sorted(positions)
    assert "### Status: NO-GO\n" in md
    assert not EMOJI.search(md), EMOJI.search(md)
    assert results["verdict_reason"] in md
    for phase in results["phases"]:  # the runbook numbers its phases ("Phase 2.1: ..."): titles as they are
        assert re.search(rf"^### {re.escape(phase['title'])} — (PASSED|FAILED|INCOMPLETE|SKIPPED)$", md, re.M), \
            phase["title"]
        for name in phase["steps"]:
            step = results["steps"][name]
            assert f"#### {step['title']} — " in md
    assert md.count("\n### Phase ") == len(results["phases"])
    # key figures: baseline tokens/s with thousands separators, best bucket, scaling efficiency (2,921.6 / 4,712.0)
    assert "- **Baseline throughput**: 5,843.2 ± 112.4 tokens/s (window mean ± stdev, all ranks) — step `baseline`, " \
           "steps 41–60 (n=20), 2,921.6 tokens/s per GPU (window mean); at world size 2" in md
    assert "- **Best bucket**: 25 MB (NSA_DDP_BUCKET_MB)" in md
    assert "- **Scaling efficiency**: 0.62 (62% of linear; one launch each, no 95% interval)" in md
    # each criterion counted once: by severity, then by outcome
    required = sum(c["severity"] == "fail" for c in results["acceptance"])
    assert (f"- **Acceptance criteria**: 12 ({required} required, {12 - required} warnings only; 1 fail, 9 pass, "
            "1 skipped, 1 warn)") in md
    # environment table
    assert "| Host | ci-runner-07 |" in md
    assert f"| Git SHA | {results['environment']['git_sha']} |" in md
    assert "| GPUs | none (CPU only) |" in md
    assert "| Runbook | runbooks/cpu_smoke.yaml" in md


def test_markdown_numbers_unnumbered_phases(results):
    for phase in results["phases"]:
        phase["title"] = re.sub(r"^Phase [\d.]+: ", "", phase["title"])
    md = render(results, "md")
    assert "### Phase 1: Preflight (snapshot and sanity tests) — PASSED" in md
    assert "### Phase 9: Stability long run with watchdog — PASSED" in md
    assert "#### 2.2 The baseline over NCCL on 2 GPUs — SKIPPED" in md


def test_markdown_bucket_sweep_table_marks_the_winner_best(results):
    md = render(results, "md")
    assert "| NSA_DDP_BUCKET_MB | Tokens/s, window mean (all ranks) | Stdev | CV | n | TFLOP/s | MFU | Status |" in md
    rows = {mb: _table_rows(md, mb) for mb in ("25", "50", "100")}
    assert all(len(r) == 1 for r in rows.values()), rows
    assert rows["25"][0] == "| 25 | 6,012.4 | 85.3 | 1.4% | 20 | n/a | n/a | **BEST** |"
    assert "BEST" not in rows["50"][0] and "BEST" not in rows["100"][0]
    assert rows["50"][0] == "| 50 | 5,861.7 | 240.9 | 4.1% | 20 | n/a | n/a | PASSED |"
    winner = results["steps"]["bucket_sweep"]["winner"]
    assert f"**Winner**: NSA_DDP_BUCKET_MB=25 — {winner['explanation']}" in md


def test_markdown_acceptance_rows_have_the_right_status_words(results):
    md = render(results, "md")
    assert "| Criterion | Target | Actual | Status | If it fails | Detail |" in md
    for crit in results["acceptance"]:
        rows = _table_rows(md, crit["name"])
        assert len(rows) == 1, crit["name"]
        cells = [c.strip() for c in rows[0].strip("|").split(" | ")]
        assert cells[3] == CRITERION_WORDS[crit["status"]], rows[0]
        assert cells[4] == {"fail": "NO-GO", "warn": "warning"}[crit["severity"]]  # never "fail" beside PASS
    assert _table_rows(md, "Throughput floor (CPU)")[0] == (
        "| Throughput floor (CPU) | >= 2,000 tokens/s | baseline.toks_per_s.mean = 5843.2 | PASS | NO-GO |  |")
    assert _table_rows(md, "NCCL baseline throughput")[0] == (
        "| NCCL baseline throughput | >= 2,000 tokens/s | n/a | SKIPPED | NO-GO | "
        "not evaluated: ddp_nccl: skipped (needs 2 GPU(s), found 0) |")


def test_markdown_recommendations_export_block(results):
    md = render(results, "md")
    block = re.search(r"```bash\n(.*?)```", md, re.S)
    assert block, md
    lines = block.group(1).splitlines()
    expected = [f"export {k}={v}" for k, v in sorted(results["recommendations"]["env"].items())]
    assert lines == expected
    assert "export NSA_DDP_BUCKET_MB=25" in lines
    for note in results["recommendations"]["notes"]:
        assert f"- {note}" in md


def test_markdown_step_kinds(results):
    md = render(results, "md")
    # skipped step: its reason
    skipped = results["steps"]["ddp_nccl"]
    assert f"#### {skipped['title']} — SKIPPED" in md
    assert f"**SKIPPED**: {skipped['reason']}" in md
    assert "needs 2 GPU(s), found 0" in md
    # train table: config (from --config), env, ranks, window, mean ± stdev, per GPU, loss drop, peak mem
    baseline = _table_rows(md, "baseline | `configs/tiny_cpu.yaml`")
    assert len(baseline) == 1
    cells = [c.strip() for c in baseline[0].strip("|").split(" | ")]
    assert cells[2:] == ["2", "steps 41–60 (n=20)", "5,843.2 ± 112.4", "2,921.6", "1.9%", "10.412 → 6.873 (−34.0%)",
                         "0.41 GiB", "PASSED"]
    env_line = md[md.index(baseline[0]):].splitlines()[2]  # the step's environment, under its table
    assert env_line.startswith("Environment: ") and "NSA_DDP_BUCKET_MB=50" in env_line and "NCCL_ALGO=Ring" in env_line
    assert "- DDP gradient compression: bf16" in md
    assert "- SDPA audit: 1,200 calls; backends: math on cpu=1,200; fallbacks to math on GPU: 0" in md
    # ab: runs per repeat, baseline/variant means, delta %, p-value, verdict, the variant kept
    assert "| fused (repeat 2) | NSA_OPT_FUSED=1 | 5,712.8 ± 142.0 | 2.5% | 20 | n/a | n/a | PASSED |" in md
    assert _table_rows(md, "baseline | fused")[0] == (
        "| baseline | fused | toks_per_s | 5,795.9 | 5,690.9 | -1.8% | — | 40 / 40 | welch | 0.210 | n/a "
        "| same |")  # results written before confidence intervals and noise floors were recorded
    assert "**Keep**: baseline — no variant was both at least as fast as baseline and stable" in md
    # pytest counts
    assert "| 46 | 0 | 6 | 0 | 52 | 38.2 s |" in md
    assert "| 18 | 0 | 2 | 0 | 20 | 17.9 s |" in md
    # bench: scalar figures and the per-S table
    assert "| `ranges_speedup_min` | 0.871 |" in md
    assert "| 1.013 | 61.2 | 60.4 | 0.871 | 3.91 | 4.49 | 1,024 |" in md
    # profile: operators and NVTX ranges
    assert "| `aten::mm` | 812.4 | 4,800 |" in md
    assert "NVTX ranges seen: `nsa.attn`, `nsa.cmp`, `nsa.gate`, `nsa.sel.ranges_v2`, `nsa.win`" in md
    assert "- Trace: `profiling/out/profile/trace_rank0_step2.json`" in md
    # longrun
    assert "| yes | n/a | yes | 0.44 GiB | no | 0 | 0 |" in md
    # snapshot: files and problems; the artifacts section
    assert "`snapshot/collect_env.txt`" in md
    assert "- Problem: nvidia-smi: not found (no NVIDIA driver on this machine)" in md
    assert "  - training csv (NSA_DDP_BUCKET_MB=100): `bucket_sweep/NSA_DDP_BUCKET_MB_100/out/training.csv`" in md


@pytest.mark.parametrize("verdict, line, css", [("GO", "### Status: GO\n", "verdict go"),
                                                ("NO-GO", "### Status: NO-GO\n", "verdict nogo"),
                                                ("INCOMPLETE", "### Status: INCOMPLETE\n", "verdict incomplete")])
def test_verdict_lines(results, verdict, line, css):
    results["verdict"] = verdict
    results["verdict_reason"] = f"reason for {verdict}"
    md = render(results, "md")
    assert line in md
    assert md.count("### Status:") == 1
    assert "reason for " + verdict in md
    html = render(results, "html")
    assert f'<div class="{css}">Status: {verdict}</div>' in html
    assert not EMOJI.search(html)


# ---------------------------------------------------------------------------------------------------------------
# Determinism

@pytest.mark.parametrize("fmt", FORMATS)
def test_rendering_is_deterministic(results, fmt):
    first = render(results, fmt)
    assert render(copy.deepcopy(results), fmt) == first
    if fmt != "json":  # json keeps whatever order; sorted keys make it equal anyway
        assert render(_reversed_dicts(results), fmt) == first
    assert render(_reversed_dicts(results), "json") == render(results, "json")


def test_json_format_is_sorted_and_complete(results):
    text = render(results, "json")
    assert json.loads(text) == results
    top_keys = [line[3:].split('"')[0] for line in text.splitlines() if re.match(r'^  "', line)]
    assert top_keys == sorted(results)


# ---------------------------------------------------------------------------------------------------------------
# JUnit

def _check_junit(text: str, results: dict) -> ET.Element:
    root = ET.fromstring(text.encode("utf-8"))
    assert root.tag == "testsuites"
    expected = _expected_junit_counts(results)
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    assert list(suites) == [p["name"] for p in results["phases"]] + ["acceptance"]
    for name, counts in expected.items():
        suite = suites[name]
        for key, value in counts.items():
            assert suite.get(key) == str(value), (name, key)
        cases = suite.findall("testcase")
        assert len(cases) == counts["tests"]
        assert len(suite.findall("testcase/failure")) == counts["failures"]
        assert len(suite.findall("testcase/error")) == counts["errors"]
        assert len(suite.findall("testcase/skipped")) == counts["skipped"]
    for key in ("tests", "failures", "errors", "skipped"):
        assert root.get(key) == str(sum(c[key] for c in expected.values())), key
    return root


def test_junit_counts_and_cases(results):
    root = _check_junit(render(results, "junit"), results)
    suite = next(s for s in root.findall("testsuite") if s.get("name") == "baseline")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == ["baseline", "ddp_nccl"]
    assert cases["baseline"].get("classname") == "cpu_smoke.baseline"
    assert cases["baseline"].get("time") == "72.400"
    assert cases["baseline"].find("failure") is None and cases["baseline"].find("skipped") is None
    assert cases["ddp_nccl"].find("skipped").get("message") == "needs 2 GPU(s), found 0"
    acceptance = next(s for s in root.findall("testsuite") if s.get("name") == "acceptance")
    crit = {c.get("name"): c for c in acceptance.findall("testcase")}
    assert "sel_perf.ranges_speedup_min = 0.871" in crit["Selection v2 faster"].find("failure").get("message")
    assert crit["Per-rank scaling (CPU: 2 ranks share 2 cores)"].find("system-out").text.startswith("WARN:")
    assert crit["NCCL baseline throughput"].find("skipped") is not None
    passed = crit["Throughput floor (CPU)"]
    assert passed.find("failure") is None and passed.find("skipped") is None


def test_junit_failed_steps(results):
    res = _failed_results(results)
    text = render(res, "junit")
    root = _check_junit(text, res)
    cases = {c.get("name"): c for c in root.iter("testcase")}
    failure = cases["baseline"].find("failure")
    assert failure.get("message") == "trainer exited with code 1 on rank 1"
    assert "RuntimeError: shape mismatch" in failure.text
    assert "steps/baseline/stackdump_rank1.txt" in failure.text
    assert cases["longrun"].find("failure").get("type") == "hang"
    assert cases["broken_expr"].find("error") is not None


def test_junit_survives_control_characters(results):
    results["steps"]["baseline"].update(status="failed", reason="bad \x1b[31mcolour\x1b[0m",
                                        excerpt="line\x00with NUL")
    root = ET.fromstring(render(results, "junit").encode("utf-8"))
    assert root.get("failures") == "2"


# ---------------------------------------------------------------------------------------------------------------
# HTML

def test_html_is_standalone_and_escapes_everything(results):
    evil = "<script>alert('x')</script>"
    results["steps"]["baseline"].update(status="failed", reason=f"bad {evil}", excerpt=f"Traceback {evil}")
    results["verdict_reason"] = evil
    results["recommendations"]["notes"].append(evil)
    html = render(results, "html")
    assert html.startswith("<!DOCTYPE html>")
    assert "<script" not in html
    assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in html
    assert "http://" not in html and "https://" not in html  # no external assets
    assert "<style>" in html
    for phase in results["phases"]:
        assert phase["title"].replace("&", "&amp;") in html
    assert '<tr class="best"><td>25</td>' in html
    assert '<td class="status-cell"><span class="status fail">FAIL</span></td>' in html
    assert not EMOJI.search(html)
    assert "export NSA_DDP_BUCKET_MB=25" in html


# ---------------------------------------------------------------------------------------------------------------
# Failed steps, empty metrics

def test_failed_steps_with_empty_metrics_render(results):
    res = _failed_results(results)
    md = render(res, "md")
    steps = res["steps"]
    assert f"#### {steps['baseline']['title']} — FAILED" in md
    assert "**FAILED**: trainer exited with code 1 on rank 1" in md
    assert _table_rows(md, "baseline | `configs/tiny_cpu.yaml`")[0].count("n/a") >= 7
    # the excerpt in a fence longer than the backticks inside it, then the stack dump
    assert "````text\nTraceback (most recent call last):" in md
    assert "RuntimeError: shape mismatch in ```selection``` branch\n````" in md
    assert "`steps/baseline/stackdump_rank1.txt`" in md
    assert f"#### {steps['longrun']['title']} — HANG" in md
    assert f"#### {steps['profiling']['title']} — TIMEOUT" in md
    assert f"#### {steps['fused_adamw']['title']} — ERROR" in md
    assert "`steps/longrun/stackdump_rank0.txt`" in md
    assert "| 25 | n/a | n/a | n/a | n/a | n/a | n/a | TIMEOUT (no heartbeat for 300 s) |" in md
    assert "**Winner**: none — " in md
    assert "No comparison available." in md
    assert "| broken_expr | > 1 | n/a | ERROR | NO-GO |" in md
    assert "| Host | n/a |" in md
    html = render(res, "html")
    assert "RuntimeError: shape mismatch" in html
    render(res, "junit")


def test_minimal_and_malformed_results_render():
    for res in ({}, {"schema_version": 1, "verdict": "INCOMPLETE"},
                {"phases": [{"name": "p", "steps": ["ghost"]}], "steps": {"orphan": {"kind": "train"}},
                 "acceptance": [{}], "recommendations": {"env": None}, "environment": {"gpus": [{"name": "H100"}]}},
                {"steps": {"x": {"kind": "sweep", "runs": [None, {"params": None, "metrics": {"toks_per_s": 5}}]},
                           "y": {"kind": "ab", "comparison": [None]}, "z": {"kind": "profile", "metrics": [1]}}}):
        for fmt in FORMATS:
            assert render(res, fmt)
    md = render({"phases": [{"name": "p", "steps": ["ghost"]}], "steps": {"orphan": {"kind": "train"}}}, "md")
    assert "No result recorded for this step." in md
    assert "Other steps" in md and "orphan" in md
    assert "### Status: INCOMPLETE\n" in md


def test_unknown_format_is_a_clear_error(results):
    with pytest.raises(ReportError, match="unknown report format 'pdf'.*md, html, json, junit"):
        render(results, "pdf")
    with pytest.raises(ReportError, match="unknown report format"):
        write_reports(Path("/nonexistent"), results, formats=("md", "pdf"))


def test_missing_templates_dir_is_a_clear_error(results, tmp_path, monkeypatch):
    missing = tmp_path / "no-templates"
    monkeypatch.setattr(renderer, "TEMPLATES_DIR", missing)
    for fmt in ("md", "html"):
        with pytest.raises(ReportError, match="report templates not found") as info:
            render(results, fmt)
        assert str(missing) in str(info.value)
    assert render(results, "junit") and render(results, "json")  # no templates needed
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    with pytest.raises(ReportError, match="report templates not found"):
        write_reports(run_dir, results)
    assert list(run_dir.iterdir()) == []  # nothing half-written


def test_a_process_compiles_a_template_once_per_templates_folder(results, tmp_path, monkeypatch):
    """A second report in the same process reuses the compiled templates; another templates folder is read anew
    (a copy whose Markdown title line says something else renders that)."""
    import shutil

    first = render(results, "md")
    assert renderer._template("md") is renderer._template("md")  # compiled once, kept
    copy = tmp_path / "templates"
    shutil.copytree(renderer.TEMPLATES_DIR, copy)
    source = (copy / "report.md.j2").read_text()
    (copy / "report.md.j2").write_text("FROM THE COPY\n" + source)
    monkeypatch.setattr(renderer, "TEMPLATES_DIR", copy)
    changed = render(results, "md")
    assert changed.startswith("FROM THE COPY") and "FROM THE COPY" not in first and changed.endswith(first[-200:])
    monkeypatch.undo()
    assert render(results, "md") == first


# ---------------------------------------------------------------------------------------------------------------
# Files and plots

def _write_csv(path: Path, steps: int, base: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"]
    for s in range(1, steps + 1):
        lines.append(f"{s},{10 - s * 0.1:.3f},0.0003,{base + (s % 5) * 10.0:.1f},0.35,1.2,0.4,0.5")
    path.write_text("\n".join(lines) + "\n")


def test_write_reports_writes_reports_and_plots(results, tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_results(run_dir, results)
    before = (run_dir / "results.json").read_bytes()
    _write_csv(run_dir / results["steps"]["baseline"]["metrics"]["csv"], 20, 5800.0)
    for run in results["steps"]["bucket_sweep"]["runs"][:2]:
        _write_csv(run_dir / run["metrics"]["csv"], 20, 6000.0)
    bad = run_dir / results["steps"]["longrun"]["metrics"]["csv"]  # unreadable csv: no plot, no crash
    bad.parent.mkdir(parents=True)
    bad.write_text("not,a\n")

    paths = write_reports(run_dir)  # reads results.json
    names = sorted(p.relative_to(run_dir).as_posix() for p in paths)
    assert names == ["junit.xml", "plots/ab_fused_adamw.png", "plots/sweep_bucket_sweep.png",
                     "plots/toks_per_s_baseline.png", "plots/toks_per_s_bucket_sweep.png", "report.html",
                     "report.md"]
    for p in paths:
        assert p.is_file() and p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG_SIGNATURE
    assert (run_dir / "results.json").read_bytes() == before  # the caller owns results.json
    assert not list(run_dir.rglob("*.tmp"))
    md = (run_dir / "report.md").read_text(encoding="utf-8")
    assert "## Plots" not in md  # every plot sits in its step's section, beside its table
    steps = results["steps"]
    for prefix, path, step in ((f"Sweep: {steps['bucket_sweep']['title']}", "plots/sweep_bucket_sweep.png",
                                "bucket_sweep"),
                               (f"Tokens/s per step: {steps['baseline']['title']}", "plots/toks_per_s_baseline.png",
                                "baseline")):
        assert re.search(rf"!\[{re.escape(prefix)}[^\]]*\]\({re.escape(path)}\)", md)
        heading = md.index(f"#### {steps[step]['title']}") if f"#### {steps[step]['title']}" in md else \
            md.index(f" {steps[step]['title']} — ")
        assert heading < md.index(f"]({path})") < md.index("## Acceptance Criteria")
    assert "  - training csv: `baseline/out/training.csv`\n" in md  # present: not marked missing
    assert "  - training csv: `single/out/training.csv` (missing)" in md
    html = (run_dir / "report.html").read_text(encoding="utf-8")
    images = re.findall(r'<img class="plot" src="([^"]+)"', html)  # every plot inline: the page stands alone
    assert len(images) == 4 and 'src="plots/' not in html
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == PNG_SIGNATURE
    inlined = {base64.b64decode(src.split(",", 1)[1]) for src in images}
    assert (run_dir / "plots/ab_fused_adamw.png").read_bytes() in inlined
    _check_junit((run_dir / "junit.xml").read_text(encoding="utf-8"), results)


def test_plots_are_byte_identical_across_runs(results, tmp_path):
    outputs = []
    for name in ("a", "b"):
        run_dir = tmp_path / name
        _write_csv(run_dir / results["steps"]["baseline"]["metrics"]["csv"], 10, 5000.0)
        plots = make_plots(results, run_dir)
        assert [p["path"] for p in plots] == ["plots/toks_per_s_baseline.png", "plots/sweep_bucket_sweep.png",
                                              "plots/ab_fused_adamw.png"]
        outputs.append({p["path"]: (run_dir / p["path"]).read_bytes() for p in plots})
    assert outputs[0] == outputs[1]


def test_write_reports_without_plots_and_other_formats(results, tmp_path):
    results["plots"] = [{"title": "gone", "path": "plots/gone.png"}]
    paths = write_reports(tmp_path, results, formats=("md", "json"), plots=False)
    assert [p.name for p in paths] == ["report.md", "report.json"]
    assert not (tmp_path / "plots").exists()
    assert "gone.png" not in (tmp_path / "report.md").read_text(encoding="utf-8")  # missing PNG left out
    assert json.loads((tmp_path / "report.json").read_text(encoding="utf-8")) == results
