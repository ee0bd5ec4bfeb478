"""nsa.training.synthetic: the vectorized sample builder against a token-by-token reading of the documented process
(the same random draws, in the same order, from the same per-sample generator), over many seeds, shapes and ranks."""

import itertools
import random

import numpy as np
import pytest
import torch

from nsa.training.config import DataConfig
from nsa.training.data import build_eval_source, build_source
from nsa.training.synthetic import TAG_EVAL, SyntheticSource


def _reference(src: SyntheticSource, index: int) -> tuple[list[int], int]:
    """Sample `index` of `src` built one token at a time, and how many of its tokens copy a copied token.

    Draws (in this order): choice uniforms (float64, n), reset uniforms (float32, n), noise tokens (n), then per
    segment slot (n // 32 + 1): Markov lengths, copy lengths, copy-source uniforms (float64). A Markov token is a
    noise token at a reset (and at token 0), else the previous token + the offset its choice uniform picks (mod V).
    Markov segment s is followed by copy s: min(copy length, tokens left, tokens so far) tokens repeated from
    int(u_s * (pos - length + 1)); the next Markov segment continues from the last copied token."""
    v, n = src.vocab_size, src.seq_len + 1
    g = np.random.Generator(np.random.PCG64(np.random.SeedSequence(
        [p % 2 ** 64 for p in (src.seed, src.sample_tag, src.rank, index)])))
    u_choice = g.random(n).tolist()
    u_reset = g.random(n, dtype=np.float32).tolist()
    noise = g.integers(0, v, n).tolist()
    n_seg = n // src.MARKOV_LEN[0] + 1
    m_lens = g.integers(src.MARKOV_LEN[0], src.MARKOV_LEN[1] + 1, n_seg).tolist()
    c_lens = g.integers(src.COPY_LEN[0], src.COPY_LEN[1] + 1, n_seg).tolist()
    src_u = g.random(n_seg).tolist()
    bounds = list(itertools.accumulate(src.PROBS))  # choice c while u >= the first c bounds
    offsets, perm = src.offsets.tolist(), src.perm.tolist()

    z, copied = [0] * n, [False] * n
    copies_of_copies = 0
    prev = pos = s = 0
    while pos < n:
        for i in range(pos, min(pos + m_lens[s], n)):
            if i == 0 or u_reset[i] < src.NOISE:
                prev = noise[i]
            else:
                c = min(sum(b <= u_choice[i] for b in bounds), src.K - 1)
                prev = (prev + offsets[c]) % v
            z[i] = prev
        pos = min(pos + m_lens[s], n)
        if pos == n:
            break
        length = min(c_lens[s], n - pos, pos)
        start = int(src_u[s] * (pos - length + 1))
        for k in range(length):
            z[pos + k], copied[pos + k] = z[start + k], True
            copies_of_copies += copied[start + k]
        pos += length
        prev = z[pos - 1]
        s += 1
    return [perm[t] for t in z], copies_of_copies


def _cases():
    rng = random.Random(20250)
    lens = [1, 2, 5, 31, 32, 33, 40, 47, 48, 80, 159, 160, 161, 200, 333, 700, 1500]
    vocabs = [16, 17, 64, 255, 256, 1000, 32000, 50257]
    cases = [(L, rng.choice(vocabs), rng.randrange(-3, 2 ** 62), rng.randrange(8), rng.randrange(10 ** 7))
             for L in lens for _ in range(3)]
    return cases + [(8191, 50257, 7, 3, 12), (4096, 16, 0, 0, 0)]


def test_the_vectorized_builder_gives_the_token_by_token_samples():
    copy_chains = 0
    for seq_len, vocab, seed, rank, index in _cases():
        src = SyntheticSource(vocab_size=vocab, seq_len=seq_len, batch_size=1, rank=rank, world_size=8, seed=seed)
        got = src.sample(index)
        assert got.dtype == torch.int64 and got.shape == (seq_len + 1,)
        expected, chains = _reference(src, index)
        assert got.tolist() == expected, (seq_len, vocab, seed, rank, index)
        copy_chains += chains
    assert copy_chains > 0  # copies of copied tokens (which must be followed back to a Markov token) occurred


@pytest.mark.parametrize("copy_len", [(0, 0), (1, 1), (48, 48)])
def test_the_builder_follows_other_segment_lengths(copy_len):
    src = SyntheticSource(vocab_size=300, seq_len=1000, batch_size=1, rank=1, world_size=2, seed=9)
    src.COPY_LEN = copy_len
    for index in range(3):
        assert src.sample(index).tolist() == _reference(src, index)[0]


def test_batches_ranks_and_the_eval_stream_are_the_reference_samples():
    kw = dict(vocab_size=1000, seq_len=96, batch_size=3, world_size=3, seed=4)
    for rank in range(3):
        src = build_source(DataConfig(), rank=rank, **kw)
        src.load_state_dict({"kind": "synthetic", "next_index": 5})
        inputs, targets = src.next_batch()
        rows = [_reference(src, i)[0] for i in range(5, 8)]
        assert inputs.tolist() == [r[:-1] for r in rows] and targets.tolist() == [r[1:] for r in rows]
    ev = build_eval_source(DataConfig(), rank=2, **kw)
    assert ev.source.sample_tag == TAG_EVAL
    assert ev.next_batch()[0].tolist() == [_reference(ev.source, i)[0][:-1] for i in range(3)]


def test_samples_do_not_depend_on_torch_s_default_dtype():
    src = SyntheticSource(vocab_size=500, seq_len=300, batch_size=1, rank=0, world_size=1, seed=3)
    expected = [src.sample(i) for i in range(4)]
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        got = [src.sample(i) for i in range(4)]
    finally:
        torch.set_default_dtype(before)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
