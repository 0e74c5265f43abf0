"""The `bench` command's engine: force-kernel throughput per kernel and N, as JSON (app.bench_plot draws it).

For each kernel x N: a seeded Plummer sphere, `warmup` untimed steps, then `repeats` single steps whose
force time the backend measured itself (CUDA events around the force launch on the GPU, perf_counter on
the CPU); the median is reported as interactions/s, the interactions being what the force evaluator
counted (StepTimings.interactions: N² for an all-pairs kernel, body-body plus body-cell for a tree), and
GFLOP/s by the 20-flops-per-interaction convention of GPU Gems 3 and the CUDA samples. A kernel that
evaluates fewer pairs than N² also gets the "equivalent all-pairs" rate (StepTimings.pair_equivalent
over the same time) in a field and a column of its own, and its body-cell count; a kernel that reports
its time split per stage (StepTimings.stages: a tree's keys, sort, build, moments, walk) gets the
median of each stage in `stages_median_ms`. With the leapfrog's cached acceleration every
step is exactly one force launch. Kernels that cannot run at an N (over max_n, out of memory, failed
compile) are recorded with the reason, never dropped.

    result = run_bench(CudaBackend, ["naive", "shared"], [4096, 65536])
    write_json(result, "bench/results/h100.json")   # app.bench_plot.plot(result, ...) draws it
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from app.bodies import Bodies
from app.ics import generate
from app.paths import ROOT
from app.physics import Physics
from app.timing import FLOPS_PER_INTERACTION, imbalance, ranks_of, rate

SCHEMA = "nbody-live-bench/1"
GFLOPS_FIELD = f"gflops_at_{FLOPS_PER_INTERACTION}_flops_per_interaction"
# rows of kernels that evaluate fewer pairs than N_targets x N_sources (a tree) also carry the all-pairs
# work of the same answer over the same time, under this name: never mistaken for interactions/s
EQUIVALENT_FIELD = "equivalent_all_pairs_interactions_per_s"
# the force evaluation's split per stage (a tree: keys, sort, build, moments, walk), median ms per step
STAGES_FIELD = "stages_median_ms"
# DESIGN.md: 12 FP32 instructions per interaction, 128 lanes x 132 SMs x 1.98 GHz (H100/H200).
DEFAULT_GPU_FP32_LIMIT = 128 / 12 * 132 * 1.98e9
# DESIGN.md: the NVIDIA CUDA-samples nbody kernel on a lent H200 (fp32, block 256), interactions/s.
CUDA_SAMPLES_H200 = {4096: 120e9, 16384: 495e9, 65536: 1409e9, 131072: 1461e9, 1048576: 1575e9}


# --- initial conditions ---------------------------------------------------------------------------------
def bench_bodies(n: int, seed: int = 42) -> Bodies:
    """The benchmark (and tune) state: app.ics's Plummer sphere, the same bodies for the same n and seed."""
    return generate("plummer", n, seed)


# --- machine facts ----------------------------------------------------------------------------------------
def git_commit() -> dict:
    def run(*args):
        try:
            out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    # A stated commit wins: a copied checkout may come without .git, or with a stale one.
    if os.environ.get("NBODY_GIT_COMMIT"):
        return {"commit": os.environ["NBODY_GIT_COMMIT"], "dirty": None}
    commit = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def device_info(backend) -> dict:
    info = getattr(backend, "device_info", None)
    if callable(info):
        try:
            return dict(info())
        except Exception as e:  # facts are nice to have; the numbers still count
            return {"name": f"unknown ({e})"}
    return {"name": cpu_name(), "cores": os.cpu_count(), "backend": getattr(backend, "name", "?")}


def reference_lines(backend: str, fp32_limit: float | None) -> list[dict]:
    """What a result is compared with, stored in its JSON (`references`) and drawn dashed by the plot:
    `{"label", "interactions_per_s"}` is a constant, `{"label", "points": [[N, rate], ...]}` a series."""
    refs = []
    if fp32_limit:
        refs.append({"label": f"FP32 issue limit {fp32_limit / 1e9:,.0f} G/s (12 FP32 instr./interaction)",
                     "interactions_per_s": fp32_limit})
    elif backend == "cuda":  # the device did not say: DESIGN.md's estimate for the GPUs we are lent
        refs.append({"label": f"FP32 issue limit H100/H200 ≈ {DEFAULT_GPU_FP32_LIMIT / 1e9:,.0f} G/s "
                              "(12 FP32 instr./interaction)", "interactions_per_s": DEFAULT_GPU_FP32_LIMIT})
    if backend == "cuda":
        refs.append({"label": "CUDA samples nbody, H200 (DESIGN.md)",
                     "points": [[n, v] for n, v in sorted(CUDA_SAMPLES_H200.items())]})
    return refs


# --- the benchmark ----------------------------------------------------------------------------------------
def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="run", file=sys.stderr, leave=False)
    except ImportError:
        return None


def run_bench(backend_cls, kernels: list[str], ns: list[int], warmup: int = 3, repeats: int = 10,
              progress: bool = True, physics: Physics | None = None, seed: int = 42) -> dict:
    """Time the force launch of every kernel at every N; returns the JSON-ready result (see module doc)."""
    physics = physics or Physics(integrator="leapfrog")
    repeats = max(int(repeats), 1)
    warmup = max(int(warmup), 0)
    records = {rec.name: rec for rec in backend_cls.kernels()}
    result = {
        "schema": SCHEMA,
        "backend": backend_cls.name,
        "ranks": backend_cls.ranks,
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "git": git_commit(),
        "python": platform.python_version(),
        "host": platform.node(),
        "device": {},
        "physics": physics.as_dict(),
        "seed": seed,
        "warmup": warmup,
        "repeats": repeats,
        "statistic": "median",
        "timing": ("time.perf_counter around each rank's force evaluation of its share; a step's time is "
                   "the slowest rank's" if backend_cls.ranks > 1
                   else "CUDA events around each force launch" if backend_cls.name == "cuda"
                   else "time.perf_counter around each force evaluation"),
        "flops_per_interaction": FLOPS_PER_INTERACTION,
        "fp32_issue_limit_interactions_per_s": None,
        "references": [],
        "results": [],
    }
    reason = backend_cls.why_not()
    bar = _progress(len(kernels) * len(ns), progress and reason is None)
    backend = None
    try:
        if reason is None:
            backend = backend_cls()
            result["device"] = device_info(backend)
            result["fp32_issue_limit_interactions_per_s"] = result["device"].get(
                "fp32_issue_limit_interactions_per_s")
        limit = result["fp32_issue_limit_interactions_per_s"]
        result["references"] = reference_lines(backend_cls.name, limit)
        for name in kernels:
            rec = records.get(name)
            why = reason
            if why is None and rec is None:
                why = f"{name!r} is not a {backend_cls.name} kernel"
            if why is None:
                why = backend_cls.kernel_why_not(name)
            for n in ns:
                entry = {"kernel": name, "n": int(n)}
                if why is None and rec.max_n is not None and n > rec.max_n:
                    entry.update(status="skipped",
                                 reason=f"N = {n:,} is over this kernel's max_n {rec.max_n:,}")
                elif why is not None:
                    entry.update(status="skipped", reason=why)
                else:
                    entry.update(_time_one(backend, name, int(n), physics, warmup, repeats, seed))
                result["results"].append(entry)
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix_str(f"{name} N={n:,}")
    finally:
        if bar is not None:
            bar.close()
        if backend is not None:
            backend.close()
    return result


def _time_one(backend, name: str, n: int, physics: Physics, warmup: int, repeats: int, seed: int) -> dict:
    from app.errors import RuntimeFault

    bodies = bench_bodies(n, seed)
    try:
        backend.load(bodies, physics, kernel=name)
    except (RuntimeFault, MemoryError) as e:
        return {"status": "skipped", "reason": f"load failed: {e}"}
    try:
        for _ in range(warmup):
            backend.step(1)
        steps = [backend.step(1) for _ in range(repeats)]
    except Exception as e:  # recorded, not hidden: the other kernels still run
        return {"status": "failed", "reason": f"{type(e).__name__}: {e}"}
    samples = [float(t.force_ms) for t in steps]
    median = statistics.median(samples)
    if median <= 0:
        return {"status": "failed", "reason": "the backend reported no force time", "samples_ms": samples}
    # what one step's force evaluation did, as its evaluator counted it (a tree's work varies by step)
    interactions = statistics.median_low(t.interactions for t in steps)
    if interactions <= 0:
        return {"status": "failed", "reason": "the backend counted no interactions", "samples_ms": samples}
    ips = rate(interactions, median)
    row = {
        "status": "ok",
        "median_ms": median,
        "min_ms": min(samples),
        "max_ms": max(samples),
        "samples_ms": samples,
        "interactions": interactions,
        "interactions_per_s": ips,
        GFLOPS_FIELD: ips * FLOPS_PER_INTERACTION * 1e-9,
    }
    pairs = statistics.median_low(t.pair_equivalent for t in steps)
    if pairs != interactions:
        row["pair_equivalent"] = pairs
        row[EQUIVALENT_FIELD] = rate(pairs, median)
        row["body_cell"] = statistics.median_low(t.body_cell for t in steps)
    stages = stage_medians([t.stages for t in steps])
    if stages:
        row[STAGES_FIELD] = stages
    row.update(rank_medians([ranks_of(t.extra) for t in steps]))
    return row


def rank_medians(per_step: list[dict[str, list[float]]]) -> dict:
    """Under MPI (app.timing.ranks_of of each step): the median force and exchange ms of each rank, and
    the imbalance of the force medians (max / mean - 1); {} for one process. The row's median_ms is the
    slowest rank's force time of each step."""
    if not per_step or not per_step[0]:
        return {}
    out = {"ranks": len(per_step[0]["force"])}
    for part in ("force", "exchange"):
        out[f"rank_{part}_median_ms"] = [float(v) for v in np.median([s[part] for s in per_step], axis=0)]
    out["rank_imbalance"] = imbalance(out["rank_force_median_ms"])
    return out


def stage_medians(per_step: list[dict[str, float]]) -> dict[str, float]:
    """The median of each stage over the timed steps (StepTimings.stages, in stage order); {} when the
    kernel reports none. Medians of parts need not add up to the median of the whole."""
    names = list(dict.fromkeys(name for stages in per_step for name in stages))
    return {name: statistics.median(stages.get(name, 0.0) for stages in per_step) for name in names}


# --- output -------------------------------------------------------------------------------------------------
def write_json(result: dict, path) -> None:
    """The results as JSON, written atomically (app.outputs); RuntimeFault naming `path` on failure."""
    from app.outputs import atomic_write

    with atomic_write(path, "w", "bench results") as f:
        f.write(json.dumps(result, indent=2, default=_json_default) + "\n")


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, tuple | set):
        return list(obj)
    return str(obj)


def format_table(result: dict) -> str:
    dev = result.get("device") or {}
    head = f"{result.get('backend', '?')} on {dev.get('name', '?')}"
    if dev.get("sm_clock_max_mhz"):
        head += f", SM clock max {dev['sm_clock_max_mhz']:.0f} MHz"
    if dev.get("driver_version"):
        head += f", driver {dev['driver_version']}"
    rows = result.get("results", [])
    # the "equivalent all-pairs" column only when a kernel evaluated fewer pairs than N² (a tree)
    equivalent = any(EQUIVALENT_FIELD in r for r in rows)
    heads = ["median ms", "G inter/s", "GFLOP/s(20)"] + (["eq. all-pairs G/s"] if equivalent else [])

    def line(kernel: str, n: str, cells: list[str], note: str = "") -> str:
        widths = (11, 11, 12, 17)
        text = f"{kernel:<16} {n:>10} " + " ".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=False))
        return text + (f"  {note}" if note else "")

    lines = [head, line("kernel", "N", heads, "note")]
    for r in rows:
        if r.get("status") == "ok":
            ips = r["interactions_per_s"]
            cells = [f"{r['median_ms']:.4f}", f"{ips / 1e9:.2f}", f"{r[GFLOPS_FIELD]:.1f}"]
            if equivalent:
                cells.append(f"{r[EQUIVALENT_FIELD] / 1e9:.2f}" if EQUIVALENT_FIELD in r else "-")
            lines.append(line(r["kernel"], f"{r['n']:,}", cells))
            lines += _detail_lines(r)
        else:
            lines.append(line(r["kernel"], f"{r['n']:,}", ["-"] * len(heads),
                              f"{r.get('status')}: {r.get('reason')}"))
    return "\n".join(lines)


def _detail_lines(r: dict) -> list[str]:
    """Under a row: what its interactions were when not all-pairs, and its time split per stage."""
    out = []
    if EQUIVALENT_FIELD in r:
        cells = r.get("body_cell", 0)
        out.append(f"{'':<16}   {r['interactions'] / r['n']:,.0f} interactions/body (body-body + body-cell, "
                   f"{100 * cells / r['interactions']:.0f}% body-cell): {r['interactions_per_s'] / 1e9:.2f} "
                   f"G/s; equivalent all-pairs N²/t {r[EQUIVALENT_FIELD] / 1e9:.2f} G/s")
    if r.get(STAGES_FIELD):
        split = " · ".join(f"{name} {ms:.3f}" for name, ms in r[STAGES_FIELD].items())
        out.append(f"{'':<16}   stages (median ms): {split}")
    if r.get("ranks"):
        force = " / ".join(f"{v:.3f}" for v in r["rank_force_median_ms"])
        exchange = " / ".join(f"{v:.3f}" for v in r["rank_exchange_median_ms"])
        out.append(f"{'':<16}   {r['ranks']} ranks (median ms per rank): force {force} · exchange {exchange}"
                   f" · imbalance {100 * r['rank_imbalance']:.0f}%")
    return out


def print_table(result: dict) -> None:
    print(format_table(result))


def load_json(path) -> dict:
    return json.loads(Path(path).read_text())
