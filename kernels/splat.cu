// The `splat` draw style on the GPU: bodies projected from the device's float4 [x, y, z, m] rows, their
// light added into a frame-sized 64-bit integer buffer, a histogram of it for the automatic exposure, and
// the tone map into RGBA8. The arithmetic contract is app/render/splat.py's docstring; the numba twin
// (app/render/splat_cpu.py) follows it too and tests/test_splat_gpu.py holds the two equal bit for bit.
//
// Why the projection is exact on both sides: every float32 product, sum and quotient is written as an
// intrinsic that rounds on its own (__fmul_rn, __fadd_rn, __fdiv_rn): the compiler may not contract
// __fmul_rn + __fadd_rn into an FMA, and __fdiv_rn is IEEE division even where --use_fast_math would turn
// `/` into an approximation. The file is also compiled with -fmad=false and without --use_fast_math
// (app/backends/cuda/compile.py FILE_OPTIONS), a belt to those braces, and because fast math implies
// -ftz=true: subnormals flushed to zero, which the twin's CPU does not do. After the projection
// everything is integer: order-independent 64-bit atomic sums, so the buffer is the same whatever the
// threads' schedule (a recording is byte-identical from run to run).
//
// The buffer is cleared with cuMemsetD32 by the host (no kernel). Entries and their arguments are
// app/render/splat.py KERNELS' (tests/test_kernels_compile.py reads them against this file's PTX).

#include "common.cuh"  // (every kernels/*.cu includes it: tests/test_kernels_compile.py)

#define SPLAT_SUB 256             // fixed-point steps per pixel (splat.py SUB)
#define SPLAT_BIAS (512 - 128)    // +2 px (plain shifts of a positive number), -half a pixel (centres)
#define SPLAT_COMPONENTS 16       // light table rows (splat_light.py COMPONENTS)
#define SPLAT_LEVELS 256          // light table levels (splat.py LEVELS)
#define SPLAT_TONE_SIZE 4096      // tone-map entries (splat.py TONE_SIZE)
#define SPLAT_EXPOSURE_SHIFT 48   // splat.py EXPOSURE_SHIFT
#define SPLAT_HIST_SUB_BITS 4     // splat.py HIST_SUB_BITS
#define SPLAT_HIST_BINS 1024      // splat.py HIST_BINS
#define SPLAT_VALUE_ARRAY 1       // splat_light.py VALUE_ARRAY: the level from values[i]
#define SPLAT_VALUE_MASS 2        // splat_light.py VALUE_MASS: the level from pos[i].w
#define SPLAT_FLT_MAX 3.402823466e+38f

typedef unsigned long long u64;

// ((m[0] x + m[1] y) + m[2] z) + m[3], each operation rounded to float32 on its own
__device__ __forceinline__ float splat_clip_row(const float* m, const float x, const float y, const float z) {
    return __fadd_rn(__fadd_rn(__fadd_rn(__fmul_rn(m[0], x), __fmul_rn(m[1], y)), __fmul_rn(m[2], z)), m[3]);
}

// max{i : T[i] <= v} with T[0] = -inf: 8 comparisons, no arithmetic on v (NaN compares false: level 0)
__device__ __forceinline__ int splat_level(const float* T, const float v) {
    int i = 0;
#pragma unroll
    for (int step = 128; step > 0; step >>= 1) {
        if (T[i + step] <= v) {
            i += step;
        }
    }
    return i;
}

__device__ __forceinline__ void splat_add(u64* accum, const int row, const int col, const int width,
                                          const int height, const unsigned int weight, const unsigned int l0,
                                          const unsigned int l1, const unsigned int l2) {
    if (weight == 0u || row < 0 || row >= height || col < 0 || col >= width) {
        return;
    }
    u64* p = accum + 3LL * ((long long)row * width + col);
    if (l0) atomicAdd(p, (u64)l0 * weight);
    if (l1) atomicAdd(p + 1, (u64)l1 * weight);
    if (l2) atomicAdd(p + 2, (u64)l2 * weight);
}

// One thread per body: its light from the tables, its projection, its bilinear 2x2 footprint added.
// accum (H, W, 3) u64; comp (N) uint8 or NULL (component 0); values (N) float or NULL (read when
// value_kind is SPLAT_VALUE_ARRAY); light (16, 256, 3) uint32; thresholds (256) float; view_proj 16 floats,
// row-major, for column vectors.
extern "C" __global__ void splat_accumulate(u64* __restrict__ accum, const float4* __restrict__ pos,
                                            const unsigned char* __restrict__ comp,
                                            const float* __restrict__ values,
                                            const unsigned int* __restrict__ light,
                                            const float* __restrict__ thresholds,
                                            const float* __restrict__ view_proj, const int n, const int width,
                                            const int height, const float w_min, const int value_kind) {
    __shared__ float T[SPLAT_LEVELS];
    __shared__ float M[16];
    for (int k = threadIdx.x; k < SPLAT_LEVELS; k += blockDim.x) {
        T[k] = thresholds[k];
    }
    if (threadIdx.x < 16) {
        M[threadIdx.x] = view_proj[threadIdx.x];
    }
    __syncthreads();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) {
        return;
    }
    const float4 p = __ldg(&pos[i]);
    const int k = comp ? min((int)__ldg(&comp[i]), SPLAT_COMPONENTS - 1) : 0;
    int lev = 0;
    if (value_kind == SPLAT_VALUE_ARRAY) {
        lev = splat_level(T, __ldg(&values[i]));
    } else if (value_kind == SPLAT_VALUE_MASS) {
        lev = splat_level(T, p.w);
    }
    const unsigned int* row_light = light + 3 * (k * SPLAT_LEVELS + lev);
    const unsigned int l0 = __ldg(row_light), l1 = __ldg(row_light + 1), l2 = __ldg(row_light + 2);
    if ((l0 | l1 | l2) == 0u) {
        return;  // hidden (or black): nothing to add
    }
    const float cw = splat_clip_row(M + 12, p.x, p.y, p.z);
    if (!(cw > w_min && cw <= SPLAT_FLT_MAX)) {
        return;  // behind the camera, NaN or overflowed
    }
    const float nx = __fdiv_rn(splat_clip_row(M, p.x, p.y, p.z), cw);
    const float ny = __fdiv_rn(splat_clip_row(M + 4, p.x, p.y, p.z), cw);
    const float px = __fmul_rn(__fadd_rn(__fmul_rn(nx, 0.5f), 0.5f), (float)width);
    const float py = __fmul_rn(__fsub_rn(0.5f, __fmul_rn(ny, 0.5f)), (float)height);
    if (!(px >= -1.0f && px <= (float)(width + 1) && py >= -1.0f && py <= (float)(height + 1))) {
        return;  // further than a pixel off the frame (or NaN)
    }
    // floor(px * 256): the product is exact (a power of two), the conversion rounds down
    const int x = __float2int_rd(__fmul_rn(px, (float)SPLAT_SUB)) + SPLAT_BIAS;
    const int y = __float2int_rd(__fmul_rn(py, (float)SPLAT_SUB)) + SPLAT_BIAS;
    const int col = (x >> 8) - 2, row = (y >> 8) - 2;
    const unsigned int fx = x & 255, fy = y & 255;
    splat_add(accum, row, col, width, height, (256u - fx) * (256u - fy), l0, l1, l2);
    splat_add(accum, row, col + 1, width, height, fx * (256u - fy), l0, l1, l2);
    splat_add(accum, row + 1, col, width, height, (256u - fx) * fy, l0, l1, l2);
    splat_add(accum, row + 1, col + 1, width, height, fx * fy, l0, l1, l2);
}

// 16 * (the leading bit's place) + the 4 bits below it, of v > 0
__device__ __forceinline__ int splat_bin(const u64 v) {
    const int e = 63 - __clzll((long long)v);
    const u64 sub = e >= SPLAT_HIST_SUB_BITS ? v >> (e - SPLAT_HIST_SUB_BITS) : v << (SPLAT_HIST_SUB_BITS - e);
    return (e << SPLAT_HIST_SUB_BITS) + (int)(sub & ((1u << SPLAT_HIST_SUB_BITS) - 1u));
}

// hist (1024) uint32, zeroed by the host: each lit pixel's brightest channel counted in its bin, a block's
// counts gathered in shared memory first (every pixel of a frame falls in a few dozen bins)
extern "C" __global__ void splat_histogram(unsigned int* __restrict__ hist, const u64* __restrict__ accum,
                                           const int pixels) {
    __shared__ unsigned int local[SPLAT_HIST_BINS];
    for (int k = threadIdx.x; k < SPLAT_HIST_BINS; k += blockDim.x) {
        local[k] = 0u;
    }
    __syncthreads();
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < pixels; i += gridDim.x * blockDim.x) {
        const u64* a = accum + 3LL * i;
        const u64 v = max(max(a[0], a[1]), a[2]);
        if (v) {
            atomicAdd(&local[splat_bin(v)], 1u);
        }
    }
    __syncthreads();
    for (int k = threadIdx.x; k < SPLAT_HIST_BINS; k += blockDim.x) {
        if (local[k]) {
            atomicAdd(&hist[k], local[k]);
        }
    }
}

// out (H * W) RGBA8, top row first; lut (3, 4096) uint8 (the background is in it); the index of a channel
// value A is min(((min(A, saturation) >> shift) * scale) >> 48, 4095), which cannot overflow
// (splat.py exposure_for). RGBA8 because that is the texture format CUDA-GL interop registers (RGB8 is not).
extern "C" __global__ void splat_tonemap(uchar4* __restrict__ out, const u64* __restrict__ accum,
                                         const unsigned char* __restrict__ lut, const int pixels,
                                         const u64 scale, const u64 saturation, const int shift) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pixels) {
        return;
    }
    unsigned char c[3];
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) {
        const u64 a = min(accum[3LL * i + ch], saturation) >> shift;
        const u64 index = min((a * scale) >> SPLAT_EXPOSURE_SHIFT, (u64)(SPLAT_TONE_SIZE - 1));
        c[ch] = __ldg(&lut[ch * SPLAT_TONE_SIZE + (int)index]);
    }
    out[i] = make_uchar4(c[0], c[1], c[2], 255);
}
