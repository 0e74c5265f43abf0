// `pair-matrix`: the N x N interaction matrix, for the panel's heatmap (N <= 8,192: 256 MB of floats).
// pair_matrix_fill_<model>_<self>(pos, out, n, eps2, G, H) writes out[i * n + j] = |a_ij|, the
// magnitude of body j's pull on body i (G m_j |d| / s³ for gravity, m_j |d| |G / s³ - H / s⁵| with
// repulsion; 0 on the diagonal), in 16 x 16 tiles: the block stages its 16 i-bodies and 16 j-bodies
// in shared memory and each thread writes one entry (coalesced along j). The backend fetches it with
// CudaBackend.interaction_matrix(); it is not part of the per-step cost.
// The force entries (pair_matrix_force_*, the range ABI of common.cuh) are the row sums of that matrix
// done the tiled way, so the variant also steps like any other: ceil(ni / B) blocks of B threads with
// B * 16 bytes of dynamic shared memory.
#include "common.cuh"

template <class Model, bool SOFT>
__device__ __forceinline__ void pair_matrix_force_body(NBODY_FORCE_ARGS) {
    extern __shared__ float4 tile[];
    nbody::tiled_force<Model, SOFT, nbody::FoldedForm, 16>(NBODY_FORCE_PASS, tile, blockDim.x,
                                                           blockIdx.x * blockDim.x + threadIdx.x);
}

NBODY_FORCE_ENTRIES_A(pair_matrix_force, pair_matrix_force_body, NBODY_TILED_MAXNREG)

template <class Model, bool SOFT>
__device__ __forceinline__ void pair_matrix_fill_body(const float4* __restrict__ pos, float* __restrict__ out,
                                                      const int n, const float eps2, const float G,
                                                      const float H) {
    __shared__ float4 ti[16];
    __shared__ float4 tj[16];
    const int tx = threadIdx.x, ty = threadIdx.y;
    const int i = blockIdx.y * 16 + ty;
    const int j = blockIdx.x * 16 + tx;
    if (ty == 0) {
        tj[tx] = (j < n) ? pos[j] : nbody::massless_body();
    } else if (ty == 1) {
        const int ii = blockIdx.y * 16 + tx;
        ti[tx] = (ii < n) ? pos[ii] : nbody::massless_body();
    }
    __syncthreads();
    const float4 bi = ti[ty];
    const float4 bj = tj[tx];
    const float dx = bj.x - bi.x;
    const float dy = bj.y - bi.y;
    const float dz = bj.z - bi.z;
    const float r2 = fmaf(dz, dz, fmaf(dy, dy, dx * dx));
    const float inv = nbody::inv_distance<SOFT>(r2 + eps2);
    const float inv3 = inv * inv * inv;
    float w;
    if (Model::repulsion) {
        w = fabsf(inv3 * fmaf(-H, inv * inv, G));
    } else {
        w = G * inv3;
    }
    if (i < n && j < n) {
        out[(long long)i * n + j] = bj.w * w * sqrtf(r2);
    }
}

#define PM_FILL(SUFFIX, MODEL, SOFT)                                                                 \
    extern "C" __global__ void pair_matrix_fill_##SUFFIX(const float4* __restrict__ pos,             \
                                                         float* __restrict__ out, const int n,       \
                                                         const float eps2, const float G, const float H) { \
        pair_matrix_fill_body<nbody::MODEL, SOFT>(pos, out, n, eps2, G, H);                           \
    }
PM_FILL(gravity_soft, Gravity, true)
PM_FILL(gravity_plain, Gravity, false)
PM_FILL(repulsion_soft, GravityRepulsion, true)
PM_FILL(repulsion_plain, GravityRepulsion, false)
