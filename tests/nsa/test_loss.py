"""The head fused with the cross entropy (nsa/loss.py, NSAModel(input_ids, targets) with model.loss "chunked" or
"fused") against a float64 reference: F.cross_entropy of the full float64 logits, loss and gradients (hidden
states, head weight, a tied embedding), with ignored targets and a chunk that does not divide the token count. The
fused loss's Triton kernel (nsa.attention.kernels.cross_entropy) runs through Triton's interpreter without a GPU
(tests/nsa/conftest.py sets TRITON_INTERPRET=1), natively on one."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from nsa.attention.kernels import KernelUnavailable
from nsa.config import ModelConfig
from nsa.loss import linear_cross_entropy, resolve_loss
from nsa.model import NSAModel, lm_loss
from nsa.toggles import Toggles
from triton_test_utils import KERNEL_DEVICE, ON_GPU, assert_within_torch_error, needs_triton

N, D, V = 37, 12, 29


def reference64(hidden, weight, targets):
    """Mean cross entropy of the float64 logits hidden @ weight.T (targets -100 ignored) and its gradients."""
    h = hidden.detach().double().requires_grad_()
    w = weight.detach().double().requires_grad_()
    loss = F.cross_entropy(h @ w.T, targets, ignore_index=-100)
    gh, gw = torch.autograd.grad(loss, (h, w))
    return loss.detach(), gh, gw


def inputs(dtype=torch.float64, ignored=(3, 4, 20)):
    torch.manual_seed(0)
    hidden = torch.randn(N, D, dtype=dtype, requires_grad=True)
    weight = (torch.randn(V, D, dtype=dtype) * 0.7).requires_grad_()
    targets = torch.randint(0, V, (N,))
    targets[list(ignored)] = -100
    return hidden, weight, targets


@pytest.mark.parametrize("chunk", [8, N, 1000])  # 8 does not divide 37; one chunk; a chunk larger than N
def test_loss_and_gradients_equal_float64_reference(chunk):
    hidden, weight, targets = inputs()
    want, gh, gw = reference64(hidden, weight, targets)
    loss = linear_cross_entropy(hidden, weight, targets, chunk=chunk)
    (loss * 3.0).backward()  # backward scales by the incoming gradient
    torch.testing.assert_close(loss.detach(), want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(hidden.grad, 3.0 * gh, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(weight.grad, 3.0 * gw, rtol=1e-10, atol=1e-12)


def test_float32_within_float32_error_and_no_grad_path():
    hidden, weight, targets = inputs(torch.float32)
    want, gh, gw = reference64(hidden, weight, targets)
    loss = linear_cross_entropy(hidden, weight, targets, chunk=5)
    loss.backward()
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.detach().double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(hidden.grad.double(), gh, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(weight.grad.double(), gw, rtol=1e-4, atol=1e-6)
    with torch.no_grad():  # evaluation: the loss alone, no gradients made
        made = []
        real = torch.Tensor.__matmul__
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.Tensor, "__matmul__", lambda a, b: made.append(1) or real(a, b))
            torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, chunk=5), loss.detach())
        assert len(made) == 8  # one logits matmul per chunk of 5 of 37 tokens, none for gradients


def test_all_targets_ignored_is_nan_like_the_reference():
    hidden, weight, targets = inputs(ignored=range(N))
    with torch.no_grad():
        assert math.isnan(float(linear_cross_entropy(hidden, weight, targets, chunk=8)))
        assert math.isnan(float(F.cross_entropy(hidden @ weight.T, targets)))


@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=needs_triton)], ids=["chunked", "fused"])
def test_all_targets_ignored_gives_the_references_zero_gradients_not_nan(fused):
    """F.cross_entropy with no counted target: a NaN loss but gradients of 0 (a micro-batch of padding adds nothing
    to the accumulated gradients); a NaN gradient would poison every parameter at the next optimizer step."""
    hidden, weight, targets = (x.to(KERNEL_DEVICE) if fused else x for x in inputs(torch.float32, ignored=range(N)))
    want_loss, gh, gw = reference64(hidden, weight, targets)
    assert math.isnan(float(want_loss)) and not gh.any() and not gw.any()
    loss = linear_cross_entropy(hidden, weight, targets, chunk=8, fused=fused)
    assert math.isnan(float(loss.detach()))
    got_h, got_w = torch.autograd.grad(loss * 2.0, (hidden, weight))
    assert not got_h.any() and not got_w.any(), "a NaN or non-zero gradient where no target counts"
    # one counted target: the gradients are that target's alone again (1 / count is not clamped away)
    targets = targets.clone()
    targets[5] = 7
    _, gh, gw = reference64(hidden, weight, targets)
    got_h, got_w = torch.autograd.grad(linear_cross_entropy(hidden, weight, targets, chunk=8, fused=fused),
                                       (hidden, weight))
    torch.testing.assert_close(got_h.cpu().double(), gh.cpu(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got_w.cpu().double(), gw.cpu(), rtol=1e-4, atol=1e-6)


def test_bfloat16_autocast_as_close_to_float64_as_the_reference():
    """Under CPU autocast both paths compute the matmul in bf16; the chunked loss and gradients are within a few
    times the reference's own error against float64."""
    hidden, weight, targets = inputs(torch.float32)
    want, gh, gw = reference64(hidden.bfloat16(), weight.bfloat16(), targets)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = F.cross_entropy((hidden @ weight.T).float(), targets)
        new = linear_cross_entropy(hidden, weight, targets, chunk=8)
    rh, rw = torch.autograd.grad(ref, (hidden, weight))
    nh, nw = torch.autograd.grad(new, (hidden, weight))
    assert new.dtype == torch.float32 and nh.dtype == torch.float32 and nw.dtype == torch.float32
    for got, base, exact in ((new, ref, want), (nh, rh, gh), (nw, rw, gw)):
        err_ref = (base.double() - exact).abs().max().item()
        assert (got.double() - exact).abs().max().item() <= 4 * err_ref + 1e-6


TINY = dict(vocab_size=53, dim=32, n_layers=1, n_heads=2, n_kv_groups=1, d_k=16, d_v=16, l=8, d=4, l_sel=8,
            n_sel=3, w=8, attention="dense")


@pytest.mark.parametrize("tie", [False, True])
def test_model_loss_chunked_equals_reference(tie, monkeypatch):
    """NSAModel(input_ids, targets) in float64: model.loss chunked and reference give the same loss and the same
    gradient of every parameter (the head, or the embedding it is tied to, included)."""
    monkeypatch.setattr("nsa.loss.CHUNK_TOKENS", 8)  # 22 tokens: chunks of 8, 8 and 6
    cfg = ModelConfig.from_flat({**TINY, "tie_embeddings": tie})
    torch.manual_seed(0)
    x = torch.randint(0, 53, (2, 11))
    y = torch.randint(0, 53, (2, 11))
    y[0, 2] = -100
    grads = {}
    for loss_impl in ("reference", "chunked"):
        torch.manual_seed(1)
        model = NSAModel(cfg.replace(loss=loss_impl)).double()
        if loss_impl == "reference":  # lm_loss's own formula on the float64 logits (lm_loss itself would round to fp32)
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), ignore_index=-100)
        else:
            loss = model.loss(x, y)
        loss.backward()
        grads[loss_impl] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    (l_ref, g_ref), (l_new, g_new) = grads["reference"], grads["chunked"]
    torch.testing.assert_close(l_new, l_ref, rtol=1e-12, atol=1e-12)
    assert g_new.keys() == g_ref.keys() and ("head.weight" in g_ref) != tie
    for name in g_ref:
        torch.testing.assert_close(g_new[name], g_ref[name], rtol=1e-10, atol=1e-12, msg=name)
    with torch.no_grad():  # model.loss "auto" is lm_loss of the logits, as before
        model = NSAModel(cfg)
        assert torch.equal(model.loss(x, y), lm_loss(model(x), y))


def test_loss_toggle_flows_into_the_model_config():
    cfg = ModelConfig.from_flat(TINY)
    assert cfg.loss == "auto" and resolve_loss(cfg.loss) == "reference"  # until a GPU A/B says otherwise
    assert cfg.with_toggles(Toggles.read({})) is cfg
    assert cfg.with_toggles(Toggles.read({"NSA_LOSS": "chunked"})).loss == "chunked"
    assert cfg.with_toggles(Toggles.read({"NSA_LOSS": "fused"})).loss == "fused"
    assert cfg.with_toggles(Toggles.read({"NSA_LOSS": "reference", "NSA_ROPE": "fused"})).flat()["rope"] == "fused"
    with pytest.raises(ValueError, match="NSA_LOSS"):
        Toggles.read({"NSA_LOSS": "fast"})
    with pytest.raises(ValueError, match="ModelConfig.loss"):
        cfg.replace(loss="fast")
    with pytest.raises(ValueError, match="loss must be one of"):
        resolve_loss("fast")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("fused", [False, pytest.param(True, marks=needs_triton)], ids=["chunked", "fused"])
def test_chunked_loss_on_cuda_under_bf16_autocast_and_graph_capture(fused):
    """On CUDA under bf16 autocast: within a few times the reference's own error against float64, and the same
    loss and gradients replayed from a captured CUDA graph (no host synchronisation inside)."""
    torch.manual_seed(0)
    n, d, v = 1000, 64, 3001
    hidden = torch.randn(n, d, device="cuda", requires_grad=True)
    weight = (torch.randn(v, d, device="cuda") * 0.1).requires_grad_()
    targets = torch.randint(0, v, (n,), device="cuda")
    targets[::7] = -100
    want, gh, gw = reference64(hidden.bfloat16().cpu(), weight.bfloat16().cpu(), targets.cpu())
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref = F.cross_entropy((hidden @ weight.T).float(), targets)
        new = linear_cross_entropy(hidden, weight, targets, chunk=384, fused=fused)
    rh, rw = torch.autograd.grad(ref, (hidden, weight))
    nh, nw = torch.autograd.grad(new, (hidden, weight))
    for got, base, exact in ((new, ref, want), (nh, rh, gh), (nw, rw, gw)):
        err_ref = (base.double().cpu() - exact).abs().max().item()
        assert (got.double().cpu() - exact).abs().max().item() <= 4 * err_ref + 1e-6

    # The graph's leaves are new ones, first used on the side stream: a leaf's gradient accumulator runs on the
    # stream it was made on, and hidden's and weight's were made on the default stream above (ref's and new's graphs
    # keep them alive); a capture whose backward reached them would make the default stream wait on the capturing
    # one, which invalidates the capture (as nsa.training.graphs builds DDP on its side stream).
    g_hidden, g_weight = (x.detach().clone().requires_grad_() for x in (hidden, weight))

    def step():
        g_hidden.grad = g_weight.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = linear_cross_entropy(g_hidden, g_weight, targets, chunk=384, fused=fused)
        loss.backward()
        return loss.detach()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the graph (the leaves' gradient accumulators are made here, on the side stream)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    g_hidden.grad = g_weight.grad = None
    with torch.cuda.graph(graph, stream=side):  # captured on the stream the warm-up ran on
        static_loss = step()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_loss, new.detach())
    torch.testing.assert_close(g_hidden.grad, nh)
    torch.testing.assert_close(g_weight.grad, nw)


# ----------------------------------------------------------------------------------------------------- the fused loss
FUSED_V = 75  # with BLOCK_V 32: two whole blocks and a masked tail of 11 columns


def _fused_against_float64(n: int, v: int, chunk: int, ignored=(), last=()) -> None:
    """fp32 through the Triton kernel: loss and gradients within a few times the PyTorch chunked path's own fp32
    error against float64 (plus 1e-6 of the largest value)."""
    torch.manual_seed(0)
    hidden = torch.randn(n, D, device=KERNEL_DEVICE, requires_grad=True)
    weight = (torch.randn(v, D, device=KERNEL_DEVICE) * 0.7).requires_grad_()
    targets = torch.randint(0, v, (n,), device=KERNEL_DEVICE)
    targets[list(ignored)] = -100
    targets[list(last)] = v - 1  # the last column, in the tail block
    want, gh, gw = reference64(hidden.cpu(), weight.cpu(), targets.cpu())
    results = {}
    for fused in (False, True):
        loss = linear_cross_entropy(hidden, weight, targets, chunk=chunk, fused=fused)
        gradients = torch.autograd.grad(loss * 3.0, (hidden, weight))
        results[fused] = (loss.detach(), *gradients)
    for got, torch_path, exact, what in zip(results[True], results[False], (want, 3.0 * gh, 3.0 * gw),
                                            ("loss", "grad hidden", "grad weight")):
        assert got.dtype == torch.float32, what
        assert_within_torch_error(what, got.cpu(), exact, torch_path.cpu(), factor=4, rel_floor=1e-6)
    assert torch.all(results[True][1][list(ignored)] == 0), "an ignored target gives no gradient"


@needs_triton
@pytest.mark.parametrize("block_v", [32, 4096])  # three blocks a row (a masked tail); one block wider than the row
@pytest.mark.parametrize("chunk", [8, 1000])
def test_fused_loss_and_gradients_equal_float64_reference(block_v, chunk, monkeypatch):
    """fp32 through the Triton kernel (interpreted on CPU), ignored targets included."""
    monkeypatch.setattr("nsa.attention.kernels.cross_entropy.host.BLOCK_V", block_v)
    _fused_against_float64(N, FUSED_V, chunk, ignored=(3, 4, 20), last=(5,))


@needs_triton
def test_fused_loss_at_the_m7c_vocabulary():
    """The shipped tile at the trainer's vocabulary: 13 blocks of 4,096 columns a row, the last 1,152 wide."""
    _fused_against_float64(6, 50304, 4, ignored=(2,), last=(0,))


@needs_triton
def test_fused_loss_under_no_grad_asks_the_kernel_for_no_gradient(monkeypatch):
    """Evaluation (no_grad): the same loss, the kernel told not to write gradients, and no gradient matmul."""
    from nsa.attention.kernels.cross_entropy import host

    hidden, weight, targets = (x.to(KERNEL_DEVICE) for x in inputs(torch.float32))
    with_grad = linear_cross_entropy(hidden, weight, targets, chunk=8, fused=True)
    asked = []
    real = host.cross_entropy_rows
    monkeypatch.setattr(host, "cross_entropy_rows", lambda *a: asked.append(a[3]) or real(*a))
    with torch.no_grad():
        loss = linear_cross_entropy(hidden, weight, targets, chunk=8, fused=True)
    assert asked == [False] * 5  # 37 tokens in chunks of 8
    torch.testing.assert_close(loss, with_grad.detach(), rtol=0, atol=0)


@needs_triton
def test_fused_kernel_rows_and_in_place_gradient_in_bf16(monkeypatch):
    """The kernel itself on bf16 logits: each row's loss (fp32) and, in place, softmax - onehot rounded once to
    bf16, against float64; an ignored row gives 0 and a zero gradient; a target outside [0, V) gives NaN; without
    the gradient the logits are left as they were."""
    from nsa.attention.kernels.cross_entropy import host

    monkeypatch.setattr(host, "BLOCK_V", 32)
    torch.manual_seed(0)
    logits = (torch.randn(9, FUSED_V) * 3).to(KERNEL_DEVICE, torch.bfloat16)
    targets = torch.tensor([0, 74, 31, 32, -100, 5, 75, -1, 40], device=KERNEL_DEVICE)
    x = logits.double().cpu()
    lse = torch.logsumexp(x, dim=1)
    t = targets.cpu()
    inside = (t >= 0) & (t < FUSED_V)
    want = torch.where(inside, lse - x.gather(1, t.clamp(0, FUSED_V - 1).unsqueeze(1)).squeeze(1), float("nan"))
    want[4] = 0.0  # ignored
    want_grad = torch.softmax(x, dim=1) - F.one_hot(t.clamp(0, FUSED_V - 1), FUSED_V).double() * inside[:, None]
    want_grad[4] = 0.0

    kept = logits.clone()
    rows = host.cross_entropy_rows(kept, targets, -100, with_grad=False)
    assert torch.equal(kept, logits), "without the gradient the logits are not written"
    grad = logits.clone()
    rows_g = host.cross_entropy_rows(grad, targets, -100, with_grad=True)
    for got in (rows, rows_g):
        assert got.dtype == torch.float32 and got.shape == (9,)
        assert torch.isnan(got[6]) and torch.isnan(got[7]), "a target outside [0, V) gives NaN"
        ok = inside.clone()
        torch.testing.assert_close(got.cpu().double()[ok], want[ok], rtol=1e-5, atol=1e-5)
        assert got[4].item() == 0.0
    assert grad.dtype == torch.bfloat16
    # one bf16 rounding of values in [-1, 1]: to nearest on a GPU, within half a bf16 ulp of 1 (2^-9) plus fp32
    # noise; Triton's interpreter truncates its fp32 -> bf16 casts, within a whole ulp (2^-8)
    ulps = 0.5 if ON_GPU else 1.0
    assert (grad.double().cpu() - want_grad).abs().max().item() <= ulps * 2 ** -8 + 1e-6
    assert torch.all(grad[4] == 0)


@needs_triton
def test_model_loss_fused_equals_reference(monkeypatch):
    """NSAModel(input_ids, targets) in fp32 with model.loss "fused" against its float64 reference, loss and every
    parameter's gradient, the head tied to the embedding: within a few times the reference path's own fp32 error."""
    monkeypatch.setattr("nsa.loss.CHUNK_TOKENS", 8)
    cfg = ModelConfig.from_flat({**TINY, "tie_embeddings": True})
    x = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 53, (2, 11), generator=torch.Generator().manual_seed(1))
    y[0, 2] = -100
    runs = {}
    for name, loss_impl, dtype in (("exact", "reference", torch.float64), ("reference", "reference", torch.float32),
                                   ("fused", "fused", torch.float32)):
        torch.manual_seed(1)
        model = NSAModel(cfg.replace(loss=loss_impl)).to(KERNEL_DEVICE, dtype)
        xs, ys = x.to(KERNEL_DEVICE), y.to(KERNEL_DEVICE)
        loss = F.cross_entropy(model(xs).flatten(0, 1), ys.flatten()) if name == "exact" else model.loss(xs, ys)
        loss.backward()
        runs[name] = {"loss": loss.detach(), **{n: p.grad for n, p in model.named_parameters()}}
    assert "head.weight" not in runs["fused"]
    for key, exact in runs["exact"].items():
        assert_within_torch_error(key, runs["fused"][key].cpu(), exact.cpu(), runs["reference"][key].cpu(), factor=4,
                                  rel_floor=1e-6)


@needs_triton
def test_fused_loss_under_torch_compile_equals_it_eager(monkeypatch):
    """Dynamo traces the fused loss whole (fullgraph; the kernel is an opaque custom op that mutates the chunk's
    logits): the same loss and gradients as eager. Compiled before the kernel module was ever loaded, it fails
    naming check_loss."""
    import nsa.loss

    hidden, weight, targets = (x.to(KERNEL_DEVICE) for x in inputs(torch.float32))

    def loss_fn(h, w, t):
        return linear_cross_entropy(h, w, t, chunk=8, fused=True)

    eager = loss_fn(hidden, weight, targets)
    want = torch.autograd.grad(eager, (hidden, weight))
    compiled = torch.compile(loss_fn, backend="aot_eager", fullgraph=True)
    got = compiled(hidden, weight, targets)
    assert torch.equal(got, eager)
    for a, b in zip(torch.autograd.grad(got, (hidden, weight)), want):
        assert torch.equal(a, b)
    torch._dynamo.reset()
    monkeypatch.setattr(nsa.loss, "_KERNEL", None)
    with pytest.raises(Exception, match="check_loss"):
        torch.compile(loss_fn, backend="aot_eager", fullgraph=True)(hidden, weight, targets)
    torch._dynamo.reset()


def test_fused_loss_where_triton_cannot_run_is_an_error_naming_why(monkeypatch):
    """CPU tensors without Triton's interpreter: an error naming why, before anything is computed (no fallback)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(KernelUnavailable, match="fused loss .*(no CUDA device|triton package is not installed)"):
        linear_cross_entropy(*inputs(torch.float32), fused=True)


@needs_triton
def test_fused_loss_refuses_float64():
    hidden, weight, targets = inputs()
    with pytest.raises(ValueError, match="bf16, fp16 or fp32, got torch.float64"):
        linear_cross_entropy(hidden.to(KERNEL_DEVICE), weight.to(KERNEL_DEVICE), targets.to(KERNEL_DEVICE), fused=True)


def test_bad_inputs_are_clear_errors():
    """Targets that are not integer class ids, or a chunk that is not a positive integer, are errors naming the
    argument (not an index error from inside the loop, or a loop that never runs)."""
    hidden, weight, targets = inputs()
    cases = [
        (dict(targets=targets.double()), r"targets \[37\] \(int64 or int32\), got \(37,\) torch.float64"),
        (dict(targets=targets.to(torch.int16)), r"int64 or int32\), got \(37,\) torch.int16"),
        (dict(targets=targets[:-1]), r"targets \[37\] .*got \(36,\)"),
        (dict(chunk=0), "chunk must be an integer >= 1, got 0"),
        (dict(chunk=2.5), "chunk must be an integer >= 1, got 2.5"),
        (dict(chunk=True), "chunk must be an integer >= 1, got True"),
    ]
    for over, match in cases:
        kwargs = {"hidden": hidden, "weight": weight, "targets": targets, **over}
        with pytest.raises(ValueError, match=match):
            linear_cross_entropy(**kwargs)
    # int32 targets are class ids as int64 ones are
    torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets.int(), chunk=8),
                               linear_cross_entropy(hidden, weight, targets, chunk=8), rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------- bench_loss
@needs_triton
def test_bench_loss_checks_each_loss_then_times_them_alternated(tmp_path, capsys):
    """benchmarks/bench_loss.py at a tiny shape (interpreted fused kernel on CPU): every implementation's loss and
    gradients checked against the reference's, then min / median / max and per-round ratios written."""
    from benchmark_scripts import load

    bench = load("bench_loss")
    out = tmp_path / "loss.json"
    assert bench.main(["--device", KERNEL_DEVICE.type, "--dtype", "fp32", "--tokens", "40", "--vocab", "70",
                       "--dim", "16", "--chunk", "16", "--repeats", "3", "--warmup", "1", "--impls", "fused,chunked",
                       "--fused-configs", "32x1", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["device_name"] == ("cpu" if KERNEL_DEVICE.type == "cpu" else torch.cuda.get_device_name())
    rows = data["by_impl"]
    assert list(rows) == ["reference", "fused", "chunked", "fused@32x1"]  # the reference first, always
    assert rows["reference"]["ratio_median"] == 1.0
    for impl in ("fused", "chunked", "fused@32x1"):
        row = rows[impl]
        assert 0 < row["ms_min"] <= row["ms_median"] <= row["ms_max"]
        assert 0 < row["ratio_min"] <= row["ratio_median"] <= row["ratio_max"]
        assert row["loss_rel_diff"] < 1e-5 and row["grad_weight_max_diff"] < 1e-5
    assert "reproduce: python benchmarks/bench_loss.py --device" in capsys.readouterr().out


def test_bench_loss_refuses_a_loss_that_differs_and_bad_options(monkeypatch, capsys):
    from benchmark_scripts import load

    bench = load("bench_loss")
    tiny = ["--tokens", "12", "--vocab", "20", "--dim", "8", "--repeats", "1", "--impls", "chunked"]
    real = bench.linear_cross_entropy
    monkeypatch.setattr(bench, "linear_cross_entropy", lambda *a, **k: real(*a, **k) * 1.01)
    with pytest.raises(SystemExit, match="chunked: loss .* differs from the reference's"):
        bench.main(tiny)
    for bad in (["--impls", "fast"], ["--tokens", "0"], ["--warmup", "-1"], ["--fused-configs", "100x8"],
                ["--fused-configs", "4096x3"], ["--fused-configs", "4096"]):
        with pytest.raises(SystemExit) as exc:
            bench.parse(bad)
        assert exc.value.code == 2, bad
    assert bench.main(tiny[:6] + ["--dry-run"]) == 0
    assert "reference, chunked, fused; 12 tokens" in capsys.readouterr().out
