// `shared`: the GPU Gems 3 ch. 31 tiled kernel (Nyland, Harris & Prins) as NVIDIA's CUDA samples nbody
// writes it: the in-project baseline every speed-up is measured against.
//
// One thread per target; the block walks the sources in tiles of blockDim.x through shared memory
// (nbody::tiled_sum), the tile loop `#pragma unroll 128` over a run-time trip count, and the sample's
// arithmetic: distSqr = d·d, then += ε² (nbody::body_body_interaction_gems3, 13 FP32 + 1 MUFU). The last
// tile is padded with massless bodies, so any nj (1, 2, 31, ...) is exact; the sample requires N to be a
// multiple of the block size. Two differences from the sample: the two-level sum of common.cuh (the
// sample's one running sum loses a distant cluster's terms at large N) and the 32-register cap.
// Launch ceil(ni / B) blocks of B threads with B * sizeof(float4) bytes of dynamic shared memory.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void shared_force(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    nbody::tiled_force<Model, SOFT, nbody::Gems3Form, 128>(NBODY_FORCE_PASS, tile, blockDim.x,
                                                           blockIdx.x * blockDim.x + threadIdx.x);
}

NBODY_FORCE_ENTRIES_A(shared_force, shared_force, NBODY_TILED_MAXNREG)
