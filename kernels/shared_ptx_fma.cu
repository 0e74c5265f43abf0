// `shared-ptx-fma`: the GPU Gems 3 tiled kernel with the distance chain (d = x_j - x_i, s² = d·d + ε², ε²
// the addend of the first fma) and the accumulation written as inline PTX sub.rn.f32 / fma.rn.f32
// (nbody::body_body_interaction_ptx), built with --use_fast_math like every variant but `shared`.
// The lesson: the SASS is the same 12 FP32 + 1 MUFU per interaction that fmaf() in C++ gives
// (nbody::body_body_interaction, e.g. pair-matrix's force rows); what it gains over `shared` comes from
// folding ε² and from fast math, not from PTX (see docs/kernels.md).
// Launch ceil(ni / B) blocks of B threads with B * 16 bytes of dynamic shared memory.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void shared_ptx_force(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    nbody::tiled_force<Model, SOFT, nbody::PtxForm, 16>(NBODY_FORCE_PASS, tile, blockDim.x,
                                                        blockIdx.x * blockDim.x + threadIdx.x);
}

NBODY_FORCE_ENTRIES_A(shared_ptx_force, shared_ptx_force, NBODY_TILED_MAXNREG)
