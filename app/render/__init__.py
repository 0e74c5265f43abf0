"""Rendering: vispy app.Canvas + gloo particles, orbit camera, colormaps, recorder.

Import `app.render.gl_setup` and call `configure()` (the Viewer does it) before anything imports
PyOpenGL: the headless EGL path needs its environment set first. Submodules:
    gl_setup   configure(headless) -> 'glfw' | 'egl'; gl_info() -> dict for `nbody-live info`
    camera     OrbitCamera (pure numpy)
    colormaps  colormap(name) -> (256, 3) float32
    shaders    build_program(vert, frag); ShaderError names the file
    particles  ParticleRenderer (VBOs, sprites tone-mapped by screen blending)
    canvas     Viewer (its per-frame timings: app.timing.FrameStats, DrawTimer)
    recorder   record(viewer, out_path, frames, ...)
"""
