"""summary.json and timeline.json of single-process runs (in this process), and their readers."""

from __future__ import annotations

import json
import math
import re

import pytest
import yaml

from train_checks import check_summary_against_csv, check_timeline
from train_utils import TINY, read_csv

from nsa.training import cli as train
from nsa.training import outputs
from nsa.training.outputs import ContractError, read_summary, read_timeline


def _run(tmp_path, *flags, **train_cfg):
    raw = yaml.safe_load(TINY.read_text())
    raw["train"].update({"seq_len": 128, "batch_size": 2, "save_every": 1000, **train_cfg})
    tmp_path.mkdir(parents=True, exist_ok=True)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    out = tmp_path / "out"
    code = train.main(["--config", str(cfg), "--out-dir", str(out), *flags])
    return code, out


def test_single_process_summary_and_timeline(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    code, out = _run(tmp_path, "--steps", "3", "--log-every", "1")
    assert code == 0
    summary = check_summary_against_csv(out, world_size=1, batch=2, accum=1, seq_len=128)
    assert summary["steps"] == 3 and summary["first_step"] == 1 and summary["parallel"] == "none"
    assert summary["comm"]["counted_by"] is None and summary["comm_time_s"] == 0.0 == summary["comm_share"]
    assert summary["comm_model"]["bytes_per_step"] == 0 and summary["comm_model_matches"] is None
    assert summary["memory_model"]["buffers"] == 0  # no DDP buckets, no FSDP gathers
    rows = read_csv(out / outputs.TRAINING_CSV)
    assert all(r["comm_bytes"] == "0" and float(r["comm_time_s"]) == 0 for r in rows)
    check_timeline(out, world_size=1)
    printed = capsys.readouterr().out
    assert "Training Summary" in printed and "num_steps: 3" in printed and "resident set size" in printed


def test_a_stopped_run_still_writes_its_summary(tmp_path, monkeypatch):
    monkeypatch.setenv("NSA_TB_DISABLE", "1")
    monkeypatch.setenv("NSA_FAULT", "nan@2")
    code, out = _run(tmp_path, "--steps", "4")
    assert code == 3
    summary = read_summary(out)
    assert summary["status"] == "nonfinite" and summary["steps"] == 1 and summary["last_step"] == 1
    assert math.isfinite(summary["final_loss"])
    timeline = read_timeline(out)
    assert timeline["missing_milestones"] == []  # step 1 completed


def test_fsdp_no_reshard_flag_and_key(tmp_path):
    from nsa.training.config import ConfigError

    args = train.build_parser().parse_args(["--config", str(TINY), "--fsdp-no-reshard"])
    cfg, _ = train.resolve_config(args)
    assert cfg.train.parallel == "fsdp" and cfg.train.fsdp_reshard is False
    args = train.build_parser().parse_args(["--config", str(TINY), "--fsdp"])
    assert train.resolve_config(args)[0].train.fsdp_reshard is True
    code = train.main(["--config", str(TINY), "--fsdp-no-reshard", "--ddp", "1", "--out-dir", str(tmp_path / "x")])
    assert code == 2 and not (tmp_path / "x").exists()
    raw = yaml.safe_load(TINY.read_text())
    raw["train"]["fsdp_reshard"] = "no"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError, match=r"'train.fsdp_reshard' must be true or false"):
        train.load_config(bad)


def _valid_summary(tmp_path) -> dict:
    from nsa.training.summary import SummaryAccumulator

    acc = SummaryAccumulator(parallel="none", world_size=1, device_type="cpu", tokens_per_step=8,
                             samples_per_step=2, steps_planned=2)
    acc.add(1, 0.5, 16.0, 3.0, 0.1, None)
    acc.set_peaks(0.2, None)
    data = acc.build("completed", None, None, None, None)
    assert set(data) == set(outputs.SUMMARY_FIELDS)  # every field written is documented, and the other way round
    outputs.write_json(tmp_path / outputs.SUMMARY_JSON, data)
    assert read_summary(tmp_path)["tokens_per_s"] == 16.0
    return data


@pytest.mark.parametrize("change,message", [
    (lambda d: d.pop("comm"), "missing field(s) comm"),
    (lambda d: d.update(schema=2), "schema 2"),
    (lambda d: d.update(steps=-1), "steps must be a non-negative integer"),
    (lambda d: d.update(avg_step_time_s="fast"), "avg_step_time_s must be a number or null"),
    (lambda d: d.update(final_loss=None), "step statistics are null"),
    (lambda d: d.update(status="fine"), "status 'fine'"),
    (lambda d: d["comm"].update(per_step=[{"kind": "gossip", "calls": 1, "bytes": 2}]), "comm.per_step: bad entry"),
    (lambda d: d["comm"].update(total=[{"kind": "all_reduce", "calls": 1, "bytes": -2}]),
     "all_reduce.bytes must be a non-negative integer"),
])
def test_read_summary_rejects_a_broken_file_in_one_line(tmp_path, change, message):
    data = _valid_summary(tmp_path)
    change(data)
    path = tmp_path / outputs.SUMMARY_JSON
    path.write_text(json.dumps(data))
    with pytest.raises(ContractError) as err:
        read_summary(path)
    assert message in str(err.value) and str(path) in str(err.value) and "\n" not in str(err.value)


def test_read_timeline_checks_names_and_order(tmp_path):
    path = tmp_path / outputs.TIMELINE_JSON
    good = {"schema": 1, "process_start_source": "/proc/self/stat", "process_start_unix": 1.0, "world_size": 1,
            "milestones": {"process_start": 0.0, "imports_done": 2.0, "model_built": 3.0},
            "ranks": None, "slowest": None, "time_to_first_step_s": None}
    outputs.write_json(path, good)
    assert read_timeline(path)["missing_milestones"][0] == "process_group_ready"
    for marks, message in (({"imports_done": 2.0, "model_built": 1.0}, "model_built (1.0 s) comes before"),
                           ({"lunch": 1.0}, "unknown milestone 'lunch'"),
                           ({"imports_done": -1}, "must be non-negative seconds")):
        outputs.write_json(path, {**good, "milestones": marks})
        with pytest.raises(ContractError, match=re.escape(message)):
            read_timeline(path)
    with pytest.raises(ContractError, match="no timeline.json"):
        read_timeline(tmp_path / "nowhere")
