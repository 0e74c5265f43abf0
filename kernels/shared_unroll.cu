// `shared-unroll`: the GPU Gems 3 tiled kernel with the tile loop unrolled by hand 2x (two independent
// accumulators, so two interaction chains are in flight per thread) and `#pragma unroll` on top.
// The lesson: the compiler already unrolls `shared` 16x and the hot loop is issue-bound, not
// latency-bound, so the second accumulator buys little (see docs/kernels.md).
// Launch ceil(ni / B) blocks of B threads with B * 16 bytes of dynamic shared memory; B must be even
// (64...1024).
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void shared_unroll_force(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    const int tid = threadIdx.x;
    const int tile_size = blockDim.x;
    const int t = blockIdx.x * tile_size + tid;
    const float4 bi = (t < ni) ? targets[t] : nbody::massless_body();
    float3 a0 = make_float3(0.0f, 0.0f, 0.0f);
    float3 a1 = make_float3(0.0f, 0.0f, 0.0f);
    for (int base = 0; base < nj; base += tile_size) {
        const int j = base + tid;
        tile[tid] = (j < nj) ? sources[j] : nbody::massless_body();
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < tile_size; k += 2) {
            a0 = nbody::body_body_interaction<Model, SOFT>(a0, bi, tile[k], eps2, G, H);
            a1 = nbody::body_body_interaction<Model, SOFT>(a1, bi, tile[k + 1], eps2, G, H);
        }
        __syncthreads();
    }
    if (t < ni) {
        const float3 a = make_float3(a0.x + a1.x, a0.y + a1.y, a0.z + a1.z);
        acc[t] = nbody::finish_acceleration<Model>(a, G);
    }
}

NBODY_FORCE_ENTRIES(shared_unroll_force, shared_unroll_force)
