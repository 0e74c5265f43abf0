"""`nbody-live tune`: measure every fp32 CUDA variant's tunables per N on this GPU; `best` reads the result.

For each N: a seeded Plummer sphere (the bench's); the `fp64` kernel's accelerations as the reference;
then phase 1 times every candidate variant at its default tunables (most promising first) and phase 2
sweeps the tunables (block size, K, q, j-slices, chunk, ...) of the three fastest variants, both within
a time budget. Timing is the bench's: CUDA events around the force launch, median of `repeats` single
steps after a warm-up step. The fastest configuration whose accelerations agree with the reference is
the entry for that N — within 1e-4 max relative error, or within twice the error of `shared` itself
where fp32 summation over N terms makes `shared` miss 1e-4 (N ~ 10^6): a kernel that is fast and wrong
is never chosen, and one as accurate as the reference implementation is not rejected.

The tunables swept are the records' own (typed, app/forces.py) and the settings tried at N come from
each record's launch policy (`policy.candidates`). The cache format and its checks are in
tuning_cache.py.

    result = run_tune(CudaBackend, [4096, 16384, 131072])   # writes the cache, returns the dict
"""

from __future__ import annotations

import datetime as _dt
import logging
import statistics
import time
from collections.abc import Callable

from app.backends.cuda import tuning_cache
from app.backends.cuda.registry import DEFAULT_KERNEL
from app.forces import format_tunables

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # max relative error against float64 (the fp64 kernel) for a configuration to count
# Phase 1 order, most promising first (the first three are timed whatever the budget); records with
# `tuned` set that are not named here come after, in registry order.
PHASE1_ORDER = ("register-blocked", "atomics-n3l", "block-template", "shared-unroll", "shared",
                "shared-ptx-fma", "multi-thread-per-body", "streams-remainder", "warp-shuffle",
                "gpu5-branchy", "naive")


def candidates(records) -> list[str]:
    """The names of the records `tune` sweeps, in phase-1 order."""
    tuned = [r.name for r in records if r.tuned]
    rank = {name: i for i, name in enumerate(PHASE1_ORDER)}
    return sorted(tuned, key=lambda name: rank.get(name, len(rank)))


# --- measuring --------------------------------------------------------------------------------------------
def _measure(backend, repeats: int) -> dict:
    """Median force time (CUDA events) of single steps after one warm-up step."""
    warm = backend.step(1).force_ms
    if warm > 100.0:  # a launch of 0.1 s or more: fewer samples, the median is still meaningful
        repeats = min(repeats, 2)
    steps = [backend.step(1) for _ in range(max(1, repeats))]
    samples = [float(t.force_ms) for t in steps]
    return {"median_ms": statistics.median(samples), "samples_ms": samples,
            "interactions": steps[-1].interactions}


def run_tune(backend_cls, ns: list[int], variants: list[str] | None = None, budget_s: float = 120.0,
             repeats: int = 3, physics=None, seed: int = 42, write: bool = True,
             say: Callable[[str], None] = print) -> dict:
    """Tune every variant at every N within `budget_s` seconds in all; write and return the cache dict."""
    from app.bench import bench_bodies
    from app.physics import Physics, relative_error

    physics = physics or Physics(integrator="leapfrog")
    records = {r.name: r for r in backend_cls.kernels()}
    tunable = candidates(records.values())
    names = [v for v in (variants or tunable) if v in tunable]
    unknown = [v for v in (variants or []) if v not in records]
    if unknown:
        from app.errors import ConfigError

        raise ConfigError(f"tune: unknown kernel(s) {', '.join(unknown)}; cuda kernels: {', '.join(records)}")
    backend = backend_cls()
    facts = backend.device.facts
    gpu, driver = tuning_cache.device_key(facts)
    data = {"schema": tuning_cache.SCHEMA, "gpu": gpu, "driver": driver,
            "source_hash": tuning_cache.source_hash(records.values()),
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
                    backend.set_tunables(**cfg)
                    m = _measure(backend, repeats)
                except Exception as e:  # recorded: one broken variant must not stop the sweep
                    rows.append({"n": n, "variant": name, "tunables": cfg, "status": "failed",
                                 "reason": f"{type(e).__name__}: {e}"})
                    return
                ips = m["interactions"] / (m["median_ms"] * 1e-3) if m["median_ms"] > 0 else 0.0
                rows.append({"n": n, "variant": name, "tunables": cfg, "status": "ok",
                             "interactions_per_s": ips, **m})

            # phase 1: every variant at its defaults (the first three whatever the budget)
            for i, name in enumerate(names):
                if i >= 3 and time.perf_counter() > deadline:
                    rows.append({"n": n, "variant": name, "status": "skipped", "reason": "time budget"})
                    continue
                measure(name, records[name].default_tunables())
            ok = [r for r in rows if r["status"] == "ok"]
            leaders = []
            for r in sorted(ok, key=lambda r: -r["interactions_per_s"]):
                if r["variant"] not in leaders:
                    leaders.append(r["variant"])
            # phase 2: the tunables of the three fastest variants, best first, until the deadline
            for name in leaders[:3]:
                for cfg in records[name].policy.candidates(records[name], n, facts.sms)[1:]:
                    if time.perf_counter() > deadline:
                        break
                    measure(name, cfg)
            winner = _validated_winner(backend, rows, bodies, physics, reference, tolerance, relative_error)
            data["measurements"].extend(rows)
            data.setdefault("references", []).append({"n": n, "tolerance": tolerance, **baseline})
            if winner is not None:
                data["best"].append({k: winner[k] for k in ("n", "variant", "tunables", "interactions_per_s",
                                                            "median_ms", "max_rel_err")})
                say(f"N = {n:>9,}: {winner['variant']} {format_tunables(winner['tunables'])}: "
                    f"{winner['interactions_per_s'] / 1e9:,.0f} G interactions/s "
                    f"({sum(r['status'] == 'ok' for r in rows)} configurations timed)")
            else:
                say(f"N = {n:>9,}: no configuration ran correctly")
    finally:
        backend.close()
    data["elapsed_s"] = round(time.perf_counter() - start, 1)
    if write:
        path = tuning_cache.write_cache(data)
        data["path"] = str(path)
        say(f"wrote {path}")
    return data


def _reference(backend, records, bodies, physics, relative_error) -> tuple:
    """(float64 reference accelerations, tolerance, facts) for one N.

    The reference is the fp64 kernel's (float64 throughout; the CPU's float64 path would take minutes
    at N ~ 10^6), else `shared`'s. The tolerance is 1e-4, or twice `shared`'s own error where fp32
    summation of N terms already costs more than that.
    """
    backend.load(bodies, physics, kernel=DEFAULT_KERNEL)
    base = backend.accelerations()
    if "fp64" not in records:
        return base, TOLERANCE, {"reference": DEFAULT_KERNEL}
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
                    row["variant"], format_tunables(row["tunables"]), worst, tolerance)
    return None

