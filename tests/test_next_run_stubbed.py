"""reports/gpu/next_run.sh run with stub commands (python3's benchmarks, nvidia-smi, compute-sanitizer): which steps
a call starts, what it refuses before starting anything, and which launch choices its K4 A/B passes on to their
numerics and memcheck (K5), from hand-made bench_choices JSON whose verdicts are known."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "reports" / "gpu" / "next_run.sh"


def _stubs(tmp: Path, bench_exit: int = 0) -> Path:
    """python3 that records its command and exits `bench_exit` (writing nothing), the script's inline Python (`-`)
    run by this interpreter; nvidia-smi and compute-sanitizer that record and exit 0."""
    stub = tmp / "bin"
    stub.mkdir()
    trace = tmp / "trace.txt"
    (stub / "python3").write_text(f'#!/bin/bash\necho "python3 $*" >> "{trace}"\n'
                                  f'case "$1" in -) exec "{sys.executable}" "$@";; esac\nexit {bench_exit}\n')
    for name in ("nvidia-smi", "compute-sanitizer"):
        (stub / name).write_text(f'#!/bin/bash\necho "{name} $*" >> "{trace}"\nexit 0\n')
    for path in stub.iterdir():
        path.chmod(0o755)
    return stub


def _call(tmp: Path, stub: Path, budget: str = "100000", part: str = "kernels") -> subprocess.CompletedProcess:
    env = {**os.environ, "PART": part, "BUDGET": budget, "OUT": str(tmp / "out"), "W": str(tmp / "w"),
           "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DRY", None)
    return subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_an_ab_process_that_records_nothing_is_not_started_again_for_each_resume(tmp_path):
    """bench_choices that exits 1 before its JSON exists (refused options, the layer out of memory, no CUDA): a
    resume would fail the same way, so the shape's A/B is not started twelve more times (each a process start,
    torch's import and the layer's build on the GPU machine)."""
    proc = _call(tmp_path, _stubs(tmp_path, bench_exit=1))
    assert proc.returncode == 0, proc.stderr
    log = (tmp_path / "out" / "log.txt").read_text()
    runs = [line for line in (tmp_path / "trace.txt").read_text().splitlines() if "bench_choices.py" in line]
    assert len(runs) == 3, runs  # K3's layer A/B, then one process per shape of K4
    assert "K4_choices_65536b1 exit 1" in log and "K4_choices_2048b8 exit 1" in log
    assert "_resume" not in log


def test_a_budget_that_is_not_whole_seconds_is_refused_before_anything_runs(tmp_path):
    stub = _stubs(tmp_path)
    for budget in ("9m", "abc", "-5", "0", "5 0"):
        proc = _call(tmp_path, stub, budget=budget)
        assert proc.returncode == 2 and f"BUDGET={budget}: expected" in proc.stderr, (budget, proc.stderr)
        assert not (tmp_path / "trace.txt").exists(), budget  # not even nvidia-smi
        assert not (tmp_path / "out" / "log.txt").exists()


def _verdicts(baseline_losses=(1.0,)) -> dict:
    """A bench_choices arm record with a verdict and one round per baseline loss given (the baseline block's loss)."""
    t = {"min": .01, "median": .01, "max": .01}
    block = {"times_s": {m: t for m in ("fwd", "bwd", "fwdbwd")}, "grad_norm": 1.0}
    return [{"round": i + 1, "baseline": {**block, "loss": loss}, "arm": {**block, "loss": 1.0},
             "ratio": {"fwdbwd": 1.0}} for i, loss in enumerate(baseline_losses)]


def _choices_file(path: Path, seq_len: int, batch: int, arms: dict, baseline_losses=(1.0,)) -> None:
    records = {}
    for name, what in arms.items():
        rec = {"settings": {}, "rounds": _verdicts(baseline_losses)}
        if what == "A/A":
            rec.update(note="the same choices in effect as the baseline: an A/A comparison", verdict="mixed")
        elif what.startswith("error"):
            rec["error"] = what
        else:
            rec["verdict"] = what
        records[name] = rec
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"bench": "choices", "seq_len": seq_len, "batch": batch, "baseline": "shipped",
                                "arm_settings": {"shipped": {}, **{a: {} for a in arms}}, "arms": records,
                                "in_progress": None}))


def _winners(tmp: Path) -> str:
    proc = _call(tmp, _stubs(tmp))
    assert proc.returncode == 0, proc.stderr
    log = (tmp / "out" / "log.txt").read_text()
    assert "DONE K4_choices_65536b1" in log and "DONE K4_choices_2048b8" in log  # the files given, not measured
    return next(line for line in log.splitlines() if "choices faster in every round:" in line).split(": ", 1)[1]


def test_a_choice_that_failed_at_one_shape_is_not_qualified_for_its_time_at_the_other(tmp_path):
    """K4's rule: faster in every round at one shape, neither slower in every round nor failed at the other. dq_query's
    outputs were not the shipped kernels' at 2,048 B 8: it computes something else there, and its speed at 65,536
    qualifies nothing; host_fused is slower in every round at 2,048; the A/A arm is never a candidate."""
    k = tmp_path / "w" / "kernels"
    _choices_file(k / "choices_65536b1.json", 65536, 1, {
        "shipped_again": "A/A", "dq_query": "faster in every round", "out_partial": "faster in every round",
        "host_fused": "faster in every round", "tile_m64_w4": "mixed"})
    _choices_file(k / "choices_2048b8.json", 2048, 8, {
        "shipped_again": "A/A", "dq_query": "error OutputsDiffer: round 1: loss 1.3 against the baseline's 1",
        "out_partial": "mixed", "host_fused": "slower in every round", "tile_m64_w4": "faster in every round"})
    assert _winners(tmp_path) == "out_partial tile_m64_w4"


def test_a_file_whose_baseline_outputs_changed_unsaid_qualifies_nothing(tmp_path):
    """A run cut before bench_choices' own end-of-run check leaves a change of the baseline's outputs unsaid in its
    file (no baseline_outputs_changed): its blocks' losses, 1.0 then 1.5, show memory overwritten during the run, so
    tile_m64_w4's "faster in every round" at 2,048 holds nothing (ab_table marks every arm of it incomplete)."""
    k = tmp_path / "w" / "kernels"
    _choices_file(k / "choices_65536b1.json", 65536, 1, {"dq_query": "faster in every round",
                                                         "tile_m64_w4": "mixed"})
    _choices_file(k / "choices_2048b8.json", 2048, 8, {"dq_query": "mixed", "tile_m64_w4": "faster in every round"},
                  baseline_losses=(1.0, 1.5))
    assert _winners(tmp_path) == "dq_query"


def test_folders_with_a_space_in_their_names_hold_every_steps_output(tmp_path):
    """$W and $OUT with a space: each step runs its own command (not the second half of a split folder name), its
    output lands in $W/kernels, and $OUT holds the part's archive of that folder, nothing else beside the logs."""
    import tarfile

    stub = _stubs(tmp_path)
    w, out = tmp_path / "w w", tmp_path / "o ut"
    env = {**os.environ, "PART": "kernels", "BUDGET": "100000", "OUT": str(out), "W": str(w),
           "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
    env.pop("DRY", None)
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    log = (out / "log.txt").read_text()
    assert "K3_topk_ab exit 0" in log and "K2_gpu_kernels exit 0" in log, log
    assert sorted(p.name for p in out.iterdir()) == ["env.txt", "kernels.tgz", "log.txt"]
    assert {"K3_topk_ab.txt", "K2_gpu_kernels.txt", ".K3_topk_ab.ok"} <= {p.name for p in (w / "kernels").iterdir()}
    with tarfile.open(out / "kernels.tgz") as tar:
        assert "kernels/K2_gpu_kernels.txt" in tar.getnames()
    assert f"--json {w}/kernels/topk_ab.json" in (tmp_path / "trace.txt").read_text()


def test_a_shape_whose_a_a_arm_came_out_one_way_in_every_round_qualifies_nothing(tmp_path):
    """The A/A arm (the shipped kernels against themselves) is the noise floor: one that is "faster in every round"
    (1 in 512 by chance) says the shape's rounds favour a side, so no choice qualifies on that shape's verdicts."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from ab_table import qualifying_choices

    def shape(path, aa_verdict):
        arms = {"shipped": {"rounds": []},
                "shipped_again": {"note": "the same choices in effect as the baseline: an A/A comparison",
                                  "verdict": aa_verdict},
                "dq_query": {"verdict": "faster in every round"}}
        path.write_text(json.dumps({"bench": "choices", "arms": arms}))
        return path

    quiet = shape(tmp_path / "a.json", "mixed")
    assert qualifying_choices([quiet]) == ["dq_query"]
    biased = shape(tmp_path / "b.json", "faster in every round")
    assert qualifying_choices([biased]) == []
    assert qualifying_choices([shape(tmp_path / "c.json", "slower in every round")]) == []


def test_a_call_whose_steps_all_ran_before_still_returns_its_parts_archive(tmp_path):
    """Each device call starts with an empty $OUT on the warm machine ($W kept): a second call whose steps are all
    DONE must still hand back the part's folder as one whole archive (before, only a step that ran wrote it)."""
    import tarfile

    stub = _stubs(tmp_path)
    first = _call(tmp_path, stub, part="trainer")
    assert first.returncode == 0, first.stderr
    (tmp_path / "out").rename(tmp_path / "out_first")  # the next call's $OUT is a new, empty folder
    second = _call(tmp_path, stub, part="trainer")
    assert second.returncode == 0, second.stderr
    log = (tmp_path / "out" / "log.txt").read_text()
    assert "DONE T" in log and "(limit " not in log  # nothing ran again
    with tarfile.open(tmp_path / "out" / "trainer.tgz") as archive:
        assert any(name.startswith("trainer/") for name in archive.getnames())
    assert not list((tmp_path / "out").glob(".*.part"))  # written under another name, then renamed
