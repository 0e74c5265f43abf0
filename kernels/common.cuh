// NBody Live: the one body-body interaction every CUDA variant uses (CUDA Handbook `bodyBodyInteraction`).
//
// Mirrors app/physics.py. With d = x_j - x_i and s² = r² + ε²:
//     gravity:            a_i += m_j d / s³            (times G once, after the sum)
//     gravity-repulsion:  a_i += m_j d (G / s³ - H / s⁵)
//
// Two specialisations of the self term:
//   SOFT  (ε² > 0, the host passes ε² >= NBODY_MIN_SOFT_EPS2): no branch at all; the self term and the
//         zero-mass padding bodies have d = 0 or m = 0 and add exactly zero.
//   PLAIN (ε = 0): 1/s is replaced by 0 where s² = 0 (FSETP + FSEL, not a branch), which skips the self
//         term and any coincident pair.
//
// Hot-loop cost of the gravity interaction, written so the compiler emits exactly this (checked with
// cuobjdump -sass; see tests/test_kernels_compile.py): 3 FADD (d), 3 FFMA (s² from ε²), MUFU.RSQ,
// 3 FMUL (1/s³ and m/s³), 3 FFMA (accumulate) = 12 FP32-pipe instructions + 1 MUFU.
//
// Every kernels/*.cu includes this file: the interaction is written once.
#pragma once

#include <cuda_runtime.h>

// Below this ε² the branch-free form could overflow (1/s⁵ of the repulsion model): the host then uses
// the PLAIN form, passing ε² itself (or 0 when it is below FLT_MIN).
#define NBODY_MIN_SOFT_EPS2 1e-12f

namespace nbody {

struct Gravity {
    static constexpr bool repulsion = false;
};
struct GravityRepulsion {
    static constexpr bool repulsion = true;
};

// 1/s from s²: SOFT has s² >= ε² > 0; PLAIN maps s² = 0 (the self term) to 0 instead of +inf.
template <bool SOFT>
__device__ __forceinline__ float inv_distance(float s2) {
    if (SOFT) {
        return rsqrtf(s2);
    } else {
        return (s2 > 0.0f) ? rsqrtf(s2) : 0.0f;
    }
}

// a_i += contribution of body j. `bi`, `bj` are [x, y, z, m]; G and H are used by the repulsion model
// only (gravity multiplies the finished sum by G, see finish_acceleration).
template <class Model, bool SOFT>
__device__ __forceinline__ float3 body_body_interaction(float3 ai, const float4 bi, const float4 bj,
                                                        const float eps2, const float G, const float H) {
    const float dx = bj.x - bi.x;  // 3 FADD
    const float dy = bj.y - bi.y;
    const float dz = bj.z - bi.z;
    const float s2 = fmaf(dz, dz, fmaf(dy, dy, fmaf(dx, dx, eps2)));  // 3 FFMA
    const float inv = inv_distance<SOFT>(s2);                           // MUFU.RSQ
    float w;
    if (Model::repulsion) {
        const float inv2 = inv * inv;
        const float inv3 = inv2 * inv;
        w = bj.w * inv3 * fmaf(-H, inv2, G);  // m (G / s³ - H / s⁵)
    } else {
        w = bj.w * (inv * inv * inv);  // 3 FMUL: m / s³
    }
    ai.x = fmaf(dx, w, ai.x);  // 3 FFMA
    ai.y = fmaf(dy, w, ai.y);
    ai.z = fmaf(dz, w, ai.z);
    return ai;
}

// The float4 written to the acceleration buffer: G applied once for plain gravity.
template <class Model>
__device__ __forceinline__ float4 finish_acceleration(const float3 a, const float G) {
    if (Model::repulsion) {
        return make_float4(a.x, a.y, a.z, 0.0f);
    }
    return make_float4(G * a.x, G * a.y, G * a.z, 0.0f);
}

// Padding for tail tiles: a massless body at the origin adds exactly zero (m = 0, and s² >= ε² > 0 for
// SOFT; s² = 0 maps to 1/s = 0 for PLAIN).
__device__ __forceinline__ float4 massless_body() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// Non-finite test on the bit pattern (exponent all ones): immune to fast-math assumptions.
__device__ __forceinline__ bool not_finite(const float x) {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

}  // namespace nbody

// Every force kernel has this signature:
//     (const float4* pos [x,y,z,m], float4* acc [ax,ay,az,0], int n, float eps2, float G, float H)
// and each variant file instantiates its templated body for the 2 models x 2 self-term forms as
//     <prefix>_gravity_soft, <prefix>_gravity_plain, <prefix>_repulsion_soft, <prefix>_repulsion_plain.
// The Python registry (app/backends/cuda/registry.py) builds the symbol names the same way.
#define NBODY_FORCE_ARGS \
    const float4* __restrict__ pos, float4* __restrict__ acc, const int n, const float eps2, const float G, \
        const float H

#define NBODY_FORCE_ENTRY(PREFIX, BODY, SUFFIX, MODEL, SOFT)                         \
    extern "C" __global__ void PREFIX##_##SUFFIX(NBODY_FORCE_ARGS) {                 \
        BODY<nbody::MODEL, SOFT>(pos, acc, n, eps2, G, H);                             \
    }

#define NBODY_FORCE_ENTRIES(PREFIX, BODY)                                            \
    NBODY_FORCE_ENTRY(PREFIX, BODY, gravity_soft, Gravity, true)                     \
    NBODY_FORCE_ENTRY(PREFIX, BODY, gravity_plain, Gravity, false)                   \
    NBODY_FORCE_ENTRY(PREFIX, BODY, repulsion_soft, GravityRepulsion, true)          \
    NBODY_FORCE_ENTRY(PREFIX, BODY, repulsion_plain, GravityRepulsion, false)
