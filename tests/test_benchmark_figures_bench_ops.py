"""benchmarks/bench_ops.py's figures from known counts (the counted layer replaced by hand-made counters): the table's
totals per length, --check's two rules (a total above MAX_OPS, a total that changes with S) and the reproduce line,
which carries the options of the run (and --check only where it was given)."""

from __future__ import annotations

import pytest

from benchmark_scripts import load


def _ops():
    """The script, loaded where TRITON_INTERPRET is set already (its import sets it for the process otherwise)."""
    return load("bench_ops")


def _counter(total: int, launches: int = 21):
    c = _ops().OpCounter()
    c.ops.update({"mm": 16, "add": total - 16})
    c.inside.update({"add": 3})
    c.launches.update({"_range_fwd_kernel": launches})
    return c


@pytest.fixture
def counted(monkeypatch):
    """main() over counters with the given totals per length; the process-wide choices it sets are restored."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    from nsa.attention import selection
    from nsa.attention.kernels.range_attn import host as range_host
    from nsa.attention.kernels.selected_attn import host as selected_host

    for module, name in ((selection, "TOPK_CHOICE"), (selected_host, "HOST_CHOICE"),
                         (selected_host, "FORCED_CHOICE"), (range_host, "GLUE_CHOICE")):
        monkeypatch.setattr(module, name, getattr(module, name))
    ops = _ops()
    monkeypatch.setattr(ops, "make_layer", lambda **kw: kw)

    def run(totals: dict[int, int], argv: list[str]) -> int:
        monkeypatch.setattr(ops, "count_layer", lambda layer, s, warmup=True: _counter(totals[s]))
        return ops.main(argv)

    return run


def test_a_run_without_check_reproduces_without_check(counted, capsys):
    assert counted({64: 90, 128: 90}, ["--seq-lens", "64,128", "--index-build", "torch"]) == 0  # no --check: 0
    text = capsys.readouterr().out
    assert "| **total ops** | **90** | **90** | 3 |" in text and "| triton launches | 21 | 21 | |" in text
    line = next(x for x in text.splitlines() if x.startswith("reproduce: "))
    assert line == ("reproduce: TRITON_INTERPRET=1 PYTHONPATH=. python benchmarks/bench_ops.py --seq-lens 64,128 "
                    "--index-build torch --topk-choice auto --sel-host-choice auto --sel-forced-choice auto "
                    "--range-glue-choice auto")


@pytest.mark.parametrize("totals, code, why", [
    ({64: 80, 128: 80}, 0, None),
    ({64: 81, 128: 81}, 1, "S=64: 81 ops > 80"),
    ({64: 70, 128: 72}, 1, "the total grows with S: {64: 70, 128: 72}"),
])
def test_check_rules(counted, capsys, totals, code, why):
    assert counted(totals, ["--seq-lens", "64,128", "--check", "--topk-choice", "topk"]) == code
    out, err = capsys.readouterr()
    assert next(x for x in out.splitlines() if x.startswith("reproduce: ")).endswith(
        "--topk-choice topk --sel-host-choice auto --sel-forced-choice auto --range-glue-choice auto --check")
    if why:
        assert why in err
    else:
        assert "check passed: 80 <= 80 ops at every S" in out
