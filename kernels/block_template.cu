// `block-template`: the tiled kernel with the block size a compile-time constant (as in the CUDA
// samples' tiling example): a static __shared__ float4 tile[BS], __launch_bounds__(BS, 2048 / BS) (32
// registers, a full SM, like the other tiled variants' NBODY_TILED_MAXNREG), and a tile loop
// whose trip count the compiler knows (unrolled 32x with no remainder code). One specialisation per
// BS in {64, 128, 256, 512, 1024}; the host picks the symbol block_template_b<BS>_<model>_<self> for
// the launch block size (`nbody-live tune` sweeps it). block_template_force_* is the BS = 256 one.
// Launch ceil(ni / BS) blocks of BS threads, no dynamic shared memory.
#include "common.cuh"

template <int BS, class Model, bool SOFT>
__device__ __forceinline__ void block_template_body(NBODY_FORCE_ARGS) {
    __shared__ float4 tile[BS];
    nbody::tiled_force<Model, SOFT, nbody::FoldedForm, 32>(NBODY_FORCE_PASS, tile, BS,
                                                           blockIdx.x * BS + threadIdx.x);
}

#define BT_SPECIALISATION(BS)                                                                  \
    template <class Model, bool SOFT>                                                          \
    __device__ __forceinline__ void block_template_##BS(NBODY_FORCE_ARGS) {                    \
        block_template_body<BS, Model, SOFT>(NBODY_FORCE_PASS);                                \
    }                                                                                          \
    NBODY_FORCE_ENTRIES_A(block_template_b##BS, block_template_##BS, __launch_bounds__(BS, 2048 / BS))

BT_SPECIALISATION(64)
BT_SPECIALISATION(128)
BT_SPECIALISATION(256)
BT_SPECIALISATION(512)
BT_SPECIALISATION(1024)

NBODY_FORCE_ENTRIES_A(block_template_force, block_template_256, __launch_bounds__(256, 8))
