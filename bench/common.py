"""Shared benchmark plumbing: result files and headers here; CUDA-event timing and the ceilings
measured in the same run live in the package (megamoe/_timing.py, also used by megamoe-bench) and
are re-exported from here."""
from __future__ import annotations

import datetime as _dt
import json
import os
import sys
from pathlib import Path

import torch

_PKG = Path(__file__).resolve().parents[1] / "packages" / "megamoe" / "python"
if str(_PKG) not in sys.path:  # the scripts also run without scripts/gpu_env.sh's PYTHONPATH
    sys.path.append(str(_PKG))
from megamoe._timing import (_hold_stream, kernel_times_sequence, measure_bf16_peak,  # noqa: E402,F401
                             measure_fp8_peak, measure_hbm_copy, time_best, time_cuda, time_cuda_graph,
                             time_cuda_sequence, time_cuda_sequence_total)

RESULTS = Path(__file__).resolve().parent / "results"


def commit() -> str:
    """$MEGAMOE_COMMIT (the GPU machine's copy has no .git), else git's (megamoe._report, one helper)."""
    from megamoe._report import _commit
    return _commit(os.environ.get("MEGAMOE_COMMIT"))


def header(extra: dict | None = None) -> dict:
    p = torch.cuda.get_device_properties(0)
    h = {"gpu": p.name, "sms": p.multi_processor_count, "gpus": torch.cuda.device_count(),
         "commit": commit(), "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
         "torch": torch.__version__}
    h.update(extra or {})
    return h


def write_results(name: str, head: dict, rows: list[dict], columns: list[str]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = head["date"][:10]
    base = RESULTS / f"{name}-{stamp}-{head['commit']}"
    base.with_suffix(".json").write_text(json.dumps({"header": head, "rows": rows}, indent=1))
    lines = [f"# {name} — {head['gpu']} x{head['gpus']}, commit {head['commit']}, {head['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in head.items() if k not in ("gpu", "commit", "date")]
    lines += ["", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c, "")) for c in columns) + " |")
    base.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return base


def _fmt(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


