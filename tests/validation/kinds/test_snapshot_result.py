"""The snapshot kind's Result (validation.kinds.snapshot): every committed snapshot step record decodes strictly into
it and encodes back unchanged (the whole step entry: its frame, metrics and artifacts, the step's and the metrics'
keys in the same order, numbers of the same JSON type; the PCIe record's own keys, which a Pcie writes before the
links' keys it keeps in `extra`, key order aside); its metrics are typed (a Pcie for the GPUs' links)."""

from __future__ import annotations

import json
from pathlib import Path

from validation.kinds import get
from validation.kinds.snapshot import Metrics, Pcie, Result
from validation.results.codec import decode, encode
from results_records import committed_steps


def test_every_committed_snapshot_step_decodes_strictly_and_encodes_back_unchanged():
    seen = without_pcie = 0
    for where, step in committed_steps("snapshot"):
        result = decode(Result, step, where)
        out = encode(result)
        assert json.dumps(out, sort_keys=True) == json.dumps(step, sort_keys=True), where
        assert list(out) == list(step) and list(out["metrics"]) == list(step["metrics"]), where
        m = result.metrics
        assert isinstance(m, Metrics) and m.files and (m.pcie is None or isinstance(m.pcie, Pcie)), where
        assert get("snapshot").read(step) == result
        without_pcie += m.pcie is None  # a record from before the PCIe links were recorded: neither key
        seen += 1
    assert seen >= 3 and without_pcie >= 1


def test_the_metrics_encode_as_the_dict_writer_wrote_them():
    """Every snapshot writes pcie_gen_min and pcie (null and the 'not measured' sentence without a GPU); nodes only
    under launcher slurm; a step that never ran writes {} (blank metrics)."""
    cpu = Metrics(git_sha="abc", gpu_count=0, files=["snapshot/git_sha.txt"],
                  pcie=Pcie("PCIe: not measured", {"gpus": []}))
    assert encode(cpu) == {"git_sha": "abc", "gpu_count": 0, "files": ["snapshot/git_sha.txt"], "problems": [],
                           "pcie_gen_min": None, "pcie": {"text": "PCIe: not measured", "gpus": []}}
    assert list(encode(Metrics(nodes=["a"]))) == ["git_sha", "gpu_count", "files", "problems", "nodes"]
    assert encode(Result())["metrics"] == {} and decode(Result, {"metrics": {}}).metrics is None


def test_the_hooks_read_the_result_and_a_damaged_step_leniently():
    kind = get("snapshot")
    step = Result(reason="nvidia-smi not found; no git", artifacts=["snapshot/x.txt"],
                  metrics=Metrics(git_sha="abc", gpu_count=1, problems=["nvidia-smi not found", "no git"],
                                  pcie=Pcie("PCIe: Gen4")))
    assert kind.view(step, {"reason": step.reason}) == {"reason": None}  # shown as the problems
    assert kind.view(Result(reason="other", metrics=step.metrics), {"reason": "other"}) == {}
    text = kind.blocks(step)[0].items
    assert text[0] == "Git SHA: `abc`; GPUs: 1" and "PCIe: Gen4" in text and "Problem: no git" in text
    assert text[-1] == "Artifacts: `snapshot/x.txt`"  # no files in the metrics: the step's artifacts
    for damaged in (None, {"metrics": None}, {"metrics": [1]}, {"metrics": {"pcie": 3, "files": "x"}}):
        assert kind.blocks(kind.read(damaged))[0].items[0] == "Git SHA: `n/a`; GPUs: n/a"
        assert kind.view(kind.read(damaged), {"reason": None}) == {}


def test_a_slurm_snapshot_returns_every_nodes_record_and_fails_short_of_a_node(tmp_path, monkeypatch):
    """launcher slurm: the nodes' own snapshots join results' environment and the step's metrics and artifacts; a node
    that left none fails the step, saying so beside the machine's problems (the run itself: a Slurm cluster's test,
    tests/validation/launch/test_slurm.py)."""
    from types import SimpleNamespace

    from validation.kinds import snapshot
    from validation.launch.spec import LaunchResult, LaunchSpec

    def fake_snapshot(step_dir, cwd, timeout_s):
        step_dir.mkdir(parents=True, exist_ok=True)
        (step_dir / "git_sha.txt").write_text("abc\n")
        return {"git_sha": "abc", "gpu_count": 0}, [step_dir / "git_sha.txt"], ["nvidia-smi not found"]

    monkeypatch.setattr(snapshot.environment, "snapshot", fake_snapshot)
    node = tmp_path / "snap" / "nodes" / "nodeA"
    node.mkdir(parents=True)
    (node / "environment.json").write_text(json.dumps({"host": "nodeA", "gpu_count": 0, "other": 1}))
    spec = LaunchSpec(argv=["python"], env={}, nnodes=2, label="nodes")
    lr = LaunchResult(status="ok", returncode=0, duration_s=1.0, argv=["sbatch"], log_path=tmp_path / "log",
                      rank_logs={}, reason="exited 0", excerpt=None, stack_dumps=[], attempts=1)
    results = {"environment": {"host": "here"}}
    ctx = SimpleNamespace(step=SimpleNamespace(name="snap", launch=SimpleNamespace(timeout_s=10)), launches=[spec],
                          run_dir=tmp_path, cwd=tmp_path, results=results, launch=lambda s, i, n: lr,
                          rel=lambda p: str(Path(p).relative_to(tmp_path)))
    result = get("snapshot").run(None, ctx)
    assert result.status == "failed" and result.metrics.nodes == ["nodeA"]
    assert result.reason == "nvidia-smi not found; node snapshots: 1 of 2 (exited 0)"
    assert result.metrics.problems == ["nvidia-smi not found"] and result.metrics.git_sha == "abc"
    assert result.artifacts == ["snap/git_sha.txt", "snap/nodes/nodeA/environment.json"]
    assert results["environment"]["git_sha"] == "abc" and results["environment"]["host"] == "here"
    assert results["environment"]["nodes"]["nodeA"]["snapshot"] == {"gpu_count": 0, "gpus": None, "torch": None,
                                                                    "host": "nodeA", "comm_env": None}
    ctx.launches = []  # in-process only: passed, its problems the reason
    alone = get("snapshot").run(None, ctx)
    assert (alone.status, alone.reason, alone.metrics.nodes) == ("passed", "nvidia-smi not found", [])


def test_a_node_whose_snapshot_is_cut_off_or_missing_has_not_snapshotted_itself(tmp_path, monkeypatch):
    """Two nodes of two left a directory, but one's environment.json is cut off and the other's missing: neither is
    counted (0 of 2), the step fails naming each node and what is wrong, and nothing of theirs joins the
    environment."""
    from types import SimpleNamespace

    from validation.kinds import snapshot
    from validation.launch.spec import LaunchResult, LaunchSpec

    monkeypatch.setattr(snapshot.environment, "snapshot", lambda step_dir, cwd, timeout_s: ({"git_sha": "abc"}, [], []))
    for name in ("nodeA", "nodeB"):
        (tmp_path / "snap" / "nodes" / name).mkdir(parents=True)
    (tmp_path / "snap" / "nodes" / "nodeA" / "environment.json").write_text('{"host": "nodeA", "gpu_co')
    (tmp_path / "snap" / "nodes" / "nodeB" / "stdout.txt").write_text("killed\n")
    lr = LaunchResult(status="ok", returncode=0, duration_s=1.0, argv=["sbatch"], log_path=tmp_path / "log",
                      rank_logs={}, reason="exited 0", excerpt=None, stack_dumps=[], attempts=1)
    results = {"environment": {}}
    ctx = SimpleNamespace(step=SimpleNamespace(name="snap", launch=SimpleNamespace(timeout_s=10)),
                          launches=[LaunchSpec(argv=["python"], env={}, nnodes=2, label="nodes")],
                          run_dir=tmp_path, cwd=tmp_path, results=results, launch=lambda s, i, n: lr,
                          rel=lambda p: str(Path(p).relative_to(tmp_path)))
    result = get("snapshot").run(None, ctx)
    assert result.status == "failed" and result.metrics.nodes == []
    assert "node nodeA: environment.json is not valid JSON" in result.reason
    assert "node nodeB: environment.json missing" in result.reason
    assert result.reason.endswith("node snapshots: 0 of 2 (exited 0)")
    assert results["environment"].get("nodes") == {}
    assert "snap/nodes/nodeA/environment.json" in result.artifacts  # the damaged file is kept as evidence
