#version 120
// A full-screen quad: a_xy are the clip-space corners.

attribute vec2 a_xy;
varying vec2 v_uv;

void main()
{
    v_uv = a_xy * 0.5 + 0.5;
    gl_Position = vec4(a_xy, 0.0, 1.0);
}
