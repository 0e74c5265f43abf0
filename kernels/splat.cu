// The `splat` draw style on the GPU: bodies projected from the device's float4 [x, y, z, m] rows, their
// light added into a frame-sized 64-bit integer buffer, a histogram of it, the exposure from it (on the
// device: no host round trip in a frame), and the tone map into RGBA8. The arithmetic contract is
// app/render/splat.py's docstring; the numba twin (app/render/splat_cpu.py) follows it too and
// tests/test_splat_gpu.py holds the two equal bit for bit.
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
#define SPLAT_X_MAX 8.0           // splat.py X_MAX
#define SPLAT_WEIGHT_ONE 65536.0  // splat.py WEIGHT_ONE
#define SPLAT_MIN_EXPOSURE_BITS 24
#define SPLAT_MAX_EXPOSURE_SCALE (1ULL << 62)

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

// The thresholds and the projection in shared memory (every body of the block reads them).
__device__ __forceinline__ void splat_load_view(float* T, float* M, const float* __restrict__ thresholds,
                                                const float* __restrict__ view_proj) {
    for (int k = threadIdx.x; k < SPLAT_LEVELS; k += blockDim.x) {
        T[k] = thresholds[k];
    }
    if (threadIdx.x < 16) {
        M[threadIdx.x] = view_proj[threadIdx.x];
    }
    __syncthreads();
}

// Contract steps 1-3 for body i: false when it adds nothing (its light is black or hidden; it is behind
// the camera, not finite or further than a pixel off the frame); else its light row (the index of its
// (component, level) in the table) and its centre in 1/256 px plus the bias, X and Y.
// comp (N) uint8 or NULL (component 0); values (N) float or NULL (read when value_kind is
// SPLAT_VALUE_ARRAY); light (16, 256, 3) uint32; M: view_proj, 16 floats, row-major, column vectors.
__device__ __forceinline__ bool splat_locate(const int i, const float4* __restrict__ pos,
                                             const unsigned char* __restrict__ comp,
                                             const float* __restrict__ values,
                                             const unsigned int* __restrict__ light, const float* T,
                                             const float* M, const int width, const int height,
                                             const float w_min, const int value_kind, int& X, int& Y,
                                             int& row) {
    const float4 p = __ldg(&pos[i]);
    const int k = comp ? min((int)__ldg(&comp[i]), SPLAT_COMPONENTS - 1) : 0;
    int lev = 0;
    if (value_kind == SPLAT_VALUE_ARRAY) {
        lev = splat_level(T, __ldg(&values[i]));
    } else if (value_kind == SPLAT_VALUE_MASS) {
        lev = splat_level(T, p.w);
    }
    row = k * SPLAT_LEVELS + lev;
    const unsigned int* l = light + 3 * row;
    if ((__ldg(l) | __ldg(l + 1) | __ldg(l + 2)) == 0u) {
        return false;  // hidden (or black): nothing to add
    }
    const float cw = splat_clip_row(M + 12, p.x, p.y, p.z);
    if (!(cw > w_min && cw <= SPLAT_FLT_MAX)) {
        return false;  // behind the camera, NaN or overflowed
    }
    const float nx = __fdiv_rn(splat_clip_row(M, p.x, p.y, p.z), cw);
    const float ny = __fdiv_rn(splat_clip_row(M + 4, p.x, p.y, p.z), cw);
    const float px = __fmul_rn(__fadd_rn(__fmul_rn(nx, 0.5f), 0.5f), (float)width);
    const float py = __fmul_rn(__fsub_rn(0.5f, __fmul_rn(ny, 0.5f)), (float)height);
    if (!(px >= -1.0f && px <= (float)(width + 1) && py >= -1.0f && py <= (float)(height + 1))) {
        return false;  // further than a pixel off the frame (or NaN)
    }
    // floor(px * 256): the product is exact (a power of two), the conversion rounds down
    X = __float2int_rd(__fmul_rn(px, (float)SPLAT_SUB)) + SPLAT_BIAS;
    Y = __float2int_rd(__fmul_rn(py, (float)SPLAT_SUB)) + SPLAT_BIAS;
    return true;
}

// The direct accumulation, one thread per body, its 2x2 footprint added straight into the frame: up to
// 12 global 64-bit atomics a body. Used where the frame has more tiles than the binned path's shared
// counters hold (SPLAT_MAX_TILES); the binned path below gives the same buffer bit for bit.
extern "C" __global__ void splat_accumulate(u64* __restrict__ accum, const float4* __restrict__ pos,
                                            const unsigned char* __restrict__ comp,
                                            const float* __restrict__ values,
                                            const unsigned int* __restrict__ light,
                                            const float* __restrict__ thresholds,
                                            const float* __restrict__ view_proj, const int n, const int width,
                                            const int height, const float w_min, const int value_kind) {
    __shared__ float T[SPLAT_LEVELS];
    __shared__ float M[16];
    splat_load_view(T, M, thresholds, view_proj);
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    int X, Y, row;
    if (i >= n || !splat_locate(i, pos, comp, values, light, T, M, width, height, w_min, value_kind, X, Y, row)) {
        return;
    }
    const unsigned int l0 = __ldg(light + 3 * row), l1 = __ldg(light + 3 * row + 1), l2 = __ldg(light + 3 * row + 2);
    const int col = (X >> 8) - 2, r = (Y >> 8) - 2;
    const unsigned int fx = X & 255, fy = Y & 255;
    splat_add(accum, r, col, width, height, (256u - fx) * (256u - fy), l0, l1, l2);
    splat_add(accum, r, col + 1, width, height, fx * (256u - fy), l0, l1, l2);
    splat_add(accum, r + 1, col, width, height, (256u - fx) * fy, l0, l1, l2);
    splat_add(accum, r + 1, col + 1, width, height, fx * fy, l0, l1, l2);
}

// --- the binned accumulation: the same buffer with few global atomics ---------------------------------
// The direct kernel spends its time in global atomics: 12 a body, on the same few addresses in a dense
// core (4.3 ms at 16M bodies on an H200, 1920x1080; bench/splat_cost.py). Software rasterizers bin
// first: here each body is placed once (splat_count: its record and its 32x32-pixel tile, counted per
// tile), the counts scanned into each tile's range (splat_offsets), the records gathered into their tiles'
// ranges (splat_scatter), and one block per chunk of a tile adds its records into the tile in shared
// memory, then adds the tile into the frame, one global atomic per lit pixel channel (splat_tiles).
// Integer sums do not depend on the order, so the buffer is the direct kernel's bit for bit.
//
// A tile covers the bodies whose first footprint column X >> 8 (the pixel column plus 2) and row fall in
// it; their footprint reaches one more column and row, so a tile's shared buffer is 33 x 33 pixels and
// its edge is added to the neighbour's pixels by the same global atomics.
// A record: x = fx | fy << 8 | (column in the tile) << 16 | (row in the tile) << 21; y = the light row.
//
// Measured and left out (H200, 16M bodies, bench/splat_cost.py): counting a warp's bodies of one tile
// with __match_any_sync and one atomic made splat_count slower (0.30 ms against 0.19 ms for plain shared
// atomics, which the hardware already merges); 64-bit shared atomics, a compare-and-swap loop on sm_90
// (ATOMS.CAST.SPIN.64 in the SASS), made splat_tiles 0.81 ms against 0.29 ms for the split adds below.

#define SPLAT_TILE 32
#define SPLAT_TILE_SHIFT 5
#define SPLAT_TILE_SPAN (SPLAT_TILE + 1)
#define SPLAT_MAX_TILES 4000   // splat.py MAX_TILES: the shared counters of count and scatter
#define SPLAT_PER_THREAD 8     // splat.py PER_THREAD: bodies a thread holds per round of splat_scatter
#define SPLAT_ROUND 2048       // 256 threads x SPLAT_PER_THREAD
#define SPLAT_MAX_CHUNK 16384  // splat.py MAX_CHUNK: the most records per block of splat_tiles
#define SPLAT_NOT_DRAWN 0xffffffffu  // splat_count's mark of a body that adds nothing

__device__ __forceinline__ int splat_tile_of(const int X, const int Y, const int tiles_x) {
    return ((Y >> 8) >> SPLAT_TILE_SHIFT) * tiles_x + ((X >> 8) >> SPLAT_TILE_SHIFT);
}

// An exclusive scan of one value per thread over the block (shuffles within each warp, then the warps'
// sums by the first warp); `total` gets the block's sum. warp_sums: 32 ints of shared memory.
__device__ __forceinline__ int splat_block_scan(const int v, int* warp_sums, int& total) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    int x = v;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
    }
    if (lane == 31) {
        warp_sums[warp] = x;
    }
    __syncthreads();
    if (warp == 0) {
        int w = lane < warps ? warp_sums[lane] : 0;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, w, off);
            if (lane >= off) w += y;
        }
        if (lane < warps) {
            warp_sums[lane] = w;
        }
    }
    __syncthreads();
    total = warp_sums[warps - 1];
    const int exclusive = (warp ? warp_sums[warp - 1] : 0) + x - v;
    __syncthreads();  // warp_sums is free again
    return exclusive;
}

// One pass of contract steps 1-3 per body: its record and its tile into `placed` (x: the record's x; y: the
// light row | tile << 12, or SPLAT_NOT_DRAWN), and counts (tiles) int, zeroed by the host, the drawn
// bodies per tile (each block counts its bodies in shared memory first, then adds its nonzero counts).
extern "C" __global__ void __launch_bounds__(256)
splat_count(int* __restrict__ counts, uint2* __restrict__ placed, const float4* __restrict__ pos,
            const unsigned char* __restrict__ comp, const float* __restrict__ values,
            const unsigned int* __restrict__ light, const float* __restrict__ thresholds,
            const float* __restrict__ view_proj, const int n, const int width, const int height,
            const float w_min, const int value_kind, const int tiles_x, const int tiles) {
    __shared__ float T[SPLAT_LEVELS];
    __shared__ float M[16];
    __shared__ int local[SPLAT_MAX_TILES];
    for (int k = threadIdx.x; k < tiles; k += blockDim.x) {
        local[k] = 0;
    }
    splat_load_view(T, M, thresholds, view_proj);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int X, Y, row;
        if (splat_locate(i, pos, comp, values, light, T, M, width, height, w_min, value_kind, X, Y, row)) {
            const int tile = splat_tile_of(X, Y, tiles_x);
            placed[i] = make_uint2((X & 255) | (Y & 255) << 8 | ((X >> 8) & (SPLAT_TILE - 1)) << 16 |
                                       ((Y >> 8) & (SPLAT_TILE - 1)) << 21,
                                   (unsigned int)row | (unsigned int)tile << 12);
            atomicAdd(&local[tile], 1);
        } else {
            placed[i] = make_uint2(0u, SPLAT_NOT_DRAWN);
        }
    }
    __syncthreads();
    for (int k = threadIdx.x; k < tiles; k += blockDim.x) {
        if (local[k]) {
            atomicAdd(&counts[k], local[k]);
        }
    }
}

// One block of 1024 threads, 4 tiles a thread: starts = the exclusive scan of counts (each tile's range of
// records), cursor = starts (splat_scatter's), chunk_starts = the exclusive scan of the tiles' chunks of
// `chunk` records (at most SPLAT_MAX_CHUNK), with the total chunk count at chunk_starts[tiles].
extern "C" __global__ void __launch_bounds__(1024)
splat_offsets(const int* __restrict__ counts, int* __restrict__ starts, int* __restrict__ cursor,
              int* __restrict__ chunk_starts, const int tiles, const int chunk) {
    __shared__ int warp_sums[32];
    const int first = 4 * threadIdx.x;
    int c[4], chunks[4], sum = 0, chunk_sum = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        c[j] = first + j < tiles ? counts[first + j] : 0;
        chunks[j] = (c[j] + chunk - 1) / chunk;
        sum += c[j];
        chunk_sum += chunks[j];
    }
    int total, chunk_total;
    int at = splat_block_scan(sum, warp_sums, total);
    int chunk_at = splat_block_scan(chunk_sum, warp_sums, chunk_total);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        if (first + j < tiles) {
            starts[first + j] = at;
            cursor[first + j] = at;
            chunk_starts[first + j] = chunk_at;
        }
        at += c[j];
        chunk_at += chunks[j];
    }
    if (threadIdx.x == 0) {
        chunk_starts[tiles] = chunk_total;
    }
}

// The placed records gathered into their tiles' ranges, a round of SPLAT_ROUND bodies at a time, held in
// registers: (1) each body's rank in its tile for the round from a shared counter, the first of each tile
// listing the tile; (2) the listed tiles' counts scanned into the round's local order, each tile's range
// reserved with one global atomic on its cursor; (3) the records staged in shared memory grouped by tile;
// (4) written out in that order, so that a tile's records of the round go out as one run of consecutive
// addresses (written where each body's thread found it, they cost one memory transaction each).
extern "C" __global__ void __launch_bounds__(256, 4)  // (its shared memory allows 4 blocks an SM anyway)
splat_scatter(uint2* __restrict__ records, int* __restrict__ cursor, const uint2* __restrict__ placed,
              const int n, const int tiles) {
    __shared__ int count[SPLAT_MAX_TILES];  // the round's bodies per tile; then (local start | list index << 16)
    __shared__ int listed[SPLAT_ROUND];      // the tiles the round touched, each once
    __shared__ int delta[SPLAT_ROUND];       // per listed tile: its global range's start minus its local start
    __shared__ uint2 staged[SPLAT_ROUND];    // the round's records grouped by tile (y: row | list index << 12)
    __shared__ int warp_sums[32];
    __shared__ int n_listed;
    for (int k = threadIdx.x; k < tiles; k += blockDim.x) {
        count[k] = 0;
    }
    if (threadIdx.x == 0) {
        n_listed = 0;
    }
    __syncthreads();
    for (int first = blockIdx.x * SPLAT_ROUND; first < n; first += gridDim.x * SPLAT_ROUND) {
        int tile[SPLAT_PER_THREAD], rank[SPLAT_PER_THREAD];
        uint2 rec[SPLAT_PER_THREAD];
#pragma unroll
        for (int j = 0; j < SPLAT_PER_THREAD; ++j) {  // (1)
            const int i = first + j * blockDim.x + threadIdx.x;
            rec[j] = i < n ? __ldg(&placed[i]) : make_uint2(0u, SPLAT_NOT_DRAWN);
            tile[j] = rec[j].y == SPLAT_NOT_DRAWN ? -1 : (int)(rec[j].y >> 12);
            rank[j] = tile[j] >= 0 ? atomicAdd(&count[tile[j]], 1) : 0;
            if (tile[j] >= 0 && rank[j] == 0) {
                listed[atomicAdd(&n_listed, 1)] = tile[j];
            }
        }
        __syncthreads();
        const int m = n_listed;  // (2): thread t scans list entries 8t .. 8t + 7
        int c[SPLAT_PER_THREAD], sum = 0;
#pragma unroll
        for (int q = 0; q < SPLAT_PER_THREAD; ++q) {
            const int k = SPLAT_PER_THREAD * threadIdx.x + q;
            c[q] = k < m ? count[listed[k]] : 0;
            sum += c[q];
        }
        int total;
        int at = splat_block_scan(sum, warp_sums, total);  // (its syncs order the reads of count before the writes)
#pragma unroll
        for (int q = 0; q < SPLAT_PER_THREAD; ++q) {
            const int k = SPLAT_PER_THREAD * threadIdx.x + q;
            if (k < m) {
                const int t = listed[k];
                delta[k] = atomicAdd(&cursor[t], c[q]) - at;
                count[t] = at | k << 16;
            }
            at += c[q];
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            n_listed = 0;  // (every thread has read it; the next round lists after the syncs below)
        }
#pragma unroll
        for (int j = 0; j < SPLAT_PER_THREAD; ++j) {  // (3)
            if (tile[j] >= 0) {
                const int v = count[tile[j]];
                staged[(v & 0xffff) + rank[j]] = make_uint2(rec[j].x, (rec[j].y & 4095u) | (unsigned int)(v >> 16) << 12);
            }
        }
        __syncthreads();
        for (int p = threadIdx.x; p < total; p += blockDim.x) {  // (4)
            const uint2 r = staged[p];
            records[delta[r.y >> 12] + p] = make_uint2(r.x, r.y & 4095u);
        }
        for (int k = threadIdx.x; k < m; k += blockDim.x) {
            count[listed[k]] = 0;
        }
        __syncthreads();  // count, listed, delta and staged are the next round's
    }
}

// A tile's pixel channels in shared memory as two 32-bit words, lo and hi: a 32-bit shared add is one
// instruction where a 64-bit one is a compare-and-swap loop. The carry out of lo goes into hi: exact while
// a chunk's sum per channel is below 2^64 (SPLAT_MAX_CHUNK bodies of at most 2^48 each: L < 2^32, w <= 2^16).
__device__ __forceinline__ void splat_add_split(unsigned int* lo, unsigned int* hi, const int k, const u64 v) {
    const unsigned int low = (unsigned int)v;
    const unsigned int old = atomicAdd(lo + k, low);
    const unsigned int high = (unsigned int)(v >> 32) + (old + low < old ? 1u : 0u);
    if (high) {
        atomicAdd(hi + k, high);
    }
}

__device__ __forceinline__ void splat_add_shared(unsigned int* lo, unsigned int* hi, const int at,
                                                 const unsigned int weight, const unsigned int l0,
                                                 const unsigned int l1, const unsigned int l2) {
    if (weight == 0u) {
        return;
    }
    if (l0) splat_add_split(lo, hi, 3 * at, (u64)l0 * weight);
    if (l1) splat_add_split(lo, hi, 3 * at + 1, (u64)l1 * weight);
    if (l2) splat_add_split(lo, hi, 3 * at + 2, (u64)l2 * weight);
}

// One block per chunk of `chunk` records of a tile (the grid is an upper bound on the chunks; blocks past
// chunk_starts[tiles] return): the chunk's footprints added into a 33 x 33 tile in shared memory, then the
// tile's lit pixel channels added into the frame. Smaller chunks spread a dense tile over more blocks (the
// core of a galaxy at 1M bodies), larger ones add fewer tiles into the frame (the host picks: splat_cuda.py).
extern "C" __global__ void __launch_bounds__(256)
splat_tiles(u64* __restrict__ accum, const uint2* __restrict__ records, const int* __restrict__ starts,
            const int* __restrict__ counts, const int* __restrict__ chunk_starts,
            const unsigned int* __restrict__ light, const int tiles, const int tiles_x, const int width,
            const int height, const int chunk) {
    __shared__ unsigned int lo[SPLAT_TILE_SPAN * SPLAT_TILE_SPAN * 3];
    __shared__ unsigned int hi[SPLAT_TILE_SPAN * SPLAT_TILE_SPAN * 3];
    const int b = blockIdx.x;
    if (b >= chunk_starts[tiles]) {
        return;
    }
    int t = 0, last = tiles - 1;  // the last tile whose chunks start at or before b: b's tile
    while (t < last) {
        const int mid = (t + last + 1) >> 1;
        if (chunk_starts[mid] <= b) {
            t = mid;
        } else {
            last = mid - 1;
        }
    }
    const int begin = starts[t] + (b - chunk_starts[t]) * chunk;
    const int end = min(begin + chunk, starts[t] + counts[t]);
    for (int k = threadIdx.x; k < SPLAT_TILE_SPAN * SPLAT_TILE_SPAN * 3; k += blockDim.x) {
        lo[k] = 0u;
        hi[k] = 0u;
    }
    __syncthreads();
    for (int r = begin + threadIdx.x; r < end; r += blockDim.x) {
        const uint2 rec = __ldg(&records[r]);
        const unsigned int fx = rec.x & 255u, fy = (rec.x >> 8) & 255u;
        const int at = (int)((rec.x >> 21) & 31u) * SPLAT_TILE_SPAN + (int)((rec.x >> 16) & 31u);
        const unsigned int* l = light + 3 * rec.y;
        const unsigned int l0 = __ldg(l), l1 = __ldg(l + 1), l2 = __ldg(l + 2);
        splat_add_shared(lo, hi, at, (256u - fx) * (256u - fy), l0, l1, l2);
        splat_add_shared(lo, hi, at + 1, fx * (256u - fy), l0, l1, l2);
        splat_add_shared(lo, hi, at + SPLAT_TILE_SPAN, (256u - fx) * fy, l0, l1, l2);
        splat_add_shared(lo, hi, at + SPLAT_TILE_SPAN + 1, fx * fy, l0, l1, l2);
    }
    __syncthreads();
    const int gx0 = (t % tiles_x) * SPLAT_TILE - 2, gy0 = (t / tiles_x) * SPLAT_TILE - 2;
    for (int p = threadIdx.x; p < SPLAT_TILE_SPAN * SPLAT_TILE_SPAN; p += blockDim.x) {
        const int col = gx0 + p % SPLAT_TILE_SPAN, row = gy0 + p / SPLAT_TILE_SPAN;
        if (col < 0 || col >= width || row < 0 || row >= height) {
            continue;
        }
        u64* out = accum + 3LL * ((long long)row * width + col);
#pragma unroll
        for (int c = 0; c < 3; ++c) {
            const u64 v = (u64)hi[3 * p + c] << 32 | lo[3 * p + c];
            if (v) atomicAdd(out + c, v);
        }
    }
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

// --- the exposure on the device -------------------------------------------------------------------------
// Why here and not on the host: a host that reads the histogram back waits for the frame's kernels, which
// wait behind the step's force on the GPU; with the exposure a kernel, `draw` queues the whole frame and
// returns, and the viewer prepares the next frame while the force runs. The numbers are splat.py
// frame_exposure's bit for bit (tests/test_splat_gpu.py compares them): float64 throughout, each operation
// rounded on its own (the file is built with -fmad=false; the intrinsics say so anyway), the light's
// running sum in numpy cumsum's order, one thread, from shared memory.

// 2^e for -1022 <= e <= 1023, exact
__device__ __forceinline__ double splat_pow2(const int e) {
    return __longlong_as_double((long long)(e + 1023) << 52);
}

// splat.py bin_value: the bin's lower edge plus half its width (exact below 16, where bins are)
__device__ __forceinline__ double splat_bin_value(const int b) {
    const int e = b >> SPLAT_HIST_SUB_BITS, sub = b & ((1 << SPLAT_HIST_SUB_BITS) - 1);
    const double half = e >= SPLAT_HIST_SUB_BITS ? 0.5 : 0.0;
    return __dmul_rn(splat_pow2(e), __dadd_rn(1.0, __ddiv_rn(__dadd_rn((double)sub, half), 16.0)));
}

// exposure (4 x u64): scale, saturation, shift, and the bits of x_per_unit (double), as splat.py
// exposure_for makes them from x: the least shift that keeps 2^24 <= E, E rounded half to even (Python's
// round), saturation = ceil(4095 * 2^48 / E) << shift, at most 2^64 - 1.
__device__ void splat_exposure_for(u64* __restrict__ exposure, const double x) {
    double steps = __dmul_rn(__dmul_rn(x, (double)SPLAT_TONE_SIZE / SPLAT_X_MAX), splat_pow2(SPLAT_EXPOSURE_SHIFT));
    if (!(isfinite(steps) && steps > 0.0)) {
        steps = 1.0;
    }
    int shift = 0;
    while (__dmul_rn(steps, splat_pow2(shift)) < splat_pow2(SPLAT_MIN_EXPOSURE_BITS) && shift < 63) {
        ++shift;
    }
    const double e = rint(__dmul_rn(steps, splat_pow2(shift)));
    const u64 scale = e >= (double)SPLAT_MAX_EXPOSURE_SCALE ? SPLAT_MAX_EXPOSURE_SCALE : e < 1.0 ? 1ULL : (u64)e;
    const u64 last = (u64)(SPLAT_TONE_SIZE - 1) << SPLAT_EXPOSURE_SHIFT;
    const u64 reach = (last + scale - 1ULL) / scale;  // < 2^60 + 2^62: no overflow
    const bool over = shift > 0 && (reach >> (64 - shift)) != 0ULL;
    exposure[0] = scale;
    exposure[1] = over ? ~0ULL : reach << shift;
    exposure[2] = (u64)shift;
    exposure[3] = (u64)__double_as_longlong(x);
}

// One block of SPLAT_HIST_BINS threads. automatic: x = level / (the light-weighted `percentile` of the lit
// pixels' histogram) (splat.py auto_exposure; nothing lit: 1 / WEIGHT_ONE); else x = manual_x (splat.py
// manual_x_per_unit).
extern "C" __global__ void __launch_bounds__(1024)  // SPLAT_HIST_BINS threads
    splat_exposure(u64* __restrict__ exposure, const unsigned int* __restrict__ hist, const int automatic,
                   const double percentile, const double level, const double manual_x) {
    __shared__ double light[SPLAT_HIST_BINS];
    __shared__ int lit;
    const int k = threadIdx.x;
    if (k == 0) {
        lit = 0;
    }
    __syncthreads();
    const unsigned int count = hist[k];
    light[k] = __dmul_rn((double)count, splat_bin_value(k));  // numpy's counts * bin values
    if (count) {
        lit = 1;
    }
    __syncthreads();
    if (k != 0) {
        return;
    }
    double x = manual_x;
    if (automatic) {
        x = 1.0 / SPLAT_WEIGHT_ONE;
        if (lit) {
            for (int i = 1; i < SPLAT_HIST_BINS; ++i) {
                light[i] = __dadd_rn(light[i - 1], light[i]);
            }
            const double target = __dmul_rn(__ddiv_rn(percentile, 100.0), light[SPLAT_HIST_BINS - 1]);
            int b = SPLAT_HIST_BINS - 1;  // numpy searchsorted (left): the first bin whose sum reaches it
            for (int i = 0; i < SPLAT_HIST_BINS; ++i) {
                if (light[i] >= target) {
                    b = i;
                    break;
                }
            }
            x = __ddiv_rn(level, splat_bin_value(b));
        }
    }
    splat_exposure_for(exposure, x);
}

// The tone-map index of a channel value A: min(((min(A, saturation) >> shift) * scale) >> 48, 4095), which
// cannot overflow (splat.py exposure_for). splat_tonemap and the bloom's splat_indices both take it here,
// with the frame's exposure as splat_exposure wrote it.
__device__ __forceinline__ u64 tone_index(const u64 value, const u64* __restrict__ exposure) {
    const u64 scale = __ldg(&exposure[0]), saturation = __ldg(&exposure[1]);
    const int shift = (int)__ldg(&exposure[2]);
    return min(((min(value, saturation) >> shift) * scale) >> SPLAT_EXPOSURE_SHIFT, (u64)(SPLAT_TONE_SIZE - 1));
}

// A pixel of the frame from its three channels' tone-map indices (each < SPLAT_TONE_SIZE): the LUT's
// colours, opaque. RGBA8 because that is the texture format CUDA-GL interop registers (RGB8 is not).
__device__ __forceinline__ uchar4 lut_pixel(const unsigned char* __restrict__ lut, const int (&index)[3]) {
    return make_uchar4(__ldg(&lut[index[0]]), __ldg(&lut[SPLAT_TONE_SIZE + index[1]]),
                       __ldg(&lut[2 * SPLAT_TONE_SIZE + index[2]]), 255);
}

// out (H * W) RGBA8, top row first; lut (3, 4096) uint8 (the background is in it), read at tone_index.
extern "C" __global__ void splat_tonemap(uchar4* __restrict__ out, const u64* __restrict__ accum,
                                         const unsigned char* __restrict__ lut, const int pixels,
                                         const u64* __restrict__ exposure) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pixels) {
        return;
    }
    int index[3];
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) {
        index[ch] = (int)tone_index(accum[3LL * i + ch], exposure);
    }
    out[i] = lut_pixel(lut, index);
}

// --- the bloom (app/render/splat_bloom.py): render.bloom > 0 ---------------------------------------------
// index (H * W * 3) uint32: each channel's tone-map index, as splat_tonemap computes it, kept for the end.
extern "C" __global__ void splat_indices(unsigned int* __restrict__ index, const u64* __restrict__ accum,
                                         const int pixels, const u64* __restrict__ exposure) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pixels) {
        return;
    }
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) {
        index[3LL * i + ch] = (unsigned int)tone_index(accum[3LL * i + ch], exposure);
    }
}

// One pass of the separable blur: out = (sum_k taps[k] max(src[.. + k - reach ..] - threshold, 0)) // total
// along the row (along_rows = 1) or the column, pixels outside the frame 0. The row pass takes the index
// with the bloom's threshold (its bright part), the column pass the row pass's output with threshold 0.
// Integer sums in 64 bits: the same bytes as the twin's glow_pass.
extern "C" __global__ void splat_glow(unsigned int* __restrict__ out, const unsigned int* __restrict__ src,
                                      const int* __restrict__ taps, const int reach, const long long total,
                                      const int width, const int height, const int along_rows,
                                      const int threshold) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= width * height) {
        return;
    }
    const int r = i / width;
    const int c = i - r * width;
    long long acc[3] = {0, 0, 0};
    for (int j = 0; j <= 2 * reach; ++j) {
        const int rr = along_rows ? r : r + j - reach;
        const int cc = along_rows ? c + j - reach : c;
        if (rr < 0 || rr >= height || cc < 0 || cc >= width) {
            continue;
        }
        const long long w = __ldg(&taps[j]);
        const long long at = 3LL * ((long long)rr * width + cc);
#pragma unroll
        for (int ch = 0; ch < 3; ++ch) {
            acc[ch] += w * (long long)max((int)__ldg(&src[at + ch]) - threshold, 0);
        }
    }
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) {
        out[3LL * i + ch] = (unsigned int)(acc[ch] / total);
    }
}

// The tone map with the glow: lut[ch, min(i + ((gain * v) >> 8), 4095)].
extern "C" __global__ void splat_tonemap_glow(uchar4* __restrict__ out, const unsigned int* __restrict__ index,
                                              const unsigned int* __restrict__ glow,
                                              const unsigned char* __restrict__ lut, const int pixels,
                                              const int gain) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= pixels) {
        return;
    }
    int lifted[3];
#pragma unroll
    for (int ch = 0; ch < 3; ++ch) {
        const long long sum = (long long)index[3LL * i + ch] + (((long long)gain * glow[3LL * i + ch]) >> 8);
        lifted[ch] = (int)min(sum, (long long)(SPLAT_TONE_SIZE - 1));
    }
    out[i] = lut_pixel(lut, lifted);
}
