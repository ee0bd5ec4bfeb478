"""nsa-train starts light: `nsa-train --help` and `nsa-train watchdog --help` import no torch (the trainer is
imported once the command line has parsed: nsa.training.cli.main), and the help still lists every flag.
benchmarks/bench_startup.py times them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nsa.training import flags, watchdog

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("torch", "triton", "numpy")

AUDIT = """\
import json, sys
sys.argv = ["nsa-train", *json.loads(sys.argv[1])]
from nsa.training.cli import console_main
try:
    console_main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in {heavy!r} if m in sys.modules)), file=sys.stderr)
"""


def help_run(argv: list[str]) -> tuple[str, list[str]]:
    """(stdout, heavy modules loaded) of the console entry `nsa-train ARGV` in a fresh process."""
    proc = subprocess.run([sys.executable, "-c", AUDIT.format(heavy=HEAVY), json.dumps(argv)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    return proc.stdout, json.loads(proc.stderr.strip().splitlines()[-1])


def options(parser) -> list[str]:
    return [o for action in parser._actions for o in action.option_strings]


@pytest.mark.parametrize("argv, parser",
                         [(["--help"], flags.build_parser),
                          (["watchdog", "--help"], lambda: watchdog.build_parser("nsa-train watchdog"))],
                         ids=["help", "watchdog-help"])
def test_help_imports_no_torch_and_lists_every_flag(argv, parser):
    out, heavy = help_run(argv)
    assert heavy == []
    listed = options(parser())
    assert len(listed) > 3
    assert [o for o in listed if o not in out] == []  # every option the parser has is in the help text


def test_a_bad_flag_is_refused_before_torch_is_imported():
    out, heavy = help_run(["--stepz", "3"])
    assert heavy == []


def test_a_bad_config_or_toggle_is_refused_before_torch_is_imported(tmp_path):
    """The config file and the NSA_* toggles are read before the trainer's imports (seconds), so that a user's
    mistake is a one-line error at once."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: {stepz: 3}\n")
    for argv, env in ((["--config", str(bad)], {}), (["--config", str(tmp_path / "none.yaml")], {}),
                      (["--config", "configs/tiny_cpu.yaml"], {"NSA_PREFILL_BATCHED": "maybe"})):
        proc = subprocess.run([sys.executable, "-c", AUDIT.format(heavy=HEAVY), json.dumps(argv)], cwd=REPO,
                              capture_output=True, text=True, timeout=120, env={**os.environ, **env})
        lines = proc.stderr.strip().splitlines()
        assert json.loads(lines[-1]) == [], argv
        assert lines[0].startswith("nsa-train: error: ") and "Traceback" not in proc.stderr, proc.stderr


def test_the_trainer_imports_no_torch_dynamo_unless_it_compiles():
    """torch._dynamo costs about a second at every trainer start-up; only a compiled model needs it (the selected
    branch's eager wrapper is made by prepare_compile, which the trainer calls before torch.compile)."""
    code = ("import json, sys\nimport nsa.training.trainer\nimport nsa.model\n"
            "print(json.dumps('torch._dynamo' in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) is False
