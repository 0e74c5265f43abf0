"""The GPU tree's kernels as its host code sees them (kernels/tree/build.cu, kernels/tree/walk.cu): their
sources and compile options, the entries with their argument types, the launch geometry, and the layout
of the buffers that the host and the kernels share. A value named after a macro of a kernel must match
it; tests/test_kernels_compile.py checks the entries' argument types against the compiled PTX."""

from __future__ import annotations

BUILD_SOURCE = "tree/build.cu"
WALK_SOURCE = "tree/walk.cu"
# The build is compiled without FMA contraction and without fast math (IEEE division, square root and
# denormals): its expressions are evaluated as the CPU twin writes them, so that the cube, keys, moments
# and opening rows are bitwise the CPU's (kernels/tree/build.cu says which are float64 and why).
BUILD_OPTIONS = ("-O3", "-std=c++17", "-lineinfo", "-fmad=false")
WALK_WARPS = 4  # kernels/tree/walk.cu TREE_WARPS
WALK_BLOCKS_PER_SM = 8
STACK_CAP = 2048  # cells per warp's stack; doubled and the walk re-run if a group overflows it

BLOCK = 256
BOUNDS_BLOCKS = 264

BUILD_KERNELS = {  # symbol -> pycuda argument types
    "tree_bounds_partial": "PiP",
    "tree_bounds_finish": "PiP",
    "tree_keys": "PiPP",
    "tree_gather": "PPPiPPP",
    "tree_level_split": "PiiPPPPPPiPPP",
    "tree_moments": "PiPPPPPPPPP",
    "tree_refit": "Pi" + "P" * 15,
    "tree_pack": "iPiPPPPPPPPPPPfifPPPP",
    "tree_group_marks": "PiiPPPPP",
    "tree_group_starts": "PPiPP",
    "tree_domain_cuts": "PPPiP",
}
MAX_LEVEL = 21  # kernels/tree/build.cu TREE_MAX_LEVEL: 63-bit keys, 21 levels below the root
LEVEL_SLOTS = MAX_LEVEL + 3  # lvl[L] for L = 0 .. 23 (level 21's cells end at lvl[22]; lvl[23] closes it)
NGROUPS_SLOT = 2 * LEVEL_SLOTS + 1  # in "levels", after the overflow flag and the scan's tickets (_build)
CUTS_SLOT = NGROUPS_SLOT + 1
LEVEL_BLOCKS_PER_SM = 4  # the per-level kernels' fixed grid (they loop over their level's cells)
SPLIT_THREADS = 256  # kernels/tree/build.cu SPLIT_THREADS: tree_level_split's block, on the per-level grid
SPLIT_TILE = 256  # kernels/tree/build.cu SPLIT_TILE: cells per tile of its look-back scan
CELL_LANES = 8  # kernels/tree/build.cu CELL_LANES: the split's lanes per cell, one per octant
EXTRA_LEVELS = 2  # levels queued past the previous build's depth before the host looks
WALK_ARGS = "PPPiiPPPPfffiPiPPPPPiiPPifP"
CELL_FIELDS = ("start", "count", "child", "nchild")  # the cell arrays of the build, int32 each
GROUP_LISTS = ("nbody", "ncell", "nactive")  # per group of the last walk (last_groups)
