"""The benchmark CLI: the reference over 2 CPU ranks, argument errors, and the GPU path's pure parts
(rows, targets, speed-ups, tables, result files, plot; the per-rank case loop with fake timers)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHONPATH = os.pathsep.join(str(ROOT / "packages" / p / "python") for p in ("fp4_gemm", "symm_comm", "megamoe"))
TIMEOUT_S = 120  # the run takes a few seconds; this only stops a hung process group


def _bench(*args: str, cwd=None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=PYTHONPATH, CUDA_VISIBLE_DEVICES="")  # CPU ranks even on a GPU host
    return subprocess.run([sys.executable, "-m", "megamoe.bench", *args], env=env, capture_output=True,
                          text=True, timeout=TIMEOUT_S, cwd=cwd)


def test_tiny_table(tmp_path):
    out = tmp_path / "bench.json"
    r = _bench("--preset", "tiny", "--tokens", "1,4", "--ranks", "2", "--reps", "2", "--json", str(out),
               "--results", str(tmp_path / "res"))
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "backend reference (no CUDA GPU" in r.stdout
    assert "n/a (no GPU)" in r.stdout  # no floors against H200 ceilings on a CPU
    header = next(i for i, l in enumerate(lines) if l.split()[:1] == ["tokens/rank"])
    table = [l for l in lines[header + 1:] if not l.startswith("wrote ")]
    assert [l.split()[0] for l in table] == ["1", "4"], r.stdout
    assert "floor" not in lines[header]
    data = json.loads(out.read_text())
    for key in ("commit", "date", "torch", "gpu", "driver"):
        assert key in data["header"]
    assert data["peaks"] is None
    rows = data["rows"]
    assert [row["tokens_per_rank"] for row in rows] == [1, 4]
    for row in rows:
        assert row["time_us"] > 0 and row["floor_us"] is None and row["time_over_floor"] is None
        assert row["pairs"] == 2 * row["tokens_per_rank"] * 4  # tiny: top-4, no missing slots
    written = sorted(p.name for p in (tmp_path / "res").iterdir())
    assert any(n.startswith("moe-tiny-2r-") and n.endswith(".json") for n in written)
    assert any(n.endswith(".md") for n in written)


def test_peaks_given_on_cpu_give_floors():
    r = _bench("--preset", "tiny", "--tokens", "1", "--ranks", "2", "--reps", "1",
               "--peaks", "fp8_tflops=1,hbm_tbs=1")
    assert r.returncode == 0, r.stderr
    assert "not measured in this run: nvlink_gbs" in r.stdout and "time/floor" in r.stdout


@pytest.mark.parametrize("args, message", [
    (("--backend", "fused"), "needs a CUDA GPU"),
    (("--backend", "auto"), "needs a CUDA GPU"),
    (("--backend", "nonsense"), "unknown backend"),
    (("--backend", "staged"), "needs a CUDA GPU"),
    (("--backend", "torch-fp8"), "needs a CUDA GPU"),
    (("--reps", "0"), "--reps: must be >= 1"),
    (("--warmup", "-1"), "--warmup: must be >= 0"),
    (("--tokens", "0"), "must be >= 1"),
    (("--preset", "tiny,huge"), "unknown preset"),
    (("--ranks", "3"), "must divide"),
    (("--peaks", "fp8=3"), "--peaks"),
])
def test_argument_errors_are_clear(args, message, monkeypatch, capsys):
    import torch
    from megamoe.bench import main
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a CPU machine, even on a GPU host
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err, err


def test_default_backend_says_why(monkeypatch):
    from megamoe import bench
    assert bench.default_backend(False) == ("reference", bench.default_backend(False)[1])
    assert "no CUDA GPU" in bench.default_backend(False)[1]
    monkeypatch.setattr(bench, "kernels_available", lambda: False)
    backend, why = bench.default_backend(True)
    assert backend == "reference" and "not built" in why
    monkeypatch.setattr(bench, "kernels_available", lambda: True)
    monkeypatch.setattr(bench, "layer_available", lambda: True)
    assert bench.default_backend(True)[0] == "staged"


def test_rows_sorted_by_preset_tokens_backend():
    from megamoe.bench import sort_rows
    rows = [dict(preset=p, tokens_per_rank=t, backend=b) for b in ("torch-fp8", "staged") for p in ("pro", "flash")
            for t in (16, 1)]
    got = [(r["preset"], r["tokens_per_rank"], r["backend"]) for r in sort_rows(rows, ["staged", "torch-fp8"], ["flash", "pro"])]
    assert got[:4] == [("flash", 1, "staged"), ("flash", 1, "torch-fp8"), ("flash", 16, "staged"), ("flash", 16, "torch-fp8")]


def test_rank_costs_by_hand():
    """2 ranks x 2 tokens, experts 0-1 on rank 0 and 2-3 on rank 1."""
    import torch
    from megamoe.bench import Shape, count_flops, floor_time, hbm_bytes, nvlink_bytes, rank_costs

    shape = Shape(H=256, I=128, E=4, K=2)
    idx = torch.tensor([[0, 3], [1, -1],    # rank 0's tokens: one pair goes to rank 1
                        [2, 3], [0, 2]])    # rank 1's tokens: one pair goes to rank 0
    costs = rank_costs(idx, 2, shape)
    assert [c.pairs for c in costs] == [3, 4]
    assert [c.flops for c in costs] == [count_flops(3, 256, 128), count_flops(4, 256, 128)]
    assert costs[0].hbm == costs[1].hbm == hbm_bytes(2, 2, 256, 128) == 2 * 3 * 256 * 128 * 4.25 / 8 + 2 * 256 * 4
    # one FP8 row + 2 scales + top-k weight out, one BF16 row back, in each direction
    assert costs[0].nvlink == costs[1].nvlink == nvlink_bytes(1, 1, 256) == (256 + 2 * 4 + 4) + 2 * 256
    peaks = dict(fp8_tflops=1.0, hbm_tbs=1.0, nvlink_gbs=1.0)
    assert floor_time(2e12, 1e12, 1e9, peaks) == (2.0, "fp8")
    assert floor_time(1e12, 1e12, 3e9, peaks) == (3.0, "nvlink")


PEAKS = {"fp8_tflops": 1350.0, "hbm_tbs": 4.2, "nvlink_gbs": 380.0}


def _fake_rows():
    from megamoe.bench import PRESETS, add_speedups, make_row
    rows = []
    for backend, scale in (("staged", 1.0), ("torch-fp8", 2.5)):
        for T in (1, 16, 128):
            t = (40e-6 + T * 1e-7) * scale
            rows.append(make_row("flash", backend, T, 1, PRESETS["flash"], 0, PEAKS, t, 1.5 * t))
    add_speedups(rows)
    return rows


def test_rows_targets_and_speedups():
    from megamoe.bench import PRESETS, TARGET_FACTOR, TARGET_SLACK_US, hbm_bytes
    rows = _fake_rows()
    staged1 = next(r for r in rows if r["backend"] == "staged" and r["tokens_per_rank"] == 1)
    # 1 token, top-6: 6 touched experts of flash
    assert staged1["hbm_bytes"] == hbm_bytes(6, 1, 4096, 2048)
    assert staged1["hbm_floor_us"] == pytest.approx(staged1["hbm_bytes"] / 4.2e12 * 1e6)
    assert staged1["bound"] == "hbm" and staged1["floor_us"] == pytest.approx(staged1["hbm_floor_us"])
    assert staged1["time_over_floor"] == pytest.approx(staged1["time_us"] / staged1["floor_us"])
    assert staged1["target_ok"] == (staged1["time_us"] <= TARGET_FACTOR * staged1["hbm_floor_us"] + TARGET_SLACK_US)
    assert staged1["speedup_vs_torch_fp8"] == pytest.approx(2.5)
    assert staged1["eager_us"] == pytest.approx(1.5 * staged1["time_us"])
    assert staged1["tflops_per_rank"] == pytest.approx(3 * 2 * 6 * 4096 * 2048 / (staged1["time_us"] * 1e-6) / 1e12)
    big = next(r for r in rows if r["tokens_per_rank"] == 128 and r["backend"] == "staged")
    assert big["target_ok"] is None  # the target is for 1-16 tokens only
    assert all(r["speedup_vs_torch_fp8"] is None for r in rows if r["backend"] == "torch-fp8")
    assert PRESETS["flash"].K == 6


def test_tables_and_result_files(tmp_path):
    from megamoe.bench import format_table, results_name, write_results
    rows = _fake_rows()
    rows.append(dict(rows[0], backend="torch-bf16", time_us=None, eager_us=None, tflops_per_rank=None,
                     time_over_floor=None, target_ok=None, note="skipped: needs ~200 GiB"))
    md = format_table(rows)
    lines = md.splitlines()
    assert lines[0].startswith("| preset | backend | tokens/rank") and len(lines) == 2 + len(rows)
    assert "pass" in md or "FAIL" in md
    assert "2.50x" in md and "| - |" in md
    head = {"commit": "abc1234", "date": "2026-12-01T21:00:00+00:00", "gpu": "NVIDIA H200", "gpus": 1,
            "driver": "999", "torch": "2.11", "cuda": "13.0", "peaks": PEAKS}
    name = results_name(["flash", "pro"], 1, head)
    assert name == "moe-flash-pro-1r-2026-12-01-abc1234"
    written = write_results(tmp_path, name, head, rows, ["a note"])
    data = json.loads((tmp_path / f"{name}.json").read_text())
    assert data["header"]["gpu"] == "NVIDIA H200" and len(data["rows"]) == len(rows)
    text = (tmp_path / f"{name}.md").read_text()
    assert "commit abc1234" in text and "- a note" in text and "| flash | staged | 1 |" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert len(written) == 2
    else:
        assert (tmp_path / f"{name}.png").stat().st_size > 1000


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    from megamoe.bench import plot_results
    assert plot_results(_fake_rows(), tmp_path / "p.png") and (tmp_path / "p.png").stat().st_size > 1000


def test_gpu_case_loop_with_fake_timers(monkeypatch):
    """_gpu_rank's loop on CPU: the torch-bf16 baseline for real, a stand-in for the staged layer
    (the API it is built with), fake timers; then merge_ranks -> rows."""
    import torch
    import megamoe
    from megamoe import _timing
    from megamoe.bench import PRESETS, _gpu_rank, add_speedups, merge_ranks

    built = {}

    class FakeExpertWeights:
        def __init__(self, *, num_experts, experts, w1, w2):
            built.update(num_experts=num_experts, experts=experts, w1=w1, w2=w2)

    class FakeLayer:
        def __init__(self, weights, *, max_tokens_per_rank, topk, group=None, backend="staged"):
            built.update(max_tokens=max_tokens_per_rank, topk=topk, group=group, backend=backend)
            self.check_ids = True

        def __call__(self, x, topk_idx, topk_w):
            assert not self.check_ids and x.dtype == torch.bfloat16 and topk_w.dtype == torch.float32
            return torch.zeros_like(x)

    monkeypatch.setattr(megamoe, "MegaMoE", FakeLayer, raising=False)
    monkeypatch.setattr(megamoe, "ExpertWeights", FakeExpertWeights, raising=False)
    calls = []

    def fake_eager(fns, **kw):
        for f in fns:
            f()
        calls.append(("eager", len(fns), kw))
        return 2e-4

    monkeypatch.setattr(_timing, "time_cuda", fake_eager)
    monkeypatch.setattr(_timing, "time_cuda_graph", lambda fns, **kw: 1e-4)
    cfg = dict(presets=["tiny"], shapes={"tiny": PRESETS["tiny"].__dict__}, backends=["staged", "torch-bf16"],
               tokens=[1, 4], seed=0, reps=3, warmup=1, no_graph=False, device_type="cpu")
    cases = _gpu_rank(0, 1, cfg)
    assert [(c["backend"], c["T"]) for c in cases] == [("staged", 1), ("staged", 4), ("torch-bf16", 1), ("torch-bf16", 4)]
    assert all(c["graph_s"] == 1e-4 and c["eager_s"] == 2e-4 for c in cases), cases
    assert built["experts"] == range(16) and built["max_tokens"] == 4 and built["topk"] == 4
    assert built["w1"].codes.shape == (16, 512, 256) and built["w1"].gate_up_interleave
    assert all(kw["reps"] == 3 and kw["warmup"] == 1 for _, _, kw in calls)
    rows = merge_ranks([cases], 1, 0, PEAKS)
    add_speedups(rows)
    assert [r["timing"] for r in rows] == ["graph"] * 4 and rows[0]["time_us"] == pytest.approx(100.0)
    assert rows[0]["eager_us"] == pytest.approx(200.0)


def test_gpu_case_loop_reports_a_failed_build(monkeypatch):
    import megamoe
    from megamoe import _timing
    from megamoe.bench import PRESETS, _gpu_rank

    class Broken:
        def __init__(self, *a, **k):
            raise RuntimeError("kernel not found")

    monkeypatch.setattr(megamoe, "MegaMoE", Broken, raising=False)
    monkeypatch.setattr(megamoe, "ExpertWeights", lambda **k: None, raising=False)
    monkeypatch.setattr(_timing, "time_cuda", lambda fns, **kw: 1.0)
    cfg = dict(presets=["tiny"], shapes={"tiny": PRESETS["tiny"].__dict__}, backends=["staged"],
               tokens=[1, 2], seed=0, reps=1, warmup=0, no_graph=True, device_type="cpu")
    cases = _gpu_rank(0, 1, cfg)
    assert len(cases) == 2 and all("build failed: RuntimeError: kernel not found" in c["note"] for c in cases)


def test_gpu_main_end_to_end_on_cpu_tensors(monkeypatch, tmp_path, capsys):
    from megamoe import _runs
    """main() down the GPU path (peaks, every backend x preset x tokens, merge, speed-ups, table,
    JSON / markdown files) with CPU tensors: a stand-in layer, torch-bf16 for real, fake timers and
    ceilings. Checks the plumbing the GPU run depends on, not any number."""
    import torch
    import megamoe
    from megamoe import _timing, bench

    class FakeLayer:
        def __init__(self, weights, *, max_tokens_per_rank, topk, group=None, backend="staged"):
            self.check_ids = True

        def __call__(self, x, topk_idx, topk_w):
            return x.clone()

    monkeypatch.setattr(megamoe, "MegaMoE", FakeLayer, raising=False)
    monkeypatch.setattr(megamoe, "ExpertWeights", lambda **k: k, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(bench, "kernels_available", lambda: True)
    monkeypatch.setattr(bench, "GPU_DEVICE_TYPE", "cpu")
    monkeypatch.setattr(bench, "run_header", lambda cuda, commit=None: {"commit": "c0ffee0", "date": "2026-12-01T22:00:00+00:00",
                                                          "gpu": "fake", "gpus": 1, "driver": "x", "torch": "t",
                                                          "cuda": "13", "device": "cuda"})
    monkeypatch.setattr(_timing, "measure_fp8_peak", lambda: 1.0e15)
    monkeypatch.setattr(_timing, "measure_hbm_copy", lambda: 4.0e12)
    # "torch-fp8" cannot run on CPU: its stand-in here is the BF16 baseline under the FP8 name
    monkeypatch.setitem(bench.TORCH_BASELINES, "torch-fp8", "bf16")
    times = {"staged": 1e-4, "torch-fp8": 3e-4, "torch-bf16": 5e-4}

    def timer(kind):
        def run(fns, **kw):
            for f in fns:
                assert f().dtype == torch.bfloat16
            return times[current["backend"]] * (1 if kind == "graph" else 2)
        return run

    current = {}
    real_build = _runs._build

    def build(backend, *a, **k):
        current["backend"] = backend
        return real_build(backend, *a, **k)

    monkeypatch.setattr(_runs, "_build", build)
    monkeypatch.setattr(_timing, "time_cuda", timer("eager"))
    monkeypatch.setattr(_timing, "time_cuda_graph", timer("graph"))
    bench.main(["--backend", "torch-fp8,torch-bf16,staged", "--preset", "tiny", "--tokens", "1,16,64",
                "--ranks", "1", "--reps", "2", "--warmup", "0", "--results", str(tmp_path)])
    out = capsys.readouterr()
    assert "peaks: FP8 1000 TFLOPS" in out.out and "HBM 4.00 TB/s" in out.out
    assert "| tiny | staged | 1 |" in out.out and "3.00x" in out.out
    assert "[megamoe-bench] tiny staged T=1: graph 100.0 us, eager 200.0 us" in out.err
    data = json.loads((tmp_path / "moe-tiny-1r-2026-12-01-c0ffee0.json").read_text())
    rows = data["rows"]
    assert [(r["tokens_per_rank"], r["backend"]) for r in rows][:3] == [(1, "torch-fp8"), (1, "torch-bf16"), (1, "staged")]
    staged = [r for r in rows if r["backend"] == "staged"]
    assert all(r["speedup_vs_torch_fp8"] == pytest.approx(3.0) and r["timing"] == "graph" for r in staged)
    assert [r["target_ok"] is not None for r in staged] == [True, True, False]
    assert data["header"]["peaks"]["fp8_tflops"] == pytest.approx(1000.0)
    assert data["header"]["peaks_defaulted"] == ["nvlink_gbs"]
    assert "PARTIAL" not in " ".join(data["notes"])
    assert (tmp_path / "moe-tiny-1r-2026-12-01-c0ffee0.md").read_text().count("| tiny |") == 9


def test_speedup_is_like_for_like():
    from megamoe.bench import add_speedups
    rows = [dict(preset="flash", tokens_per_rank=1, backend="torch-fp8", time_us=300.0, eager_us=300.0, timing="eager"),
            dict(preset="flash", tokens_per_rank=1, backend="staged", time_us=50.0, eager_us=100.0, timing="graph")]
    add_speedups(rows)
    assert rows[1]["speedup_vs_torch_fp8"] == pytest.approx(3.0)  # eager vs eager: the baseline had no graph


def _multi_rank_worker(rank, world, cfg):
    """Inside a spawned gloo rank: fake timers (one real call each), then the GPU case loop on CPU."""
    from megamoe import _timing, bench
    _timing.time_cuda = lambda fns, **kw: [f() for f in fns] and 1e-3
    _timing.time_cuda_graph = lambda fns, **kw: None
    return bench._gpu_rank(rank, world, cfg)


def test_gpu_case_loop_over_two_ranks():
    """The multi-rank flow (torch-bf16 over all_to_all_single, eager only) on 2 gloo ranks."""
    from megamoe.bench import PRESETS, merge_ranks
    from megamoe.reference import run_local_ranks
    cfg = dict(presets=["tiny"], shapes={"tiny": PRESETS["tiny"].__dict__}, backends=["torch-bf16"],
               tokens=[1, 8], seed=0, reps=1, warmup=0, no_graph=False, device_type="cpu")
    per_rank = run_local_ranks(_multi_rank_worker, 2, cfg)
    assert all(c["eager_s"] == 1e-3 and "eager only" in c["note"] for cases in per_rank for c in cases), per_rank
    rows = merge_ranks(per_rank, 2, 0, PEAKS)
    assert [r["timing"] for r in rows] == ["eager", "eager"] and rows[1]["nvlink_bytes"] > 0


def test_staged_without_kernels_is_left_out_beside_baselines(monkeypatch):
    from megamoe import bench
    monkeypatch.setattr(bench, "kernels_available", lambda: False)
    assert "not built" in bench.check_backends(["torch-fp8", "staged"], True)["staged"]
    with pytest.raises(ValueError, match="staged: the CUDA kernels are not built"):
        bench.check_backends(["staged"], True)
    monkeypatch.setattr(bench, "kernels_available", lambda: True)
    monkeypatch.setattr(bench, "layer_available", lambda: False)
    assert bench.check_backends(["staged", "torch-bf16"], True) == {"staged": "megamoe.MegaMoE is not in this checkout"}
    assert bench.check_backends(["torch-bf16"], True) == {}


def test_time_sliced_ranks():
    """Fewer GPUs than ranks: only the symm_comm layers run (time-sliced), named in the results file."""
    from megamoe.bench import results_name, time_sliced_error
    assert time_sliced_error(["staged", "fused"], 2, 1) is None
    assert time_sliced_error(["torch-fp8", "staged"], 4, 8) is None  # a GPU per rank: anything runs
    msg = time_sliced_error(["staged", "torch-fp8", "torch-bf16"], 2, 1)
    assert msg and "--ranks 2" in msg and "torch-fp8, torch-bf16 need one GPU per rank" in msg and "staged" in msg
    assert "reference need one GPU per rank" in time_sliced_error(["reference"], 2, 1)  # as before: refused
    head = {"commit": "abc1234", "date": "2026-12-01T21:00:00+00:00", "time_sliced": "2 ranks on 1 GPU"}
    assert results_name(["flash"], 2, head) == "moe-flash-2r-timesliced-2026-12-01-abc1234"


@pytest.mark.gpu
def test_gpu_ranks_time_sliced(tmp_path):
    """megamoe-bench with more ranks than GPUs (one GPU is enough): the staged and fused layers run time-sliced
    (gloo + CUDA IPC), every row timed and finite, the results named and noted as time-sliced; a torch
    baseline is refused with the reason."""
    import torch
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from fp4_gemm._lib import LIB as F
    from megamoe._lib import LIB as M
    from symm_comm._lib import LIB as S
    if not (F.available() and S.available() and M.available()):
        pytest.skip("libraries not built")
    gpus = torch.cuda.device_count()
    if gpus >= 8:
        pytest.skip("16 time-sliced ranks on 8 GPUs: the 2- and 4-GPU machines cover the mixed placement")
    ranks = next(r for r in (2, 4, 8) if r > gpus)  # divides the tiny preset's 16 experts; shares GPUs
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [PYTHONPATH, os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, "-m", "megamoe.bench", "--preset", "tiny", "--tokens", "1,33", "--ranks", str(ranks),
           "--reps", "2", "--warmup", "1", "--commit", "test", "--results", str(tmp_path)]
    r = subprocess.run(cmd + ["--backend", "staged,fused"], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "time-sliced" in r.stdout
    (js,) = [p for p in tmp_path.iterdir() if p.suffix == ".json"]
    assert js.name.startswith(f"moe-tiny-{ranks}r-timesliced-")
    data = json.loads(js.read_text())
    assert "time_sliced" in data["header"]
    rows = data["rows"]
    assert {(row["backend"], row["tokens_per_rank"]) for row in rows} == {(b, t) for b in ("staged", "fused")
                                                                          for t in (1, 33)}
    for row in rows:
        assert row["time_us"] and row["time_us"] > 0 and "failed" not in row["note"], row
    r = subprocess.run(cmd + ["--backend", "staged,torch-fp8"], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "torch-fp8 need one GPU per rank" in r.stderr
