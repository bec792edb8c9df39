"""CPU check of the packed-weight layout: a bit-level model of the kernel's decoder, run on the
packed bytes, must give exactly the E4M3 values of the transformed weights (fresh random codes and
shifts over the whole shift range)."""
from __future__ import annotations

import os

import pytest
import torch

from fp4_gemm import layout
from fp4_gemm import numerics as nm


@pytest.mark.parametrize("G,N,K", [(1, 128, 128), (2, 256, 384), (3, 384, 256)])
def test_packed_decode_matches_transformed(G, N, K):
    seed = int(os.environ.get("MEGAMOE_TEST_SEED") or int.from_bytes(os.urandom(4), "little"))
    gen = torch.Generator().manual_seed(seed)
    C = layout.constants()
    codes = torch.randint(0, 256, (G, N, K // 2), generator=gen, dtype=torch.int32).to(torch.uint8)
    shift = torch.randint(C["kMinShift"], C["kMaxShift"] + 1, (G, N, K // 32), generator=gen, dtype=torch.int32).to(torch.int8)
    tw = nm.TransformedWeights(codes, shift, torch.ones(G, N), 0, False)
    packed = layout.pack_weights(codes, shift)
    assert packed.shape == (G, N // 128, K // 128, C["kBlockChunkBytes"])
    got = layout.emulate_decode(packed, N, K)
    want = nm.decode_transformed(tw).float()
    bad = (got != want) & ~(torch.isnan(got) & torch.isnan(want))
    assert not bad.any(), f"seed={seed}: {int(bad.sum())} decoded values differ, first at {bad.nonzero()[0].tolist()}"


def test_pack_rejects_bad_shapes():
    with pytest.raises(ValueError, match="N="):
        layout.pack_weights(torch.zeros(1, 100, 64, dtype=torch.uint8), torch.zeros(1, 100, 4, dtype=torch.int8))
    with pytest.raises(ValueError, match="shift"):
        layout.pack_weights(torch.zeros(1, 128, 64, dtype=torch.uint8), torch.zeros(1, 128, 3, dtype=torch.int8))
