// `multi-thread-per-body`: Q consecutive threads (Q in {2, 4, 8, 16, 32}) share one target. The block
// loads a tile of blockDim.x source bodies into shared memory as `shared` does; thread r of a target's
// group takes tile entries r, r + Q, r + 2Q, ... (the Q lanes of a group read Q consecutive float4:
// no bank conflict), then the group sums its Q partial accelerations with __shfl_xor_sync. A block of
// B threads covers B / Q targets, so small N launches Q times as many threads: at N = 4,096 one thread
// per body is only 4,096 threads, far too few for 132 SMs x 2,048 threads.
// Symbols multi_thread_q<Q>_<model>_<self>; multi_thread_force_* is Q = 4. Launch ceil(ni * Q / B)
// blocks of B threads (B a multiple of 32) with B * 16 bytes of dynamic shared memory.
#include "common.cuh"

template <int Q, class Model, bool SOFT>
__device__ __forceinline__ void multi_thread_body(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    const int tid = threadIdx.x;
    const int tile_size = blockDim.x;
    const int r = tid % Q;
    const int t = blockIdx.x * (tile_size / Q) + tid / Q;
    const float4 bi = (t < ni) ? targets[t] : nbody::massless_body();
    float3 ai = nbody::zero3();
    float3 part = nbody::zero3();  // the two-level sum (common.cuh)
    int count = 0;
    for (int base = 0; base < nj; base += tile_size) {
        const int j = base + tid;
        tile[tid] = (j < nj) ? sources[j] : nbody::massless_body();
        __syncthreads();
#pragma unroll 8
        for (int k = r; k < tile_size; k += Q) {
            part = nbody::body_body_interaction<Model, SOFT>(part, bi, tile[k], eps2, G, H);
        }
        nbody::close_partial(ai, part, count, tile_size);
        __syncthreads();
    }
    ai = nbody::add3(ai, part);
#pragma unroll
    for (int o = Q / 2; o > 0; o >>= 1) {
        ai.x += __shfl_xor_sync(0xffffffffu, ai.x, o);
        ai.y += __shfl_xor_sync(0xffffffffu, ai.y, o);
        ai.z += __shfl_xor_sync(0xffffffffu, ai.z, o);
    }
    if (r == 0 && t < ni) {
        acc[t] = nbody::finish_acceleration<Model>(ai, G);
    }
}

#define MT_SPECIALISATION(Q)                                                                   \
    template <class Model, bool SOFT>                                                          \
    __device__ __forceinline__ void multi_thread_##Q(NBODY_FORCE_ARGS) {                       \
        multi_thread_body<Q, Model, SOFT>(NBODY_FORCE_PASS);                                   \
    }                                                                                          \
    NBODY_FORCE_ENTRIES_A(multi_thread_q##Q, multi_thread_##Q, NBODY_TILED_MAXNREG)

MT_SPECIALISATION(2)
MT_SPECIALISATION(4)
MT_SPECIALISATION(8)
MT_SPECIALISATION(16)
MT_SPECIALISATION(32)

NBODY_FORCE_ENTRIES_A(multi_thread_force, multi_thread_4, NBODY_TILED_MAXNREG)
