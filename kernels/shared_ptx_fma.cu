// `shared-ptx-fma`: the GPU Gems 3 tiled kernel with the distance chain (d = x_j - x_i, s² = d·d + ε²)
// and the accumulation written as inline PTX sub.rn.f32 / fma.rn.f32 (nbody::body_body_interaction_ptx).
// The lesson: nvcc already contracts the C++ chain into the same FFMAs, so the SASS is identical in
// count (12 FP32 + 1 MUFU per interaction) — PTX FMA does not help (see docs/kernels.md).
// Launch with blockDim.x * 16 bytes of dynamic shared memory.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void shared_ptx_force(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    const int tid = threadIdx.x;
    const int tile_size = blockDim.x;
    const int i = blockIdx.x * tile_size + tid;
    const float4 bi = (i < n) ? pos[i] : nbody::massless_body();
    float3 ai = make_float3(0.0f, 0.0f, 0.0f);
    for (int base = 0; base < n; base += tile_size) {
        const int j = base + tid;
        tile[tid] = (j < n) ? pos[j] : nbody::massless_body();
        __syncthreads();
#pragma unroll 16
        for (int k = 0; k < tile_size; ++k) {
            ai = nbody::body_body_interaction_ptx<Model, SOFT>(ai, bi, tile[k], eps2, G, H);
        }
        __syncthreads();
    }
    if (i < n) {
        acc[i] = nbody::finish_acceleration<Model>(ai, G);
    }
}

NBODY_FORCE_ENTRIES(shared_ptx_force, shared_ptx_force)
