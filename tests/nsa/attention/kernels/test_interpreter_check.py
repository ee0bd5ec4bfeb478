"""nsa.attention.kernels.interpreter_check (the address check every interpreted kernel test runs under, tests/nsa/conftest.py): a kernel
whose mask lets one element past its tensor through is stopped at that access, for loads, stores and atomics, with
the kernel's line; the same kernels with the right masks, and a kernel reading a view inside a larger storage,
pass; the check is installed for this session wherever the kernels are interpreted."""

import pytest
import torch

from nsa import toggles
from triton_test_utils import HAVE_TRITON, ON_GPU

pytestmark = [pytest.mark.skipif(not HAVE_TRITON, reason="needs the triton package"),
              pytest.mark.skipif(ON_GPU, reason="the interpreter's check (on a GPU: compute-sanitizer)")]

if HAVE_TRITON:
    import triton
    import triton.language as tl

    @triton.jit
    def _copy(X, Y, N, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(X + i, mask=i < N + EXTRA, other=0.0)  # EXTRA 1: one element past X
        tl.store(Y + i, x, mask=i < N)

    @triton.jit
    def _write(Y, N, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(Y + i, tl.full([BLOCK], 1.0, tl.float32), mask=i < N + EXTRA)

    @triton.jit
    def _add(Y, N, EXTRA: tl.constexpr, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.atomic_add(Y + i, tl.full([BLOCK], 1.0, tl.float32), mask=i < N + EXTRA)


def _bounds():
    from nsa.attention.kernels import interpreter_check
    if not interpreter_check.supported():
        pytest.skip("this triton's interpreter lacks what the check patches")
    return interpreter_check


def test_the_session_runs_under_the_check():
    if toggles.parse("NSA_TEST_NO_BOUNDS"):
        pytest.skip("NSA_TEST_NO_BOUNDS=1")
    assert _bounds().installed()


@pytest.mark.parametrize("kernel", ["load", "store", "atomic"])
def test_one_element_past_a_tensor_is_stopped_at_the_access(kernel):
    bounds = _bounds()
    x, y = torch.arange(40, dtype=torch.float32), torch.zeros(40)
    launch = {"load": lambda extra: _copy[(1,)](x, y, 40, EXTRA=extra, BLOCK=64),
              "store": lambda extra: _write[(1,)](y, 40, EXTRA=extra, BLOCK=64),
              "atomic": lambda extra: _add[(1,)](y, 40, EXTRA=extra, BLOCK=64)}[kernel]
    with bounds.checking():
        launch(0)  # the right mask
        if kernel == "load":
            assert torch.equal(y, x)
        with pytest.raises(Exception, match=rf"{'atomic' if kernel == 'atomic' else kernel} of 1 element\(s\) of 4 "
                                            r"bytes outside every tensor argument at test_interpreter_check.py"):
            launch(1)


def test_a_view_inside_a_larger_storage_passes():
    """The check knows storages, not views: reading past a view's end inside its storage is allowed (as memcheck
    allows it inside an allocation)."""
    bounds = _bounds()
    base = torch.arange(64, dtype=torch.float32)
    y = torch.zeros(40)
    with bounds.checking():
        _copy[(1,)](base[:40], y, 40, EXTRA=1, BLOCK=64)
    assert torch.equal(y, base[:40])


QUALIFY_SHAPE = ["--device", "cpu", "--dtype", "fp32", "--seq-len", "64", "--hpg", "2", "--d-k", "32", "--l", "8",
                 "--d", "4", "--l-sel", "16", "--n-sel", "3", "--w", "16"]


def test_qualify_checks_addresses_on_cpu(monkeypatch, capsys):
    """`qualify --device cpu --check-addresses` runs the kernels under the check: they pass, and a kernel swapped
    for one that writes a float past its tensor fails the run at that kernel, naming the access."""
    from nsa.attention.kernels import qualify

    _bounds()
    assert qualify.main(QUALIFY_SHAPE + ["--check-addresses", "--kernels", "cmp,select,sel_kv"]) == 0
    assert "addresses checked" in capsys.readouterr().out

    def writes_past_its_output(q, k, v, *rest):
        y = torch.zeros(40)
        _write[(1,)](y, 40, EXTRA=1, BLOCK=64)
        return q.sum() * 0 + y.sum()

    monkeypatch.setattr(qualify.range_attn, "window_attention", writes_past_its_output)
    assert qualify.main(QUALIFY_SHAPE + ["--check-addresses", "--kernels", "win"]) == 1
    err = capsys.readouterr().err
    assert "qualify: FAILED win" in err and "store of 1 element(s) of 4 bytes outside every tensor argument" in err


def test_qualify_refuses_the_address_check_off_the_interpreter(capsys):
    from nsa.attention.kernels import qualify

    assert qualify.main(["--device", "cuda", "--check-addresses"]) == 2
    assert "--check-addresses checks the interpreter's accesses: use it with --device cpu" in capsys.readouterr().err
