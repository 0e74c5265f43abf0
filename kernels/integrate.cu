// Integrators and checks shared by every force variant (one thread per body). They never touch the
// mass in pos.w, and they write |v| into the float speed buffer the renderer colours by.
//
//   leapfrog KDK:   kick_drift (v += a dt/2; x += v dt), force, kick (v += a dt/2)
//   euler-damped:   force, euler_damped (v = (v + a dt) * damping; x += v dt)
#include "common.cuh"

__device__ __forceinline__ float speed_of(const float4 v) {
    return sqrtf(fmaf(v.z, v.z, fmaf(v.y, v.y, v.x * v.x)));
}

extern "C" __global__ void kick_drift(float4* __restrict__ pos, float4* __restrict__ vel,
                                      const float4* __restrict__ acc, const int n, const float half_dt,
                                      const float dt) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const float4 a = acc[i];
    float4 v = vel[i];
    float4 p = pos[i];
    v.x = fmaf(a.x, half_dt, v.x);
    v.y = fmaf(a.y, half_dt, v.y);
    v.z = fmaf(a.z, half_dt, v.z);
    p.x = fmaf(v.x, dt, p.x);
    p.y = fmaf(v.y, dt, p.y);
    p.z = fmaf(v.z, dt, p.z);
    vel[i] = v;
    pos[i] = p;  // p.w, the mass, is written back unchanged
}

extern "C" __global__ void kick(float4* __restrict__ vel, const float4* __restrict__ acc,
                                float* __restrict__ speed, const int n, const float half_dt) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const float4 a = acc[i];
    float4 v = vel[i];
    v.x = fmaf(a.x, half_dt, v.x);
    v.y = fmaf(a.y, half_dt, v.y);
    v.z = fmaf(a.z, half_dt, v.z);
    vel[i] = v;
    speed[i] = speed_of(v);
}

extern "C" __global__ void euler_damped(float4* __restrict__ pos, float4* __restrict__ vel,
                                        const float4* __restrict__ acc, float* __restrict__ speed,
                                        const int n, const float dt, const float damping) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const float4 a = acc[i];
    float4 v = vel[i];
    float4 p = pos[i];
    v.x = fmaf(a.x, dt, v.x) * damping;
    v.y = fmaf(a.y, dt, v.y) * damping;
    v.z = fmaf(a.z, dt, v.z) * damping;
    p.x = fmaf(v.x, dt, p.x);
    p.y = fmaf(v.y, dt, p.y);
    p.z = fmaf(v.z, dt, p.z);
    vel[i] = v;
    pos[i] = p;
    speed[i] = speed_of(v);
}

// acc[i].xyz += part[i].xyz: a pair split's reduce-scatter adds another device's partial rows (copied here).
extern "C" __global__ void add_rows(float4* __restrict__ acc, const float4* __restrict__ part, const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const float4 p = part[i];
    float4 a = acc[i];
    a.x += p.x;
    a.y += p.y;
    a.z += p.z;
    acc[i] = a;
}

// |v| of every body, for the speed buffer after a load or a re-attach.
extern "C" __global__ void speeds(const float4* __restrict__ vel, float* __restrict__ speed, const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        speed[i] = speed_of(vel[i]);
    }
}

// The index of the first body whose position, mass or velocity is NaN/inf, or the untouched initial
// value (the host sets *first = INT_MAX before the launch). Run every few steps on the GPU; the host
// reads the 4-byte result only after the step's own synchronisation.
extern "C" __global__ void first_nonfinite(const float4* __restrict__ pos, const float4* __restrict__ vel,
                                           const int n, int* __restrict__ first) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    bool bad = false;
    if (i < n) {
        const float4 p = pos[i];
        const float4 v = vel[i];
        bad = nbody::not_finite(p.x) | nbody::not_finite(p.y) | nbody::not_finite(p.z) |
              nbody::not_finite(p.w) | nbody::not_finite(v.x) | nbody::not_finite(v.y) |
              nbody::not_finite(v.z);
    }
    // One atomic per warp that has a bad body: the lowest lane is the warp's lowest index.
    const unsigned mask = __ballot_sync(0xffffffffu, bad);
    if (mask != 0u && (threadIdx.x & 31) == __ffs(mask) - 1) {
        atomicMin(first, i);
    }
}

// A domain split keeps the state in the tree's key order (app/decomposition.py, Bonsai's layout): after
// each evaluation the rows move to their place in the new order. Two passes, because a row's new place
// may hold a row not yet read: the gather into scratch by the tree's order (order[k] = the row that goes
// to k) ...
extern "C" __global__ void key_order_gather(const int* __restrict__ order, const int n,
                                            const float4* __restrict__ vel, const float* __restrict__ speed,
                                            const int* __restrict__ ids, float4* __restrict__ svel,
                                            float* __restrict__ sspeed, int* __restrict__ sids) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) {
        return;
    }
    const int i = order[k];
    svel[k] = vel[i];
    sspeed[k] = speed[i];
    sids[k] = ids[i];
}

// ... then the state from it, with the positions the tree gathered in the same order (spos) and the
// accelerations its walk wrote in key order (sacc, whole after the exchange).
extern "C" __global__ void key_order_take(const int n, const float4* __restrict__ spos,
                                          const float4* __restrict__ sacc, const float4* __restrict__ svel,
                                          const float* __restrict__ sspeed, const int* __restrict__ sids,
                                          float4* __restrict__ pos, float4* __restrict__ acc,
                                          float4* __restrict__ vel, float* __restrict__ speed,
                                          int* __restrict__ ids) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) {
        return;
    }
    pos[k] = spos[k];
    acc[k] = sacc[k];
    vel[k] = svel[k];
    speed[k] = sspeed[k];
    ids[k] = sids[k];
}

// The renderer's rows are bodies in load order (its colours and components are): row k of a state in key
// order goes to the row of its body, ids[k].
extern "C" __global__ void scatter_by_id(const int n, const int* __restrict__ ids,
                                         const float4* __restrict__ pos, const float* __restrict__ speed,
                                         float4* __restrict__ out_pos, float* __restrict__ out_speed) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) {
        return;
    }
    const int body = ids[k];
    out_pos[body] = pos[k];
    out_speed[body] = speed[k];
}
