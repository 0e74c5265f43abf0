// `fp64`: the whole step in double precision, for accuracy checks (1e-10 against the float64
// reference). The state lives in double buffers (pos64 [x, y, z, m], vel64, acc64); the integrators
// here advance them in double and write the float32 copies (pos x, y, z for the renderer — the mass in
// pos.w is left alone — vel and |v|) so that the renderer, the non-finite check and a switch back to
// an fp32 kernel see the same bodies. Tiled like `shared`, with a dvec4 tile (32 bytes per thread
// of dynamic shared memory). rsqrt() in double is the CUDA math library's (1 ulp); --use_fast_math
// does not touch double precision.
//
//     fp64_force_<model>_<self>(pos64, acc, n, eps2, G, H, acc64)   (eps2, G, H as double)
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void fp64_body(const nbody::dvec4* __restrict__ pos64, float4* __restrict__ acc,
                                          const int n, const double eps2, const double G, const double H,
                                          nbody::dvec4* __restrict__ acc64) {
    extern __shared__ nbody::dvec4 tile64[];
    const int tid = threadIdx.x;
    const int tile_size = blockDim.x;
    const int i = blockIdx.x * tile_size + tid;
    const nbody::dvec4 zero = nbody::dvec4{0.0, 0.0, 0.0, 0.0};
    const nbody::dvec4 bi = (i < n) ? pos64[i] : zero;
    double3 ai = make_double3(0.0, 0.0, 0.0);
    for (int base = 0; base < n; base += tile_size) {
        const int j = base + tid;
        tile64[tid] = (j < n) ? pos64[j] : zero;
        __syncthreads();
#pragma unroll 4
        for (int k = 0; k < tile_size; ++k) {
            ai = nbody::body_body_interaction_fp64<Model, SOFT>(ai, bi, tile64[k], eps2, G, H);
        }
        __syncthreads();
    }
    if (i < n) {
        const double s = Model::repulsion ? 1.0 : G;
        const nbody::dvec4 a{s * ai.x, s * ai.y, s * ai.z, 0.0};
        acc64[i] = a;
        acc[i] = make_float4((float)a.x, (float)a.y, (float)a.z, 0.0f);
    }
}

#define FP64_ENTRY(SUFFIX, MODEL, SOFT)                                                              \
    extern "C" __global__ void fp64_force_##SUFFIX(const nbody::dvec4* __restrict__ pos64,               \
                                                   float4* __restrict__ acc, const int n,           \
                                                   const double eps2, const double G, const double H, \
                                                   nbody::dvec4* __restrict__ acc64) {                   \
        fp64_body<nbody::MODEL, SOFT>(pos64, acc, n, eps2, G, H, acc64);                              \
    }
FP64_ENTRY(gravity_soft, Gravity, true)
FP64_ENTRY(gravity_plain, Gravity, false)
FP64_ENTRY(repulsion_soft, GravityRepulsion, true)
FP64_ENTRY(repulsion_plain, GravityRepulsion, false)

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
    v.x = fma(a.x, half_dt, v.x);
    v.y = fma(a.y, half_dt, v.y);
    v.z = fma(a.z, half_dt, v.z);
    p.x = fma(v.x, dt, p.x);
    p.y = fma(v.y, dt, p.y);
    p.z = fma(v.z, dt, p.z);
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
    v.x = fma(a.x, half_dt, v.x);
    v.y = fma(a.y, half_dt, v.y);
    v.z = fma(a.z, half_dt, v.z);
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
    v.x = fma(a.x, dt, v.x) * damping;
    v.y = fma(a.y, dt, v.y) * damping;
    v.z = fma(a.z, dt, v.z) * damping;
    p.x = fma(v.x, dt, p.x);
    p.y = fma(v.y, dt, p.y);
    p.z = fma(v.z, dt, p.z);
    vel64[i] = v;
    pos64[i] = p;
    store_render(pos, vel, i, p, v);
    speed[i] = speed64(v);
}
