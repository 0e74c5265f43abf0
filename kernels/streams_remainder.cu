// `streams-remainder`: split the targets at nfull = floor(ni / B) * B. The main kernel
// (streams_remainder_force_*) runs on one stream over targets [0, nfull): nfull / B blocks with no
// bounds checks in the tile loop — every thread has a target and the sources [0, floor(nj / B) * B) fill
// every tile — then adds the last nj mod B sources straight from global memory. The tail kernel
// (streams_remainder_tail_*) runs on a second stream at the same time: one block for the ni - nfull < B
// leftover targets, tiled with checks over all nj sources.
// Both streams wait for the previous step and the next integrator waits for both (the host uses two
// blocking streams between events on the legacy stream). Launch both with B threads and B * 16 bytes of
// dynamic shared memory; the host skips the main kernel when ni < B and the tail when B divides ni.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void streams_main(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    const int jfull = (nj / blockDim.x) * blockDim.x;
    const int t = blockIdx.x * blockDim.x + threadIdx.x;  // grid = floor(ni / B) blocks: always < ni
    const float4 bi = targets[t];
    float3 ai = nbody::tiled_sum<Model, SOFT, nbody::FoldedForm, 16, false>(sources, jfull, bi, eps2, G, H,
                                                                            tile, blockDim.x);
    float3 part = nbody::zero3();  // the last < B sources: a partial sum of their own (common.cuh)
    for (int j = jfull; j < nj; ++j) {  // the same address for every thread: a broadcast load
        part = nbody::body_body_interaction<Model, SOFT>(part, bi, __ldg(&sources[j]), eps2, G, H);
    }
    ai = nbody::add3(ai, part);
    acc[t] = nbody::finish_acceleration<Model>(ai, G);
}

template <class Model, bool SOFT>
__device__ __forceinline__ void streams_tail(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    nbody::tiled_force<Model, SOFT, nbody::FoldedForm, 16>(NBODY_FORCE_PASS, tile, blockDim.x,
                                                           (ni / blockDim.x) * blockDim.x + threadIdx.x);
}

NBODY_FORCE_ENTRIES_A(streams_remainder_force, streams_main, NBODY_TILED_MAXNREG)
NBODY_FORCE_ENTRIES_A(streams_remainder_tail, streams_tail, NBODY_TILED_MAXNREG)
