"""The kernel workbench's screenshots for docs/writing-kernels.md, taken on the GPU machine: the headless
viewer (EGL) with its panel, on the CUDA backend, running a `new-kernel` starter from a kernel file.

1. reload: the file saved with a compile error, then with a correct edit: the Kernel section lists both
   reloads (the compiler's line; compile, validate and swap times);
2. compare: the Compare tab with A/B against `shared` (both times, B / A, the acceleration difference)
   and the bodies coloured by their force error against the exact sum, with the legend.

    python3 bench/workbench_screenshots.py OUT_DIR [N]      # writes OUT_DIR/workbench-*.png
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

SIZE = (1600, 900)


def main(out: Path, n: int = 65536) -> None:
    from app.backends.cuda import registry, user_kernels
    from app.commands.assembly import make_backend
    from app.render import gl_setup
    from app.render.canvas import Viewer
    from app.scene import load_scene
    from app.ui import Panel

    out.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp()) / "my-kernel.cu"
    shared = next(r for r in registry.RECORDS if r.name == "shared")
    good = user_kernels.new_kernel_text("my-kernel", shared)
    path.write_text(good)
    user_kernels.load([path], [])
    gl_setup.configure(headless=True)
    scene = load_scene("collision", {"initial.n": n, "run.backend": "cuda", "run.kernel": "my-kernel"})
    backend = make_backend(scene)
    viewer = Viewer(scene, backend, size=SIZE, headless=True)
    panel = Panel(viewer)
    panel.bridge.refresh_hz = 0.0
    ctl = panel.controller
    try:
        frames(viewer, 60)

        def save(text: str) -> None:
            before = len(ctl.reloads)
            path.write_text(text)
            deadline = time.monotonic() + 30
            while len(ctl.reloads) == before and time.monotonic() < deadline:
                frames(viewer, 1)
            frames(viewer, 5)

        save(good.replace("extern __shared__ float4 tile[];", "extern __shared__ float4 tile[]"))
        save(good.replace("#include", "// a faster loop, one day\n#include", 1))
        viewer.save_png(out / "workbench-reload.png", overlays=True)
        print(f"reloads: {[(r.outcome, r.message[:80]) for r in ctl.reloads]}")

        ctl.start_compare("shared")
        ctl.set_error_view("error")
        frames(viewer, 3)  # (the messages these leave move the tab bar: click where it is now)
        click(viewer, panel, "tab:Compare")
        frames(viewer, 240)  # the exact sum is taken in pieces over frames
        viewer.save_png(out / "workbench-compare.png", overlays=True)
        print(f"A/B: {ctl.compare_line()}")
    finally:
        panel.close()
        viewer.close()
        backend.close()


def frames(viewer, count: int) -> None:
    for _ in range(count):
        viewer.step_and_render()


def click(viewer, panel, name: str) -> None:
    """A left click on the widget `name` through vispy's events, as a user's (tests/test_panel.py)."""
    x0, y0, x1, y1 = panel.item_rects[name]
    pos = ((x0 + x1) / 2, (y0 + y1) / 2)
    viewer.events.mouse_move(pos=pos, button=None, buttons=[], modifiers=())
    frames(viewer, 2)
    viewer.events.mouse_press(pos=pos, button=1, buttons=[1], modifiers=())
    frames(viewer, 2)
    viewer.events.mouse_release(pos=pos, button=1, buttons=[], modifiers=())
    frames(viewer, 3)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 65536)
