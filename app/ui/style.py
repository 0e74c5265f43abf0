"""The panel's look, shared by the panel and its sections: colours, the frame breakdown's, the formats of
its typed fields, the keys' help line, and how a rate is written."""

from __future__ import annotations

RED_BG = (0.55, 0.08, 0.08, 1.0)
RED_TEXT = (1.0, 0.42, 0.38, 1.0)
OK_TEXT = (0.55, 0.85, 0.55, 1.0)
WARN_TEXT = (1.0, 0.75, 0.30, 1.0)
DIM_TEXT = (0.60, 0.64, 0.70, 1.0)
FADED_TEXT = (0.32, 0.34, 0.38, 1.0)  # a legend entry for a part this path does not have now
ACCENT = (1.0, 0.62, 0.22, 1.0)
# the frame breakdown bar: (history field, label, colour)
BREAKDOWN = (
    ("force_ms", "force", (1.00, 0.55, 0.15, 1.0)),
    ("integrate_ms", "integrate", (0.95, 0.85, 0.30, 1.0)),
    ("mapunmap_ms", "map", (0.55, 0.80, 0.95, 1.0)),
    ("draw_ms", "draw", (0.35, 0.60, 1.00, 1.0)),
    ("upload_ms", "upload", (0.65, 0.45, 0.95, 1.0)),
    ("record_ms", "record", (0.95, 0.25, 0.25, 1.0)),
    ("panel_ms", "panel", (0.45, 0.85, 0.60, 1.0)),
    ("energy_ms", "drift", (0.90, 0.45, 0.55, 1.0)),
    ("probe_ms", "error probe", (0.80, 0.60, 0.30, 1.0)),
    ("python_ms", "Python", (0.55, 0.58, 0.62, 1.0)),
)
FIELD_FORMAT = {"initial.n": "{:d}", "run.steps_per_frame": "{:d}", "run.frames_per_step": "{:d}"}
PRESET_KEYS_HELP = "Space pause · [ ] kernel · R reset · C camera · F fit · V record · Tab hide · Esc quit"
REC_RED = (0.92, 0.16, 0.16, 1.0)


def fmt_rate(x: float) -> str:
    for scale, unit in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"
