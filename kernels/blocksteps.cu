// Block time steps' state updates on one GPU (app/backends/cuda/blockops.py), one launch each.
//
// The same float64 arithmetic as the CPU twin's ops (app/backends/blocksteps_ops.py), where CuPy's fancy
// indexing took four to six launches per update (bench/results/h200-2026-11-26-blocksteps-profile-*.txt:
// with the scheduler's change, 0.65-0.8 ms less per 1M-body substep on an H200). Every product and sum is
// rounded on its own (__dmul_rn, __dadd_rn: the compiler may not contract them into an FMA), in numpy's
// order:
//   drift        x + dt * v
//   kick         v + a * h                 (h: the row's half step)
//   norms        sqrt((ax*ax + ay*ay) + az*az)
// so each result has the bits of the numpy expression (tests/test_blocksteps_gpu.py). The state is
// (N, 3) row-major float64; `rows` are int64 indices into it (the scheduler's active rows, unique).

#include "common.cuh"  // (every kernels/*.cu includes it: tests/test_kernels_compile.py)

extern "C" __global__ void block_drift(double* __restrict__ pos, const double* __restrict__ vel, const int n3,
                                       const double dt) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n3) {
        pos[i] = __dadd_rn(pos[i], __dmul_rn(dt, vel[i]));
    }
}

extern "C" __global__ void block_kick(double* __restrict__ vel, const double* __restrict__ acc,
                                      const long long* __restrict__ rows, const double* __restrict__ half,
                                      const int m) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m) {
        return;
    }
    const long long r = 3 * rows[i];
    const double h = half[i];
    for (int c = 0; c < 3; ++c) {
        vel[r + c] = __dadd_rn(vel[r + c], __dmul_rn(acc[r + c], h));
    }
}

// float32 [x, y, z, m] rows for the walk from the float64 positions (round to nearest, as numpy's astype)
extern "C" __global__ void block_pack_rows(float4* __restrict__ out, const double* __restrict__ pos,
                                           const float* __restrict__ mass, const int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        const long long r = 3LL * i;
        out[i] = make_float4(__double2float_rn(pos[r]), __double2float_rn(pos[r + 1]),
                             __double2float_rn(pos[r + 2]), mass[i]);
    }
}

// a(x) of the evaluated rows kept in float64 (float to double: exact)
extern "C" __global__ void block_take_acc(double* __restrict__ acc, const float4* __restrict__ acc32,
                                          const long long* __restrict__ rows, const int m) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m) {
        const long long j = rows[i];
        const float4 a = acc32[j];
        acc[3 * j] = a.x;
        acc[3 * j + 1] = a.y;
        acc[3 * j + 2] = a.z;
    }
}

// |a| of the rows, the criterion's input
extern "C" __global__ void block_acc_norms(double* __restrict__ out, const double* __restrict__ acc,
                                           const long long* __restrict__ rows, const int m) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m) {
        const long long r = 3 * rows[i];
        const double x = acc[r], y = acc[r + 1], z = acc[r + 2];
        out[i] = __dsqrt_rn(__dadd_rn(__dadd_rn(__dmul_rn(x, x), __dmul_rn(y, y)), __dmul_rn(z, z)));
    }
}
