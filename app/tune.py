"""`nbody-live tune`: measure every fp32 CUDA variant's tunables per N on this GPU; `best` reads the result.

For each N: a seeded Plummer sphere (the bench's); the `fp64` kernel's accelerations as the reference;
then phase 1 times every candidate variant at its default tunables (most promising first) and phase 2
sweeps the tunables (block size, K, q, j-slices, chunk, ...) of the three fastest variants, both within
a time budget. Timing is the bench's: CUDA events around the force launch, median of `repeats` single
steps after a warm-up step. The fastest configuration whose accelerations agree with the reference is
the entry for that N — within 1e-4 max relative error, or within twice the error of `shared` itself
where fp32 summation over N terms makes `shared` miss 1e-4 (N ~ 10^6): a kernel that is fast and wrong
is never chosen, and one as accurate as the reference implementation is not rejected.

The cache is one JSON file per GPU name and driver in the user cache dir (platformdirs;
$NBODY_CACHE_DIR overrides), and records the kernel-source hash (every kernels/*.cu and *.cuh and the
nvcc options). A file whose GPU, driver or source hash does not match, or that cannot be parsed, is
stale: `best` ignores it (one log line, then a default) and the next `tune` rewrites it.

    result = run_tune(CudaBackend, [4096, 16384, 131072])   # writes the cache, returns the dict
    choice, why = lookup(4096, device_facts())               # what `best` runs at N = 4096
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from app.paths import KERNELS

log = logging.getLogger(__name__)

SCHEMA = "nbody-live-tune/1"
TOLERANCE = 1e-4  # max relative error against float64 (the fp64 kernel) for a configuration to count
# The fp32 variants tune considers, most promising first (phase 1 order).
CANDIDATES = ("register-blocked", "atomics-n3l", "block-template", "shared-unroll", "shared",
              "shared-ptx-fma", "multi-thread-per-body", "streams-remainder", "warp-shuffle",
              "gpu5-branchy", "naive")
NEVER = ("best", "fp64", "pair-matrix")  # not candidates: the chooser itself, double, the heatmap one
BAND_OCTAVES = 1.0  # a tuned N serves N within a factor of 2 (and everything above the largest one)


# --- where and what -------------------------------------------------------------------------------------
def cache_dir() -> Path:
    env = os.environ.get("NBODY_CACHE_DIR")
    if env:
        return Path(env) / "tune"
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("nbody-live")) / "tune"
    except ImportError:
        return Path.home() / ".cache" / "nbody-live" / "tune"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text or "unknown").strip("-").lower() or "unknown"


def cache_path(gpu: str, driver: str | None) -> Path:
    return cache_dir() / f"tune-{_slug(gpu)}-{_slug(driver or 'unknown')}.json"


def source_hash(kernels: Path = KERNELS) -> str:
    """sha256 of every kernel source and header and the nvcc options: any edit makes the cache stale."""
    from app.backends.cuda.compile import NVCC_OPTIONS, SOURCE_OPTIONS

    h = hashlib.sha256(("options=" + " ".join(NVCC_OPTIONS) + "\n").encode())
    for name, options in sorted(SOURCE_OPTIONS.items()):
        h.update(f"{name}: {' '.join(options)}\n".encode())
    for path in sorted([*kernels.glob("*.cu"), *kernels.glob("*.cuh")]):
        h.update(f"\0{path.name}\0".encode() + path.read_bytes())
    return h.hexdigest()


def device_key(facts) -> tuple[str, str | None]:
    """(GPU name, driver version) of a DeviceFacts (or anything with .name and .driver_version)."""
    return str(facts.name), getattr(facts, "driver_version", None)


# --- reading and writing the cache ----------------------------------------------------------------------
def read_cache(gpu: str, driver: str | None, src_hash: str | None = None) -> tuple[dict | None, str]:
    """(cache, '') when the file exists, parses and matches GPU, driver and source hash; else (None, why)."""
    path = cache_path(gpu, driver)
    if not path.is_file():
        return None, f"no tuning cache for {gpu} (driver {driver}) at {path}"
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"schema is not {SCHEMA}")
        entries = data.get("best")
        if not isinstance(entries, list) or not all(
                isinstance(e, dict) and isinstance(e.get("n"), int) and isinstance(e.get("variant"), str)
                and isinstance(e.get("tunables", {}), dict) for e in entries):
            raise ValueError("'best' is not a list of {n, variant, tunables}")
    except (OSError, ValueError) as e:
        return None, f"the tuning cache {path} is corrupt ({e}); ignored until `nbody-live tune` rewrites it"
    if data.get("gpu") != gpu or data.get("driver") != driver:
        return None, f"the tuning cache {path} is for {data.get('gpu')} / driver {data.get('driver')}"
    src_hash = src_hash or source_hash()
    if data.get("source_hash") != src_hash:
        return None, f"the tuning cache {path} is stale (the kernel sources changed since it was measured)"
    return data, ""


def write_cache(data: dict) -> Path:
    """Atomically (temp file + rename) write `data` to its GPU's cache file; returns the path."""
    path = cache_path(data["gpu"], data.get("driver"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tune-", suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
    os.replace(tmp, path)
    return path


def choose(entries: list[dict], n: int) -> dict | None:
    """The entry for N: the nearest tuned N within BAND_OCTAVES, or the largest one for N above it."""
    if not entries or n < 1:
        return None
    near = min(entries, key=lambda e: abs(math.log2(n / e["n"])))
    if abs(math.log2(n / near["n"])) <= BAND_OCTAVES:
        return near
    largest = max(entries, key=lambda e: e["n"])
    if n > largest["n"] and largest["n"] >= 65536:  # large N: the asymptotic winner stays the winner
        return largest
    return None


def lookup(n: int, facts) -> tuple[dict | None, str]:
    """(entry, '') for N on this GPU from a valid cache, else (None, why) — `best`'s question."""
    gpu, driver = device_key(facts)
    data, why = read_cache(gpu, driver)
    if data is None:
        return None, why
    entry = choose(data["best"], n)
    if entry is None:
        tuned = ", ".join(f"{e['n']:,}" for e in data["best"]) or "none"
        return None, f"no tuned N near N = {n:,} on {gpu} (tuned: {tuned})"
    return entry, ""


# --- what to try ------------------------------------------------------------------------------------------
def candidate_configs(record, n: int, sms: int) -> list[dict]:
    """Tunable settings to try for one record at N, its defaults first (then a focused sweep)."""
    from app.backends.cuda import registry
    from app.backends.cuda.launch import auto_chunk, auto_slices, slice_plan

    default = registry.default_tunables(record)
    allowed = record.tunables
    configs: list[dict] = [default]

    def add(cfg: dict) -> None:
        full = {**default, **cfg}
        if all(v in allowed.get(k, (v,)) for k, v in full.items()) and full not in configs:
            configs.append(full)

    kind = registry.launch_policy(record).kind
    if kind == "register-blocked":
        for k, b in ((6, 128), (4, 64), (6, 64), (2, 64), (4, 256), (2, 128), (6, 256), (1, 64), (4, 128)):
            auto = auto_slices(n, b, k, sms)
            near = {auto}
            for s in (auto // 2, auto * 2, auto + auto // 2):
                if s >= 1:
                    near.add(slice_plan(n, b, s)[1])
            for s in sorted(near):
                choice = 0 if s == auto else s
                if choice in allowed["slices"]:
                    add({"k": k, "block_size": b, "slices": choice})
    elif kind == "n3l":
        for ki in (4, 2):
            auto = auto_chunk(n, ki, sms)
            for chunk in (0, max(1, auto // 2), auto * 2, max(1, auto // 4)):
                if chunk in allowed["chunk"]:
                    add({"ki": ki, "chunk": chunk})
        add({"block_size": 64})
    elif kind == "multi-thread":
        for q in (2, 8, 16, 32, 4):
            for b in (256, 128, 512):
                add({"q": q, "block_size": b})
    else:
        for b in (128, 512, 64, 1024, 256):
            add({"block_size": b})
    return configs


# --- measuring --------------------------------------------------------------------------------------------
def _measure(backend, repeats: int) -> dict:
    """Median force time (CUDA events) of single steps after one warm-up step."""
    warm = backend.step(1).force_ms
    if warm > 100.0:  # a launch of 0.1 s or more: fewer samples, the median is still meaningful
        repeats = min(repeats, 2)
    samples = [float(backend.step(1).force_ms) for _ in range(max(1, repeats))]
    median = statistics.median(samples)
    return {"median_ms": median, "samples_ms": samples}


def run_tune(backend_cls, ns: list[int], variants: list[str] | None = None, budget_s: float = 120.0,
             repeats: int = 3, physics=None, seed: int = 42, write: bool = True,
             say: Callable[[str], None] = print) -> dict:
    """Tune every variant at every N within `budget_s` seconds in all; write and return the cache dict."""
    from app.bench import bench_bodies
    from app.physics import Physics, relative_error

    physics = physics or Physics(integrator="leapfrog")
    records = {r.name: r for r in backend_cls.kernels()}
    names = [v for v in (variants or CANDIDATES) if v in records and v not in NEVER]
    unknown = [v for v in (variants or []) if v not in records]
    if unknown:
        from app.errors import ConfigError

        raise ConfigError(f"tune: unknown kernel(s) {', '.join(unknown)}; cuda kernels: {', '.join(records)}")
    backend = backend_cls()
    facts = backend._facts
    gpu, driver = device_key(facts)
    data = {"schema": SCHEMA, "gpu": gpu, "driver": driver, "source_hash": source_hash(),
            "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "physics": physics.as_dict(), "seed": seed, "repeats": repeats, "budget_s": budget_s,
            "tolerance": TOLERANCE, "best": [], "measurements": []}
    start = time.perf_counter()
    try:
        ns = sorted(set(int(n) for n in ns))
        for index, n in enumerate(ns):
            left = budget_s - (time.perf_counter() - start)
            deadline = time.perf_counter() + max(left / (len(ns) - index), 1.0)
            bodies = bench_bodies(n, seed)
            reference, tolerance, baseline = _reference(backend, records, bodies, physics, relative_error)
            rows: list[dict] = []

            def measure(name: str, cfg: dict, n=n, bodies=bodies, rows=rows) -> None:
                try:
                    if backend.kernel != name or backend.n != n:
                        backend.load(bodies, physics, kernel=name)
                    backend.clear_tunables()
                    backend.set_tunables(**{k: v for k, v in cfg.items() if k in records[name].tunables})
                    m = _measure(backend, repeats)
                except Exception as e:  # recorded: one broken variant must not stop the sweep
                    rows.append({"n": n, "variant": name, "tunables": cfg, "status": "failed",
                                 "reason": f"{type(e).__name__}: {e}"})
                    return
                ips = n * n / (m["median_ms"] * 1e-3) if m["median_ms"] > 0 else 0.0
                rows.append({"n": n, "variant": name, "tunables": cfg, "status": "ok",
                             "interactions_per_s": ips, **m})

            # phase 1: every variant at its defaults (the first three whatever the budget)
            for i, name in enumerate(names):
                if i >= 3 and time.perf_counter() > deadline:
                    rows.append({"n": n, "variant": name, "status": "skipped", "reason": "time budget"})
                    continue
                measure(name, candidate_configs(records[name], n, facts.sms)[0])
            ok = [r for r in rows if r["status"] == "ok"]
            leaders = []
            for r in sorted(ok, key=lambda r: -r["interactions_per_s"]):
                if r["variant"] not in leaders:
                    leaders.append(r["variant"])
            # phase 2: the tunables of the three fastest variants, best first, until the deadline
            for name in leaders[:3]:
                for cfg in candidate_configs(records[name], n, facts.sms)[1:]:
                    if time.perf_counter() > deadline:
                        break
                    measure(name, cfg)
            winner = _validated_winner(backend, rows, bodies, physics, reference, tolerance, relative_error)
            data["measurements"].extend(rows)
            data.setdefault("references", []).append({"n": n, "tolerance": tolerance, **baseline})
            if winner is not None:
                data["best"].append({k: winner[k] for k in ("n", "variant", "tunables", "interactions_per_s",
                                                            "median_ms", "max_rel_err")})
                say(f"N = {n:>9,}: {winner['variant']} {_fmt(winner['tunables'])}: "
                    f"{winner['interactions_per_s'] / 1e9:,.0f} G interactions/s "
                    f"({sum(r['status'] == 'ok' for r in rows)} configurations timed)")
            else:
                say(f"N = {n:>9,}: no configuration ran correctly")
    finally:
        backend.close()
    data["elapsed_s"] = round(time.perf_counter() - start, 1)
    if write:
        path = write_cache(data)
        data["path"] = str(path)
        say(f"wrote {path}")
    return data


def _reference(backend, records, bodies, physics, relative_error) -> tuple:
    """(float64 reference accelerations, tolerance, facts) for one N.

    The reference is the fp64 kernel's (float64 throughout; the CPU's float64 path would take minutes
    at N ~ 10^6), else `shared`'s. The tolerance is 1e-4, or twice `shared`'s own error where fp32
    summation of N terms already costs more than that.
    """
    from app.backends.cuda import registry

    backend.load(bodies, physics, kernel=registry.DEFAULT_KERNEL)
    base = backend.accelerations()
    if "fp64" not in records:
        return base, TOLERANCE, {"reference": registry.DEFAULT_KERNEL}
    backend.load(bodies, physics, kernel="fp64")
    reference = backend.accelerations()
    base_err, _ = relative_error(base, reference)
    tolerance = max(TOLERANCE, 2.0 * base_err)
    return reference, tolerance, {"reference": "fp64", "shared_max_rel_err": base_err}


def _validated_winner(backend, rows, bodies, physics, reference, tolerance, relative_error) -> dict | None:
    """The fastest row whose accelerations agree with the reference (tries the five fastest)."""
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -r["interactions_per_s"])
    for row in ok[:5]:
        try:
            backend.load(bodies, physics, kernel=row["variant"])
            backend.clear_tunables()
            backend.set_tunables(**row["tunables"])
            worst, _ = relative_error(backend.accelerations(), reference)
        except Exception as e:
            row["validation"] = f"failed: {type(e).__name__}: {e}"
            continue
        row["max_rel_err"] = worst
        if worst <= tolerance:
            return row
        log.warning("tune: %s %s: max rel err %.2e against float64 (allowed %.2e): not chosen",
                    row["variant"], _fmt(row["tunables"]), worst, tolerance)
    return None


def _fmt(tun: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(tun.items()))
