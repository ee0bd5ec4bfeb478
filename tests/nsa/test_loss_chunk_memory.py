"""The language model's head and loss (nsa/loss.py, nsa/model.py) against references written here: the float64
cross entropy of the same weights (loss, gradient of the final hidden states and of the tied embedding / head
weight) for model.loss reference and chunked, in fp32 and under CPU bf16 autocast (the fused loss's float64 checks,
through Triton's interpreter, are tests/nsa/test_loss.py's); logits near 1e4 in fp32; and what the chunked and fused
losses keep in memory (one chunk's logits at a time, never the batch's)."""

from __future__ import annotations

import weakref

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from nsa.config import ModelConfig
from nsa.loss import linear_cross_entropy
from nsa.model import NSAModel

TINY = dict(vocab_size=53, dim=32, n_layers=1, n_heads=2, n_kv_groups=1, d_k=16, d_v=16, l=8, d=4, l_sel=8,
            n_sel=3, w=8, attention="dense", tie_embeddings=True)


def _max_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.detach().double() - want).abs().max().item()


def _loss_and_grads(model, loss_of, autocast):
    """(loss, d loss / d final hidden states, d loss / d tied embedding weight), all float64."""
    model.zero_grad()
    seen = {}

    def keep(module, args, out):
        out.retain_grad()
        seen["hidden"] = out

    hook = model.norm.register_forward_hook(keep)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = loss_of(model)
        loss.backward()
    finally:
        hook.remove()
    return loss.detach().double(), seen["hidden"].grad.double(), model.tok_emb.weight.grad.double()


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("loss", ["reference", "chunked"])
def test_model_loss_and_head_gradients_against_float64(loss, autocast, monkeypatch):
    """B 3 x S 7 = 21 tokens in chunks of 5 (the last of 1), the first 5 targets ignored, a tied head of 53 tokens:
    NSAModel(x, y) is the float64 cross entropy of the same weights, with its gradients of the final hidden states and
    of the tied weight, within a few times what the plain PyTorch path (F.cross_entropy of the head's logits in the
    same precision) errs by. The float64 mean is over the 16 counted tokens, not over rows."""
    monkeypatch.setattr("nsa.loss.CHUNK_TOKENS", 5)
    x = torch.randint(0, 53, (3, 7), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 53, (3, 7), generator=torch.Generator().manual_seed(1))
    y[0, :5] = -100  # row 0 counts 2 tokens, rows 1 and 2 count 7: a mean of row means would differ
    torch.manual_seed(3)
    cfg = ModelConfig.from_flat(TINY)
    base = NSAModel(cfg)
    wide = NSAModel(cfg).double()
    wide.load_state_dict(base.state_dict())
    want = _loss_and_grads(wide, lambda m: F.cross_entropy(m(x).flatten(0, 1), y.flatten(), ignore_index=-100),
                           False)
    # the float64 loss is the mean over counted tokens: check that against its per-token terms
    with torch.no_grad():
        per_token = F.cross_entropy(wide(x).flatten(0, 1), y.flatten(), ignore_index=-100, reduction="none")
    assert want[0].item() == pytest.approx(per_token.sum().item() / 16, rel=1e-12)
    plain = NSAModel(cfg)
    plain.load_state_dict(base.state_dict())
    base_errs = _loss_and_grads(plain, lambda m: F.cross_entropy(m(x).float().flatten(0, 1), y.flatten(),
                                                                 ignore_index=-100), autocast)
    model = NSAModel(cfg.replace(loss=loss))
    model.load_state_dict(base.state_dict())
    got = _loss_and_grads(model, lambda m: m(x, y), autocast)
    for name, g, p, w in zip(("loss", "hidden grad", "weight grad"), got, base_errs, want):
        assert torch.isfinite(g).all(), name
        err, err_plain = _max_err(g, w), _max_err(p, w)
        assert err <= 4 * err_plain + 1e-6 * w.abs().max().item(), (name, err, err_plain)


def test_float32_logits_near_ten_thousand_stay_finite_and_exact():
    """|logit| up to about 1e4 in fp32 (13 tokens in chunks of 4, a vocabulary of 11): no inf or NaN, and the loss
    and gradients within fp32's error of the float64 cross entropy."""
    gen = torch.Generator().manual_seed(5)
    hidden = (torch.randn(13, 4, generator=gen) * 70).requires_grad_()
    weight = (torch.randn(11, 4, generator=gen) * 70).requires_grad_()
    targets = torch.randint(0, 11, (13,), generator=gen)
    assert (hidden @ weight.T).abs().max().item() > 5e3
    h64, w64 = hidden.detach().double().requires_grad_(), weight.detach().double().requires_grad_()
    want = F.cross_entropy(h64 @ w64.T, targets)
    want_h, want_w = torch.autograd.grad(want, (h64, w64))
    loss = linear_cross_entropy(hidden, weight, targets, chunk=4)
    got_h, got_w = torch.autograd.grad(loss, (hidden, weight))
    for got, ref in ((loss, want), (got_h, want_h), (got_w, want_w)):
        assert torch.isfinite(got).all()
        assert _max_err(got, ref.detach()) <= 1e-5 * max(1.0, ref.abs().max().item())


class _ChunkLogits(TorchFunctionMode):
    """At each matmul whose output has `v` columns (a chunk's logits), how many tensors of at least `floor` bytes
    made earlier are still referenced; and the largest tensor made."""

    def __init__(self, v: int, floor: int):
        super().__init__()
        self.v, self.floor = v, floor
        self.alive: dict[int, int] = {}
        self.alive_at_logits: list[int] = []
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in ("matmul", "__matmul__", "mm") and args[1].shape[-1] == self.v:
            self.alive_at_logits.append(len(self.alive))
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self.largest = max(self.largest, storage.nbytes())
                key = id(storage)
                if storage.nbytes() >= self.floor and key not in self.alive:
                    self.alive[key] = storage.nbytes()
                    weakref.finalize(storage, self.alive.pop, key, None)
        return out


class _RowsKernel:
    """The fused loss's kernel module as nsa.loss uses it (nsa.attention.kernels.cross_entropy.host's contract), in
    PyTorch: each row's loss, and the logits overwritten in place with softmax - onehot (0 for an ignored row)."""

    DTYPES = (torch.bfloat16, torch.float16, torch.float32)

    @staticmethod
    def cross_entropy_rows(logits, targets, ignore_index=-100, with_grad=True):
        wide = logits.float()
        ok = targets != ignore_index
        safe = torch.where(ok, targets, 0)
        lse = torch.logsumexp(wide, dim=1)
        loss = torch.where(ok, lse - wide.gather(1, safe[:, None])[:, 0], 0.0)
        if with_grad:
            grad = torch.softmax(wide, dim=1)
            grad[torch.arange(len(safe)), safe] -= 1.0
            logits.copy_(grad * ok[:, None])
        return loss


@pytest.mark.parametrize("grad", [True, False], ids=["train", "no-grad"])
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("fused", [False, True], ids=["chunked", "fused"])
def test_chunked_loss_holds_one_chunks_logits_at_a_time(fused, autocast, grad, monkeypatch):
    """32 tokens in chunks of 16 over a vocabulary of 1,000 (hidden width 4, so that no [V, D] or [N, D] tensor is as
    large as a chunk's logits): no tensor the size of the batch's fp32 logits is ever made, and the second chunk's
    logits are made when no tensor of the first chunk's [16, 1000] is still referenced (nsa/loss.py: at most one
    chunk's logits exist). The fused path's loop runs with its kernel's contract written in PyTorch."""
    if fused:
        monkeypatch.setattr("nsa.loss._KERNEL", _RowsKernel)
        monkeypatch.setattr("nsa.loss.check_loss", lambda choice, device: None)
    n, d, v, chunk = 32, 4, 1000, 16
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, d, generator=gen).requires_grad_()
    weight = torch.randn(v, d, generator=gen).requires_grad_()
    targets = torch.randint(0, v, (n,), generator=gen)
    targets[3] = -100
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with _ChunkLogits(v, chunk * v * 2) as seen:  # a chunk's logits in bf16, the narrowest compute dtype here
            loss = linear_cross_entropy(hidden, weight, targets, chunk=chunk, fused=fused)
            if grad:
                loss.backward()
    with torch.no_grad():
        want = F.cross_entropy(hidden.double() @ weight.double().T, targets)
    assert abs(loss.item() - want.item()) < (5e-2 if autocast else 1e-4)
    assert len(seen.alive_at_logits) == n // chunk, seen.alive_at_logits  # one logits matmul per chunk
    assert seen.largest < n * v * 4, seen.largest  # never the batch's fp32 logits
    assert seen.alive_at_logits == [0] * (n // chunk), seen.alive_at_logits
