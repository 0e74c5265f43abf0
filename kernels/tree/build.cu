// The GPU tree's construction (`tree` record; docs/tree.md specifies every step and the CPU twin in
// app/backends/cpu_tree_kernels.py implements the same): bounding cube, Morton keys, the gather into key
// order, the octree level by level, moments bottom up and the packed cell rows the walk reads.
//
// Built with -fmad=false and without --use_fast_math (app/backends/cuda/tree.py): every expression here is
// evaluated as the CPU twin writes it, operation by operation, IEEE-rounded to nearest (divisions and
// square roots included, denormals kept), without contraction into FMAs, so that the cube, the keys, the
// moments and the opening rows are bitwise those of the CPU tree and both walks accept the same cells.
//
// Precision (docs/tree.md, step 7). The moments and the opening rows are float32: they are per cell every
// step, and a desktop GPU runs float64 at 1/64 of its float32 rate. Float64 stays where float32 would
// change the answer and the cost is small:
//   - tree_bounds_finish: one thread per evaluation (the cube: numpy's float64 min / max arithmetic);
//   - tree_keys: floor((x - lo) * 2^21 / size) needs the difference to 2^-21 of the cube and below, which
//     float32 (24 bits, once rounded by the subtraction and again by the scale) gets wrong by one cell for
//     bodies near a cell's face; a few float64 operations per coordinate in a kernel bound by its memory
//     traffic (16 bytes read, 8 written per body);
//   - tree_pack: the offset of a cell's centre of mass from its geometric centre, (com - lo) - (ijk + 1/2)
//     side, a difference of two numbers as large as the cube resolved to a fraction of a deep cell's side
//     (2^-21 of the cube at level 21: float32 resolves an eighth of that): about 20 float64 operations per
//     cell, a cell per three or four bodies.
//   - tree_refit (only between builds, rebuild_every > 1): a cell's cube against its bodies' box and the
//     grown cube, relative to the same float64 corner for the same reason (the cube is a deep cell's to
//     2^-21 of the key cube); about 60 float64 operations per cell.
//
// Cells are stored breadth first: the cells of level L are the contiguous range [level_start[L],
// level_start[L+1]); the children of a cell are contiguous, in octant order, in the next level's range.
// The level ranges live on the device (lvl[L] = the first cell of level L), so the host queues every level
// (tree_level_split) and every moments pass without waiting for a
// level's size, and reads lvl once after the build. A round trip per level cost 1.5 to 2.4 ms of the 1M
// step on H200 machines; queued with a CuPy prefix sum over all cells per level the build still took
// 2.0 ms, bound by the host's calls: hence one scan launch per level, over the level alone, and only as
// many levels as the last build had (app/backends/cuda/tree.py). Each kernel loops over its level's range
// with a fixed grid; an empty level costs its launches.

#include <stdint.h>

#define TREE_MAX_LEVEL 21
#define TREE_KEY_CELLS 2097152.0  // 2^21 integer coordinates per axis

// --- bounding cube -----------------------------------------------------------------------------------
// numpy's min/max propagate NaN (the CPU cube then falls back to size 1): so do these.
__device__ __forceinline__ float min_of(float a, float b) { return (a != a) ? a : ((b != b || b < a) ? b : a); }
__device__ __forceinline__ float max_of(float a, float b) { return (a != a) ? a : ((b != b || b > a) ? b : a); }

// Per block: min and max of x, y, z over a grid-stride share of the n positions -> part[6 * block].
extern "C" __global__ void __launch_bounds__(256) tree_bounds_partial(const float4* __restrict__ p, int n,
                                                                      float* __restrict__ part) {
    __shared__ float s[6][256];
    float v[6];
    bool any = false;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float4 q = p[i];
        if (!any) {
            v[0] = v[3] = q.x;
            v[1] = v[4] = q.y;
            v[2] = v[5] = q.z;
            any = true;
        } else {
            v[0] = min_of(v[0], q.x);
            v[1] = min_of(v[1], q.y);
            v[2] = min_of(v[2], q.z);
            v[3] = max_of(v[3], q.x);
            v[4] = max_of(v[4], q.y);
            v[5] = max_of(v[5], q.z);
        }
    }
    if (!any) {  // no position: neutral elements
        v[0] = v[1] = v[2] = __int_as_float(0x7f800000);
        v[3] = v[4] = v[5] = __int_as_float(0xff800000);
    }
    for (int k = 0; k < 6; ++k) s[k][threadIdx.x] = v[k];
    __syncthreads();
    for (int h = blockDim.x / 2; h > 0; h >>= 1) {
        if (threadIdx.x < h) {
            for (int k = 0; k < 3; ++k) {
                s[k][threadIdx.x] = min_of(s[k][threadIdx.x], s[k][threadIdx.x + h]);
                s[k + 3][threadIdx.x] = max_of(s[k + 3][threadIdx.x], s[k + 3][threadIdx.x + h]);
            }
        }
        __syncthreads();
    }
    if (threadIdx.x < 6) part[6 * blockIdx.x + threadIdx.x] = s[threadIdx.x][0];
}

// One thread: the cube from the blocks' partials, as the CPU's bounding_cube: lo = the per-axis minimum,
// size = the largest extent x (1 + 1e-6); a zero or non-finite extent gives size 1 and a non-finite lo
// component becomes 0. box = [lo.x, lo.y, lo.z, size, 2^21 / size] (double; the last is the keys' scale,
// divided once here rather than in every thread of tree_keys).
extern "C" __global__ void tree_bounds_finish(const float* __restrict__ part, int blocks, double* __restrict__ box) {
    if (threadIdx.x != 0 || blockIdx.x != 0) return;
    float v[6];
    for (int k = 0; k < 6; ++k) v[k] = part[k];
    for (int b = 1; b < blocks; ++b) {
        for (int k = 0; k < 3; ++k) {
            v[k] = min_of(v[k], part[6 * b + k]);
            v[k + 3] = max_of(v[k + 3], part[6 * b + k + 3]);
        }
    }
    double extent = 0.0;
    bool nan = false;
    for (int k = 0; k < 3; ++k) {
        const double e = (double)v[k + 3] - (double)v[k];
        if (e != e) nan = true;                 // numpy's max propagates NaN
        else if (k == 0 || e > extent) extent = e;
    }
    double size = extent * (1.0 + 1e-6);
    if (nan || !(isfinite(size) && size > 0.0)) size = 1.0;
    for (int k = 0; k < 3; ++k) box[k] = isfinite((double)v[k]) ? (double)v[k] : 0.0;
    box[3] = size;
    box[4] = TREE_KEY_CELLS / size;
}

// --- keys ---------------------------------------------------------------------------------------------
__device__ __forceinline__ unsigned long long spread21(unsigned long long v) {
    v &= 0x1FFFFFull;
    v = (v | (v << 32)) & 0x1F00000000FFFFull;
    v = (v | (v << 16)) & 0x1F0000FF0000FFull;
    v = (v | (v << 8)) & 0x100F00F00F00F00Full;
    v = (v | (v << 4)) & 0x10C30C30C30C30C3ull;
    v = (v | (v << 2)) & 0x1249249249249249ull;
    return v;
}

// floor((v - lo) * scale) clamped to [0, 2^21 - 1]; NaN and negatives give 0 (no undefined cast).
__device__ __forceinline__ unsigned long long key_coord(float v, double lo, double scale) {
    const double f = ((double)v - lo) * scale;
    if (!(f > 0.0)) return 0ull;
    if (f >= TREE_KEY_CELLS - 1.0) return (unsigned long long)(TREE_KEY_CELLS - 1.0);
    return (unsigned long long)f;
}

// 63-bit keys, x above y above z: coordinate bit b of x, y, z goes to key bit 3b+2, 3b+1, 3b.
extern "C" __global__ void tree_keys(const float4* __restrict__ p, int n, const double* __restrict__ box,
                                     unsigned long long* __restrict__ keys) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const double scale = box[4];
    const float4 q = p[i];
    keys[i] = (spread21(key_coord(q.x, box[0], scale)) << 2) | (spread21(key_coord(q.y, box[1], scale)) << 1) |
              spread21(key_coord(q.z, box[2], scale));
}

// The bodies and keys in key order: spos[k] = p[order[k]], skeys[k] = keys[order[k]], sorder = order.
extern "C" __global__ void tree_gather(const float4* __restrict__ p, const unsigned long long* __restrict__ keys,
                                       const long long* __restrict__ order, int n, float4* __restrict__ spos,
                                       unsigned long long* __restrict__ skeys, int* __restrict__ sorder) {
    const int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n) return;
    const int i = (int)order[k];
    spos[k] = p[i];
    skeys[k] = keys[i];
    sorder[k] = i;
}

// --- the octree, one level at a time --------------------------------------------------------------------
// The octant of sorted key k at the next level; nondecreasing over a cell's range (a shared prefix).
__device__ __forceinline__ int octant(const unsigned long long* skeys, int k, int shift) {
    return (int)((skeys[k] >> shift) & 7ull);
}

// First index in [lo, hi) whose octant is >= o (hi if none).
__device__ __forceinline__ int octant_bound(const unsigned long long* skeys, int lo, int hi, int shift, int o) {
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (octant(skeys, mid, shift) < o) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// The cells of level `level`, [lvl[level], lvl[level + 1]), as a grid-stride loop.
#define FOR_LEVEL_CELLS(c, lvl, level)                                                                   \
    for (int c = (lvl)[level] + blockIdx.x * blockDim.x + threadIdx.x, c##_end = (lvl)[(level) + 1];    \
         c < c##_end; c += gridDim.x * blockDim.x)

// One launch per level splits it: `tree_level_split` counts each cell's non-empty octants, places the
// children by a prefix sum over the level, and writes them (it was three launches per level, count, scan
// and write; the host's launches were the 1M step's bottleneck on two GPUs, whose builds one thread queues
// in turns: docs/multi-gpu.md).
//
// The prefix sum is a single pass with decoupled look-back (Merrill and Garland, "Single-pass Parallel
// Prefix Scan with Decoupled Look-back", NVIDIA 2016), on the per-level kernels' fixed grid: blocks take
// tiles of SPLIT_TILE cells in order from a ticket counter per level (tickets[level]); for its tile a block
//   1. counts: eight lanes per cell, lane o finds where octant o starts in the cell's key range by one
//      binary search (a level's longest chain of dependent loads is one search of the cell, not eight in a
//      row: the top levels are a few cells over a million keys), and keeps those edges for step 3;
//   2. scans the tile's child counts, publishes the tile's total, and adds up its predecessors' published
//      totals back to the first published prefix. A tile's predecessors were taken by blocks already
//      running that never wait for it, so no co-residency is assumed;
//   3. writes: a split cell's children go to [b + prefix, ...), one per non-empty octant in octant order
//      (lane o writes octant o's child, placed by the non-empty lanes before it); child[c] = the first
//      child's index, -1 for a leaf.
// The status word of tile t (status[t]): bits 62-63 what it holds (1 the tile's total, 2 the inclusive
// prefix), bits 32-37 level + 1 (a word of an earlier level of this build reads as "not yet"; the host
// zeroes status and tickets before each build), bits 0-31 the value. The last tile sets
// lvl[level + 2] = b + the level's children; past the capacity `cap` of the cell arrays it sets
// *overflow = 1 and leaves the next level empty, and no child is written past `cap` (the host grows the
// arrays and builds again). nchild[c] = the number of children of a split cell (more than `leaf` bodies
// and level < 21), 0 for a leaf.
#define CELL_LANES 8
#define SPLIT_THREADS 256
#define SPLIT_CELLS_PER_PASS (SPLIT_THREADS / CELL_LANES)
#define SPLIT_TILE 256  // cells per tile: 8 passes of 32 cells; one per thread in the scan
#define SPLIT_ITEMS (SPLIT_TILE / SPLIT_THREADS)
#define SCAN_TOTAL 1ull
#define SCAN_PREFIX 2ull

__device__ __forceinline__ unsigned eighth_mask() { return 0xffu << (threadIdx.x & 24); }

__device__ __forceinline__ unsigned long long scan_word(unsigned long long flag, int level, long long value) {
    return (flag << 62) | ((unsigned long long)(level + 1) << 32) | (unsigned long long)(unsigned)value;
}

extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
tree_level_split(int* __restrict__ lvl, int level, int leaf, const unsigned long long* __restrict__ skeys,
                 int* __restrict__ cstart, int* __restrict__ ccount, int* __restrict__ child,
                 int* __restrict__ nchild, int* __restrict__ edges, int cap, int* __restrict__ overflow,
                 unsigned long long* __restrict__ status, int* __restrict__ tickets) {
    __shared__ int s_count[SPLIT_TILE];   // the tile's child counts, then each cell's first child
    __shared__ int warp_total[SPLIT_THREADS / 32];
    __shared__ int s_tile;
    __shared__ long long s_prefix;
    const int a = lvl[level], b = lvl[level + 1];
    const int tiles = (b - a + SPLIT_TILE - 1) / SPLIT_TILE;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int o = threadIdx.x & (CELL_LANES - 1);
    const unsigned mask = eighth_mask();
    const bool can_split = level < TREE_MAX_LEVEL;
    const int shift = 3 * (TREE_MAX_LEVEL - 1 - level);
    if (tiles == 0) {  // an empty level: the next one is empty too
        if (blockIdx.x == 0 && threadIdx.x == 0) lvl[level + 2] = b;
        return;
    }
    for (;;) {
        if (threadIdx.x == 0) s_tile = atomicAdd(&tickets[level], 1);
        __syncthreads();
        const int t = s_tile;
        if (t >= tiles) break;
        const int tile0 = a + t * SPLIT_TILE;
        // 1. count (the eight lanes of a cell enter and leave each pass together: the shuffles and the
        // ballot name only their own eighth)
        for (int k = threadIdx.x / CELL_LANES; k < SPLIT_TILE; k += SPLIT_CELLS_PER_PASS) {
            const int c = tile0 + k;
            if (c >= b) {
                if (o == 0) s_count[k] = 0;
                continue;
            }
            const int s0 = cstart[c], e = s0 + ccount[c];
            const bool split = e - s0 > leaf && can_split;
            int edge = s0;
            if (split && o > 0) edge = octant_bound(skeys, s0, e, shift, o);
            int next = __shfl_down_sync(mask, edge, 1, CELL_LANES);
            if (o == CELL_LANES - 1) next = e;
            const unsigned nonempty = __ballot_sync(mask, split && next > edge);
            if (o == 0) s_count[k] = __popc(nonempty & mask);
            edges[CELL_LANES * (c - a) + o] = edge;
        }
        __syncthreads();
        // 2. the exclusive prefix of the counts: each thread's SPLIT_ITEMS consecutive cells, then the warps
        int v[SPLIT_ITEMS];
        int sum = 0;
#pragma unroll
        for (int j = 0; j < SPLIT_ITEMS; ++j) {
            v[j] = s_count[SPLIT_ITEMS * threadIdx.x + j];
            sum += v[j];
        }
        int incl = sum;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            const int y = __shfl_up_sync(0xffffffffu, incl, d);
            if (lane >= d) incl += y;
        }
        if (lane == 31) warp_total[warp] = incl;
        __syncthreads();
        if (warp == 0) {  // inclusive scan of the warps' totals (SPLIT_THREADS / 32 of them)
            int w = lane < SPLIT_THREADS / 32 ? warp_total[lane] : 0;
#pragma unroll
            for (int d = 1; d < 32; d <<= 1) {
                const int y = __shfl_up_sync(0xffffffffu, w, d);
                if (lane >= d) w += y;
            }
            if (lane < SPLIT_THREADS / 32) warp_total[lane] = w;
            const long long total = __shfl_sync(0xffffffffu, w, SPLIT_THREADS / 32 - 1);  // the tile's
            if (lane == 0) {  // publish, then look back
                long long prefix = 0;
                if (t == 0) {
                    atomicExch(&status[0], scan_word(SCAN_PREFIX, level, total));
                } else {
                    atomicExch(&status[t], scan_word(SCAN_TOTAL, level, total));
                    for (int j = t - 1;;) {
                        const unsigned long long st = atomicAdd(&status[j], 0ull);
                        if ((int)((st >> 32) & 0x3f) != level + 1) continue;  // not yet published
                        prefix += (long long)(unsigned)(st & 0xffffffffull);
                        if ((st >> 62) == SCAN_PREFIX) break;
                        --j;
                    }
                    atomicExch(&status[t], scan_word(SCAN_PREFIX, level, prefix + total));
                }
                s_prefix = prefix;
                if (t == tiles - 1) {
                    long long end = (long long)b + prefix + total;
                    if (end > cap) {
                        *overflow = 1;
                        end = b;
                    }
                    lvl[level + 2] = (int)end;
                }
            }
        }
        __syncthreads();
        int run = (int)s_prefix + (warp > 0 ? warp_total[warp - 1] : 0) + incl - sum;
#pragma unroll
        for (int j = 0; j < SPLIT_ITEMS; ++j) {  // each cell's first child, counted from b
            const int k = SPLIT_ITEMS * threadIdx.x + j;
            if (tile0 + k < b) nchild[tile0 + k] = v[j];
            s_count[k] = v[j] ? b + run : -1;
            run += v[j];
        }
        __syncthreads();
        // 3. write (edges were written by this block in step 1: visible after the barriers)
        for (int k = threadIdx.x / CELL_LANES; k < SPLIT_TILE; k += SPLIT_CELLS_PER_PASS) {
            const int c = tile0 + k;
            if (c >= b) continue;
            const int first = s_count[k];
            if (o == 0) child[c] = first;
            if (first < 0) continue;  // a leaf: the same for the cell's eight lanes
            const int edge = edges[CELL_LANES * (c - a) + o];
            const int next = o == CELL_LANES - 1 ? cstart[c] + ccount[c] : edges[CELL_LANES * (c - a) + o + 1];
            const unsigned nonempty = __ballot_sync(mask, next > edge);
            const int out = first + __popc(nonempty & mask & ((1u << (threadIdx.x & 31)) - 1u));
            if (next > edge && out < cap) {
                cstart[out] = edge;
                ccount[out] = next - edge;
                child[out] = -1;
            }
        }
        __syncthreads();  // s_tile, s_prefix, s_count and warp_total are rewritten by the next tile
    }
}

// --- groups of targets --------------------------------------------------------------------------------
// mark[s] = 1 where a group starts: every group cell (at most `cap` bodies, or a leaf, with a parent of
// more than `cap`; the root if it qualifies itself) cut into runs of `group` bodies (the CPU's
// group_starts). One thread per cell marks the groups of its qualifying children.
// The number of cells is read at *ncell_at (the level bounds on the device), so that the marks are queued
// with the build before the host has looked at it; the grid covers the cell arrays' capacity.
extern "C" __global__ void tree_group_marks(const int* __restrict__ ncell_at, int cap, int group,
                                            const int* __restrict__ cstart, const int* __restrict__ ccount,
                                            const int* __restrict__ child, const int* __restrict__ nchild,
                                            int* __restrict__ mark) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= *ncell_at) return;
    const bool qualifies = ccount[c] <= cap || nchild[c] == 0;
    if (c == 0 && qualifies) {
        for (int s = cstart[0]; s < cstart[0] + ccount[0]; s += group) mark[s] = 1;
    }
    if (qualifies) return;  // a qualifying cell's children are inside its groups
    for (int k = child[c]; k < child[c] + nchild[c]; ++k) {
        if (ccount[k] <= cap || nchild[k] == 0) {
            for (int s = cstart[k]; s < cstart[k] + ccount[k]; s += group) mark[s] = 1;
        }
    }
}

// The groups' starts from the marks and their inclusive prefix sum `incl` (CuPy's device scan): group g
// starts at gstart[g]; gstart[ngroups] = n closes the last, and *ngroups_at = ngroups, for the host's one
// look after the build and for tree_domain_cuts (no host round trip between the marks and the walk).
extern "C" __global__ void tree_group_starts(const int* __restrict__ mark, const int* __restrict__ incl, int n,
                                             int* __restrict__ gstart, int* __restrict__ ngroups_at) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    if (mark[i]) gstart[incl[i] - 1] = i;
    if (i == n - 1) {
        gstart[incl[i]] = n;
        *ngroups_at = incl[i];
    }
}

// A domain split's cuts moved to group starts (app/decomposition.py align_cuts): for cut j, at = the first
// group g in [0, ngroups] whose start gstart[g] >= cuts[j] (ngroups if none) and aligned = gstart[at];
// out[j] = at, out[count + j] = aligned. One thread per cut.
extern "C" __global__ void tree_domain_cuts(const int* __restrict__ gstart, const int* __restrict__ ngroups_at,
                                            const int* __restrict__ cuts, int count, int* __restrict__ out) {
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= count) return;
    const int ngroups = *ngroups_at;
    int lo = 0, hi = ngroups;  // gstart[ngroups] = n >= every cut
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (gstart[mid] < cuts[j]) lo = mid + 1;
        else hi = mid;
    }
    out[j] = lo;
    out[count + j] = gstart[lo];
}

// --- moments, one level at a time from the deepest -------------------------------------------------------
// The cells of level `level`: mass, centre of mass and the second moment sum m y y^T about it (xx yy zz xy xz
// yz), in float32, exactly as app/backends/cpu_tree_kernels.py `moments` (leaves: two passes over their
// bodies; parents: the parallel-axis theorem over their children). The centre of mass is summed relative to
// a point of the cell (its first body, or its first child's centre of mass), so that its rounding is relative
// to the cell's extent rather than to |x| (the CPU's docstring says more). Also b_max, the bound on the
// distance from the centre of mass to the cell's bodies that the `bmax` opening test reads: sqrt of the
// largest ((dx dx + dy dy) + dz dz) over a leaf's bodies, the largest |com - com_child| + b_max_child over a
// parent's children, float32 in that order as the CPU's.
__device__ void cell_moments(int c, const float4* __restrict__ spos, const int* __restrict__ cstart,
                             const int* __restrict__ ccount, const int* __restrict__ child,
                             const int* __restrict__ nchild, float* __restrict__ mass,
                             float* __restrict__ com, float* __restrict__ m2, float* __restrict__ bmax) {
    float mt = 0.0f, sx = 0.0f, sy = 0.0f, sz = 0.0f, cx, cy, cz, br = 0.0f;
    float q[6] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
    if (nchild[c] == 0) {
        const int s = cstart[c], e = s + ccount[c];
        const float4 p0 = spos[s];
        for (int j = s; j < e; ++j) {
            const float4 p = spos[j];
            mt += p.w;
            sx += p.w * (p.x - p0.x);
            sy += p.w * (p.y - p0.y);
            sz += p.w * (p.z - p0.z);
        }
        if (mt != 0.0f) {
            cx = p0.x + sx / mt;
            cy = p0.y + sy / mt;
            cz = p0.z + sz / mt;
        } else {  // massless: the mean position
            sx = sy = sz = 0.0f;
            for (int j = s; j < e; ++j) {
                const float4 p = spos[j];
                sx += p.x - p0.x;
                sy += p.y - p0.y;
                sz += p.z - p0.z;
            }
            cx = p0.x + sx / (float)(e - s);
            cy = p0.y + sy / (float)(e - s);
            cz = p0.z + sz / (float)(e - s);
        }
        float r2 = 0.0f;
        for (int j = s; j < e; ++j) {
            const float4 p = spos[j];
            const float dx = p.x - cx, dy = p.y - cy, dz = p.z - cz;
            r2 = fmaxf(r2, (dx * dx + dy * dy) + dz * dz);
            q[0] += p.w * dx * dx;
            q[1] += p.w * dy * dy;
            q[2] += p.w * dz * dz;
            q[3] += p.w * dx * dy;
            q[4] += p.w * dx * dz;
            q[5] += p.w * dy * dz;
        }
        br = sqrtf(r2);
    } else {
        const int f = child[c], e = f + nchild[c];
        const float x0 = com[3 * f], y0 = com[3 * f + 1], z0 = com[3 * f + 2];
        for (int k = f; k < e; ++k) {
            mt += mass[k];
            sx += mass[k] * (com[3 * k] - x0);
            sy += mass[k] * (com[3 * k + 1] - y0);
            sz += mass[k] * (com[3 * k + 2] - z0);
        }
        if (mt != 0.0f) {
            cx = x0 + sx / mt;
            cy = y0 + sy / mt;
            cz = z0 + sz / mt;
        } else {  // massless: the children's centres weighted by their body counts
            sx = sy = sz = 0.0f;
            for (int k = f; k < e; ++k) {
                sx += (float)ccount[k] * (com[3 * k] - x0);
                sy += (float)ccount[k] * (com[3 * k + 1] - y0);
                sz += (float)ccount[k] * (com[3 * k + 2] - z0);
            }
            cx = x0 + sx / (float)ccount[c];
            cy = y0 + sy / (float)ccount[c];
            cz = z0 + sz / (float)ccount[c];
        }
        for (int k = f; k < e; ++k) {
            const float dx = com[3 * k] - cx, dy = com[3 * k + 1] - cy, dz = com[3 * k + 2] - cz;
            br = fmaxf(br, sqrtf((dx * dx + dy * dy) + dz * dz) + bmax[k]);
            const float mk = mass[k];
            q[0] += m2[6 * k] + mk * dx * dx;
            q[1] += m2[6 * k + 1] + mk * dy * dy;
            q[2] += m2[6 * k + 2] + mk * dz * dz;
            q[3] += m2[6 * k + 3] + mk * dx * dy;
            q[4] += m2[6 * k + 4] + mk * dx * dz;
            q[5] += m2[6 * k + 5] + mk * dy * dz;
        }
    }
    mass[c] = mt;
    bmax[c] = br;
    com[3 * c] = cx;
    com[3 * c + 1] = cy;
    com[3 * c + 2] = cz;
    for (int k = 0; k < 6; ++k) m2[6 * c + k] = q[k];
}

extern "C" __global__ void tree_moments(const int* __restrict__ lvl, int level, const float4* __restrict__ spos,
                                        const int* __restrict__ cstart, const int* __restrict__ ccount,
                                        const int* __restrict__ child, const int* __restrict__ nchild,
                                        float* __restrict__ mass, float* __restrict__ com,
                                        float* __restrict__ m2, float* __restrict__ bmax) {
    FOR_LEVEL_CELLS(c, lvl, level) {
        cell_moments(c, spos, cstart, ccount, child, nchild, mass, com, m2, bmax);
    }
}

// --- a cell's cube ----------------------------------------------------------------------------------------
// centre (x, y, z) relative to the key cube's corner and side w, float64 (CUDA 13 deprecates double4)
struct __align__(16) TreeCube {
    double x, y, z, w;
};

// The build's cube of cell c at level lv: its centre relative to the key cube's corner (box[0..2]) and its
// side, in float64, from the key prefix of its first body (app/backends/cpu_tree_kernels.py cell_cubes).
__device__ __forceinline__ TreeCube build_cube(int c, int lv, const unsigned long long* __restrict__ skeys,
                                              const int* __restrict__ cstart, const double* __restrict__ box) {
    const unsigned long long prefix = skeys[cstart[c]] >> (3 * (TREE_MAX_LEVEL - lv));
    unsigned long long ix = 0, iy = 0, iz = 0;
    for (int b = 0; b < lv; ++b) {
        ix |= ((prefix >> (3 * b + 2)) & 1ull) << b;
        iy |= ((prefix >> (3 * b + 1)) & 1ull) << b;
        iz |= ((prefix >> (3 * b)) & 1ull) << b;
    }
    // the side, size / 2^lv: exact, as a product with 2^-lv made from its exponent bits (no float64 division)
    const double w = box[3] * __longlong_as_double((long long)(1023 - lv) << 52);
    return TreeCube{((double)ix + 0.5) * w, ((double)iy + 0.5) * w, ((double)iz + 0.5) * w, w};
}

// --- the refit between rebuilds (rebuild_every > 1; docs/tree.md, "Refit") --------------------------------
// The cube tolerance: a body at most this fraction of the key cube outside its cell's cube counts as inside
// (cpu_tree_kernels.py REFIT_TOL, 2^-46).
#define TREE_REFIT_TOL 1.4210854715202004e-14

// One level of a refit, from the deepest: the cells keep the build's topology (body ranges, children) and
// get the moments of their current bodies (cell_moments, as after a build) and an opening cube grown from
// the build's to hold those bodies, as the CPU twin's refit_cubes computes it operation by operation: the
// bodies' float32 bounding box bottom up (a leaf over its bodies, a parent over its children's boxes), in
// float64 relative to lo against the build cube's faces with the tolerance, and for a cell with a body
// outside, the union of cube and box: centre (lo + hi) / 2, side its largest extent + 2 tol. Always from the
// build's cube, so a refit depends on the build and the current positions only. `lo3` / `hi3`: 3 floats per
// cell; `cubes`: the cubes tree_pack reads; `grown`: cells grown, summed over the refit.
extern "C" __global__ void tree_refit(const int* __restrict__ lvl, int level, const float4* __restrict__ spos,
                                      const int* __restrict__ cstart, const int* __restrict__ ccount,
                                      const int* __restrict__ child, const int* __restrict__ nchild,
                                      const unsigned long long* __restrict__ skeys, const double* __restrict__ box,
                                      float* __restrict__ mass, float* __restrict__ com, float* __restrict__ m2,
                                      float* __restrict__ bmax, float* __restrict__ lo3, float* __restrict__ hi3,
                                      TreeCube* __restrict__ cubes, int* __restrict__ grown) {
    FOR_LEVEL_CELLS(c, lvl, level) {
        cell_moments(c, spos, cstart, ccount, child, nchild, mass, com, m2, bmax);
        const TreeCube cube = build_cube(c, level, skeys, cstart, box);
        cubes[c] = cube;
        if (ccount[c] == 0) continue;
        float lo[3], hi[3];
        if (nchild[c] == 0) {
            const int s = cstart[c], e = s + ccount[c];
            const float4 p0 = spos[s];
            lo[0] = hi[0] = p0.x;
            lo[1] = hi[1] = p0.y;
            lo[2] = hi[2] = p0.z;
            for (int j = s + 1; j < e; ++j) {
                const float4 p = spos[j];
                lo[0] = fminf(lo[0], p.x);
                hi[0] = fmaxf(hi[0], p.x);
                lo[1] = fminf(lo[1], p.y);
                hi[1] = fmaxf(hi[1], p.y);
                lo[2] = fminf(lo[2], p.z);
                hi[2] = fmaxf(hi[2], p.z);
            }
        } else {
            const int f = child[c], e = f + nchild[c];
            for (int a = 0; a < 3; ++a) {
                lo[a] = lo3[3 * f + a];
                hi[a] = hi3[3 * f + a];
            }
            for (int k = f + 1; k < e; ++k) {
                for (int a = 0; a < 3; ++a) {
                    lo[a] = fminf(lo[a], lo3[3 * k + a]);
                    hi[a] = fmaxf(hi[a], hi3[3 * k + a]);
                }
            }
        }
        for (int a = 0; a < 3; ++a) {
            lo3[3 * c + a] = lo[a];
            hi3[3 * c + a] = hi[a];
        }
        const double off[3] = {cube.x, cube.y, cube.z};
        const double half = cube.w * 0.5;
        const double tol = box[3] * TREE_REFIT_TOL;
        bool out = false;
        for (int a = 0; a < 3; ++a) {
            if ((double)lo[a] - box[a] < off[a] - half - tol) out = true;
            if ((double)hi[a] - box[a] > off[a] + half + tol) out = true;
        }
        if (out) {
            atomicAdd(grown, 1);
            double w = 0.0, centre[3];
            for (int a = 0; a < 3; ++a) {
                const double blo = fmin(off[a] - half, (double)lo[a] - box[a]);
                const double bhi = fmax(off[a] + half, (double)hi[a] - box[a]);
                w = fmax(w, bhi - blo);
                centre[a] = (blo + bhi) * 0.5;
            }
            cubes[c] = TreeCube{centre[0], centre[1], centre[2], w + 2.0 * tol};
        }
    }
}

// --- what the walk reads ----------------------------------------------------------------------------------
// r_open is multiplied by this before it is squared (1 + 2^-19, exact in float32): 32 float32 units, far more
// than the roundings of r_open and of the walk's d_box^2 add up to, so that the float32 test never accepts a
// cell that exact arithmetic on the same centre of mass would open (app/backends/cpu_tree_kernels.py
// MAC_SLACK and opening_rows say more).
#define TREE_MAC_SLACK 1.0000019073486328125f

// IEEE float32 multiply, rounded to nearest and keeping denormals as numpy does (--use_fast_math would
// flush them): the relative test's rows of a tiny cell stay the twin's.
__device__ __forceinline__ float pack_mul(float a, float b) {
    float r;
    asm("mul.rn.f32 %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));
    return r;
}

// Per cell: mac = [com, r_open^2 x slack^2] for the walk's float32 opening test, r_open = side / theta +
// |com - centre| (opening 0, "cube"; also opening 2, "rel", for the groups that have no last acceleration)
// or b_max / theta (opening 1, "bmax"; cell_moments' bound), and three float4 rows [com, M], [Qxx Qyy Qzz Qxy],
// [Qxz Qyz, trace_factor * T, 0] for the interaction
// (Q = 3 M2 - T I, T = trace M2: the CPU's pack_cells), all float32 as the CPU's opening_rows and pack_cells
// compute them. The centre and side come from `cubes` after a refit, else from the level (found from the
// level ranges) and the key prefix of the cell's first body. And links = [start, count, first child,
// children]: one 16-byte load where the walk, after the opening test, read four arrays (a chain of dependent
// loads per tested cell). With opening 2 also rel = [M b_max^3, (b_max x slack)^2], the relative test's rows
// (walk.cu accepted_relative; the CPU's relative_rows).
extern "C" __global__ void tree_pack(int ncell, const int* __restrict__ level_start, int nlevels,
                                     const unsigned long long* __restrict__ skeys,
                                     const int* __restrict__ cstart, const int* __restrict__ ccount,
                                     const int* __restrict__ child, const int* __restrict__ nchild,
                                     const double* __restrict__ box,
                                     const float* __restrict__ mass, const float* __restrict__ com,
                                     const float* __restrict__ m2, const float* __restrict__ bmax,
                                     const TreeCube* __restrict__ cubes, float theta, int opening,
                                     float trace_factor, float4* __restrict__ mac, float2* __restrict__ rel,
                                     float4* __restrict__ pack, int4* __restrict__ links) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ncell) return;
    links[c] = make_int4(cstart[c], ccount[c], child[c], nchild[c]);
    const float X = com[3 * c], Y = com[3 * c + 1], Z = com[3 * c + 2];
    float r;
    if (opening == 2) {
        const float b = bmax[c];
        const float guard = pack_mul(b, TREE_MAC_SLACK);
        rel[c] = make_float2(pack_mul(pack_mul(pack_mul(b, b), b), mass[c]), pack_mul(guard, guard));
    }
    if (opening == 1) {
        r = (bmax[c] / theta) * TREE_MAC_SLACK;
    } else {
        TreeCube cube;
        if (cubes != nullptr) {  // a refit's (tree_refit)
            cube = cubes[c];
        } else {  // the build's, from the key prefix at the cell's level
            int lv = 0;
            while (lv + 1 < nlevels && level_start[lv + 1] <= c) ++lv;
            cube = build_cube(c, lv, skeys, cstart, box);
        }
        // the centre of mass' offset from the centre, (com - lo) - centre, in float64 (the header says why),
        // then float32
        const float ex = (float)(((double)X - box[0]) - cube.x);
        const float ey = (float)(((double)Y - box[1]) - cube.y);
        const float ez = (float)(((double)Z - box[2]) - cube.z);
        const float delta = sqrtf((ex * ex + ey * ey) + ez * ez);
        r = ((float)cube.w / theta + delta) * TREE_MAC_SLACK;
    }
    mac[c] = make_float4(X, Y, Z, r * r);
    const float* s = m2 + 6 * c;
    const float tr = (s[0] + s[1]) + s[2];
    pack[3 * c] = make_float4(X, Y, Z, mass[c]);
    pack[3 * c + 1] = make_float4(3.0f * s[0] - tr, 3.0f * s[1] - tr, 3.0f * s[2] - tr, 3.0f * s[3]);
    pack[3 * c + 2] = make_float4(3.0f * s[4], 3.0f * s[5], tr * trace_factor, 0.0f);
}
