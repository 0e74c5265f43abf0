"""The kernel section: the combo of every record (greyed with the reason where it cannot run), its doc
line, its tunables as sliders and combos (greyed while the kernel does not read them), and, while the
user's kernel files are watched, their reloads: each save's outcome, the time of each stage, and the
compiler's or the validation's message (app/ui/reload_actions.py)."""

from __future__ import annotations

import numpy as np

from app.core.values import AUTO, FloatRange, IntChoice, default_text
from app.engine.forces import unread_reason
from app.ui.style import DIM_TEXT, OK_TEXT, RED_BG, RED_TEXT, WARN_TEXT


def _slider_ends(spec: FloatRange) -> tuple[float, float]:
    """A FloatRange's slider ends. ImGui sliders are float32: an open lower end starts at the next float32
    above it, so the slider never offers a value the record refuses."""
    lo = float(np.nextafter(np.float32(spec.lo), np.float32(spec.hi))) if spec.lo_open else float(spec.lo)
    return lo, float(spec.hi)


def _slider_value(spec: FloatRange, v: float) -> float:
    """What a FloatRange slider returned, for the record to validate: a float32 rounding of an end (0.1 is
    0.100000001 in float32) is that end; anything else, a value typed beyond the ends too, as it is (a
    slider's Ctrl+click text input does not clamp), so that the record rejects it and the field turns red."""
    for end in (spec.lo, spec.hi):
        if v != end and np.float32(v) == np.float32(end) and not (spec.lo_open and end == spec.lo):
            return float(end)
    return float(v)


def draw(panel) -> None:
    imgui = panel.imgui
    ctl = panel.controller
    cur = ctl.backend.kernel
    imgui.set_next_item_width(-1)
    opened = imgui.begin_combo("##kernel", cur, imgui.ComboFlags_.height_large)
    panel._combo_rect("kernel_combo", opened)
    if opened:
        kernel_rows(panel, cur, "kernel:", ctl.switch_kernel, precision=True)
        imgui.end_combo()
    rec = ctl.record(cur)
    panel._tooltip(rec.doc)
    imgui.push_text_wrap_pos(0.0)
    imgui.text_colored(imgui.ImVec4(*DIM_TEXT), f"{rec.doc}  [{rec.backend} · {rec.precision}]")
    imgui.pop_text_wrap_pos()
    if rec.origin:
        panel._tooltip(f"{rec.doc}\nfrom: {rec.origin}\nsource: {rec.source} ({rec.entry})")
    _tunables(panel)
    _reloads(panel)


RELOADS_SHOWN = 5


def _reloads(panel) -> None:
    """The watched kernel files and their last reloads, newest first: what came of each save, the stage
    times (compile, validate, swap; live: from the save to the swap) and the message."""
    imgui = panel.imgui
    ctl = panel.controller
    if not ctl.reload_watching:
        return
    imgui.separator_text("reloads")
    names = ", ".join(p.name for p in ctl.reload_watching)
    imgui.text_colored(
        imgui.ImVec4(*DIM_TEXT), f"watching {names}" + ("  (building...)" if ctl.reload_busy else "")
    )
    panel._rect("reload:watching")
    imgui.push_text_wrap_pos(0.0)
    for i, r in enumerate(reversed(ctl.reloads)):
        if i == RELOADS_SHOWN:
            break
        ok = r.outcome == "swapped"
        colour = OK_TEXT if ok else (RED_TEXT if r.outcome == "compile error" else WARN_TEXT)
        stages = f"compile {r.compile_s * 1e3:.0f} ms"
        if r.validate_s is not None:
            stages += f" · validate {r.validate_s * 1e3:.0f} ms"
        if r.swap_s is not None:
            stages += f" · swap {r.swap_s * 1e3:.1f} ms"
        if r.live_s is not None:
            stages += f" · live {r.live_s:.2f} s after the save"
        imgui.text_colored(imgui.ImVec4(*colour), f"{r.path.name}: {r.outcome}")
        panel._rect(f"reload:{i}")
        imgui.text_colored(imgui.ImVec4(*DIM_TEXT), stages)
        if not ok or i == 0:
            imgui.text(r.message)
    imgui.pop_text_wrap_pos()


def kernel_rows(panel, current: str, rect: str, pick, precision: bool = False) -> None:
    """Inside an open combo: every record, grouped by backend, one greyed with the reason it cannot run
    now; a click on one that can calls `pick(name)`. Widgets are named `rect` + the kernel's name (the
    kernel combo's, the Compare tab's kernel B)."""
    imgui = panel.imgui
    ctl = panel.controller
    group = None
    for rec in ctl.records:
        if rec.backend != group:
            group = rec.backend
            imgui.separator_text(group.upper())
        reason = ctl.why_not(rec.name)
        if reason:
            imgui.begin_disabled()
        clicked, _ = imgui.selectable(f"{rec.name}##{rect}", rec.name == current)
        panel._rect(f"{rect}{rec.name}")
        panel._tooltip(f"{rec.doc}" + (f"\nunavailable: {reason}" if reason else ""), disabled=bool(reason))
        if precision:
            imgui.same_line(imgui.get_window_width() - 56)
            imgui.text_disabled(rec.precision)
        if reason:
            imgui.end_disabled()
        if clicked and not reason:
            pick(rec.name)


def _tunables(panel) -> None:
    """Every tunable of the current kernel's record, with the value the next step uses: IntChoice and
    Choice a combo, FloatRange a slider (logarithmic when spec.log). A change goes through the
    controller, validated by the record, and applies from the next step."""
    imgui = panel.imgui
    backend = panel.controller.backend
    values = backend.tunables()
    for spec in backend.tunable_specs():
        key = f"tunable:{spec.name}"
        current = values.get(spec.name, spec.default)
        unread = unread_reason(spec, values)  # greyed: the kernel does not read it at these values
        if unread:
            imgui.begin_disabled()
        imgui.set_next_item_width(150.0)
        if isinstance(spec, FloatRange):
            lo, hi = _slider_ends(spec)
            flags = imgui.SliderFlags_.no_round_to_format | (
                imgui.SliderFlags_.logarithmic if spec.log else 0
            )
            red = key in panel.field_errors
            if red:
                for col in (imgui.Col_.frame_bg, imgui.Col_.frame_bg_hovered, imgui.Col_.frame_bg_active):
                    imgui.push_style_color(col, imgui.ImVec4(*RED_BG))
            # auto (a number that follows N) shows the number it is now, and says so; a drag sets a number
            shown = spec.value_at(current, backend.n)
            fmt = "auto: %.4g" if current == AUTO else "%.4g"
            changed, v = imgui.slider_float(f"{spec.name}##{key}", shown, lo, hi, fmt, flags)
            panel._rect(key)
            if red:
                imgui.pop_style_color(3)
            if changed:  # dragged within the ends, or typed (Ctrl+click): the record judges it
                _set_tunable(panel, key, spec.name, _slider_value(spec, v))
            if spec.by_n and current != AUTO:  # the way back to the number that follows N
                imgui.same_line()
                if imgui.small_button(f"auto##{key}"):
                    _set_tunable(panel, key, spec.name, AUTO)
                panel._rect(f"{key}:auto")
                panel._tooltip(f"{spec.name} follows N again: {spec.describe_auto()}")
        else:
            options = spec.values if isinstance(spec, IntChoice) else spec.options
            panel._combo(
                f"{spec.name}##{key}",
                key,
                options,
                current,
                lambda c, key=key, name=spec.name: _set_tunable(panel, key, name, c),
            )
        if unread:
            imgui.end_disabled()
            panel.unread[key] = unread
        else:
            panel.unread.pop(key, None)
        panel._tooltip(
            f"{spec.name}: {spec.doc + ' ' if spec.doc else ''}({spec.describe()}, default "
            f"{default_text(spec)})" + (f"\n{unread}" if unread else ""),
            disabled=bool(unread),
        )
        if key in panel.field_errors:
            panel._rejected(key, str(values.get(spec.name, spec.default)))


def _set_tunable(panel, key: str, name: str, value) -> None:
    msg = panel.controller.set_tunable(name, value)
    if msg:
        panel.field_errors[key] = msg
    else:
        panel.field_errors.pop(key, None)


# --- the panel -------------------------------------------------------------------------------
