"""NBody Live: a real-time 3D N-body gravity viewer for writing, comparing and showing GPU kernels.

Data flow (see ../shared/DESIGN.md): bodies live in the vertex buffer that OpenGL draws; backends update
them in place; nothing but timings (and, when recording, finished images) crosses to the host per frame.
"""

__version__ = "0.1.0"
