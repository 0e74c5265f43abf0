// `register-blocked`: each thread owns K targets (K in {1, 2, 4, 6}) and reuses every source body it
// loads from shared memory K times, so the LDS and the loop overhead are paid once per K interactions.
// For softened gravity (the common case) the tile holds sources in mass-scaled coordinates
// (nbody::scaled_source: (c x, c y, c z, -c) and c² ε² with c = m^(-1/2)), which removes the per-pair
// mass multiply: 11 FP32 + 1 MUFU per interaction (nbody::body_body_interaction_scaled); repulsion
// and ε = 0 use the standard interaction (12 FP32 + 1 MUFU), and so do the source tiles that hold
// the block's own targets (the self pairs must add exactly zero; which sources those are comes from
// the addresses, nbody::target_offset). So a target that is also a source must be passed as that
// source's own element (pos + i0 into the one buffer), never as a copy elsewhere: a copy's self pair
// would take the scaled form and add its rounding residual, about m |x| 2^-24 / ε³ (at ε² = 1e-10 and
// N = 2,000, 1e4 times the acceleration). See docs/kernels.md for the SASS.
//
// Small N: the nj sources are split across blocks (a 2D grid: blockIdx.x = target tile of B*K targets,
// blockIdx.y = j-slice of `slice_len` sources, a multiple of B), so that all SMs are busy even at
// N = 4,096. With one slice the kernel writes acc itself; with S slices each block writes raw partial
// sums to partial[slice * npad + t] (npad = gridDim.x * B * K) and regblock_reduce adds them over the
// ni targets (and applies G). Deterministic: no atomics.
//
// Symbols regblock_k<K>_b<B>_<model>_<self>(targets, sources, acc, ni, nj, eps2, G, H, partial,
// slice_len) for B in {64, 128, 256}; register_blocked_force_* is K = 4, B = 128. Block size must equal
// B; no dynamic shared memory.
#include "common.cuh"

template <int K, int B, class Model, bool SOFT>
__device__ __forceinline__ void regblock_body(NBODY_FORCE_ARGS, float4* __restrict__ partial,
                                              const int slice_len) {
    constexpr bool SCALED = SOFT && !Model::repulsion;
    __shared__ float4 tile[B];
    __shared__ __align__(16) float etile[B];
    const int tid = threadIdx.x;
    const int t0 = blockIdx.x * (B * K) + tid;
    float3 xi[K];
    float3 ai[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int t = t0 + k * B;
        const float4 p = (t < ni) ? targets[t] : nbody::massless_body();
        xi[k] = make_float3(p.x, p.y, p.z);
        ai[k] = make_float3(0.0f, 0.0f, 0.0f);
    }
    const int jbeg = blockIdx.y * slice_len;
    const int jend = min(nj, jbeg + slice_len);
    // The source index of this block's first target, clamped to [-B*K, nj] so that the per-tile test
    // stays 32-bit: past either end none of the block's B*K targets is a source (index in [0, nj)).
    const long long own = blockIdx.x * (B * K) + nbody::target_offset(targets, sources);
    const int self0 =
        static_cast<int>(min(max(own, static_cast<long long>(-B * K)), static_cast<long long>(nj)));
    for (int base = jbeg; base < jend; base += B) {
        // A tile that overlaps this block's own targets holds the self pairs: there the scaled form
        // would not give exactly zero (fma(-c, x, fl(c x)) is the rounding residual of c x, and the
        // softening amplifies it by 1/ε³), so those K tiles of nj/B take the standard interaction.
        const bool fast = SCALED && (base >= self0 + B * K || base + B <= self0);
        const int j = base + tid;
        const float4 b = (j < jend) ? sources[j] : nbody::massless_body();
        if (fast) {
            const nbody::ScaledSource s = nbody::scaled_source(b, eps2);
            tile[tid] = s.p;
            etile[tid] = s.e;
        } else {
            tile[tid] = b;
        }
        __syncthreads();
        if (fast) {
#pragma unroll 8
            for (int kk = 0; kk < B; ++kk) {
                const float4 sj = tile[kk];
                const float ej = etile[kk];
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    ai[k] = nbody::body_body_interaction_scaled(ai[k], xi[k], sj, ej);
                }
            }
        } else {
#pragma unroll 8
            for (int kk = 0; kk < B; ++kk) {
                const float4 sj = tile[kk];
#pragma unroll
                for (int k = 0; k < K; ++k) {
                    const float4 bi = make_float4(xi[k].x, xi[k].y, xi[k].z, 0.0f);
                    ai[k] = nbody::body_body_interaction<Model, SOFT>(ai[k], bi, sj, eps2, G, H);
                }
            }
        }
        __syncthreads();
    }
    const bool direct = (gridDim.y == 1);
    const long long npad = (long long)gridDim.x * (B * K);
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const int t = t0 + k * B;
        if (t < ni) {
            if (direct) {
                acc[t] = nbody::finish_acceleration<Model>(ai[k], G);
            } else {
                partial[blockIdx.y * npad + t] = make_float4(ai[k].x, ai[k].y, ai[k].z, 0.0f);
            }
        }
    }
}

#define RB_PARAMS (float4* __restrict__ partial, const int slice_len)
#define RB_ARGS (partial, slice_len)
#define RB_SPECIALISATION(K, B)                                                                    \
    template <class Model, bool SOFT>                                                              \
    __device__ __forceinline__ void regblock_##K##_##B(NBODY_FORCE_ARGS, float4* __restrict__ partial, \
                                                       const int slice_len) {                      \
        regblock_body<K, B, Model, SOFT>(NBODY_FORCE_PASS, partial, slice_len);                   \
    }                                                                                              \
    NBODY_FORCE_ENTRIES_X(regblock_k##K##_b##B, regblock_##K##_##B, __launch_bounds__(B, 1024 / B), \
                          RB_PARAMS, RB_ARGS)

RB_SPECIALISATION(1, 64)
RB_SPECIALISATION(1, 128)
RB_SPECIALISATION(1, 256)
RB_SPECIALISATION(2, 64)
RB_SPECIALISATION(2, 128)
RB_SPECIALISATION(2, 256)
RB_SPECIALISATION(4, 64)
RB_SPECIALISATION(4, 128)
RB_SPECIALISATION(4, 256)
RB_SPECIALISATION(6, 64)
RB_SPECIALISATION(6, 128)
RB_SPECIALISATION(6, 256)

NBODY_FORCE_ENTRIES_X(register_blocked_force, regblock_4_128, __launch_bounds__(128, 8), RB_PARAMS, RB_ARGS)

// acc[t] = scale * sum over slices of partial[s * npad + t] for t in [0, ni) (scale = G for gravity, 1 for
// repulsion); acc is the force entry's acc (acc + i0 on the host).
extern "C" __global__ void regblock_reduce(const float4* __restrict__ partial, float4* __restrict__ acc,
                                           const int ni, const int npad, const int slices,
                                           const float scale) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= ni) {
        return;
    }
    float x = 0.0f, y = 0.0f, z = 0.0f;
    for (int s = 0; s < slices; ++s) {
        const float4 p = partial[(long long)s * npad + t];
        x += p.x;
        y += p.y;
        z += p.z;
    }
    acc[t] = make_float4(scale * x, scale * y, scale * z, 0.0f);
}
