#version 120
// The splat draw style's frame (app/render/splat_layer.py): one quad over the viewport, a_corner in
// [-1, 1]^2. The CUDA kernels write the image top row first, as recorded frames are; a GL texture's first
// row is its bottom one (t = 0), so t runs from 1 at the bottom of the viewport to 0 at its top.
attribute vec2 a_corner;
varying vec2 v_uv;

void main() {
    v_uv = vec2(0.5 * (a_corner.x + 1.0), 0.5 * (1.0 - a_corner.y));
    gl_Position = vec4(a_corner, 0.0, 1.0);
}
