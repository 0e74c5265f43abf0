"""`bench --tunable NAME=V1,V2,...`: the tunable settings each kernel is timed with, and, per scene and N,
the fastest setting of an approximate kernel (a tree) whose sampled error meets its budget.

    settings = kernel_settings(selected_records, {"theta": [0.3, 0.5]}, every_record)
    settings["tree"]  -> [{"theta": 0.3}, {"theta": 0.5}]     settings["best"] -> [{}]
    fastest_within_budget(result["results"])                 -> one entry per (kernel, scene, N)

A list sweeps: one bench row per value, and the cartesian product when several tunables of one kernel
are listed. A kernel that has none of the listed tunables runs once with its own (default or tuned)
settings, so `best` is never swept by θ. A tunable that no selected kernel has is a usage error naming
the kernels that have it.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from app.core.errors import ConfigError
from app.engine.forces import KernelRecord, format_tunables, unread_reason


def kernel_settings(
    selected: Iterable[KernelRecord], lists: Mapping[str, list], every: Iterable[KernelRecord]
) -> dict[str, list[dict]]:
    """kernel name -> the settings ({tunable: value}, validated by the record) to time it with, in the
    order given; [{}] for a kernel that has none of the listed tunables. ConfigError for a tunable none of
    `selected` has (naming those of `every` that have it) or a value out of a kernel's range."""
    selected = list(selected)
    for name in lists:
        if not any(_has(rec, name) for rec in selected):
            owners = [rec.name for rec in every if _has(rec, name)]
            chosen = ", ".join(rec.name for rec in selected) or "none"
            where = (
                f"kernels with {name!r}: {', '.join(owners)}"
                if owners
                else "no kernel has it (`nbody-live info --kernels` lists the tunables)"
            )
            raise ConfigError(
                f"--tunable {name}: none of the selected kernels ({chosen}) has this tunable; {where}"
            )
    out = {}
    for rec in selected:
        own = [
            (name, list(dict.fromkeys(rec.tunable(name).validate(v, rec.name) for v in values)))
            for name, values in lists.items()
            if _has(rec, name)
        ]
        out[rec.name] = [
            dict(zip([name for name, _ in own], combo, strict=True))
            for combo in itertools.product(*(values for _, values in own))
        ]
    return out


def sweep_notes(selected: Iterable[KernelRecord], lists: Mapping[str, list]) -> list[str]:
    """Lines saying which swept values change nothing measured: a tunable the kernel does not read at a
    setting (its `read_when`, as the panel greys it), and the trees' theta under the relative opening
    test (their default), which reads theta for a run's first step only. Said before the timing, so that
    a flat sweep is not mistaken for a result; [] for sweeps kernel_settings refuses (it says why)."""
    selected = list(selected)
    try:
        settings = kernel_settings(selected, lists, selected)
    except ConfigError:
        return []
    notes = []
    for rec in selected:
        rows = settings.get(rec.name, [])
        swept = [name for name in (rows[0] if rows else {}) if len({str(r[name]) for r in rows}) > 1]
        values = [{**rec.default_tunables(), **r} for r in rows]  # what each row runs with
        for name in swept:
            reasons = (unread_reason(rec.tunable(name), v) for v in values)
            unread = {reason for reason in reasons if reason is not None}
            if unread:
                notes.append(f"{rec.name}: {name} is swept where it is {' / '.join(sorted(unread))}")
            if name == "theta" and any(v.get("opening") == "rel" for v in values):
                notes.append(
                    f"{rec.name}: theta is swept under opening=rel, which reads it for a run's first "
                    "step only; add --tunable opening=cube (or bmax) to compare theta"
                )
    return notes


def _has(rec: KernelRecord, name: str) -> bool:
    return any(spec.name == name for spec in rec.tunables)


def fastest_within_budget(rows: Iterable[dict]) -> list[dict]:
    """Per (kernel, scene, N, and device count where rows have "gpus") with sampled errors: the measured
    setting with the smallest step time whose p99 relative error is within the row's budget
    (`error.budget_p99`), or, when none is, `tunables` None and the smallest p99 measured. In the order the
    rows were measured."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        err = r.get("error") or {}
        if r.get("status") == "ok" and "p99" in err and err.get("budget_p99") is not None:
            groups.setdefault((r["kernel"], r.get("scene"), r["n"], r.get("gpus")), []).append(r)
    out = []
    for (kernel, scene, n, gpus), group in groups.items():
        budget = group[0]["error"]["budget_p99"]
        entry = {"kernel": kernel, "scene": scene, "n": n, "budget_p99": budget, "settings": len(group)}
        if gpus is not None:
            entry["gpus"] = gpus
        within = [r for r in group if r["error"]["p99"] <= budget]
        if within:
            best = min(within, key=step_ms)
            entry.update(
                tunables=best.get("tunables", {}), step_median_ms=step_ms(best), p99=best["error"]["p99"]
            )
        else:
            closest = min(group, key=lambda r: r["error"]["p99"])
            entry.update(
                tunables=None,
                smallest_p99=closest["error"]["p99"],
                smallest_p99_tunables=closest.get("tunables", {}),
            )
        out.append(entry)
    return out


def step_ms(row: dict) -> float:
    """A row's median time per full step (force + integrate); the force time for rows written before
    bench recorded the step."""
    return row.get("step_median_ms", row["median_ms"])


def summary_lines(entries: Iterable[dict]) -> list[str]:
    """The printout of `fastest_within_budget`: one line per (kernel, scene, N)."""
    lines = []
    for e in entries:
        gpus = f" · {e['gpus']} GPU(s)" if "gpus" in e else ""
        head = f"{e['kernel']} · {e['scene']} · N = {e['n']:,}{gpus}: "
        if e["tunables"] is not None:
            lines.append(
                head + f"fastest within p99 <= {e['budget_p99']:g}: "
                f"{format_tunables(e['tunables']) or 'default tunables'}, step "
                f"{e['step_median_ms']:.3f} ms (p99 {e['p99']:.2e}; {e['settings']} setting(s) "
                "measured)"
            )
        else:
            lines.append(
                head + f"none of {e['settings']} setting(s) met p99 <= {e['budget_p99']:g}; the "
                f"smallest p99 was {e['smallest_p99']:.2e} "
                f"({format_tunables(e['smallest_p99_tunables']) or 'default tunables'})"
            )
    return lines
