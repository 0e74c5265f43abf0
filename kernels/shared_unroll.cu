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
    float3 a = nbody::zero3();
    float3 a0 = nbody::zero3();  // two open partial sums of the two-level sum (common.cuh)
    float3 a1 = nbody::zero3();
    int count = 0;
    for (int base = 0; base < nj; base += tile_size) {
        const int j = base + tid;
        tile[tid] = (j < nj) ? sources[j] : nbody::massless_body();
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < tile_size; k += 2) {
            a0 = nbody::body_body_interaction<Model, SOFT>(a0, bi, tile[k], eps2, G, H);
            a1 = nbody::body_body_interaction<Model, SOFT>(a1, bi, tile[k + 1], eps2, G, H);
        }
        count += tile_size;
        if (count >= NBODY_PARTIAL_LEN) {
            a = nbody::add3(a, nbody::add3(a0, a1));
            a0 = a1 = nbody::zero3();
            count = 0;
        }
        __syncthreads();
    }
    if (t < ni) {
        acc[t] = nbody::finish_acceleration<Model>(nbody::add3(a, nbody::add3(a0, a1)), G);
    }
}

NBODY_FORCE_ENTRIES_A(shared_unroll_force, shared_unroll_force, NBODY_TILED_MAXNREG)
