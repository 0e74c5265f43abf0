#version 120
// A soft round sprite, exactly zero (with zero slope) at its rim, so no visible squares. Its light
// x = v_color * g is tone-mapped here, s = 1 - exp(-x), and blended with
// glBlendFunc(GL_ONE_MINUS_DST_COLOR, GL_ONE) ("screen"): dst = 1 - (1 - dst)(1 - s). Over all sprites
// that is background + (1 - background)(1 - exp(-sum x)), the same as accumulating x in an HDR buffer
// and tone-mapping once (see app/render/particles.py). (1 - r^2)^3 is within 0.075 of the rim-shifted
// gaussian exp(-4 r^2) it replaced, for two multiplies instead of an exponential.

varying vec3 v_color;

void main()
{
    vec2 p = gl_PointCoord * 2.0 - 1.0;
    float r2 = dot(p, p);
    if (r2 >= 1.0)
        discard;
    float q = 1.0 - r2;
    float g = q * q * q;
    gl_FragColor = vec4(1.0 - exp(-v_color * g), 1.0);
}
