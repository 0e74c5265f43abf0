#version 120
// One GL point per body. a_pos is the backends' float4 layout [x, y, z, m]; a_speed is |v| (colour by force
// error: the body's place on the error legend, 0..1, app/engine/error_colours.py); a_comp is
// the body's component (app.components), an index into the per-component tables: colour and gain
// (brightness, 0 = hidden: such a body is put outside the clip volume and adds no light).
// The sprite is twice the nominal diameter so the gaussian tail has room; sprites smaller than
// u_min_sprite px are drawn at u_min_sprite px and dimmed by the area ratio (same light, no aliasing).

attribute vec4 a_pos;
attribute float a_speed;
attribute float a_comp;

uniform mat4 u_view;
uniform mat4 u_proj;
uniform float u_point_size;       // nominal diameter in pixels of a body of mean mass
uniform float u_density_size;     // (16384 / N)^(1/4) above 16k bodies: area, hence light, ~ 1/sqrt(N)
uniform float u_size_by_mass;     // 1.0: scale by sqrt(m / mean m), clamped; 0.0: all the same size
uniform float u_inv_mean_mass;
uniform float u_inv_speed_scale;  // 1 / (robust speed scale): speed * this = 1 at the top of the map
uniform float u_color_by;         // 0 speed, 1 mass, 2 none, 3 component, 4 component x speed, 5 x mass,
                                  // 6 force error: a_speed is already the colormap position, 0..1
uniform float u_cmap_low;         // the colormap position of the lowest value (keeps slow bodies visible)
uniform float u_brightness;
uniform float u_min_sprite;       // render.min_sprite, px
uniform sampler2D u_cmap;         // 256 x 1 RGB
uniform vec3 u_comp_color[16];    // per component (MAX_COMPONENTS in app/components.py)
uniform float u_comp_gain[16];

varying vec3 v_color;

const float MAX_SPRITE = 128.0;

void main()
{
    int k = int(clamp(a_comp, 0.0, 15.0) + 0.5);
    float comp_gain = u_comp_gain[k];
    if (comp_gain <= 0.0) {  // hidden: outside the clip volume, no fragment, no light
        gl_Position = vec4(0.0, 0.0, 2.0, 1.0);
        gl_PointSize = 1.0;
        v_color = vec3(0.0);
        return;
    }
    gl_Position = u_proj * (u_view * vec4(a_pos.xyz, 1.0));

    float rel_mass = max(a_pos.w * u_inv_mean_mass, 0.0);
    float d = u_point_size * u_density_size;
    if (u_size_by_mass > 0.5)
        d *= clamp(sqrt(rel_mass), 0.5, 6.0);
    float sprite = 2.0 * d;
    float drawn = clamp(sprite, u_min_sprite, MAX_SPRITE);
    gl_PointSize = drawn;
    float gain = (sprite / drawn) * (sprite / drawn);

    float quantity = mod(u_color_by, 4.0);  // component x speed / x mass shade by speed / mass
    bool by_error = u_color_by > 5.5;
    float t;
    if (by_error)
        t = clamp(a_speed, 0.0, 1.0);
    else if (quantity < 0.5)
        t = clamp(a_speed * u_inv_speed_scale, 0.0, 1.0);
    else if (quantity < 1.5)
        t = clamp(0.5 + 0.25 * log2(max(rel_mass, 1e-6)), 0.0, 1.0);
    else
        t = 0.75;
    vec3 color;
    if (u_color_by < 2.5 || by_error)
        color = texture2DLod(u_cmap, vec2(mix(u_cmap_low, 1.0, t), 0.5), 0.0).rgb;
    else if (u_color_by < 3.5)
        color = u_comp_color[k];
    else
        color = u_comp_color[k] * mix(0.25, 1.25, t);
    v_color = color * (u_brightness * gain * comp_gain);
}
