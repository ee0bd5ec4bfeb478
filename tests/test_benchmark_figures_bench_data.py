"""benchmarks/bench_data.py's figures from known timings (each builder replaced by one that takes a given time on a
fake clock): builders alternated A B A B, the equality check and the warm-up never timed, milliseconds per sample
(a round's time over its samples) as min / median / max, and the median of the per-round ratios; a builder whose
samples differ stops the benchmark before anything is timed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from benchmark_scripts import load

bench = load("bench_data")

# seconds per sample of each builder's timed calls, round by round; untimed calls (3 checks, 1 warm-up) take 1,000 s
TIMED = {"per-segment": [0.008, 0.006, 0.020], "vectorized": [0.002, 0.003, 0.004]}
UNTIMED = 3 + 1


def _fake(monkeypatch, *, differ=False):
    clock = {"now": 0.0}
    calls: list[str] = []
    seen: dict[str, int] = {}

    def builder(name):
        def sample(src, index):
            n = seen[name] = seen.get(name, -1) + 1
            calls.append(name)
            clock["now"] += 1000.0 if n < UNTIMED else TIMED[name][(n - UNTIMED) // 2]
            return torch.tensor([index + (differ and name == "vectorized")])
        return sample

    for name in TIMED:
        monkeypatch.setitem(bench.BUILDERS, name, builder(name))
    monkeypatch.setattr(bench, "time", SimpleNamespace(perf_counter=lambda: clock["now"]))
    return calls


def test_rounds_alternate_and_figures_are_per_sample_and_per_round(monkeypatch, tmp_path, capsys):
    calls = _fake(monkeypatch)
    out = tmp_path / "data.json"
    argv = ["--seq-lens", "64", "--vocab", "16", "--rounds", "3", "--samples", "2", "--json", str(out)]
    assert bench.main(argv) == 0
    assert calls[-12:] == (["per-segment"] * 2 + ["vectorized"] * 2) * 3  # A B A B A B, 2 samples each
    result = json.loads(out.read_text())["results"][0]
    seg, vec = result["ms_per_sample"]["per-segment"], result["ms_per_sample"]["vectorized"]
    assert (seg["min"], seg["median"], seg["max"]) == pytest.approx((6.0, 8.0, 20.0))
    assert (vec["min"], vec["median"], vec["max"]) == pytest.approx((2.0, 3.0, 4.0))
    # per round 8/2, 6/3, 20/4: median 4 (the ratio of the medians, 8/3, would be 2.7)
    assert result["ratio_median"] == pytest.approx(4.0) and result["ratio_range"] == pytest.approx([2.0, 5.0])
    text = capsys.readouterr().out
    assert text.startswith("# python ") and " ".join(argv) in text.splitlines()[0]
    assert "4.0x (rounds 2.0-5.0)" in text


def test_builders_that_differ_stop_before_timing(monkeypatch):
    calls = _fake(monkeypatch, differ=True)
    with pytest.raises(SystemExit, match="sample 0 differs; nothing timed"):
        bench.main(["--seq-lens", "64", "--vocab", "16"])
    assert len(calls) == 2


@pytest.mark.parametrize("argv", [["--seq-lens", "0"], ["--seq-lens", "x"], ["--rounds", "0"], ["--vocab", "8"]])
def test_bad_options_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2 and argv[0] in capsys.readouterr().err


def test_the_per_segment_baseline_builds_the_library_s_samples():
    from nsa.training.synthetic import SyntheticSource

    src = SyntheticSource(vocab_size=300, seq_len=700, batch_size=1, rank=2, world_size=4, seed=11)
    for index in range(3):
        assert torch.equal(bench.per_segment_sample(src, index), src.sample(index))
