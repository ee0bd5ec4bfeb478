"""reports/gpu/next_run.sh, the script a GPU session runs first, checked on CPU so that a typo in it costs a CI run
and not the session's device time (a session has 15 minutes of it, and a command refused there is a start spent).

The script's DRY mode (DRY=DIR) runs nothing and writes each step's command to DIR/NNN_<step>.argv. Every command
of every part is then checked the way it would be read on the GPU machine, short of running it:
- a benchmark (python3 benchmarks/X.py ...): its own --dry-run, which checks every option and value (launch choices,
  lengths, --variant's NSA_* variables against nsa.toggles) and runs no case;
- a runbook (python3 -m validation.cli run ...): `run --dry-run`, which checks the runbook, the files it names, the
  phases of --skip/--only, --resume, --reuse and --out, and launches nothing;
- a pytest command: its files and -k collected (pytest --collect-only), at least one test selected in each file;
- inline Python (python3 -c, alone or under compute-sanitizer): run with pytest.main and qualify.main replaced by
  recorders, so that the launch choices it sets are checked (an attribute the module already has, and a value
  "auto" or one of the module's NAME + "S"), then the recorded pytest arguments collected and qualify's parsed;
- compute-sanitizer: memcheck, with the sanitizer kind's --launch-timeout 0 (a long launch is not cut).
A command of any other form fails the test, so that a new one gets its check here. The checker's own test feeds
it broken commands of each form. The runbooks' own benchmark and memcheck commands (the bench and sanitizer steps'
launches, as planned: gpu_kernels.yaml and h100_single.yaml run on the GPU only) go through the same checks.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from benchmark_scripts import load

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "reports" / "gpu" / "next_run.sh"
PARTS = ("kernels", "selection", "choices", "trainer", "h100")


def dry_commands(part: str, tmp: Path) -> list[tuple[str, list[str]]]:
    """[(step, argv)] of PART=part in the script's order, from a DRY run in `tmp`."""
    env = {**os.environ, "PART": part, "OUT": str(tmp / "out"), "W": str(tmp / "w"), "DRY": str(tmp / "argv"),
           "BUDGET": "100000",  # the script's python3 (PART=h100 runs some): this interpreter, as on the GPU machine
           "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"PART={part} DRY: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    files = sorted((tmp / "argv").glob("*.argv"))
    return [(f.stem.split("_", 1)[1], f.read_bytes().decode().split("\0")[:-1]) for f in files]


class Problem(AssertionError):
    """A command of the script that would fail on the GPU machine."""


def _bench(script: str):
    path = Path(script)
    if path.parent != Path("benchmarks") or path.suffix != ".py" or not (ROOT / path).is_file():
        raise Problem(f"{script}: no such benchmark")
    return load(path.stem)


def _choice_modules() -> list[str]:
    """The modules of nsa/ that hold a launch choice (a NAME_CHOICE = "auto" constant)."""
    found = []
    for path in sorted((ROOT / "nsa").rglob("*.py")):
        if re.search(r'^[A-Z_]+_CHOICE = "auto"', path.read_text(), re.M):
            found.append(".".join(path.relative_to(ROOT).with_suffix("").parts))
    return found


class Checker:
    """Checks commands one by one; the pytest ones are collected together at the end (collect)."""

    def __init__(self, capsys):
        self.capsys = capsys
        self.pytest_runs: list[tuple[str, list[str]]] = []  # (where, pytest arguments)

    def check(self, where: str, argv: list[str]) -> None:
        if argv[:1] == ["compute-sanitizer"]:
            if "python3" not in argv:
                raise Problem(f"{where}: compute-sanitizer runs no python3: {argv}")
            tool = argv[1:argv.index("python3")]
            if tool[:2] != ["--tool", "memcheck"] or "--launch-timeout" not in tool \
                    or tool[tool.index("--launch-timeout") + 1:][:1] != ["0"]:
                raise Problem(f"{where}: compute-sanitizer {' '.join(tool)}: expected --tool memcheck ... "
                              "--launch-timeout 0 (the sanitizer kind's)")
            argv = argv[argv.index("python3"):]
        if argv[:1] != ["python3"]:
            raise Problem(f"{where}: not a form this test knows (add its check here): {argv}")
        rest = argv[1:]
        if rest and rest[0].startswith("benchmarks/"):
            self._benchmark(where, rest[0], rest[1:])
        elif rest[:3] == ["-m", "validation.cli", "run"]:
            self._runbook(where, rest[3:])
        elif rest[:2] == ["-m", "pytest"]:
            self.pytest_runs.append((where, rest[2:]))
        elif rest[:2] == ["-m", "nsa.attention.kernels.qualify"]:
            self._qualify(where, rest[2:])
        elif rest[:1] == ["-c"] and len(rest) == 2:
            self._inline(where, rest[1])
        else:
            raise Problem(f"{where}: not a form this test knows (add its check here): {argv}")

    def _benchmark(self, where: str, script: str, args: list[str]) -> None:
        main = _bench(script).main
        try:
            code = main([*args, "--dry-run"])
        except SystemExit as exc:  # argparse's error
            code = exc.code
        out = self.capsys.readouterr()
        if code != 0:
            raise Problem(f"{where}: {script} {' '.join(args)}: exit {code}\n{out.err[-2000:]}")

    def _runbook(self, where: str, args: list[str]) -> None:
        from typer.testing import CliRunner  # the CLI in this process (its own start-up is seconds)

        from validation import cli

        cwd = os.getcwd()
        os.chdir(ROOT)  # the script runs from the repository root: its paths are relative to it
        try:
            result = CliRunner().invoke(cli.app, ["run", *args, "--dry-run"])
        finally:
            os.chdir(cwd)
        if result.exit_code != 0:
            raise Problem(f"{where}: nsa-validate run {' '.join(args)} --dry-run: exit {result.exit_code}\n"
                          f"{result.output[-2000:]}")

    def _inline(self, where: str, code: str) -> None:
        from nsa.attention.kernels import qualify  # the module the inline code calls, imported by it anyway

        modules = [importlib.import_module(name) for name in _choice_modules()]
        before = [dict(vars(m)) for m in modules]
        recorded: list[tuple[str, list[str]]] = []
        saved = pytest.main, qualify.main
        pytest.main = lambda args=None, *a, **k: recorded.append(("pytest", list(args or []))) or 0
        qualify.main = lambda argv=None: recorded.append(("qualify", list(argv or []))) or 0
        try:
            try:
                exec(compile(code, f"<{where}>", "exec"), {"__name__": "__main__"})
            except SystemExit as exc:
                if exc.code not in (0, None):
                    raise Problem(f"{where}: the inline code exits {exc.code}") from None
            for module, old in zip(modules, before):
                for name, value in vars(module).items():
                    if name in old and old[name] is value:
                        continue
                    if name not in old:
                        raise Problem(f"{where}: sets {module.__name__}.{name}, which the module does not have")
                    known = getattr(module, name + "S", None)
                    if known is None or (value != "auto" and value not in known):
                        raise Problem(f"{where}: {module.__name__}.{name} = {value!r}: expected auto or one of "
                                      f"{', '.join(known or ())}")
        finally:
            pytest.main, qualify.main = saved
            for module, old in zip(modules, before):
                for name in [n for n in vars(module) if n not in old]:
                    delattr(module, name)
                for name, value in old.items():
                    if vars(module).get(name) is not value:
                        setattr(module, name, value)
        if not recorded:
            raise Problem(f"{where}: the inline code calls neither pytest.main nor qualify.main")
        for what, args in recorded:
            if what == "pytest":
                self.pytest_runs.append((where, args))
            else:
                self._qualify(where, args)

    def _qualify(self, where: str, args: list[str]) -> None:
        from nsa.attention.kernels import qualify  # imports torch and the kernels: only where a command runs it

        try:
            qualify.parse_args(args)
        except SystemExit as exc:
            raise Problem(f"{where}: qualify {' '.join(args)}: exit {exc.code}\n"
                          f"{self.capsys.readouterr().err[-2000:]}") from None

    def collect(self) -> None:
        """Every recorded pytest command collected, grouped by its -k: each of its files selects a test."""
        groups: dict[str | None, list[tuple[str, str]]] = {}
        for where, args in self.pytest_runs:
            files = [a for a in args if a.endswith(".py")]
            k = args[args.index("-k") + 1] if "-k" in args else None
            unknown = [a for i, a in enumerate(args) if a not in files and a != "-k" and (i == 0 or args[i - 1] != "-k")
                       and a not in ("-q", "-p", "no:cacheprovider") and not (i and args[i - 1] == "-p")]
            if unknown or not files:
                raise Problem(f"{where}: pytest {' '.join(args)}: {'options ' + str(unknown) if unknown else 'no file'}"
                              " (this test knows -q, -p, -k and test files)")
            groups.setdefault(k, []).extend((where, f) for f in files)
        for k, wheres in groups.items():
            missing = [f"{where}: {f}" for where, f in wheres if not (ROOT / f).is_file()]
            if missing:
                raise Problem(f"no such test file: {'; '.join(missing)}")
            files = sorted({f for _, f in wheres})
            proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                   *files, *(["-k", k] if k else [])], cwd=ROOT, capture_output=True, text=True,
                                  timeout=300)
            ids = [line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line]
            empty = [f"{where}: {f}" for where, f in wheres if f not in ids]
            if proc.returncode not in (0, 5) or empty:
                raise Problem(f"pytest --collect-only {' '.join(files)}{' -k ' + k if k else ''}: exit "
                              f"{proc.returncode}; nothing selected in {'; '.join(empty) or '-'}\n"
                              f"{proc.stdout[-1500:]}\n{proc.stderr[-1500:]}")


@pytest.fixture(scope="module")
def commands(tmp_path_factory) -> dict[str, list[tuple[str, list[str]]]]:
    return {part: dry_commands(part, tmp_path_factory.mktemp(part)) for part in PARTS}


def test_every_part_runs_dry_with_its_steps_named_once(commands):
    for part, steps in commands.items():
        assert steps, f"PART={part} records no step"
        names = [name for name, _ in steps]
        assert len(names) == len(set(names)), f"PART={part}: a step name twice (its output file is overwritten)"
        # a step that continues another's file (--resume FILE of that same --json) adds to it, by design
        outs = [argv[argv.index("--json") + 1] for _, argv in steps
                if "--json" in argv and ("--resume" not in argv or argv[argv.index("--resume") + 1]
                                         != argv[argv.index("--json") + 1])]
        assert len(outs) == len(set(outs)), f"PART={part}: two steps write the same --json file"


def test_every_command_of_the_script_would_start(commands, capsys):
    checker = Checker(capsys)
    for part, steps in commands.items():
        for name, argv in steps:
            checker.check(f"PART={part} {name}", argv)
    assert len(checker.pytest_runs) >= 10  # S1's three, C1's six and T3's; qualify's are checked where recorded
    checker.collect()


def runbook_commands() -> list[tuple[str, list[str]]]:
    """[(where, argv)]: every launch of every runbook's bench and sanitizer steps, as planned, the interpreter
    written python3 as in the script."""
    from validation.runbook.loader import load_runbook
    from validation.runbook.plan import step_launches

    out = []
    for path in sorted((ROOT / "runbooks").glob("*.yaml")):
        for step in load_runbook(path).steps():
            if step.kind in ("bench", "sanitizer"):
                out += [(f"{path.name} {step.name}", ["python3" if a == sys.executable else a for a in spec.argv])
                        for spec in step_launches(step)]
    return out


def test_every_benchmark_and_memcheck_command_of_the_runbooks_would_start(capsys):
    commands = runbook_commands()
    kinds = {argv[argv.index("python3") + 1] for _, argv in commands}
    assert {"benchmarks/bench_attention.py", "benchmarks/profile_layer.py", "benchmarks/bench_train.py",
            "benchmarks/bench_selection.py", "-m"} <= kinds  # the GPU runbooks' benchmarks, and qualify (-m)
    checker = Checker(capsys)
    for where, argv in commands:
        checker.check(where, argv)
    assert checker.pytest_runs == []


def test_an_unknown_part_is_refused(tmp_path):
    env = {**os.environ, "PART": "kernel", "OUT": str(tmp_path / "out"), "W": str(tmp_path / "w"),
           "DRY": str(tmp_path / "argv")}
    proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "PART=kernel: expected kernels" in proc.stderr



def test_a_second_call_on_the_warm_machine_runs_only_the_steps_that_did_not_end_well(tmp_path):
    """A step that exited 0 leaves a marker in its folder; a second call of the part on the same machine (its $W
    kept, a new $OUT) logs it DONE instead of running it again, so that the A/Bs do not eat the second call, and
    runs the rest: a step that failed, was cut or skipped, and gpu_kernels.yaml (K2, which --resume continues).
    Checked with the script's own step function: python3 replaced by a stub that exits 0 for the A/B steps (K3, K4)
    and 1 for the others, in a folder of its own."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text("#!/bin/bash\ncase \"$*\" in *bench_selection*|*bench_choices*) exit 0;; esac\n"
                                  "exit 1\n")
    (stub / "python3").chmod(0o755)
    (stub / "compute-sanitizer").write_text("#!/bin/bash\nexit 1\n")
    (stub / "compute-sanitizer").chmod(0o755)
    (stub / "nvidia-smi").write_text("#!/bin/bash\nexit 0\n")
    (stub / "nvidia-smi").chmod(0o755)

    def call(n):
        out = tmp_path / f"out{n}"
        env = {**os.environ, "PART": "kernels", "OUT": str(out), "W": str(tmp_path / "w"), "BUDGET": "100000",
               "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60)
        assert proc.returncode == 0, proc.stderr
        return (out / "log.txt").read_text()

    first = call(1)
    assert "K3_topk_ab exit 0" in first and "K4_choices_65536b1 exit 0" in first and "K2_gpu_kernels exit 1" in first
    second = call(2)
    assert "DONE K3_topk_ab" in second and "DONE K4_choices_2048b8" in second
    assert "K3_topk_ab exit" not in second and "K4_choices_65536b1 exit" not in second
    assert "K2_gpu_kernels exit 1" in second  # not ended well: run again

BROKEN = [
    (["python3", "benchmarks/bench_attention.py", "--device", "cuda", "--dkdv-choice", "w4s1_splt"], "exit 2"),
    (["python3", "benchmarks/bench_attention.py", "--device", "cuda", "--seqlens", "2048"], "exit 2"),
    (["python3", "benchmarks/bench_train.py", "--device", "cuda", "--variant", "a:NSA_ROPE=fusd"], "NSA_ROPE"),
    (["python3", "benchmarks/bench_selection.py", "--seq-lens", "2k"], "--seq-lens"),
    (["python3", "benchmarks/tune_kernels.py", "--families", "range_qq"], "range_qq"),
    (["python3", "benchmarks/bench_nothing.py"], "no such benchmark"),
    (["python3", "-m", "validation.cli", "run", "runbooks/gpu_kernels.yaml", "--skip", "trainer"], "no phase"),
    (["python3", "-c", "from nsa.attention import selection; selection.TOPK_CHOICE = 'top'; import pytest; "
                       "pytest.main(['tests/test_next_run.py'])"], "expected auto or one of sort, topk"),
    (["python3", "-c", "import importlib; setattr(importlib.import_module('nsa.attention.kernels.range_attn.host'), "
                       "'QUERY_CHOIC', 'bn32'); from nsa.attention.kernels import qualify; qualify.main([])"],
     "which the module does not have"),
    (["python3", "-c", "from nsa.attention.kernels import qualify; qualify.main(['--dtype', 'bf8'])"], "exit 2"),
    (["python3", "-m", "nsa.attention.kernels.qualify", "--kernels", "select,sel_kvv"], "exit 2"),
    (["python3", "benchmarks/profile_layer.py", "--paths", "nsa-trito"], "exit 2"),
    (["compute-sanitizer", "--tool", "memcheck", "python3", "-c", "pass"], "--launch-timeout 0"),
    (["python3", "-m", "nsa.training", "--steps", "1"], "not a form"),
]


@pytest.mark.parametrize("argv,says", BROKEN, ids=[f"{i}" for i in range(len(BROKEN))])
def test_the_checker_refuses_a_broken_command(argv, says, capsys):
    from nsa.attention import selection
    from nsa.attention.kernels.range_attn import host

    with pytest.raises(Problem, match=re.escape(says)):
        Checker(capsys).check("broken", argv)
    assert selection.TOPK_CHOICE == "auto" and host.QUERY_CHOICE == "auto" and not hasattr(host, "QUERY_CHOIC")


@pytest.mark.parametrize("args,says", [
    (["tests/test_next_run.py", "-k", "no_such_test_name"], "nothing selected"),
    (["tests/nsa/no_such_file.py"], "no such test file"),
    (["-x", "tests/test_next_run.py"], "options"),
])
def test_the_checker_refuses_a_pytest_command_that_selects_nothing(args, says, capsys):
    checker = Checker(capsys)
    checker.check("broken", ["python3", "-m", "pytest", *args])
    with pytest.raises(Problem, match=re.escape(says)):
        checker.collect()


FAKE_BENCH = '''
"""bench_choices.main with the device replaced: fixed block times; the process ends as an illegal memory access
ends it (os._exit 134) whenever a block runs under the selected backward's query-outer dQ."""
import os, sys
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks")); sys.path.insert(0, os.environ["REPO"])
import bench_choices as bc
from nsa.attention.kernels.selected_attn import host
argv = sys.argv[1:]
argv[argv.index("--device") + 1] = "cpu"
def measure(one, warmup, repeats, device):
    if host.DQ_CHOICE == "query":
        os._exit(134)
    t = {"min": .01, "median": .01, "max": .01}
    return {"times_s": {m: t for m in ("fwd", "bwd", "fwdbwd")}, "passes": 5, "loss": 1.0, "grad_norm": 1.0}
bc.measure_block = measure
bc.layer_pass = lambda args: None
sys.exit(bc.main(argv))
'''


def test_a_crash_in_one_choice_costs_that_choice_only_and_a_second_call_keeps_the_first_calls_figures(tmp_path):
    """PART=kernels' K4 with bench_choices' device replaced (a choice that ends the process at its first block, as an
    illegal memory access does): the step continues its file in new processes until every arm has a verdict or an
    error, the crashed choice recorded as such and every other one measured; a second call on the warm machine
    finds the file done and neither runs the A/B again nor rewrites it."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (tmp_path / "fake_bench.py").write_text(FAKE_BENCH)
    (stub / "python3").write_text(
        "#!/bin/bash\ncase \"$1\" in\n"
        f"  benchmarks/bench_choices.py) shift; exec {sys.executable} {tmp_path / 'fake_bench.py'} \"$@\";;\n"
        f"  -) exec {sys.executable} \"$@\";;\nesac\nexit 0\n")
    for name in ("python3", "compute-sanitizer", "nvidia-smi"):
        path = stub / name
        if not path.exists():
            path.write_text("#!/bin/bash\nexit 0\n")
        path.chmod(0o755)

    def call(n):
        env = {**os.environ, "PART": "kernels", "OUT": str(tmp_path / f"out{n}"), "W": str(tmp_path / "w"),
               "BUDGET": "100000", "REPO": str(ROOT), "PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}
        proc = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return (tmp_path / f"out{n}" / "log.txt").read_text()

    first = call(1)
    assert "K4_choices_65536b1 exit 134" in first and "K4_choices_65536b1_resume1 exit 1" in first
    assert "K4_choices_65536b1_resume2" not in first  # done after one resume: nothing left
    path = tmp_path / "w" / "kernels" / "choices_65536b1.json"
    arms = json.loads(path.read_text())["arms"]
    assert arms["dq_query"]["error"].startswith("crashed")
    assert all("verdict" in r for a, r in arms.items() if a != "dq_query"), arms.keys()
    assert len(arms) == 11  # the A/A arm and ten choices
    before = path.read_bytes()
    second = call(2)
    assert "DONE K4_choices_65536b1:" in second and "DONE K4_choices_2048b8:" in second
    assert "K4_choices_65536b1 exit" not in second and path.read_bytes() == before
