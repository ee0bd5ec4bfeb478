"""benchmarks/ab_table.py: the A/B files of a GPU run (bench_attention.py's JSON, one per arm, round and case, as
reports/gpu/next_run.sh names them) reduced to one verdict per choice, and the steps next_run.sh's log.txt says
failed or were skipped. The JSON comes from bench_attention.main itself (one tiny CPU case, in this process), and
the log from next_run.sh itself (its python3 replaced by one that exits 3), so that a change of either format fails
here."""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import pytest

from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]
ab = load("ab_table")


@pytest.fixture(scope="module")
def bench_json(tmp_path_factory) -> dict:
    """bench_attention.py's --json of one case (nsa-torch, S 64, CPU), run in this process."""
    bench = load("bench_attention")
    out = tmp_path_factory.mktemp("bench") / "one.json"
    spawn = bench.spawn
    bench.spawn = lambda path, s, args: bench.run_case(path, args.shape, s, args.device, args.dtype, args.repeats,
                                                       args.warmup, batch=args.batch)
    try:
        assert bench.main(["--device", "cpu", "--shape", "small", "--paths", "nsa-torch", "--seq-lens", "64",
                           "--repeats", "1", "--warmup", "0", "--json", str(out)]) == 0
    finally:
        bench.spawn = spawn
    return json.loads(out.read_text())


def _write(folder: Path, name: str, data: dict, scale: float | None) -> None:
    """data with every time multiplied by scale (None: the case failed, as bench_attention records it)."""
    data = copy.deepcopy(data)
    case = data["results"][0]
    if scale is None:
        data["results"] = [{"path": case["path"], "seq_len": case["seq_len"], "error": "exit 1: boom"}]
    else:
        for stats in case["times_s"].values():
            for key in stats:
                stats[key] *= scale
    (folder / name).write_text(json.dumps(data))


def test_each_choice_gets_its_rounds_and_one_verdict(tmp_path, bench_json, capsys):
    arms = {  # (label, case): {arm: [scale of round 1, round 2]}
        ("layer", "65536"): {"shipped": [1.0, 1.0], "auto": [0.8, 0.9]},
        ("query-choice_bn32", "2048b8"): {"shipped": [1.0, 1.0], "new": [1.1, 0.95]},
        ("query-choice_m64", "2048b8"): {"shipped": [1.0, 1.0], "new": [1.2, 1.05]},
        ("sel-dq-choice_query", "65536b1"): {"shipped": [1.0, 1.0], "new": [0.7, None]},
        ("sel-out-choice_partial", "65536b1"): {"shipped": [1.0], "new": [0.7, 0.7]},
    }
    for (label, case), by_arm in arms.items():
        for arm, scales in by_arm.items():
            for r, scale in enumerate(scales, 1):
                _write(tmp_path, f"{label}_{arm}_r{r}_{case}.json", bench_json, scale)
    (tmp_path / "notes.json").write_text("{}")  # not an A/B file: ignored
    records = {(r["label"], r["case"]): r for r in ab.comparisons(tmp_path, ("shipped", "sort"))}
    assert set(records) == set(arms)
    layer = records[("layer", "65536")]
    assert (layer["baseline"], layer["choice"], layer["verdict"]) == ("shipped", "auto", "faster in every round")
    assert [r["ratio"]["fwdbwd"] for r in layer["rounds"]] == pytest.approx([0.8, 0.9])
    assert layer["rounds"][0]["choice_ms"]["fwd"] == pytest.approx(
        0.8 * bench_json["results"][0]["times_s"]["fwd"]["median"] * 1e3)
    assert records[("query-choice_bn32", "2048b8")]["verdict"] == "mixed"
    assert records[("query-choice_m64", "2048b8")]["verdict"] == "slower in every round"
    assert records[("sel-dq-choice_query", "65536b1")]["verdict"] == "incomplete"  # round 2 of the choice failed
    assert records[("sel-out-choice_partial", "65536b1")]["verdict"] == "incomplete"  # no baseline in round 2

    out = tmp_path / "ab.json"
    assert ab.main([str(tmp_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "| layer | 65536 | auto vs shipped | 2 |" in text and "**faster in every round** (by chance 1 in 4: 2 rounds)" in text
    assert "reproduce: python benchmarks/ab_table.py" in text
    assert len(json.loads(out.read_text())["comparisons"]) == len(arms)


def test_the_baseline_is_the_first_named_arm_present(tmp_path, bench_json):
    for arm, scale in (("sort", 1.0), ("topk", 0.5)):
        _write(tmp_path, f"layer_{arm}_r1_65536.json", bench_json, scale)
    (rec,) = ab.comparisons(tmp_path, ("shipped", "sort"))
    assert (rec["baseline"], rec["choice"]) == ("sort", "topk")
    assert ab.comparisons(tmp_path, ("old",)) == []  # no baseline arm: not an A/B of this table


def test_failed_and_skipped_steps_come_from_next_run_logs(tmp_path):
    """next_run.sh itself, its python3 a stub that exits 3, compute-sanitizer absent: every step it runs exits
    non-zero, and under a budget of 110 s the steps that need 200 s are skipped; ab_table lists both kinds."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text("#!/bin/sh\nexit 3\n")
    (stub / "python3").chmod(0o755)
    out, work = tmp_path / "out", tmp_path / "w"
    env = {**os.environ, "PART": "trainer", "OUT": str(out), "W": str(work), "BUDGET": "110",
           "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DRY", None)
    proc = subprocess.run(["bash", str(ROOT / "reports" / "gpu" / "next_run.sh")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    trainer = work / "trainer"
    (out / "log.txt").replace(work / "log.txt")  # as the log comes back beside the untarred part folders
    problems = ab.step_problems(trainer)
    assert "T0_loss_tests: exit 3" in problems
    assert any(p.startswith("T0_loss_memcheck: exit ") and not p.endswith("exit 0") for p in problems)
    assert any(p.startswith("T1_dense_each_change: skipped (") for p in problems), problems  # needs 200 s


def test_bad_arguments_exit_2(tmp_path, capsys):
    for argv in ([str(tmp_path / "none")], [str(tmp_path), "--baseline", ","]):
        with pytest.raises(SystemExit) as exc:
            ab.main(argv)
        assert exc.value.code == 2
    assert ab.main([str(tmp_path)]) == 0
    assert "no A/B files" in capsys.readouterr().out
