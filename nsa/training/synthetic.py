"""The synthetic token source: a seeded, learnable token process generated on the fly (see SyntheticSource)."""

from __future__ import annotations

import math

import numpy as np
import torch

from nsa.training.config import DataError
from nsa.training.source import check_state

# ------------------------------------------------------------------------------------------ synthetic

_MASK64 = (1 << 64) - 1
_TAG_PROCESS = 0x70726F63  # "proc"
_TAG_SAMPLE = 0x73616D70  # "samp"
TAG_EVAL = 0x6576616C  # "eval"


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _mix_seed(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 chain): nearby inputs give unrelated seeds. The process's torch
    generator keeps only its low 32 bits (two run seeds share a process with probability 2**-32); each sample's
    generator (sample_generator) takes every bit of its parts."""
    h = 0
    for p in parts:
        h = _splitmix64(h ^ (p & _MASK64))
    return h & ((1 << 63) - 1)


def sample_generator(*parts: int) -> np.random.Generator:
    """The generator of one sample (numpy's PCG64, 128 bits of state) seeded from every bit of `parts` (seed, tag,
    rank, index): a torch CPU generator keeps only the low 32 bits of its seed, so distinct samples would repeat one
    another with probability 2**-32 a pair (thousands of repeats in a run of millions of samples)."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([p & _MASK64 for p in parts])))


class SyntheticSource:
    """A seeded, learnable token process: a sparse Markov chain with verbatim copies of earlier spans.

    The process (the same on every rank; depends only on `seed` and `vocab_size` V):
      * a random permutation `perm` of the V ids and K = 4 distinct random offsets o_1..o_4 in [1, V).
        In latent space a token z is followed by z + o_c (mod V) with probability PROBS[c] = .50/.25/.15/.10,
        except that with probability NOISE = 0.05 the next token is uniform over all V ids. The emitted id
        is perm[z], so in id space every token has 4 likely successors from an arbitrary-looking sparse table.
      * each sequence alternates Markov segments (length uniform in [32, 160]) with copy segments
        (length uniform in [8, 48]) that repeat, verbatim, a span starting at a uniformly random earlier
        position; the chain then continues from the last copied token. About 23% of tokens are copies
        (windows of at most 32 tokens, seq_len + 1 <= 32, are a pure Markov chain: the first segment is at least
        32 long).
    Samples: sample i of rank r is drawn from its own generator (sample_generator) seeded from (seed, r, i), so ranks
    see different samples, any sample is reproducible, and `state_dict()` is just {"kind", "next_index"}.

    What loss it allows (nats per token, V = vocab_size):
      * Markov tokens: conditional entropy H_m = `markov_entropy` (exact) ~ 0.95*1.21 + h(0.05) + 0.05*ln V,
        i.e. 1.53 (V=64), 1.62 (V=256), 1.87 (V=32000), against ln V = 4.16, 5.55, 10.37.
      * copied tokens: ~0 once a model finds the source (attention/induction); the first token of each copy
        costs up to ln V. A bigram model (no attention) stays near H_m on all tokens.
      * floor ~ 0.77*H_m + ln V/124 = `entropy_floor` (an estimate): 1.22 (V=64), 1.30 (V=256), 1.53 (V=32000).
    Generation is vectorized over the whole sample (see `_tokens`): Python steps once per segment, not per token.
    """

    K = 4
    PROBS = (0.50, 0.25, 0.15, 0.10)
    NOISE = 0.05
    MARKOV_LEN = (32, 160)
    COPY_LEN = (8, 48)
    MIN_VOCAB = 16

    def __init__(self, *, vocab_size: int, seq_len: int, batch_size: int, rank: int, world_size: int,
                 seed: int) -> None:
        if vocab_size < self.MIN_VOCAB:
            raise DataError(f"data: dataset 'synthetic' needs vocab_size >= {self.MIN_VOCAB}, got {vocab_size}")
        self.vocab_size, self.seq_len, self.batch_size = vocab_size, seq_len, batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.next_index = 0
        self.sample_tag = _TAG_SAMPLE  # build_eval_source switches to a disjoint stream of samples
        g = torch.Generator().manual_seed(_mix_seed(seed, _TAG_PROCESS, vocab_size))
        self.perm = torch.randperm(vocab_size, generator=g)
        self.offsets = torch.randperm(vocab_size - 1, generator=g)[: self.K] + 1  # distinct, nonzero
        self._bounds = torch.tensor(self.PROBS, dtype=torch.float64).cumsum(0).tolist()[: self.K - 1]
        self._offsets_np, self._perm_np = self.offsets.numpy(), self.perm.numpy()

    # -- what the process allows
    @property
    def markov_entropy(self) -> float:
        """Exact conditional entropy (nats) of a Markov token given the previous one."""
        v, eps = self.vocab_size, self.NOISE
        q = [(1 - eps) * p + eps / v for p in self.PROBS]
        return -sum(x * math.log(x) for x in q) - (v - self.K) * (eps / v) * math.log(eps / v)

    @property
    def entropy_floor(self) -> float:
        """Estimated best achievable loss (nats/token): Markov tokens at `markov_entropy`, copies ~free."""
        markov = sum(self.MARKOV_LEN) / 2
        copy = sum(self.COPY_LEN) / 2
        return (markov * self.markov_entropy + math.log(self.vocab_size)) / (markov + copy)

    # -- one sample
    def sample(self, index: int) -> torch.Tensor:
        """Sample `index` of this rank: int64 [seq_len + 1]."""
        return torch.from_numpy(self._sample(index))

    def _sample(self, index: int) -> np.ndarray:
        # numpy past the draws: single-threaded small ops, which a busy machine's other processes cannot stall the way
        # they stall torch's intra-op thread pool
        v, n = self.vocab_size, self.seq_len + 1
        g = sample_generator(self.seed, self.sample_tag, self.rank, index)
        u = g.random(n)
        choice = np.zeros(n, dtype=np.int64)  # the offset u picks: how many of the first K - 1 bounds are <= u
        for bound in self._bounds:
            choice += u >= bound
        inc = self._offsets_np[choice]
        # float32 draws whatever torch's default dtype is (the samples must not depend on it)
        reset = g.random(n, dtype=np.float32) < np.float32(self.NOISE)
        reset[0] = True
        noise_tok = g.integers(0, v, n)
        n_seg = n // self.MARKOV_LEN[0] + 1
        m_lens = g.integers(self.MARKOV_LEN[0], self.MARKOV_LEN[1] + 1, n_seg).tolist()
        c_lens = g.integers(self.COPY_LEN[0], self.COPY_LEN[1] + 1, n_seg).tolist()
        src_u = g.random(n_seg).tolist()
        markov_starts, copies = _layout(n, m_lens, c_lens, src_u)
        return self._perm_np[_tokens(v, inc, reset, noise_tok, markov_starts, copies)]

    # -- TokenSource
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.next_index
        windows = np.stack([self._sample(start + i) for i in range(self.batch_size)])
        self.next_index = start + self.batch_size
        return (torch.from_numpy(np.ascontiguousarray(windows[:, :-1])),
                torch.from_numpy(np.ascontiguousarray(windows[:, 1:])))

    def state_dict(self) -> dict:
        return {"kind": "synthetic", "next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        self.next_index = check_state(state, "synthetic", ("next_index",))["next_index"]

    def close(self) -> None:
        pass


def _layout(n: int, m_lens: list[int], c_lens: list[int], src_u: list[float]) -> tuple[list[int], list[tuple]]:
    """Where the segments of an n-token sample lie: the start of every Markov segment, and every copy segment as
    (start, length, source start). Markov segment s has length m_lens[s] and is followed by copy s, of length
    min(c_lens[s], tokens left, tokens before it), whose source starts at int(src_u[s] * (start - length + 1)),
    so it lies wholly before the copy; the last segment is cut at n."""
    markov_starts, copies = [], []
    pos = s = 0
    while pos < n:
        markov_starts.append(pos)
        pos += m_lens[s]
        if pos >= n:
            break
        length = min(c_lens[s], n - pos, pos)
        copies.append((pos, length, int(src_u[s] * (pos - length + 1))))
        pos += length
        s += 1
    return markov_starts, copies


def _tokens(v: int, inc: np.ndarray, reset: np.ndarray, noise_tok: np.ndarray, markov_starts: list[int],
            copies: list[tuple]) -> np.ndarray:
    """The latent tokens z [n] of one sample, vectorized over all tokens.

    In a Markov segment z_i = z_{i-1} + inc_i (mod v), except z_i = noise_tok_i where reset_i; at the segment's
    first token z_{i-1} is the token before it (the last copied one). In a copy segment z_i = z_src+(i-start).
    With anchors at resets and at segment starts, a Markov token is (value at its last anchor a) + inc_{a+1..i}:
    one cumulative sum. The only sequential part is one integer per segment: the token before each segment
    (the previous copy's last token, followed back through copies to the Markov token it repeats)."""
    n = inc.shape[0]
    idx = np.arange(n)
    # where each token's value comes from: itself (Markov), or the position it copies, followed back to a Markov one
    origin = idx.copy()
    if copies:
        c_start, c_len, c_src = (np.array(col, dtype=np.int64) for col in zip(*copies))
        seg = np.repeat(np.arange(len(copies)), c_len)
        at = idx[: seg.size] - np.repeat(np.cumsum(c_len) - c_len, c_len)  # offset within its copy
        copied, source = c_start[seg] + at, c_src[seg] + at
        origin[copied] = source
        while True:  # sources lie strictly earlier: pointer doubling ends in log2(chain length) rounds
            nxt = origin[source]
            if np.array_equal(nxt, source):
                break
            source = nxt
            origin[copied] = source
    starts = np.array(markov_starts, dtype=np.int64)
    seg_start = np.zeros(n, dtype=bool)
    seg_start[starts] = True
    markov_seg = np.cumsum(seg_start) - 1  # Markov segment of each Markov token
    anchor = np.maximum.accumulate(np.where(reset | seg_start, idx, 0))
    csum = np.cumsum(inc)
    head = np.where(reset, noise_tok, inc)  # an anchor's value, less the token before it where it is no reset
    rel = head[anchor] + csum - csum[anchor]
    follows = ~reset[anchor]  # the value adds the token before the segment
    # the token before Markov segment s >= 1, in segment order (each depends only on earlier segments)
    before = origin[starts[1:] - 1]
    prev = [0] * len(markov_starts)
    for s, (r, f, t) in enumerate(zip(rel[before].tolist(), follows[before].tolist(),
                                      markov_seg[before].tolist()), 1):
        prev[s] = (r + prev[t]) % v if f else r % v
    z = (rel + follows * np.array(prev, dtype=np.int64)[markov_seg]) % v
    return z[origin]
