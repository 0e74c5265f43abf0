// `naive`: one thread per target, every source position read straight from global memory (float4 loads
// through the read-only data cache). The textbook all-pairs loop, the floor every tiled variant beats.
// Launch ceil(ni / B) blocks of B threads, no dynamic shared memory.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void naive_force(NBODY_FORCE_ARGS) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= ni) {
        return;
    }
    const float4 bi = __ldg(&targets[t]);
    float3 ai = nbody::zero3();
    for (int base = 0; base < nj; base += NBODY_PARTIAL_LEN) {  // partial sums (common.cuh)
        const int end = min(nj, base + NBODY_PARTIAL_LEN);
        float3 part = nbody::zero3();
#pragma unroll 4
        for (int j = base; j < end; ++j) {
            part = nbody::body_body_interaction<Model, SOFT>(part, bi, __ldg(&sources[j]), eps2, G, H);
        }
        ai = nbody::add3(ai, part);
    }
    acc[t] = nbody::finish_acceleration<Model>(ai, G);
}

NBODY_FORCE_ENTRIES_A(naive_force, naive_force, NBODY_TILED_MAXNREG)
