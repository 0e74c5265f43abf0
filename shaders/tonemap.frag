#version 120
// Maps the additive HDR light of the particle pass to the screen: 1 - exp(-x) per channel, so dense
// cores whiten smoothly instead of clipping, then lays it over the background colour.
// Zero light gives exactly the background.

uniform sampler2D u_hdr;
uniform vec3 u_background;
uniform float u_exposure;
varying vec2 v_uv;

void main()
{
    vec3 light = texture2D(u_hdr, v_uv).rgb * u_exposure;
    vec3 mapped = 1.0 - exp(-max(light, 0.0));
    gl_FragColor = vec4(u_background + (1.0 - u_background) * mapped, 1.0);
}
