"""megamoe-bench's result tables and files: markdown / aligned tables, the run header (commit, date,
GPU, driver, torch / CUDA versions), JSON + markdown + PNG plot under one name."""
from __future__ import annotations

import json
import os
import sys

import torch

__all__ = ["GPU_COLUMNS", "CPU_COLUMNS", "format_table", "run_header", "results_name", "write_markdown",
           "plot_results", "write_results"]


GPU_COLUMNS = (  # header, row key, format
    ("preset", "preset", "{}"), ("backend", "backend", "{}"), ("tokens/rank", "tokens_per_rank", "{:d}"),
    ("pairs", "pairs", "{:d}"), ("time us", "time_us", "{:.1f}"), ("timing", "timing", "{}"), ("eager us", "eager_us", "{:.1f}"),
    ("TFLOPS/rank", "tflops_per_rank", "{:.1f}"), ("HBM MB", "hbm_bytes", "{:.1f}"),
    ("NVLink MB", "nvlink_bytes", "{:.2f}"), ("floor us", "floor_us", "{:.1f}"), ("bound", "bound", "{}"),
    ("time/floor", "time_over_floor", "{:.2f}"), ("HBM floor us", "hbm_floor_us", "{:.1f}"),
    ("<=1.3xHBM+25us", "target_ok", "{}"), ("vs torch-fp8", "speedup_vs_torch_fp8", "{:.2f}x"),
    ("GEMMs alone us", "gemms_us", "{:.1f}"), ("TFLOPS vs GEMMs alone", "vs_gemms", "{:.2f}"),
    ("note", "note", "{}"),
)
CPU_COLUMNS = (
    ("tokens/rank", "tokens_per_rank", "{:d}"), ("pairs", "pairs", "{:d}"), ("time us", "time_us", "{:.1f}"),
    ("TFLOPS/rank", "tflops_per_rank", "{:.4f}"), ("HBM MB", "hbm_bytes", "{:.3f}"),
    ("NVLink MB", "nvlink_bytes", "{:.3f}"),
)
MB_KEYS = ("hbm_bytes", "nvlink_bytes")


def _cell(row: dict, key: str, fmt: str) -> str:
    v = row.get(key)
    if v is None or v == "":
        return "-"
    if key == "target_ok":
        return "pass" if v else "FAIL"
    return fmt.format(v / 1e6 if key in MB_KEYS else v)


def format_table(rows: list[dict], columns=GPU_COLUMNS, markdown: bool = True) -> str:
    cells = [[h for h, _, _ in columns]] + [[_cell(r, k, f) for _, k, f in columns] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(cells[0]) + " |", "|" + "---|" * len(columns)]
        return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells[1:]])
    widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells)


def _driver_version() -> str:
    try:
        import subprocess
        out = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                      text=True, stderr=subprocess.DEVNULL, timeout=20)
        return out.splitlines()[0].strip()
    except Exception:
        return "unknown"


def _commit(override: str | None = None) -> str:
    """The commit the results belong to: `override` (--commit: a copy without .git, e.g. a GPU machine's),
    else git's, else "unknown"."""
    if override:
        return override
    try:
        import subprocess
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=here, text=True,
                                       stderr=subprocess.DEVNULL, timeout=20).strip()
    except Exception:
        return "unknown"


def run_header(cuda: bool, commit: str | None = None) -> dict:
    """Where and what ran: commit, UTC date, GPU, driver, torch / CUDA versions."""
    import datetime as dt
    h = {"commit": _commit(commit), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
         "torch": torch.__version__, "cuda": torch.version.cuda or "none", "device": "cuda" if cuda else "cpu"}
    if cuda:
        p = torch.cuda.get_device_properties(0)
        h.update(gpu=p.name, gpus=torch.cuda.device_count(), sms=p.multi_processor_count, driver=_driver_version())
    else:
        h.update(gpu="none", gpus=0, driver="none")
    return h


def results_name(presets: list[str], ranks: int, head: dict) -> str:
    sliced = "-timesliced" if head.get("time_sliced") else ""  # never mistaken for a speed run
    return f"moe-{'-'.join(presets)}-{ranks}r{sliced}-{head['date'][:10]}-{head['commit']}"


def write_markdown(path, head: dict, rows: list[dict], notes: list[str], columns=GPU_COLUMNS) -> None:
    lines = [f"# megamoe-bench — {head.get('gpu')} x{head.get('gpus')}, commit {head['commit']}, {head['date']}", ""]
    lines += [f"- {k}: {v}" for k, v in head.items() if k not in ("commit", "date")]
    lines += [f"- {n}" for n in notes] + ["", format_table(rows, columns), ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


def plot_results(rows: list[dict], path) -> bool:
    """PNG: time per call vs tokens per rank (log-log), one line per backend, the floor dashed, one
    subplot per preset. False (nothing written) without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    fig, axes = plt.subplots(1, len(presets), figsize=(6 * len(presets), 4.5), squeeze=False)
    for ax, preset in zip(axes[0], presets):
        mine = [r for r in rows if r["preset"] == preset]
        for backend in dict.fromkeys(r["backend"] for r in mine):
            pts = [(r["tokens_per_rank"], r["time_us"]) for r in mine if r["backend"] == backend and r["time_us"]]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=backend)
        floor = sorted({(r["tokens_per_rank"], r["floor_us"]) for r in mine if r["floor_us"]})
        if floor:
            ax.plot(*zip(*floor), "k--", label="floor")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("tokens per rank")
        ax.set_ylabel("time per call (us)")
        ax.set_title(preset)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def write_results(out_dir, name: str, head: dict, rows: list[dict], notes: list[str], plot: bool = True) -> list[str]:
    """<out_dir>/<name>.json, .md and (plot, where matplotlib is installed) .png."""
    os.makedirs(out_dir, exist_ok=True)
    base = os.path.join(out_dir, name)
    with open(base + ".json", "w") as f:
        json.dump({"header": head, "notes": notes, "rows": rows}, f, indent=1)
    write_markdown(base + ".md", head, rows, notes)
    written = [base + ".json", base + ".md"]
    try:
        if plot and plot_results(rows, base + ".png"):
            written.append(base + ".png")
    except Exception as e:  # the plot is a convenience: the JSON and markdown are written already
        print(f"megamoe-bench: no plot ({type(e).__name__}: {e})", file=sys.stderr)
    return written
