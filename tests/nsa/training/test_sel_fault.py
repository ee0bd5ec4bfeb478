"""NSA_FAULT=sel_v1_quadratic@SEQ: selection v1 made super-linearly slow above SEQ tokens, for the triage tests.

The fault must be honest: the same output, real O(S^2) work (counted here as comparisons; its time is what the
triage runbook, runbooks/triage_cpu.yaml, measures), only in v1 of the batched PyTorch path, only above SEQ. It lives outside the model
(nsa.training.model_faults), which the trainer installs into the layers it builds."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from nsa import toggles
from nsa.attention import selection
from nsa.config import ModelConfig
from nsa.model import NSAModel
from nsa.training import model_faults
from nsa_test_utils import make_attn, make_cfg, rand_x
from train_utils import TINY

SEQ = 48


@pytest.mark.parametrize("text,expected", [
    ("sel_v1_quadratic@256", toggles.Fault("sel_v1_quadratic", None, None, 256)),
    (" SEL_V1_QUADRATIC@0 ", toggles.Fault("sel_v1_quadratic", None, None, 0)),
    ("crash@3:1", toggles.Fault("crash", 3, 1)),  # the step faults are unchanged
])
def test_fault_syntax(text, expected):
    fault = toggles.parse("NSA_FAULT", {"NSA_FAULT": text})
    assert fault == expected
    assert toggles.Toggles.read({"NSA_FAULT": text}).fault == fault
    if fault.kind in toggles.MODEL_FAULT_KINDS:
        assert not any(fault.fires(step, rank) for step in range(5) for rank in range(3))  # never a step fault
    else:
        layer = make_attn(make_cfg(selection="v1"), seed=1)
        assert model_faults.install(layer, fault) == 0 and layer.range_builder is selection.selection_ranges_v1


@pytest.mark.parametrize("text", ["sel_v1_quadratic@", "sel_v1_quadratic@x", "sel_v1_quadratic@256:0",
                                  "sel_v1_quadratic", "sel_v1_quadratic@-5", "sel_v2_quadratic@256"])
def test_bad_fault_values_are_one_line_errors(text):
    with pytest.raises(ValueError) as err:
        toggles.parse("NSA_FAULT", {"NSA_FAULT": text})
    message = str(err.value)
    assert "NSA_FAULT" in message and "sel_v1_quadratic@SEQ" in message and "\n" not in message


def _layer(ranges: str, fault: str | None, prefill: str = "batched"):
    """A layer built from the config the toggles resolve to, with the fault installed as the trainer installs it."""
    tg = toggles.Toggles.read({"NSA_SEL_RANGES_V2": "1" if ranges == "v2" else "0",
                               "NSA_PREFILL_BATCHED": "1" if prefill == "batched" else "0", "NSA_FAULT": fault or ""})
    layer = make_attn(make_cfg().with_toggles(tg), seed=1)
    installed = model_faults.install(layer, tg.fault)
    assert installed == (1 if fault and ranges == "v1" else 0)
    return layer


@pytest.fixture
def spy(monkeypatch):
    """Every call of the fault's redundant pass: (query positions, comparisons made)."""
    calls = []
    real = model_faults.pairwise_block_overlap

    def counting(blocks, *args, **kwargs):
        counts, comparisons = real(blocks, *args, **kwargs)
        calls.append((blocks.shape[-2], comparisons))
        return counts, comparisons

    monkeypatch.setattr(model_faults, "pairwise_block_overlap", counting)
    return calls


def test_v1_output_is_unchanged_and_the_extra_work_is_quadratic_above_seq(spy):
    clean = _layer("v1", None)
    faulty = _layer("v1", f"sel_v1_quadratic@{SEQ}")
    assert clean.range_builder is selection.selection_ranges_v1
    assert faulty.range_builder.seq_len == SEQ and faulty.range_builder.builder is selection.selection_ranges_v1
    comparisons = {}
    for s in (SEQ // 2, SEQ, 2 * SEQ, 4 * SEQ):
        x = rand_x(2, s, faulty.cfg.dim, seed=3)
        spy.clear()
        with torch.no_grad():
            expected = clean(x)
            assert not spy  # the clean layer never does the extra work
            got = faulty(x)
        assert torch.equal(got, expected), f"seq {s}: the fault changed the output"
        if s <= SEQ:
            assert spy == [], f"seq {s} <= {SEQ}: no extra work expected"
        else:
            assert [n for n, _ in spy] == [s], spy  # one pass per forward, over all s query positions
            comparisons[s] = spy[0][1]
    cfg = faulty.cfg
    b, g, n = 2, cfg.n_kv_groups, cfg.n_sel
    for s, count in comparisons.items():
        assert count == b * g * s * s * n * n
    assert comparisons[4 * SEQ] == 4 * comparisons[2 * SEQ]  # doubling S quadruples the work


def test_v2_and_the_sequential_path_are_unaffected(spy):
    v2 = _layer("v2", f"sel_v1_quadratic@{SEQ}")
    assert v2.range_builder is selection.selection_ranges_v2
    x = rand_x(2, 4 * SEQ, v2.cfg.dim, seed=4)
    with torch.no_grad():
        v2(x)
    assert spy == []
    for seq in (SEQ, 0):  # one query per call there: not even a threshold of 0 is passed
        sequential = _layer("v1", f"sel_v1_quadratic@{seq}", prefill="sequential")
        assert sequential.cfg.prefill == "sequential"
        with torch.no_grad():
            sequential(rand_x(1, 2 * SEQ, v2.cfg.dim, seed=5))
        assert spy == []


def test_the_layer_reads_no_toggle(monkeypatch, spy):
    """NSA_* variables are read once, at start-up (Toggles.read), and reach a layer only through its config."""
    monkeypatch.setenv("NSA_SEL_RANGES_V2", "0")
    monkeypatch.setenv("NSA_PREFILL_BATCHED", "0")
    monkeypatch.setenv("NSA_KERNEL", "triton")
    monkeypatch.setenv("NSA_FAULT", f"sel_v1_quadratic@{SEQ}")
    layer = make_attn(make_cfg(), seed=1)
    assert (layer.cfg.selection, layer.cfg.prefill, layer.cfg.kernel) == ("v2", "batched", "auto")
    assert layer.range_builder is selection.selection_ranges_v2
    v1 = make_attn(make_cfg(selection="v1", kernel="torch"), seed=1)
    assert v1.range_builder is selection.selection_ranges_v1  # the fault only where the trainer installs it
    with torch.no_grad():
        v1(rand_x(1, 2 * SEQ, v1.cfg.dim, seed=6))
    assert spy == []


def test_pairwise_block_overlap_counts_shared_blocks():
    blocks = torch.tensor([[[0, 1], [0, -1], [2, 1]]])  # one sequence, 3 queries, n_sel 2
    counts, comparisons = model_faults.pairwise_block_overlap(blocks, max_elements=4)  # forces 1-query chunks
    # query 0 {0,1}: shares 0 and 1 with itself (2), 0 with q1 (1), 1 with q2 (1)
    assert counts.tolist() == [[4, 2, 3]] and comparisons == 3 * 3 * 2 * 2


def test_install_goes_into_every_v1_layer_of_a_model_and_nowhere_else():
    """What the trainer does once its model is built (nsa.training.trainer: model_faults.install)."""
    tg = toggles.Toggles.read({"NSA_SEL_RANGES_V2": "0", "NSA_FAULT": f"sel_v1_quadratic@{SEQ}"})
    model_cfg = ModelConfig(vocab_size=32, n_layers=2, nsa=make_cfg()).with_toggles(tg)
    model = NSAModel(model_cfg)
    assert model_faults.install(model, tg.fault) == 2
    assert all(block.attn.range_builder.seq_len == SEQ for block in model.blocks)
    assert model_faults.install(NSAModel(dataclasses.replace(model_cfg, attention="dense")), tg.fault) == 0
    assert model_faults.install(NSAModel(model_cfg), toggles.Toggles.read({"NSA_FAULT": "crash@3"}).fault) == 0


@pytest.mark.parametrize("seq, bites", [(64, True), (48, False), (32, False)])
def test_the_trainer_says_when_the_fault_cannot_bite_at_its_sequence_length(tmp_path, seq, bites):
    """The fault works above SEQ tokens only: a run whose sequences are SEQ tokens or shorter is told it has no
    effect (as a run without the v1 batched torch path is), one with longer sequences is not."""
    import json

    from nsa.training import distributed, trainer
    from nsa.training.cli import resolve_config
    from nsa.training.flags import build_parser

    out = tmp_path / "out"
    argv = ["--config", str(TINY), "--out-dir", str(out), "--steps", "1", "--batch-size", "1", "--seq-len", str(seq)]
    cfg, path = resolve_config(build_parser().parse_args(argv), environ={})
    tg = toggles.Toggles.read({"NSA_FAULT": f"sel_v1_quadratic@{SEQ}", "NSA_SEL_RANGES_V2": "0",
                               "NSA_PREFILL_BATCHED": "1", "NSA_KERNEL": "torch", "NSA_TB_DISABLE": "1"})
    info = distributed.init(cfg.train.device, cfg.train.pg_timeout_s)
    trainer.Trainer(cfg, path, info, tg, False, ["nsa-train", *argv])
    notes = [n for n in json.loads((out / "status.json").read_text())["notes"] if "sel_v1_quadratic" in n]
    assert len(notes) == 1 and ("no effect" not in notes[0]) == bites, notes
    if not bites:
        assert f"this run's sequences are {seq} tokens" in notes[0]
