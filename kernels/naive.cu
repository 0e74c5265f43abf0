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
    float3 ai = make_float3(0.0f, 0.0f, 0.0f);
#pragma unroll 4
    for (int j = 0; j < nj; ++j) {
        ai = nbody::body_body_interaction<Model, SOFT>(ai, bi, __ldg(&sources[j]), eps2, G, H);
    }
    acc[t] = nbody::finish_acceleration<Model>(ai, G);
}

NBODY_FORCE_ENTRIES(naive_force, naive_force)
