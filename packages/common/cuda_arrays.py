"""Framework-neutral views of CUDA arrays (torch tensors, CuPy arrays) for the ctypes launchers.

torch: pointers from data_ptr(), stream = torch.cuda.current_stream(). CuPy (and anything with
__cuda_array_interface__): pointer, shape and strides from the interface, stream = CuPy's current
stream. CuPy has no BF16 / FP8 dtypes: pass raw bits (uint16 for BF16, uint8 for E4M3).
This file is the single source; each package's `_arrays.py` is a link to it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


def _torch():
    try:
        import torch
        return torch
    except ImportError:  # pragma: no cover - torch is optional
        return None


@dataclass
class DevArray:
    obj: Any
    framework: str  # "torch" | "cupy"
    ptr: int
    shape: tuple
    strides: tuple  # in elements
    itemsize: int
    kind: str  # "bf16", "fp8", "f32", "i32", "i64", "u8", "u16", ...
    device: int


_TORCH_KIND = {
    "torch.bfloat16": "bf16", "torch.float8_e4m3fn": "fp8", "torch.float32": "f32",
    "torch.int32": "i32", "torch.int64": "i64", "torch.uint8": "u8", "torch.int8": "i8",
    "torch.float16": "f16", "torch.float64": "f64", "torch.int16": "i16", "torch.uint16": "u16",
}
_NP_KIND = {"float32": "f32", "int32": "i32", "int64": "i64", "uint8": "u8", "int8": "i8",
            "uint16": "u16", "int16": "i16", "float16": "f16", "float64": "f64"}


def is_torch(x) -> bool:
    t = _torch()
    return t is not None and isinstance(x, t.Tensor)


def view(x, name: str) -> DevArray:
    """Describe a CUDA array; raise TypeError/ValueError naming `name` if it is not one."""
    if is_torch(x):
        if not x.is_cuda:
            raise ValueError(f"{name}: expected a CUDA tensor, got one on {x.device}")
        return DevArray(x, "torch", x.data_ptr(), tuple(x.shape), tuple(x.stride()), x.element_size(),
                        _TORCH_KIND.get(str(x.dtype), str(x.dtype)), x.device.index)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(f"{name}: expected a torch CUDA tensor or a CuPy array, got {type(x).__name__}")
    dt = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    if cai.get("strides") is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    else:
        strides = tuple(s // dt.itemsize for s in cai["strides"])
    dev = getattr(getattr(x, "device", None), "id", 0)
    return DevArray(x, "cupy", int(cai["data"][0]), shape, strides, dt.itemsize,
                    _NP_KIND.get(dt.name, dt.name), dev)


def check(a: DevArray, name: str, kinds: tuple, ndim: int | None = None, contiguous: bool = False):
    if a.kind not in kinds:
        raise TypeError(f"{name}: expected dtype {' or '.join(kinds)}, got {a.kind}")
    if ndim is not None and len(a.shape) != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {a.shape}")
    if contiguous and 0 not in a.shape:  # an empty array is contiguous whatever its strides
        acc = 1
        for s, st in zip(reversed(a.shape), reversed(a.strides)):
            if s != 1 and st != acc:
                raise ValueError(f"{name}: must be contiguous (shape {a.shape}, strides {a.strides})")
            acc *= s


def same_device(*arrs: DevArray):
    devs = {a.device for a in arrs}
    if len(devs) > 1:
        raise ValueError(f"arrays are on different devices: {sorted(devs)}")


def device_of(a: DevArray):
    """Context manager making a's device current: the C launchers launch on the current device."""
    if a.framework == "torch":
        return _torch().cuda.device(a.device)
    import cupy
    return cupy.cuda.Device(a.device)


def stream_of(a: DevArray) -> int:
    if a.framework == "torch":
        return _torch().cuda.current_stream(a.device).cuda_stream
    import cupy
    return cupy.cuda.get_current_stream().ptr


def capturing(a: DevArray) -> bool:
    """True while a's framework's current stream (on the current device: call it inside device_of(a)) is
    being captured into a CUDA graph (launches are recorded, not run)."""
    if a.framework == "torch":
        return bool(_torch().cuda.is_current_stream_capturing())
    import cupy
    return bool(cupy.cuda.get_current_stream().is_capturing())


def empty_like_framework(a: DevArray, shape, kind: str):
    """Allocate an output on a's device with a's framework (kind: f32 / u8 / fp8 / bf16 / i32)."""
    if a.framework == "torch":
        t = _torch()
        dt = {"f32": t.float32, "fp8": t.float8_e4m3fn, "u8": t.uint8, "bf16": t.bfloat16,
              "i32": t.int32, "i64": t.int64, "u16": t.uint16}[kind]
        return t.empty(shape, dtype=dt, device=f"cuda:{a.device}")
    import cupy
    dt = {"f32": cupy.float32, "fp8": cupy.uint8, "u8": cupy.uint8, "bf16": cupy.uint16,
          "i32": cupy.int32, "i64": cupy.int64, "u16": cupy.uint16}[kind]
    with cupy.cuda.Device(a.device):
        return cupy.empty(shape, dtype=dt)
