"""CPU tests for symm_comm: the layout (through the library, when built) and the argument checks."""
from __future__ import annotations

import ctypes

import pytest
from symm_lib_util import layout as _layout, lib_or_skip as _lib_or_skip

from symm_comm import errors as E
from symm_comm._arrays import DevArray
from symm_comm._validate import Config, check_buffer_args, check_combine, check_dispatch
from symm_comm.layout import REGIONS, region_bytes


def test_struct_mirror_size():
    lib = _lib_or_skip().lib
    from symm_comm._lib import SymmLayout
    assert lib.symm_layout_size() == ctypes.sizeof(SymmLayout)
    assert lib.symm_abi_version() == 3
    for code in (0, -1, -2, -3, -4):
        assert lib.symm_error_string(code)


@pytest.mark.parametrize("cin", [0, -1, 100])
@pytest.mark.parametrize("R,E,H,K,T,bm", [(1, 8, 256, 2, 16, 128), (2, 256, 7168, 8, 4096, 128),
                                          (8, 256, 1024, 8, 65536, 128),
                                          (8, 256, 7168, 8, 128, 64), (4, 384, 4096, 6, 1, 128),
                                          (3, 6, 128, 3, 5, 7)])
def test_layout_regions(R, E, H, K, T, bm, cin):
    if cin > 0:
        cin = min(cin, _layout(R, R - 1, E, H, K, T, bm).pool_rows)  # at most the pool's rows
    L = _layout(R, R - 1, E, H, K, T, bm, cmb_in_rows=cin)
    rows_in = L.pool_rows if cin < 0 else cin
    assert L.cmb_in_rows == rows_in
    Lx, S = E // R, H // 128
    assert (L.num_ranks, L.rank, L.num_local_experts, L.scale_cols) == (R, R - 1, Lx, S)
    # combine chunks: a power of two >= 16 tokens, C chunks cover T, shared tables (R + 5) * C <= 8192 ints
    ch, C = L.combine_chunk, L.num_chunks
    assert ch >= 16 and ch & (ch - 1) == 0 and C == -(-T // ch) and (R + 5) * C <= 8192
    assert L.version == 10
    # default pool: contiguous worst case, a multiple of block_m, and room for the masked layout
    assert L.pool_rows % bm == 0
    assert L.pool_rows >= R * T * K + Lx * (bm - 1)
    assert L.pool_rows >= Lx * L.max_m and L.max_m >= 1
    assert L.num_blocks * bm == L.pool_rows
    offs = [getattr(L, "off_" + r) for r in REGIONS]
    assert offs == sorted(offs) and offs[0] == 0
    assert all(o % 1024 == 0 for o in offs)
    need = {"signals": 2 * R * 8, "state": 256, "meta_count": 2 * Lx * R * 4, "meta_slots": 2 * Lx * R * T * 4,
            "meta_map": 2 * R * T * K * 4, "id_slot": T * K * 4,
            "stage_x": 2 * T * H, "stage_s": 2 * T * S * 4, "stage_w": 2 * T * K * 4, "kmask": T * 4,
            "meta_scan": 256 * E * 4,  # SYMM_META_MAX_GROUPS rows
            "cmb_hist": R * C * 4, "cmb_order": R * C * ch * K * 4, "cmb_arr": 2 * T * 4,
            "src_counts": Lx * R * 4, "exp_counts": Lx * 4, "exp_offsets": (Lx + 1) * 4,
            "arrivals": L.num_blocks * 4, "row_src": L.pool_rows * 4, "pool_x": L.pool_rows * H,
            "pool_s": L.pool_rows * S * 4, "pool_w": L.pool_rows * 4, "combine": 2 * K * T * H * 2,
            "cmb_map": T * K * 4 if rows_in else 0, "cmb_in": rows_in * H * 2}
    rb = region_bytes(L)
    for r in REGIONS:
        assert rb[r] >= need[r], r
        assert rb[r] - need[r] < 1024 + 32, r  # only alignment padding
    assert L.total_bytes == offs[-1] + rb["cmb_in"]
    # halves are 16-byte multiples so every half starts 16-byte aligned
    for h in ("meta_count_half", "meta_slots_half", "stage_x_half", "stage_s_half", "stage_w_half", "combine_half",
              "cmb_arr_half", "meta_map_half"):
        assert getattr(L, h) % 16 == 0


def test_layout_rejects_cmb_in_rows_above_pool():
    _lib_or_skip()
    from symm_comm.layout import compute_layout
    L = compute_layout(2, 0, 16, 256, 2, 64, 128)
    with pytest.raises(RuntimeError, match="invalid size"):
        compute_layout(2, 0, 16, 256, 2, 64, 128, cmb_in_rows=L.pool_rows + 1)


def test_layout_explicit_pool_and_max_m():
    L = _layout(2, 0, 16, 256, 2, 64, 128, pool_rows=1000, max_m=40)
    assert L.pool_rows == 1024 and L.max_m == 40
    L = _layout(2, 0, 16, 256, 2, 64, 128, pool_rows=128, max_m=100)  # masked needs 8 * 100 rows
    assert L.pool_rows >= 800 and L.pool_rows % 128 == 0


@pytest.mark.parametrize("args", [(2, 0, 7, 256, 2, 8, 128), (2, 0, 8, 200, 2, 8, 128), (2, 2, 8, 256, 2, 8, 128),
                                  (2, 0, 8, 256, 0, 8, 128), (2, 0, 8, 256, 33, 8, 128), (2, 0, 8, 256, 2, 0, 128),
                                  (2, 0, 8, 256, 2, 8, 0)])
def test_layout_rejects(args):
    _lib_or_skip()
    from symm_comm.layout import compute_layout
    with pytest.raises(RuntimeError, match="invalid size"):
        compute_layout(*args)


# ---- argument validation (pure Python, no GPU) -------------------------------------------------
CFG = Config(hidden=256, topk=4, max_tokens=64, num_experts=16, num_local_experts=8, max_m=32, device=0)


def _arr(shape, kind, itemsize, ptr=1 << 20, device=0, strides=None):
    if strides is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    return DevArray(None, "torch", ptr, tuple(shape), strides, itemsize, kind, device)


def _good(T=10):
    return (_arr((T, 256), "fp8", 1), _arr((T, 2), "f32", 4), _arr((T, 4), "i64", 8), _arr((T, 4), "f32", 4))


def test_dispatch_ok():
    assert check_dispatch(CFG, *_good(), "contiguous") == (10, 8)
    assert check_dispatch(CFG, *_good(0), "masked") == (0, 8)
    x, s, i, w = _good()
    assert check_dispatch(CFG, _arr((10, 256), "u8", 1), s, _arr((10, 4), "i32", 4), None, "contiguous") == (10, 4)


@pytest.mark.parametrize("which,arr,err,match", [
    (0, _arr((10, 256), "bf16", 2), TypeError, "x_fp8"),
    (0, _arr((10, 128), "fp8", 1), ValueError, "x_fp8: hidden"),
    (0, _arr((65, 256), "fp8", 1), ValueError, "max_tokens"),
    (0, _arr((10, 256), "fp8", 1, ptr=(1 << 20) + 8), ValueError, "x_fp8: data pointer"),
    (0, _arr((10, 256), "fp8", 1, strides=(512, 1)), ValueError, "x_fp8: must be contiguous"),
    (0, _arr((10, 256), "fp8", 1, device=1), ValueError, "x_fp8: on device 1"),
    (1, _arr((10, 3), "f32", 4), ValueError, "x_scales"),
    (1, _arr((10, 2), "f16", 2), TypeError, "x_scales"),
    (2, _arr((10, 4), "f32", 4), TypeError, "topk_idx"),
    (2, _arr((10, 5), "i32", 4), ValueError, "topk_idx"),
    (3, _arr((10, 4), "f64", 8), TypeError, "topk_w"),
    (3, _arr((9, 4), "f32", 4), ValueError, "topk_w"),
])
def test_dispatch_bad_args(which, arr, err, match):
    a = list(_good())
    a[which] = arr
    with pytest.raises(err, match=match):
        check_dispatch(CFG, *a, "contiguous")


def test_dispatch_bad_layout():
    with pytest.raises(ValueError, match="layout"):
        check_dispatch(CFG, *_good(), "ragged")


def test_combine_args():
    assert check_combine(CFG, _arr((1000, 256), "bf16", 2), False, 10, None, None) == 1000
    assert check_combine(CFG, _arr((8, 32, 256), "u16", 2), True, 10, _arr((10, 4), "f32", 4), None) == 256
    with pytest.raises(ValueError, match="expert_out: masked"):
        check_combine(CFG, _arr((8, 31, 256), "bf16", 2), True, 10, None, None)
    with pytest.raises(TypeError, match="expert_out"):
        check_combine(CFG, _arr((1000, 256), "f32", 4), False, 10, None, None)
    with pytest.raises(ValueError, match="topk_w"):
        check_combine(CFG, _arr((1000, 256), "bf16", 2), False, 10, _arr((11, 4), "f32", 4), None)
    with pytest.raises(ValueError, match="out: expected shape"):
        check_combine(CFG, _arr((1000, 256), "bf16", 2), False, 10, None, _arr((10, 255), "bf16", 2))


@pytest.mark.parametrize("args,match", [((2, 7, 256, 2, 8, 128, "torch"), "num_experts"),
                                        ((2, 8, 100, 2, 8, 128, "torch"), "hidden"),
                                        ((2, 8, 256, 0, 8, 128, "torch"), "topk"),
                                        ((2, 8, 256, 2, 0, 128, "torch"), "max_tokens"),
                                        ((2, 8, 256, 2, 8, 0, "torch"), "block_m"),
                                        ((2, 8, 256, 2, 8, 128, "mpi"), "backend")])
def test_buffer_args(args, match):
    with pytest.raises(ValueError, match=match):
        check_buffer_args(*args)


def test_error_messages_name_rank_and_phase():
    e = E.make_error((1, 1, 3, 0, 7, 42, 0, 0))
    assert isinstance(e, E.SymmTimeoutError) and isinstance(e, TimeoutError)
    assert "rank 1" in str(e) and "dispatch cross-rank barrier" in str(e) and "rank 0" in str(e)
    e = E.make_error((3, 0, 4, 5000, 4096, 1, 0, 0))
    assert not isinstance(e, E.SymmTimeoutError) and "5000 rows" in str(e) and "4096" in str(e)
    assert "expert id 300" in str(E.make_error((2, 0, 1, 17, 300, 1, 0, 0)))
