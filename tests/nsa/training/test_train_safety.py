"""Resume, stops, stack dumps, deliberate faults and the watchdog, on real trainer processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import yaml

from train_utils import (REPO, TINY, clean_env, final_params, finish, heartbeats, kill_group, last_step, pid_alive,
                         read_csv, run, start, wait_for)


def _config(tmp_path, **train):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update(train)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _step_losses(out_dir, rank=0):
    """step -> loss from the heartbeats (full float precision), last record per step."""
    return {h["step"]: h["loss"] for h in heartbeats(out_dir, rank) if h["msg"] == "step"}


def test_stop_and_resume_reproduces_the_uninterrupted_run_bitwise(tmp_path):
    cfg = _config(tmp_path, steps=8, save_every=3, batch_size=2)
    code, out = run(tmp_path / "full", config=cfg)
    assert code == 0, out[-3000:]
    # the same run, crashed at step 5 (after the checkpoint of step 3), then resumed
    code, out = run(tmp_path / "cut", config=cfg, env={"NSA_FAULT": "crash@5"})
    assert code == 1 and "NSA_FAULT injected crash at step 5" in out
    status = json.loads((tmp_path / "cut" / "status.json").read_text())
    assert status["status"] == "crashed" and "InjectedCrash" in status["reason"]
    assert "InjectedCrash" in (tmp_path / "cut" / "error_rank0.txt").read_text()
    assert [int(r["step"]) for r in read_csv(tmp_path / "cut" / "training.csv")] == [1, 2, 3, 4]
    code, out = run(tmp_path / "cut", "--resume", config=cfg)
    assert code == 0, out[-3000:]
    assert "resumed from" in out and "step_00000003" in out
    full, cut = _step_losses(tmp_path / "full"), _step_losses(tmp_path / "cut")
    assert sorted(cut) == list(range(1, 9))
    assert cut == full  # bitwise: the same float for every step, including steps 4..8 re-run after resume
    rows = read_csv(tmp_path / "cut" / "training.csv")
    assert [int(r["step"]) for r in rows] == list(range(1, 9))  # rows after the checkpoint were replaced
    a, b = final_params(tmp_path / "full"), final_params(tmp_path / "cut")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_sigterm_to_one_rank_mid_step_leaves_a_loadable_checkpoint_and_resume_matches_the_uninterrupted_run(
        tmp_path):
    """Preemption of a DDP run: SIGTERM reaches one rank (rank 1, not the one that writes the files) while steps are
    running. Every rank stops at the same step after finishing it, the checkpoint of that step is complete and
    loads, and `--resume` continues to the planned last step with the same loss at every step as a run that was
    never interrupted (bitwise) and training.csv rows 1..N exactly once."""
    from nsa.training import checkpoint
    from nsa.training.distributed import DistInfo
    from nsa.model import NSAModel
    from nsa.training.optim import build_adamw
    from nsa.training.config import load_config

    steps = 24
    cfg = _config(tmp_path, steps=steps, save_every=1000, batch_size=2, log_every=1000)
    ddp = ("--ddp", "1")
    full_dir, cut_dir = tmp_path / "full", tmp_path / "cut"
    reference = start(full_dir, *ddp, nproc=2, config=cfg)  # the uninterrupted run, alongside the cut one
    proc = start(cut_dir, *ddp, nproc=2, config=cfg)
    try:
        wait_for(lambda: last_step(cut_dir, 1) >= 4, 90, "rank 1 at step 4", proc)
        worker = heartbeats(cut_dir, 1)[0]["pid"]
        t_signal = time.time()
        os.kill(worker, signal.SIGTERM)
        code, out = finish(proc, 90)
        ref_code, ref_out = finish(reference, 90)
    finally:
        kill_group(proc)
        kill_group(reference)
    assert ref_code == 0, ref_out[-3000:]
    assert code == 0, out[-3000:]  # a requested stop is a clean exit of every rank, so torchrun's too

    status = json.loads((cut_dir / "status.json").read_text())
    # rank 0 only learns that some rank was signalled (the stop vote is a count); rank 1 names the signal
    assert status["status"] == "terminated" and "signal" in status["reason"], status
    assert any(h["msg"] == "stop" and "SIGTERM" in (h.get("reason") or "") for h in heartbeats(cut_dir, 1))
    stop = status["step"]
    assert 4 <= stop < steps, f"stopped at step {stop}: the signal did not land while steps were running"
    # the signal came while a step was in flight (between two step records of rank 1); that step, or at the
    # latest the next one (a signal after the step's stop vote), is finished and is the last
    step_ts = {h["step"]: h["ts"] for h in heartbeats(cut_dir, 1) if h["msg"] == "step"}
    in_flight = min(s for s, ts in step_ts.items() if ts >= t_signal)
    assert step_ts[in_flight - 1] < t_signal, "the signal arrived before the step records started"
    assert stop in (in_flight, in_flight + 1), (stop, in_flight)
    for rank in (0, 1):
        last = heartbeats(cut_dir, rank)[-1]
        assert last["msg"] == "stop" and last["step"] == stop and last["status"] == "terminated", last
    assert [int(r["step"]) for r in read_csv(cut_dir / "training.csv")] == list(range(1, stop + 1))

    # the checkpoint of the stop step is complete (the only one: save_every is beyond the run) and loads
    ckpt = checkpoint.latest_checkpoint(cut_dir)
    assert ckpt is not None and ckpt.name == f"step_{stop:08d}", ckpt
    assert not list((cut_dir / "checkpoints").glob("*.tmp"))
    run_cfg = load_config(cut_dir / "config.yaml")
    for rank in (0, 1):
        torch.manual_seed(12345)  # weights unlike the checkpoint's until it is loaded
        net = NSAModel(run_cfg.model)
        opt = build_adamw(net, run_cfg.train.lr, run_cfg.train.weight_decay,
                          (run_cfg.train.beta1, run_cfg.train.beta2), False)
        info = DistInfo(rank=rank, world_size=2, local_rank=rank, device=torch.device("cpu"), backend=None)
        step, data_state = checkpoint.load(ckpt, net, opt, info, scaler=None)
        assert step == stop and data_state
        saved = torch.load(ckpt / "model_optim.pt", map_location="cpu", weights_only=False)["model"]
        assert all(torch.equal(p, saved[k]) for k, p in net.state_dict().items())
        assert all(torch.isfinite(p).all() for p in net.parameters())
        assert len(opt.state) == len(list(net.parameters()))  # AdamW moments restored for every parameter

    code, out = run(cut_dir, *ddp, "--resume", nproc=2, config=cfg, timeout=90)
    assert code == 0, out[-3000:]
    assert f"resumed from {ckpt}" in out and f"(step {stop})" in out
    status = json.loads((cut_dir / "status.json").read_text())
    assert status["status"] == "completed" and status["step"] == steps
    full, cut = _step_losses(full_dir), _step_losses(cut_dir)
    assert sorted(full) == sorted(cut) == list(range(1, steps + 1))
    assert cut == full  # bitwise, the steps after the resume included
    assert [int(r["step"]) for r in read_csv(cut_dir / "training.csv")] == list(range(1, steps + 1))
    a, b = final_params(full_dir), final_params(cut_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_nan_on_one_rank_stops_every_rank_with_the_reason(tmp_path):
    cfg = _config(tmp_path, steps=6)
    code, out = run(tmp_path / "nan", "--ddp", "1", nproc=2, config=cfg, env={"NSA_FAULT": "nan@3:1"})
    assert code != 0
    status = json.loads((tmp_path / "nan" / "status.json").read_text())
    assert status["status"] == "nonfinite" and "step 3" in status["reason"] and "1 of 2" in status["reason"]
    for rank in (0, 1):
        last = heartbeats(tmp_path / "nan", rank)[-1]
        assert last["msg"] == "stop" and last["step"] == 3, last
    assert heartbeats(tmp_path / "nan", 1)[-1]["local_loss"] is None  # NaN is written as null
    assert math_isfinite(heartbeats(tmp_path / "nan", 0)[-1]["local_loss"])
    assert [int(r["step"]) for r in read_csv(tmp_path / "nan" / "training.csv")] == [1, 2]


def math_isfinite(x) -> bool:
    return x is not None and x == x and abs(x) != float("inf")


def test_sigusr1_dumps_stacks_and_training_continues_then_halt_stops_cleanly(tmp_path):
    out_dir = tmp_path / "run"
    proc = start(out_dir, "--steps", "100000", "--log-every", "1000")
    try:
        wait_for(lambda: last_step(out_dir) >= 3, 60, "step 3", proc)
        os.kill(proc.pid, signal.SIGUSR1)
        dumps = wait_for(lambda: sorted(out_dir.glob("stackdump_rank0_*.txt")), 20, "a stack dump", proc)
        text = dumps[0].read_text()
        assert "rank 0" in text and "MainThread" in text and "nsa/training/trainer.py" in text
        at_dump = last_step(out_dir)
        wait_for(lambda: last_step(out_dir) >= at_dump + 3, 30, "steps after the dump", proc)
        assert (out_dir / "stackdump_rank0.txt").stat().st_size > 0  # the C-level (faulthandler) dump
        (out_dir / ".HALT").write_text("stop for the test")
        code, out = finish(proc, 60)
    finally:
        kill_group(proc)
    assert code == 0, out[-3000:]
    status = json.loads((out_dir / "status.json").read_text())
    assert status["status"] == "halted" and "stop for the test" in status["reason"]
    step = status["step"]
    assert int(read_csv(out_dir / "training.csv")[-1]["step"]) == step
    assert (out_dir / "checkpoints" / f"step_{step:08d}" / "meta.json").is_file()

    # a resumed run moves the old .HALT aside, continues from the checkpoint; SIGTERM saves and exits 0
    proc = start(out_dir, "--steps", "100000", "--log-every", "1000", "--resume")
    try:
        wait_for(lambda: last_step(out_dir) >= step + 2, 60, "steps after resume", proc)
        os.kill(proc.pid, signal.SIGTERM)
        code, out = finish(proc, 60)
    finally:
        kill_group(proc)
    assert code == 0, out[-3000:]
    assert (out_dir / ".HALT.prev").is_file() and not (out_dir / ".HALT").exists()
    status = json.loads((out_dir / "status.json").read_text())
    assert status["status"] == "terminated" and "SIGTERM" in status["reason"]
    assert (out_dir / "checkpoints" / f"step_{status['step']:08d}" / "meta.json").is_file()
    steps = [int(r["step"]) for r in read_csv(out_dir / "training.csv")]
    assert steps == list(range(1, status["step"] + 1))


def test_hang_is_detected_by_the_watchdog_and_ends_at_the_process_group_timeout(tmp_path):
    out_dir = tmp_path / "hang"
    cfg = _config(tmp_path, steps=50)
    proc = start(out_dir, "--ddp", "1", "--pg-timeout", "15", nproc=2, config=cfg, env={"NSA_FAULT": "hang@3:1"})
    try:
        wait_for(lambda: (out_dir / "heartbeat_rank1.jsonl").exists()
                 and heartbeats(out_dir, 1)[-1]["msg"] == "fault", 60, "the injected hang", proc)
        wd = subprocess.run([sys.executable, "-m", "nsa.training.watchdog", "--dir", str(out_dir), "--stall-after", "2",
                             "--include-earlier",
                             "--interval", "0.5", "--ranks", "2"], cwd=REPO, env=clean_env(),
                            capture_output=True, text=True, timeout=60)
        assert wd.returncode == 1, wd.stdout + wd.stderr
        halt = json.loads((out_dir / ".HALT").read_text())
        assert halt["by"] == "watchdog" and "1" in halt["reason"]
        # SIGUSR1 from the watchdog: the hung rank (sleeping in Python) dumps with its step
        dump = wait_for(lambda: sorted(out_dir.glob("stackdump_rank1_*.txt")), 20, "rank 1 stack dump", proc)
        assert "step 3" in dump[0].read_text() and "hang" in dump[0].read_text()
        # rank 0 is blocked inside the all-reduce (C code): only the faulthandler dump can show it
        wait_for(lambda: (out_dir / "stackdump_rank0.txt").exists()
                 and (out_dir / "stackdump_rank0.txt").stat().st_size > 0, 20, "rank 0 C-level dump", proc)
        pids = [heartbeats(out_dir, r)[0]["pid"] for r in (0, 1)]
        code, out = finish(proc, 120)
    finally:
        kill_group(proc)
    assert code != 0
    status = json.loads((out_dir / "status.json").read_text())
    assert status["status"] == "crashed"
    time.sleep(0.5)
    assert not any(pid_alive(p) for p in pids), "trainer processes left behind"


@pytest.mark.parametrize("argv, needle", [
    (["--config", "{bad_key}"], "train.stepz"),
    (["--config", "{tiny}", "--stepz", "3"], "unrecognized arguments: --stepz"),
    (["--config", "{tiny}", "--dataset", "text", "--data-path", "{missing}"], "does-not-exist"),
    (["--config", "{tiny}", "--precision", "fp8"], "--precision"),
    (["--config", "{nowhere}"], "config file not found"),
])
def test_user_errors_are_one_line_without_traceback(tmp_path, argv, needle):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"]["stepz"] = 3
    bad_key = tmp_path / "bad.yaml"
    bad_key.write_text(yaml.safe_dump(raw))
    subs = {"{bad_key}": str(bad_key), "{tiny}": str(TINY), "{missing}": str(tmp_path / "does-not-exist"),
            "{nowhere}": str(tmp_path / "nowhere.yaml")}
    argv = [subs.get(a, a) for a in argv]
    proc = subprocess.run([sys.executable, "-m", "nsa.training", "--out-dir", str(tmp_path / "o"), *argv], cwd=REPO,
                          env=clean_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert needle in err and err.startswith("nsa-train: error:")
    if argv[:1] == ["--config"] and "bad.yaml" in argv[1]:
        assert str(bad_key) in err


def test_bad_toggle_value_names_the_variable(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "nsa.training", "--config", str(TINY), "--out-dir", str(tmp_path)],
                          cwd=REPO, env=clean_env({"NSA_DDP_COMPRESS": "int8"}), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "NSA_DDP_COMPRESS" in proc.stderr and "bf16" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_ranks_stop_with_a_checkpoint_when_their_torchrun_agent_is_killed(tmp_path):
    """SIGKILL of the torchrun agent (what the orchestrator does to it when it dies itself): every rank gets its
    own SIGTERM (parent-death signal), stops at its next step with a checkpoint, and no rank runs on alone."""
    cfg = _config(tmp_path, steps=100000, save_every=100000, batch_size=2, log_every=1000)
    out = tmp_path / "out"
    proc = start(out, "--ddp", "1", nproc=2, config=cfg)
    try:
        wait_for(lambda: last_step(out, 1) >= 3, 90, "rank 1 at step 3", proc)
        ranks = [heartbeats(out, r)[0]["pid"] for r in (0, 1)]
        os.kill(proc.pid, signal.SIGKILL)  # the agent only; its ranks are in sessions of their own
        proc.wait(10)
        wait_for(lambda: not any(pid_alive(p) for p in ranks), 60, "both ranks to exit")
    finally:
        kill_group(proc)
        for pid in ranks if "ranks" in locals() else []:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "terminated", status
    stopped = status["step"]
    assert (out / "checkpoints" / f"step_{stopped:08d}").is_dir()
