"""The synthetic token source: a seeded, learnable token process generated on the fly (see SyntheticSource)."""

from __future__ import annotations

import math

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
    """A 63-bit generator seed from integers (splitmix64 chain): nearby inputs give unrelated seeds."""
    h = 0
    for p in parts:
        h = _splitmix64(h ^ (p & _MASK64))
    return h & ((1 << 63) - 1)


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
    Samples: sample i of rank r is drawn from its own torch.Generator seeded from (seed, r, i), so ranks see
    different samples, any sample is reproducible, and `state_dict()` is just {"kind", "next_index"}.

    What loss it allows (nats per token, V = vocab_size):
      * Markov tokens: conditional entropy H_m = `markov_entropy` (exact) ~ 0.95*1.21 + h(0.05) + 0.05*ln V,
        i.e. 1.53 (V=64), 1.62 (V=256), 1.87 (V=32000), against ln V = 4.16, 5.55, 10.37.
      * copied tokens: ~0 once a model finds the source (attention/induction); the first token of each copy
        costs up to ln V. A bigram model (no attention) stays near H_m on all tokens.
      * floor ~ 0.77*H_m + ln V/124 = `entropy_floor` (an estimate): 1.22 (V=64), 1.30 (V=256), 1.53 (V=32000).
    Generation is vectorized per segment (cumulative sums in latent space, no per-token Python loop).
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
        self._cum = torch.tensor(self.PROBS, dtype=torch.float64).cumsum(0)

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
        v, n = self.vocab_size, self.seq_len + 1
        g = torch.Generator().manual_seed(_mix_seed(self.seed, self.sample_tag, self.rank, index))
        choice = torch.searchsorted(self._cum, torch.rand(n, generator=g, dtype=torch.float64), right=True)
        inc = self.offsets[choice.clamp_max(self.K - 1)]
        reset = torch.rand(n, generator=g) < self.NOISE
        reset[0] = True
        noise_tok = torch.randint(0, v, (n,), generator=g)
        n_seg = n // self.MARKOV_LEN[0] + 1
        m_lens = torch.randint(self.MARKOV_LEN[0], self.MARKOV_LEN[1] + 1, (n_seg,), generator=g).tolist()
        c_lens = torch.randint(self.COPY_LEN[0], self.COPY_LEN[1] + 1, (n_seg,), generator=g).tolist()
        src_u = torch.rand(n_seg, generator=g, dtype=torch.float64).tolist()

        z = torch.empty(n, dtype=torch.int64)
        pos, s = 0, 0
        while pos < n:
            end = min(pos + m_lens[s], n)
            z_prev = int(z[pos - 1]) if pos else 0
            z[pos:end] = self._markov(inc[pos:end], reset[pos:end], noise_tok[pos:end], z_prev)
            pos = end
            if pos >= n:
                break
            length = min(c_lens[s], n - pos, pos)
            src = int(src_u[s] * (pos - length + 1))
            z[pos:pos + length] = z[src:src + length]
            pos += length
            s += 1
        return self.perm[z]

    def _markov(self, inc: torch.Tensor, reset: torch.Tensor, noise_tok: torch.Tensor, z_prev: int) -> torch.Tensor:
        # z_i = u_r + sum_{r < j <= i} inc_j where r is the last reset <= i (u_r its uniform token),
        # or z_prev + sum_{j <= i} inc_j when there is none: one cumsum and one cummax.
        csum = inc.cumsum(0)
        idx = torch.arange(inc.numel())
        last = torch.where(reset, idx, torch.full_like(idx, -1)).cummax(0).values
        base = torch.where(last >= 0, (noise_tok - csum)[last.clamp_min(0)], torch.full_like(idx, z_prev))
        return (base + csum) % self.vocab_size

    # -- TokenSource
    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.next_index
        windows = torch.stack([self.sample(start + i) for i in range(self.batch_size)])
        self.next_index = start + self.batch_size
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()

    def state_dict(self) -> dict:
        return {"kind": "synthetic", "next_index": self.next_index}

    def load_state_dict(self, state: dict) -> None:
        self.next_index = check_state(state, "synthetic", ("next_index",))["next_index"]

    def close(self) -> None:
        pass
