"""Rendering: vispy app.Canvas + gloo particles, orbit camera, colormaps, recorder.

Import `app.render.gl_setup` and call `configure()` (the Viewer does it) before anything imports
PyOpenGL: the headless EGL path needs its environment set first. Submodules:
    gl_setup   configure(headless) -> 'glfw' | 'egl'; gl_info() -> dict for `nbody-live info`
    camera     OrbitCamera (pure numpy)
    colormaps  colormap(name) -> (256, 3) float32
    shaders    build_program(vert, frag); ShaderError names the file
    particles  ParticleRenderer (VBOs, sprites tone-mapped by screen blending)
    canvas     Viewer (its per-frame timings: app.render.frames.FrameStats, DrawTimer)
    recorder   Recorder (frames in, an mp4 out), record_scene / render_still / record (headless)
    live_recording  ViewRecorder: the viewer's Record button / V, measure_record_cost
"""
