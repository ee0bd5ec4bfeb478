"""Data streams of several ranks against one rank: a text corpus's ranks, step by step and micro-batch by
micro-batch, read together exactly the windows one rank with the global batch reads (nsa.training.corpus: window w
is rank w % world_size's), across epochs when the ranks' epoch drops no window; synthetic samples of distinct
(rank, index) are distinct, training and evaluation samples too."""

import random

import pytest
import torch

from nsa.training.config import DataConfig
from nsa.training.data import build_eval_source, build_source


def _windows(batch) -> list[tuple[int, ...]]:
    inputs, targets = batch
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    return [tuple(row) for row in torch.cat([inputs, targets[:, -1:]], 1).tolist()]


@pytest.mark.parametrize("world, batch, accum", [(2, 5, 1), (2, 2, 2), (3, 3, 1), (3, 1, 3)])
def test_text_ranks_together_read_the_global_batch_of_one_rank_every_step(tmp_path, world, batch, accum):
    # 12 * 5 + 1 tokens of aperiodic letters: 12 windows of seq_len 5, a multiple of the world size, so no rank drops
    # a window and the two readings stay equal across epochs; a rank's 6 or 4 windows an epoch end inside a batch
    # or between the micro-batches of a step
    letters = random.Random(3).choices("abcdefghijklmnopqrstuvwxyz", k=12 * 5)
    (tmp_path / "c.txt").write_text("".join(letters))  # + the document separator: 61 tokens
    cfg = DataConfig(dataset="text", path=str(tmp_path))
    kw = dict(vocab_size=256, seq_len=5, seed=0)
    stream = [ord(c) for c in letters] + [0]
    by_hand = [tuple(stream[w * 5:w * 5 + 6]) for w in range(12)]
    ranks = [build_source(cfg, batch_size=batch, rank=r, world_size=world, **kw) for r in range(world)]
    one = build_source(cfg, batch_size=world * batch * accum, rank=0, world_size=1, **kw)
    g = world * batch * accum
    for step in range(7):  # 7 steps of G >= 8 windows: past four epochs of 12
        mine = {r: [w for _ in range(accum) for w in _windows(ranks[r].next_batch())] for r in range(world)}
        # rank r's micro-batches, in order, hold its windows r, r + world, ... of the step
        for r in range(world):
            first = step * batch * accum
            assert mine[r] == [by_hand[(r + (first + k) * world) % 12] for k in range(batch * accum)], (step, r)
        together = sorted(w for r in range(world) for w in mine[r])
        assert together == sorted(_windows(one.next_batch()))
        assert together == sorted(by_hand[(step * g + k) % 12] for k in range(g))  # no window twice, none left out


def test_synthetic_samples_of_distinct_ranks_and_indices_differ():
    # a torch CPU generator keeps only the low 32 bits of its seed, so distinct (seed, rank, index) gave the same
    # sample with probability 2**-32 a pair. Seed 0, 8 ranks: _mix_seed of rank 4 sample 122,871 and rank 6 sample 122,664 share their low 32 bits (found
    # among 8 x 2**21 samples, 32,672 such pairs); with 256 samples per rank and step both are in step 480. Rank 2's
    # evaluation sample 2,730 and rank 7's training sample 25,209 share them too.
    kw = dict(vocab_size=256, seq_len=31, batch_size=1, world_size=8, seed=0)

    def sample(rank, index, source=None):
        source = source or build_source(DataConfig(), rank=rank, **kw)
        source.load_state_dict({"kind": "synthetic", "next_index": index})
        return source.next_batch()[0]

    eval_source = build_eval_source(DataConfig(), rank=2, **kw).source
    distinct = [not torch.equal(sample(4, 122_871), sample(6, 122_664)),
                not torch.equal(sample(2, 2_730, eval_source), sample(7, 25_209))]
    assert distinct == [True, True]
