"""The tuning cache `best` reads: one JSON file per GPU name and driver (no pycuda, no measuring here).

It lives in the user cache dir (platformdirs; $NBODY_CACHE_DIR overrides) and records the kernel-source
hash (every kernels/*.cu and *.cuh, the default nvcc options and every record's own). A file whose GPU,
driver or source hash does not match, or that cannot be parsed, is stale: `best` ignores it (one log
line, then a default) and the next `nbody-live tune` (app/backends/cuda/tune.py) rewrites it.

    choice, why = lookup(4096, device_facts(0), registry.RECORDS)   # what `best` runs at N = 4096
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from app import paths
from app.paths import KERNELS

SCHEMA = "nbody-live-tune/1"
BAND_OCTAVES = 1.0  # a tuned N serves N within a factor of 2 (and everything above the largest one)


# --- where and what -------------------------------------------------------------------------------------
def cache_dir() -> Path:
    return paths.cache_dir("tune")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text or "unknown").strip("-").lower() or "unknown"


def cache_path(gpu: str, driver: str | None) -> Path:
    return cache_dir() / f"tune-{_slug(gpu)}-{_slug(driver or 'unknown')}.json"


def source_hash(records, kernels: Path = KERNELS) -> str:
    """sha256 of every kernel source and header and the nvcc options (the default and each record's
    own): any edit makes the cache stale."""
    from app.backends.cuda.compile import NVCC_OPTIONS

    h = hashlib.sha256(("options=" + " ".join(NVCC_OPTIONS) + "\n").encode())
    for rec in sorted(records, key=lambda r: r.name):
        options = getattr(rec.policy, "nvcc_options", None)
        if options is not None:
            h.update(f"{rec.source}: {' '.join(options)}\n".encode())
    for path in sorted([*kernels.glob("*.cu"), *kernels.glob("*.cuh")]):
        h.update(f"\0{path.name}\0".encode() + path.read_bytes())
    return h.hexdigest()


def device_key(facts) -> tuple[str, str | None]:
    """(GPU name, driver version) of a DeviceFacts (or anything with .name and .driver_version)."""
    return str(facts.name), getattr(facts, "driver_version", None)


# --- reading and writing the cache ----------------------------------------------------------------------
def read_cache(gpu: str, driver: str | None, src_hash: str) -> tuple[dict | None, str]:
    """(cache, '') when the file exists, parses and matches GPU, driver and source hash; else (None, why)."""
    path = cache_path(gpu, driver)
    if not path.is_file():
        return None, f"no tuning cache at {path}"
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
    if data.get("source_hash") != src_hash:
        return None, f"the tuning cache {path} is stale (the kernel sources changed since it was measured)"
    return data, ""


def write_cache(data: dict) -> Path:
    """Atomically (app.outputs) write `data` to its GPU's cache file; returns the path."""
    from app.outputs import atomic_write

    path = cache_path(data["gpu"], data.get("driver"))
    path.parent.mkdir(parents=True, exist_ok=True)  # our own cache folder
    with atomic_write(path, "w", "tuning cache") as f:
        json.dump(data, f, indent=1, default=str)
        f.write("\n")
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


def lookup(n: int, facts, records) -> tuple[dict | None, str]:
    """(entry, '') for N on this GPU from a valid cache, else (None, why) — `best`'s question."""
    gpu, driver = device_key(facts)
    data, why = read_cache(gpu, driver, source_hash(records))
    if data is None:
        return None, why
    entry = choose(data["best"], n)
    if entry is None:
        tuned = ", ".join(f"{e['n']:,}" for e in data["best"]) or "none"
        return None, f"no tuned N near N = {n:,} on {gpu} (tuned: {tuned})"
    return entry, ""
