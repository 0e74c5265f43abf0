// `atomics-n3l`: Newton's third law. Each pair is evaluated once and its reaction force is added to
// the other body, so N²/2 pair evaluations serve N² interactions; the price is that partial forces
// from different warps meet in global memory, through FP atomics (float4 atomicAdd, sm_90).
//
// Work unit: one warp = an i-tile of 32*KI bodies (KI per lane, held in registers for the whole task)
// against `chunk` consecutive j-tiles of 64 bodies (2 per lane) at or right of the diagonal. For an
// off-diagonal j-tile the warp evaluates 32 x 2 x KI pairs per rotation step — each pair updates both
// a_i (kept in registers) and a_j (carried by the lane that holds body j) — then rotates the j-bodies
// and their partial forces one lane along with __shfl_sync (14 SHFL per step); after 32 steps every
// j-body is back in its own lane and its partial force is added to acc with one atomicAdd. A j-tile
// inside the i-tile (the diagonal) is evaluated the ordinary way, i side only. a_i is added with one
// atomic at the end of the task. Per pair: 16 FP32 + 1 MUFU for two interactions.
//
// acc must be zeroed before the launch (the host does a memset inside the force timing). Gravity is
// scaled by G at the atomic (scale = G), repulsion already carries G (scale = 1). The order of the
// atomic additions varies from run to run: the result is not bitwise reproducible.
//
// The one variant without the target/source ranges of common.cuh: Newton's third law pairs bodies
// within ONE set (a_i and a_j from the same pair), so the kernel is symmetric by construction and keeps
// the signature (pos, acc, n, ...) over bodies [0, n). The host evaluates ranges with it only where they
// are the same set (the full evaluation; a share of one set would pass pos + i0, acc + i0 and its n).
//
// Symbols n3l_ki<KI>_<model>_<self>(pos, acc, n, eps2, G, H, chunk, chunks_per_row, task_lo, task_hi),
// KI in {2, 4}; atomics_n3l_force_* is KI = 4. Block size <= 128. The tasks are numbered
// row * chunks_per_row + chunk over ceil(n / (32 KI)) rows; a launch runs the tasks [task_lo, task_hi),
// one warp each (empty warps exit): all of them for one device, a balanced slice of them per device of a
// pair split (app/decomposition.py PairTiles), which then adds the partial accelerations of the devices.
#include "common.cuh"

namespace {

template <class Model, bool SOFT>
__device__ __forceinline__ void n3l_pair(const float4 pi, float3& ai, const float4 pj, float3& aj,
                                         const float eps2, const float G, const float H) {
    const float dx = pj.x - pi.x;
    const float dy = pj.y - pi.y;
    const float dz = pj.z - pi.z;
    const float s2 = fmaf(dz, dz, fmaf(dy, dy, fmaf(dx, dx, eps2)));
    const float f = nbody::pair_weight<Model, SOFT>(s2, G, H);
    const float wj = pj.w * f;
    const float wi = pi.w * f;
    ai.x = fmaf(dx, wj, ai.x);
    ai.y = fmaf(dy, wj, ai.y);
    ai.z = fmaf(dz, wj, ai.z);
    aj.x = fmaf(-dx, wi, aj.x);
    aj.y = fmaf(-dy, wi, aj.y);
    aj.z = fmaf(-dz, wi, aj.z);
}

__device__ __forceinline__ float4 shfl4(const float4 v, const int src) {
    return make_float4(__shfl_sync(0xffffffffu, v.x, src), __shfl_sync(0xffffffffu, v.y, src),
                       __shfl_sync(0xffffffffu, v.z, src), __shfl_sync(0xffffffffu, v.w, src));
}

__device__ __forceinline__ float3 shfl3(const float3 v, const int src) {
    return make_float3(__shfl_sync(0xffffffffu, v.x, src), __shfl_sync(0xffffffffu, v.y, src),
                       __shfl_sync(0xffffffffu, v.z, src));
}

__device__ __forceinline__ void add_force(float4* acc, const int idx, const int n, const float3 a,
                                          const float scale) {
    if (idx < n) {
        atomicAdd(&acc[idx], make_float4(scale * a.x, scale * a.y, scale * a.z, 0.0f));
    }
}

}  // namespace

#define N3L_ARGS                                                                                         \
    const float4* __restrict__ pos, float4* __restrict__ acc, const int n, const float eps2, const float G, \
        const float H, const int chunk, const int chunks_per_row, const int task_lo, const int task_hi
#define N3L_PASS pos, acc, n, eps2, G, H, chunk, chunks_per_row, task_lo, task_hi

template <int KI, class Model, bool SOFT>
__device__ __forceinline__ void n3l_body(N3L_ARGS) {
    constexpr int TI = 32 * KI;  // bodies per i-tile
    constexpr int R = KI / 2;    // j-tiles (64 bodies) per i-tile
    const int lane = threadIdx.x & 31;
    const long long warp = task_lo + (((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5);
    if (warp >= task_hi) {
        return;  // the whole warp leaves together
    }
    const int ntj = (n + 63) / 64;
    const int nti = (n + TI - 1) / TI;
    const int row = (int)(warp / chunks_per_row);
    const int c = (int)(warp - (long long)row * chunks_per_row);
    if (row >= nti) {
        return;
    }
    const int jt0 = row * R + c * chunk;
    if (jt0 >= ntj) {
        return;  // the whole warp leaves together: no shuffle is left half-attended
    }
    const int jt1 = min(jt0 + chunk, ntj);
    const int src = (lane + 31) & 31;  // rotation: lane l takes what lane l-1 held
    const float scale = Model::repulsion ? 1.0f : G;
    constexpr int U = (KI == 2 && !Model::repulsion) ? 4 : (KI == 2 ? 2 : 1);  // unroll within 64 registers

    float4 pi[KI];
    float3 ai[KI];
#pragma unroll
    for (int k = 0; k < KI; ++k) {
        const int idx = row * TI + k * 32 + lane;
        pi[k] = (idx < n) ? pos[idx] : nbody::massless_body();
        ai[k] = make_float3(0.0f, 0.0f, 0.0f);
    }
    for (int jt = jt0; jt < jt1; ++jt) {
        const int ja = jt * 64 + lane;
        const int jb = ja + 32;
        float4 pa = (ja < n) ? pos[ja] : nbody::massless_body();
        float4 pb = (jb < n) ? pos[jb] : nbody::massless_body();
        if (jt < (row + 1) * R) {
            // Diagonal: the j-tile lies inside the i-tile. Every ordered pair once, i side only.
#pragma unroll 2
            for (int s = 0; s < 32; ++s) {
#pragma unroll
                for (int k = 0; k < KI; ++k) {
                    ai[k] = nbody::body_body_interaction<Model, SOFT>(ai[k], pi[k], pa, eps2, G, H);
                    ai[k] = nbody::body_body_interaction<Model, SOFT>(ai[k], pi[k], pb, eps2, G, H);
                }
                pa = shfl4(pa, src);
                pb = shfl4(pb, src);
            }
        } else {
            float3 aa = make_float3(0.0f, 0.0f, 0.0f);
            float3 ab = make_float3(0.0f, 0.0f, 0.0f);
#pragma unroll U
            for (int s = 0; s < 32; ++s) {
#pragma unroll
                for (int k = 0; k < KI; ++k) {
                    n3l_pair<Model, SOFT>(pi[k], ai[k], pa, aa, eps2, G, H);
                    n3l_pair<Model, SOFT>(pi[k], ai[k], pb, ab, eps2, G, H);
                }
                pa = shfl4(pa, src);
                pb = shfl4(pb, src);
                aa = shfl3(aa, src);
                ab = shfl3(ab, src);
            }
            add_force(acc, ja, n, aa, scale);  // 32 rotations: every j-body is home again
            add_force(acc, jb, n, ab, scale);
        }
    }
#pragma unroll
    for (int k = 0; k < KI; ++k) {
        add_force(acc, row * TI + k * 32 + lane, n, ai[k], scale);
    }
}

#define N3L_SPECIALISATION(KI)                                                                     \
    template <class Model, bool SOFT>                                                              \
    __device__ __forceinline__ void n3l_##KI(N3L_ARGS) {                                           \
        n3l_body<KI, Model, SOFT>(N3L_PASS);                                                       \
    }                                                                                              \
    NBODY_ENTRIES(n3l_ki##KI, n3l_##KI, __launch_bounds__(128, 8), (N3L_ARGS), (N3L_PASS))

N3L_SPECIALISATION(2)
N3L_SPECIALISATION(4)

NBODY_ENTRIES(atomics_n3l_force, n3l_4, __launch_bounds__(128, 8), (N3L_ARGS), (N3L_PASS))
