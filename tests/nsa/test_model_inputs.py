"""Bad inputs to the NSA layer and the model either work or end in a ValueError naming what is wrong, never in
silently wrong numbers or an unrelated reshape error from deep inside a kernel.

- targets of another shape than input_ids (e.g. [S, B], or flattened) with as many elements gave a finite, wrong
  loss; int32 targets worked with the chunked loss but not the reference one;
- an empty batch (B = 0) raised "cannot reshape tensor of 0 elements" on the PyTorch path (and worked on the Triton
  path); now a ValueError on every path, as an empty sequence already was;
- a decode cache that keeps fewer window / block tokens than the layer reads returned wrong outputs after a few
  steps.
"""

from __future__ import annotations

import pytest
import torch

from nsa.attention import DenseAttention
from nsa.attention.cache import NSACache
from nsa.config import ModelConfig
from nsa.model import NSAModel, lm_loss
from nsa_test_utils import make_attn, make_cfg

TINY = dict(vocab_size=64, dim=32, n_layers=1, n_heads=4, n_kv_groups=2, d_k=8, d_v=8, l=8, d=4, l_sel=8, n_sel=4,
            w=16)


def _model(loss="reference"):
    torch.manual_seed(0)
    return NSAModel(ModelConfig.from_flat({**TINY, "loss": loss}))


def _ids(b, s, seed):
    return torch.randint(0, TINY["vocab_size"], (b, s), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("loss", ["reference", "chunked"])
@pytest.mark.parametrize("bad", ["transposed", "flat", "float"])
def test_targets_of_another_shape_or_dtype_are_a_value_error(loss, bad):
    model = _model(loss)
    ids, targets = _ids(2, 12, 1), _ids(2, 12, 2)
    wrong = {"transposed": targets.T.contiguous(), "flat": targets.flatten(), "float": targets.float()}[bad]
    with pytest.raises(ValueError, match="targets") as err:
        model(ids, wrong)
    assert str(tuple(wrong.shape)) in str(err.value) and "(2, 12)" in str(err.value)


def test_lm_loss_refuses_targets_of_another_shape():
    logits = torch.randn(2, 12, 64)
    with pytest.raises(ValueError, match=r"\(2, 12\)"):
        lm_loss(logits, _ids(12, 2, 0))
    assert torch.isfinite(lm_loss(logits, _ids(2, 12, 0)))


def test_int32_targets_give_the_int64_loss_on_every_loss():
    ids, targets = _ids(2, 12, 1), _ids(2, 12, 2)
    for loss in ("reference", "chunked"):
        model = _model(loss)
        want = model(ids, targets)
        assert torch.equal(model(ids, targets.to(torch.int32)), want), loss


@pytest.mark.parametrize("prefill", ["batched", "sequential"])
def test_an_empty_batch_is_a_value_error_naming_the_shape(prefill):
    attn = make_attn(make_cfg(prefill=prefill), seed=1)
    x = torch.randn(0, 21, attn.cfg.dim)
    for call in (attn, attn.branch_outputs, attn.selected_blocks):
        with pytest.raises(ValueError, match=r"B>=1.*\(0, 21, 32\)"):
            call(x)
    with pytest.raises(ValueError, match=r"B>=1"):
        DenseAttention(attn.cfg)(x)
    with pytest.raises(ValueError, match=r"B>=1"):
        _model()(torch.zeros(0, 12, dtype=torch.int64))
    with pytest.raises(ValueError, match="batch size"):
        attn.new_cache(0)


def test_a_cache_that_keeps_too_few_tokens_is_refused():
    attn = make_attn(make_cfg(w=16, l=8), seed=1)
    x = torch.randn(1, 1, attn.cfg.dim)
    for w, l in ((4, 8), (16, 4)):
        with pytest.raises(ValueError, match="new_cache"):
            attn.decode_step(x, NSACache(batch_size=1, w=w, l=l))
    attn.decode_step(x, NSACache(batch_size=1, w=32, l=8))  # one that keeps more is fine
