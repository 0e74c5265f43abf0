"""The Simulation tab: the scene preset, N, the physics, time steps and steps per frame."""

from __future__ import annotations

from app.model.config import COARSEN, INTEGRATORS, MODELS, TIMESTEPS


def draw(panel) -> None:
    imgui = panel.imgui
    ctl = panel.controller
    if imgui.button("Resume" if panel.viewer.paused else "Pause", imgui.ImVec2(80, 0)):
        ctl.toggle_pause()
    panel._rect("pause")
    panel._tooltip("Space")
    imgui.same_line()
    if imgui.button("Step", imgui.ImVec2(60, 0)):
        ctl.single_step()
    panel._rect("step")
    panel._tooltip("one integrator step, then paused")
    imgui.same_line()
    if imgui.button("Reset", imgui.ImVec2(60, 0)):
        ctl.reset()
    panel._rect("reset")
    panel._tooltip("R: the scene's initial bodies again (same seed, current N and kernel)")
    imgui.same_line()
    if imgui.button("Save snapshot", imgui.ImVec2(110, 0)):
        ctl.save_snapshot()
    panel._rect("save_snapshot")
    panel._tooltip(
        f"S: the current state to {ctl.view_recorder.directory}/snapshot-<time>.npz (float64, "
        "original body order; opens with `nbody-live run FILE`)"
    )
    if panel._presets is None:
        from app.scene import preset_names

        panel._presets = preset_names()
    imgui.set_next_item_width(150.0)
    if imgui.begin_combo("scene preset", panel.viewer.scene.name):
        for name in panel._presets:
            clicked, _ = imgui.selectable(name, name == panel.viewer.scene.name)
            if clicked:
                ctl.load_preset(name)
        imgui.end_combo()
    panel._rect("preset")
    file_reason = "the bodies come from a snapshot file" if panel.viewer.scene.initial.file else None
    panel._field("N (bodies)", "initial.n", file_reason)
    panel._field("dt", "physics.dt")
    panel._field("softening ε", "physics.softening")
    panel._field("G", "physics.G")
    panel._choice("integrator", "physics.integrator", INTEGRATORS)
    phys = ctl.backend.physics
    panel._field(
        "damping",
        "physics.damping",
        None if phys.integrator == "euler-damped" else "applies to the euler-damped integrator",
    )
    panel._choice("force model", "physics.model", MODELS)
    panel._field(
        "repulsion H",
        "physics.repulsion",
        None if phys.model == "gravity-repulsion" else "applies to the gravity-repulsion model",
    )
    panel._choice("time steps", "physics.timesteps", TIMESTEPS)
    panel._tooltip(
        "shared: every body takes dt. block: hierarchical levels, body i steps dt / 2^l_i "
        "(GADGET-2's criterion), only the active bodies are walked; dt is the max step; the "
        "tree on one device (docs/blocksteps.md)"
    )
    not_block = None if phys.timesteps == "block" else "applies to block time steps"
    panel._field("block levels L", "physics.block_levels", not_block)
    panel._field("block η", "physics.block_eta", not_block)
    panel._choice("block coarsening", "physics.block_coarsen", COARSEN, not_block)
    panel._field("steps / frame", "run.steps_per_frame")
    panel._field("frames / max step", "run.frames_per_step", not_block)
    panel._tooltip(
        "block steps: frames drawn inside each max step, the bodies at the frame's time "
        "(substeps that end by then run, the others predicted along their drift); a frame "
        "advances steps/frame ÷ this many max steps"
    )
