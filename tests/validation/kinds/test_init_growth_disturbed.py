"""The init-growth flag against disturbed inits: other work on the machine only lengthens an init, so a disturbed
reference is left out while an undisturbed one is left, a growth measured on a disturbed launch is no flag, and an
absence of growth measured against a disturbed reference is no verdict."""

from validation.kinds import train_report

SHAKEN = {"disturbed": True, "text": "other processes used 3.0 cores"}
QUIET = {"disturbed": False, "text": "no interference"}


def _st(init_s, n_params, interference=None):
    out = {"init_s": init_s, "n_params": n_params}
    if interference is not None:
        out["init_interference"] = interference
    return out


def test_a_slow_disturbed_reference_is_left_out_for_an_undisturbed_one():
    # the smallest model's init was stretched from ~2 s to 30 s by other work; an undisturbed run of twice the
    # model took 3 s. The run of 4x the model taking 40 s grew 13.3x over the quiet reference for a model 2x its
    # size: a growth the disturbed reference (1.33x for 4x) hides.
    earlier = [("small", _st(30.0, 1e6, SHAKEN)), ("mid", _st(3.0, 2e6, QUIET))]
    g = train_report.init_growth(_st(40.0, 4e6, QUIET), earlier)
    assert g["reference"] == "mid"
    assert g["flagged"] is True
    assert "`small`" in g["text"]  # said which reference was left out


def test_a_disturbed_launch_is_not_flagged_but_inconclusive():
    g = train_report.init_growth(_st(30.0, 1e6, SHAKEN), [("small", _st(2.0, 1e6, QUIET))])
    assert g["flagged"] is False
    assert g.get("inconclusive") is True
    assert "inconclusive" in g["text"].lower()
    # a disturbed launch that did not grow did not grow: a verdict
    g = train_report.init_growth(_st(3.0, 1e6, SHAKEN), [("small", _st(2.0, 1e6, QUIET))])
    assert g["flagged"] is False and not g.get("inconclusive")
    # no interference record at all: flagged as before
    g = train_report.init_growth(_st(30.0, 1e6), [("small", _st(2.0, 1e6))])
    assert g["flagged"] is True and not g.get("inconclusive")


def test_no_growth_against_only_a_disturbed_reference_is_inconclusive():
    g = train_report.init_growth(_st(12.0, 2e6, QUIET), [("small", _st(30.0, 1e6, SHAKEN))])
    assert g["flagged"] is False
    assert g.get("inconclusive") is True
    # a growth over a disturbed reference stands: the reference's undisturbed init can only be shorter
    g = train_report.init_growth(_st(60.0, 1e6, QUIET), [("small", _st(10.0, 1e6, SHAKEN))])
    assert g["flagged"] is True and not g.get("inconclusive")


def test_init_interference_covers_the_init_period_only():
    # samples every 2 s from unix 1000; other processes use 8 cores of 8 (the launch leaves them none) only from
    # 1010 to 1016: the init (imports_done 2 s -> setup_done 8 s after a process start at 1000) is quiet, the
    # training after it disturbed
    rows = []
    for i in range(0, 16):
        t = 1000.0 + 2 * i
        busy = 1010.0 < t <= 1016.0
        rows.append({"time": t, "node": "n0", "sample": i, "other_cpu_pct": 800.0 if busy else 0.0,
                     "ncpu": 8, "step_cores": 8, "steal_pct": 0.0})
    startup = {"process_start_unix": 1000.0, "imports_s": 2.0, "init_s": 6.0}
    rec = train_report.init_interference(rows, startup)
    assert rec is not None and rec["disturbed"] is False
    late = {"process_start_unix": 1000.0, "imports_s": 10.0, "init_s": 6.0}
    assert train_report.init_interference(rows, late)["disturbed"] is True
