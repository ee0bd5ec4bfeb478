"""validation.contracts: the readers of the trainer's small files never raise, and what they derive (the DDP
compression in effect, settings the trainer ignored) comes from those files, not from its log."""

from __future__ import annotations

import json
import os
import time

from validation import contracts


def test_missing_or_damaged_files_read_as_nothing(tmp_path):
    assert contracts.read_env_json(tmp_path) == {} and contracts.read_sdpa_audit(tmp_path) == {}
    assert contracts.read_status_json(tmp_path) is None and contracts.read_status_json(None) is None
    (tmp_path / "env.json").write_text("{not json")
    (tmp_path / "status.json").write_text("[1, 2]")  # JSON, but not an object
    assert contracts.read_env_json(tmp_path) == {} and contracts.read_status_json(tmp_path) is None
    assert contracts.stack_dumps(tmp_path / "nowhere") == [] and contracts.error_files(None, 0) == []
    assert not contracts.halted(tmp_path)


def test_status_json_of_an_earlier_launch_is_not_this_ones(tmp_path):
    path = tmp_path / "status.json"
    path.write_text(json.dumps({"status": "completed", "step": 5}))
    old = time.time() - 100
    os.utime(path, (old, old))
    assert contracts.read_status_json(tmp_path) == {"status": "completed", "step": 5}
    assert contracts.read_status_json(tmp_path, since=time.time()) is None
    assert contracts.read_status_json(tmp_path, since=old + 0.5) is not None  # 1 s of clock slack


def test_ddp_compression_is_the_toggle_in_effect_under_ddp_only():
    ddp = {"parallel": "ddp", "toggles": {"ddp_compress": "bf16", "ddp_bucket_mb": "50"}}
    assert contracts.ddp_compression(ddp) == "bf16"
    assert contracts.ddp_compression({**ddp, "toggles": {"ddp_compress": "none"}}) is None
    assert contracts.ddp_compression({**ddp, "parallel": "fsdp"}) is None  # the trainer ignores it there
    assert contracts.ddp_compression({**ddp, "parallel": "single"}) is None
    assert contracts.ddp_compression({}) is None and contracts.ddp_compression({"toggles": "garbled"}) is None


def test_ignored_settings_come_from_status_json_notes():
    status = {"notes": ["[ddp] world size 2", "NSA_OPT_FUSED=1 is ignored: fused AdamW needs CUDA"]}
    assert contracts.ignored_settings(status, ["NSA_OPT_FUSED", "NSA_DDP_BUCKET_MB"]) == ["NSA_OPT_FUSED"]
    assert contracts.ignored_settings(None, ["NSA_OPT_FUSED"]) == []
    assert contracts.ignored_settings({"notes": [None, 3]}, ["NSA_OPT_FUSED"]) == []


def test_a_note_on_another_setting_whose_name_holds_this_one_is_not_this_ones():
    # a setting whose name is the start of another's: the note names the other one only
    status = {"notes": ["NSA_SEL_RANGES_V2=1 is ignored: the Triton selection builds its ranges itself"]}
    assert contracts.ignored_settings(status, ["NSA_SEL_RANGES", "NSA_SEL_RANGES_V2"]) == ["NSA_SEL_RANGES_V2"]
    assert contracts.ignored_settings(status, ["RANGES_V2"]) == []


def test_error_files_and_stack_dumps_of_this_launch(tmp_path):
    (tmp_path / "error_rank1.txt").write_text("Traceback ...")
    (tmp_path / "error_rankX.txt").write_text("not a rank")
    (tmp_path / "stackdump_rank0.txt").write_text("Current thread ...")
    (tmp_path / "stackdump_rank1.txt").write_text("")  # empty: not a dump
    (tmp_path / ".HALT").write_text("")
    assert [(rank, p.name) for _, rank, p in contracts.error_files(tmp_path, time.time() - 10)] == \
        [(1, "error_rank1.txt")]
    assert contracts.error_files(tmp_path, time.time() + 10) == []
    assert [p.name for p in contracts.stack_dumps(tmp_path)] == ["stackdump_rank0.txt"]
    assert contracts.halted(tmp_path)
