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
    const int nfull = (n / blockDim.x) * blockDim.x;
    const int i = blockIdx.x * blockDim.x + threadIdx.x;  // grid = nfull / B blocks: always < nfull
    const float4 bi = pos[i];
    float3 ai = nbody::tiled_sum<Model, SOFT, nbody::FoldedForm, 16, false>(pos, nfull, bi, eps2, G, H, tile,
                                                                            blockDim.x);
    for (int j = nfull; j < n; ++j) {  // the same address for every thread: a broadcast load
        ai = nbody::body_body_interaction<Model, SOFT>(ai, bi, __ldg(&pos[j]), eps2, G, H);
    }
    acc[i] = nbody::finish_acceleration<Model>(ai, G);
}

template <class Model, bool SOFT>
__device__ __forceinline__ void streams_tail(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    nbody::tiled_force<Model, SOFT, nbody::FoldedForm, 16>(pos, acc, n, eps2, G, H, tile, blockDim.x,
                                                           (n / blockDim.x) * blockDim.x + threadIdx.x);
}

NBODY_FORCE_ENTRIES(streams_remainder_force, streams_main)
NBODY_FORCE_ENTRIES(streams_remainder_tail, streams_tail)
