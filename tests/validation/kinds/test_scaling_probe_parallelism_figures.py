"""The parallelism step's recommendation against what its batch-size search can and cannot show, by hand: a batch the
search never reached (its `max` below the batch the runbook needs), a batch of 1 that does not fit, and a search
stopped by a failure that is not out of memory."""

from __future__ import annotations

from pathlib import Path

import pytest

from validation.kinds.parallelism.analysis import decide_recommendation
from validation.kinds.parallelism.records import Metrics
from validation.results.codec import decode
from validation.runbook.loader import load_runbook

REPO = Path(__file__).resolve().parents[3]
RB = """\
name: t
requirements: {{gpus: 0, backend: gloo}}
defaults: {{config: configs/tiny_cpu.yaml, args: {{steps: 5, batch_size: {need}}}, nproc_per_node: 2}}
phases:
  - name: p
    steps:
      - {{name: par, kind: parallelism, strategies: [ddp, fsdp], batch_search: {{start: 1, max: 64, steps: 3}}}}
"""


def _par(tmp_path, need: int):
    path = tmp_path / "rb.yaml"
    path.write_text(RB.format(need=need))
    return load_runbook(path, cwd=str(REPO)).steps()[0]


def _metrics(search: dict) -> Metrics:
    """Both strategies ran twice at the batch needed, passed, 10 of 80 GB (87.5% headroom), no difference."""
    strategies = {k: {"strategy": k, "runs": 2, "passed": 2, "oom": 0, "peak_alloc_gb": 8.0, "peak_reserved_gb": 10.0,
                      "toks_per_s": 1000.0} for k in ("ddp", "fsdp")}
    return decode(Metrics, {"strategies": strategies, "capacity": {"gb": 80.0, "device": "cuda"}, "comparisons": {},
                            "headroom": 0.2, "batch_search": search}, "metrics")


def _searched(largest, first_oom, tried, error=None) -> dict:
    return {"largest": largest, "first_oom": first_oom, "error": error,
            "tried": [{"batch": b, "fits": f} for b, f in tried]}


UP_TO_64 = [(1, True), (2, True), (4, True), (8, True), (16, True), (32, True), (64, True)]


def test_a_batch_beyond_the_searchs_max_is_decided_by_the_runs_that_ran_it(tmp_path):
    """The runbook needs 128 a rank; the search (max 64) fit every batch it tried and never tried 128. The runs at
    128 passed, none out of memory, at 10 of 80 GB: DDP fits with 87.5% headroom. (Read as 'largest 64 < 128', every
    strategy 'did not fit' and nothing was recommended.)"""
    search = {k: _searched(64, None, UP_TO_64) for k in ("ddp", "fsdp")}
    m = decide_recommendation(_par(tmp_path, 128), _metrics(search))
    assert m.batch_needed == 128
    assert (m.recommendation, m.regime) == ("ddp", "fits_with_headroom"), m.recommendation_reason
    assert m.recommendation_numbers["ddp"].fits is True
    assert m.recommendation_numbers["ddp"].headroom == pytest.approx(1 - 10 / 80)


def test_a_batch_of_one_that_does_not_fit_leaves_no_batch_that_does(tmp_path):
    """DDP's search ran out of memory at batch 1 (largest None, first OOM 1): the batch needed, 4, does not fit
    either, so DDP does not fit and FSDP (largest 16) is recommended. (A search that found no batch at all was
    read as saying nothing, and DDP was recommended on the runs alone.)"""
    search = {"ddp": _searched(None, 1, [(1, False)]),
              "fsdp": _searched(16, 17, [(1, True), (2, True), (4, True), (8, True), (16, True), (32, False),
                                         (24, False), (20, False), (18, False), (17, False)])}
    m = decide_recommendation(_par(tmp_path, 4), _metrics(search))
    assert (m.recommendation, m.regime) == ("fsdp", "does_not_fit"), m.recommendation_reason
    assert m.recommendation_numbers["ddp"].fits is False and m.recommendation_numbers["fsdp"].fits is True


def test_a_search_stopped_by_another_failure_says_nothing_of_the_batch_it_did_not_reach(tmp_path):
    """DDP's search fit 1, 2, 4 and stopped at 8 on a NaN loss (not out of memory); the runs at 8 passed, none out
    of memory: nothing showed 8 out of memory, so DDP fits. (Read as 'largest 4 < 8': does not fit.)"""
    search = {"ddp": _searched(4, None, [(1, True), (2, True), (4, True)], error="batch 8: exit code 1 (NaN loss)"),
              "fsdp": _searched(64, None, UP_TO_64)}
    m = decide_recommendation(_par(tmp_path, 8), _metrics(search))
    assert m.recommendation_numbers["ddp"].fits is True
    assert (m.recommendation, m.regime) == ("ddp", "fits_with_headroom"), m.recommendation_reason


def test_a_batch_the_search_found_out_of_memory_does_not_fit(tmp_path):
    """The search's own boundary: DDP fits up to 12 (first OOM 13); the batch needed 16 does not fit, 12 does."""
    tried = [(1, True), (2, True), (4, True), (8, True), (16, False), (12, True), (14, False), (13, False)]
    search = {"ddp": _searched(12, 13, tried), "fsdp": _searched(64, None, UP_TO_64)}
    m = decide_recommendation(_par(tmp_path, 16), _metrics(search))
    assert (m.recommendation, m.regime) == ("fsdp", "does_not_fit")
    m = decide_recommendation(_par(tmp_path, 12), _metrics(search))
    assert (m.recommendation, m.regime) == ("ddp", "fits_with_headroom")


def _info(device, gpus_gb=()):
    from validation.kinds.parallelism.records import RunInfo

    env = {"device": device, "devices": [{"index": i, "name": "NVIDIA H200", "memory_gb": gb}
                                         for i, gb in enumerate(gpus_gb)]}
    return decode(RunInfo, {"summary": None, "trace": None, "env": env}, "info")


def test_a_cpu_run_on_a_host_with_gpus_has_the_hosts_memory_per_rank_and_no_batch_search(tmp_path, monkeypatch):
    """configs/tiny_cpu.yaml trains on the CPU (device: cpu) even where CUDA is available, and env.json then lists
    the host's GPUs beside device "cpu". Its peak is the ranks' RSS: the memory a rank has is the host's 64 GiB / 2
    ranks = 32 GiB, and the batch-size search (which would double a CPU batch up to 64 without any OOM) is skipped.
    (Read as a GPU run: 139.8 GB of GPU memory a rank, and the search ran on the CPU.)"""
    from types import SimpleNamespace

    from validation.kinds.parallelism import analysis

    monkeypatch.setattr(analysis, "host_memory_gb", lambda: 64.0)
    par = _par(tmp_path, 4)  # nproc_per_node 2
    cap = analysis.capacity(par, [_info("cpu", (139.8, 139.8))] * 2)
    assert (cap.gb, cap.device) == (pytest.approx(32.0), "cpu"), cap
    ctx = SimpleNamespace(run_dir=tmp_path, winners=dict,
                          launch=lambda *a: pytest.fail("no batch-size search launch for CPU runs"))
    skipped = analysis.search_batches(par, Metrics(capacity=cap), ctx)
    assert skipped.skipped == analysis.CPU_SEARCH_SKIPPED
    # runs that trained on the GPU: the GPU's memory (a run that never wrote env.json says nothing)
    cap = analysis.capacity(par, [_info(None), _info("cuda:0", (79.6,))])
    assert (cap.gb, cap.device) == (pytest.approx(79.6), "cuda")
    # a run on the CPU of a host without GPUs: the host's memory per rank
    cap = analysis.capacity(par, [_info("cpu")])
    assert (cap.gb, cap.device) == (pytest.approx(32.0), "cpu")
