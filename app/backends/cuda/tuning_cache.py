"""The tuning cache `best` reads: one JSON file per GPU name and driver, a tuning per device count in it
(no pycuda, no measuring here).

It lives in the user cache dir (platformdirs; $NBODY_CACHE_DIR overrides) and records the kernel-source
hash (every kernels/*.cu and *.cuh, the default nvcc options and every record's own). A file whose GPU,
driver or source hash does not match, or that cannot be parsed, is stale: `best` ignores it (one log
line, then a default) and the next `nbody-live tune` (app/backends/cuda/tune.py) rewrites it.

Layout (schema nbody-live-tune/2):

    {"schema": "nbody-live-tune/2", "gpu", "driver", "compute_capability", "source_hash",
     "tunings": {"1": TUNE RESULT, "2": TUNE RESULT, ...}}        # keyed by the device count K

A tune result is what one `nbody-live tune [--gpus K]` run measured, whole (tune.py returns it and
`tune --json` writes it): its own schema, GPU, driver and source hash, "gpus" (K), "best" (the entry per
N: {n, variant, tunables, ...}), "measurements", .... `best` on one GPU reads the tuning "1"; under
`--gpus K` the tuning "K" (policies.BestPolicy). A tune run replaces its own device count's tuning and
keeps the others while GPU, driver and source hash match (else they were measured on other sources and
are dropped with the file).

Migration from schema nbody-live-tune/1 (before tunings per device count): such a file is one tune result
of one GPU at the top level (no "gpus", no "tunings"). It is read as the tuning "1", so an old cache stays
valid for one GPU (and for the one-GPU fallback under --gpus K); the next `tune` writes the file as schema
2 with that tuning kept. A tune result of schema 1 (a committed `tune --json`) reads the same way.

    choice, why = lookup(4096, device_facts(0), registry.RECORDS)      # what `best` runs at N = 4096
    choice, why = lookup(4096, device_facts(0), registry.RECORDS, 2)   # ... on 2 GPUs
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from pathlib import Path

from app.core import paths
from app.core.paths import KERNELS

SCHEMA = "nbody-live-tune/2"
SCHEMA_1 = "nbody-live-tune/1"  # one GPU's tune result at the top level: read as the tuning "1"
BAND_OCTAVES = 1.0  # a tuned N serves N within a factor of 2 (and everything above the largest one)


# --- where and what -------------------------------------------------------------------------------------
def cache_dir() -> Path:
    return paths.cache_dir("tune")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "-", text or "unknown").strip("-").lower() or "unknown"


def cache_path(gpu: str, driver: str | None) -> Path:
    return cache_dir() / f"tune-{_slug(gpu)}-{_slug(driver or 'unknown')}.json"


def source_hash(records, kernels: Path = KERNELS) -> str:
    """sha256 of every kernel source and header, the user's kernel files among `records` included, and the
    nvcc options (the default and each record's own): any edit makes the cache stale, and so does loading
    another set of kernel files (a tuning that picked one of them is not for a run without it)."""
    from app.backends.cuda.compile import NVCC_OPTIONS

    h = hashlib.sha256(("options=" + " ".join(NVCC_OPTIONS) + "\n").encode())
    for rec in sorted(records, key=lambda r: r.name):
        options = getattr(rec.policy, "nvcc_options", None)
        if options is not None:
            h.update(f"{rec.source}: {' '.join(options)}\n".encode())
    for path in sorted([*kernels.glob("*.cu"), *kernels.glob("*.cuh")]):
        h.update(f"\0{path.name}\0".encode() + path.read_bytes())
    for rec in sorted(records, key=lambda r: r.name):  # the user's kernel files: tuned with them, valid
        if rec.source is not None and Path(rec.source).is_absolute():  # only with them, as they were
            h.update(f"\0{rec.source}\0".encode() + Path(rec.source).read_bytes())
    return h.hexdigest()


def device_key(facts) -> tuple[str, str | None]:
    """(GPU name, driver version) of a DeviceFacts (or anything with .name and .driver_version)."""
    return str(facts.name), getattr(facts, "driver_version", None)


def gpus_of(result: dict) -> int:
    """The device count a tune result was measured on (schema 1 has none: one GPU)."""
    return int(result.get("gpus", 1))


def on_gpus(k: int) -> str:
    """'1 GPU', '2 GPUs'."""
    return f"{k} GPU" + ("" if k == 1 else "s")


# --- the layout -----------------------------------------------------------------------------------------
HEADER = ("gpu", "driver", "compute_capability", "source_hash")  # the file's, copied from its newest tuning


def _check_tuning(result, where: str) -> dict:
    entries = result.get("best") if isinstance(result, dict) else None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict)
        and isinstance(e.get("n"), int)
        and isinstance(e.get("variant"), str)
        and isinstance(e.get("tunables", {}), dict)
        for e in entries
    ):
        raise ValueError(f"{where}'best' is not a list of {{n, variant, tunables}}")
    if not isinstance(result.get("gpus", 1), int) or gpus_of(result) < 1:
        raise ValueError(f"{where}'gpus' is not a device count >= 1")
    return result


def as_file(data) -> dict:
    """Any tune data in the layout of a schema-2 file (a new dict; the tunings are not copied): a schema-2
    file as it is; a tune result (schema 2, or schema 1: one GPU's) as a file holding only its tuning.
    ValueError saying what is wrong when it is neither."""
    if not isinstance(data, dict) or data.get("schema") not in (SCHEMA, SCHEMA_1):
        raise ValueError(f"schema is not {SCHEMA} (or {SCHEMA_1})")
    if not isinstance(data.get("gpu"), str):
        raise ValueError("no gpu")
    if data["schema"] == SCHEMA and "tunings" in data:
        tunings = data["tunings"]
        if not isinstance(tunings, dict) or not tunings:
            raise ValueError("'tunings' is not a table of tune results by device count")
        for key, result in tunings.items():
            where = f"tunings[{key!r}]: "
            _check_tuning(result, where)
            if key != str(gpus_of(result)):
                raise ValueError(f"{where}measured on {on_gpus(gpus_of(result))}, filed under {key}")
        return dict(data)
    result = _check_tuning(data, "")
    return {"schema": SCHEMA, **{k: data.get(k) for k in HEADER}, "tunings": {str(gpus_of(data)): result}}


# --- reading and writing the cache ----------------------------------------------------------------------
def read_file(gpu: str, driver: str | None, src_hash: str | None) -> tuple[dict | None, str]:
    """(the whole file in schema 2, '') when it exists, parses and matches GPU, driver and source hash
    (a schema-1 file: its one tuning as "1"); else (None, why)."""
    path = cache_path(gpu, driver)
    if not path.is_file():
        return None, f"no tuning cache at {path}"
    try:
        data = as_file(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        return None, f"the tuning cache {path} is corrupt ({e}); ignored until `nbody-live tune` rewrites it"
    if data.get("gpu") != gpu or data.get("driver") != driver:
        return None, f"the tuning cache {path} is for {data.get('gpu')} / driver {data.get('driver')}"
    if data.get("source_hash") != src_hash:
        return None, f"the tuning cache {path} is stale (the kernel sources changed since it was measured)"
    return data, ""


def read_cache(gpu: str, driver: str | None, src_hash: str, gpus: int = 1) -> tuple[dict | None, str]:
    """(the tune result on `gpus` devices, '') from a valid cache file that has one; else (None, why)."""
    data, why = read_file(gpu, driver, src_hash)
    if data is None:
        return None, why
    result = data["tunings"].get(str(gpus))
    if result is None:
        tuned = ", ".join(on_gpus(int(k)) for k in data["tunings"])
        return (
            None,
            f"the tuning cache {cache_path(gpu, driver)} has no tuning on {on_gpus(gpus)} (tuned on {tuned})",
        )
    return result, ""


def write_cache(result: dict, over_kept: bool = False) -> Path:
    """Atomically (app.core.outputs) file the tune result `result` in its GPU's cache as the tuning of its
    device count, keeping the file's tunings of other device counts where it is valid for the same GPU,
    driver and sources; returns the path. `over_kept` (a tune interrupted after some N): its N replace
    those of the tuning of its device count already there, whose other N are kept."""
    from app.core.outputs import atomic_write

    gpu, driver = result["gpu"], result.get("driver")
    kept, _why = read_file(gpu, driver, result.get("source_hash"))
    tunings = dict(kept["tunings"]) if kept is not None else {}
    key = str(gpus_of(result))
    if over_kept and key in tunings:
        tuned = {e["n"] for e in result["best"]}
        best = [e for e in tunings[key]["best"] if e["n"] not in tuned] + result["best"]
        result = {**result, "best": sorted(best, key=lambda e: e["n"])}
    tunings[key] = result
    data = {
        "schema": SCHEMA,
        **{k: result.get(k) for k in HEADER},
        "tunings": {k: tunings[k] for k in sorted(tunings, key=int)},
    }
    path = cache_path(gpu, driver)
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


def lookup(n: int, facts, records, gpus: int = 1) -> tuple[dict | None, str]:
    """(entry, '') for N on this GPU (`gpus` of them) from a valid cache, else (None, why) — `best`'s
    question."""
    gpu, driver = device_key(facts)
    data, why = read_cache(gpu, driver, source_hash(records), gpus)
    if data is None:
        return None, why
    entry = choose(data["best"], n)
    if entry is None:
        tuned = ", ".join(f"{e['n']:,}" for e in data["best"]) or "none"
        where = gpu if gpus == 1 else f"{on_gpus(gpus)} ({gpu})"
        return None, f"no tuned N near N = {n:,} on {where} (tuned: {tuned})"
    return entry, ""
