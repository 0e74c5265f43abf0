"""The panel's MPI section (shown when the backend's state is shared by several ranks, app/backends/ranks.py):
per rank its share of the bodies, its force time and its exchange time (medians of the last frames), the
force imbalance, and "gather every K frames" (how often rank 0 gathers the velocities: colours by speed,
energy, snapshots; positions reach it every step). The setting goes through `Controller.set_gather_every`.
Widgets are recorded in `panel.item_rects` as `ranks:table` and `ranks:gather_every`.
"""

from __future__ import annotations

from app.engine.timing import imbalance
from app.parallel.multidevice import split

GATHER_EVERY_MAX = 120  # the slider's end (the setting takes any K >= 1)


def rank_medians(backend, frames: int) -> tuple[list[float], list[float]]:
    """(force ms, exchange ms) per rank: medians over the last `frames` frames that stepped."""
    import numpy as np

    rows = list(backend.splits)[-frames:]
    if not rows:
        return [0.0] * backend.ranks, [0.0] * backend.ranks
    return (
        [float(v) for v in np.median([f for f, _ in rows], axis=0)],
        [float(v) for v in np.median([e for _, e in rows], axis=0)],
    )


def ranks_section(panel, frames: int) -> None:
    imgui = panel.imgui
    ctl = panel.controller
    b = ctl.backend
    panel._header(f"MPI: {b.ranks} ranks")
    force, exchange = rank_medians(b, frames)
    shares = split(b.n, [1.0] * b.ranks)
    T = imgui.TableFlags_
    if imgui.begin_table("ranks", 4, T.sizing_stretch_prop | T.row_bg | T.borders_inner_v):
        for name in ("rank", "bodies", "force ms", "exchange ms"):
            imgui.table_setup_column(name)
        imgui.table_headers_row()
        for rank, (share, f, e) in enumerate(zip(shares, force, exchange, strict=True)):
            imgui.table_next_row()
            for text in (f"{rank}", f"{share.count:,}", f"{f:8.2f}", f"{e:8.2f}"):
                imgui.table_next_column()
                panel._mono(text)
        imgui.end_table()
    panel._rect("ranks:table")
    panel._tooltip(
        "each rank's force evaluation of its share of the targets against all bodies, and its "
        "position exchange (Allgatherv after each step: it includes waiting for slower ranks)"
    )
    imgui.text(f"force imbalance {100 * imbalance(force):.0f}% (slowest / mean - 1)")
    imgui.set_next_item_width(160.0)
    changed, k = imgui.slider_int("gather every (frames)", int(b.gather_every), 1, GATHER_EVERY_MAX)
    panel._rect("ranks:gather_every")
    panel._tooltip(
        "how often rank 0 gathers every rank's velocities (the colours by speed, the energy "
        "monitor, snapshots); positions reach rank 0 every step through the exchange itself"
    )
    if changed:
        ctl.set_gather_every(k)
