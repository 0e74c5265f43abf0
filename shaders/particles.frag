#version 120
// A soft round sprite, exactly zero (with zero slope) at its rim, so no visible squares, added to the
// HDR target with glBlendFunc(GL_ONE, GL_ONE). (1 - r^2)^3 is within 0.075 of the rim-shifted gaussian
// exp(-4 r^2) it replaced, for two multiplies instead of an exponential: the sprite pass is fill-bound on
// GH100's few graphics units.

varying vec3 v_color;

void main()
{
    vec2 p = gl_PointCoord * 2.0 - 1.0;
    float r2 = dot(p, p);
    if (r2 >= 1.0)
        discard;
    float q = 1.0 - r2;
    float g = q * q * q;
    gl_FragColor = vec4(v_color * g, g);
}
