"""A trainer launch's files and records read as validation.results.trainer_launch's records: the committed runs of
every multi-launch step decode strictly as LaunchRun and encode back unchanged; collect() reads status.json,
env.json's nodes and sdpa_audit.json as TrainerStatus, TrainerEnv (JobNode) and SdpaAudit and records the same
metrics as the string-key reading it replaced (the parent's code, kept here as the reference)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from validation.kinds import trainer
from validation.results.codec import decode, encode
from validation.results.trainer_launch import JobNode, LaunchRun, TrainerEnv, TrainerStatus

REPO = Path(__file__).resolve().parents[3]


def _runs():
    for path in sorted(REPO.glob("reports/**/results.json")):
        for name, step in json.loads(path.read_text()).get("steps", {}).items():
            for key in ("runs", "superseded"):
                for i, run in enumerate(step.get(key) or []):
                    yield f"{path}: steps.{name}.{key}[{i}]", run


def test_every_committed_run_decodes_strictly_and_encodes_back_unchanged():
    seen = 0
    for where, run in _runs():
        assert json.dumps(encode(decode(LaunchRun, run, where))) == json.dumps(run), where
        seen += 1
    assert seen > 0


def _parent_node_metrics(env: dict, known: dict) -> dict:
    """validation.kinds.trainer._node_metrics's reading of env.json before the records (the parent's code)."""
    nodes = env.get("nodes") or []
    for node in nodes:
        if isinstance(node, dict) and node.get("node"):
            known.setdefault(str(node["node"]), {}).update({k: node.get(k) for k in ("host", "gpus", "env")})
    return {"nodes": [str(n.get("node")) for n in nodes if isinstance(n, dict)],
            "gpus": [str(g) for n in nodes if isinstance(n, dict) for g in (n.get("gpus") or [])]}


ENVS = [
    {},
    {"nodes": None},
    {"nodes": []},
    {"nodes": [{"node": "n0", "host": "h0", "gpus": ["H100", "H100"], "env": {"NCCL_IB_HCA": "mlx5"}},
               {"node": "n1", "host": "h1", "gpus": ["H100"], "env": {}}]},
    {"nodes": [{"node": "n0"}, "not a node", 3, {"node": "", "gpus": None}, {"host": "h", "gpus": ["A100"]}]},
    {"nodes": [{"node": 7, "host": None, "gpus": [0, 1], "env": None, "rank0": True}]},
]


@pytest.mark.parametrize("env", ENVS)
def test_node_metrics_read_env_json_nodes_as_the_string_key_code_did(env):
    known_before: dict = {}
    expected = _parent_node_metrics(env, known_before)
    ctx = SimpleNamespace(results={"environment": {}})
    spec = SimpleNamespace(launcher="local", nnodes=1)
    lr = SimpleNamespace(nodes=[], job_id=None, duration_s=None)
    got = trainer._node_metrics(ctx, spec, lr, env, 100.0)
    assert got["nodes"] == expected["nodes"]
    assert got["gpus"] == expected["gpus"]
    assert ctx.results["environment"].get("nodes", {}) == known_before
    assert all(isinstance(n, JobNode) for n in decode(TrainerEnv, env, lenient=True).job_nodes())


def _parent_audit(audit: dict) -> dict:
    gpu = [r for r in audit.get("by_site", []) if r.get("device") == "cuda"]
    return {"calls": audit.get("calls", 0), "backends": audit.get("backends", []),
            "fallbacks": sum(r["calls"] for r in gpu if r.get("backend") == "math"),
            "by_site": audit.get("by_site", [])}


AUDITS = [
    {"calls": 0, "backends": [], "by_site": []},
    {"calls": 12, "backends": ["flash", "math"],
     "by_site": [{"site": "cmp", "backend": "flash", "device": "cuda", "dtype": "bfloat16", "calls": 8},
                 {"site": "win", "backend": "math", "device": "cuda", "dtype": "bfloat16", "calls": 3},
                 {"site": "win", "backend": "math", "device": "cpu", "dtype": "float32", "calls": 1}]},
    {"by_site": [{"site": "cmp", "backend": "math", "device": "cuda", "dtype": "float16", "calls": 2}]},
    {"calls": 5, "backends": {"math": 5}},
]


@pytest.mark.parametrize("audit", AUDITS)
def test_collect_records_the_sdpa_audit_as_the_string_key_code_did(audit, tmp_path, monkeypatch):
    out = tmp_path / "s" / "out"
    out.mkdir(parents=True)
    monkeypatch.setattr(trainer.contracts, "read_sdpa_audit", lambda _: audit)
    monkeypatch.setattr(trainer.contracts, "read_status_json",
                        lambda _: {"status": "failed", "reason": "oom", "step": 3})
    monkeypatch.setattr(trainer.train_report, "launch_metrics", lambda *a: {})
    ctx = SimpleNamespace(run_dir=tmp_path, results={"environment": {}}, rel=lambda p: str(p))
    step = SimpleNamespace(launch=SimpleNamespace(window=10, warmup_steps=0))
    spec = SimpleNamespace(out_dir="s/out", window=None, world_size=1, launcher="local", nnodes=1)
    lr = SimpleNamespace(status="ok", reason=None, nodes=[], job_id=None, duration_s=None)
    status, reason, m = trainer.collect(ctx, step, spec, lr)
    assert json.dumps(m["sdpa_audit"]) == json.dumps(_parent_audit(audit))
    assert (status, reason, m["trainer_status"]) == ("failed", "trainer ended failed: oom", "failed")


@pytest.mark.parametrize("written, expected", [
    ({}, (None, None, None)),
    ({"status": "completed", "step": 20}, ("completed", None, 20)),
    ({"status": "failed", "reason": "stalled", "step": "x", "notes": ["a"]}, ("failed", "stalled", None)),
])
def test_status_json_reads_as_a_trainer_status(written, expected):
    s = decode(TrainerStatus, written, "status.json", lenient=True)
    assert (s.status, s.reason, s.step) == expected


def _parent_earlier_startups(results: dict, exclude_csv) -> list[tuple[str, dict]]:
    """validation.kinds.train_report.earlier_startups before the records (the parent's code)."""
    found = []
    for name, step in results.get("steps", {}).items():
        candidates = [(name, step.get("metrics") or {})]
        candidates += [(f"{name}[{r.get('label')}]", r.get("metrics") or {})
                       for r in (step.get("runs") or []) if isinstance(r, dict)]
        for label, m in candidates:
            if isinstance(m.get("startup"), dict) and m.get("csv") != exclude_csv:
                found.append((label, m["startup"]))
    return found


def test_earlier_startups_and_init_growth_read_the_committed_runs_as_the_string_key_code_did():
    from validation.kinds import train_report
    seen = 0
    for path in sorted(REPO.glob("reports/**/results.json")):
        results = json.loads(path.read_text())
        parent = [(label, s) for label, s in _parent_earlier_startups(results, None)
                  if "milestones" in s]  # the start-ups init_growth can use (a problem or {} has no init_s)
        got = train_report.earlier_startups(results, None)
        assert [(label, encode(s)) for label, s in got] == parent, path
        for own in ({"init_s": 30.0, "n_params": 1e9}, {"init_s": 0.2, "n_params": 1e5}):
            assert train_report.init_growth(own, got) == train_report.init_growth(own, parent), path
        seen += len(got)
    assert seen > 0


TIMELINE = {"milestones": {"process_start": 0.0, "imports_done": 1.5, "setup_done": 3.25, "first_logged_step": 4.0},
            "time_to_first_step_s": 4.0, "slowest": {"setup_done": {"rank": 1, "s": 3.3}},
            "process_start_unix": 1000.5, "missing_milestones": ["first_forward"]}


@pytest.mark.parametrize("timeline, expected", [
    ({}, {}),
    ({"problem": "timeline.json: milestones must be an object"},
     {"problem": "timeline.json: milestones must be an object"}),
    (TIMELINE, {"milestones": TIMELINE["milestones"], "imports_s": 1.5, "init_s": 1.75, "first_step_s": 0.75,
                "time_to_first_step_s": 4.0, "slowest": TIMELINE["slowest"], "n_params": 1000.0,
                "process_start_unix": 1000.5, "missing": ["first_forward"]}),
])
def test_startup_metrics_read_timeline_json_as_a_timeline(timeline, expected):
    from validation.kinds import train_report
    assert train_report.startup_metrics(timeline, 1000) == expected
