// `gpu5-branchy`: the starting point of the brute-force optimisation write-ups — the textbook loop as
// first ported to a GPU. One thread per target, every source body read from global memory, the distance
// through sqrtf and the weight through divides (nbody::body_body_interaction_divide), and a per-pair
// branch that skips the self term (and, without softening, coincident pairs). The self term is the
// textbook's `j == i` by index: the target's index among the sources (nbody::target_offset), -1 when it
// is not one of them. Force and move are separate kernels through a force buffer: this kernel writes acc,
// kernels/integrate.cu moves the bodies. Kept as the floor the later variants are measured against.
// Launch ceil(ni / B) blocks of B threads, no dynamic shared memory.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void gpu5_force(NBODY_FORCE_ARGS) {
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= ni) {
        return;
    }
    const long long own = t + nbody::target_offset(targets, sources);
    const int self = (own >= 0 && own < nj) ? static_cast<int>(own) : -1;
    const float4 bi = targets[t];
    float3 ai = nbody::zero3();
    for (int base = 0; base < nj; base += NBODY_PARTIAL_LEN) {  // partial sums (common.cuh)
        const int end = min(nj, base + NBODY_PARTIAL_LEN);
        float3 part = nbody::zero3();
        for (int j = base; j < end; ++j) {
            const float4 bj = sources[j];
            bool skip = (j == self);
            if (!SOFT) {
                const float dx = bj.x - bi.x, dy = bj.y - bi.y, dz = bj.z - bi.z;
                skip = skip || (dx * dx + dy * dy + dz * dz + eps2 == 0.0f);
            }
            if (!skip) {
                part = nbody::body_body_interaction_divide<Model>(part, bi, bj, eps2, G, H);
            }
        }
        ai = nbody::add3(ai, part);
    }
    acc[t] = nbody::finish_acceleration<Model>(ai, G);
}

NBODY_FORCE_ENTRIES(gpu5_force, gpu5_force)
