// `streams-remainder`: split the bodies at nfull = floor(N / B) * B. The main kernel
// (streams_remainder_force_*) runs on one stream over the block-multiple part: N / B blocks with no
// bounds checks at all — every thread has a body and every tile is full — then adds the last N - nfull
// sources straight from global memory. The tail kernel (streams_remainder_tail_*) runs on a second
// stream at the same time: one block for the N - nfull < B leftover bodies, tiled with checks.
// Both streams wait for the previous step and the next integrator waits for both (the host uses two
// blocking streams between events on the legacy stream). Launch both with blockDim.x * 16 bytes of
// dynamic shared memory; the host skips the main kernel when N < B and the tail when B divides N.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void streams_main(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    const int tid = threadIdx.x;
    const int tile_size = blockDim.x;
    const int nfull = (n / tile_size) * tile_size;
    const int i = blockIdx.x * tile_size + tid;  // grid = nfull / B blocks: always < nfull
    const float4 bi = pos[i];
    float3 ai = make_float3(0.0f, 0.0f, 0.0f);
    for (int base = 0; base < nfull; base += tile_size) {
        tile[tid] = pos[base + tid];
        __syncthreads();
#pragma unroll 16
        for (int k = 0; k < tile_size; ++k) {
            ai = nbody::body_body_interaction<Model, SOFT>(ai, bi, tile[k], eps2, G, H);
        }
        __syncthreads();
    }
    for (int j = nfull; j < n; ++j) {  // the same address for every thread: a broadcast load
        ai = nbody::body_body_interaction<Model, SOFT>(ai, bi, __ldg(&pos[j]), eps2, G, H);
    }
    acc[i] = nbody::finish_acceleration<Model>(ai, G);
}

template <class Model, bool SOFT>
__device__ __forceinline__ void streams_tail(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    const int tid = threadIdx.x;
    const int tile_size = blockDim.x;
    const int i = (n / tile_size) * tile_size + tid;
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

NBODY_FORCE_ENTRIES(streams_remainder_force, streams_main)
NBODY_FORCE_ENTRIES(streams_remainder_tail, streams_tail)
