"""Executes a runbook: every step in order, results on disk after each one, acceptance, verdict, reports.

The runner never prints: it reports progress through a `Reporter` (the CLI's is a rich live display) and returns
the results dict (validation.results documents it).

Steps run in order; a step whose runbook entry says `on_failure: stop` and that ends failed, timeout, hang or
error ends the run there: the remaining steps are recorded as skipped ("not run: step X failed and on_failure is
stop") and the verdict is computed as usual.

Every file the run writes lies under RUN_DIR: each output path is checked (relative, no `..`) and no existing
symlink on it or under a step's directory may lead outside RUN_DIR (e.g. RUN_DIR/<step> replaced by a link to
another directory before a --resume); such a run stops before writing anything with RunDirError, as does a run
whose directory cannot be written (disk full, permission denied, not a directory).
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from validation import environment, metrics, stats
from validation.launcher import LaunchResult, LaunchSpec, launch
from validation.plan import PlannedLaunch, nsys_available, recorded_env, step_launches
from validation.results import (FAILED_STEP_STATUSES, FINAL_STEP_STATUSES, SCHEMA_VERSION, RunDirError, cannot_write,
                                os_error_text, write_results)
from validation.runbook import Runbook, Step, references

COMPRESSION_RE = re.compile(r"\[ddp\] gradient compression enabled: (\w+)")


class Reporter:
    """Progress hooks; the default does nothing."""

    def run_started(self, runbook: Runbook, run_dir: Path, steps: list[Step]) -> None: ...
    def step_started(self, step: Step, launches: int) -> None: ...
    def launch_started(self, step: Step, planned: PlannedLaunch, index: int, total: int) -> None: ...
    def launch_progress(self, step: Step, progress) -> None: ...
    def step_finished(self, step: Step, result: dict) -> None: ...
    def run_finished(self, results: dict) -> None: ...


class _SafeReporter:
    """Progress display must never cost a run its results: reporter errors are logged and dropped."""

    def __init__(self, inner: Reporter):
        self._inner = inner

    def __getattr__(self, name):
        method = getattr(self._inner, name)

        def call(*args, **kwargs):
            try:
                return method(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001 - display only
                logging.getLogger(__name__).warning("progress display failed in %s: %s", name, exc)
                return None

        return call


@dataclass
class RunOptions:
    only: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    overrides: tuple[str, ...] = ()
    cwd: Path = Path(".")


def _tool_version() -> str:
    try:
        return importlib.metadata.version("nsa-validate")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree without installing
        return "unknown"


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


class Runner:
    def __init__(self, runbook: Runbook, run_dir: Path, options: RunOptions, reporter: Reporter | None = None,
                 previous: dict | None = None):
        self.rb, self.run_dir, self.opt = runbook, Path(run_dir), options
        self.reporter = _SafeReporter(reporter or Reporter())
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cannot_write(self.run_dir, exc) from None
        self.env_record = environment.probe(options.cwd)
        self.results = previous or self._fresh_results()
        self.results["environment"] = {**self.results.get("environment", {}), **self.env_record}
        self.results["finished"] = None
        self.results["verdict"] = "INCOMPLETE"

    # ------------------------------------------------------------------ results skeleton
    def _fresh_results(self) -> dict:
        rb = self.rb
        return {
            "schema_version": SCHEMA_VERSION,
            "tool": {"name": "nsa-validate", "version": _tool_version()},
            "runbook": {"name": rb.name, "description": rb.description, "path": rb.path, "sha256": rb.sha256},
            "run_dir": str(self.run_dir), "started": _now(), "finished": None, "duration_s": None,
            "verdict": "INCOMPLETE", "verdict_reason": "not finished",
            "environment": {},
            "options": {"only": list(self.opt.only), "skip": list(self.opt.skip), "set": list(self.opt.overrides)},
            "phases": [{"name": p.name, "title": p.title, "description": p.description,
                        "steps": [s.name for s in p.steps]} for p in rb.phases],
            "steps": {s.name: self._pending(s) for s in rb.steps()},
            "acceptance": [], "recommendations": {"env": {}, "notes": []}, "plots": [],
        }

    @staticmethod
    def _pending(step: Step) -> dict:
        return {"name": step.name, "phase": step.phase, "kind": step.kind, "title": step.title,
                "description": step.description, "status": "pending", "reason": None, "started": None,
                "duration_s": None, "dir": step.name, "command": None, "env": {}, "metrics": {}, "runs": [],
                "winner": None, "comparison": [], "artifacts": [], "excerpt": None, "stack_dumps": [],
                "optional": step.optional}

    def save(self) -> None:
        write_results(self.run_dir, self.results)

    # ------------------------------------------------------------------ the run
    def run(self) -> dict:
        steps = self.rb.steps()
        self._check_outputs_inside(steps)
        self.reporter.run_started(self.rb, self.run_dir, steps)
        t0 = time.time()
        self.save()
        stopped_by: Step | None = None  # a step with on_failure: stop that failed
        try:
            for step in steps:
                current = self.results["steps"].get(step.name) or self._pending(step)
                if current["status"] not in FINAL_STEP_STATUSES:
                    if stopped_by is not None:
                        result = self._not_run(step, stopped_by)
                    else:
                        try:
                            result = self._run_step(step)
                        except OSError as exc:  # writing the step's files (disk full, permission denied)
                            where = exc.filename if isinstance(exc.filename, str) else self.run_dir / step.name
                            raise RunDirError(f"step {step.name}: cannot write {where}: {os_error_text(exc)}") \
                                from None
                    self.results["steps"][step.name] = result
                    self.save()
                    self.reporter.step_finished(step, result)
                    current = result
                # a step finished in an earlier, interrupted run (--resume) counts too
                if stopped_by is None and step.on_failure == "stop" and current["status"] in FAILED_STEP_STATUSES:
                    stopped_by = step
        except KeyboardInterrupt:
            for name, res in self.results["steps"].items():
                if res["status"] == "running":
                    res.update(status="interrupted", reason="interrupted (Ctrl-C)")
            self._finish(t0, interrupted=True)
            raise
        self._finish(t0, interrupted=False)
        return self.results

    def _finish(self, t0: float, interrupted: bool) -> None:
        from validation.acceptance import evaluate, recommendations, verdict

        self.results["acceptance"] = evaluate(self.rb, self.results, self.run_dir)
        self.results["recommendations"] = recommendations(self.rb, self.results)
        self.results["verdict"], self.results["verdict_reason"] = verdict(self.results, interrupted)
        self.results["finished"] = _now()
        self.results["duration_s"] = round(time.time() - t0 + (self.results.get("duration_s") or 0.0), 3)
        self.save()
        self.reporter.run_finished(self.results)

    def _not_run(self, step: Step, stopped_by: Step) -> dict:
        status = self.results["steps"][stopped_by.name]["status"]
        how = {"timeout": "timed out", "hang": "hung", "error": "ended in an error"}.get(status, "failed")
        result = self._pending(step)
        result.update(status="skipped", duration_s=0.0,
                      reason=f"not run: step {stopped_by.name} {how} and on_failure is stop")
        return result

    # ------------------------------------------------------------------ outputs stay inside RUN_DIR
    def _step_paths(self, step: Step) -> list[str]:
        """Every path (relative to RUN_DIR) that `step` writes under."""
        paths = [step.name]
        for pl in step_launches(step, None, self.run_dir):
            paths += [pl.dir] + ([pl.out_dir] if pl.out_dir else [])
        return paths

    def _check_outputs_inside(self, steps: list[Step]) -> None:
        """Before anything runs: every output path of the steps still to run, and the plots directory, stays
        inside RUN_DIR. Raises RunDirError."""
        inside_run_dir(self.run_dir, "plots")
        for step in steps:
            current = self.results["steps"].get(step.name) or {}
            if current.get("status") not in FINAL_STEP_STATUSES:
                for rel in self._step_paths(step):
                    inside_run_dir(self.run_dir, rel)

    # ------------------------------------------------------------------ one step
    def _skip_reason(self, step: Step) -> str | None:
        if self.opt.only and step.phase not in self.opt.only:
            return f"phase {step.phase} not selected (--only {' '.join(self.opt.only)})"
        if step.phase in self.opt.skip:
            return f"phase {step.phase} skipped (--skip)"
        reason = environment.unmet_for(step, self.env_record)
        if reason:
            return reason
        if step.kind == "profile" and step.profiler == "nsys" and not nsys_available(step):
            return "profiler nsys requested, but nsys is not on PATH"
        for ref in sorted({r for v in list(step.launch.env.values()) + list(step.launch.args.values())
                           for r in references(v)}):
            if not (self.results["steps"].get(ref) or {}).get("winner"):
                return f"needs the winner of {ref}, which has none ({self.results['steps'][ref]['status']})"
        return None

    def _winners(self) -> dict[str, dict[str, Any]]:
        return {name: res["winner"]["params"] for name, res in self.results["steps"].items() if res.get("winner")}

    def _run_step(self, step: Step) -> dict:
        result = self._pending(step)
        result["started"] = _now()
        t0 = time.time()
        skip = self._skip_reason(step)
        if skip:
            result.update(status="skipped", reason=skip, duration_s=0.0)
            return result
        planned = step_launches(step, self._winners(), self.run_dir)
        # checked again right before writing: a link may have appeared since the run started
        for rel in [step.name] + [p for pl in planned for p in (pl.dir, pl.out_dir) if p]:
            inside_run_dir(self.run_dir, rel)
        result["status"] = "running"
        self.results["steps"][step.name] = result
        self.save()
        step_dir = self.run_dir / step.name
        try:
            step_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise cannot_write(step_dir, exc) from None
        self.reporter.step_started(step, max(1, len(planned)))
        try:
            handler = getattr(self, f"_step_{step.kind}")
            handler(step, planned, result)
        except KeyboardInterrupt:
            result.update(status="interrupted", reason="interrupted (Ctrl-C)")
            raise
        finally:
            result["duration_s"] = round(time.time() - t0, 3)
        return result

    def _launch(self, step: Step, pl: PlannedLaunch, index: int, total: int) -> LaunchResult:
        self.reporter.launch_started(step, pl, index, total)
        env = {**os.environ, **pl.env}
        if (pl.nproc_per_node > 1 or step.is_training) and pl.launcher.type == "torchrun":
            # the ranks share this machine's cores (Slurm nodes: torchrun's own default applies there)
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(1, pl.world_size))))
        spec = LaunchSpec(
            argv=pl.argv, env=env, cwd=self.opt.cwd, step_dir=self.run_dir / pl.dir,
            nproc_per_node=pl.nproc_per_node, torchrun=pl.torchrun,
            launcher=pl.launcher.type, nnodes=pl.nnodes, rdzv_backend=pl.launcher.rdzv_backend,
            rdzv_endpoint=pl.launcher.rdzv_endpoint, slurm=pl.slurm_options(), job_name=pl.job_name(),
            job_env=dict(pl.env),
            master_port=None if pl.master_port == "auto" else int(pl.master_port), port_retries=pl.port_retries,
            timeout_s=pl.timeout_s,
            trainer_out_dir=(self.run_dir / pl.out_dir) if pl.out_dir else None,
            stall_timeout_s=pl.stall_timeout_s if pl.out_dir else None,
            expected_ranks=pl.world_size if pl.out_dir else None,
            on_progress=lambda p: self.reporter.launch_progress(step, p), wrapper=list(pl.wrapper))
        return launch(spec)

    def _rel(self, path: Path | str | None) -> str | None:
        if path is None:
            return None
        try:
            return str(Path(path).resolve().relative_to(self.run_dir.resolve()))
        except ValueError:
            return str(path)

    def _record_launch(self, target: dict, pl: PlannedLaunch, lr: LaunchResult) -> None:
        target["command"] = lr.argv
        target["env"] = recorded_env(pl.env)
        target["artifacts"] = sorted({*target.get("artifacts", []), self._rel(lr.log_path),
                                      *(self._rel(p) for p in lr.rank_logs.values())} - {None})
        if lr.excerpt:
            target["excerpt"] = lr.excerpt
        target["stack_dumps"] = sorted({*target.get("stack_dumps", []), *(self._rel(p) for p in lr.stack_dumps)})

    # ------------------------------------------------------------------ training launches
    def _train_metrics(self, step: Step, pl: PlannedLaunch, lr: LaunchResult) -> tuple[str, str | None, dict]:
        """(status, reason, metrics) of one trainer launch."""
        out_dir = self.run_dir / pl.out_dir
        window = metrics.Window(last=step.launch.window, warmup=step.launch.warmup_steps)
        read = metrics.read_training_csv(out_dir / "training.csv")
        m = metrics.summarize(read, window, world_size=pl.world_size)
        m["world_size"] = pl.world_size
        m["csv"] = self._rel(out_dir / "training.csv")
        m.update(self._node_metrics(pl, lr, out_dir, m))
        trainer_status = _read_json(out_dir / "status.json")
        m["trainer_status"] = trainer_status.get("status")
        log_text = _read_text(lr.log_path)
        found = COMPRESSION_RE.search(log_text)
        m["compression"] = found.group(1) if found else None
        audit = _read_json(out_dir / "sdpa_audit.json")
        if audit:
            gpu = [r for r in audit.get("by_site", []) if r.get("device") == "cuda"]
            m["sdpa_audit"] = {"calls": audit.get("calls", 0), "backends": audit.get("backends", []),
                               "fallbacks": sum(r["calls"] for r in gpu if r.get("backend") == "math"),
                               "by_site": audit.get("by_site", [])}
        if lr.status != "ok":
            return lr.status, lr.reason, m
        if m["trainer_status"] != "completed":
            return "failed", f"trainer ended {m['trainer_status']}: {trainer_status.get('reason')}", m
        return _csv_verdict(m, trainer_status.get("step"))

    def _node_metrics(self, pl: PlannedLaunch, lr: LaunchResult, out_dir: Path, m: dict) -> dict:
        """Launcher, nodes (from the trainer's env.json: every node of the job), per-node throughput; every node's
        record (host, GPUs, NCCL/IB/Slurm environment) is added to the run's environment["nodes"]."""
        nodes = _read_json(out_dir / "env.json").get("nodes") or []
        known = self.results["environment"].setdefault("nodes", {})
        for node in nodes:
            if isinstance(node, dict) and node.get("node"):
                known.setdefault(str(node["node"]), {}).update({k: node.get(k) for k in ("host", "gpus", "env")})
        mean = (m.get("toks_per_s") or {}).get("mean")
        return {"launcher": pl.launcher.type, "nnodes": pl.nnodes,
                "nodes": [str(n.get("node")) for n in nodes if isinstance(n, dict)] or list(lr.nodes),
                "slurm_job": lr.job_id,
                "gpus": [str(g) for n in nodes if isinstance(n, dict) for g in (n.get("gpus") or [])],
                "toks_per_s_per_node": mean / pl.nnodes if isinstance(mean, (int, float)) else None}

    def _single_train(self, step: Step, planned: list[PlannedLaunch], result: dict) -> tuple[PlannedLaunch, LaunchResult]:
        pl = planned[0]
        lr = self._launch(step, pl, 0, 1)
        self._record_launch(result, pl, lr)
        status, reason, m = self._train_metrics(step, pl, lr)
        result.update(status=status, reason=reason, metrics=m)
        return pl, lr

    def _step_train(self, step, planned, result) -> None:
        self._single_train(step, planned, result)
        if step.scaling_baseline:
            # multi-node scaling: this run's throughput against the baseline step's, per process
            m, base = result["metrics"], (self.results["steps"].get(step.scaling_baseline) or {}).get("metrics") or {}
            multi, single = (m.get("toks_per_s") or {}).get("mean"), (base.get("toks_per_s") or {}).get("mean")
            ratio = m.get("world_size", 1) / max(1, base.get("world_size") or 1)
            m["scaling_baseline"] = step.scaling_baseline
            m["scaling_efficiency"] = metrics.scaling_efficiency(multi, single, ratio)

    def _step_longrun(self, step, planned, result) -> None:
        pl, lr = self._single_train(step, planned, result)
        out_dir = self.run_dir / pl.out_dir
        m = result["metrics"]
        m["halted"] = (out_dir / ".HALT").exists() or m.get("trainer_status") == "halted"
        m["stalls"] = 1 if lr.status == "hang" else 0
        m["stack_dumps"] = [self._rel(p) for p in sorted(out_dir.glob("stackdump_*.txt")) if p.stat().st_size]
        if result["status"] == "passed" and m["halted"]:
            result.update(status="failed", reason="the run was halted (.HALT)")

    def _step_profile(self, step, planned, result) -> None:
        pl, _ = self._single_train(step, planned, result)
        if pl.wrapper:
            result["artifacts"] += [self._rel(p) for p in sorted((self.run_dir / pl.dir).glob("nsys_profile*"))]
        traces = sorted((self.run_dir / pl.out_dir / "profile").glob("trace_rank0_*.json"))
        prof = {"trace": self._rel(traces[-1]) if traces else None, "top_ops": [], "nvtx_ranges": []}
        if traces:
            prof.update(_profile_summary(traces[-1]))
            result["artifacts"].append(self._rel(traces[-1]))
        elif result["status"] == "passed":
            result.update(status="failed", reason="no profiler trace was written")
        result["metrics"]["profile"] = prof

    def _step_sweep(self, step, planned, result) -> None:
        runs, problems = [], []
        for i, pl in enumerate(planned):
            lr = self._launch(step, pl, i, len(planned))
            self._record_launch(result, pl, lr)
            status, reason, m = self._train_metrics(step, pl, lr)
            runs.append({"label": pl.label, "params": pl.params, "status": status, "reason": reason,
                         "dir": pl.dir, "command": lr.argv, "metrics": m, "repeat": 0})
            if status != "passed":
                problems.append(f"{pl.label}: {reason}")
            result["runs"] = runs
            self.save()
        label, explanation = metrics.select_best(
            [(r["label"], r["metrics"]) for r in runs if r["status"] == "passed"], step.select_metric,
            step.select_goal)
        if label is not None:
            won = next(r for r in runs if r["label"] == label)
            result["winner"] = {"label": label, "params": won["params"], "explanation": explanation}
        result["metrics"] = {"points": len(runs), "passed": sum(r["status"] == "passed" for r in runs),
                             "winner": label, "selection": explanation}
        if problems:
            result.update(status="failed", reason="; ".join(problems))
        elif label is None:
            result.update(status="failed", reason=f"no winner: {explanation}")
        else:
            result.update(status="passed", reason=None)

    def _step_ab(self, step, planned, result) -> None:
        runs, problems = [], []
        for i, pl in enumerate(planned):
            lr = self._launch(step, pl, i, len(planned))
            self._record_launch(result, pl, lr)
            status, reason, m = self._train_metrics(step, pl, lr)
            runs.append({"label": pl.label, "params": pl.params, "status": status, "reason": reason, "dir": pl.dir,
                         "command": lr.argv, "metrics": m, "repeat": pl.repeat})
            if status != "passed":
                problems.append(f"{pl.label}: {reason}")
            result["runs"] = runs
            self.save()
        samples = {label: [] for label in ["baseline", *step.variants]}
        for r in runs:
            if r["status"] == "passed":
                samples[r["label"]] += metrics.window_values(self.run_dir / r["metrics"]["csv"], step.metric,
                                                             metrics.Window(step.launch.window,
                                                                            step.launch.warmup_steps))
        higher = stats.METRIC_DIRECTIONS.get(step.metric, "higher") == "higher"
        comparison, by_label = [], {}
        for label in step.variants:
            if samples["baseline"] and samples[label]:
                c = stats.compare_samples(samples["baseline"], samples[label], higher_is_better=higher)
                comparison.append({"baseline": "baseline", "variant": label, "metric": step.metric, **c})
                by_label[label] = c
        result["comparison"] = comparison
        result["metrics"] = {"compared": step.metric, "variants": by_label,
                             "baseline": _pooled_summary(runs, "baseline")}
        for label in step.variants:
            result["metrics"][label] = _pooled_summary(runs, label)
        ignored = {label: self._ignored_settings(step, runs, label) for label in step.variants}
        for label, names in ignored.items():
            if names:
                result.setdefault("notes", []).append(
                    f"{label}: the trainer ignored {', '.join(names)} on this machine, so this A/B compares equal "
                    "settings and the variant is not recommended")
        if step.recommend and comparison:
            # the seed runbook's rule: keep a variant if it is stable and at least as fast as the baseline
            best = [c for c in comparison if c["verdict"] != "worse" and not ignored[c["variant"]] and (
                c["mean_b"] >= c["mean_a"] if higher else c["mean_b"] <= c["mean_a"])
                and _pooled_summary(runs, c["variant"]).get("throughput_stable")]
            if best:
                chosen = max(best, key=lambda c: c["mean_b"] if higher else -c["mean_b"])
                params = next(r["params"] for r in runs if r["label"] == chosen["variant"])
                result["winner"] = {"label": chosen["variant"], "params": params,
                                    "explanation": f"{chosen['variant']} is not worse than baseline "
                                                   f"({chosen['mean_b']:.1f} vs {chosen['mean_a']:.1f}) and stable"}
            else:
                result["winner"] = {"label": "baseline", "params": {}, "explanation":
                                    "no variant was both at least as fast as baseline and stable"}
        result.update(status="failed" if problems else "passed",
                      reason="; ".join(problems) or "; ".join(result.get("notes", [])) or None)

    def _ignored_settings(self, step: Step, runs: list[dict], label: str) -> list[str]:
        """Variables of a variant that its trainer runs reported as ignored (e.g. NSA_OPT_FUSED on CPU)."""
        names = set()
        for r in runs:
            if r["label"] != label:
                continue
            notes = _read_json(self.run_dir / r["dir"] / "out" / "status.json").get("notes", [])
            for var in step.variants[label].env:
                if any(var in n and "ignored" in n for n in notes):
                    names.add(var)
        return sorted(names)

    # ------------------------------------------------------------------ other kinds
    def _step_snapshot(self, step, planned, result) -> None:
        env, files, problems = environment.snapshot(self.run_dir / step.name, self.opt.cwd,
                                                    timeout_s=step.launch.timeout_s)
        self.results["environment"].update(env)
        result["artifacts"] = [self._rel(f) for f in files]
        result["metrics"] = {"git_sha": env.get("git_sha"), "gpu_count": env.get("gpu_count"),
                             "files": result["artifacts"], "problems": problems}
        status = "passed"
        if planned:  # launcher slurm: a snapshot of every node of an allocation
            lr = self._launch(step, planned[0], 0, 1)
            self._record_launch(result, planned[0], lr)
            known = self.results["environment"].setdefault("nodes", {})
            names = []
            nodes_dir = self.run_dir / step.name / "nodes"
            for node_dir in sorted(d for d in (nodes_dir.iterdir() if nodes_dir.is_dir() else []) if d.is_dir()):
                node_env = _read_json(node_dir / "environment.json")
                names.append(node_dir.name)
                known.setdefault(node_dir.name, {}).update(snapshot={"gpu_count": node_env.get("gpu_count"),
                                                                     "gpus": node_env.get("gpus"),
                                                                     "torch": node_env.get("torch"),
                                                                     "host": node_env.get("host"),
                                                                     "comm_env": node_env.get("comm_env")})
                result["artifacts"] += [self._rel(f) for f in sorted(node_dir.iterdir())]
            result["metrics"]["nodes"] = names
            if lr.status != "ok" or len(names) < planned[0].nnodes:
                status = "failed"
                problems = problems + [f"node snapshots: {len(names)} of {planned[0].nnodes} ({lr.reason})"]
        result.update(status=status, reason="; ".join(problems) or None)

    def _step_pytest(self, step, planned, result) -> None:
        pl = planned[0]
        lr = self._launch(step, pl, 0, 1)
        self._record_launch(result, pl, lr)
        counts = _junit_counts(self.run_dir / pl.dir / "pytest.xml")
        result["metrics"] = counts
        result["artifacts"].append(self._rel(self.run_dir / pl.dir / "pytest.xml"))
        if lr.status in ("timeout", "hang", "error", "interrupted"):
            result.update(status=lr.status, reason=lr.reason)
        elif counts.get("total", 0) == 0:
            result.update(status="failed", reason=f"no tests ran ({lr.reason})")
        elif counts["failed"] or counts["errors"]:
            result.update(status="failed", reason=f"{counts['failed']} failed, {counts['errors']} errors "
                                                  f"of {counts['total']}")
        else:
            result.update(status="passed", reason=None)

    def _step_bench(self, step, planned, result) -> None:
        pl = planned[0]
        lr = self._launch(step, pl, 0, 1)
        self._record_launch(result, pl, lr)
        data = _read_json(self.run_dir / pl.dir / "bench.json")
        result["metrics"] = data if isinstance(data, dict) else {"results": data}
        if lr.status != "ok":
            result.update(status=lr.status if lr.status != "ok" else "failed", reason=lr.reason)
        elif not data:
            result.update(status="failed", reason="the benchmark wrote no JSON")
        else:
            result["artifacts"].append(self._rel(self.run_dir / pl.dir / "bench.json"))
            result.update(status="passed", reason=None)


# ---------------------------------------------------------------------- helpers
def _csv_verdict(m: dict, trainer_steps: Any) -> tuple[str, str | None, dict]:
    """(status, reason, m) of a launch whose trainer completed, from its training.csv summary `m`.

    A missing, empty or unparseable file fails. So does a row left out anywhere but at the very end (a damaged
    row: the numbers around it cannot be trusted either), and a file that ends before the trainer's last step
    by more than a cut-off last line (rows were lost). A last line cut off mid-row, what a writer killed while
    writing leaves, passes with that said in the reason."""
    if m["status"] not in metrics.USABLE_STATUSES:
        reason = str(m.get("reason"))
        if reason.startswith(f"{m['status']}: "):  # "missing: /path" -> "training.csv missing: /path"
            reason = reason[len(m["status"]) + 2:]
        return "failed", f"training.csv {m['status']}: {reason}", m
    dropped, cut = m.get("dropped_rows") or 0, bool(m.get("cut_last_line"))
    if dropped > (1 if cut else 0):
        return "failed", (f"training.csv damaged: {dropped} unparseable row(s) left out (first at "
                          f"{m.get('first_bad_row')})"), m
    last = m.get("last_step")
    if isinstance(trainer_steps, int) and last is not None and last + (1 if cut else 0) < trainer_steps:
        return "failed", (f"training.csv ends at step {last} but the trainer completed step {trainer_steps}: "
                          f"{trainer_steps - last - (1 if cut else 0)} row(s) lost"), m
    if cut:
        return "passed", (f"training.csv: the last line was cut off mid-row and left out (1 row); statistics use "
                          f"steps {m['window']['first_step']}-{m['window']['last_step']}"), m
    return "passed", None, m


def _within(path: Path, root: Path) -> bool:
    return path == root or root in path.parents


def inside_run_dir(run_dir: Path, rel: str | Path) -> Path:
    """RUN_DIR/rel, once it is known to stay inside RUN_DIR: `rel` is relative and has no `..`, no existing
    symlink along it leads outside RUN_DIR, and neither does any symlink under it when it is an existing
    directory (e.g. the files a resumed step would overwrite). Raises RunDirError naming the path."""
    rel_path = Path(rel)
    if not str(rel) or rel_path.is_absolute() or ".." in rel_path.parts:
        raise RunDirError(f"output path {str(rel)!r}: must be relative to the run directory {run_dir}, "
                          "without '..'")
    root = Path(run_dir).resolve()

    def check(path: Path) -> None:
        if not path.is_symlink():
            return
        try:
            target = path.resolve()
        except (OSError, RuntimeError):  # a link loop: nowhere safe
            target = None
        if target is None or not _within(target, root):
            raise RunDirError(f"{path} is a symlink to {os.readlink(path)}, outside the run directory {run_dir}: "
                              "refusing to write through it")

    current = Path(run_dir)
    for part in rel_path.parts:
        current = current / part
        check(current)
    if current.is_dir():
        for dirpath, dirnames, filenames in os.walk(current):  # links are not followed, only checked
            for name in dirnames + filenames:
                check(Path(dirpath) / name)
    return current


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


def _read_text(path: Path | None) -> str:
    try:
        return Path(path).read_text(errors="replace") if path else ""
    except OSError:
        return ""


def _junit_counts(path: Path) -> dict[str, int]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError):
        return {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "total": 0}
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) for s in suites)
    errors = sum(int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return {"passed": total - failed - errors - skipped, "failed": failed, "skipped": skipped, "errors": errors,
            "total": total, "duration_s": round(sum(float(s.get("time", 0)) for s in suites), 3)}


def _profile_summary(trace: Path, top: int = 15) -> dict:
    """Top operators by self time and the nsa.* ranges seen, from a torch profiler chrome trace."""
    data = _read_json(trace)
    events = [e for e in data.get("traceEvents", []) if isinstance(e, dict) and e.get("ph") == "X"]
    ranges = sorted({e["name"] for e in events if str(e.get("name", "")).startswith("nsa.")})
    ops: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") in ("cpu_op", "kernel", "gpu_op") and "dur" in e:
            ops.setdefault(e["name"], []).append(float(e["dur"]))
    rows = sorted(({"name": k, "total_ms": round(sum(v) / 1000, 3), "calls": len(v)} for k, v in ops.items()),
                  key=lambda r: -r["total_ms"])[:top]
    return {"top_ops": rows, "nvtx_ranges": ranges}


def _pooled_summary(runs: list[dict], label: str) -> dict:
    """Mean over repeats of the per-run summary means (or the single run's summary)."""
    mine = [r["metrics"] for r in runs if r["label"] == label and r["status"] == "passed"]
    if not mine:
        return {}
    if len(mine) == 1:
        return mine[0]
    means = [m["toks_per_s"]["mean"] for m in mine if m.get("toks_per_s")]
    return {"toks_per_s": {"mean": sum(means) / len(means), "n": len(means)},
            "throughput_stable": all(m.get("throughput_stable") for m in mine), "repeats": len(mine)}
