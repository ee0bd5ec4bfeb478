"""benchmarks/bench_train.py's runs under the conditions of a GPU session's step: a drift of the device over the run
(the order of the launches), a stop by SIGTERM (the `timeout` of next_run.sh's step: the case's trainer, in a session
of its own, ended with it, the runs measured so far kept in the JSON), a JSON left by an earlier call; and
benchmarks/ab_table.py's reading of the runs (a round whose runs all failed)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmark_scripts import load
from process_checks import pid_alive

bench = load("bench_train")
ab_table = load("ab_table")

COLUMNS = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb\n"
TOKENS = 1000  # tokens of one step


class Trainer:
    """bench_train.run_in_session for the cases: each launch's steps take `base_s` x (1 + drift x launches before
    it), the device slowing down over the run; `on_launch(n, out_dir)` is called at the n-th launch (1-based)."""

    def __init__(self, root, drift=0.0, on_launch=None):
        self.root, self.drift, self.on_launch, self.launches = root, drift, on_launch, []

    def __call__(self, cmd, cwd=None, env=None, timeout=None):
        out = self.root / cmd[cmd.index("--out-dir") + 1]
        steps = int(cmd[cmd.index("--steps") + 1])
        self.launches.append(out.name)
        if self.on_launch:
            self.on_launch(len(self.launches), out)
        out.mkdir(parents=True, exist_ok=True)
        dt = 0.001 * (1 + self.drift * (len(self.launches) - 1))
        rows = [f"{i},3.0,0.001,{TOKENS / dt!r},{dt!r},1.0,0.1,0.2\n" for i in range(1, steps + 1)]
        (out / "training.csv").write_text(COLUMNS + "".join(rows))
        (out / "env.json").write_text(json.dumps({"flops_per_token": 1e6, "peak_flops": 1e12, "n_params": 1e6,
                                                  "device_name": "cpu", "attention_kernel": "torch"}))
        return type("Done", (), {"returncode": 0, "stdout": "", "stderr": ""})()


@pytest.fixture
def trainer(tmp_path, monkeypatch):
    monkeypatch.setattr(bench, "ROOT", tmp_path)
    monkeypatch.setattr(bench, "OUT", tmp_path / "artifacts")
    fake = Trainer(tmp_path)
    monkeypatch.setattr(bench, "run_in_session", fake)
    return fake


def test_a_drift_over_the_run_gives_two_identical_variants_no_every_round_verdict(trainer, tmp_path):
    """Two variants that are the same step, on a device 10% slower at each launch: no effect, so the table must not
    say "faster" or "slower in every round". Launched A B A B, B ran after A in both repeats and came out slower in
    both; with the second repeat reversed (A B B A) the drift is against B in one round and against A in the other."""
    trainer.drift = 0.1
    out = tmp_path / "ab.json"
    assert bench.main(["--quick", "--no-ddp", "--repeats", "2", "--variant", "a", "--variant", "b",
                       "--json", str(out)]) == 0
    (rec,) = ab_table.train_records(tmp_path, tmp_path / "ab.runs.json", ("a",))
    ratios = [r["ratio"]["time"] for r in rec["rounds"]]
    # launches 1.0, 1.1 in the first repeat; then b at 1.2 and a at 1.3: a's tokens/s over b's is 1.1 and 1.2 / 1.3
    assert ratios == pytest.approx([1.1, 1.2 / 1.3])
    assert rec["verdict"] == "mixed"


def test_the_json_of_an_earlier_call_is_replaced_before_the_first_case(trainer, tmp_path):
    out = tmp_path / "r.json"
    out.write_text(json.dumps([{"case": "tiny", "ranks": 1, "toks_per_s": 1.0, "runs": 1}]))
    out.with_suffix(".runs.json").write_text(json.dumps([{"case": "tiny", "toks_per_s": 1.0, "repeat": 0}]))
    seen = []
    trainer.on_launch = lambda n, _: seen.append((json.loads(out.read_text()),
                                                   json.loads(out.with_suffix(".runs.json").read_text())))
    assert bench.main(["--quick", "--no-ddp", "--json", str(out)]) == 0
    assert seen == [([], [])]  # while the first case ran, no figure of the earlier call stood for this one's


def test_sigterm_keeps_the_runs_measured_so_far_and_says_what_was_not(trainer, tmp_path, capsys):
    """`timeout` ends a step with SIGTERM (next_run.sh's T3 is 200 s for four compile cases): the two runs that
    finished are in the JSON, the case cut and the one after it are listed as not measured, and the exit is 143."""
    out = tmp_path / "r.json"
    before = signal.getsignal(signal.SIGTERM)

    def sigterm_at_third(n, _):
        if n == 3:
            handler = signal.getsignal(signal.SIGTERM)
            # with no handler of bench_train's, the signal would end the test process itself
            assert handler not in (signal.SIG_DFL, signal.SIG_IGN, None), "SIGTERM would end the run unwritten"
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.5)  # the handler runs here, in the case's call (run_in_session)
            raise AssertionError("SIGTERM did not stop the case")

    trainer.on_launch = sigterm_at_third
    code = bench.main(["--quick", "--no-ddp", "--models", "nsa,dense", "--modes", "eager,compile",
                       "--json", str(out)])
    assert code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before
    assert trainer.launches == ["tiny_x1", "tiny_dense_x1", "tiny+compile_x1"]
    rows = json.loads(out.read_text())
    assert [r["case"] for r in rows if "error" not in r] == ["tiny", "tiny_dense"]
    assert [r["toks_per_s"] for r in rows if "error" not in r] == pytest.approx([1e6, 1e6])
    assert [r["case"] for r in rows if "error" in r] == ["tiny+compile", "tiny_dense+compile"]
    assert all("not measured" in r["error"] and r["repeat"] == 0 for r in rows if "error" in r)
    assert len(json.loads(out.with_suffix(".runs.json").read_text())) == 2
    text = capsys.readouterr().out
    assert "| tiny | nsa | eager |" in text and "FAILED tiny+compile x1" in text


class Cut(Exception):
    """What a signal handler raises in the process running a case (bench_train's raises on SIGTERM)."""


def test_a_stopped_run_ends_its_case_whole_process_group(tmp_path):
    """The case runs in a session of its own (so that its timeout can end torchrun's workers): no signal sent to
    bench_train's process group reaches it, so a bench_train stopped while a case runs must end that session, or its
    trainer goes on using the device under the next step's measurements."""
    pids = tmp_path / "pids"
    script = ("import os, subprocess, sys, time\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\n"
              f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
              "time.sleep(30)\n")

    def alarm(signum, frame):
        raise Cut

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, 1.5)
    started = []
    try:
        with pytest.raises(Cut):
            bench.run_in_session([sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ), timeout=60)
        started = [int(p) for p in pids.read_text().split()]
        deadline = time.monotonic() + 5
        while any(map(pid_alive, started)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(map(pid_alive, started))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        for pid in started:  # left running by a bench_train that does not end them
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _run(variant, repeat, tps):
    return {"case": f"d+graphs@{variant}", "ranks": 1, "model": "dense", "mode": "graphs", "variant": variant,
            "seq_len": 2048, "batch": 8, "repeat": repeat, "toks_per_s": tps}


def test_a_round_whose_runs_all_failed_leaves_the_comparison_incomplete(tmp_path):
    """Three repeats; the new variant faster in the first two; in the third both runs failed (their summaries say
    the repeat). Two rounds of three decide nothing: "faster in every round" would read the failed round as absent."""
    runs = [_run("old", 0, 100.0), _run("new", 0, 110.0), _run("old", 1, 101.0), _run("new", 1, 111.0)]
    (tmp_path / "t.runs.json").write_text(json.dumps(runs))
    summaries = [{**_run(v, 2, None), "error": "boom"} for v in ("old", "new")]
    for s in summaries:
        del s["toks_per_s"]
    (tmp_path / "t.json").write_text(json.dumps(summaries))
    (rec,) = ab_table.train_records(tmp_path, tmp_path / "t.runs.json", ("old",))
    assert [r["round"] for r in rec["rounds"]] == [1, 2, 3]
    assert [r["ratio"].get("time") for r in rec["rounds"]] == pytest.approx([100 / 110, 101 / 111, None])
    assert "not measured" in rec["rounds"][2]["failed"]
    assert rec["verdict"] == "incomplete"


def test_next_run_measures_the_32k_target_before_the_other_long_context(tmp_path, capsys):
    """next_run.sh's T2 (PART=trainer) is four cases of ~25-30 s each under a 120 s limit: issue 32's target is NSA
    against the dense twin at 32,768 tokens, so those two cases run first, where a cut (its figures kept) spares them.
    """
    root = bench.ROOT
    env = {**os.environ, "PART": "trainer", "OUT": str(tmp_path / "out"), "W": str(tmp_path / "w"),
           "DRY": str(tmp_path / "argv"), "BUDGET": "100000"}
    proc = subprocess.run(["bash", str(root / "reports" / "gpu" / "next_run.sh")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    (argv_file,) = (tmp_path / "argv").glob("*_T2_long_context.argv")
    argv = argv_file.read_bytes().decode().split("\0")[:-1]
    assert argv[:2] == ["python3", "benchmarks/bench_train.py"]
    capsys.readouterr()
    assert bench.main([*argv[2:], "--dry-run"]) == 0
    cases = [line.split(":")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("m7c_")]
    assert cases[:2] == ["m7c_125m_s32768_bf16+graphs", "m7c_125m_s32768_bf16_dense+graphs"]
    assert len(cases) == 4
