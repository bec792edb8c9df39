"""The token-tile rule for spread group sizes (fp4_gemm.ops.expected_tiles / pick_block_n_spread) against
independent computations: a Monte-Carlo draw of Poisson group sizes, and the rule's definition evaluated
by brute force. Fresh seeded draws (the `gen` fixture, conftest.py: MEGAMOE_TEST_SEED pins one)."""
from __future__ import annotations

import math

import pytest
import torch

from fp4_gemm import ops


@pytest.mark.parametrize("mean_m", [0.3, 1.0, 3.0, 8.0, 12.0, 32.0, 48.0, 192.0, 1500.0])
def test_expected_tiles_matches_sampling(gen, mean_m):
    n = 400_000
    x = torch.poisson(torch.full((n,), float(mean_m), dtype=torch.float64), generator=gen)
    for b in ops.BLOCK_NS:
        tiles = torch.ceil(x / b)
        mc, se = tiles.mean().item(), tiles.std().item() / math.sqrt(n)
        got = ops.expected_tiles(mean_m, b)
        # (+ 8 / n: a tail event the sample may not hold once, e.g. an empty group at mean 12)
        assert abs(got - mc) <= 5 * se + 8 / n, f"mean {mean_m}, block_n {b}: {got} vs sampled {mc} +- {se}"


def test_expected_tiles_edges():
    assert ops.expected_tiles(0.0, 8) == 0.0
    # tiny mean: a group is non-empty with probability 1 - e^-m and then fits any tile
    assert ops.expected_tiles(0.01, 128) == pytest.approx(1 - math.exp(-0.01), rel=1e-9)
    # huge mean: ceil(X / b) averages m / b + about 1/2
    assert ops.expected_tiles(100_000.0, 128) == pytest.approx(100_000 / 128 + 0.5, abs=0.02)


def test_pick_block_n_spread_is_the_cheapest_tile():
    for m in [0.05, 0.5, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48, 64, 96, 128, 192, 300, 4096]:
        cost = {b: ops.expected_tiles(m, b) * ops.TILE_KBLOCK_COST[b] for b in ops.BLOCK_NS}
        got = ops.pick_block_n_spread(float(m))
        assert got in ops.BLOCK_NS
        assert cost[got] <= min(cost.values()) * (1 + 1e-6), f"mean {m}: {got} costs {cost[got]}, min {cost}"
        # no smaller tile is as cheap (the smaller tile wins a tie)
        assert all(cost[b] > cost[got] * (1 + 1e-6) for b in ops.BLOCK_NS if b < got), (m, got, cost)


def test_pick_block_n_spread_ends():
    # Not monotonic in the mean: around 150 tokens per expert three 64-token tiles can cost less than two
    # 128-token tiles (the brute-force test above checks every pick against the model).
    picks = [ops.pick_block_n_spread(m / 4) for m in range(1, 2000)]
    assert picks[0] == 8 and picks[-1] == 128 and set(picks) == set(ops.BLOCK_NS)
