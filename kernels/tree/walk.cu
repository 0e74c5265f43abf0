// The GPU tree's walk (`tree` record; docs/tree.md): one warp per group of 32 x TPL targets consecutive
// in key order, in the Bonsai / Ryoanji style (a design followed, code written from the papers):
//
//   - groups are runs of at most 32 x TPL bodies inside one group cell (build.cu tree_group_marks), so a
//     group's box stays inside a tree cell; the box is the tight box of its members (warp min / max);
//   - the warp walks the octree from the root with a stack of cell indices in global memory: each pass
//     pops up to 32 cells, one per lane, and tests them against the box in float32 (the CPU twin's test,
//     bitwise: app/backends/cpu_tree_kernels.py box_accepts, or relative_accepts under opening "rel",
//     whose per-group threshold the first pass over the members takes from their last accelerations);
//     an accepted cell joins the cell list, an opened leaf's bodies join the body list, an opened inner
//     cell pushes its children;
//   - both lists are compacted into shared memory with ballots / warp prefix sums and evaluated 32 entries
//     at a time: each lane stages one entry in shared memory, then every lane sums all 32 for its TPL
//     targets (LDS broadcasts; the group's TPL targets per lane share each load), or for its first slot only
//     where the group has at most 32 members (in_slots);
//   - the result goes to the target's original row (the state never moves: the tree's copies are sorted).
//
// Persistent warps take groups from an atomic counter, so the stacks exist once per resident warp.
// Launch: (grid, 1) x (32 * TREE_WARPS) threads, the host sizes `grid` to fill the GPU.

#include "common.cuh"

#define TREE_WARPS 4      // warps per block
// Groups of 64 (the default): the registers capped for 7 blocks an SM (72 a thread; uncapped the walk takes
// 75 and 6 blocks fit): 2-3% faster on an H100, 64 registers (8 blocks) 0.5-2.6% slower
// (bench/results/h100-2026-11-27-walk-slots.txt)
#define TREE_G64_BLOCKS 7
#define TREE_CELLBUF 64   // accepted cells waiting (a pass adds <= 32 to < 32)
#define TREE_BODYBUF 64   // opened bodies waiting (filled 32 at a time)

namespace tree {

__device__ __forceinline__ int warp_exclusive_sum(int v, int lane, int* total) {
    int x = v;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    *total = __shfl_sync(0xffffffffu, x, 31);
    return x - v;
}

// a += the monopole + quadrupole of a cell (docs/tree.md, step 6): p0 = [com, M], p1 = [Qxx Qyy Qzz Qxy],
// p2 = [Qxz Qyz, T', 0] with T' = eps^2 T for gravity (G applied at the end) and T for repulsion.
template <class Model>
__device__ __forceinline__ float3 body_cell(float3 a, const float4 bi, const float4 p0, const float4 p1,
                                            const float4 p2, const float eps2, const float G, const float H) {
    const float dx = p0.x - bi.x, dy = p0.y - bi.y, dz = p0.z - bi.z;
    if (Model::repulsion) {
        const float r2 = fmaf(dz, dz, fmaf(dy, dy, dx * dx));
        const float inv = rsqrtf(r2 + eps2);  // an accepted cell is never at d = 0
        const float inv2 = inv * inv;
        const float inv3 = inv * inv2;
        const float inv5 = inv3 * inv2;
        const float inv7 = inv5 * inv2;
        const float qdx = fmaf(p1.x, dx, fmaf(p1.w, dy, p2.x * dz));
        const float qdy = fmaf(p1.w, dx, fmaf(p1.y, dy, p2.y * dz));
        const float qdz = fmaf(p2.x, dx, fmaf(p2.y, dy, p1.z * dz));
        const float dqd = fmaf(dx, qdx, fmaf(dy, qdy, dz * qdz));
        const float d1 = G * inv3 - H * inv5;
        const float d2 = -3.0f * G * inv5 + 5.0f * H * inv7;
        const float d3 = 15.0f * G * inv7 - 35.0f * H * inv7 * inv2;
        const float tr = p2.z;
        const float third = 1.0f / 3.0f;
        const float radial = p0.w * d1 + d2 * tr * third + 0.5f * (d2 * tr + d3 * third * (dqd + tr * r2));
        const float tang = d2 * third;
        a.x = fmaf(radial, dx, fmaf(tang, qdx, a.x));
        a.y = fmaf(radial, dy, fmaf(tang, qdy, a.y));
        a.z = fmaf(radial, dz, fmaf(tang, qdz, a.z));
        return a;
    }
    // Gravity, the hot path, in the form with the fewest instructions: 30 FP32 and the rsqrt (SASS, sm_90), where
    // the textbook order G [(M/s^3 + 5/2 (dQd - eps^2 T)/s^7) d - Q d/s^5] took 33. With 1/s^5 taken out,
    //     a += (1/s^5) [(M s^2 + 5/2 (dQd - eps^2 T)/s^2) d - Q d],
    // and the chains start from the constants they add (eps^2, -eps^2 T): an FFMA where an FMUL and an FADD
    // were. s^-5 is the highest power formed (s^-7 was), so it overflows later for tiny s.
    // (bench/results/h100-2026-11-27-walk-slots.txt: the 8M walk 8% faster from this, 12% with in_slots.)
    const float s2 = fmaf(dz, dz, fmaf(dy, dy, fmaf(dx, dx, eps2)));
    const float inv = rsqrtf(s2);  // an accepted cell is never at d = 0
    const float inv2 = inv * inv;
    const float inv5 = inv2 * inv2 * inv;
    const float qdx = fmaf(p1.x, dx, fmaf(p1.w, dy, p2.x * dz));
    const float qdy = fmaf(p1.w, dx, fmaf(p1.y, dy, p2.y * dz));
    const float qdz = fmaf(p2.x, dx, fmaf(p2.y, dy, p1.z * dz));
    const float dqd_t = fmaf(dx, qdx, fmaf(dy, qdy, fmaf(dz, qdz, -p2.z)));  // d.Q.d - eps^2 T
    const float radial = fmaf(2.5f * inv2, dqd_t, p0.w * s2);
    a.x = fmaf(inv5, fmaf(radial, dx, -qdx), a.x);
    a.y = fmaf(inv5, fmaf(radial, dy, -qdy), a.y);
    a.z = fmaf(inv5, fmaf(radial, dz, -qdz), a.z);
    return a;
}

// IEEE binary32 operations, rounded to nearest, as numpy's: the .rn forbids contraction into an FMA, and
// no .ftz keeps denormals. __fadd_rn & co. would not do: they follow --use_fast_math's -ftz=true, flushing
// denormals that numpy keeps, and a flushed square or a flushed comparison could flip a decision the twin
// makes (a group box within 1e-19 of a centre of mass, or r_open^2 below 1.2e-38 on a tiny cloud).
#define TREE_IEEE_OP(name, instruction)                                   \
    __device__ __forceinline__ float name(float a, float b) {             \
        float r;                                                          \
        asm(instruction " %0, %1, %2;" : "=f"(r) : "f"(a), "f"(b));       \
        return r;                                                         \
    }
TREE_IEEE_OP(ieee_sub, "sub.rn.f32")
TREE_IEEE_OP(ieee_add, "add.rn.f32")
TREE_IEEE_OP(ieee_mul, "mul.rn.f32")
TREE_IEEE_OP(ieee_min, "min.f32")
TREE_IEEE_OP(ieee_max, "max.f32")
__device__ __forceinline__ float ieee_sqrt(float a) {
    float r;
    asm("sqrt.rn.f32 %0, %1;" : "=f"(r) : "f"(a));
    return r;
}
__device__ __forceinline__ bool ieee_greater(float a, float b) {
    unsigned r;
    asm("{\n\t.reg .pred p;\n\tsetp.gt.f32 p, %1, %2;\n\tselp.u32 %0, 1, 0, p;\n\t}" : "=r"(r) : "f"(a), "f"(b));
    return r != 0;
}

// The opening test, bitwise the CPU twin's box_accepts: d_box(com)^2 > r_open^2 in float32, m = [com,
// r_open^2] (build.cu tree_pack rounds r_open outwards, so that the float32 test accepts only cells that exact
// arithmetic accepts). An accepted cell's centre of mass lies strictly outside the box (a positive d_box^2
// needs a positive difference on some axis): no target of the group sits on it.
__device__ __forceinline__ bool accepted(const float4 m, const float lo[3], const float hi[3]) {
    const float dx = ieee_max(ieee_max(ieee_sub(lo[0], m.x), 0.0f), ieee_sub(m.x, hi[0]));
    const float dy = ieee_max(ieee_max(ieee_sub(lo[1], m.y), 0.0f), ieee_sub(m.y, hi[1]));
    const float dz = ieee_max(ieee_max(ieee_sub(lo[2], m.z), 0.0f), ieee_sub(m.z, hi[2]));
    return ieee_greater(ieee_add(ieee_add(ieee_mul(dx, dx), ieee_mul(dy, dy)), ieee_mul(dz, dz)), m.w);
}

// The relative test (opening "rel"), bitwise the twin's relative_accepts: d_box^2 > guard^2 and
// (d^2 d^2) sqrt(d^2) tg >= M b_max^3, r = [M b_max^3, guard^2] (build.cu tree_pack), tg the group's
// threshold (group_threshold). GADGET-2's criterion with the quadrupole's error term: G M b^3 / d^5 <= alpha
// |a|min; the guard keeps every cell whose bodies may reach the box open.
__device__ __forceinline__ bool accepted_relative(const float4 m, const float2 r, const float lo[3],
                                                  const float hi[3], const float tg) {
    const float dx = ieee_max(ieee_max(ieee_sub(lo[0], m.x), 0.0f), ieee_sub(m.x, hi[0]));
    const float dy = ieee_max(ieee_max(ieee_sub(lo[1], m.y), 0.0f), ieee_sub(m.y, hi[1]));
    const float dz = ieee_max(ieee_max(ieee_sub(lo[2], m.z), 0.0f), ieee_sub(m.z, hi[2]));
    const float d2 = ieee_add(ieee_add(ieee_mul(dx, dx), ieee_mul(dy, dy)), ieee_mul(dz, dz));
    if (!ieee_greater(d2, r.y)) return false;
    return !ieee_greater(r.x, ieee_mul(ieee_mul(ieee_mul(d2, d2), ieee_sqrt(d2)), tg));
}

// |a| of one last acceleration, sqrt((x x + y y) + z z) in IEEE float32 (the twin's group_threshold).
__device__ __forceinline__ float acceleration_norm(const float4 a) {
    return ieee_sqrt(ieee_add(ieee_add(ieee_mul(a.x, a.x), ieee_mul(a.y, a.y)), ieee_mul(a.z, a.z)));
}

struct WarpShared {
    int cells[TREE_CELLBUF];
    int bodies[TREE_BODYBUF];
    float4 body[32];
    float4 cell[3 * 32];
};

template <class Model, bool SOFT, int TPL>
__device__ __forceinline__ void flush_bodies(WarpShared& sh, const float4* __restrict__ spos, int from, int count,
                                             int lane, const float4 (&bi)[TPL], float3 (&ai)[TPL],
                                             float eps2, float G, float H) {
    if (lane < count) sh.body[lane] = spos[sh.bodies[from + lane]];
    __syncwarp();
    for (int j = 0; j < count; ++j) {
        const float4 bj = sh.body[j];
#pragma unroll
        for (int t = 0; t < TPL; ++t) ai[t] = nbody::body_body_interaction<Model, SOFT>(ai[t], bi[t], bj, eps2, G, H);
    }
    __syncwarp();
}

template <class Model, int TPL>
__device__ __forceinline__ void flush_cells(WarpShared& sh, const float4* __restrict__ pack, int from, int count,
                                            int lane, const float4 (&bi)[TPL], float3 (&ai)[TPL],
                                            float eps2, float G, float H) {
    if (lane < count) {
        const int c = sh.cells[from + lane];
        sh.cell[3 * lane] = pack[3 * c];
        sh.cell[3 * lane + 1] = pack[3 * c + 1];
        sh.cell[3 * lane + 2] = pack[3 * c + 2];
    }
    __syncwarp();
    for (int j = 0; j < count; ++j) {
        const float4 p0 = sh.cell[3 * j], p1 = sh.cell[3 * j + 1], p2 = sh.cell[3 * j + 2];
#pragma unroll
        for (int t = 0; t < TPL; ++t) ai[t] = body_cell<Model>(ai[t], bi[t], p0, p1, p2, eps2, G, H);
    }
    __syncwarp();
}

// A group of at most 32 x K members (K < TPL) leaves the last TPL - K slots of every lane empty: its lists
// are evaluated for the first K only, which halves the evaluation of a group of <= 32 in a warp of two
// targets a lane (a fifth of the groups at 1M, groups of 64). Each target's sum is the same sequence of the
// same operations either way, so its acceleration is bitwise the one the full evaluation gives.
template <int K, class T, int N>
__device__ __forceinline__ T (&first_slots(T (&a)[N]))[K] {
    static_assert(K <= N, "a lane holds at most N slots");
    return *reinterpret_cast<T(*)[K]>(&a);
}

// flush(bi', ai') with the first `slots` of a lane's TPL slots (1, 2 or TPL): flush_cells or flush_bodies
// for the slots the group fills.
template <int TPL, class Flush>
__device__ __forceinline__ void in_slots(int slots, const float4 (&bi)[TPL], float3 (&ai)[TPL], Flush&& flush) {
    if constexpr (TPL > 1) {
        if (slots == 1) return flush(first_slots<1>(bi), first_slots<1>(ai));
    }
    if constexpr (TPL > 2) {
        if (slots == 2) return flush(first_slots<2>(bi), first_slots<2>(ai));
    }
    flush(bi, ai);
}

// spos/sorder: the sources in key order and their indices (relative to the sources' start); group g is
// the sorted bodies [gstart[g], gstart[g + 1]); the walk takes the groups [g_lo, ngroups). A member
// whose index lies in [t_lo, t_hi) (and, with an active_mask, whose mask byte is set: block steps' active
// rows) is a target and writes acc[index - t_lo]; with sorted_out every member
// is a target and writes acc[k], k its place in key order (a domain of a multi-device split: its bodies'
// accelerations in key order, app/decomposition.py). Per group: nbody, ncell
// (list lengths) and nactive (targets written); totals[0] += nactive (nbody + ncell), totals[1] +=
// nactive ncell. flags[0]: the group counter (zeroed by the host), flags[1]: set on a stack overflow.
template <class Model, bool SOFT, int TPL>
__device__ __forceinline__ void walk(const float4* __restrict__ spos, const int* __restrict__ sorder,
                                     const int* __restrict__ gstart,
                                     int t_lo, int t_hi, const int4* __restrict__ links,
                                     const float4* __restrict__ mac,
                                     const float4* __restrict__ pack, float4* __restrict__ acc, float eps2,
                                     float G, float H, int ngroups, int* __restrict__ stacks, int stack_cap,
                                     int* __restrict__ flags, int* __restrict__ nbody_out,
                                     int* __restrict__ ncell_out, int* __restrict__ nactive_out,
                                     unsigned long long* __restrict__ totals, int g_lo, int sorted_out,
                                     const float2* __restrict__ rel, const float4* prev,  // prev may be acc
                                     int prev_by_order, float rel_scale,
                                     const unsigned char* __restrict__ active_mask) {
    __shared__ WarpShared shared[TREE_WARPS];
    const int lane = threadIdx.x & 31;
    const int wib = threadIdx.x >> 5;
    WarpShared& sh = shared[wib];
    int* stack = stacks + (size_t)(blockIdx.x * TREE_WARPS + wib) * stack_cap;
    const unsigned lt_mask = (1u << lane) - 1u;

    for (;;) {
        int g = 0;
        if (lane == 0) g = g_lo + atomicAdd(&flags[0], 1);
        g = __shfl_sync(0xffffffffu, g, 0);
        if (g >= ngroups) return;

        // the members: sorted bodies gstart[g] + t * 32 + lane below gstart[g + 1]
        const int base = gstart[g], end = gstart[g + 1];
        const int need = (end - base + 31) >> 5;          // the slots a lane fills: 1 .. TPL
        const int slots = need <= 2 ? max(need, 1) : TPL;  // evaluated: 1, 2 or TPL (in_slots)
        float4 bi[TPL];
        int row[TPL];
        int active = 0;
        float amin = __int_as_float(0x7f800000);  // the relative test: the members' smallest last |a|
        float lo3[3], hi3[3];
        lo3[0] = lo3[1] = lo3[2] = __int_as_float(0x7f800000);
        hi3[0] = hi3[1] = hi3[2] = __int_as_float(0xff800000);
#pragma unroll
        for (int t = 0; t < TPL; ++t) {
            const int k = base + t * 32 + lane;
            row[t] = -1;
            bi[t] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (k < end) {
                bi[t] = spos[k];
                const int idx = sorder[k];
                if (sorted_out) {
                    row[t] = k;
                    ++active;
                } else if (idx >= t_lo && idx < t_hi && (active_mask == nullptr || active_mask[idx])) {
                    row[t] = idx - t_lo;  // (block steps: only the masked rows; the others shape the box)
                    ++active;
                }
                if (rel_scale > 0.0f) {  // every member (a span's non-target too); min.f32 skips a NaN, as
                    amin = ieee_min(amin, acceleration_norm(prev[prev_by_order ? idx : k]));  // the twin
                }
                lo3[0] = ieee_min(lo3[0], bi[t].x);  // the box of the members' own coordinates (fminf
                lo3[1] = ieee_min(lo3[1], bi[t].y);  // would flush a denormal one: the twin keeps it)
                lo3[2] = ieee_min(lo3[2], bi[t].z);
                hi3[0] = ieee_max(hi3[0], bi[t].x);
                hi3[1] = ieee_max(hi3[1], bi[t].y);
                hi3[2] = ieee_max(hi3[2], bi[t].z);
            }
        }
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) {
            active += __shfl_xor_sync(0xffffffffu, active, d);
#pragma unroll
            for (int k = 0; k < 3; ++k) {
                lo3[k] = ieee_min(lo3[k], __shfl_xor_sync(0xffffffffu, lo3[k], d));
                hi3[k] = ieee_max(hi3[k], __shfl_xor_sync(0xffffffffu, hi3[k], d));
            }
            amin = ieee_min(amin, __shfl_xor_sync(0xffffffffu, amin, d));
        }
        // the group's relative threshold, or 0: the geometric rows (no target, or no usable |a| yet)
        float tg = ieee_mul(rel_scale, amin);
        if (!(rel_scale > 0.0f && tg > 0.0f && tg < __int_as_float(0x7f800000))) tg = 0.0f;
        if (active == 0) {
            if (lane == 0) {
                nbody_out[g] = 0;
                ncell_out[g] = 0;
                nactive_out[g] = 0;
            }
            continue;
        }

        float3 ai[TPL];
#pragma unroll
        for (int t = 0; t < TPL; ++t) ai[t] = make_float3(0.0f, 0.0f, 0.0f);
        int sp = (links[0].y > 0) ? 1 : 0;
        if (lane == 0) stack[0] = 0;
        __syncwarp();
        int ncells = 0, nbodies = 0;  // list lengths (the counts)
        int cfill = 0, bfill = 0;     // entries waiting in the shared buffers
        bool overflow = false;

        while (sp > 0) {
            const int npop = min(32, sp);
            sp -= npop;
            const int c = (lane < npop) ? stack[sp + lane] : -1;
            __syncwarp();
            bool take = false;
            int push = 0, first = 0, leaf_n = 0, leaf_s = 0;
            if (c >= 0) {
                const int4 link = links[c];  // [start, count, first child, children], loaded beside mac
                if (tg > 0.0f ? accepted_relative(mac[c], rel[c], lo3, hi3, tg) : accepted(mac[c], lo3, hi3)) {
                    take = true;
                } else if (link.w == 0) {
                    leaf_s = link.x;
                    leaf_n = link.y;
                } else {
                    first = link.z;
                    push = link.w;
                }
            }
            // opened inner cells: children onto the stack
            int pushed;
            const int at = warp_exclusive_sum(push, lane, &pushed);
            if (sp + pushed > stack_cap) {
                overflow = true;
                break;
            }
            for (int k = 0; k < push; ++k) stack[sp + at + k] = first + k;
            sp += pushed;
            __syncwarp();
            // accepted cells: into the cell buffer, evaluated 32 at a time
            const unsigned took = __ballot_sync(0xffffffffu, take);
            if (take) sh.cells[cfill + __popc(took & lt_mask)] = c;
            cfill += __popc(took);
            ncells += __popc(took);
            __syncwarp();
            if (cfill >= 32) {
                in_slots(slots, bi, ai, [&](const auto& b, auto& a) {
                    flush_cells<Model>(sh, pack, cfill - 32, 32, lane, b, a, eps2, G, H);
                });
                cfill -= 32;
            }
            // opened leaves: their bodies into the body buffer, evaluated 32 at a time
            int total;
            const int off = warp_exclusive_sum(leaf_n, lane, &total);
            nbodies += total;
            for (int done = 0; done < total;) {
                const int takeb = min(TREE_BODYBUF - bfill, total - done);
                const int b0 = max(off, done), b1 = min(off + leaf_n, done + takeb);
                for (int q = b0; q < b1; ++q) sh.bodies[bfill + q - done] = leaf_s + (q - off);
                bfill += takeb;
                done += takeb;
                __syncwarp();
                while (bfill >= 32) {
                    in_slots(slots, bi, ai, [&](const auto& b, auto& a) {
                        flush_bodies<Model, SOFT>(sh, spos, bfill - 32, 32, lane, b, a, eps2, G, H);
                    });
                    bfill -= 32;
                }
            }
        }
        if (cfill > 0) {
            in_slots(slots, bi, ai, [&](const auto& b, auto& a) {
                flush_cells<Model>(sh, pack, 0, cfill, lane, b, a, eps2, G, H);
            });
        }
        if (bfill > 0) {
            in_slots(slots, bi, ai, [&](const auto& b, auto& a) {
                flush_bodies<Model, SOFT>(sh, spos, 0, bfill, lane, b, a, eps2, G, H);
            });
        }
#pragma unroll
        for (int t = 0; t < TPL; ++t) {
            if (row[t] >= 0) acc[row[t]] = nbody::finish_acceleration<Model>(ai[t], G);
        }
        if (lane == 0) {
            if (overflow) atomicExch(&flags[1], 1);
            nbody_out[g] = nbodies;
            ncell_out[g] = ncells;
            nactive_out[g] = active;
            atomicAdd(&totals[0], (unsigned long long)active * (unsigned long long)(nbodies + ncells));
            atomicAdd(&totals[1], (unsigned long long)active * (unsigned long long)ncells);
        }
    }
}

template <class Model, bool SOFT, class... A>
__device__ __forceinline__ void walk_one_per_lane(A... a) { walk<Model, SOFT, 1>(a...); }
template <class Model, bool SOFT, class... A>
__device__ __forceinline__ void walk_two_per_lane(A... a) { walk<Model, SOFT, 2>(a...); }
template <class Model, bool SOFT, class... A>
__device__ __forceinline__ void walk_four_per_lane(A... a) { walk<Model, SOFT, 4>(a...); }

}  // namespace tree

#define TREE_WALK_PARAMS                                                                                    \
    (const float4* spos, const int* sorder, const int* gstart, int t_lo, int t_hi, const int4* links,              \
     const float4* mac, const float4* pack, float4* acc, float eps2,                                            \
     float G, float H, int ngroups, int* stacks, int stack_cap, int* flags, int* nbody_out, int* ncell_out,  \
     int* nactive_out, unsigned long long* totals, int g_lo, int sorted_out, const float2* rel,             \
     const float4* prev, int prev_by_order, float rel_scale, const unsigned char* active_mask)
#define TREE_WALK_ARGS                                                                                      \
    (spos, sorder, gstart, t_lo, t_hi, links, mac, pack, acc, eps2, G, H, ngroups,                              \
     stacks, stack_cap, flags, nbody_out, ncell_out, nactive_out, totals, g_lo, sorted_out, rel, prev,      \
     prev_by_order, rel_scale, active_mask)

// tree_walk_g32_<model>_<self> (groups of 32: one target per lane), tree_walk_g64_... (two per lane),
// tree_walk_g128_... (four per lane: each entry staged in shared memory serves four targets per lane)
NBODY_ENTRIES(tree_walk_g32, tree::walk_one_per_lane, __launch_bounds__(32 * TREE_WARPS), TREE_WALK_PARAMS,
              TREE_WALK_ARGS)
NBODY_ENTRIES(tree_walk_g64, tree::walk_two_per_lane, __launch_bounds__(32 * TREE_WARPS, TREE_G64_BLOCKS),
              TREE_WALK_PARAMS, TREE_WALK_ARGS)
NBODY_ENTRIES(tree_walk_g128, tree::walk_four_per_lane, __launch_bounds__(32 * TREE_WARPS), TREE_WALK_PARAMS,
              TREE_WALK_ARGS)
