"""Finds and loads one package's shared library (the plain C ABI of its CUDA kernels).

Search order:
  1. $MEGAMOE_LIB_DIR (a build folder's lib/, e.g. one built on a machine without a GPU);
  2. the installed package folder (pip install . puts lib<pkg>.so next to __init__.py);
  3. <repo>/build/lib and <repo>/build/*/lib (a developer's in-tree CMake build).
This file is the single source; each package's `_native.py` is a link to it.
"""
from __future__ import annotations

import ctypes
import glob
import os
import re
from functools import lru_cache
from pathlib import Path

BUILD_HINT = (
    "build them with nvcc >= 12.8 (`pip install .` on a machine with the CUDA toolkit, or "
    "`cmake -S . -B build -G Ninja && cmake --build build`) and, for a build folder made "
    "elsewhere, set MEGAMOE_LIB_DIR=<build>/lib"
)


class KernelsNotBuiltError(RuntimeError):
    """Raised when a GPU entry point is called but the CUDA library was not built or found."""


class NoCudaDeviceError(RuntimeError):
    """Raised when a GPU entry point is called where torch sees no CUDA device (a CPU-only torch build,
    no driver, no visible GPU): instead of torch's "Torch not compiled with CUDA enabled" AssertionError."""


def require_cuda_device(entry: str, device=None) -> None:
    """Raise NoCudaDeviceError naming `entry` unless torch can use a CUDA device (`device`, if given:
    an index, "cuda", "cuda:N" or a torch.device, must exist; a non-CUDA device passes). Cheap: call it
    first in a GPU entry point."""
    try:
        import torch
    except ImportError:
        raise NoCudaDeviceError(f"{entry}: needs a CUDA device, and torch is not installed") from None
    idx = None
    if device is not None:
        d = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if d.type != "cuda":
            return  # not a CUDA device: the caller's own checks name it
        idx = d.index
    if torch.version.cuda is None:
        why = (f"this torch build ({torch.__version__}) has no CUDA support (a CPU-only wheel); install a "
               "CUDA build of torch on a machine with an NVIDIA GPU")
    elif not torch.cuda.is_available():
        why = "torch sees no CUDA device (no NVIDIA driver, no GPU, or CUDA_VISIBLE_DEVICES hides them)"
    else:
        n = torch.cuda.device_count()
        if idx is None or 0 <= idx < n:
            return
        why = f"CUDA device {idx} does not exist ({n} visible)"
    raise NoCudaDeviceError(f"{entry}: no CUDA device to run on: {why}")


def _candidates(pkg: str, pkg_dir: Path) -> list[Path]:
    name = f"lib{pkg}.so"
    out = []
    env = os.environ.get("MEGAMOE_LIB_DIR")
    if env:
        out.append(Path(env) / name)
    out.append(pkg_dir / name)
    # Source tree (also an editable install): <repo>/packages/<pkg>/python/<pkg>/
    repo = pkg_dir.parents[3] if len(pkg_dir.parents) > 3 else pkg_dir
    out.append(repo / "build" / "lib" / name)
    out.extend(Path(p) for p in sorted(glob.glob(str(repo / "build" / "*" / "lib" / name))))
    return out


def load(pkg: str, pkg_dir: str | Path) -> ctypes.CDLL:
    tried = _candidates(pkg, Path(pkg_dir).resolve())
    for p in tried:
        if p.is_file():
            return ctypes.CDLL(str(p))
    raise KernelsNotBuiltError(
        f"the CUDA kernels of '{pkg}' were not built or not found (looked for "
        + ", ".join(str(p) for p in tried) + f"); {BUILD_HINT}"
    )


class NativeLib:
    """Lazily loaded library with ctypes signatures; `call` raises on a non-zero return code.

    signatures: {symbol: (argtypes, restype)}; error_fn: the symbol turning a code into text;
    abi: (symbol, version): the C ABI the package's Python side mirrors, checked once by require().
    """

    def __init__(self, pkg: str, pkg_dir: str | Path, signatures: dict, error_fn: str,
                 abi: tuple[str, int] | None = None):
        self.pkg, self.pkg_dir, self.signatures, self.error_fn, self.abi = pkg, pkg_dir, signatures, error_fn, abi
        self._lib = None
        self._abi_checked = False

    @property
    def lib(self) -> ctypes.CDLL:
        if self._lib is None:
            L = load(self.pkg, self.pkg_dir)
            for name, (args, res) in self.signatures.items():
                fn = getattr(L, name, None)
                if fn is not None:
                    fn.argtypes, fn.restype = args, res
            self._lib = L
        return self._lib

    def require(self) -> None:
        """Raise KernelsNotBuiltError (how to build) unless the library loads and implements the
        package's ABI (an older build has other signatures): call first in every GPU entry point,
        before anything is allocated. The ABI is checked once (a ctypes call per GEMM costs host time)."""
        L = self.lib
        if self.abi is None or self._abi_checked:
            return
        sym, want = self.abi
        fn = getattr(L, sym, None)
        got = fn() if fn is not None else None
        if got != want:
            raise KernelsNotBuiltError(f"lib{self.pkg}.so implements ABI {got}, this package needs {want}: "
                                       f"rebuild it; {BUILD_HINT}")
        self._abi_checked = True

    def available(self) -> bool:
        try:
            self.lib
            return True
        except KernelsNotBuiltError:
            return False

    def call(self, name: str, *args) -> None:
        fn = getattr(self.lib, name, None)
        if fn is None:
            raise KernelsNotBuiltError(f"lib{self.pkg}.so has no '{name}': it is out of date; {BUILD_HINT}")
        rc = fn(*args)
        if rc != 0:
            msg = getattr(self.lib, self.error_fn)(rc).decode()
            raise RuntimeError(f"{self.pkg}: {name} failed: {msg} (code {rc})")


def header_constants(path, known: dict | None = None) -> dict:
    """`static constexpr int kName = <expr>;` lines of a C++ header -> {kName: int}. An expression
    may use integer literals, + - * / ( ) and names declared earlier in the same header (or `known`)."""
    vals: dict = dict(known or {})
    for name, expr in re.findall(r"static\s+constexpr\s+int\s+(k\w+)\s*=\s*([^;]+);", Path(path).read_text()):
        expr = re.sub(r"\w+::", "", expr).replace("/", "//")
        if not re.fullmatch(r"[\w\s+\-*/()]+", expr):
            raise ValueError(f"{path}: cannot evaluate {name} = {expr}")
        vals[name] = int(eval(expr, {"__builtins__": {}}, dict(vals)))  # only literals and earlier names
    return vals


def package_header(pkg_dir, rel: str) -> Path:
    """include/<rel> of an installed package (<pkg>/include/...) or of the source tree (the package's
    own packages/<pkg>/include/..., or packages/common/include/... for the shared headers)."""
    here = Path(pkg_dir).resolve()
    for p in (here / "include" / rel, here.parents[1] / "include" / rel, here.parents[2] / "common" / "include" / rel):
        if p.is_file():
            return p
    raise FileNotFoundError(f"include/{rel} not found next to {here} or in the source tree")


@lru_cache(maxsize=None)
def shared_constants(pkg_dir: str) -> dict:
    """The granularities every package shares (include/moe_common/constants.cuh): {"kScaleGroup": 128}."""
    return header_constants(package_header(pkg_dir, "moe_common/constants.cuh"))
