"""NSAModel inference (nsa/model.py prefill, decode_step, generate) for NSA and the dense twin, against full
recomputation: every expected value comes from the training forward over the whole sequence so far, run from
scratch with no cache (model(ids)[:, -1]), or from a decode that starts from an empty cache.

Shapes: compression blocks of l=8 every d=4 tokens, selection blocks of l_sel=8 of which n_sel=4 are kept (so from
t=32 on the choice depends on importance), a window of w=16; sequences of 34-40 tokens cross all of those.
"""

from __future__ import annotations

import contextlib
import json
import re

import pytest
import torch

from benchmark_scripts import load
from nsa.attention import layer as nsa_layer
from nsa.attention.cache import DenseCache, NSACache
from nsa.attention.geometry import decode_reads
from nsa.model import ModelConfig, NSAModel
from nsa_test_utils import assert_nontrivial, randomize_params

TINY = dict(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_groups=2, d_k=8, d_v=8,
            l=8, d=4, l_sel=8, n_sel=4, w=16)
TOL = {torch.float64: dict(atol=1e-10, rtol=1e-10), torch.float32: dict(atol=1e-4, rtol=1e-4)}


def model_of(attention: str = "nsa", dtype=torch.float64, seed: int = 0, **overrides) -> NSAModel:
    torch.manual_seed(seed)
    model = NSAModel(ModelConfig.from_flat({**TINY, "attention": attention, **overrides}))
    randomize_params(model, seed=seed + 1000)  # init-independent, well-scaled weights
    return model.to(dtype)


def ids_of(b: int, s: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, TINY["vocab_size"], (b, s), generator=torch.Generator().manual_seed(seed))


def last_logits(model: NSAModel, ids: torch.Tensor) -> torch.Tensor:
    """The reference: the training forward over the whole sequence, from scratch, at its last position."""
    with torch.no_grad():
        return model(ids)[:, -1]


def greedy_reference(model: NSAModel, ids: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        ids = torch.cat([ids, last_logits(model, ids).argmax(-1, keepdim=True)], dim=1)
    return ids


MODELS = [
    pytest.param("nsa", torch.float64, {}, id="nsa-f64"),
    pytest.param("nsa", torch.float32, dict(phi="avg", gate="softmax", n_kv_groups=1), id="nsa-f32-avg-softmax-G1"),
    pytest.param("dense", torch.float64, {}, id="dense-f64"),
    pytest.param("dense", torch.float32, {}, id="dense-f32"),
]


@pytest.mark.parametrize("attention,dtype,over", MODELS)
def test_each_decode_step_equals_full_recomputation(attention, dtype, over):
    """Prefill 3 tokens, then decode to 38: every step's logits are the whole sequence's forward, last position,
    across the l, d and l_sel block boundaries, past n_sel * l_sel and past the window."""
    model = model_of(attention, dtype, **over)
    ids = ids_of(2, 38)
    logits, caches = model.prefill(ids[:, :3])
    assert logits.shape == (2, TINY["vocab_size"]) and logits.dtype == dtype
    torch.testing.assert_close(logits, last_logits(model, ids[:, :3]), **TOL[dtype])
    for k in range(3, 38):
        step = model.decode_step(ids[:, k: k + 1], caches)
        ref = last_logits(model, ids[:, : k + 1])
        assert_nontrivial(ref, f"logits at {k}")
        torch.testing.assert_close(step, ref, **TOL[dtype], msg=lambda m: f"decode step at position {k}: {m}")
    assert all(c.length == 38 for c in caches)
    if attention == "nsa":  # the window and the raw compression tokens are bounded, not the whole history
        assert all(c.k_win.data.shape[2] <= 2 * (TINY["w"] + 1) and c.k_raw.data.shape[2] <= 2 * (TINY["l"] + 1)
                   for c in caches)
        assert [len(c.reads) for c in caches] == [35, 35]  # one count per decode step; the prefill reads none


# Geometries for the selected branch of a decode step, each with B = 3 and every step from position 1 on:
SELECTED_CASES = [
    # one group; n_sel = 3 keeps only the forced blocks (0, the previous, the current) once 4 blocks exist; a
    # window of 4 tokens, so the selected ranges reach well outside it
    pytest.param(dict(n_kv_groups=1, l=8, d=4, l_sel=8, n_sel=3, w=4), 44, id="G1-forced-only-w4"),
    # two groups; selection blocks of 16 (the current block is partial for 15 of every 16 steps); a window of 40
    # that holds the whole sequence until t = 40, then cuts through the selected ranges (block 0 always outside)
    pytest.param(dict(n_kv_groups=2, l=8, d=4, l_sel=16, n_sel=4, w=40), 72, id="G2-lsel16-w40"),
    # one head per group; compression blocks longer than selection blocks; avg compression, softmax gates
    pytest.param(dict(n_kv_groups=4, l=16, d=8, l_sel=8, n_sel=5, w=16, phi="avg", gate="softmax"), 52,
                 id="G4-l16-lsel8-avg-softmax"),
]


@pytest.mark.parametrize("over,s", SELECTED_CASES)
def test_decode_steps_equal_the_full_forward_across_groups_and_selection_geometries(over, s):
    """Prefill one token, decode the rest: every step's logits are the forward over the sequence so far (float64,
    1e-10), for 1, 2 and 4 KV groups, 3 sequences, selected ranges inside, across and outside the window and
    ending at the sequence's last token; each step's tokens read are decode_reads' count."""
    model = model_of("nsa", torch.float64, **over)
    cfg = model.cfg.nsa
    assert s > cfg.n_sel * cfg.l_sel  # past the point where the choice depends on importance
    ids = ids_of(3, s, seed=9)
    with torch.no_grad():
        full = model(ids)  # causal: position k is the forward over ids[:, :k + 1]
    logits, caches = model.prefill(ids[:, :1])
    steps = [logits] + [model.decode_step(ids[:, k: k + 1], caches) for k in range(1, s)]
    assert_nontrivial(full, "logits")
    for k, step in enumerate(steps):
        torch.testing.assert_close(step, full[:, k], **TOL[torch.float64],
                                   msg=lambda m: f"decode step at position {k}: {m}")
    # and from scratch at a partial current block, at a block's last token and at the end
    for k in (cfg.n_sel * cfg.l_sel + 2, (s // cfg.l_sel) * cfg.l_sel - 1, s - 1):
        torch.testing.assert_close(steps[k], last_logits(model, ids[:, : k + 1]), **TOL[torch.float64])
    expected = [decode_reads(k + 1, cfg) for k in range(1, s)]
    assert all(c.reads == expected for c in caches), "tokens read per decode step differ from decode_reads"


@contextlib.contextmanager
def _no_host_reads():
    """Every way Python code reads a tensor's value on the host (a device synchronisation on CUDA) raises."""
    names = ("tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__")
    saved = {name: getattr(torch.Tensor, name) for name in names}

    def refuse(name):
        def read(self, *args, **kwargs):
            raise AssertionError(f"a decode step read a tensor on the host: Tensor.{name}")
        return read

    try:
        for name in names:
            setattr(torch.Tensor, name, refuse(name))
        yield
    finally:
        for name, method in saved.items():
            setattr(torch.Tensor, name, method)


def test_decode_step_reads_no_tensor_value_on_the_host(monkeypatch):
    """An NSA layer's decode step (its default selected branch) never reads a tensor's value on the host, so it
    needs no CUDA synchronisation; the per-token oracle's loop (DECODE_SELECTED "loop") does, which the check
    catches."""
    attn = model_of("nsa", torch.float64).blocks[0].attn
    x = torch.randn(2, 40, TINY["dim"], dtype=torch.float64, generator=torch.Generator().manual_seed(10))
    cache = attn.new_cache(2)
    attn.prefill(x[:, :3], cache)
    with _no_host_reads():
        for k in range(3, 40):  # past n_sel * l_sel = 32
            attn.decode_step(x[:, k: k + 1], cache)
    monkeypatch.setattr(nsa_layer, "DECODE_SELECTED", "loop")
    with pytest.raises(AssertionError, match="Tensor.tolist"), _no_host_reads():
        attn.decode_step(x[:, :1], attn.new_cache(2))
    monkeypatch.setattr(nsa_layer, "DECODE_SELECTED", "vectorised")
    with pytest.raises(ValueError, match=re.escape("DECODE_SELECTED must be one of auto | gather | loop, "
                                                   "got 'vectorised'")):
        attn.decode_step(x[:, :1], attn.new_cache(2))


def _cache_tensors(cache, cfg) -> dict[str, torch.Tensor]:
    """What a decode step reads from a layer's cache."""
    if isinstance(cache, DenseCache):
        return {"k": cache.k.last(), "v": cache.v.last()}
    out = {name: getattr(cache, name).last() for name in ("k_sel", "v_sel", "k_cmp", "v_cmp")}
    out.update({name: getattr(cache, name).last(cfg.w) for name in ("k_win", "v_win")})
    out.update({name: getattr(cache, name).last(cfg.l) for name in ("k_raw", "v_raw")})
    return out


@pytest.mark.parametrize("attention,over", [("nsa", {}), ("nsa", dict(prefill="sequential")), ("dense", {})],
                         ids=["nsa-batched", "nsa-sequential", "dense"])
def test_prefill_then_decode_equals_decode_from_an_empty_cache(attention, over):
    """A prompt of P tokens prefilled, then decoded on, gives the logits and the cache contents of a decode that
    starts from empty caches, for P on both sides of block boundaries (l=8, d=4, l_sel=8) and past n_sel*l_sel."""
    model = model_of(attention, **over)
    ids = ids_of(2, 40, seed=1)
    empty = model.new_caches(2)
    token_by_token = [model.decode_step(ids[:, k: k + 1], empty) for k in range(40)]
    for p in (1, 8, 9, 17, 34):
        logits, caches = model.prefill(ids[:, :p])
        torch.testing.assert_close(logits, token_by_token[p - 1], **TOL[torch.float64])
        for k in range(p, min(p + 4, 40)):
            torch.testing.assert_close(model.decode_step(ids[:, k: k + 1], caches), token_by_token[k],
                                       **TOL[torch.float64], msg=lambda m: f"prompt {p}, position {k}: {m}")
    # the caches after the whole sequence hold the same keys and values, however they were filled
    _, caches = model.prefill(ids)
    cfg = model.cfg.nsa
    for layer, (a, b) in enumerate(zip(caches, empty)):
        assert a.length == b.length == 40
        ta, tb = _cache_tensors(a, cfg), _cache_tensors(b, cfg)
        for name in ta:
            torch.testing.assert_close(ta[name], tb[name], **TOL[torch.float64],
                                       msg=lambda m: f"layer {layer} {name}: {m}")


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_greedy_generate_equals_argmax_of_full_recomputation(attention):
    model = model_of(attention)
    prompt = ids_of(2, 10, seed=2)
    out = model.generate(prompt, max_new_tokens=26)
    assert out.shape == (2, 36) and out.dtype == prompt.dtype
    assert torch.equal(out[:, :10], prompt)
    assert torch.equal(out, greedy_reference(model, prompt, 26))
    assert len(set(out[:, 10:].flatten().tolist())) > 3, "a degenerate generation would make the check vacuous"
    # int32 ids give the same tokens, as int32
    out32 = model.generate(prompt.int(), max_new_tokens=26)
    assert out32.dtype == torch.int32 and torch.equal(out32.long(), out)
    assert torch.equal(model.generate(prompt, max_new_tokens=0), prompt)


def test_sampled_generate_is_reproducible_and_samples_softmax_over_temperature():
    model = model_of("nsa")
    prompt = ids_of(2, 18, seed=3)
    gen = lambda seed: torch.Generator().manual_seed(seed)  # noqa: E731
    a = model.generate(prompt, 16, temperature=0.8, generator=gen(7))
    b = model.generate(prompt, 16, temperature=0.8, generator=gen(7))
    assert torch.equal(a, b)
    assert not torch.equal(a, model.generate(prompt, 16, temperature=0.8, generator=gen(8)))
    assert not torch.equal(a, model.generate(prompt, 16))  # not greedy
    # independent sampler: full recomputation, softmax(logits / T), one multinomial draw per step from the same stream
    ref, g = prompt, gen(7)
    for _ in range(16):
        probs = torch.softmax(last_logits(model, ref) / 0.8, dim=-1)
        ref = torch.cat([ref, torch.multinomial(probs, 1, generator=g)], dim=1)
    assert torch.equal(a, ref)


@pytest.mark.parametrize("dtype,temperature", [(torch.float32, 1e-40), (torch.float64, 1e-320)])
def test_sampling_at_a_vanishing_temperature_is_greedy_not_an_error(dtype, temperature):
    """Any finite temperature > 0 is accepted; as it goes to 0, softmax(logits / T) goes to the argmax. Below the
    dtype's range logits / T overflows to inf (softmax NaN, multinomial refuses it); the limit is still greedy."""
    model = model_of("nsa", dtype)
    prompt = ids_of(2, 9, seed=8)
    out = model.generate(prompt, 6, temperature=temperature, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, model.generate(prompt, 6))


def test_eos_stops_each_row_independently_and_pads_with_eos():
    model = model_of("nsa")
    prompt = ids_of(3, 5, seed=4)
    free = model.generate(prompt, 16)[:, 5:]  # greedy with no eos: the continuation each row would take

    def stops(eos):  # index of each row's first eos in its free continuation (16: none)
        return [row.index(eos) if eos in row else 16 for row in free.tolist()]

    # an eos that stops the rows at different steps, one row possibly never
    eos = next(t for t in free[0].tolist() if len(set(stops(t))) > 1)
    out = model.generate(prompt, 16, eos_id=eos)
    at = stops(eos)
    assert out.shape[1] == 5 + min(16, max(at) + 1)
    for r in range(3):
        n = min(at[r] + 1, 16)
        assert torch.equal(out[r, 5: 5 + n], free[r, :n]), f"row {r} differs before its eos"
        assert bool((out[r, 5 + n:] == eos).all()), f"row {r} is not padded with eos after it stopped"
    # a single row stops at its eos: the output ends there
    one = model.generate(prompt[1:2], 16, eos_id=free[1, 2].item())
    first = free[1].tolist().index(free[1, 2].item())
    assert torch.equal(one[0, 5:], free[1, : first + 1])


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_batch_rows_are_independent(attention):
    model = model_of(attention)
    prompt = ids_of(3, 12, seed=5)
    batch = model.generate(prompt, 22)
    rows = torch.cat([model.generate(prompt[r: r + 1], 22) for r in range(3)])
    assert torch.equal(batch, rows)
    logits, caches = model.prefill(prompt)
    for r in range(3):
        single, _ = model.prefill(prompt[r: r + 1])
        torch.testing.assert_close(logits[r: r + 1], single, **TOL[torch.float64])


def test_inference_keeps_no_gradients_and_leaves_training_unchanged():
    model = model_of("nsa", torch.float32)
    assert all(p.requires_grad for p in model.parameters()) and model.training
    ids = ids_of(2, 20, seed=6)
    before = model(ids).detach()
    with torch.enable_grad():
        logits, caches = model.prefill(ids[:, :10])
        step = model.decode_step(ids[:, 10:11], caches)
        out = model.generate(ids[:, :10], 5, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert not logits.requires_grad and not step.requires_grad and not out.requires_grad
    assert not any(t.requires_grad for c in caches for t in _cache_tensors(c, model.cfg.nsa).values())
    assert all(p.grad is None for p in model.parameters()) and model.training
    after = model(ids)
    torch.testing.assert_close(after, before, atol=0, rtol=0)
    after.sum().backward()  # the training forward still builds its graph
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_bad_inputs_are_clear_errors():
    model = model_of("nsa", torch.float32)
    dense = model_of("dense", torch.float32)
    ids = ids_of(2, 6)
    cases = [
        (lambda: model.generate(ids.float(), 3), r"shape \[B>=1, S>=1\] \(int64 or int32\)"),
        (lambda: model.generate(ids[0], 3), r"shape \[B>=1, S>=1\]"),
        (lambda: model.generate(ids[None], 3), r"shape \[B>=1, S>=1\]"),
        (lambda: model.generate(ids[:, :0], 3), r"S>=1"),
        (lambda: model.generate(ids + 64, 3), r"\[0, 64\) \(vocab_size\)"),
        (lambda: model.generate(ids - 7, 3), r"\[0, 64\)"),
        (lambda: model.generate(ids, -1), "max_new_tokens must be an integer >= 0, got -1"),
        (lambda: model.generate(ids, 2.0), "max_new_tokens"),
        (lambda: model.generate(ids, True), "max_new_tokens"),
        (lambda: model.generate(ids, 3, temperature=-0.5), "temperature"),
        (lambda: model.generate(ids, 3, temperature=float("nan")), "temperature"),
        (lambda: model.generate(ids, 3, temperature=1.0, generator=7), "torch.Generator"),
        (lambda: model.generate(ids, 3, eos_id=64), "eos_id"),
        (lambda: model.prefill(ids.double()), r"int64 or int32"),
        (lambda: model.decode_step(ids[:, :2], model.new_caches(2)), r"shape \[B>=1, 1\]"),
        (lambda: model.decode_step(ids[:1, :1], model.new_caches(2)), "1 sequences, the caches 2"),
        (lambda: model.decode_step(ids[:, :1], model.new_caches(2)[:1]), "2 NSACaches"),
        (lambda: model.decode_step(ids[:, :1], dense.new_caches(2)), "2 NSACaches"),
        (lambda: dense.decode_step(ids[:, :1], model.new_caches(2)), "2 DenseCaches"),
        (lambda: model.new_caches(0), "batch size"),
        (lambda: dense.new_caches(0), "batch size"),
        (lambda: model.blocks[0].attn.prefill(torch.zeros(2, 3, 32), model.prefill(ids)[1][0]), "empty cache"),
        (lambda: dense.blocks[0].attn.prefill(torch.zeros(2, 3, 32), DenseCache(batch_size=1)), "empty cache"),
    ]
    for call, match in cases:
        with pytest.raises(ValueError, match=match):
            call()
    # RoPE is the model's only position information: a prompt has no maximum length (here 3x the training window)
    assert model.generate(ids_of(1, 3 * TINY["w"]), 1).shape == (1, 3 * TINY["w"] + 1)
    assert isinstance(model.new_caches(1)[0], NSACache)


def test_bench_decode_runs():
    bench = load("bench_decode")
    assert bench.main(["--dry-run"]) == 0
    assert bench.main(["--lengths", "16", "--new-tokens", "2", "--repeats", "1", "--warmup", "0",
                       "--attention", "nsa,dense"]) == 0


def test_bench_decode_selected_ab_runs_both_forms_and_restores_the_default(tmp_path, capsys):
    bench = load("bench_decode")
    out = tmp_path / "ab.json"
    assert bench.main(["--lengths", "40", "--new-tokens", "3", "--repeats", "2", "--warmup", "0", "--batch", "2",
                       "--attention", "nsa", "--selected-ab", "--json", str(out)]) == 0
    assert nsa_layer.DECODE_SELECTED == "gather"
    written = json.loads(out.read_text())
    (row,) = written["rows"]
    # the file says what ran: every setting, and the command that runs it again
    assert (written["lengths"], written["warmup"], written["seed"], written["attention"]) == ([40], 0, 0, ["nsa"])
    assert written["command"] == ("python benchmarks/bench_decode.py --lengths 40 --new-tokens 3 --repeats 2 "
                                  f"--warmup 0 --batch 2 --attention nsa --selected-ab --json {out}")
    for key in ("loop_tok_s", "gather_tok_s", "speedup"):
        low, median, high = row[key]
        assert 0 < low <= median <= high
    assert row["max_logit_diff_loop_gather"] <= 1e-3 * row["logit_scale"]
    assert "loop (A) vs gather (B)" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:  # the A/B is NSA's alone
        bench.main(["--attention", "nsa,dense", "--selected-ab", "--dry-run"])
    assert exc.value.code == 2


@pytest.mark.parametrize("attention", ["nsa", "dense"])
def test_caches_of_other_tokens_are_not_equal(attention):
    """A layer's cache is its keys and values: two prefills of different tokens (same batch, length and counts)
    are different caches, where the dataclass's field comparison (its counts only) called them equal."""
    model = model_of(attention)
    with torch.no_grad():
        _, one = model.prefill(ids_of(1, 12, seed=1))
        _, two = model.prefill(ids_of(1, 12, seed=2))
    assert one[0] != two[0] and one[0] == one[0]
