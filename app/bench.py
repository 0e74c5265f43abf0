"""The `bench` command's engine: force-kernel throughput per kernel and N, as JSON and a PNG plot.

For each kernel x N: a seeded Plummer sphere, `warmup` untimed steps, then `repeats` single steps whose
force time the backend measured itself (CUDA events around the force launch on the GPU, perf_counter on
the CPU); the median is reported as interactions/s, the interactions being what the force evaluator
counted (StepTimings.interactions: N² for an all-pairs kernel, body-body plus body-cell for a tree), and
GFLOP/s by the 20-flops-per-interaction convention of GPU Gems 3 and the CUDA samples. A kernel that
evaluates fewer pairs than N² also gets the "equivalent all-pairs" rate (StepTimings.pair_equivalent
over the same time) in a field and a column of its own. With the leapfrog's cached acceleration every
step is exactly one force launch. Kernels that cannot run at an N (over max_n, out of memory, failed
compile) are recorded with the reason, never dropped.

    result = run_bench(CudaBackend, ["naive", "shared"], [4096, 65536])
    write_json(result, "bench/results/h100.json"); plot(result, "bench/results/h100.png")
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from app.bodies import Bodies
from app.paths import ROOT
from app.physics import Physics
from app.timing import FLOPS_PER_INTERACTION, rate

SCHEMA = "nbody-live-bench/1"
GFLOPS_FIELD = f"gflops_at_{FLOPS_PER_INTERACTION}_flops_per_interaction"
# rows of kernels that evaluate fewer pairs than N_targets x N_sources (a tree) also carry the all-pairs
# work of the same answer over the same time, under this name: never mistaken for interactions/s
EQUIVALENT_FIELD = "equivalent_all_pairs_interactions_per_s"
# DESIGN.md: 12 FP32 instructions per interaction, 128 lanes x 132 SMs x 1.98 GHz (H100/H200).
DEFAULT_GPU_FP32_LIMIT = 128 / 12 * 132 * 1.98e9
# DESIGN.md: the NVIDIA CUDA-samples nbody kernel on a lent H200 (fp32, block 256), interactions/s.
CUDA_SAMPLES_H200 = {4096: 120e9, 16384: 495e9, 65536: 1409e9, 131072: 1461e9, 1048576: 1575e9}


# --- initial conditions ---------------------------------------------------------------------------------
def bench_bodies(n: int, seed: int = 42) -> Bodies:
    """The benchmark state: app.ics's Plummer sphere, or a local Hénon-method one if that is missing."""
    try:
        from app.ics import generate

        return generate("plummer", n, seed)
    except ImportError:
        return plummer(n, seed)


def plummer(n: int, seed: int = 42) -> Bodies:
    """Plummer sphere in N-body units (Aarseth, Hénon & Wielen 1974), equal masses, centre-of-mass frame."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(1e-6, 0.999, n)
    r = 1.0 / np.sqrt(x ** (-2.0 / 3.0) - 1.0)
    pos = r[:, None] * _unit_vectors(rng, n)
    q = np.empty(n)
    todo = np.arange(n)
    while todo.size:  # von Neumann rejection for q = v / v_escape, g(q) = q² (1 - q²)^3.5
        qq = rng.uniform(0, 1, todo.size)
        yy = rng.uniform(0, 0.1, todo.size)
        ok = yy < qq**2 * (1 - qq**2) ** 3.5
        q[todo[ok]] = qq[ok]
        todo = todo[~ok]
    speed = q * np.sqrt(2.0) * (1.0 + r**2) ** -0.25
    vel = speed[:, None] * _unit_vectors(rng, n)
    pos *= 3 * math.pi / 16
    vel /= math.sqrt(3 * math.pi / 16)
    pos -= pos.mean(axis=0)
    vel -= vel.mean(axis=0)
    return Bodies.from_arrays(pos, vel, np.full(n, 1.0 / n), source=f"plummer(n={n}, seed={seed})")


def _unit_vectors(rng, n):
    z = rng.uniform(-1, 1, n)
    phi = rng.uniform(0, 2 * math.pi, n)
    s = np.sqrt(1 - z * z)
    return np.stack([s * np.cos(phi), s * np.sin(phi), z], axis=1)


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


def _cpu_name() -> str:
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
    return {"name": _cpu_name(), "cores": os.cpu_count(), "backend": getattr(backend, "name", "?")}


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
        "timing": ("CUDA events around each force launch" if backend_cls.name == "cuda"
                   else "time.perf_counter around each force evaluation"),
        "flops_per_interaction": FLOPS_PER_INTERACTION,
        "fp32_issue_limit_interactions_per_s": None,
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
    return row


# --- output -------------------------------------------------------------------------------------------------
def write_json(result: dict, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")


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
        else:
            lines.append(line(r["kernel"], f"{r['n']:,}", ["-"] * len(heads),
                              f"{r.get('status')}: {r.get('reason')}"))
    return "\n".join(lines)


def print_table(result: dict) -> None:
    print(format_table(result))


def _series(result: dict) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in result.get("results", []):
        if r.get("status") == "ok":
            series.setdefault(r["kernel"], []).append((r["n"], r["interactions_per_s"]))
    return {k: sorted(v) for k, v in series.items()}


def _limit(result: dict) -> tuple[float | None, str]:
    limit = result.get("fp32_issue_limit_interactions_per_s")
    if limit:
        return float(limit), f"FP32 issue limit {limit / 1e9:,.0f} G/s (12 FP32 instr./interaction)"
    if result.get("backend") == "cuda":
        g = DEFAULT_GPU_FP32_LIMIT / 1e9
        return DEFAULT_GPU_FP32_LIMIT, f"FP32 issue limit H100/H200 ≈ {g:,.0f} G/s (12 FP32 instr./inter.)"
    return None, ""


def _title(result: dict) -> str:
    dev = (result.get("device") or {}).get("name") or result.get("backend", "")
    date = str(result.get("date", ""))[:10]
    commit = ((result.get("git") or {}).get("commit") or "")[:8]
    return f"NBody Live force kernels: {dev}  {date}  {commit}".rstrip()


def plot(result: dict, png_path, engine: str = "auto") -> Path:
    """Log-log interactions/s vs N, one line per kernel, the FP32 issue limit dashed; returns the path.

    engine: 'matplotlib', 'pillow', or 'auto' (matplotlib when importable).
    """
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    if engine in ("auto", "matplotlib"):
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot  # noqa: F401
        except ImportError:
            if engine == "matplotlib":
                raise
        else:
            _plot_matplotlib(result, png_path)
            return png_path
    _plot_pillow(result, png_path)
    return png_path


def _plot_matplotlib(result: dict, png_path: Path) -> None:
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, ax = plt.subplots(figsize=(10, 6.4), dpi=100)
    # Up to 20 distinct colours, and a marker cycle on top, so 14 kernels never share a look.
    colors = plt.get_cmap("tab20").colors
    markers = "os^vDP*Xh<>p"
    for k, (name, pts) in enumerate(_series(result).items()):
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=markers[k % len(markers)], linewidth=2,
                color=colors[k % len(colors)], label=name)
    if result.get("backend") == "cuda":
        ref = sorted(CUDA_SAMPLES_H200.items())
        ax.plot([p[0] for p in ref], [p[1] for p in ref], linestyle=":", color="0.45", marker=".",
                label="CUDA samples nbody, H200 (DESIGN.md)")
    limit, label = _limit(result)
    if limit:
        ax.axhline(limit, linestyle="--", color="crimson", linewidth=1.5, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ys = [v for pts in _series(result).values() for _, v in pts] + ([limit] if limit else [])
    if ys:
        ax.set_ylim(min(ys) / 2, max(ys) * 4)  # room above the limit line for the legend
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _pos: _n_label(int(round(v)))))
    ax.set_xlabel("N (bodies)")
    ax.set_ylabel("interactions / s")
    ax.set_title(_title(result), fontsize=11)
    ax.grid(True, which="major", alpha=0.35)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path)
    plt.close(fig)


# --- the Pillow plot (no matplotlib needed) ---------------------------------------------------------------
_COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (148, 103, 189), (140, 86, 75), (227, 119, 194),
           (23, 190, 207), (188, 189, 34)]


def _si(value: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= scale:
            v = value / scale
            return f"{v:.0f}{suffix}" if v >= 1 and abs(v - round(v)) < 1e-9 else f"{v:g}{suffix}"
    return f"{value:g}"


def _n_label(n: int) -> str:
    if n >= 2**20 and n % 2**20 == 0:
        return f"{n >> 20}Mi"
    if n >= 1024 and n % 1024 == 0:
        return f"{n >> 10}Ki"
    return str(n)


def _font(size: int):
    from PIL import ImageFont

    for name in ("DejaVuSans.ttf", "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"):
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            pass
    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1
        return ImageFont.load_default()


def _plot_pillow(result: dict, png_path: Path) -> None:
    from PIL import Image, ImageDraw

    width, height = 1000, 640
    left, right, top, bottom = 90, 30, 50, 70
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    font, small, title_font = _font(14), _font(12), _font(15)
    series = _series(result)
    limit, limit_label = _limit(result)
    ref = sorted(CUDA_SAMPLES_H200.items()) if result.get("backend") == "cuda" else []
    xs = [n for pts in series.values() for n, _ in pts] + [n for n, _ in ref]
    ys = [v for pts in series.values() for _, v in pts] + [v for _, v in ref] + ([limit] if limit else [])
    if not xs:
        xs = [n for n in (r.get("n") for r in result.get("results", [])) if n] or [1, 1024]
    if not ys:
        ys = [1e6, 1e9]
    x0, x1 = math.log2(min(xs)) - 0.5, math.log2(max(xs)) + 0.5
    y0, y1 = math.floor(math.log10(min(ys)) - 0.05), math.ceil(math.log10(max(ys)) + 0.05)
    if y1 - y0 < 1:
        y1 = y0 + 1
    pw, ph = width - left - right, height - top - bottom

    def px(n):
        return left + (math.log2(n) - x0) / (x1 - x0) * pw

    def py(v):
        return top + (1 - (math.log10(v) - y0) / (y1 - y0)) * ph

    # grid and ticks
    for e in range(int(y0), int(y1) + 1):
        y = py(10.0**e)
        d.line([(left, y), (left + pw, y)], fill=(225, 225, 225))
        label = _si(10.0**e)
        tw = d.textlength(label, font=small)
        d.text((left - 8 - tw, y - 7), label, fill="black", font=small)
    for k in range(math.ceil(x0), math.floor(x1) + 1):
        n = 2**k
        x = px(n)
        d.line([(x, top), (x, top + ph)], fill=(240, 240, 240) if k % 2 else (225, 225, 225))
        if k % 2 == 0 or x1 - x0 < 8:
            label = _n_label(n)
            tw = d.textlength(label, font=small)
            d.text((x - tw / 2, top + ph + 6), label, fill="black", font=small)
    d.rectangle([left, top, left + pw, top + ph], outline="black")
    d.text((left + pw / 2 - d.textlength("N (bodies)", font=font) / 2, height - 32), "N (bodies)",
           fill="black", font=font)
    ylabel = Image.new("RGBA", (200, 20), (255, 255, 255, 0))
    ImageDraw.Draw(ylabel).text((0, 0), "interactions / s", fill="black", font=font)
    ylabel = ylabel.rotate(90, expand=True)
    img.paste(ylabel, (8, top + ph // 2 - 100), ylabel)
    d.text((left, 16), _title(result), fill="black", font=title_font)

    legend: list[tuple[str, tuple, str]] = []
    if limit:
        y = py(limit)
        x = left
        while x < left + pw:  # dashed
            d.line([(x, y), (min(x + 10, left + pw), y)], fill=(200, 30, 45), width=2)
            x += 16
        legend.append((limit_label, (200, 30, 45), "dash"))
    if ref:
        pts = [(px(n), py(v)) for n, v in ref]
        for a, b in zip(pts, pts[1:], strict=False):
            _dotted(d, a, b, (120, 120, 120))
        for p in pts:
            d.ellipse([p[0] - 2, p[1] - 2, p[0] + 2, p[1] + 2], fill=(120, 120, 120))
        legend.append(("CUDA samples nbody, H200 (DESIGN.md)", (120, 120, 120), "dot"))
    for i, (name, pts) in enumerate(series.items()):
        color = _COLORS[i % len(_COLORS)]
        xy = [(px(n), py(v)) for n, v in pts]
        if len(xy) > 1:
            d.line(xy, fill=color, width=3, joint="curve")
        for p in xy:
            d.ellipse([p[0] - 4, p[1] - 4, p[0] + 4, p[1] + 4], fill=color, outline="white")
        legend.append((name, color, "line"))
    if legend:
        lw = max(d.textlength(t, font=small) for t, _, _ in legend) + 50
        lx, ly = left + 12, top + 12
        d.rectangle([lx, ly, lx + lw, ly + 8 + 18 * len(legend)], fill="white", outline=(160, 160, 160))
        for j, (text, color, style) in enumerate(legend):
            yy = ly + 13 + 18 * j
            if style == "dash":
                d.line([(lx + 8, yy), (lx + 18, yy)], fill=color, width=2)
                d.line([(lx + 24, yy), (lx + 34, yy)], fill=color, width=2)
            elif style == "dot":
                _dotted(d, (lx + 8, yy), (lx + 34, yy), color)
            else:
                d.line([(lx + 8, yy), (lx + 34, yy)], fill=color, width=3)
            d.text((lx + 42, yy - 7), text, fill="black", font=small)
    skipped = [r for r in result.get("results", []) if r.get("status") != "ok"]
    if skipped:
        d.text((left + pw - 200, top + ph - 20), f"{len(skipped)} run(s) skipped: see JSON",
               fill=(120, 120, 120), font=small)
    img.save(png_path)


def _dotted(d, a, b, color) -> None:
    length = math.hypot(b[0] - a[0], b[1] - a[1])
    steps = max(int(length / 6), 1)
    for s in range(0, steps, 2):
        t0, t1 = s / steps, min((s + 1) / steps, 1.0)
        d.line([(a[0] + (b[0] - a[0]) * t0, a[1] + (b[1] - a[1]) * t0),
                (a[0] + (b[0] - a[0]) * t1, a[1] + (b[1] - a[1]) * t1)], fill=color, width=2)


def load_json(path) -> dict:
    return json.loads(Path(path).read_text())
