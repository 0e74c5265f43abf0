#version 120
// The tone-mapped frame as it is: one texel per pixel (nearest), no blending; the background is in it.
uniform sampler2D u_frame;
varying vec2 v_uv;

void main() {
    gl_FragColor = vec4(texture2D(u_frame, v_uv).rgb, 1.0);
}
