"""NSA_* values against the documented table (README "Environment toggles", nsa.toggles): each value form means
what the table says or is an error naming the variable; NSA_FAULT fires at the step and rank it names; the named
ranges of nsa.observability stay balanced when their body raises and cost nothing when off."""

from __future__ import annotations

import pytest
import torch

from nsa import observability, toggles


@pytest.mark.parametrize("raw,expected", [
    ("0", False), ("1", True), ("true", True), ("false", False), (" 1 ", True), ("yes", True), ("no", False),
    ("ON", True), ("off", False), ("", None), ("   ", None),
])
def test_boolean_forms_mean_what_the_table_says(raw, expected):
    assert toggles.parse("NSA_SEL_RANGES_V2", {"NSA_SEL_RANGES_V2": raw}) is expected


@pytest.mark.parametrize("raw", ["2", "-1", "ture", "１", "٣", "0.0"])
def test_boolean_typos_are_errors_naming_the_variable(raw):
    with pytest.raises(ValueError, match=r"NSA_SEL_RANGES_V2=.*expected 0 or 1"):
        toggles.parse("NSA_SEL_RANGES_V2", {"NSA_SEL_RANGES_V2": raw})


@pytest.mark.parametrize("raw,expected", [("25", 25), (" 50 ", 50), ("007", 7), ("1048576", 1 << 20), ("", 25)])
def test_bucket_size_takes_decimal_counts(raw, expected):
    assert toggles.parse("NSA_DDP_BUCKET_MB", {"NSA_DDP_BUCKET_MB": raw}) == expected


@pytest.mark.parametrize("raw", ["+5", "1_0", "٢٥", "２５", "0", "-1", "1048577", "2.5"])
def test_bucket_size_that_is_no_plain_count_is_an_error_naming_the_variable(raw):
    """A positive integer written in ASCII digits, as NSA_FAULT's STEP, RANK and SEQ are: Python's int() would read
    '1_0' as 10 and the Arabic-Indic or full-width '25' as 25, a bucket size nobody wrote as such."""
    with pytest.raises(ValueError, match=r"NSA_DDP_BUCKET_MB=.*expected a positive integer"):
        toggles.parse("NSA_DDP_BUCKET_MB", {"NSA_DDP_BUCKET_MB": raw})
    assert "NSA_DDP_BUCKET_MB" in toggles.check("NSA_DDP_BUCKET_MB", raw)  # the runbook check refuses it too


@pytest.mark.parametrize("text,step,rank", [("crash@5", 5, None), ("hang@3:1", 3, 1), ("nan@1:0", 1, 0),
                                            ("csv_garble@2", 2, None)])
def test_a_step_fault_fires_at_its_step_and_rank_only(text, step, rank):
    fault = toggles.parse("NSA_FAULT", {"NSA_FAULT": text})
    fired = {(s, r) for s in range(0, 8) for r in range(3) if fault.fires(s, r)}
    assert fired == {(step, r) for r in range(3) if rank is None or r == rank}


def test_no_fault_without_the_variable():
    assert toggles.parse("NSA_FAULT", {}) is None and toggles.parse("NSA_FAULT", {"NSA_FAULT": " "}) is None
    assert toggles.Toggles.read({}).fault is None


@pytest.fixture
def fake_nvtx(monkeypatch):
    """A CUDA machine's NVTX, counted: the depth of open ranges and every push."""
    state = {"depth": 0, "pushed": []}

    def push(name):
        state["pushed"].append(name)
        state["depth"] += 1
        return state["depth"] - 1

    def pop():
        state["depth"] -= 1
        return state["depth"]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", push)
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", pop)
    yield state
    observability.configure(nvtx=False)


def test_ranges_are_popped_when_the_body_raises(fake_nvtx):
    observability.configure(nvtx=True)
    with pytest.raises(KeyError):
        with observability.span("nsa.sel"):
            with observability.span("nsa.sel.topk"):
                raise KeyError("inside")
    assert fake_nvtx["depth"] == 0 and fake_nvtx["pushed"] == ["nsa.sel", "nsa.sel.topk"]


def test_ranges_cost_nothing_when_off(fake_nvtx):
    observability.configure(nvtx=False)
    assert observability.span("nsa.cmp") is observability.span("nsa.win")  # one shared no-op context
    with observability.span("nsa.cmp"):
        pass
    assert fake_nvtx["pushed"] == []
