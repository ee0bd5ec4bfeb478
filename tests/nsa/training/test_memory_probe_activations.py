"""comm_model.activation_bytes against what autograd really saves (saved_tensors_hooks, unique storages, parameters
excluded), for every loss, precision, attention and activation checkpointing; memory_model with DDP's
gradient_as_bucket_view against real DDP's storages; the trainer's figure for the model it builds."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml

from train_utils import TINY

from nsa.config import ModelConfig
from nsa.loss import linear_cross_entropy
from nsa.model import NSAModel, lm_loss
from nsa.training.comm_model import activation_bytes, memory_model, param_specs

AUTOCAST = {"fp32": None, "bf16": torch.bfloat16}


def _cfg(**changes) -> ModelConfig:
    return ModelConfig.from_flat({**yaml.safe_load(TINY.read_text())["model"], **changes})


def _autocast(precision: str):
    dtype = AUTOCAST[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast("cpu", dtype=dtype)


class _Saved:
    """Bytes autograd saves for backward in the block: each tensor storage once, parameters left out."""

    def __init__(self, exclude=()):
        self.exclude = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, int] = {}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def _pack(self, t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in self.exclude:
            self.storages[storage.data_ptr()] = storage.nbytes()
        return t

    @property
    def bytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self):
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc):
        self._hooks.__exit__(*exc)


def _loss(net: NSAModel, ids, targets):
    return lm_loss(net(ids), targets) if net.cfg.loss == "reference" else net(ids, targets)


def _saved_by_step(cfg: ModelConfig, b: int, s: int, precision: str) -> tuple[int, NSAModel, torch.Tensor]:
    torch.manual_seed(0)
    net = NSAModel(cfg)
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    with _Saved(net.parameters()) as saved, _autocast(precision):
        loss = _loss(net, ids, ids)
    return saved.bytes, net, loss


CASES = [  # (model changes, batch, seq_len): past the window (chunked window, padded chunks), within it, dense
    ({}, 2, 128),
    ({}, 3, 100),
    ({"n_layers": 1}, 1, 200),
    ({"phi": "avg", "gate": "softmax"}, 2, 48),
    ({"attention": "dense"}, 2, 128),
    ({"n_layers": 1, "vocab_size": 4096}, 2, 64),  # the head's share dominant, as in a 125M model with one layer
]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("loss", ["reference", "chunked"])
@pytest.mark.parametrize("changes,b,s", CASES)
def test_activation_bytes_is_what_autograd_saves(changes, b, s, loss, precision):
    cfg = _cfg(**changes, loss=loss)
    measured, _, _ = _saved_by_step(cfg, b, s, precision)
    assert activation_bytes(cfg, b, s, precision) == pytest.approx(measured, rel=0.03)


def test_the_head_saves_the_log_softmax_or_the_fused_losses_gradients():
    """By hand, tiny model at B 2 x S 128 (N = 256 tokens, V = 256, D = 64, fp32): the reference's cross entropy
    saves the fp32 log-softmax [N, V] and the int64 targets; the chunked and fused losses save no logits but their
    fp32 head-weight gradient [V, D] (their hidden-state gradient takes the place of the head's saved input)."""
    n, v, d = 256, 256, 64
    ref, chunked, fused = (activation_bytes(_cfg(loss=loss), 2, 128) for loss in ("reference", "chunked", "fused"))
    assert ref - chunked == n * v * 4 + n * 8 - v * d * 4 == 198_656
    assert fused == chunked
    # bf16: the head's bf16 input [N, D] and its bf16 weight copy [V, D] beside the same log-softmax
    ref16, chunked16 = (activation_bytes(_cfg(loss=loss), 2, 128, "bf16") for loss in ("reference", "chunked"))
    assert ref16 - chunked16 == n * v * 4 + n * 8 + v * d * 2 - v * d * 4


def test_the_fused_loss_saves_what_the_chunked_one_saves():
    """nsa.loss's autograd Function keeps the same two gradients for both (fused only changes how a chunk's
    logit gradient is made): the head's saved bytes are its hidden-state gradient [N, D] and fp32 weight gradient."""
    torch.manual_seed(0)
    hidden = torch.randn(256, 64, requires_grad=True)
    weight = torch.randn(256, 64, requires_grad=True)
    with _Saved([weight, hidden]) as saved:
        linear_cross_entropy(hidden, weight, torch.randint(0, 256, (256,)), chunk=100)
    assert saved.bytes == 256 * 64 * 4 + 256 * 64 * 4 + 4


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("loss", ["reference", "chunked"])
def test_checkpointing_keeps_block_inputs_and_one_recomputed_block(loss, precision):
    """With checkpointing, what is saved at the end of forward (the ids, each block's input, the head's tensors:
    measured) and, when the last block is recomputed, those less the head's (freed by then) plus that block's own
    tensors (measured on the block alone; its input is one of those kept)."""
    b, s = 2, 128
    cfg = _cfg(loss=loss, activation_checkpointing=True)
    at_forward, net, _ = _saved_by_step(cfg, b, s, precision)
    x = torch.randn(b, s, cfg.dim, requires_grad=True)
    with _Saved(net.parameters()) as block, _autocast(precision):
        net.blocks[-1](x)
    with _Saved(net.parameters()) as head, _autocast(precision):
        hidden = net.norm(torch.randn(b, s, cfg.dim, requires_grad=True))
        ids = torch.randint(0, cfg.vocab_size, (b, s))
        if loss == "reference":
            F.cross_entropy(net.head(hidden).float().flatten(0, 1), ids.flatten())
        else:
            linear_cross_entropy(hidden.flatten(0, 1), net.head.weight, ids.flatten())
    recompute = at_forward - head.bytes + block.bytes - x.untyped_storage().nbytes()
    assert activation_bytes(cfg, b, s, precision) == pytest.approx(max(at_forward, recompute), rel=0.03)
    assert recompute > at_forward  # the tiny model's head is smaller than a block


def test_ddp_gradients_as_bucket_views_are_no_extra_buffer(tmp_path):
    """Real DDP (one gloo rank): the bytes of its gradient buckets and of the parameters' .grad, each storage once,
    are memory_model's grads + buffers, with and without gradient_as_bucket_view (per rank, so the world size the
    model is asked about does not change them)."""
    cfg = _cfg(n_layers=1)
    ids = torch.randint(0, cfg.vocab_size, (1, 32))
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        for view in (False, True):
            torch.manual_seed(0)
            net = NSAModel(cfg)
            ddp = torch.nn.parallel.DistributedDataParallel(net, gradient_as_bucket_view=view)
            buckets = {}

            def hook(state, bucket):
                buffer = bucket.buffer()
                buckets[buffer.untyped_storage().data_ptr()] = buffer.untyped_storage().nbytes()
                future = torch.futures.Future()
                future.set_result(buffer)
                return future

            ddp.register_comm_hook(None, hook)
            lm_loss(ddp(ids), ids).backward()
            grads = {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
                     for p in net.parameters()}
            held = sum({**buckets, **grads}.values())
            model = memory_model(param_specs(net), "ddp", world_size=2, gradient_as_bucket_view=view)
            assert model["grads"] + model["buffers"] == held
            assert held == (1 if view else 2) * sum(p.numel() * 4 for p in net.parameters())
    finally:
        dist.destroy_process_group()


def test_the_trainers_figure_is_the_model_it_builds(tmp_path):
    """NSA_LOSS=chunked (the config says auto): the trainer's memory_model activations are what its own model saves
    on one of its micro-batches with the chunked loss, not the reference's batch-wide log-softmax."""
    from nsa import toggles
    from nsa.training import distributed, trainer
    from nsa.training.cli import resolve_config
    from nsa.training.flags import build_parser

    raw = yaml.safe_load(TINY.read_text())
    raw["model"].update({"vocab_size": 4096, "n_layers": 1})
    raw["train"].update({"seq_len": 64, "batch_size": 2})
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw))
    argv = ["--config", str(path), "--out-dir", str(tmp_path / "out"), "--steps", "1", "--save-every", "1000"]
    cfg, cfg_path = resolve_config(build_parser().parse_args(argv), environ={})
    tg = toggles.Toggles.read({"NSA_LOSS": "chunked", "NSA_TB_DISABLE": "1"})
    info = distributed.init(cfg.train.device, cfg.train.pg_timeout_s)
    run = trainer.Trainer(cfg, cfg_path, info, tg, False, ["nsa-train", *argv])
    try:
        ids = torch.randint(0, 4096, (2, 64))
        with _Saved(run.net.parameters()) as saved:
            run.net(ids, ids)
        assert run.memory_prediction["activations"] == pytest.approx(saved.bytes, rel=0.03)
    finally:
        run.heartbeat.close()
