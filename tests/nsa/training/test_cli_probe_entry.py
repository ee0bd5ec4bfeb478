"""nsa-train's entry point (nsa.training.cli) as a user meets it: an empty --config, a stdout nobody reads any more
(`nsa-train ... | head -1`), a Ctrl-C while the trainer imports torch, and the end of the process (its exit code and
last output kept without the interpreter's teardown)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from nsa.training import cli, flags
from nsa.training.config import ConfigError
from train_utils import REPO, TINY, clean_env, read_csv


def _small_config(tmp_path: Path, steps: int) -> Path:
    """tiny_cpu.yaml cut to a few short steps (seconds on a CPU), every step logged."""
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update(steps=steps, seq_len=64, batch_size=1, log_every=1, warmup_steps=1)
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize("environ", [{}, {"CONFIG": str(TINY)}], ids=["no-CONFIG", "CONFIG-set"])
def test_an_empty_config_path_is_refused_not_replaced_by_another_config(monkeypatch, environ):
    """`--config "$CFG"` with CFG unset gave --config "": it was taken for no --config, and the run trained $CONFIG
    or the default 125M production config (configs/m7c_125m_2xa100_production.yaml) without a word."""
    monkeypatch.chdir(REPO)  # where the default config is
    args = flags.build_parser().parse_args(["--config", ""])
    with pytest.raises(ConfigError, match="--config: an empty path"):
        cli.resolve_config(args, environ)


def test_an_empty_config_path_exits_2_naming_the_flag(monkeypatch, capsys):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("CONFIG", raising=False)
    assert cli.main(["--config", "", "--steps", "0"]) == flags.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("nsa-train: error: --config: an empty path") and len(err.splitlines()) == 1, err


def test_a_stdout_nobody_reads_is_dropped_and_the_run_completes(tmp_path):
    """stdout is a pipe whose reader has gone (`nsa-train ... | head -1`): the run trains to its end, exit 0, and
    stderr stays empty (logging printed "--- Logging error ---" and a traceback there for every line logged)."""
    out = tmp_path / "out"
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout fails with EPIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "nsa.training", "--config", str(_small_config(tmp_path, 3)),
                               "--out-dir", str(out)], cwd=REPO, env=clean_env(), stdout=write_end,
                              stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write_end)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Logging error" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    status = json.loads((out / "status.json").read_text())
    assert (status["status"], status["step"]) == ("completed", 3)
    assert [row["step"] for row in read_csv(out / "training.csv")] == ["1", "2", "3"]


# A Ctrl-C at the moment torch imports numpy (inside torch's own import): the finder raises SIGINT there, as a
# terminal would; SIGINT gets Python's handler first, as in an interactive shell (a background job ignores it).
CTRL_C_AT_NUMPY = """\
import importlib.abc, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)

class CtrlC(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "numpy":
            sys.meta_path.remove(self)
            print("SIGINT while importing numpy", file=sys.stderr, flush=True)
            signal.raise_signal(signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["nsa-train", *sys.argv[1:]]
from nsa.training.cli import console_main
console_main()
"""


def test_ctrl_c_while_the_trainer_imports_torch_stops_it_before_anything_runs(tmp_path):
    """torch turns an exception raised while it imports numpy into a warning: the KeyboardInterrupt of that Ctrl-C
    was lost and the run trained to its end (exit 0), or crashed later on a half-imported numpy. It is held until
    the imports finish and then raised: the process ends by SIGINT with no out_dir made."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", CTRL_C_AT_NUMPY, "--config", str(_small_config(tmp_path, 2)),
                           "--out-dir", str(out)], cwd=REPO, env=clean_env(), capture_output=True, text=True,
                          timeout=120)
    if "SIGINT while importing numpy" not in proc.stderr:
        pytest.skip("numpy was not imported while the trainer's modules were (this torch imports it elsewhere)")
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    assert proc.stderr.rstrip().endswith("KeyboardInterrupt"), proc.stderr[-3000:]
    assert "step 1/" not in proc.stdout
    assert not out.exists()


def test_the_process_ends_with_its_exit_code_and_every_line_but_without_the_interpreters_teardown(tmp_path):
    """With torch loaded, the interpreter's teardown took 0.7-0.8 s of a core after the run's last record, in every
    rank of every launch: console_main ends the process without it (nsa.process.exit_without_teardown). The exit code
    (3: a non-finite loss) and everything the run printed survive it, the atexit handlers run, and its files are
    complete. The probe (tests/nsa/test_process_exit.py) holds an object only the teardown frees; stdout is
    block-buffered into a pipe."""
    from nsa.training.trainer import EXIT_NONFINITE
    from tests.nsa.test_process_exit import run_probe

    out = tmp_path / "out"
    proc = run_probe("sys.argv = ['nsa-train', *sys.argv[1:]]\nfrom nsa.training.cli import console_main\n"
                     "console_main()", "--config", str(_small_config(tmp_path, 3)), "--out-dir", str(out),
                     torch=False, env={"NSA_FAULT": "nan@2", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == EXIT_NONFINITE, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
    lines = proc.stdout.splitlines()
    assert lines[-1] == "atexit handler ran", lines[-5:]
    assert any("nonfinite at step 1: non-finite loss" in line for line in lines), lines[-5:]
    assert "interpreter teardown" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert json.loads((out / "status.json").read_text())["status"] == "nonfinite"
    assert [row["step"] for row in read_csv(out / "training.csv")] == ["1"]
