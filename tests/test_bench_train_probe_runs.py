"""benchmarks/bench_train.py end to end without training: each case's `python -m nsa.training` is replaced by a
stand-in that writes the training.csv and env.json a run would, with step times chosen here, so that the run's
figure, the order of the launches, a failed case, the CPU modes and the printed command are checked against
hand-computed figures and the script's documented contract."""

from __future__ import annotations

import json
import os
import shlex

import pytest

from benchmark_scripts import load

bench = load("bench_train")

TOKENS = 1000  # tokens of one step
FPT = 1e6  # env.json's flops_per_token
PEAK = 1e12  # env.json's peak_flops
COLUMNS = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"


def _times(steps: int, warmup: int) -> list[float]:
    """Warm-up steps of 1 s, then 15 steps of 1 ms and the rest of 4 ms."""
    return [1.0] * warmup + [0.001] * 15 + [0.004] * (steps - warmup - 15)


class FakeTrainer:
    """bench_train.run_in_session for the cases: records each launch (its out_dir's name) and writes its files."""

    def __init__(self, root, times=_times, broken=()):
        self.root, self.times, self.broken, self.launches = root, times, broken, []

    def __call__(self, cmd, cwd=None, env=None, timeout=None):
        out = self.root / cmd[cmd.index("--out-dir") + 1]
        steps = int(cmd[cmd.index("--steps") + 1])
        self.launches.append(out.name)
        out.mkdir(parents=True, exist_ok=True)
        lines = [COLUMNS]
        for i, dt in enumerate(self.times(steps, 5), 1):
            lines.append(f"{i},3.0,0.001,{TOKENS / dt!r},{dt!r},1.0,0.1,0.2\n")
        if any(b in out.name for b in self.broken):
            lines[-1] = lines[-1][:8]  # the last row cut short, no newline
        (out / "training.csv").write_text("".join(lines))
        (out / "env.json").write_text(json.dumps({"flops_per_token": FPT, "peak_flops": PEAK, "n_params": 1e6,
                                                  "device_name": "cpu", "attention_kernel": "torch"}))
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "OUT", tmp_path / "artifacts")
    trainer = FakeTrainer(tmp_path)
    monkeypatch.setattr(bench, "run_in_session", trainer)
    return trainer


def test_run_figure_is_tokens_over_the_time_of_its_timed_steps(fake, tmp_path):
    assert bench.main(["--quick", "--no-ddp", "--json", str(tmp_path / "r.json")]) == 0
    (row,) = json.loads((tmp_path / "r.json").read_text())
    # 35 timed steps of 1,000 tokens: 15 of 1 ms and 20 of 4 ms, 0.095 s in all; the 5 warm-up steps excluded.
    # (The mean of the per-step rates, (15 x 1e6 + 20 x 250,000) / 35 = 571,429, is no throughput.)
    assert row["toks_per_s"] == pytest.approx(35_000 / 0.095)
    assert row["steady_steps"] == 35 and row["steps"] == 40
    assert row["mfu"] == pytest.approx(FPT * 35_000 / 0.095 / PEAK)
    assert row["achieved_tflops"] == pytest.approx(FPT * 35_000 / 0.095 / 1e12)


def test_a_run_without_steps_after_its_warm_up_fails_and_the_others_still_run(fake, tmp_path, capsys):
    fake.times = lambda steps, warmup: [0.001] * (warmup if steps == 40 else steps)  # the tiny case stops early
    code = bench.main(["--no-ddp", "--json", str(tmp_path / "r.json")])
    rows = json.loads((tmp_path / "r.json").read_text())
    assert code == 1
    assert [r["case"] for r in rows if "error" in r] == ["tiny"]
    assert [r["case"] for r in rows if "error" not in r] == ["m7c_125m_s2048"]
    assert "FAILED tiny x1" in capsys.readouterr().out


def test_a_training_csv_cut_short_is_a_failed_case_not_a_crash(fake, tmp_path):
    fake.broken = ("tiny",)
    code = bench.main(["--no-ddp", "--json", str(tmp_path / "r.json")])
    rows = json.loads((tmp_path / "r.json").read_text())
    assert code == 1
    assert {r["case"]: "error" in r for r in rows} == {"tiny": True, "m7c_125m_s2048": False}


def test_launches_alternate_the_models_and_the_repeats(fake):
    assert bench.main(["--quick", "--no-ddp", "--repeats", "2", "--models", "nsa,dense",
                       "--modes", "eager,compile"]) == 0
    one_round = ["tiny_x1", "tiny_dense_x1", "tiny+compile_x1", "tiny_dense+compile_x1"]
    # the second repeat in the reverse order: a drift over the run favours neither side of a pair in every repeat
    assert fake.launches == one_round + one_round[::-1]


def test_gpu_cases_put_the_two_models_of_a_mode_side_by_side():
    names = [c["name"] for c in bench.gpu_cases(["eager", "graphs"])]
    assert names == ["m7c_125m_s2048_bf16", "m7c_125m_s2048_bf16_dense", "m7c_125m_s2048_bf16+graphs",
                     "m7c_125m_s2048_bf16_dense+graphs"]


@pytest.mark.parametrize("argv, message", [
    (["--modes", "graphs"], "--modes graphs: CUDA graphs need --device cuda"),
    (["--modes", "eager,compile+graphs"], "CUDA graphs need --device cuda"),
    (["--contexts", "4096"], "--contexts needs --device cuda"),
])
def test_cpu_refuses_what_needs_cuda_before_any_case(fake, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        bench.main(["--quick", *argv])
    assert exc.value.code == 2 and not fake.launches
    assert message in capsys.readouterr().err


def test_cpu_runs_the_models_and_modes_asked_for(fake, capsys):
    assert bench.main(["--quick", "--dry-run", "--models", "dense", "--modes", "compile"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("tiny")]
    assert line.startswith("tiny_dense+compile: model dense, mode compile:")
    assert "--attention dense" in line and "--compile" in line


def test_cpu_fastest_mode_lines_keep_each_config_apart():
    def row(case, config, mode, tps):
        return {"case": case, "config": config, "ranks": 1, "runs": 1, "model": "nsa", "mode": mode,
                "variant": "", "seq_len": None, "batch": None, "toks_per_s": tps, "attention_kernel": "torch"}
    rows = [row("tiny", "configs/tiny.yaml", "eager", 9000.0), row("big", "configs/big.yaml", "eager", 40.0),
            row("tiny+compile", "configs/tiny.yaml", "compile", 12000.0),
            row("big+compile", "configs/big.yaml", "compile", 30.0)]
    fastest = [x for x in bench.comparisons(rows) if ": fastest " in x]
    assert len(fastest) == 2
    assert any("configs/tiny.yaml" in x and "fastest compile (12,000 tokens/s" in x for x in fastest)
    assert any("configs/big.yaml" in x and "fastest eager (40 tokens/s" in x for x in fastest)


def test_reproduce_line_runs_the_same_cases_again(fake, capsys, monkeypatch):
    monkeypatch.setenv("NSA_OPT_FUSED", "0")
    argv = ["--quick", "--dry-run", "--variant", "a:NSA_ROPE=fused, NSA_LOSS=chunked"]
    assert bench.main(argv) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("reproduce: "))
    words = shlex.split(line[len("reproduce: "):])
    assert words == ["NSA_OPT_FUSED=0", "python", "benchmarks/bench_train.py", *argv]


def test_a_case_past_its_timeout_ends_its_whole_process_group(tmp_path):
    """A case's process and the children it started (torchrun's workers) are ended at the timeout, the children too,
    and the timeout is reported at once: subprocess.run's timeout killed the direct child only, and then waited for
    a child still holding the output pipe (here 30 s)."""
    import subprocess
    import sys
    import time

    from process_checks import pid_alive

    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
              "time.sleep(30)\n")
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        bench.run_in_session([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ), timeout=2,
                             grace_s=1)
    assert time.monotonic() - t0 < 15
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pid_alive(child)
