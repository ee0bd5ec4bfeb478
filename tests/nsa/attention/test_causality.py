"""Changing x at positions >= t never changes outputs at positions < t.

Checked for every prefill/selection path and for token-by-token decode, with
t inside the first window, beyond the window, and beyond several selection
blocks (so top-k selection is active).
"""

import pytest
import torch

from nsa_test_utils import make_attn, make_cfg, rand_x

# l=8, d=4, l_sel=8, n_sel=4 (32 tokens of selection, importance-driven from t=32), w=16
S = 60
TS = [1, 7, 9, 17, 30, 45, 59]


def _perturbed(x, t, seed):
    g = torch.Generator().manual_seed(seed)
    x2 = x.clone()
    x2[:, t:] = 5.0 * torch.randn(x2[:, t:].shape, generator=g)
    return x2


@pytest.mark.parametrize("prefill", ["batched", "sequential"])
@pytest.mark.parametrize("selection", ["v2", "v1"])
def test_prefill_is_causal(prefill, selection):
    torch.manual_seed(0)
    cfg = make_cfg(prefill=prefill, selection=selection)
    attn = make_attn(cfg, seed=1)
    x = rand_x(2, S, cfg.dim, seed=2)
    with torch.no_grad():
        y = attn(x)
        br = attn.branch_outputs(x)
        for t in TS:
            x2 = _perturbed(x, t, seed=100 + t)
            y2 = attn(x2)
            br2 = attn.branch_outputs(x2)
            torch.testing.assert_close(y2[:, :t], y[:, :t], atol=1e-6, rtol=1e-6, msg=lambda m: f"future leak into output before t={t}: {m}")
            for name in ("cmp", "sel", "win"):
                torch.testing.assert_close(
                    br2[name][:, :, :t], br[name][:, :, :t], atol=1e-6, rtol=1e-6,
                    msg=lambda m: f"future leak into branch {name} before t={t}: {m}",
                )
            # sanity: the perturbation is effective at position t
            assert (y2[:, t] - y[:, t]).abs().max() > 1e-4


def test_decode_is_causal():
    torch.manual_seed(0)
    cfg = make_cfg()
    attn = make_attn(cfg, seed=1)
    x = rand_x(2, S, cfg.dim, seed=2)

    def decode_all(inp):
        cache = attn.new_cache(inp.shape[0])
        return torch.cat([attn.decode_step(inp[:, k : k + 1], cache) for k in range(inp.shape[1])], dim=1)

    with torch.no_grad():
        y = decode_all(x)
        for t in (9, 30, 45):
            x2 = _perturbed(x, t, seed=200 + t)
            y2 = decode_all(x2)
            torch.testing.assert_close(y2[:, :t], y[:, :t], atol=1e-6, rtol=1e-6, msg=lambda m: f"decode: future leak before t={t}: {m}")
            assert (y2[:, t] - y[:, t]).abs().max() > 1e-4
