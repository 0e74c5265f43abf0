// Conserved quantities reduced on the device (issue 4's energy/momentum drift): only ten doubles go
// back to the host, never the state. Host side: app/backends/cuda/diagnostics.py.
//
//   diag_moments_<p>(pos, vel, n, partial)        O(N), grid-stride; per block 9 double sums:
//       [0] K = ½ Σ m v²   [1..3] P = Σ m v   [4..6] L = Σ m r × v   [7] Σ m |v|   [8] Σ m |r| |v|
//   diag_potential_<p>_<model>_<self>(pos, n, eps2, G, H3, chunk_tiles, ti0, tiles, partial)   O(N²), each
//       pair once, i-tiles ti0 .. ti0 + gridDim.x of `tiles` (a live sample runs them a slice a frame):
//       U = Σ_{i<j} m_i m_j (-G / s + H / (3 s³)),  s² = r² + ε²   (app/physics.potential_energy)
//   diag_finalize(moments, n_moment_blocks, potential, n_potential_blocks, out)   one block: out[0..9]
//
// <p> is f32 (the float4 state: positions [x, y, z, m], velocities [vx, vy, vz, 0]) or f64 (the double
// state of the `fp64` kernel, nbody::dvec4 with the same layout). Every sum is deterministic: fixed
// grid-stride and tree orders, no atomics, one block for the last pass.
//
// Potential geometry: tiles of DIAG_BLOCK bodies; block (x, y) = (i-tile ti = ti0 + x, chunk of chunk_tiles
// j-tiles starting at y * chunk_tiles). Each block writes its own partial (y * tiles + ti), so the slices a
// launch is cut into change nothing in the sum: one launch over all i-tiles or many give the same bits. A block walks the j-tiles of its chunk that are >= ti (the upper
// triangle; blocks left of the diagonal do nothing and write 0). In the diagonal tile only k > tid
// counts (j > i): the self term -G m²/ε is never formed, so ε = 0 and ε > 0 need no subtraction.
// Per thread the tile's 256 terms Σ m_j / s and Σ m_j / s³ are summed in the state's precision, then
// added into double accumulators; m_i (-G A + H/3 B) is formed in double. Padding bodies are massless
// (they add exactly zero) and threads past n contribute nothing.
#include "common.cuh"

#define DIAG_BLOCK 256
#define DIAG_MOMENTS 9
#define DIAG_RESULTS 10

namespace diag {

struct Wide {
    double x, y, z, w;
};

__device__ __forceinline__ Wide widen(const float4 b) { return Wide{b.x, b.y, b.z, b.w}; }
__device__ __forceinline__ Wide widen(const nbody::dvec4 b) { return Wide{b.x, b.y, b.z, b.w}; }

// Block-wide sums of K doubles (blockDim.x == DIAG_BLOCK); thread 0 writes them to out[0..K).
template <int K>
__device__ __forceinline__ void block_sum(double (&v)[K], double* __restrict__ out) {
    __shared__ double warp_sums[K][DIAG_BLOCK / 32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
#pragma unroll
    for (int k = 0; k < K; ++k) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) {
            v[k] += __shfl_down_sync(0xffffffffu, v[k], off);
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            warp_sums[k][warp] = v[k];
        }
    }
    __syncthreads();
    if (warp == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) {
            double x = (lane < DIAG_BLOCK / 32) ? warp_sums[k][lane] : 0.0;
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                x += __shfl_down_sync(0xffffffffu, x, off);
            }
            if (lane == 0) {
                out[k] = x;
            }
        }
    }
}

// --- O(N): kinetic energy, momenta and their scales -----------------------------------------------------
template <class Body>
__device__ __forceinline__ void moments(const Body* __restrict__ pos, const Body* __restrict__ vel, const int n,
                                        double* __restrict__ partial) {
    double s[DIAG_MOMENTS];
#pragma unroll
    for (int k = 0; k < DIAG_MOMENTS; ++k) {
        s[k] = 0.0;
    }
    const int stride = gridDim.x * blockDim.x;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const Wide p = widen(pos[i]);
        const Wide v = widen(vel[i]);
        const double m = p.w;
        const double v2 = fma(v.z, v.z, fma(v.y, v.y, v.x * v.x));
        const double r2 = fma(p.z, p.z, fma(p.y, p.y, p.x * p.x));
        const double speed = sqrt(v2);
        s[0] += 0.5 * m * v2;
        s[1] += m * v.x;
        s[2] += m * v.y;
        s[3] += m * v.z;
        s[4] += m * (p.y * v.z - p.z * v.y);
        s[5] += m * (p.z * v.x - p.x * v.z);
        s[6] += m * (p.x * v.y - p.y * v.x);
        s[7] += m * speed;
        s[8] += m * sqrt(r2) * speed;
    }
    block_sum<DIAG_MOMENTS>(s, partial + DIAG_MOMENTS * blockIdx.x);
}

// --- O(N²): the pair potential --------------------------------------------------------------------------
struct F32 {
    using Body = float4;
    using Real = float;
    static constexpr int unroll = 8;
    static __device__ __forceinline__ Body zero() { return nbody::massless_body(); }
    template <bool SOFT>
    static __device__ __forceinline__ float inv(const float s2) {
        return nbody::inv_distance<SOFT>(s2);
    }
};

struct F64 {
    using Body = nbody::dvec4;
    using Real = double;
    static constexpr int unroll = 4;  // 8 makes ptxas spill around double rsqrt's slow path
    static __device__ __forceinline__ Body zero() { return nbody::dvec4{0.0, 0.0, 0.0, 0.0}; }
    template <bool SOFT>
    static __device__ __forceinline__ double inv(const double s2) {
        if (SOFT) {
            return rsqrt(s2);
        }
        return (s2 > 0.0) ? rsqrt(s2) : 0.0;
    }
};

// a += m_j / s, b += m_j / s³ (b for the repulsion model only); `keep` false drops the pair.
template <class P, class Model, bool SOFT, bool MASKED>
__device__ __forceinline__ void pair_terms(typename P::Real& a, typename P::Real& b, const typename P::Body bi,
                                           const typename P::Body bj, const typename P::Real eps2,
                                           const bool keep) {
    using Real = typename P::Real;
    const Real dx = bj.x - bi.x;
    const Real dy = bj.y - bi.y;
    const Real dz = bj.z - bi.z;
    const Real s2 = fma(dz, dz, fma(dy, dy, fma(dx, dx, eps2)));
    Real inv = P::template inv<SOFT>(s2);
    if (MASKED) {
        inv = keep ? inv : Real(0);
    }
    if (Model::repulsion) {
        const Real m_s = bj.w * inv;
        a += m_s;
        b = fma(m_s, inv * inv, b);
    } else {
        a = fma(bj.w, inv, a);
    }
}

template <class P, class Model, bool SOFT>
__device__ __forceinline__ void potential(const typename P::Body* __restrict__ pos, const int n,
                                          const typename P::Real eps2, const double G, const double H3,
                                          const int chunk_tiles, const int ti0, const int tiles,
                                          double* __restrict__ partial) {
    using Body = typename P::Body;
    using Real = typename P::Real;
    __shared__ Body tile[DIAG_BLOCK];
    const int tid = threadIdx.x;
    const int ti = ti0 + blockIdx.x;
    const int first = blockIdx.y * chunk_tiles;
    const int last = min(first + chunk_tiles, tiles);
    const int i = ti * DIAG_BLOCK + tid;
    const Body bi = (i < n) ? pos[i] : P::zero();
    double a = 0.0;  // Σ_{j>i} m_j / s
    double b = 0.0;  // Σ_{j>i} m_j / s³
    for (int tj = max(first, ti); tj < last; ++tj) {
        const int j = tj * DIAG_BLOCK + tid;
        tile[tid] = (j < n) ? pos[j] : P::zero();
        __syncthreads();
        Real ta = Real(0);
        Real tb = Real(0);
        if (tj == ti) {  // the diagonal tile: j > i only
            for (int k = 0; k < DIAG_BLOCK; ++k) {
                pair_terms<P, Model, SOFT, true>(ta, tb, bi, tile[k], eps2, k > tid);
            }
        } else {
#pragma unroll P::unroll
            for (int k = 0; k < DIAG_BLOCK; ++k) {
                pair_terms<P, Model, SOFT, false>(ta, tb, bi, tile[k], eps2, true);
            }
        }
        a += (double)ta;
        b += (double)tb;
        __syncthreads();
    }
    double u[1] = {0.0};
    if (i < n) {
        u[0] = (double)bi.w * (Model::repulsion ? fma(H3, b, -G * a) : -G * a);
    }
    block_sum<1>(u, partial + blockIdx.y * tiles + ti);
}

}  // namespace diag

extern "C" __global__ void __launch_bounds__(DIAG_BLOCK)
    diag_moments_f32(const float4* __restrict__ pos, const float4* __restrict__ vel, const int n,
                     double* __restrict__ partial) {
    diag::moments(pos, vel, n, partial);
}

extern "C" __global__ void __launch_bounds__(DIAG_BLOCK)
    diag_moments_f64(const nbody::dvec4* __restrict__ pos, const nbody::dvec4* __restrict__ vel, const int n,
                     double* __restrict__ partial) {
    diag::moments(pos, vel, n, partial);
}

#define DIAG_POTENTIAL(PREC, SUFFIX, MODEL, SOFT)                                                          \
    extern "C" __global__ void __launch_bounds__(DIAG_BLOCK) diag_potential_##PREC##_##SUFFIX(              \
        const diag::PREC::Body* __restrict__ pos, const int n, const diag::PREC::Real eps2, const double G, \
        const double H3, const int chunk_tiles, const int ti0, const int tiles,                             \
        double* __restrict__ partial) {                                                                     \
        diag::potential<diag::PREC, nbody::MODEL, SOFT>(pos, n, eps2, G, H3, chunk_tiles, ti0, tiles,      \
                                                        partial);                                           \
    }
#define DIAG_POTENTIALS(PREC)                                   \
    DIAG_POTENTIAL(PREC, gravity_soft, Gravity, true)           \
    DIAG_POTENTIAL(PREC, gravity_plain, Gravity, false)         \
    DIAG_POTENTIAL(PREC, repulsion_soft, GravityRepulsion, true) \
    DIAG_POTENTIAL(PREC, repulsion_plain, GravityRepulsion, false)

namespace diag {
using f32 = F32;
using f64 = F64;
}  // namespace diag

DIAG_POTENTIALS(f32)
DIAG_POTENTIALS(f64)

// One block: the per-block partials summed in a fixed order; out = [K, Px, Py, Pz, Lx, Ly, Lz, Σm|v|,
// Σm|r||v|, U].
extern "C" __global__ void __launch_bounds__(DIAG_BLOCK)
    diag_finalize(const double* __restrict__ moments, const int n_moments, const double* __restrict__ potential,
                  const int n_potential, double* __restrict__ out) {
    double s[DIAG_RESULTS];
#pragma unroll
    for (int k = 0; k < DIAG_RESULTS; ++k) {
        s[k] = 0.0;
    }
    for (int b = threadIdx.x; b < n_moments; b += blockDim.x) {
#pragma unroll
        for (int k = 0; k < DIAG_MOMENTS; ++k) {
            s[k] += moments[DIAG_MOMENTS * b + k];
        }
    }
    for (int b = threadIdx.x; b < n_potential; b += blockDim.x) {
        s[DIAG_MOMENTS] += potential[b];
    }
    diag::block_sum<DIAG_RESULTS>(s, out);
}
