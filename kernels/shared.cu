// `shared`: the GPU Gems 3 ch. 31 tiled kernel (Nyland, Harris & Prins), as in NVIDIA's CUDA samples nbody.
//
// One thread per body. The block walks the bodies in tiles of blockDim.x: each thread loads one float4
// of the tile into shared memory, __syncthreads, then every thread runs the tile through the
// interaction (a broadcast LDS.128 per source body), __syncthreads, next tile. The last tile is padded
// with massless bodies, so the inner loop has no bounds check and any N (1, 2, 31, ...) is exact.
// Launch with blockDim.x * sizeof(float4) bytes of dynamic shared memory.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void shared_force(NBODY_FORCE_ARGS) {
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
            ai = nbody::body_body_interaction<Model, SOFT>(ai, bi, tile[k], eps2, G, H);
        }
        __syncthreads();
    }
    if (i < n) {
        acc[i] = nbody::finish_acceleration<Model>(ai, G);
    }
}

NBODY_FORCE_ENTRIES(shared_force, shared_force)
