"""The head fused with the cross entropy (nsa/loss.py, NSAModel(input_ids, targets) with model.loss "chunked")
against a float64 reference: F.cross_entropy of the full float64 logits, loss and gradients (hidden states, head
weight, a tied embedding), with ignored targets and a chunk that does not divide the token count."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nsa.config import ModelConfig
from nsa.loss import linear_cross_entropy, resolve_loss
from nsa.model import NSAModel, lm_loss
from nsa.toggles import Toggles

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
    assert cfg.with_toggles(Toggles.read({"NSA_LOSS": "reference", "NSA_ROPE": "fused"})).flat()["rope"] == "fused"
    with pytest.raises(ValueError, match="NSA_LOSS"):
        Toggles.read({"NSA_LOSS": "fused"})
    with pytest.raises(ValueError, match="ModelConfig.loss"):
        cfg.replace(loss="fast")
    with pytest.raises(ValueError, match="loss must be one of"):
        resolve_loss("fast")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_chunked_loss_on_cuda_under_bf16_autocast_and_graph_capture():
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
        new = linear_cross_entropy(hidden, weight, targets, chunk=384)
    rh, rw = torch.autograd.grad(ref, (hidden, weight))
    nh, nw = torch.autograd.grad(new, (hidden, weight))
    for got, base, exact in ((new, ref, want), (nh, rh, gh), (nw, rw, gw)):
        err_ref = (base.double().cpu() - exact).abs().max().item()
        assert (got.double().cpu() - exact).abs().max().item() <= 4 * err_ref + 1e-6

    def step():
        hidden.grad = weight.grad = None
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = linear_cross_entropy(hidden, weight, targets, chunk=384)
        loss.backward()
        return loss.detach()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # warm-up outside the graph
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    hidden.grad = weight.grad = None
    with torch.cuda.graph(graph):
        static_loss = step()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(static_loss, new.detach())
    torch.testing.assert_close(hidden.grad, nh)
    torch.testing.assert_close(weight.grad, nw)
