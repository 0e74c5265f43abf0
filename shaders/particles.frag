#version 120
// A soft gaussian sprite, exactly zero at its rim (no visible squares), added to the HDR target
// with glBlendFunc(GL_ONE, GL_ONE).

varying vec3 v_color;

const float K = 4.0;                 // exp(-K r^2): the rim (r = 1) is at 1.8% before the shift
const float RIM = 0.01831563888873418;  // exp(-K)

void main()
{
    vec2 p = gl_PointCoord * 2.0 - 1.0;
    float r2 = dot(p, p);
    if (r2 >= 1.0)
        discard;
    float g = (exp(-K * r2) - RIM) / (1.0 - RIM);
    gl_FragColor = vec4(v_color * g, g);
}
