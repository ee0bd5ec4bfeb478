"""The `comm` step kind: its schema, the choice between the torch benchmark and nccl-tests, the nccl-tests table
parser (on a format sample: this machine has no GPU, so nccl-tests itself never runs here), a run through the
runner with fake `<kind>_perf` programs, and a real 2-rank gloo run of the torch benchmark (plus one rank) with its
metrics, report table and plot."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from validation.analysis import nccl_tests
from validation.analysis.collectives import bus_factor
from validation.runbook.plan import step_launches
from validation.report import write_reports
from validation.runbook.loader import RunbookError, load_runbook
from validation.execution.runner import RunOptions, Runner
from validation.kinds import comm as comm_kind

REPO = Path(__file__).resolve().parents[3]
SAMPLE = REPO / "tests" / "validation" / "fixtures" / "nccl_tests_all_reduce_8gpu.txt"

RUNBOOK = """\
name: comm_test
requirements: {{gpus: 0}}
defaults: {{nproc_per_node: 2, timeout_s: 120}}
phases:
  - name: comm
    title: Communication
    steps:
{steps}
acceptance:
  - {{name: busbw, expr: "{criterion}", target: "measured"}}
"""


def _runbook(tmp_path, steps: str, criterion: str = "True") -> Path:
    path = tmp_path / "comm.yaml"
    path.write_text(RUNBOOK.format(steps=steps, criterion=criterion))
    return path


# ---------------------------------------------------------------------------------------------- nccl-tests
def test_parser_reads_the_out_of_place_columns_of_the_format_sample():
    parsed = nccl_tests.parse(SAMPLE.read_text(), "all_reduce")
    rows = parsed["rows"]
    assert parsed["world_size"] == 8 and parsed["avg_busbw_gbps"] == 33.04
    assert parsed["devices"] == ["NVIDIA A100-SXM4-80GB"] * 8  # the name each `# Rank` line ends with
    assert [r["bytes"] for r in rows] == [8192 * 2 ** i for i in range(14)]
    assert rows[0]["time_s"] == pytest.approx(40e-6) and rows[-1]["time_s"] == pytest.approx(1150e-6)
    for r in rows:  # recomputed with our conventions: equal to what nccl-tests printed, up to its rounding
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9)
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * 2 * 7 / 8)
        assert abs(r["busbw_gbps"] - r["reported_busbw_gbps"]) <= 0.006
    summary = comm_kind.summarize("all_reduce", list(reversed(rows)))
    assert summary.sizes == 14 and summary.latency_us == pytest.approx(40.0)
    assert summary.busbw_gbps.max == pytest.approx(rows[-1]["busbw_gbps"])
    assert [r.bytes for r in summary.table] == sorted(r["bytes"] for r in rows)


def test_parser_older_layout_without_root_and_with_unparsable_rows():
    # all_gather_perf of an older nccl-tests: no root column, "error" instead of "#wrong"; a row with N/A time
    text = """# nThread 1 nGpus 2 minBytes 1024 maxBytes 4096 step: 2(factor) warmup iters: 5 iters: 20 validation: 1
#  Rank  0 Group  0 Pid   900 on host device  0 [0x07] Tesla V100-SXM2-16GB
#  Rank  1 Group  0 Pid   900 on host device  1 [0x08] Tesla V100-SXM2-16GB
#
#                                             out-of-place                       in-place
#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error
#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
        1024           128     float    none    20.00    0.05    0.03  0e+00    20.00    0.05    0.03  0e+00
        2048           256     float    none      N/A     N/A     N/A    N/A    20.00    0.10    0.05  0e+00
        4096           512     float    none    25.00    0.16    0.08  0e+00    24.00    0.17    0.09  0e+00
# Avg bus bandwidth    : 0.055
"""
    parsed = nccl_tests.parse(text, "all_gather")
    assert parsed["world_size"] == 2 and [r["bytes"] for r in parsed["rows"]] == [1024, 4096]
    assert parsed["devices"] == ["Tesla V100-SXM2-16GB"] * 2
    assert parsed["rows"][1]["busbw_gbps"] == pytest.approx(4096 / 25e-6 / 1e9 * bus_factor("all_gather", 2))
    with pytest.raises(nccl_tests.NcclTestsError, match="no nccl-tests table header"):
        nccl_tests.parse("all_reduce_perf: command not found\n", "all_reduce")
    with pytest.raises(nccl_tests.NcclTestsError, match="holds no row"):
        nccl_tests.parse(text.split("        1024")[0], "all_gather")


def _fake_binaries(tmp_path, kinds=("all_reduce", "all_gather", "reduce_scatter", "broadcast"),
                   nvidia_smi=True) -> str:
    """A directory with `<kind>_perf` programs printing the format sample (and nvidia-smi); returns a PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    names = [nccl_tests.BINARIES[k] for k in kinds] + (["nvidia-smi"] if nvidia_smi else [])
    for name in names:
        exe = bin_dir / name
        exe.write_text(f"#!/bin/sh\necho \"$0 $*\" > \"{bin_dir}/$(basename $0).args\"\ncat '{SAMPLE}'\n")
        exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin"


def test_source_selection_and_commands(tmp_path):
    path = _fake_binaries(tmp_path)
    base = "      - {{name: c, kind: comm, source: {source}, env: {{PATH: '{path}'}}{extra}}}"

    def step(source, extra="", p=path):
        return load_runbook(_runbook(tmp_path, base.format(source=source, path=p, extra=extra))).step("c")

    kind = comm_kind.Comm()
    assert kind.resolved_source(step("auto")) == "nccl-tests"
    assert kind.resolved_source(step("auto", ", backend: gloo")) == "torch"
    assert kind.resolved_source(step("auto", ", nnodes: 2")) == "torch"
    assert kind.resolved_source(step("torch")) == "torch"
    no_smi = _fake_binaries(tmp_path / "x", nvidia_smi=False) if (tmp_path / "x").mkdir() is None else None
    assert kind.resolved_source(step("auto", p=no_smi)) == "torch"  # no GPU machine: the torch benchmark
    partial = _fake_binaries(tmp_path / "y", kinds=("all_reduce",)) if (tmp_path / "y").mkdir() is None else None
    assert kind.resolved_source(step("auto", p=partial)) == "torch"
    assert kind.skip_reason(step("nccl-tests", p=partial)) == ("source nccl-tests, but all_gather_perf, "
                                                              "reduce_scatter_perf, broadcast_perf not on PATH")

    specs = step_launches(step("nccl-tests", ", min_bytes: 1024, max_bytes: 1048576, iters: 7, warmup: 2"))
    assert [s.argv for s in specs][0] == ["all_reduce_perf", "-b", "1024", "-e", "1048576", "-f", "2", "-g", "2",
                                         "-n", "7", "-w", "2"]
    assert [s.dir for s in specs] == ["c/all_reduce", "c/all_gather", "c/reduce_scatter", "c/broadcast"]
    assert not specs[0].uses_torchrun

    (spec,) = step_launches(step("torch", ", kinds: [all_reduce, broadcast], sizes: [8192, 4096], nnodes: 2, "
                                          "compute_ms: 150"))
    assert spec.argv[spec.argv.index("--compute-ms") + 1] == "150.0"
    assert spec.argv[1:3] == ["-m", "validation.analysis.comm_bench"] and spec.uses_torchrun and spec.world_size == 4
    assert spec.argv[spec.argv.index("--kinds") + 1] == "all_reduce,broadcast"
    assert spec.argv[spec.argv.index("--sizes") + 1] == "4096,8192"
    (job,) = step_launches(step("torch", ", nnodes: 2, launcher: {type: slurm, partition: debug}"))
    script = job.batch_script()
    assert job.launcher == "slurm" and "#SBATCH --nodes=2" in script and "-m validation.analysis.comm_bench" in script
    assert "--nnodes=2 --nproc-per-node=2" in script


@pytest.mark.parametrize("extra, needle", [
    ("kinds: [all_reduce, alltoall]", "kinds[1]: 'alltoall' is not one of all_reduce"),
    ("kinds: []", "kinds: expected a non-empty list"),
    ("sizes: [4096], min_bytes: 1024", "sizes: give either sizes or min_bytes/max_bytes"),
    ("min_bytes: 4096, max_bytes: 1024", "max_bytes: must be >= min_bytes (4096), got 1024"),
    ("iters: 0", "iters: must be >= 1, got 0"),
    ("source: nccl-tests, backend: gloo", "source: nccl-tests measures NCCL"),
    ("source: nccl-tests, nnodes: 2", "MPI build of nccl-tests"),
    ("source: nccl-tests, compute_ms: 100", "compute_ms: nccl-tests times its calls back to back"),
    ("compute_ms: -1", "compute_ms: must be >= 0, got -1"),
    ("config: configs/tiny_cpu.yaml", "config: unknown key"),
])
def test_schema_errors_name_the_key(tmp_path, extra, needle):
    path = _runbook(tmp_path, f"      - {{name: c, kind: comm, {extra}}}")
    with pytest.raises(RunbookError) as info:
        load_runbook(path)
    assert needle in str(info.value) and str(info.value).startswith(f"{path}:")


def test_nccl_tests_run_through_the_runner_with_fake_programs(tmp_path):
    path = _fake_binaries(tmp_path, kinds=("all_reduce",))
    rb = load_runbook(_runbook(tmp_path, f"      - {{name: c, kind: comm, source: nccl-tests, kinds: [all_reduce], "
                                         f"nproc_per_node: 8, env: {{PATH: '{path}'}}}}",
                               "c.all_reduce.busbw_gbps.max >= 100 and c.all_reduce.sizes >= 6"))
    results = Runner(rb, tmp_path / "run", RunOptions(cwd=REPO)).run()
    step = results["steps"]["c"]
    assert step["status"] == "passed", step["reason"]
    m = step["metrics"]
    assert (m["world_size"], m["backend"], m["source"]) == (8, "nccl", "nccl-tests")
    assert m["device_name"] == "NVIDIA A100-SXM4-80GB"  # what the bandwidths' ceiling reads
    assert m["all_reduce"]["busbw_gbps"]["max"] == pytest.approx(67108864 / 1150e-6 / 1e9 * 1.75)
    assert results["verdict"] == "GO"
    assert (tmp_path / "bin" / "all_reduce_perf.args").read_text().split()[1:] == [
        "-b", "8192", "-e", "1073741824", "-f", "2", "-g", "8", "-n", "20", "-w", "5"]


# ---------------------------------------------------------------------------------------------- torch, gloo
def test_torch_benchmark_two_ranks_and_one_rank(tmp_path):
    steps = ("      - {name: c2, kind: comm, iters: 3, warmup: 1, min_bytes: 4096, max_bytes: 131072}\n"
             "      - {name: c1, kind: comm, nproc_per_node: 1, kinds: [all_reduce, broadcast], iters: 2, "
             "sizes: [4096, 65536], compute_ms: 5}")
    rb = load_runbook(_runbook(tmp_path, steps, "c2.all_reduce.busbw_gbps.max > 0 and c2.broadcast.sizes >= 6"))
    run_dir = tmp_path / "run"
    results = Runner(rb, run_dir, RunOptions(cwd=REPO)).run()
    two, one = results["steps"]["c2"], results["steps"]["c1"]
    assert two["status"] == "passed" and one["status"] == "passed", (two["reason"], one["reason"])
    m = two["metrics"]
    assert (m["world_size"], m["backend"], m["source"], m["device_name"]) == (2, "gloo", "torch", "cpu")
    assert set(comm_kind.tables(m)) == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    for kind, table in comm_kind.tables(m).items():
        assert [r["bytes"] for r in table] == [4096 * 2 ** i for i in range(6)], kind
        for r in table:
            assert r["time_s"] > 0
            assert r["busbw_gbps"] == pytest.approx(r["bytes"] / r["time_s"] / 1e9 * bus_factor(kind, 2))
        assert m[kind]["latency_us"] == pytest.approx(table[0]["time_s"] * 1e6) and m[kind]["sizes"] == 6
    assert "note" not in m
    # each launch sampled (telemetry.csv): on a busy machine the bandwidth criterion is inconclusive, naming it
    assert two["interference"]["measured"] == 1 and one["interference"]["measured"] == 1
    if results["verdict"] != "GO":
        (crit,) = results["acceptance"]
        assert results["verdict"] == "INCOMPLETE" and two["interference"]["disturbed"], results["verdict_reason"]
        assert crit["status"] == "inconclusive" and "was disturbed: " in crit["detail"], crit
    assert json.loads((run_dir / "c2" / "comm.json").read_text())["threads"] >= 1

    m1 = one["metrics"]
    assert m1["world_size"] == 1 and "nothing between ranks" in m1["note"]
    assert all(r["busbw_gbps"] == 0 for r in m1["all_reduce"]["table"])
    assert [r["bytes"] for r in m1["broadcast"]["table"]] == [4096, 65536] and m1["compute_ms"] == 5
    kind = comm_kind.Comm()
    assert kind.summary_line(kind.read(one)).startswith(" (2 collectives x 2 sizes, gloo, 1 rank")

    written = write_reports(run_dir, results)
    assert run_dir / "plots" / "comm_c2.png" in written and run_dir / "plots" / "comm_c1.png" in written
    md = (run_dir / "report.md").read_text()
    assert "| size | time (us) | algbw (GB/s) | busbw (GB/s) |" in md and "| 128 KiB |" in md
    assert "**Peak all-reduce bus bandwidth**" in md and "Note: one rank: the collectives move nothing" in md
    html = (run_dir / "report.html").read_text()
    assert "<th>busbw (GB/s)</th>" in html


def test_size_text():
    assert [comm_kind.size_text(b) for b in (4096, 1 << 20, 3 << 30, 1500, None)] == [
        "4 KiB", "1 MiB", "3 GiB", "1500 B", "n/a"]
