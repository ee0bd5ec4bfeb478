"""benchmarks/bench_attention.py's choice of timed passes, on simulated passes: a first pass that only compiled does
not make a case slow (it did on the GPU run of 2026-11-26: the Triton path at S 2,048 was timed once), a case slow
on its second pass too is timed once, and a fast one gets its warm-up and repeats after an untimed first pass."""

from __future__ import annotations

from benchmark_scripts import load

bench = load("bench_attention")


class Passes:
    """`one()` of a case whose passes take the given (fwd, bwd) seconds in turn, the last one repeated."""

    def __init__(self, *durations):
        self.durations, self.calls, self.reset_at = list(durations), 0, None

    def one(self):
        self.calls += 1
        return self.durations[min(self.calls, len(self.durations)) - 1]

    def reset(self):
        self.reset_at = self.calls


def test_a_first_pass_that_compiled_does_not_make_the_case_slow():
    passes = Passes((14.0, 3.0), (0.004, 0.003))
    times = bench.timed_passes(passes.one, warmup=2, repeats=10, before_timing=passes.reset)
    assert times == [(0.004, 0.003)] * 10
    assert passes.calls == 1 + 1 + 2 + 10  # the compiling pass, the pass that showed it fast, warm-up, repeats
    assert passes.reset_at == 4  # the peak memory is reset after the warm-up, before the timed passes


def test_a_case_slow_on_its_second_pass_is_timed_once_by_that_pass():
    passes = Passes((30.0, 20.0), (12.0, None))
    times = bench.timed_passes(passes.one, warmup=2, repeats=10, before_timing=passes.reset)
    assert times == [(12.0, None)] and passes.calls == 2


def test_a_fast_case_is_timed_repeats_times_after_an_untimed_first_pass():
    passes = Passes((0.5, 0.25), (0.01, 0.02))
    times = bench.timed_passes(passes.one, warmup=0, repeats=3)
    assert times == [(0.01, 0.02)] * 3 and passes.calls == 4
    assert bench.timed_passes(Passes((9.0, 0.5)).one, warmup=0, repeats=2, slow_s=10.0) == [(9.0, 0.5)] * 2


def test_a_batched_case_counts_b_times_s_tokens():
    """--batch B: the pass runs B sequences and tokens/s counts B x S (issue 31's B 8 targets at 2,048)."""
    case = bench.run_case("dense", "small", 64, "cpu", "fp32", repeats=1, warmup=0, batch=3)
    assert case["batch"] == 3
    assert case["toks_per_s"] == 3 * 64 / case["times_s"]["fwdbwd"]["median"]


def test_an_unknown_launch_choice_is_refused_before_any_case_runs(capsys):
    """Every --*-choice flag takes auto or a name its module declares; a typo exits 2 naming the flag and the names
    (it used to start the CPU cases and fail, if at all, inside the nsa-triton case's subprocess)."""
    import pytest

    for flag in bench._CHOICE_FLAGS:
        known = bench._choices(bench._CHOICE_FLAGS[flag])
        assert known and all(isinstance(k, str) for k in known), flag
        with pytest.raises(SystemExit) as stop:
            bench.main([f"--{flag}", "nosuch", "--device", "cpu"])
        assert stop.value.code == 2, flag
        err = capsys.readouterr().err
        assert f"--{flag} 'nosuch': expected auto or one of {', '.join(known)}" in err, err


def test_a_case_sets_the_choice_each_flag_names(monkeypatch):
    """run_case sets the module constant beside each flag's names (DQ_CHOICES -> DQ_CHOICE) for the A/B."""
    import importlib

    import pytest

    for flag, name in bench._CHOICE_FLAGS.items():
        module, attribute = name.split(":")
        mod = importlib.import_module(module)
        setting = attribute.removesuffix("S")
        monkeypatch.setattr(mod, setting, getattr(mod, setting))  # restored after the test
        value = bench._choices(name)[-1]
        bench._set_choice(flag, value)
        assert getattr(mod, setting) == value, flag
        with pytest.raises(SystemExit, match=f"--{flag} 'nosuch': expected auto or one of"):
            bench._set_choice(flag, "nosuch")
