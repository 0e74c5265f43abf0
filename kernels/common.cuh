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

// NVRTC (the hot reload may compile with it) has CUDA's types built in and no host headers
#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>

#include <cstdint>
#else
typedef unsigned long long uintptr_t;  // (<cstdint>'s, on the 64-bit targets CUDA has)
#endif

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

// The weight w of source j (a_i += w d) from 1/s: m / s³ for gravity (3 FMUL), m (G / s³ - H / s⁵) with
// repulsion.
template <class Model>
__device__ __forceinline__ float source_weight(const float inv, const float m, const float G, const float H) {
    if (Model::repulsion) {
        const float inv2 = inv * inv;
        return m * (inv2 * inv) * fmaf(-H, inv2, G);
    }
    return m * (inv * inv * inv);
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
    const float w = source_weight<Model>(inv, bj.w, G, H);              // 3 FMUL (gravity)
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

// Two-level accumulation. The fp32 variants with one running sum per target add their terms into a
// partial sum that starts from zero and is added to the running total once it holds NBODY_PARTIAL_LEN
// sources (whole tiles: a tile of 1,024 closes one each tile, one of 64 every 16 tiles):
//     part = 0;  part += w_j d_j for the next 1,024 sources;  a_i += part;  ...
// (register-blocked's source slices and atomics-n3l's tasks are partial sums of their own). One fp32
// accumulator over all N sources loses whole terms once it is large: a term below half an ulp of the
// running sum rounds away, and the terms of a distant cluster, all of one sign and size, are lost alike,
// so the error grows like N u |a|, not √N u |a|. Measured with a CPU emulation of this arithmetic that
// gives the H200's figures to every printed digit: `collision` scaled by 5 (bench/realn.sh), N = 81,920:
// the primary's inner bodies (|a| ≈ 0.28) added the secondary's 40,960 terms of ≈ 1.3e-8 < ulp/2 to one
// sum and lost up to 88% of its pull: max rel error 1.66e-3. With partial sums of 1,024 sources 7.8e-7
// (of 256: 2.6e-6); at N = 1,048,576: 2.1e-2 with one sum, 1.9e-5 with 1,024 (3.7e-4 with 64: the
// length must not follow the block size). docs/kernels.md, "Accuracy", has the rest.
// Cost: 3 FADD and an integer compare per tile or NBODY_PARTIAL_LEN sources, outside the hot loop.
#define NBODY_PARTIAL_LEN 1024

__device__ __forceinline__ float3 zero3() { return make_float3(0.0f, 0.0f, 0.0f); }

// The running total plus one finished partial sum (3 FADD).
__device__ __forceinline__ float3 add3(const float3 a, const float3 b) {
    return make_float3(a.x + b.x, a.y + b.y, a.z + b.z);
}

// After `added` more sources went into `part`: once it holds NBODY_PARTIAL_LEN or more, add it to
// `total` and start the next one. The caller adds the last, open partial sum after its loop.
__device__ __forceinline__ void close_partial(float3& total, float3& part, int& count, const int added) {
    count += added;
    if (count >= NBODY_PARTIAL_LEN) {
        total = add3(total, part);
        part = zero3();
        count = 0;
    }
}

// Padding for tail tiles: a massless body at the origin adds exactly zero (m = 0, and s² >= ε² > 0 for
// SOFT; s² = 0 maps to 1/s = 0 for PLAIN).
__device__ __forceinline__ float4 massless_body() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// targets - sources in bodies, so that target t is source t + offset when it is one (the host passes
// pos + i0 and pos + j0: offset = i0 - j0). For the two variants that must know which source is the
// target itself rather than rely on d = 0 (gpu5's textbook branch, register-blocked's scaled form). From
// integer addresses, as comparing pointers into different buffers is undefined in C++; for two buffers
// no index pair in range matches (that would take equal addresses), so a copy of a source elsewhere is
// not its self term.
__device__ __forceinline__ long long target_offset(const float4* targets, const float4* sources) {
    const uintptr_t d = reinterpret_cast<uintptr_t>(targets) - reinterpret_cast<uintptr_t>(sources);
    return static_cast<long long>(d) / static_cast<long long>(sizeof(float4));
}

// Non-finite test on the bit pattern (exponent all ones): immune to fast-math assumptions.
__device__ __forceinline__ bool not_finite(const float x) {
    return (__float_as_uint(x) & 0x7f800000u) == 0x7f800000u;
}

}  // namespace nbody

// Every force kernel (all variants but atomics-n3l, see atomics_n3l.cu) has this signature:
//     (const float4* targets [x,y,z,m], const float4* sources [x,y,z,m], float4* acc [ax,ay,az,0],
//      int ni, int nj, float eps2, float G, float H, ...variant parameters)
// (fp64.cu: the same in double, plus its double result) and writes acc[t] = the acceleration of
// targets[t] from sources[0..nj), for every t in [0, ni) and nothing else: a range of targets against a
// range of sources, so that one launch can be a multi-GPU share, a tree-code leaf or a validation sample.
// The host passes pos + i0, pos + j0 and acc + i0 (the kernels never see i0, j0); the full evaluation
// passes pos twice with ni == nj. targets and sources may therefore alias: nothing is written through
// them, which keeps __restrict__ valid. Each variant's head comment gives its launch geometry.
// A target that is also a source needs no index test: SOFT adds exactly zero at d = 0 and PLAIN maps
// s² = 0 to 1/s = 0, so the self term is skipped by position. Only gpu5's textbook branch and
// register-blocked's scaled form (whose self pair is not exactly zero) must know which source is the
// target itself; nbody::target_offset tells them from the addresses.
// Each variant file instantiates its templated body for the 2 models x 2 self-term forms as
//     <prefix>_gravity_soft, <prefix>_gravity_plain, <prefix>_repulsion_soft, <prefix>_repulsion_plain.
// The Python registry (app/backends/cuda/registry.py) builds the symbol names the same way.
#define NBODY_FORCE_ARGS                                                                                    \
    const float4* __restrict__ targets, const float4* __restrict__ sources, float4* __restrict__ acc,      \
        const int ni, const int nj, const float eps2, const float G, const float H
// NBODY_FORCE_ARGS passed on, for a body template called from an entry or a specialisation wrapper.
#define NBODY_FORCE_PASS targets, sources, acc, ni, nj, eps2, G, H

// The four entries of any parameter list:
//     NBODY_ENTRIES(PREFIX, BODY, ATTR, (PARAMS...), (ARGS...))
// defines extern "C" PREFIX_<model>_<self>(PARAMS...) calling BODY<Model, SOFT>(ARGS...). ATTR is e.g.
// __launch_bounds__(256) or empty.
#define NBODY_UNPACK(...) __VA_ARGS__
#define NBODY_ENTRY(PREFIX, BODY, SUFFIX, MODEL, SOFT, ATTR, PARAMS, ARGS)                               \
    extern "C" __global__ void ATTR PREFIX##_##SUFFIX(NBODY_UNPACK PARAMS) {                              \
        BODY<nbody::MODEL, SOFT>(NBODY_UNPACK ARGS);                                                      \
    }
#ifndef NBODY_ONE_FORM
#define NBODY_ENTRIES(PREFIX, BODY, ATTR, PARAMS, ARGS)                                                   \
    NBODY_ENTRY(PREFIX, BODY, gravity_soft, Gravity, true, ATTR, PARAMS, ARGS)                            \
    NBODY_ENTRY(PREFIX, BODY, gravity_plain, Gravity, false, ATTR, PARAMS, ARGS)                          \
    NBODY_ENTRY(PREFIX, BODY, repulsion_soft, GravityRepulsion, true, ATTR, PARAMS, ARGS)                 \
    NBODY_ENTRY(PREFIX, BODY, repulsion_plain, GravityRepulsion, false, ATTR, PARAMS, ARGS)
#else
// The hot reload's build (app/backends/cuda/reload_build.py) compiles only the form the run launches,
// a quarter of ptxas's work: -DNBODY_ONE_FORM=N, N = 0..3 in the order above.
#if NBODY_ONE_FORM == 0
#define NBODY_ENTRIES(PREFIX, BODY, ATTR, PARAMS, ARGS) \
    NBODY_ENTRY(PREFIX, BODY, gravity_soft, Gravity, true, ATTR, PARAMS, ARGS)
#elif NBODY_ONE_FORM == 1
#define NBODY_ENTRIES(PREFIX, BODY, ATTR, PARAMS, ARGS) \
    NBODY_ENTRY(PREFIX, BODY, gravity_plain, Gravity, false, ATTR, PARAMS, ARGS)
#elif NBODY_ONE_FORM == 2
#define NBODY_ENTRIES(PREFIX, BODY, ATTR, PARAMS, ARGS) \
    NBODY_ENTRY(PREFIX, BODY, repulsion_soft, GravityRepulsion, true, ATTR, PARAMS, ARGS)
#else
#define NBODY_ENTRIES(PREFIX, BODY, ATTR, PARAMS, ARGS) \
    NBODY_ENTRY(PREFIX, BODY, repulsion_plain, GravityRepulsion, false, ATTR, PARAMS, ARGS)
#endif
#endif

// The force entries: BODY<Model, SOFT>(NBODY_FORCE_ARGS).
#define NBODY_FORCE_ENTRIES(PREFIX, BODY) \
    NBODY_ENTRIES(PREFIX, BODY, , (NBODY_FORCE_ARGS), (NBODY_FORCE_PASS))

// ======================================================================================================
// Additions for the kernel suite (issue 5). Everything below is additive: the interaction above is
// unchanged and remains what `naive`, `shared` and most variants call. The forms below are the SAME
// physics written differently, kept here so that every way of writing the interaction lives in one file.
// ======================================================================================================

// Force entries with a launch-bounds attribute and extra trailing arguments (register-blocked, ...):
//     NBODY_FORCE_ENTRIES_X(PREFIX, BODY, ATTR, (PARAMS...), (ARGS...))
// defines PREFIX_<model>_<self>(NBODY_FORCE_ARGS, PARAMS...) calling BODY<Model, SOFT>(targets, sources,
// acc, ni, nj, eps2, G, H, ARGS...).
#define NBODY_FORCE_ENTRIES_X(PREFIX, BODY, ATTR, PARAMS, ARGS)                                          \
    NBODY_ENTRIES(PREFIX, BODY, ATTR, (NBODY_FORCE_ARGS, NBODY_UNPACK PARAMS),                            \
                  (NBODY_FORCE_PASS, NBODY_UNPACK ARGS))

// Same, without extra arguments but with an attribute (block-template's __launch_bounds__(BS), ...).
#define NBODY_FORCE_ENTRIES_A(PREFIX, BODY, ATTR) \
    NBODY_ENTRIES(PREFIX, BODY, ATTR, (NBODY_FORCE_ARGS), (NBODY_FORCE_PASS))

// The register cap of the one-sum fp32 loops with a run-time tile or trip count (naive, shared,
// shared-unroll, shared-ptx-fma, multi-thread-per-body, streams-remainder, pair-matrix; block-template
// gets 32 from __launch_bounds__(BS, 2048 / BS)). NBODY_FORCE_ARGS puts G and H at parameter offsets
// 0x234 and 0x238, no longer one 8-byte pair (one LDC.64), and without the cap ptxas gave the
// repulsion-plain entries 34 registers instead of 32 (at B = 256: 6 blocks per SM instead of 8); the
// two-level sum's partial and count (below) took several entries to 39-42. Capped: 32, no spills, the
// same hot loop (FP32 count per interaction unchanged, checked with cuobjdump).
#define NBODY_TILED_MAXNREG __maxnreg__(32)

namespace nbody {

// --- the textbook form (`gpu5-branchy`): sqrt and divides, the caller skips the self pair -------------
// a_i += m_j d / r³ with r = sqrt(s²); repulsion a_i += m_j d (G / r³ - H / r⁵). For PLAIN (ε = 0) the
// caller's branch also skips coincident pairs (s² = 0).
template <class Model>
__device__ __forceinline__ float3 body_body_interaction_divide(float3 ai, const float4 bi, const float4 bj,
                                                               const float eps2, const float G,
                                                               const float H) {
    const float dx = bj.x - bi.x;
    const float dy = bj.y - bi.y;
    const float dz = bj.z - bi.z;
    const float s2 = dx * dx + dy * dy + dz * dz + eps2;
    const float r = sqrtf(s2);
    const float r3 = s2 * r;
    float w;
    if (Model::repulsion) {
        w = bj.w * (G / r3 - H / (r3 * s2));
    } else {
        w = bj.w / r3;
    }
    ai.x += dx * w;
    ai.y += dy * w;
    ai.z += dz * w;
    return ai;
}

// --- the distance chain as inline PTX fma.rn.f32 (`shared-ptx-fma`) -----------------------------------
// (Host compilers, e.g. a CPU emulation of these kernels, get the plain C++ operations instead.)
__device__ __forceinline__ float ptx_fma(const float a, const float b, const float c) {
#if defined(__CUDA_ARCH__)
    float d;
    asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(d) : "f"(a), "f"(b), "f"(c));
    return d;
#else
    return fmaf(a, b, c);
#endif
}
__device__ __forceinline__ float ptx_sub(const float a, const float b) {
#if defined(__CUDA_ARCH__)
    float d;
    asm("sub.rn.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
#else
    return a - b;
#endif
}

template <class Model, bool SOFT>
__device__ __forceinline__ float3 body_body_interaction_ptx(float3 ai, const float4 bi, const float4 bj,
                                                            const float eps2, const float G, const float H) {
    const float dx = ptx_sub(bj.x, bi.x);
    const float dy = ptx_sub(bj.y, bi.y);
    const float dz = ptx_sub(bj.z, bi.z);
    const float s2 = ptx_fma(dz, dz, ptx_fma(dy, dy, ptx_fma(dx, dx, eps2)));
    const float inv = inv_distance<SOFT>(s2);
    float w;
    if (Model::repulsion) {
        const float inv2 = inv * inv;
        w = bj.w * (inv2 * inv) * ptx_fma(-H, inv2, G);
    } else {
        w = bj.w * (inv * inv * inv);
    }
    ai.x = ptx_fma(dx, w, ai.x);
    ai.y = ptx_fma(dy, w, ai.y);
    ai.z = ptx_fma(dz, w, ai.z);
    return ai;
}

// --- the GPU Gems 3 / CUDA samples form (`shared`, the baseline every speed-up is measured against) -----
// As in NVIDIA's nbody sample: distSqr = d·d, then distSqr += ε². nvcc contracts d·d into FMUL + 2 FFMA
// but may not fold the separate += ε² into them (that would reassociate), so this costs 13 FP32-pipe
// instructions + 1 MUFU: one FADD more than body_body_interaction, the first lesson of the suite.
template <class Model, bool SOFT>
__device__ __forceinline__ float3 body_body_interaction_gems3(float3 ai, const float4 bi, const float4 bj,
                                                              const float eps2, const float G,
                                                              const float H) {
    const float dx = bj.x - bi.x;
    const float dy = bj.y - bi.y;
    const float dz = bj.z - bi.z;
    float s2 = dx * dx + dy * dy + dz * dz;
    s2 += eps2;
    const float w = source_weight<Model>(inv_distance<SOFT>(s2), bj.w, G, H);
    ai.x += dx * w;
    ai.y += dy * w;
    ai.z += dz * w;
    return ai;
}

// --- mass-scaled coordinates (`register-blocked`, gravity with ε > 0): 11 FP32 + 1 MUFU --------------
// With c_j = m_j^(-1/2), store the source as (c x_j, c y_j, c z_j, -c_j) and e_j = c_j² ε². Then
//     d' = fma(-c_j, x_i, c_j x_j) = c_j d            (3 FFMA instead of 3 FADD: same cost)
//     s'² = d'·d' + e_j = c_j² (r² + ε²)              (3 FFMA)
//     q  = rsqrt(s'²) = 1 / (c_j s)                    (MUFU.RSQ)
//     q³ d' = c_j d / (c_j³ s³) = m_j d / s³           (2 FMUL: q², q³; the mass multiply is gone)
//     a_i += q³ d'                                     (3 FFMA)
// 11 FP32-pipe instructions instead of 12: the per-pair `m_j *` is folded into the per-source scale,
// computed once per tile entry and reused by every thread and every register-blocked body.
// Massless bodies (padding, test particles) get c = 0 and e = 1: d' = 0, so they add exactly zero.
// e is floored at 1e-25 so that q³ stays finite (the self pair has d' = 0 and must add 0, not NaN).
struct ScaledSource {
    float4 p;  // (c x, c y, c z, -c)
    float e;   // c² ε²
};

__device__ __forceinline__ ScaledSource scaled_source(const float4 b, const float eps2) {
    ScaledSource s;
    const bool massive = b.w > 0.0f;
    const float c = massive ? rsqrtf(b.w) : 0.0f;
    s.p = make_float4(c * b.x, c * b.y, c * b.z, -c);
    s.e = massive ? fmaxf(eps2 * c * c, 1e-25f) : 1.0f;
    return s;
}

__device__ __forceinline__ float3 body_body_interaction_scaled(float3 ai, const float3 xi, const float4 sj,
                                                               const float ej) {
    const float dx = fmaf(sj.w, xi.x, sj.x);  // 3 FFMA: c (x_j - x_i)
    const float dy = fmaf(sj.w, xi.y, sj.y);
    const float dz = fmaf(sj.w, xi.z, sj.z);
    const float s2 = fmaf(dz, dz, fmaf(dy, dy, fmaf(dx, dx, ej)));  // 3 FFMA
    const float q = rsqrtf(s2);                                      // MUFU.RSQ
    const float w = (q * q) * q;                                     // 2 FMUL
    ai.x = fmaf(dx, w, ai.x);                                        // 3 FFMA
    ai.y = fmaf(dy, w, ai.y);
    ai.z = fmaf(dz, w, ai.z);
    return ai;
}

// --- the pair weight for Newton's third law (`atomics-n3l`) --------------------------------------------
// f such that a_i += m_j f d and a_j -= m_i f d: gravity f = 1/s³ (G applied once after the sum),
// repulsion f = G/s³ - H/s⁵.
template <class Model, bool SOFT>
__device__ __forceinline__ float pair_weight(const float s2, const float G, const float H) {
    const float inv = inv_distance<SOFT>(s2);
    const float inv2 = inv * inv;
    if (Model::repulsion) {
        return (inv2 * inv) * fmaf(-H, inv2, G);
    }
    return inv2 * inv;
}

// --- double precision (`fp64`) ----------------------------------------------------------------------
// [x, y, z, m] in double, 32-byte aligned (CUDA 13 deprecates double4 for its ambiguous alignment).
struct __align__(32) dvec4 {
    double x, y, z, w;
};

template <class Model, bool SOFT>
__device__ __forceinline__ double3 body_body_interaction_fp64(double3 ai, const dvec4 bi, const dvec4 bj,
                                                              const double eps2, const double G,
                                                              const double H) {
    const double dx = bj.x - bi.x;
    const double dy = bj.y - bi.y;
    const double dz = bj.z - bi.z;
    const double s2 = fma(dz, dz, fma(dy, dy, fma(dx, dx, eps2)));
    double inv;
    if (SOFT) {
        inv = rsqrt(s2);
    } else {
        inv = (s2 > 0.0) ? rsqrt(s2) : 0.0;
    }
    const double inv2 = inv * inv;
    double w;
    if (Model::repulsion) {
        w = bj.w * (inv2 * inv) * fma(-H, inv2, G);
    } else {
        w = bj.w * (inv2 * inv);
    }
    ai.x = fma(dx, w, ai.x);
    ai.y = fma(dy, w, ai.y);
    ai.z = fma(dz, w, ai.z);
    return ai;
}

// --- the interaction forms as types, and the one tiled loop of the shared-memory variants ---------------
struct FoldedForm {  // body_body_interaction: 12 FP32 + 1 MUFU
    template <class Model, bool SOFT>
    static __device__ __forceinline__ float3 add(float3 ai, const float4 bi, const float4 bj, const float eps2,
                                                 const float G, const float H) {
        return body_body_interaction<Model, SOFT>(ai, bi, bj, eps2, G, H);
    }
};
struct Gems3Form {  // body_body_interaction_gems3: 13 FP32 + 1 MUFU
    template <class Model, bool SOFT>
    static __device__ __forceinline__ float3 add(float3 ai, const float4 bi, const float4 bj, const float eps2,
                                                 const float G, const float H) {
        return body_body_interaction_gems3<Model, SOFT>(ai, bi, bj, eps2, G, H);
    }
};
struct PtxForm {  // body_body_interaction_ptx
    template <class Model, bool SOFT>
    static __device__ __forceinline__ float3 add(float3 ai, const float4 bi, const float4 bj, const float eps2,
                                                 const float G, const float H) {
        return body_body_interaction_ptx<Model, SOFT>(ai, bi, bj, eps2, G, H);
    }
};

// The GPU Gems 3 ch. 31 tile walk (Nyland, Harris & Prins): a_i summed over sources [0, nj). Each thread of
// the block stores one float4 of the tile in `tile` (tile_size entries), __syncthreads, every thread runs
// the tile through Form (one broadcast LDS.128 per source) into the open partial sum (the two-level
// accumulation above), __syncthreads, next tile. CHECKED pads the
// last tile with massless bodies (any nj); without it the caller guarantees nj is a multiple of
// tile_size. A compile-time tile_size (block-template) gives the unrolled loop a known trip count.
template <class Model, bool SOFT, class Form, int UNROLL, bool CHECKED = true>
__device__ __forceinline__ float3 tiled_sum(const float4* __restrict__ sources, const int nj, const float4 bi,
                                            const float eps2, const float G, const float H, float4* tile,
                                            const int tile_size) {
    const int tid = threadIdx.x;
    float3 ai = zero3();
    float3 part = zero3();
    int count = 0;
    for (int base = 0; base < nj; base += tile_size) {
        const int j = base + tid;
        tile[tid] = (!CHECKED || j < nj) ? sources[j] : massless_body();
        __syncthreads();
#pragma unroll UNROLL
        for (int k = 0; k < tile_size; ++k) {
            part = Form::template add<Model, SOFT>(part, bi, tile[k], eps2, G, H);
        }
        close_partial(ai, part, count, tile_size);
        __syncthreads();
    }
    return add3(ai, part);
}

// One thread per target t (t >= ni: a padding thread that only helps load tiles): the tiled sum over
// all nj sources, written to acc[t] with G applied.
template <class Model, bool SOFT, class Form, int UNROLL>
__device__ __forceinline__ void tiled_force(NBODY_FORCE_ARGS, float4* tile, const int tile_size,
                                            const int t) {
    const float4 bi = (t < ni) ? targets[t] : massless_body();
    const float3 ai = tiled_sum<Model, SOFT, Form, UNROLL>(sources, nj, bi, eps2, G, H, tile, tile_size);
    if (t < ni) {
        acc[t] = finish_acceleration<Model>(ai, G);
    }
}

}  // namespace nbody
