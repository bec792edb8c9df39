"""torch.library integration of MegaMoE: the custom op `megamoe::moe_forward` and the layer registry.

    torch.ops.megamoe.moe_forward(x, topk_idx, topk_w, layer_id) -> y BF16 [T, H]

layer_id names a live MegaMoE (the registry holds weak references). The op is opaque to
torch.compile (its fake implementation gives the output's shape), so a module calling it compiles
with fullgraph=True; it launches kernels only on the current stream and synchronises the host only
for the optional id check (off under CUDA-graph capture), so it can be captured into a CUDA graph.
"""
from __future__ import annotations

import itertools
import threading
import weakref

import torch

from ._validate import check_forward

_registry: dict[int, weakref.ref] = {}
_ids = itertools.count(1)
_lock = threading.Lock()


def register(layer) -> int:
    with _lock:
        lid = next(_ids)
        _registry[lid] = weakref.ref(layer, lambda _r, lid=lid: _registry.pop(lid, None))
    return lid


def unregister(layer_id: int) -> None:
    with _lock:
        _registry.pop(layer_id, None)


def lookup(layer_id: int):
    """The live layer registered as layer_id, or None."""
    r = _registry.get(int(layer_id))
    return r() if r is not None else None


def get_layer(layer_id: int):
    layer = lookup(layer_id)
    if layer is None:
        raise RuntimeError(f"megamoe::moe_forward: no live MegaMoE with layer_id {layer_id} (destroyed or "
                           "garbage-collected; keep a reference to the layer while calling it)")
    return layer


@torch.library.custom_op("megamoe::moe_forward", mutates_args=())
def moe_forward(x: torch.Tensor, topk_idx: torch.Tensor, topk_w: torch.Tensor, layer_id: int) -> torch.Tensor:
    return get_layer(layer_id)._forward_impl(x, topk_idx, topk_w)


@moe_forward.register_fake
def _(x, topk_idx, topk_w, layer_id):
    layer = lookup(layer_id)
    if layer is not None:  # shape / dtype / device errors at trace time already
        check_forward(layer.config, x, topk_idx, topk_w)
    return x.new_empty((x.shape[0], x.shape[1]), dtype=torch.bfloat16)
