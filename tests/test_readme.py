"""The README's CPU-runnable Python snippets run as written (so they cannot rot)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)


def test_readme_has_the_reference_snippet():
    assert any("moe_reference" in b for b in _python_blocks()), "README lost its moe_reference example"


@pytest.mark.parametrize("block", [b for b in _python_blocks() if "moe_reference" in b],
                         ids=lambda b: b.splitlines()[0][:40])
def test_readme_reference_snippet_runs(block):
    import torch
    ns: dict = {}
    exec(compile(block, str(README), "exec"), ns)  # noqa: S102 - the README's own code
    y, x = ns["y"], ns["x"]
    assert y.dtype == torch.bfloat16 and y.shape == x.shape and bool(torch.isfinite(y.float()).all())
