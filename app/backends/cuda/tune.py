"""`nbody-live tune`: measure every fp32 CUDA variant's tunables per N on this GPU (or on K of them);
`best` reads the result.

For each N: a seeded Plummer sphere (the bench's); the `fp64` kernel's accelerations as the reference;
then phase 1 times every candidate variant at its default tunables (most promising first) and phase 2
sweeps the tunables (block size, K, q, j-slices, chunk, ...) of the three fastest variants, both within
a time budget (every variant is compiled first, outside it). Timing is the bench's: CUDA events around
the force launch, median of single steps after a warm-up step — `repeats` of them, more where launches
are short (`repeats_for`). Then the choice is made robust to launch noise (`final_order`): the leaders
within FINAL_MARGIN of the fastest are timed again in FINAL_ROUNDS interleaved rounds, each on a fresh
load, and ranked by the median of their round medians; a variant at its defaults (what its own bench row
runs) goes ahead of a faster tuned configuration within NOISE of it. The first configuration in that
order whose accelerations agree with the reference is the entry for that N — within 1e-4 max relative
error, or within twice the error of `shared` itself where fp32 summation over N terms makes `shared` miss
1e-4 (N ~ 10^6): a kernel that is fast and wrong is never chosen, and one as accurate as the reference
implementation is not rejected.

The tunables swept are the records' own (typed, app/engine/forces.py) and the settings tried at N come from
each record's launch policy (`policy.candidates`). The cache format and its checks are in
tuning_cache.py.

On K GPUs (`tune --gpus K`: the backend class is multi_backend_class's, app/backends/multi.py) the same
phases, check and ranking run through the multi-device driver, each variant split as its record says
(app/parallel/decomposition.py: a share of the targets, or a slice of atomics-n3l's pair tiles): a step's time
is the slowest device's force time plus the exchange that completes it (StepTimings.exchange_ms), what
`bench --gpus` scaling compares, so the winner is what scales on K devices, not what is fastest on one.
The reference, the device facts and the source hash come from one GPU of the base backend (GPU 0; the
fp64 kernel does not run on several GPUs); the accuracy check is of the K devices' accelerations. The
result is cached as the tuning on K GPUs, beside the others.

    result = run_tune(CudaBackend, [4096, 16384, 131072])   # writes the cache, returns the dict
    result = run_tune(multi_backend_class(CudaBackend, 2), [1048576])   # the tuning on 2 GPUs
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
import statistics
import time
from collections.abc import Callable

from app.backends.cuda import heuristic, tuning_cache
from app.core.errors import ConfigError, RuntimeFault
from app.engine.forces import format_tunables, with_role
from app.parallel.decomposition import of as decomposition_of

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # max relative error against float64 (the fp64 kernel) for a configuration to count
# Short launches are noisy (at N = 4,096 a launch takes ~25 µs, and one bench saw the same configuration
# differ by 19% between two loads): each configuration's timed launches add up to MIN_TIMED_MS or more,
# with at most MAX_REPEATS launches.
MIN_TIMED_MS = 20.0
MAX_REPEATS = 50
# The final decision: the leaders within FINAL_MARGIN of the fastest (at most FINALISTS) are timed again in
# FINAL_ROUNDS interleaved rounds, each on a fresh load, where those rounds cost FINAL_MAX_S or less (at
# N = 1 Mi a launch takes 0.4 s and three samples already agree within 0.1%).
FINAL_MARGIN = 0.10
FINALISTS = 4
FINAL_ROUNDS = 5
FINAL_MAX_S = 3.0
NOISE = 0.03  # within 3% of the fastest, a variant at its defaults wins over a tuned configuration


def candidates(records) -> list[str]:
    """The names of the records `tune` sweeps, in phase-1 order: each record's `tune_rank`, most promising
    first (the first three are timed whatever the budget); swept records without one come after, in
    registry order."""
    tuned = [r for r in records if r.tuned]
    last = len(tuned)
    return [r.name for r in sorted(tuned, key=lambda r: last if r.tune_rank is None else r.tune_rank)]


# --- measuring --------------------------------------------------------------------------------------------
def repeats_for(launch_ms: float, repeats: int) -> int:
    """Timed launches for a configuration whose warm-up launch took `launch_ms`: `repeats`, or enough to
    add up to MIN_TIMED_MS (at most MAX_REPEATS); 2 where one launch takes 0.1 s or more."""
    if launch_ms > 100.0:  # the median of two is still meaningful, and a 1 Mi sweep stays in budget
        return min(repeats, 2)
    enough = math.ceil(MIN_TIMED_MS / launch_ms) if launch_ms > 0 else MAX_REPEATS
    return max(1, repeats, min(MAX_REPEATS, enough))


def step_ms(timings) -> float:
    """What one step costs in the ranking: the force time (CUDA events; on several devices the slowest
    one's) plus the exchange that completes it (0 on one device), as `bench --gpus` scaling compares."""
    return float(timings.force_ms) + float(timings.exchange_ms)


def _measure(backend, repeats: int) -> dict:
    """Median step time (`step_ms`) of single steps after one warm-up step; on several devices also the
    medians of its force and exchange parts (of this timing: the final rounds re-time median_ms only)."""
    repeats = repeats_for(step_ms(backend.step(1)), repeats)
    steps = [backend.step(1) for _ in range(repeats)]
    samples = [step_ms(t) for t in steps]
    out = {
        "median_ms": statistics.median(samples),
        "samples_ms": samples,
        "interactions": steps[-1].interactions,
    }
    if steps[-1].devices:  # what the time of a step over several devices is made of
        out["force_median_ms"] = statistics.median(float(t.force_ms) for t in steps)
        out["exchange_median_ms"] = statistics.median(float(t.exchange_ms) for t in steps)
    return out


def run_tune(
    backend_cls,
    ns: list[int],
    variants: list[str] | None = None,
    budget_s: float = 120.0,
    repeats: int = 3,
    physics=None,
    seed: int = 42,
    write: bool = True,
    say: Callable[[str], None] = print,
    on_n: Callable[[dict], None] | None = None,
) -> dict:
    """Tune every variant at every N within `budget_s` seconds in all; write (as the tuning of its device
    count) and return the result. `backend_cls`: one GPU's backend, or its form over K devices
    (multi_backend_class: `base` and `k`), see the module doc. `on_n(result)` after each N (its
    "complete" false until the last): what the command keeps as it goes. Interrupted (KeyboardInterrupt)
    or stopped by a RuntimeFault (its --json on a full disk), both raised on, the N finished are filed
    over the cached tuning of the same device count, its other N kept."""
    from app.model.ics import bench_bodies
    from app.model.physics import Physics, relative_error

    physics = physics or Physics(integrator="leapfrog")
    devices = int(backend_cls.k)
    one_cls = backend_cls.base or backend_cls  # one device: facts, the reference, the source hash
    records = {r.name: r for r in one_cls.kernels()}
    names = _variants(backend_cls, records, variants)
    one = one_cls()
    try:
        backend = backend_cls() if devices > 1 else one
    except BaseException:
        one.close()
        raise
    facts = one.device.facts
    on = f" on {tuning_cache.on_gpus(devices)}" if devices > 1 else ""
    if devices > 1:
        say(
            f"timing{on} through the multi-device driver (as `run --gpus {devices}` runs); the float64 "
            f"reference on one GPU"
        )
    data = _result_head(facts, records, devices, physics, seed, repeats, budget_s)
    begun = time.perf_counter()
    data["complete"] = False
    try:
        ns = sorted(set(int(n) for n in ns))
        _compile_first(backend, names, bench_bodies(min(ns), seed), physics, say)
        say(_plan_line(len(names), ns, budget_s))
        start = time.perf_counter()  # the budget is for timing: compiling (minutes when cold) is not in it
        for index, n in enumerate(ns):
            bodies = bench_bodies(n, seed)
            reference, tolerance, baseline = _reference(one, records, bodies, physics, relative_error)
            left = budget_s - (time.perf_counter() - start)
            deadline = time.perf_counter() + max(left / (len(ns) - index), 1.0)
            sweep = _Sweep(backend, records, physics, repeats, devices)
            rows = sweep.at(n, bodies, names, facts.sms, deadline)
            order = final_order(rows, records, _retimer(backend, bodies, physics, repeats))
            winner = _validated_winner(backend, order, bodies, physics, reference, tolerance, relative_error)
            data["measurements"].extend(rows)
            data.setdefault("references", []).append({"n": n, "tolerance": tolerance, **baseline})
            _keep_winner(data, winner, n, rows, on, say)
            if on_n is not None:
                on_n(data)
        data["complete"] = True
        data["elapsed_s"] = round(time.perf_counter() - begun, 1)
        if write:
            data["path"] = str(tuning_cache.write_cache(data))
            say(f"wrote {data['path']}")
    except (KeyboardInterrupt, RuntimeFault) as stop:  # what was measured is filed (ms), then it goes on
        if write and data["best"]:
            path = tuning_cache.write_cache(data, over_kept=not data["complete"])
            tuned = ", ".join(f"{e['n']:,}" for e in data["best"])
            kept = "" if data["complete"] else " (its other N as they were)"
            why = "interrupted" if isinstance(stop, KeyboardInterrupt) else "stopped"
            say(f"{why}: the tuning of N = {tuned}{on} is filed in {path}{kept}")
        raise
    finally:
        if backend is not one:
            backend.close()
        one.close()
    return data


def _variants(backend_cls, records: dict, variants: list[str] | None) -> list[str]:
    """The variants to time: those asked for (default: every candidate) that `backend_cls` runs;
    ConfigError naming a kernel that is not a CUDA one."""
    runs = {r.name for r in backend_cls.kernels()}
    tunable = [name for name in candidates(records.values()) if name in runs]
    unknown = [v for v in (variants or []) if v not in records]
    if unknown:
        raise ConfigError(f"tune: unknown kernel(s) {', '.join(unknown)}; cuda kernels: {', '.join(records)}")
    return [v for v in (variants or tunable) if v in tunable]


def _result_head(
    facts, records: dict, devices: int, physics, seed: int, repeats: int, budget_s: float
) -> dict:
    """The tuning's facts before its rows: the GPU and driver, the sources' hash, what was asked."""
    gpu, driver = tuning_cache.device_key(facts)
    return {
        "schema": tuning_cache.SCHEMA,
        "gpu": gpu,
        "driver": driver,
        "compute_capability": heuristic.compute_capability(facts),
        "source_hash": tuning_cache.source_hash(records.values()),
        "gpus": devices,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "physics": physics.as_dict(),
        "seed": seed,
        "repeats": repeats,
        "budget_s": budget_s,
        "tolerance": TOLERANCE,
        "best": [],
        "measurements": [],
    }


class _Sweep:
    """One N's timings on `backend`: phase 1, every variant at its defaults (the first three whatever the
    budget); phase 2, the tunables of the three fastest, best first, until the deadline. A variant that
    fails is recorded with its reason: one broken variant must not stop the sweep."""

    def __init__(self, backend, records: dict, physics, repeats: int, devices: int):
        self.backend, self.records, self.physics = backend, records, physics
        self.repeats, self.devices = repeats, devices

    def at(self, n: int, bodies, names: list[str], sms: int, deadline: float) -> list[dict]:
        rows: list[dict] = []
        for i, name in enumerate(names):
            if i >= 3 and time.perf_counter() > deadline:
                rows.append({"n": n, "variant": name, "status": "skipped", "reason": "time budget"})
                continue
            rows.append(self.measure(n, bodies, name, self.records[name].default_tunables()))
        leaders: list[str] = []
        for r in sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -r["interactions_per_s"]):
            if r["variant"] not in leaders:
                leaders.append(r["variant"])
        for name in leaders[:3]:
            for cfg in self.records[name].policy.candidates(self.records[name], n, sms)[1:]:
                if time.perf_counter() > deadline:
                    break
                rows.append(self.measure(n, bodies, name, cfg))
        return rows

    def measure(self, n: int, bodies, name: str, cfg: dict) -> dict:
        backend = self.backend
        try:
            if backend.kernel != name or backend.n != n:
                backend.load(bodies, self.physics, kernel=name)
            backend.clear_tunables()
            backend.set_tunables(**cfg)
            m = _measure(backend, self.repeats)
        except Exception as e:  # recorded: one broken variant must not stop the sweep
            return {
                "n": n,
                "variant": name,
                "tunables": cfg,
                "status": "failed",
                "reason": f"{type(e).__name__}: {e}",
            }
        ips = m["interactions"] / (m["median_ms"] * 1e-3) if m["median_ms"] > 0 else 0.0
        split = {"split": decomposition_of(self.records[name]).name} if self.devices > 1 else {}
        return {
            "n": n,
            "variant": name,
            "tunables": cfg,
            "status": "ok",
            "interactions_per_s": ips,
            **split,
            **m,
        }


def _keep_winner(data: dict, winner: dict | None, n: int, rows: list[dict], on: str, say) -> None:
    """The winner of N into the result's "best" (what the cache keeps), and one line saying so."""
    if winner is None:
        say(f"N = {n:>9,}{on}: no configuration ran correctly")
        return
    data["best"].append(
        {
            k: winner[k]
            for k in (
                "n",
                "variant",
                "tunables",
                "interactions_per_s",
                "median_ms",
                "max_rel_err",
                "chosen_because",
                "split",
                "force_median_ms",
                "exchange_median_ms",
            )
            if k in winner
        }
    )
    rounds = len(winner.get("round_medians_ms", []))
    split = f" (split by {winner['split']})" if "split" in winner else ""
    say(
        f"N = {n:>9,}{on}: {winner['variant']} {format_tunables(winner['tunables'])}{split}: "
        f"{winner['interactions_per_s'] / 1e9:,.0f} G interactions/s "
        f"({sum(r['status'] == 'ok' for r in rows)} configurations timed"
        + (f"; the leaders again in {rounds} rounds)" if rounds else ")")
    )


def _reference(backend, records, bodies, physics, relative_error) -> tuple:
    """(float64 reference accelerations, tolerance, facts) for one N.

    The reference is the record with the role "reference" (fp64: float64 throughout; the CPU's float64
    path would take minutes at N ~ 10^6), else the "baseline"'s (`shared`). The tolerance is 1e-4, or
    twice the baseline's own error where fp32 summation of N terms already costs more than that.
    """
    baseline = with_role(records.values(), "baseline").name
    backend.load(bodies, physics, kernel=baseline)
    base = backend.accelerations()
    try:
        exact = with_role(records.values(), "reference").name
    except ConfigError:  # (several GPUs run the fp32 records only)
        return base, TOLERANCE, {"reference": baseline}
    backend.load(bodies, physics, kernel=exact)
    reference = backend.accelerations()
    base_err, _ = relative_error(base, reference)
    tolerance = max(TOLERANCE, 2.0 * base_err)
    return reference, tolerance, {"reference": exact, f"{baseline}_max_rel_err": base_err}


def _plan_line(variants: int, ns: list[int], budget_s: float) -> str:
    """What the timing will take: the budget, plus the re-timing of each N's leaders (FINAL_MAX_S at
    most) and their accuracy checks (a few seconds each at N ~ 10^6)."""
    from app.core.eta import duration

    about = budget_s + len(ns) * (FINAL_MAX_S + 3.0)
    return (
        f"timing {variants} variants at N = {', '.join(f'{n:,}' for n in ns)}: about {duration(about)} "
        f"(--budget-s {budget_s:g}, then each N's leaders again); Ctrl-C stops and files the N finished"
    )


def _compile_first(backend, names, bodies, physics, say) -> None:
    """Load every candidate once so that its modules are compiled before the budget's clock starts."""
    say(f"compiling {len(names)} variants (cached after the first run) ...")
    for name in names:
        try:
            backend.load(bodies, physics, kernel=name)
        except Exception as e:  # noqa: BLE001 - the sweep records the failure when it times this variant
            log.info("tune: %s does not load: %s", name, e)


def _retimer(backend, bodies, physics, repeats: int) -> Callable[[dict], float]:
    """A function timing one row's configuration again on a fresh load (median force ms)."""

    def retime(row: dict) -> float:
        backend.load(bodies, physics, kernel=row["variant"])  # fresh buffers: a load's own variance counts
        backend.clear_tunables()
        backend.set_tunables(**row["tunables"])
        return _measure(backend, repeats)["median_ms"]

    return retime


def _at_defaults(row: dict, records: dict) -> bool:
    rec = records[row["variant"]]
    return rec.with_tunables(row["tunables"]) == rec.default_tunables()


def final_order(rows: list[dict], records: dict, retime: Callable[[dict], float]) -> list[dict]:
    """The timed rows, the one to choose first: see the module doc. Re-timed rows get `round_medians_ms`
    and `final_ms`, and `interactions_per_s` and `median_ms` from `final_ms`; `chosen_because` says why
    the first is first."""
    ok = sorted((r for r in rows if r["status"] == "ok"), key=lambda r: -r["interactions_per_s"])
    if not ok:
        return []
    finalists = [r for r in ok if r["interactions_per_s"] >= (1 - FINAL_MARGIN) * ok[0]["interactions_per_s"]]
    finalists = finalists[:FINALISTS]
    cost_s = FINAL_ROUNDS * sum(r["median_ms"] * (len(r["samples_ms"]) + 1) for r in finalists) / 1e3
    if len(finalists) > 1 and cost_s <= FINAL_MAX_S:
        for _ in range(FINAL_ROUNDS):  # interleaved: a drift of the clock or the heat touches every finalist
            for row in list(finalists):
                try:
                    row.setdefault("round_medians_ms", []).append(retime(row))
                except Exception as e:  # noqa: BLE001 - recorded; the others still compete
                    row["status"], row["reason"] = "failed", f"re-timing: {type(e).__name__}: {e}"
                    finalists.remove(row)
        for row in finalists:
            row["final_ms"] = statistics.median(row["round_medians_ms"])
            row["interactions_per_s"] = row["interactions"] / (row["final_ms"] * 1e-3)
            row["median_ms"] = row["final_ms"]
        finalists.sort(key=lambda r: r["final_ms"])
        ok = finalists + [r for r in ok if r not in finalists and r["status"] == "ok"]
    if not ok:
        return []
    within_noise = [r for r in ok if r["median_ms"] <= ok[0]["median_ms"] * (1 + NOISE)]
    plain = next((r for r in within_noise if _at_defaults(r, records)), None)
    if plain is not None and plain is not ok[0]:
        plain["chosen_because"] = (
            f"at its defaults and within {NOISE:.0%} of the fastest "
            f"({ok[0]['variant']} {format_tunables(ok[0]['tunables'])})"
        )
        ok = [plain] + [r for r in ok if r is not plain]
    return ok


def _validated_winner(backend, order, bodies, physics, reference, tolerance, relative_error) -> dict | None:
    """The first row of `order` whose accelerations agree with the reference (tries the first five)."""
    for row in order[:5]:
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
        log.warning(
            "tune: %s %s: max rel err %.2e against float64 (allowed %.2e): not chosen",
            row["variant"],
            format_tunables(row["tunables"]),
            worst,
            tolerance,
        )
    return None
