"""`best`'s launch policy: it runs another record, chosen per N for this GPU (and the device count) from the
tuning cache (tuning_cache.py), else the committed heuristic table (heuristic.py), else a safe pick."""

from __future__ import annotations

from app.backends.cuda.policy_base import GridPolicy
from app.core.errors import ConfigError


class BestPolicy(GridPolicy):
    """Runs another record, chosen per N for this GPU: the tuning cache's entry (`nbody-live tune`), else
    the committed heuristic table's pick for this GPU's family (heuristic.py), else the safe pick at its
    defaults on a GPU the table does not know. Under `--gpus K` the cache's tuning on K GPUs (`nbody-live
    tune --gpus K`), else the one-GPU pick with a warning. The evaluator asks `resolve` per N."""

    resolves = True

    def __init__(self, safe: str, table=None):
        super().__init__()
        self.safe = safe
        self.table = table  # None: heuristic.TABLE (a test points it elsewhere)

    def symbols(self, rec) -> list[str]:
        return []

    def resolve(self, records: dict, facts, n: int, devices: int = 1) -> tuple:
        """(record, tunables, source, warning) for N split over `devices` GPUs (`--gpus K`; 1: one GPU).

        One GPU: `source` is the log line's "which": "tuned cache for <gpu>", "heuristic from <file> for
        <family> (<why no cache>; run `nbody-live tune` to tune)" or "safe pick ..."; `warning` is None, or
        why a cache or table that exists was not usable. K > 1: the cache's tuning on K GPUs ("tuned cache
        for <gpu> on K GPUs": what scales on K devices may not be what is fastest on one), else what one
        GPU would run, its source saying so and a warning naming `nbody-live tune --gpus K` (nothing
        falls back silently)."""
        if devices > 1:
            rec, tun, why = self._cached(records, facts, n, devices)
            if rec is not None:
                return rec, tun, f"tuned cache for {facts.name} on {devices} GPUs", None
            rec, tun, source, warning = self.resolve(records, facts, n)
            fallback = (
                f"best: no tuning on {devices} GPUs for N = {n:,} ({why}); running the one-GPU pick "
                f"{rec.name}; run `nbody-live tune --gpus {devices}` to tune on {devices} GPUs"
            )
            return (
                rec,
                tun,
                f"{source}, the one-GPU pick (none tuned on {devices} GPUs)",
                "; ".join(w for w in (warning, fallback) if w),
            )
        from app.backends.cuda import heuristic

        warning = None
        rec, tun, why = self._cached(records, facts, n, 1)
        if rec is not None:
            return rec, tun, f"tuned cache for {facts.name}", None
        hint = f"{why}; run `nbody-live tune` to tune"
        table_path = self.table or heuristic.TABLE
        try:
            table = heuristic.load_table(records.values(), table_path)
        except heuristic.HeuristicTableError as e:
            table, warning = None, f"best: {e}; using the safe pick {self.safe}"
        family = heuristic.family_for(table, facts) if table is not None else None
        if family is not None:
            pick = heuristic.nearest(family["picks"], n)
            rec = records[pick["variant"]]
            source = (
                f"heuristic from {heuristic.shown(table_path)} for "
                f"{heuristic.describe_family(family, facts)} ({hint})"
            )
            return rec, rec.with_tunables(pick.get("tunables", {})), source, warning
        rec = records[self.safe]
        unknown = "" if table is None else f", a GPU {heuristic.shown(table_path)} does not know"
        return rec, rec.default_tunables(), f"safe pick for {facts.name}{unknown} ({hint})", warning

    @staticmethod
    def _cached(records: dict, facts, n: int, devices: int) -> tuple:
        """(record, tunables, '') of the tuning cache's entry for N on `devices` GPUs, else (None, None,
        why not)."""
        from app.backends.cuda import tuning_cache

        try:
            choice, why = tuning_cache.lookup(n, facts, list(records.values()), devices)
        except Exception as e:  # a broken cache must never stop the viewer
            choice, why = None, f"tuning cache unreadable ({e})"
        if choice is None:
            return None, None, why
        try:
            rec = records[choice["variant"]]
            tun = rec.with_tunables(
                {
                    k: v
                    for k, v in choice.get("tunables", {}).items()
                    if any(t.name == k for t in rec.tunables)
                }
            )
        except (ConfigError, KeyError, TypeError, ValueError) as e:
            return None, None, f"the cached choice cannot be used ({e})"
        return rec, tun, ""
