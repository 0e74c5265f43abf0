// `fp64`: the whole step in double precision, for accuracy checks (1e-10 against the float64
// reference). The state lives in double buffers (pos64 [x, y, z, m], vel64, acc64); the integrators
// here advance them in double and write the float32 copies (pos x, y, z for the renderer — the mass in
// pos.w is left alone — vel and |v|) so that the renderer, the non-finite check and a switch back to
// an fp32 kernel see the same bodies. Tiled like `shared`, with a dvec4 tile: ceil(ni / B) blocks of B
// threads with B * 32 bytes of dynamic shared memory. rsqrt() in double is the CUDA math library's
// (1 ulp); --use_fast_math does not touch double precision.
//
// The force entry is the range ABI of common.cuh in double, with the double result as well:
//     fp64_force_<model>_<self>(targets64, sources64, acc, ni, nj, eps2, G, H, acc64)   (eps2, G, H double)
// writes acc64[t] and its float copy acc[t] for t in [0, ni) (the host passes acc + i0 and acc64 + i0).
#include "common.cuh"

#define FP64_FORCE_ARGS                                                                                  \
    const nbody::dvec4* __restrict__ targets, const nbody::dvec4* __restrict__ sources,                 \
        float4* __restrict__ acc, const int ni, const int nj, const double eps2, const double G,          \
        const double H, nbody::dvec4* __restrict__ acc64

template <class Model, bool SOFT>
__device__ __forceinline__ void fp64_body(FP64_FORCE_ARGS) {
    extern __shared__ nbody::dvec4 tile64[];
    const int tid = threadIdx.x;
    const int tile_size = blockDim.x;
    const int t = blockIdx.x * tile_size + tid;
    const nbody::dvec4 zero = nbody::dvec4{0.0, 0.0, 0.0, 0.0};
    const nbody::dvec4 bi = (t < ni) ? targets[t] : zero;
    double3 ai = make_double3(0.0, 0.0, 0.0);
    for (int base = 0; base < nj; base += tile_size) {
        const int j = base + tid;
        tile64[tid] = (j < nj) ? sources[j] : zero;
        __syncthreads();
#pragma unroll 4
        for (int k = 0; k < tile_size; ++k) {
            ai = nbody::body_body_interaction_fp64<Model, SOFT>(ai, bi, tile64[k], eps2, G, H);
        }
        __syncthreads();
    }
    if (t < ni) {
        const double s = Model::repulsion ? 1.0 : G;
        const nbody::dvec4 a{s * ai.x, s * ai.y, s * ai.z, 0.0};
        acc64[t] = a;
        acc[t] = make_float4((float)a.x, (float)a.y, (float)a.z, 0.0f);
    }
}

NBODY_ENTRIES(fp64_force, fp64_body, , (FP64_FORCE_ARGS), (targets, sources, acc, ni, nj, eps2, G, H, acc64))

// The integrators' updates round exactly like numpy's `v + h * a` and `(v + dt * a) * damping` on
// float64: each product and each sum correctly rounded on its own, never one fused multiply-add (nvcc
// would contract `v + h * a` into a DFMA, which rounds once). With identical accelerations the GPU fp64
// path, the CPU backend (numba without fastmath) and the numpy reference then take bitwise-identical
// steps, which the tests require. Only x, y, z change: w (the mass in pos64) is kept.
__device__ __forceinline__ nbody::dvec4 step(nbody::dvec4 v, const double h, const nbody::dvec4 a) {
    v.x = __dadd_rn(v.x, __dmul_rn(h, a.x));
    v.y = __dadd_rn(v.y, __dmul_rn(h, a.y));
    v.z = __dadd_rn(v.z, __dmul_rn(h, a.z));
    return v;
}

__device__ __forceinline__ nbody::dvec4 scaled(nbody::dvec4 v, const double s) {
    v.x = __dmul_rn(v.x, s);
    v.y = __dmul_rn(v.y, s);
    v.z = __dmul_rn(v.z, s);
    return v;
}

__device__ __forceinline__ float speed64(const nbody::dvec4 v) {
    return (float)sqrt(fma(v.z, v.z, fma(v.y, v.y, v.x * v.x)));
}

__device__ __forceinline__ void store_render(float4* pos, float4* vel, const int i, const nbody::dvec4 p,
                                             const nbody::dvec4 v) {
    float4 q = pos[i];  // q.w, the float32 mass, is left as it is
    q.x = (float)p.x;
    q.y = (float)p.y;
    q.z = (float)p.z;
    pos[i] = q;
    vel[i] = make_float4((float)v.x, (float)v.y, (float)v.z, 0.0f);
}

extern "C" __global__ void fp64_kick_drift(nbody::dvec4* __restrict__ pos64, nbody::dvec4* __restrict__ vel64,
                                           const nbody::dvec4* __restrict__ acc64, float4* __restrict__ pos,
                                           float4* __restrict__ vel, const int n, const double half_dt,
                                           const double dt) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const nbody::dvec4 a = acc64[i];
    nbody::dvec4 v = vel64[i];
    nbody::dvec4 p = pos64[i];
    v = step(v, half_dt, a);
    p = step(p, dt, v);
    vel64[i] = v;
    pos64[i] = p;
    store_render(pos, vel, i, p, v);
}

extern "C" __global__ void fp64_kick(nbody::dvec4* __restrict__ vel64, const nbody::dvec4* __restrict__ acc64,
                                     float4* __restrict__ vel, float* __restrict__ speed, const int n,
                                     const double half_dt) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const nbody::dvec4 a = acc64[i];
    nbody::dvec4 v = vel64[i];
    v = step(v, half_dt, a);
    vel64[i] = v;
    vel[i] = make_float4((float)v.x, (float)v.y, (float)v.z, 0.0f);
    speed[i] = speed64(v);
}

extern "C" __global__ void fp64_euler_damped(nbody::dvec4* __restrict__ pos64, nbody::dvec4* __restrict__ vel64,
                                             const nbody::dvec4* __restrict__ acc64, float4* __restrict__ pos,
                                             float4* __restrict__ vel, float* __restrict__ speed,
                                             const int n, const double dt, const double damping) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const nbody::dvec4 a = acc64[i];
    nbody::dvec4 v = vel64[i];
    nbody::dvec4 p = pos64[i];
    v = scaled(step(v, dt, a), damping);
    p = step(p, dt, v);
    vel64[i] = v;
    pos64[i] = p;
    store_render(pos, vel, i, p, v);
    speed[i] = speed64(v);
}
