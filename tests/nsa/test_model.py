"""NSAModel (nsa/model.py): shapes, causality, activation checkpointing, parameter count, FLOPs cost model,
aux statistics, learning, and ModelConfig validation.

Every expectation is computed independently of the code under test: parameter counts from unique parameter
ids, dense FLOPs from the nn.Linear modules of a built model, attention FLOPs by counting, per query position,
the keys each branch reads with explicit masks, and checkpointing against the plain model's gradients.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import yaml

from nsa.model import ModelConfig, NSAModel, flops_per_token, lm_loss
from nsa_test_utils import randomize_params

REPO = Path(__file__).resolve().parents[2]
PRODUCTION = REPO / "configs" / "m7c_125m_2xa100_production.yaml"

# Tiny shapes that exercise every branch at S = 160: compressed blocks of 16 every 8 tokens, 5 selection blocks
# of 32 of which n_sel = 4 are kept (so importance matters), and a window of 32 < S.
TINY = dict(vocab_size=128, dim=64, n_layers=2, n_heads=4, n_kv_groups=2, d_k=16, d_v=16,
            l=16, d=8, l_sel=32, n_sel=4, w=32)
S = 160


def tiny_cfg(**overrides) -> ModelConfig:
    return ModelConfig.from_flat({**TINY, **overrides})


def tiny_model(seed: int = 0, randomize: bool = True, **overrides) -> NSAModel:
    """A tiny model; randomize=True overwrites every weight with well-scaled random values (init-independent)."""
    torch.manual_seed(seed)
    model = NSAModel(tiny_cfg(**overrides))
    if randomize:
        randomize_params(model, seed=seed + 1000)
    return model


def tokens(b: int, s: int, vocab: int = TINY["vocab_size"], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (b, s), generator=gen)


def production_model_cfg() -> ModelConfig:
    return ModelConfig.from_flat(yaml.safe_load(PRODUCTION.read_text())["model"])


# ----------------------------------------------------------------------------------------------- shapes and inputs


def test_logits_shape_and_dtype():
    model = tiny_model()
    x = tokens(3, 40)
    logits = model(x)
    assert logits.shape == (3, 40, TINY["vocab_size"])
    assert logits.dtype == torch.float32
    assert torch.isfinite(logits).all()
    # int32 ids are accepted and mean the same tokens
    torch.testing.assert_close(model(x.to(torch.int32)), logits, atol=0, rtol=0)


def test_bf16_model_logits_and_fp32_loss():
    model = tiny_model().to(torch.bfloat16)
    x = tokens(2, 48)
    logits = model(x)
    assert logits.shape == (2, 48, TINY["vocab_size"]) and logits.dtype == torch.bfloat16
    loss = model.loss(x, x)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)


@pytest.mark.parametrize("bad", [
    torch.zeros(40, dtype=torch.int64),  # [S]
    torch.zeros(1, 2, 40, dtype=torch.int64),  # [B, S, 1]
    torch.zeros(2, 40, dtype=torch.float32),  # float ids
    torch.zeros(2, 40, dtype=torch.bool),
], ids=["1d", "3d", "float", "bool"])
def test_bad_input_names_expected_shape(bad):
    model = tiny_model(randomize=False)
    with pytest.raises(ValueError, match=r"\[B, S\]") as err:
        model(bad)
    assert str(tuple(bad.shape)) in str(err.value)  # and what it got


def test_empty_sequence_is_a_value_error():
    with pytest.raises(ValueError):
        tiny_model(randomize=False)(torch.zeros(2, 0, dtype=torch.int64))


def test_lm_loss_is_mean_next_token_cross_entropy():
    model = tiny_model()
    x, y = tokens(2, 40, seed=1), tokens(2, 40, seed=2)
    logits = model(x)
    # independent: -log p(target), averaged over every position of every sequence, in float64
    logp = torch.log_softmax(logits.double(), dim=-1)
    expected = -logp.gather(-1, y.unsqueeze(-1)).mean()
    loss = lm_loss(logits, y)
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert abs(loss.item() - expected.item()) < 1e-5
    assert abs(model.loss(x, y).item() - expected.item()) < 1e-5


# ----------------------------------------------------------------------------------------------------- causality


@pytest.mark.parametrize("t", [1, 15, 16, 40, 63, 100, 150])
def test_model_is_causal(t):
    """Changing tokens at positions >= t leaves logits < t unchanged and changes every logit >= t."""
    model = tiny_model()
    x = tokens(2, S)
    gen = torch.Generator().manual_seed(t)
    y = x.clone()
    shift = torch.randint(1, TINY["vocab_size"], (S - t,), generator=gen)
    y[0, t:] = (x[0, t:] + shift) % TINY["vocab_size"]  # every token at >= t differs; sequence 1 unchanged
    with torch.no_grad():
        a, b = model(x), model(y)
    torch.testing.assert_close(b[0, :t], a[0, :t], atol=1e-6, rtol=0, msg=lambda m: f"future leaked into < {t}: {m}")
    # the other sequence of the batch is untouched by sequence 0's change
    torch.testing.assert_close(b[1], a[1], atol=1e-6, rtol=0, msg=lambda m: f"batch rows interact: {m}")
    # ... and the change is visible at every position >= t, so the comparison above can fail
    changed = (b[0, t:] - a[0, t:]).abs().amax(dim=-1)
    assert bool((changed > 1e-4).all()), f"positions >= {t} unchanged: {changed}"


# ---------------------------------------------------------------------------------------- activation checkpointing


def _loss_and_grads(model: NSAModel, x: torch.Tensor, y: torch.Tensor):
    model.zero_grad(set_to_none=True)
    loss = model.loss(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _plain_and_checkpointed(n_layers: int, seed: int = 0):
    plain = tiny_model(seed=seed, n_layers=n_layers)
    ckpt = NSAModel(tiny_cfg(n_layers=n_layers, activation_checkpointing=True))
    ckpt.load_state_dict(plain.state_dict())
    return plain, ckpt


def assert_checkpointing_matches(plain: NSAModel, ckpt: NSAModel, x, y) -> None:
    loss_p, grads_p = _loss_and_grads(plain, x, y)
    loss_c, grads_c = _loss_and_grads(ckpt, x, y)
    assert torch.equal(loss_c, loss_p) or abs(loss_c.item() - loss_p.item()) < 1e-6, (loss_c, loss_p)
    assert grads_c.keys() == grads_p.keys()
    bad = [n for n in grads_p if not torch.allclose(grads_c[n], grads_p[n], atol=1e-6, rtol=0)]
    assert not bad, f"checkpointed gradients differ from the plain model's for {bad}"


def test_checkpointing_gives_identical_loss_and_gradients():
    plain, ckpt = _plain_and_checkpointed(n_layers=2)
    x, y = tokens(2, S, seed=3), tokens(2, S, seed=4)
    assert_checkpointing_matches(plain, ckpt, x, y)
    _, grads = _loss_and_grads(plain, x, y)
    for name, g in grads.items():
        assert g.abs().max() > 0, f"{name}: zero gradient makes the comparison vacuous"


def test_checkpointing_each_layer_recomputes_its_own_block():
    """The seed bug: closures built in a loop made every layer recompute the LAST block in backward. With three
    layers of distinct weights, each layer's gradients must equal the plain model's, layer by layer."""
    plain, ckpt = _plain_and_checkpointed(n_layers=3, seed=7)
    blocks = plain.blocks
    # distinct weights per layer, so recomputing another layer's block would give different activations
    for i, j in ((0, 1), (1, 2), (0, 2)):
        assert not torch.equal(blocks[i].attn.q_proj.weight, blocks[j].attn.q_proj.weight)
    x, y = tokens(2, S, seed=5), tokens(2, S, seed=6)
    loss_p, grads_p = _loss_and_grads(plain, x, y)
    loss_c, grads_c = _loss_and_grads(ckpt, x, y)
    assert abs(loss_c.item() - loss_p.item()) < 1e-6
    for layer in range(3):
        names = [n for n in grads_p if n.startswith(f"blocks.{layer}.")]
        assert len(names) > 10
        for n in names:
            torch.testing.assert_close(grads_c[n], grads_p[n], atol=1e-6, rtol=0,
                                       msg=lambda m, n=n: f"{n}: gradient wrong under checkpointing: {m}")
    # the gradients of different layers differ from each other, so a mix-up between layers would be visible
    for suffix in ("attn.q_proj.weight", "attn.k_sel.weight", "mlp.w_up.weight", "attn_norm.weight"):
        per_layer = [grads_p[f"blocks.{i}.{suffix}"] for i in range(3)]
        for i, j in ((0, 1), (1, 2), (0, 2)):
            assert (per_layer[i] - per_layer[j]).abs().max() > 1e-4, f"{suffix}: layers {i} and {j} have equal grads"


def _count_block_forwards(model: NSAModel, x, y, grad: bool = True) -> list[int]:
    counts = [0] * len(model.blocks)
    handles = []
    for i, block in enumerate(model.blocks):
        def hook(module, args, i=i):
            counts[i] += 1
        # a pre-hook: non-reentrant checkpointing may stop a recomputation early, before a forward hook would run
        handles.append(block.register_forward_pre_hook(hook))
    try:
        if grad:
            model.loss(x, y).backward()
        else:
            with torch.no_grad():
                model.loss(x, y)
    finally:
        for h in handles:
            h.remove()
    return counts


def test_checkpointing_recomputes_each_block_in_backward():
    plain, ckpt = _plain_and_checkpointed(n_layers=2)
    x, y = tokens(1, 64, seed=8), tokens(1, 64, seed=9)
    assert _count_block_forwards(plain, x, y) == [1, 1]
    assert _count_block_forwards(ckpt, x, y) == [2, 2]  # forward, then recomputed once in backward
    assert _count_block_forwards(ckpt, x, y, grad=False) == [1, 1]  # nothing to recompute without autograd


# ------------------------------------------------------------------------------------------- parameters and tying


def _unique_param_count(model: nn.Module) -> int:
    seen = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        seen[id(p)] = p.numel()
    return sum(seen.values())


def test_tied_embeddings_share_one_tensor_counted_once():
    tied = tiny_model(randomize=False, tie_embeddings=True)
    untied = tiny_model(randomize=False, tie_embeddings=False)
    assert tied.head.weight is tied.tok_emb.weight
    assert untied.head.weight is not untied.tok_emb.weight
    emb = TINY["vocab_size"] * TINY["dim"]
    all_tied = sum(p.numel() for _, p in tied.named_parameters(remove_duplicate=False))
    assert tied.num_params() == _unique_param_count(tied) == all_tied - emb
    assert untied.num_params() == _unique_param_count(untied)
    assert untied.num_params() - tied.num_params() == emb
    # tying is real: the head reads the embedding table
    with torch.no_grad():
        tied.tok_emb.weight[5].fill_(0.5)
    assert torch.all(tied.head.weight[5] == 0.5)


@pytest.mark.parametrize("name", ["m7c_125m_2xa100_production", "m7c_125m_1xh100", "m7c_125m_40g"])
def test_m7c_config_has_about_125m_parameters(name):
    cfg = ModelConfig.from_flat(yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())["model"])
    with torch.device("meta"):
        model = NSAModel(cfg)
    assert next(model.parameters()).is_meta
    n = model.num_params()
    assert n == _unique_param_count(model)
    assert 120e6 <= n <= 130e6, n


# ----------------------------------------------------------------------------------------------------- FLOPs model


def _is_compressor(name: str) -> bool:
    return ".phi_k." in name or ".phi_v." in name


def independent_flops(model: NSAModel, seq_len: int) -> dict[str, float]:
    """Training FLOPs per token from a built model (meta is fine) and explicit per-position key counts.

    dense:      2*in*out of every nn.Linear a token goes through (compressor MLPs excluded), x3 for training.
    compressor: the phi_k/phi_v MLPs run once per compression block and per KV group: 2*in*out of their
                Linear layers x (blocks in the sequence) x G / seq_len, x3.
    attention:  for each query t, keys read per head = visible compressed blocks + tokens <= t of the n_sel
                selected blocks + window; 2*(d_k+d_v) FLOPs per key per head, x3; plus forward-only importance
                scores 2*d_k per visible compressed block per head.
    """
    cfg = model.cfg
    L, H, G = cfg.n_layers, cfg.n_heads, cfg.n_kv_groups
    a = cfg.nsa
    l, d, l_sel, n_sel, w = a.l, a.d, a.l_sel, a.n_sel, a.w

    dense = 0
    cmp_linear = 0
    for name, mod in model.named_modules():
        if isinstance(mod, nn.Linear):
            if _is_compressor(name):
                cmp_linear += 2 * mod.in_features * mod.out_features
            else:
                dense += 2 * mod.in_features * mod.out_features
    # blocks [i*d, i*d + l) that lie inside the sequence, counted one by one
    n_blocks = sum(1 for i in range(seq_len) if i * d + l <= seq_len)
    compressor = cmp_linear * G * n_blocks / seq_len

    pos = torch.arange(seq_len)
    block_ends = torch.arange(seq_len) * d + l - 1
    reads = cmp_reads = 0
    for t in range(seq_len):
        n_cmp = int((block_ends <= t).sum())
        # selection: the current (partial) block and n_sel - 1 others (block 0, then the most recent ones), each
        # counted by its tokens <= t; with fewer than n_sel started blocks, all of them
        cur = t // l_sel
        started = list(range(cur + 1))
        chosen = started if len(started) <= n_sel else [0] + started[-(n_sel - 1):]
        assert len(set(chosen)) == min(n_sel, cur + 1)
        sel_mask = torch.isin(pos // l_sel, torch.tensor(chosen)) & (pos <= t)
        n_sel_tok = int(sel_mask.sum())
        assert n_sel_tok == min(t + 1, (n_sel - 1) * l_sel + (t % l_sel + 1))  # the closed form, cross-checked
        n_win = int(((pos <= t) & (pos > t - w)).sum())
        assert n_win == min(w, t + 1)
        reads += n_cmp + n_sel_tok + n_win
        cmp_reads += n_cmp
    attention = L * H * 2 * (a.d_k + a.d_v) * reads / seq_len
    importance = L * H * 2 * a.d_k * cmp_reads / seq_len
    return {"dense": 3.0 * dense, "compressor": 3.0 * compressor, "attention": 3.0 * attention,
            "importance": float(importance)}


@pytest.mark.parametrize("overrides,seq_len", [
    ({}, 160),
    ({}, 8),  # shorter than one compression block: no compressed tokens
    ({}, 37),
    ({"phi": "avg", "tie_embeddings": True}, 160),
    ({"n_sel": 3, "w": 16, "ffn_hidden": 96}, 100),
])
def test_flops_per_token_matches_independent_count_tiny(overrides, seq_len):
    model = tiny_model(randomize=False, **overrides)
    expected = independent_flops(model, seq_len)
    total = sum(expected.values())
    got = flops_per_token(model.cfg, seq_len)
    assert got == pytest.approx(total, rel=1e-2), expected
    # every term is derived from the documented cost model, so agreement is exact up to rounding; 1% alone would
    # not notice a missing importance term (~0.2% of the total here)
    assert got == pytest.approx(total, rel=1e-9), expected
    assert model.flops_per_token(seq_len) == got
    if model.cfg.nsa.phi == "avg":
        assert expected["compressor"] == 0


def test_flops_per_token_production_config():
    cfg = production_model_cfg()
    with torch.device("meta"):
        model = NSAModel(cfg)
    expected = independent_flops(model, 2048)
    got = flops_per_token(cfg, 2048)
    assert got == pytest.approx(sum(expected.values()), rel=1e-2), expected
    assert got == pytest.approx(sum(expected.values()), rel=1e-9), expected  # compressor term is ~0.6% here
    # sanity: a 125M model at S=2048 is of the order of 6 * N FLOPs per token (plus attention)
    assert 6 * model.num_params() * 0.5 < got < 6 * model.num_params() * 3


def test_selection_key_count_matches_the_blocks_the_model_selects():
    """The FLOPs model's selected-token count equals the tokens <= t of the blocks forward actually selects."""
    model = tiny_model()
    cfg = model.cfg
    captured = []
    handle = model.blocks[1].attn.register_forward_hook(lambda m, args, out: captured.append(args[0].detach()))
    with torch.no_grad():
        model(tokens(2, S))
    handle.remove()
    blocks = model.blocks[1].attn.selected_blocks(captured[0])  # [B, G, S, n_sel], -1 = none
    pos = torch.arange(S)
    for t in (0, 31, 32, 95, 96, 127, 128, 159):
        expected = min(t + 1, (cfg.nsa.n_sel - 1) * cfg.nsa.l_sel + (t % cfg.nsa.l_sel + 1))
        for b in range(2):
            for g in range(cfg.n_kv_groups):
                chosen = blocks[b, g, t]
                chosen = chosen[chosen >= 0]
                assert len(set(chosen.tolist())) == len(chosen) == min(cfg.nsa.n_sel, t // cfg.nsa.l_sel + 1)
                n = int((torch.isin(pos // cfg.nsa.l_sel, chosen) & (pos <= t)).sum())
                assert n == expected, (t, b, g, chosen.tolist())


def test_flops_attention_part_grows_sub_quadratically():
    cfg = production_model_cfg()
    with torch.device("meta"):
        model = NSAModel(cfg)
    dense_linear = sum(2 * m.in_features * m.out_features for n, m in model.named_modules()
                       if isinstance(m, nn.Linear) and not _is_compressor(n))
    cmp_linear = sum(2 * m.in_features * m.out_features for n, m in model.named_modules()
                     if isinstance(m, nn.Linear) and _is_compressor(n))

    def attention_part(s):  # the function's total minus the dense and compressor terms, per token
        n_blocks = (s - cfg.nsa.l) // cfg.nsa.d + 1
        return flops_per_token(cfg, s) - 3.0 * (dense_linear + cmp_linear * cfg.n_kv_groups * n_blocks / s)

    lengths = [512, 1024, 2048, 4096, 8192, 16384]
    totals = [flops_per_token(cfg, s) for s in lengths]
    assert all(a < b for a, b in zip(totals, totals[1:])), totals  # more context, more work per token
    per_token = attention_part(16384) / attention_part(4096)
    per_sequence = 4 * per_token  # 4x the tokens
    # dense attention would be 4x per token and 16x per sequence; NSA reads a bounded selection and window
    assert 1.0 < per_token < 2.0, per_token
    assert per_sequence < 8.0, per_sequence


@pytest.mark.parametrize("phi", ["avg", "mlp"])
def test_flops_per_token_rejects_empty_sequence(phi):
    with pytest.raises(ValueError, match="seq_len"):
        flops_per_token(tiny_cfg(phi=phi), 0)


# ------------------------------------------------------------------------------------------------------ aux stats


def test_aux_stats_recorded_only_when_enabled():
    model = tiny_model()
    x1, x2 = tokens(2, S, seed=11), tokens(2, S, seed=12)
    assert model.aux_stats() == {}
    with torch.no_grad():
        model(x1)
    assert model.aux_stats() == {}, "recorded with record_stats off"

    # capture each layer's attention input to recompute the statistics independently
    inputs = []
    handles = [blk.attn.register_forward_hook(lambda m, args, out: inputs.append(args[0].detach()))
               for blk in model.blocks]
    model.set_record_stats(True)
    with torch.no_grad():
        model(x1)
    for h in handles:
        h.remove()
    stats = model.aux_stats()
    assert set(stats) == {"gate_cmp", "gate_sel", "gate_win", "sel_mean_dist_blocks"}
    for key in ("gate_cmp", "gate_sel", "gate_win"):
        assert 0.0 < stats[key] < 1.0, (key, stats[key])
    assert stats["sel_mean_dist_blocks"] > 0.0  # S spans 5 selection blocks: earlier blocks are selected

    cfg = model.cfg
    gate_means, dists = [], []
    for blk, inp in zip(model.blocks, inputs):
        with torch.no_grad():
            gates = torch.sigmoid(blk.attn.gate(inp)).view(*inp.shape[:2], cfg.n_heads, 3)
        gate_means.append(gates.mean(dim=(0, 1, 2)))
        chosen = blk.attn.selected_blocks(inp)  # [B, G, S, n_sel]
        current = (torch.arange(inp.shape[1]) // cfg.nsa.l_sel).view(1, 1, -1, 1).expand_as(chosen)
        valid = chosen >= 0
        dists.append((current - chosen)[valid].double().mean())
    gate_mean = torch.stack(gate_means).mean(dim=0)
    for i, key in enumerate(("gate_cmp", "gate_sel", "gate_win")):
        assert stats[key] == pytest.approx(gate_mean[i].item(), abs=1e-6), key
    assert stats["sel_mean_dist_blocks"] == pytest.approx(torch.stack(dists).mean().item(), abs=1e-5)

    # recording off again: another forward leaves the last recorded statistics as they were
    model.set_record_stats(False)
    with torch.no_grad():
        model(x2)
    assert model.aux_stats() == stats
    # recording on: the statistics follow the latest forward
    model.set_record_stats(True)
    with torch.no_grad():
        model(x2)
    assert model.aux_stats() != stats


# ---------------------------------------------------------------------------------------------- learning / grads


def test_every_parameter_gets_a_gradient():
    model = tiny_model(randomize=False)  # the model's own init: nothing may start dead
    x = tokens(2, S, seed=13)
    model.loss(x[:, :-1], x[:, 1:]).backward()
    for name, p in model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient"
        assert p.grad.abs().max() > 0, f"{name}: zero gradient"


def test_adamw_learns_a_repeating_sequence():
    torch.manual_seed(0)
    model = NSAModel(tiny_cfg(n_layers=2))
    period = tokens(1, 12, seed=14)
    seq = period.repeat(2, S // 12 + 2)[:, : S + 1]
    x, y = seq[:, :-1], seq[:, 1:]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    losses = []
    for _ in range(25):
        opt.zero_grad(set_to_none=True)
        loss = model.loss(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] == pytest.approx(math.log(TINY["vocab_size"]), abs=0.5)  # starts near uniform
    assert losses[-1] < 0.5 * losses[0], losses
    assert losses[-1] < math.log(12), losses  # below what the frequencies of the 12 period tokens alone give


# ------------------------------------------------------------------------------------------ ModelConfig validation


@pytest.mark.parametrize("field,value,named", [
    ("vocab_size", 0, "vocab_size"),
    ("vocab_size", -5, "vocab_size"),
    ("vocab_size", 128.0, "vocab_size"),
    ("vocab_size", True, "vocab_size"),
    ("n_layers", 0, "n_layers"),
    ("dim", 0, "dim"),
    ("n_heads", 0, "n_heads"),
    ("n_kv_groups", 3, "n_kv_groups"),  # does not divide n_heads = 4
    ("d_k", 15, "d_k"),  # odd: RoPE rotates pairs
    ("d_v", 0, "d_v"),
    ("d", 5, "d=5"),  # does not divide l = 16
    ("l_sel", 36, "l_sel"),  # not a multiple of d = 8
    ("n_sel", 2, "n_sel"),
    ("w", 0, ".w "),
    ("phi", "conv", "phi"),
    ("gate", "relu", "gate"),
    ("rope_theta", 0, "rope_theta"),
    ("ffn_hidden", 0, "ffn_hidden"),
    ("norm_eps", 0.0, "norm_eps"),
    ("init_std", -0.02, "init_std"),
    ("tie_embeddings", 1, "tie_embeddings"),
    ("activation_checkpointing", "yes", "activation_checkpointing"),
])
def test_model_config_validation_names_the_field(field, value, named):
    with pytest.raises(ValueError) as err:
        tiny_cfg(**{field: value})
    assert named in str(err.value), str(err.value)
    assert repr(value) in str(err.value) or str(value) in str(err.value), str(err.value)


@pytest.mark.parametrize("dim,hidden", [(64, 192), (96, 256), (768, 2048)])  # 8/3*dim up to a multiple of 64
def test_default_ffn_hidden_is_llama_width(dim, hidden):
    with torch.device("meta"):
        model = NSAModel(tiny_cfg(dim=dim))
    mlp = model.blocks[0].mlp
    assert (mlp.w_gate.out_features, mlp.w_up.out_features, mlp.w_down.in_features) == (hidden,) * 3
    with torch.device("meta"):
        model = NSAModel(tiny_cfg(dim=dim, ffn_hidden=100))
    assert model.blocks[0].mlp.w_up.out_features == 100
