"""The ImGui panel's renderer: imgui-bundle's ProgrammablePipelineRenderer (its shader, VAO and texture
handling) with `render` redone for a per-frame overlay (app.ui.imgui_bridge draws with it):

* `render(draw_data)` copies every command list into ONE vertex and ONE index buffer and keeps the draw
  commands (texture, scissor, count, offset, base vertex) as a Python list; `render(None)` replays the
  last uploaded lists: a handful of GL calls, no ImGui work at all.
* PyOpenGL's raw entry points (a wrapped glGetIntegerv costs ~12 µs, a raw one ~1 µs).
* The GL state saved and restored is the set the original handles (less polygon mode, which nothing here
  changes); a texture is bound only when it changes between commands.

Importing this module imports PyOpenGL and imgui-bundle: the bridge imports it when it is made (the
viewer's GL context current), never at start-up.
"""

from __future__ import annotations

import ctypes
from typing import Any

from imgui_bundle import imgui
from imgui_bundle.python_backends.opengl_backend_programmable import ProgrammablePipelineRenderer
from OpenGL import GL
from OpenGL.raw.GL.VERSION import GL_1_0 as g10
from OpenGL.raw.GL.VERSION import GL_1_1 as g11
from OpenGL.raw.GL.VERSION import GL_1_3 as g13
from OpenGL.raw.GL.VERSION import GL_1_4 as g14
from OpenGL.raw.GL.VERSION import GL_1_5 as g15
from OpenGL.raw.GL.VERSION import GL_2_0 as g20
from OpenGL.raw.GL.VERSION import GL_3_0 as g30
from OpenGL.raw.GL.VERSION import GL_3_2 as g32

# the GL state a frame saves and restores: integers (in the order `_restore` unpacks them) and capabilities
_INTS = (
    "GL_CURRENT_PROGRAM",
    "GL_ACTIVE_TEXTURE",
    "GL_TEXTURE_BINDING_2D",
    "GL_ARRAY_BUFFER_BINDING",
    "GL_VERTEX_ARRAY_BINDING",
    "GL_BLEND_SRC_RGB",
    "GL_BLEND_DST_RGB",
    "GL_BLEND_SRC_ALPHA",
    "GL_BLEND_DST_ALPHA",
    "GL_BLEND_EQUATION_RGB",
    "GL_BLEND_EQUATION_ALPHA",
)
_CAPS = (GL.GL_BLEND, GL.GL_CULL_FACE, GL.GL_DEPTH_TEST, GL.GL_SCISSOR_TEST)
_ENUMS = [int(getattr(GL, n)) for n in _INTS]
_IDX_TYPE = GL.GL_UNSIGNED_SHORT if imgui.INDEX_SIZE == 2 else GL.GL_UNSIGNED_INT


class ReplayRenderer(ProgrammablePipelineRenderer):
    """Draws ImGui's draw data over the bound framebuffer, or replays the last (see the module doc)."""

    def __init__(self):
        super().__init__()
        self._int1 = ctypes.c_int(0)
        self._vp = (ctypes.c_int * 4)()
        self._sc = (ctypes.c_int * 4)()
        self._proj: Any = (ctypes.c_float * 16)()  # filled from floats by slice (ctypes' stubs want c_float)
        self._cmds: list[tuple] = []
        self._pending: tuple[bytes, bytes] | None = None
        self._fb = (0, 0)
        self.vertices = 0  # of the last upload (for the System section)

    def _get(self, e: int) -> int:
        g10.glGetIntegerv(e, ctypes.byref(self._int1))
        return self._int1.value

    # --- an upload: the draw lists into one vertex and one index buffer, the commands kept -------------
    def _prepare(self, draw_data) -> None:
        io = self.io
        dw, dh = io.display_size
        sx, sy = io.display_framebuffer_scale
        fb_w, fb_h = int(dw * sx), int(dh * sy)
        self._update_textures()
        self._cmds = []
        self._fb = (fb_w, fb_h)
        if fb_w <= 0 or fb_h <= 0:
            return
        draw_data.scale_clip_rects(io.display_framebuffer_scale)
        self._project(dw, dh)
        self._gather(draw_data, fb_h)

    def _project(self, dw: float, dh: float) -> None:
        """The orthographic projection of the display (dw x dh, y down) into `_proj`."""
        p = self._proj
        p[:] = (
            2.0 / dw,
            0.0,
            0.0,
            0.0,
            0.0,
            -2.0 / dh,
            0.0,
            0.0,
            0.0,
            0.0,
            -1.0,
            0.0,
            -1.0,
            1.0,
            0.0,
            1.0,
        )

    def _gather(self, draw_data, fb_h: int) -> None:
        """Every command list's vertices and indices joined (uploaded by the next `render`), and its
        commands with their scissor in framebuffer pixels and offsets into the joined buffers."""
        vsize, isize = imgui.VERTEX_SIZE, imgui.INDEX_SIZE
        vparts, iparts, cmds = [], [], self._cmds
        vbase = ibase = 0
        for cl in draw_data.cmd_lists:
            nv, ni = cl.vtx_buffer.size(), cl.idx_buffer.size()
            vparts.append(ctypes.string_at(cl.vtx_buffer.data_address(), nv * vsize))
            iparts.append(ctypes.string_at(cl.idx_buffer.data_address(), ni * isize))
            for cmd in cl.cmd_buffer:
                x, y, z, w = cmd.clip_rect
                if z <= x or w <= y or cmd.elem_count == 0:
                    continue
                cmds.append(
                    (
                        cmd.tex_ref.get_tex_id(),
                        int(x),
                        int(fb_h - w),
                        int(z - x),
                        int(w - y),
                        cmd.elem_count,
                        (ibase + cmd.idx_offset) * isize,
                        vbase + cmd.vtx_offset,
                    )
                )
            vbase += nv
            ibase += ni
        self.vertices = vbase
        self._pending = (b"".join(vparts), b"".join(iparts))

    # --- a frame: save the GL state, draw, restore --------------------------------------------------------
    def render(self, draw_data=None) -> None:
        """Upload and draw `draw_data`; with None, draw the last uploaded lists again."""
        if draw_data is not None:
            self._prepare(draw_data)
        if not self._cmds:
            return
        saved = [self._get(e) for e in _ENUMS]
        enabled = [bool(g10.glIsEnabled(c)) for c in _CAPS]
        g10.glGetIntegerv(GL.GL_VIEWPORT, self._vp)
        g10.glGetIntegerv(GL.GL_SCISSOR_BOX, self._sc)
        self._set_state()
        self._draw()
        self._restore(saved, enabled)

    def _set_state(self) -> None:
        """The pipeline ImGui draws with: alpha blending, no culling or depth test, scissor on, its
        program, projection, VAO and buffers bound, the viewport over the whole framebuffer."""
        g10.glEnable(GL.GL_BLEND)
        g14.glBlendEquation(GL.GL_FUNC_ADD)
        g10.glBlendFunc(GL.GL_SRC_ALPHA, GL.GL_ONE_MINUS_SRC_ALPHA)
        g10.glDisable(GL.GL_CULL_FACE)
        g10.glDisable(GL.GL_DEPTH_TEST)
        g10.glEnable(GL.GL_SCISSOR_TEST)
        g13.glActiveTexture(GL.GL_TEXTURE0)
        g10.glViewport(0, 0, *self._fb)
        g20.glUseProgram(self._shader_handle)
        g20.glUniform1i(self._attrib_location_tex, 0)
        g20.glUniformMatrix4fv(self._attrib_proj_mtx, 1, GL.GL_FALSE, self._proj)
        g30.glBindVertexArray(self._vao_handle)
        g15.glBindBuffer(GL.GL_ARRAY_BUFFER, self._vbo_handle)
        g15.glBindBuffer(GL.GL_ELEMENT_ARRAY_BUFFER, self._elements_handle)

    def _draw(self) -> None:
        """The pending upload (after a `_prepare`), then every kept command."""
        if self._pending is not None:
            vdata, idata = self._pending
            self._pending = None
            g15.glBufferData(GL.GL_ARRAY_BUFFER, len(vdata), vdata, GL.GL_STREAM_DRAW)
            g15.glBufferData(GL.GL_ELEMENT_ARRAY_BUFFER, len(idata), idata, GL.GL_STREAM_DRAW)
        bound = None
        for tex, x, y, w, h, count, offset, base in self._cmds:
            if tex != bound:
                g11.glBindTexture(GL.GL_TEXTURE_2D, tex)
                bound = tex
            g10.glScissor(x, y, w, h)
            g32.glDrawElementsBaseVertex(GL.GL_TRIANGLES, count, _IDX_TYPE, ctypes.c_void_p(offset), base)

    def _restore(self, saved: list[int], enabled: list[bool]) -> None:
        """The GL state `render` found (`saved`: the _INTS, `enabled`: the _CAPS; viewport and scissor box
        in `_vp` / `_sc`)."""
        (program, active, tex2d, array_buf, vao, src_rgb, dst_rgb, src_a, dst_a, eq_rgb, eq_a) = saved
        g30.glBindVertexArray(vao)  # restores that VAO's element buffer binding with it
        g15.glBindBuffer(GL.GL_ARRAY_BUFFER, array_buf)
        g20.glUseProgram(program)
        g13.glActiveTexture(active)
        g11.glBindTexture(GL.GL_TEXTURE_2D, tex2d)
        g20.glBlendEquationSeparate(eq_rgb, eq_a)
        g14.glBlendFuncSeparate(src_rgb, dst_rgb, src_a, dst_a)
        for cap, on in zip(_CAPS, enabled, strict=True):
            (g10.glEnable if on else g10.glDisable)(cap)
        g10.glScissor(*self._sc)
        g10.glViewport(*self._vp)
