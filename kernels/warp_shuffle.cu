// `warp-shuffle`: no shared memory at all. Each warp walks the sources 32 at a time: every lane loads
// one source body (a coalesced float4 load), then the warp broadcasts them one by one with
// __shfl_sync (4 SHFL per source body: x, y, z, m). Any ni, nj: lanes past the end of the sources load
// massless bodies, lanes past the end of the targets keep taking part in the shuffles (no early return),
// they just do not store. Launch ceil(ni / B) blocks of B threads (B a multiple of 32), no dynamic
// shared memory.
// The lesson: a shuffle is an issue slot like an LDS, and four of them per interaction cost more than
// one broadcast LDS.128 (see docs/kernels.md).
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void warp_shuffle_force(NBODY_FORCE_ARGS) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    const int lane = threadIdx.x & 31;
    const float4 bi = (t < ni) ? targets[t] : nbody::massless_body();
    float3 ai = nbody::zero3();
    for (int group = 0; group < nj; group += NBODY_PARTIAL_LEN) {  // partial sums (common.cuh)
        const int end = min(nj, group + NBODY_PARTIAL_LEN);
        float3 part = nbody::zero3();
        for (int base = group; base < end; base += 32) {
            const int j = base + lane;
            const float4 mine = (j < nj) ? sources[j] : nbody::massless_body();
#pragma unroll 8
            for (int k = 0; k < 32; ++k) {
                float4 bj;
                bj.x = __shfl_sync(0xffffffffu, mine.x, k);
                bj.y = __shfl_sync(0xffffffffu, mine.y, k);
                bj.z = __shfl_sync(0xffffffffu, mine.z, k);
                bj.w = __shfl_sync(0xffffffffu, mine.w, k);
                part = nbody::body_body_interaction<Model, SOFT>(part, bi, bj, eps2, G, H);
            }
        }
        ai = nbody::add3(ai, part);
    }
    if (t < ni) {
        acc[t] = nbody::finish_acceleration<Model>(ai, G);
    }
}

NBODY_FORCE_ENTRIES(warp_shuffle_force, warp_shuffle_force)
