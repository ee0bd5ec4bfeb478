"""summary.json's steady-state throughput (the first step, with its lazy initialization and compilation, left out)
against figures computed by hand from the step times, the printed block naming the steps each figure covers, the
reader's checks of the new fields, and the memory model's label for what its activation figure stands for."""

from __future__ import annotations

import json

import pytest

from nsa.training import outputs
from nsa.training.comm_model import activations_basis
from nsa.training.summary import SummaryAccumulator, format_summary


def _resumed_run() -> dict:
    """Steps 5, 6, 7, 8 of a run resumed at 4: the first takes 10 s (compilation), the others 1, 2 and 1 s; 8 tokens
    and 2 samples per step."""
    acc = SummaryAccumulator(parallel="none", world_size=1, device_type="cpu", tokens_per_step=8,
                             samples_per_step=2, steps_planned=8)
    for step, dt in ((5, 10.0), (6, 1.0), (7, 2.0), (8, 1.0)):
        acc.add(step, dt, 8 / dt, 1.0, 0.1, None)
    acc.set_peaks(0.2, None)
    return acc.build("completed", None, None, None, None)


def test_steady_state_throughput_leaves_the_first_step_out_by_hand():
    s = _resumed_run()
    assert s["tokens_per_s"] == pytest.approx(32 / 14.0)  # every step: 4 x 8 tokens over 14 s
    assert s["tokens_per_s_excl_first"] == pytest.approx(24 / 4.0)  # steps 6-8: 3 x 8 tokens over 4 s
    assert s["samples_per_s_excl_first"] == pytest.approx(6 / 4.0)
    assert (s["throughput_first_step"], s["last_step"]) == (6, 8)


def test_one_step_has_no_steady_state_figure():
    acc = SummaryAccumulator(parallel="none", world_size=1, device_type="cpu", tokens_per_step=8,
                             samples_per_step=2, steps_planned=1)
    acc.add(1, 0.5, 16.0, 3.0, 0.1, None)
    s = acc.build("completed", None, None, None, None)
    assert s["tokens_per_s"] == 16.0
    assert s["tokens_per_s_excl_first"] is None and s["throughput_first_step"] is None
    assert "throughput_tokens_per_sec_all_steps: 16 (global, steps 1-1)" in format_summary(s)


def test_printed_block_names_the_steps_each_throughput_covers():
    lines = format_summary(_resumed_run()).splitlines()
    assert "throughput_tokens_per_sec: 6 (global, steps 6-8: the first step left out)" in lines
    assert "throughput_tokens_per_sec_all_steps: 2 (global, steps 5-8)" in lines


def test_reader_checks_the_new_fields_and_reads_a_file_written_before_them(tmp_path):
    s = _resumed_run()
    path = tmp_path / outputs.SUMMARY_JSON
    path.write_text(json.dumps({**s, "tokens_per_s_excl_first": "fast"}))
    with pytest.raises(outputs.ContractError, match="tokens_per_s_excl_first must be a number or null"):
        outputs.read_summary(path)
    path.write_text(json.dumps({**s, "throughput_first_step": 0}))
    with pytest.raises(outputs.ContractError, match="throughput_first_step must be a positive integer"):
        outputs.read_summary(path)
    older = {k: v for k, v in s.items() if k not in outputs.SUMMARY_OPTIONAL}
    path.write_text(json.dumps(older))
    read = outputs.read_summary(path)
    assert read["tokens_per_s_excl_first"] is None and read["tokens_per_s"] == pytest.approx(32 / 14.0)


def test_the_activation_figure_is_labelled_exact_on_cpu_only():
    assert activations_basis("cpu", "torch").startswith("exact")
    for kernel in ("torch", "triton"):
        basis = activations_basis("cuda", kernel)
        assert basis.startswith("estimate") and kernel in basis
