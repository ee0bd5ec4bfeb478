"""Synthetic trainer launches for the tests of decisions (sweep, ab), recommendations and compare: a fake
`validation.execution.runner.launch` that writes what a trainer run leaves behind (training.csv, status.json, env.json) with
a throughput chosen per launch, so that a whole step runs in-process in milliseconds with a known truth."""

from __future__ import annotations

import json
import math
import zlib
from pathlib import Path

import numpy as np

from validation.execution.acceptance import evaluate, verdict
from validation.execution.evidence import assess
from validation.launch.spec import LaunchResult

HEADER = "step,loss,lr,toks_per_s,step_time_s,grad_norm,mem_alloc_gb,mem_reserved_gb"
AB_VARIANTS = '{batched: {env: {NSA_PREFILL_BATCHED: "1"}}}'


def ab_runbook(repeats: int = 3, variants: str = AB_VARIANTS, defaults: str = "") -> str:
    """The decision tests' runbook: one `ab` step "pick" (phase "p", recommend: true) of NSA_PREFILL_BATCHED "0"
    against `variants` (a YAML flow mapping), `repeats` runs each, on the tiny CPU config (5 steps, one process);
    `defaults` is added inside the defaults mapping (e.g. ", retry_disturbed: 2")."""
    return ("name: t\n"
            "requirements: {gpus: 0, backend: gloo}\n"
            f"defaults: {{config: configs/tiny_cpu.yaml, args: {{steps: 5}}, nproc_per_node: 1{defaults}}}\n"
            "phases:\n"
            "  - name: p\n"
            "    steps:\n"
            "      - name: pick\n"
            "        kind: ab\n"
            '        baseline: {env: {NSA_PREFILL_BATCHED: "0"}}\n'
            f"        variants: {variants}\n"
            f"        repeats: {repeats}\n"
            "        recommend: true\n")


def ar1_series(seed: int, n: int, level: float, cv: float, phi: float = 0.5) -> np.ndarray:
    """An AR(1) throughput series: lag-1 correlation phi, marginal CV cv around `level`."""
    rng = np.random.default_rng(seed)
    x = np.empty(n)
    x[0] = rng.standard_normal() * cv
    e = rng.standard_normal(n) * cv * math.sqrt(1 - phi * phi)
    for t in range(1, n):
        x[t] = phi * x[t - 1] + e[t]
    return level * (1.0 + x)


def write_csv(path: Path, toks: np.ndarray | list[float]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [HEADER] + [f"{i + 1},{5 - i * 0.01:.4f},0.001,{v:.3f},{4096 / v:.6f},1.0,1.0,1.5"
                       for i, v in enumerate(toks)]
    path.write_text("\n".join(rows) + "\n")


class FakeTrainer:
    """Replaces validation.execution.runner.launch. `level(spec)` gives a launch's true throughput; every launch adds its
    own run-level noise (run_cv) and AR(1) step noise (cv), drawn from a seed fixed by the launch's directory, so
    that the data do not depend on the run order. `notes(spec)` gives status.json notes (e.g. an ignored
    setting). Launches are recorded in `self.launched` in order."""

    def __init__(self, level, cv: float = 0.03, run_cv: float = 0.0, notes=None, seed: int = 0, busy=None):
        """`busy(spec)`: True for a launch another process disturbed: its telemetry.csv then records one busy
        neighbour on a 2-core machine the launch uses whole (else a quiet one)."""
        self.level, self.cv, self.run_cv, self.notes, self.seed, self.busy = level, cv, run_cv, notes, seed, busy
        self.launched = []

    def __call__(self, spec) -> LaunchResult:
        self.launched.append(spec)
        argv = list(spec.argv)
        steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 20
        key = zlib.crc32(f"{self.seed}:{spec.dir}".encode())
        rng = np.random.default_rng(key)
        level = self.level(spec) * (1.0 + self.run_cv * rng.standard_normal())
        out = Path(spec.trainer_out_dir)
        write_csv(out / "training.csv", ar1_series(key + 1, steps, level, self.cv))
        status = {"status": "completed", "step": steps, "notes": list(self.notes(spec)) if self.notes else []}
        (out / "status.json").write_text(json.dumps(status))
        (out / "env.json").write_text(json.dumps({"world_size": 1}))
        log = Path(spec.step_dir) / "stdout.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("fake trainer\n")
        if self.busy is not None:
            other = 150.0 if self.busy(spec) else 0.0
            lines = ["time,node,sample,ncpu,step_cores,host_cpu_pct,other_cpu_pct,steal_pct,other_top"]
            lines += [f"{1000 + i},n0,{i},2,2,{190 + other:g},{'' if i == 0 else f'{other:g}'},0,"
                      + ("python -c busy[9] 99%" if other and i else "") for i in range(6)]
            (Path(spec.step_dir) / "telemetry.csv").write_text("\n".join(lines) + "\n")
        return LaunchResult(status="ok", returncode=0, duration_s=0.01, argv=argv, log_path=log, rank_logs={},
                            reason="exited 0", excerpt=None, stack_dumps=[], attempts=1)


FAKE_ENV = {"git_sha": "x", "host": "h", "platform": "p", "python": "3", "torch": "t", "cuda": None, "nccl": None,
            "gpus": [], "gpu_count": 0, "cpu_count": 2, "packages": {}}


def run_runbook(monkeypatch, tmp_path: Path, text: str, trainer: FakeTrainer, run_name: str = "run") -> dict:
    """Write the runbook `text`, run it in-process with `trainer` as the launcher; the results dict."""
    from validation.launch import environment
    from validation.execution import runner
    from validation.runbook.loader import load_runbook

    monkeypatch.setattr(runner, "launch", trainer)
    monkeypatch.setattr(environment, "probe", lambda cwd=None: dict(FAKE_ENV))
    path = tmp_path / "rb.yaml"
    path.write_text(text)
    rb = load_runbook(path)
    return runner.Runner(rb, tmp_path / run_name, runner.RunOptions(cwd=tmp_path)).run()


def run_ab_step(monkeypatch, tmp_path: Path, runbook_text: str, collect, values) -> dict:
    """One `ab` step's AB.run in-process, below the launcher: `collect(spec)` returns the metrics a launch's
    telemetry and statistics would give (toks_per_s, throughput_stable, interference), `values(run)` the per-step
    tokens/s of a run record as written (label, repeat). The step is the runbook's first; returns its Result as
    results.json would hold it (the step's entry, less what the runner adds)."""
    from types import SimpleNamespace

    from validation.runbook.plan import step_launches
    from validation.runbook.loader import load_runbook
    from validation.kinds import ab as ab_mod
    from validation.kinds import trainer as trainer_mod
    from validation.results.codec import encode

    path = tmp_path / "rb.yaml"
    path.write_text(runbook_text)
    step = load_runbook(path, cwd=str(Path(__file__).resolve().parents[2])).steps()[0]
    monkeypatch.setattr(trainer_mod, "collect", lambda ctx, step, spec, lr: ("passed", None, collect(spec)))
    monkeypatch.setattr(ab_mod, "run_values", lambda run_dir, step, run, metric: values(run))
    monkeypatch.setattr(ab_mod, "_ignored_settings", lambda ctx, step, runs, label: [])
    monkeypatch.setattr(ab_mod, "declared_pair_noise", lambda ctx: None)
    ctx = SimpleNamespace(run_dir=tmp_path, launch=lambda spec, i, n: SimpleNamespace(argv=spec.argv),
                          save=lambda partial=None: None, results={"runbook": {"name": "t"}}, step=step,
                          launches=step_launches(step, {}, tmp_path))
    return encode(ab_mod.AB().run(step.options, ctx))


def judge(rb, results: dict) -> tuple[dict, tuple]:
    """A run's evidence, criteria and verdict as the runner computes them at the end of a run, from `results`
    (updated in place): ({criterion name: its row}, (verdict word, reason))."""
    results["evidence"] = assess(rb, results, results["run_dir"])
    results["acceptance"] = evaluate(rb, results, results["run_dir"])
    return {c["name"]: c for c in results["acceptance"]}, verdict(results, False)
