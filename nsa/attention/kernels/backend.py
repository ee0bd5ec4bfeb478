"""The batched path's branch pipeline over one interface: the layer writes the pipeline once (NSAAttention.
_branches_batched: compressed, then the selection and the selected branch, then the window) over a backend that
says how each step runs.

    compressed(p) -> (o_cmp, lse or None)   the compressed branch; the Triton path also returns its log-sum-exp,
                                            which ranks the selection blocks without a second softmax pass
    select(p, lse) -> blocks                each query group's n_sel selection blocks [B, G, S, n_sel]
    selected(p, blocks) -> o_sel            the selected branch over those blocks
    window(p) -> o_win                      the sliding-window branch

`p` is the layer's NSAProjections (q, k_cmp, v_cmp, k_sel, v_sel, k_win, v_win). `branches(...)` picks the backend
the configured kernel resolves to on the projections' device (nsa.attention.kernels.resolve).
"""

from __future__ import annotations

from typing import Callable, Protocol

import torch

from nsa.attention.kernels import (compressed_attention, resolve, selected_attention, triton_modules,
                                   window_attention)
from nsa.config import NSAConfig
from nsa.observability import span


class Branches(Protocol):
    def compressed(self, p) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def select(self, p, lse: torch.Tensor | None) -> torch.Tensor: ...

    def selected(self, p, blocks: torch.Tensor) -> torch.Tensor: ...

    def window(self, p) -> torch.Tensor: ...


class TorchBranches:
    """The PyTorch path (the naive.py modules; CPU and CUDA). `select` is the layer's selection (Eq. 9, 10:
    importance from the compressed probabilities, then choose_blocks) and `range_builder` its selection-range
    builder (cfg.selection's, or the wrapper a trainer fault installs), both read from the layer per forward."""

    def __init__(self, cfg: NSAConfig, select: Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor],
                 range_builder: Callable):
        self.cfg, self._select, self._ranges = cfg, select, range_builder

    def compressed(self, p) -> tuple[torch.Tensor, None]:
        return compressed_attention(p.q, p.k_cmp, p.v_cmp, self.cfg.l, self.cfg.d), None

    def select(self, p, lse: None) -> torch.Tensor:
        return self._select(p.q, p.k_cmp, p.q.shape[2])

    def selected(self, p, blocks: torch.Tensor) -> torch.Tensor:
        s = p.q.shape[2]
        with span(f"nsa.sel.ranges_{self.cfg.selection}"):
            ranges = self._ranges(blocks, torch.arange(s, device=p.q.device), self.cfg.l_sel)
        return selected_attention(p.q, p.k_sel, p.v_sel, ranges, self.cfg.l_sel)

    def window(self, p) -> torch.Tensor:
        return window_attention(p.q, p.k_win, p.v_win, self.cfg.w)


class TritonBranches:
    """The Triton path (each op package's host.py): every branch and the selection fused, no host synchronisation.
    The compressed branch's log-sum-exp gives the compressed attention probabilities exp(s - lse) that rank the
    selection blocks; the selected branch's inverted index is cfg.index_build's."""

    def __init__(self, cfg: NSAConfig):
        self.cfg, self.tk = cfg, triton_modules()

    def compressed(self, p) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tk.range.compressed_attention_lse(p.q, p.k_cmp, p.v_cmp, self.cfg.l, self.cfg.d)

    def select(self, p, lse: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        with span("nsa.sel.importance"):
            return self.tk.selection.select_blocks(p.q, p.k_cmp, lse, cfg.l, cfg.d, cfg.l_sel, cfg.n_sel)

    def selected(self, p, blocks: torch.Tensor) -> torch.Tensor:
        return self.tk.selected.selected_attention(p.q, p.k_sel, p.v_sel, blocks, self.cfg.l_sel,
                                                   index_build=self.cfg.index_build)

    def window(self, p) -> torch.Tensor:
        return self.tk.range.window_attention(p.q, p.k_win, p.v_win, self.cfg.w)


def branches(cfg: NSAConfig, device: torch.device, select: Callable, range_builder: Callable,
             dtype: torch.dtype | None = None) -> Branches:
    """The backend cfg.kernel resolves to on `device` (for projections of `dtype`, if given): TritonBranches or
    TorchBranches (whose `select` and `range_builder` are the layer's)."""
    if resolve(cfg.kernel, device, cfg, dtype) == "triton":
        return TritonBranches(cfg)
    return TorchBranches(cfg, select, range_builder)
