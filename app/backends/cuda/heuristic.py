"""`best`'s measured heuristic: the committed table of tuned picks per GPU, for a GPU with no tuning cache.

kernels/best_heuristic.json holds, per GPU, the winners of one `nbody-live tune` run on it (one GPU; made by
`nbody-live tune --update-heuristic TUNE.json`, which replaces that GPU's family and keeps the others).
A GPU is matched by its name, else by its compute capability (a family measured on the same
architecture); the pick for N is the tuned N nearest in log space. A GPU the table does not know runs
the registry's safe pick. No pycuda here, and nothing is measured: the table is data.

    table = load_table(registry.RECORDS)          # HeuristicTableError names the file and the problem
    family = family_for(table, facts)             # None: a GPU the table does not know
    pick = nearest(family["picks"], 131072)       # {"n", "variant", "tunables", ...}
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from app.backends.cuda import tuning_cache
from app.core.errors import ConfigError
from app.core.paths import KERNELS, ROOT

SCHEMA = "nbody-live-best-heuristic/1"
TABLE = KERNELS / "best_heuristic.json"
REPAIR = "restore it from git or rebuild it with `nbody-live tune --update-heuristic TUNE.json`"


class HeuristicTableError(ConfigError):
    """The heuristic table (or the tune result it is made from) cannot be used; the message says why."""


def shown(path: Path) -> str:
    """A path as the log line shows it: relative to the checkout when inside it."""
    path = Path(path)
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# --- reading and checking ---------------------------------------------------------------------------------
def check_pick(pick, records: dict, where: str) -> dict:
    """A pick {n, variant, tunables, ...} that names a swept kernel with allowed tunables, or the error."""
    if not isinstance(pick, dict) or not isinstance(pick.get("n"), int) or pick["n"] < 1:
        raise HeuristicTableError(
            f"{where}: expected {{n (a whole number >= 1), variant, tunables}}, got {pick!r}"
        )
    rec = records.get(pick.get("variant"))
    if rec is None or not rec.tuned:
        swept = ", ".join(name for name, r in records.items() if r.tuned)
        raise HeuristicTableError(f"{where}: {pick.get('variant')!r} is not a kernel `tune` sweeps ({swept})")
    tunables = pick.get("tunables", {})
    if not isinstance(tunables, dict):
        raise HeuristicTableError(f"{where}: tunables must be a table, got {tunables!r}")
    try:
        rec.validate_tunables(tunables)
    except ConfigError as e:
        raise HeuristicTableError(f"{where}: {e}") from None
    return pick


def check_table(table, records: dict, path: Path) -> dict:
    """The table, after checking its schema and that every pick names an existing kernel configuration."""
    if not isinstance(table, dict) or table.get("schema") != SCHEMA:
        raise HeuristicTableError(
            f"{path} is not a `best` heuristic table (its schema is not {SCHEMA}); " + REPAIR
        )
    families = table.get("families")
    if not isinstance(families, list):
        raise HeuristicTableError(f"{path}: 'families' must be a list")
    for i, family in enumerate(families):
        where = f"{path}: families[{i}]"
        if not isinstance(family, dict) or not isinstance(family.get("gpu"), str):
            raise HeuristicTableError(f"{where}: expected {{gpu, compute_capability, picks}}")
        picks = family.get("picks")
        if not isinstance(picks, list) or not picks:
            raise HeuristicTableError(f"{where} ({family['gpu']}): 'picks' must be a non-empty list")
        for j, pick in enumerate(picks):
            check_pick(pick, records, f"{where} ({family['gpu']}).picks[{j}]")
    return table


def load_table(records, path: Path | None = None) -> dict:
    """The checked table at `path` (default TABLE); HeuristicTableError (naming the file) when it is
    missing or bad."""
    path = Path(path or TABLE)
    try:
        table = json.loads(path.read_text())
    except OSError as e:
        raise HeuristicTableError(
            f"cannot read the `best` heuristic table {path}: {e.strerror or e}; {REPAIR}"
        ) from None
    except ValueError as e:
        raise HeuristicTableError(
            f"the `best` heuristic table {path} is not valid JSON ({e}); {REPAIR}"
        ) from None
    return check_table(table, {r.name: r for r in records}, path)


# --- choosing ---------------------------------------------------------------------------------------------
def compute_capability(facts) -> str | None:
    """'9.0' from DeviceFacts (a (major, minor) tuple) or anything with a 'X.Y' string; None if unknown."""
    cc = getattr(facts, "compute_capability", None)
    if isinstance(cc, (tuple, list)) and len(cc) == 2:
        return f"{cc[0]}.{cc[1]}"
    return str(cc) if cc else None


def family_for(table: dict, facts) -> dict | None:
    """This GPU's family: the one measured on a GPU of the same name, else on the same compute
    capability (the first such in the table), else None."""
    families = table["families"]
    for family in families:
        if family["gpu"] == facts.name:
            return family
    cc = compute_capability(facts)
    for family in families:
        if cc is not None and family.get("compute_capability") == cc:
            return family
    return None


def describe_family(family: dict, facts) -> str:
    """'NVIDIA H200', or 'NVIDIA H200 picks (compute capability 9.0, like NVIDIA H100 80GB HBM3)'."""
    if family["gpu"] == facts.name:
        return family["gpu"]
    return f"{family['gpu']} picks (compute capability {family.get('compute_capability')}, like {facts.name})"


def nearest(picks: list[dict], n: int) -> dict:
    """The pick whose N is nearest to `n` in log space (the smaller N on an exact tie)."""
    return min(picks, key=lambda p: (abs(math.log(max(n, 1) / p["n"])), p["n"]))


# --- making the table from a tune result ------------------------------------------------------------------
def family_from_tune(tune: dict, records, source: str, previous: dict | None = None) -> dict:
    """One family from a tune result of one GPU (`tune --json`, or the cache file's tuning on one GPU):
    its GPU and its winners per N. A tuning on several GPUs is refused: the table holds one GPU's picks.

    The compute capability comes from the tune result (written since tune records it), else from the
    family it replaces; without either the family matches its GPU by name only.
    """
    by_name = {r.name: r for r in records}
    try:
        layout = tuning_cache.as_file(tune)
    except ValueError:
        raise HeuristicTableError(
            f"{source} is not a tune result (schema {tuning_cache.SCHEMA} or "
            f"{tuning_cache.SCHEMA_1} with a gpu): give the file `nbody-live tune "
            "--json` wrote"
        ) from None
    tunings = layout["tunings"]
    if "1" not in tunings:
        counts = ", ".join(tuning_cache.on_gpus(int(k)) for k in tunings)
        raise HeuristicTableError(
            f"{source}: a tuning on {counts}, and the table holds the picks of one "
            "GPU: give the JSON of `nbody-live tune` without --gpus"
        )
    tune = {**{k: layout.get(k) for k in tuning_cache.HEADER}, **tunings["1"]}
    best = tune.get("best")
    if not isinstance(best, list) or not best:
        raise HeuristicTableError(f"{source}: the tune result has no winners ('best' is empty)")
    picks = []
    for i, entry in enumerate(best):
        check_pick(entry, by_name, f"{source}: best[{i}]")
        picks.append(
            {
                k: entry[k]
                for k in ("n", "variant", "tunables", "interactions_per_s", "median_ms")
                if k in entry
            }
        )
    cc = tune.get("compute_capability") or (previous or {}).get("compute_capability")
    return {
        "gpu": tune["gpu"],
        "compute_capability": cc,
        "from": source,
        "tuned": tune.get("created"),
        "driver": tune.get("driver"),
        "source_hash": tune.get("source_hash"),
        "picks": sorted(picks, key=lambda p: p["n"]),
    }


def updated_table(table: dict | None, tune: dict, records, source: str) -> dict:
    """`table` with the tune result's GPU family replaced (or added); the other families kept."""
    families = list((table or {}).get("families", []))
    previous = next((f for f in families if f.get("gpu") == tune.get("gpu")), None)
    family = family_from_tune(tune, records, source, previous)
    kept = [f for f in families if f.get("gpu") != family["gpu"]]
    return {
        "schema": SCHEMA,
        "doc": "best's picks per N for a GPU with no tuning cache; made by `nbody-live tune "
        "--update-heuristic TUNE.json` (app/backends/cuda/heuristic.py); do not edit by hand",
        "families": sorted([*kept, family], key=lambda f: f["gpu"]),
    }


def update_from_tune(tune_path: Path, records, path: Path | None = None) -> dict:
    """Rewrite the table at `path` (default TABLE; atomically) with the family measured in `tune_path`;
    returns it."""
    from app.core.outputs import atomic_write

    path = Path(path or TABLE)
    tune_path = Path(tune_path)
    try:
        tune = json.loads(tune_path.read_text())
    except OSError as e:
        raise HeuristicTableError(f"cannot read the tune result {tune_path}: {e.strerror or e}") from None
    except ValueError as e:
        raise HeuristicTableError(f"{tune_path} is not valid JSON ({e})") from None
    table = load_table(records, path) if path.exists() else None
    new = updated_table(table, tune, records, shown(tune_path))
    check_table(new, {r.name: r for r in records}, path)
    with atomic_write(path, "w", "best heuristic table") as f:
        json.dump(new, f, indent=1)
        f.write("\n")
    return new
