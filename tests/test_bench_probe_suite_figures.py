"""bench_aa_compare, bench_validation and bench_ops: --recompare's A/B decisions follow the step's rule for an
unsteady winner (kept from interleaved repeats, dropped from one run each), a runbook that cannot load is refused
before any run, zero or negative --steps are refused, the printed reproduce commands run again as printed (a
--longrun --out directory that now holds a run; lengths given with spaces), and the long run's whole-file re-read
figure is printed at the precision of the bytes it is set against."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from benchmark_scripts import load

REPO = Path(__file__).resolve().parents[1]
CSV_HEAD = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"


# ------------------------------------------------------------------------------------------ bench_aa_compare
def _ab_run(run_dir: Path, levels: dict[str, list[float]], unsteady: set) -> dict:
    """A results.json holding aa_cpu's A/B step only: each arm's runs at the given tokens/s levels (+-1% per step),
    the (label, repeat) in `unsteady` recorded with throughput_stable false; no runbook noise declared."""
    runs = []
    for label, per_repeat in levels.items():
        for r, level in enumerate(per_repeat):
            rel = f"aa_ab/{label}_r{r + 1}/out/training.csv"
            values = [level * (1 + 0.01 * ((i % 3) - 1)) for i in range(16)]
            path = run_dir / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(CSV_HEAD + "".join(f"{i + 1},4.0,0.001,{v:.3f},{4096 / v:.6f},1.0,1.0,1.5\n"
                                               for i, v in enumerate(values)))
            runs.append({"label": label, "repeat": r, "status": "passed", "params": {},
                         "metrics": {"csv": rel, "window": {"last": 12, "warmup": 4},
                                     "toks_per_s": {"mean": sum(values[4:]) / 12, "n": 12},
                                     "throughput_stable": (label, r) not in unsteady,
                                     "interference": {"disturbed": False, "text": "quiet"}}})
    return {"runbook": {"name": "aa_cpu"}, "steps": {"aa_ab": {"name": "aa_ab", "kind": "ab", "runs": runs}}}


def test_recompare_keeps_a_paired_winner_whose_steps_varied_as_the_ab_step_does(tmp_path):
    """The ab step (validation/kinds/ab): with interleaved repeats a winner ahead in every repeat is kept even where
    one repeat's per-step throughput was unsteady; with one run per variant such a winner is not kept (the
    baseline is). torch at twice the baseline in both repeats, its second repeat unsteady: a (false) winner that
    the step would have reported, so --recompare must count it."""
    from validation.runbook.loader import load_runbook

    bench = load("bench_aa_compare")
    rb = load_runbook(REPO / "runbooks" / "aa_cpu.yaml")
    levels = {"baseline": [1000.0, 1100.0], "torch": [2000.0, 2210.0]}
    results = _ab_run(tmp_path / "paired", levels, {("torch", 1)})
    got = bench.redecide(results, tmp_path / "paired", rb)["aa_ab"]
    assert (got["winner"], got["choice"], got["significant"], got["recommendable"]) == ("torch", "torch", True, True)

    # one run per variant (block means of one run): the unsteady winner is not kept, the baseline is the choice
    text = (REPO / "runbooks" / "aa_cpu.yaml").read_text()
    marker = "variants: {torch: {env: {NSA_KERNEL: torch}}}\n        repeats: 2"
    assert marker in text
    single = tmp_path / "single.yaml"
    single.write_text(text.replace(marker, marker.replace("repeats: 2", "repeats: 1")))
    results = _ab_run(tmp_path / "single", {"baseline": [1000.0], "torch": [2000.0]}, {("torch", 0)})
    got = bench.redecide(results, tmp_path / "single", load_runbook(single))["aa_ab"]
    assert (got["winner"], got["choice"], got["significant"], got["recommendable"]) == (None, "baseline", False,
                                                                                        False)


@pytest.mark.parametrize("extra", [[], ["--recompare"]])
def test_a_runbook_that_cannot_load_is_refused_before_any_run(tmp_path, monkeypatch, capsys, extra):
    bench = load("bench_aa_compare")

    def no_run(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(bench, "real_run", no_run)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exc:
        bench.main(["--pairs", "1", "--slow-pairs", "0", "--runbook", str(tmp_path / "missing.yaml"),
                    "--out", str(out), *extra])
    assert exc.value.code == 2
    assert "--runbook" in (err := capsys.readouterr().err) and "runbook file not found" in err
    assert not out.exists()


# ------------------------------------------------------------------------------------------ bench_validation
@pytest.mark.parametrize("steps", ["0", "-5"])
def test_bench_validation_refuses_zero_or_negative_steps(monkeypatch, capsys, steps):
    bench = load("bench_validation")
    monkeypatch.setattr(bench, "longrun", lambda args: pytest.fail("the long run started"))
    with pytest.raises(SystemExit) as exc:
        bench.main(["--longrun", "--steps", steps])
    assert exc.value.code == 2 and "--steps" in capsys.readouterr().err


def test_bench_validation_longrun_reproduce_command_runs_again(tmp_path, monkeypatch, capsys):
    """After `--longrun --out DIR` the directory holds the run, and a run into it is refused: the printed command
    must start a new run with the same settings (--steps, --repeats, --runbook), not stop at that refusal."""
    bench = load("bench_validation")
    run_dir = tmp_path / "run"
    real_longrun = bench.longrun

    def first(args):  # the run, kept where --out says
        run_dir.mkdir()
        (run_dir / "results.json").write_text("{}")
        return {}

    monkeypatch.setattr(bench, "longrun", first)
    assert bench.main(["--longrun", "--steps", "150", "--repeats", "2", "--out", str(run_dir)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    prefix = "reproduce: python benchmarks/bench_validation.py "
    assert line.startswith(prefix)
    argv = shlex.split(line[len(prefix):])

    class Started(Exception):
        pass

    def run(cmd, **kwargs):
        raise Started(cmd)

    monkeypatch.setattr(bench, "longrun", real_longrun)
    monkeypatch.setattr(bench.subprocess, "run", run)
    with pytest.raises(Started) as started:
        bench.main(argv)
    cmd = started.value.args[0]
    assert cmd[cmd.index("--") + 1:][:2] == ["run", str(REPO / "runbooks" / "load_cpu.yaml")]
    assert "phases.longrun.steps.longrun.args.steps=150" in cmd and str(run_dir) not in cmd
    assert argv[argv.index("--repeats") + 1] == "2"


def test_bench_validation_whole_file_rereads_are_printed_at_the_reads_precision(capsys):
    bench = load("bench_validation")
    mb = 2**20
    stage = {"rows": 150, "runs": [0.1, 0.2], "seconds": bench.spread([0.1, 0.2]), "peak_rss_mb": 100.0}
    fig = {"verdict": "NO-GO", "step_status": "passed", "steps_logged": 150, "last_step": 150,
           "toks_per_s_mean": 6500.0, "training_csv_bytes": 13098, "heartbeat_files": 2, "heartbeat_bytes": 121554,
           "stdout_log_bytes": 45995, "wall_s": 14.5, "self_cpu_s": 2.9, "self_peak_rss_mb": 358.0,
           "children_cpu_s": 13.7, "children_peak_rss_mb": 405.0, "polling": {}, "heartbeat_opens": 16,
           "heartbeat_bytes_read": 49594, "heartbeat_full_reread_bytes": 432960, "metrics_stage": stage,
           "report_stage": {**stage, "plots": 1}, "report_cli_wall_s": 2.7}
    bench._print_longrun(fig)
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("heartbeat reads: "))
    assert f"{49594 / mb:.2f} MB read" in line  # 0.05
    assert line.endswith(f"whole-file re-reads at the same polls: {432960 / mb:.2f} MB")  # 0.41, not "0 MB"


# ------------------------------------------------------------------------------------------ bench_ops
@pytest.fixture
def ops_main(monkeypatch):
    """bench_ops.main over hand-made counters (90 ops at every length); the process-wide choices it sets are
    restored."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from nsa.attention import selection
    from nsa.attention.kernels.range_attn import host as range_host
    from nsa.attention.kernels.selected_attn import host as selected_host

    for module, name in ((selection, "TOPK_CHOICE"), (selected_host, "HOST_CHOICE"),
                         (selected_host, "FORCED_CHOICE"), (range_host, "GLUE_CHOICE")):
        monkeypatch.setattr(module, name, getattr(module, name))
    ops = load("bench_ops")
    seen: list[int] = []

    def count(layer, s, warmup=True):
        seen.append(s)
        c = ops.OpCounter()
        c.ops.update({"mm": 16, "add": 74})
        return c

    monkeypatch.setattr(ops, "make_layer", lambda **kw: kw)
    monkeypatch.setattr(ops, "count_layer", count)
    return ops, seen


def test_bench_ops_reproduce_line_runs_as_printed_with_spaced_lengths(ops_main, capsys):
    ops, seen = ops_main
    assert ops.main(["--seq-lens", "64, 128", "--topk-choice", "topk"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("reproduce: "))
    words = shlex.split(line[len("reproduce: "):])
    argv = words[words.index("benchmarks/bench_ops.py") + 1:]
    assert seen == [64, 128]
    seen.clear()
    assert ops.main(argv) == 0  # the command as printed: the same lengths and options
    again = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("reproduce: "))
    assert seen == [64, 128] and again == line and argv[argv.index("--topk-choice") + 1] == "topk"

