"""Every kernels/*.cu compiles with nvcc for sm_90 without register spills or stack frames, and every
force entry takes the parameters the host passes (the range ABI of kernels/common.cuh, read from the PTX).
The GPU tree's walk has no float64 arithmetic in its PTX, and its build keeps float64 only where
kernels/tree/build.cu says why (desktop GPUs run float64 at 1/64 of float32).

Runs on the CPU-only CI machine: it needs nvcc, not a GPU (skipped, saying so, without nvcc). The
registry checks and the ptxas-report parser need neither. If cuobjdump is found, the SASS of the
tiled gravity inner loops is checked: 13 FP32 instructions for `shared` (the CUDA sample's arithmetic),
12 for the folded form DESIGN.md's FP32 limit assumes.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import needs_nvcc

from app.backends.cuda import registry
from app.backends.cuda.compile import (
    NVCC_OPTIONS,
    CompiledModule,
    compile_file,
    find_nvcc,
    kernel_files,
    parse_ptxas,
)
from app.backends.cuda.errors import KernelCompileError
from app.backends.cuda.policies import FORMS
from app.core.paths import KERNELS

ARCH = "sm_90"
CU_FILES = kernel_files()
# diagnostics' potentials sum over one set of bodies; integrate.cu moves them
SUPPORT_SYMBOLS = ("kick_drift", "kick", "euler_damped", "speeds", "first_nonfinite")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A private compile cache, so the test compiles for real and leaves the user's cache alone."""
    mp = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("nvcc-cache")
    mp.setenv("NBODY_CACHE_DIR", str(path))
    yield path
    mp.undo()


_compiled: dict[Path, CompiledModule] = {}


def compiled(path: Path, options=None) -> CompiledModule:
    """`path` built as the launches build it (with the nvcc options of its record's policy)."""
    if options is None:
        options = next((r.policy.nvcc_options for r in registry.RECORDS if r.source == path.name), None)
    if path not in _compiled:
        _compiled[path] = compile_file(path, ARCH, options)
    return _compiled[path]


def test_there_are_kernels():
    names = {p.name for p in CU_FILES}
    assert {"naive.cu", "shared.cu", registry.INTEGRATE_SOURCE} <= names
    assert (KERNELS / "common.cuh").is_file()


@pytest.mark.parametrize("path", CU_FILES, ids=lambda p: p.name)
def test_every_cu_includes_common(path):
    assert re.search(r'^\s*#\s*include\s+"common\.cuh"', path.read_text(), re.M), (
        f'{path.name} must #include "common.cuh" (the one body-body interaction)'
    )


@needs_nvcc
@pytest.mark.parametrize("path", CU_FILES, ids=lambda p: p.name)
def test_compiles_without_spills_or_stack(cache, path):
    module = compiled(path)
    assert module.cubin[:4] == b"\x7fELF"
    assert module.functions, f"no ptxas report parsed from:\n{module.log}"
    assert not module.problems(), "\n".join(module.problems()) + "\n" + module.log
    for f in module.functions.values():
        assert 0 < f.registers <= 64, f"{f.name}: {f.registers} registers"


# --- the force ABI: the records' prepare strings against the kernels' own parameter lists ----------------
_PTX_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\(([^)]*)\)")
_PTX_TYPE = {"u64": "P", "b64": "P", "u32": "i", "s32": "i", "b32": "i", "f32": "f", "f64": "d"}
_PTX: dict[tuple[str, tuple[str, ...]], str] = {}


def ptx_of(source: str, options) -> str:
    """The PTX of kernels/`source` from nvcc -ptx with `options` (None: NVCC_OPTIONS), as the launches
    build the file (kernels/ on the include path)."""
    options = tuple(options or NVCC_OPTIONS)
    if (source, options) not in _PTX:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "k.ptx"
            cmd = [
                find_nvcc(),
                "-ptx",
                f"-arch={ARCH}",
                *options,
                "-I",
                str(KERNELS),
                "-o",
                str(out),
                str(KERNELS / source),
            ]
            subprocess.run(cmd, check=True, capture_output=True, timeout=600)
            _PTX[source, options] = out.read_text()
    return _PTX[source, options]


def ptx_parameters(source: str, options) -> dict[str, str]:
    """Entry name -> its parameter types as a prepare string (P pointer, i int, f float, d double),
    from nvcc -ptx with the options the launches build the file with."""
    return {
        name: "".join(_PTX_TYPE[t] for t in re.findall(r"\.param\s+\.(\w+)", params))
        for name, params in _PTX_ENTRY.findall(ptx_of(source, options))
    }


@needs_nvcc
@pytest.mark.parametrize("rec", [r for r in registry.RECORDS if not r.policy.resolves], ids=lambda r: r.name)
def test_prepare_strings_match_the_kernels(rec):
    """Every entry a record's policy launches takes exactly the arguments the policy prepares it with
    (the range ABI of common.cuh, or the policy's own): a mismatch would pass garbage silently."""
    params = ptx_parameters(rec.source, rec.policy.nvcc_options)
    for tun in rec.policy.symbol_tunables(rec):
        for repulsion, soft in FORMS:
            for symbol, arg_types in rec.policy.entries(rec, repulsion, soft, tun):
                assert params.get(symbol) == arg_types, f"{rec.source}:{symbol} takes {params.get(symbol)}"


@needs_nvcc
def test_tree_build_prepare_strings_match_the_kernels():
    """The GPU tree's build kernels (compiled with their own options) take what tree.py prepares."""
    from app.backends.cuda import tree

    params = ptx_parameters(tree.BUILD_SOURCE, tree.BUILD_OPTIONS)
    for symbol, arg_types in tree.BUILD_KERNELS.items():
        assert params.get(symbol) == arg_types, f"{tree.BUILD_SOURCE}:{symbol} takes {params.get(symbol)}"


@needs_nvcc
def test_block_step_prepare_strings_match_the_kernels_and_nothing_is_contracted():
    """kernels/blocksteps.cu takes what app/backends/cuda/blockops.py prepares, and its float64 products and
    sums stay separate (no fma): they must be the CPU twin's numpy expressions bit for bit."""
    from app.backends.cuda import blockops

    params = ptx_parameters(blockops.SOURCE, None)
    for symbol, arg_types in blockops.KERNELS.items():
        assert params.get(symbol) == arg_types, f"{blockops.SOURCE}:{symbol} takes {params.get(symbol)}"
    assert not re.search(r"\bfma\.", ptx_of(blockops.SOURCE, None))


def test_a_kernel_file_without_a_record_takes_its_own_options():
    """kernels/splat.cu is built with FILE_OPTIONS (no fast math, no FMA contraction) wherever the caller
    names no options, as every launch and this file's other tests do; a file of the same name elsewhere
    (a user's) is not."""
    from app.backends.cuda.compile import FILE_OPTIONS, default_options

    own = FILE_OPTIONS["splat.cu"]
    assert default_options(KERNELS / "splat.cu") == own
    assert "-fmad=false" in own and not any("fast_math" in o for o in own)
    assert default_options(KERNELS / "naive.cu") == NVCC_OPTIONS
    assert default_options(Path("/elsewhere/splat.cu")) == NVCC_OPTIONS


@needs_nvcc
def test_splat_prepare_strings_match_and_its_float_arithmetic_rounds_each_operation():
    """kernels/splat.cu takes what app/render/splat.py KERNELS names (Q, an unsigned 64-bit scalar, is a
    .u64 parameter like a pointer), and its PTX, built with its own options, has no fused multiply-add,
    no flush-to-zero and no approximate division: each float32 operation rounds as the numba twin's."""
    from app.backends.cuda.compile import FILE_OPTIONS
    from app.render import splat

    options = FILE_OPTIONS[splat.SOURCE]
    params = ptx_parameters(splat.SOURCE, options)
    for symbol, arg_types in splat.KERNELS.items():
        assert params.get(symbol) == arg_types.replace("Q", "P"), f"{symbol} takes {params.get(symbol)}"
    ptx = ptx_of(splat.SOURCE, options)
    assert re.search(r"\bmul\.rn\.f32", ptx) and re.search(r"\bdiv\.rn\.f32", ptx)
    assert not re.search(r"\b(fma|mad)\.[\w.]*f32|\.ftz\b|\.approx\b", ptx)


# --- float64 in the GPU tree (issue 25): none in the walk, only the build's few, said and bounded ---------
# An FP64 arithmetic instruction: the opcode with .f64 in its type (cvt from or to f64 too), maybe guarded.
_FP64_OP = re.compile(
    r"^\s*(?:@!?%p\w+\s+)?(?:add|sub|mul|fma|mad|setp|min|max|cvt|div|neg|abs|sqrt|rcp|"
    r"rsqrt|selp|testp|copysign)(?:\.\w+)*\.f64\b",
    re.M,
)
# The build's float64, per entry (kernels/tree/build.cu's header says why each stays): the cube (one thread
# per evaluation), the keys (per body, a kernel bound by its memory traffic), the opening rows' centre
# offset (per cell) and a refit's cube (per cell, between builds: the build cube from the key prefix, the
# comparison of the bodies' box with its faces and the grown cube, all relative to the float64 corner). The
# bounds are about today's counts plus a margin (34, 18, 23 and 62 with nvcc 13.0): the moments (459 in
# float64) and the rest of tree_pack (26 more) must not come back.
TREE_BUILD_FP64 = {"tree_bounds_finish": 48, "tree_keys": 24, "tree_pack": 30, "tree_refit": 75}


def fp64_per_entry(source: str, options) -> dict[str, int]:
    """Entry name -> the number of FP64 arithmetic instructions in its PTX."""
    parts = re.split(r"(?m)^\.(?:visible\s+)?\.entry\s+(\w+)", ptx_of(source, options))
    return {name: len(_FP64_OP.findall(body)) for name, body in zip(parts[1::2], parts[2::2], strict=True)}


def test_the_fp64_pattern_counts_instructions():
    ptx = "\n".join(
        [
            "\tcvt.f64.f32 \t%fd1, %f1;",
            "\tsub.rn.f64 \t%fd3, %fd1, %fd2;",
            "@%p1 setp.gt.f64 %p2, %fd3, 0d0;",
            "\tcvt.rn.f32.f64 %f2, %fd3;",
            "\tsub.rn.f32 %f3, %f2, %f1;",
            "\tld.global.f64 %fd4, [%rd1];",
            "\tmov.f64 %fd5, %fd4;",
        ]
    )
    assert len(_FP64_OP.findall(ptx)) == 4  # arithmetic and conversions; loads and moves are not


@needs_nvcc
def test_the_tree_walk_has_no_fp64_arithmetic():
    """The walk, 80% of a tree step, tests its cells in float32 (issue 25; before: 360 FP64 instructions,
    the float64 opening test, 30 in each of its 12 entries)."""
    from app.backends.cuda import tree

    counts = fp64_per_entry(tree.WALK_SOURCE, tree.TreePolicy.nvcc_options)
    assert len(counts) == 12 and not any(counts.values()), counts


@needs_nvcc
def test_the_tree_build_keeps_only_the_float64_it_explains():
    from app.backends.cuda import tree

    counts = fp64_per_entry(tree.BUILD_SOURCE, tree.BUILD_OPTIONS)
    assert set(tree.BUILD_KERNELS) <= set(counts)
    over = {k: v for k, v in counts.items() if v > TREE_BUILD_FP64.get(k, 0)}
    assert not over, f"FP64 instructions beyond {TREE_BUILD_FP64}: {over}"
    assert counts["tree_moments"] == 0


def test_registry_records():
    names = [r.name for r in registry.RECORDS]
    assert len(names) == len(set(names))
    assert registry.DEFAULT_KERNEL in names
    for rec in registry.RECORDS:
        assert rec.backend == "cuda" and rec.doc and rec.origin and rec.entry
        assert (KERNELS / rec.source).is_file(), rec.source
        assert rec.policy.resolves or len(rec.policy.symbols(rec)) >= 4


@needs_nvcc
@pytest.mark.parametrize("rec", registry.RECORDS, ids=lambda r: r.name)
def test_registry_symbols_exist(cache, rec):
    module = compiled(KERNELS / rec.source)
    missing = [s for s in rec.policy.symbols(rec) if s not in module.functions]
    assert not missing, f"{rec.source} lacks {missing}; it defines {sorted(module.functions)}"
    support = compiled(KERNELS / registry.INTEGRATE_SOURCE)
    assert set(SUPPORT_SYMBOLS) <= set(support.functions)


@needs_nvcc
def test_compile_error_carries_nvcc_output_and_file_name(cache, tmp_path):
    bad = tmp_path / "broken_variant.cu"
    bad.write_text(
        '#include "common.cuh"\n\nextern "C" __global__ void f(float* x) {\n'
        "    x[0] = this_is_not_declared;\n}\n"
    )
    with pytest.raises(KernelCompileError) as info:
        compile_file(bad, ARCH)
    text = str(info.value)
    assert "broken_variant.cu" in text
    assert "this_is_not_declared" in text and "error" in text.lower()
    assert info.value.returncode != 0 and info.value.path == bad


@needs_nvcc
def test_cache_serves_the_same_cubin(cache):
    path = KERNELS / registry.INTEGRATE_SOURCE
    first = compile_file(path, ARCH)
    second = compile_file(path, ARCH)
    assert second.cached and second.cubin == first.cubin and second.functions == first.functions


def test_parse_ptxas_report():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'shared_force_gravity_soft' for 'sm_90'
ptxas info    : Function properties for shared_force_gravity_soft
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 16 bytes smem
ptxas info    : Compiling entry function 'kick' for 'sm_90'
ptxas info    : Function properties for kick
    24 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 22 registers, used 0 barriers
"""
    f = parse_ptxas(log)
    assert f["shared_force_gravity_soft"].registers == 32
    assert f["shared_force_gravity_soft"].spill_stores == 8 and f["shared_force_gravity_soft"].barriers == 1
    assert f["shared_force_gravity_soft"].shared_bytes == 16
    assert f["kick"].stack_frame == 24 and f["kick"].registers == 22
    assert len(f["kick"].problems()) == 1 and len(f["shared_force_gravity_soft"].problems()) == 1


def test_cuda_package_imports_without_pycuda():
    """The package is importable anywhere; without pycuda why_not says what to install."""
    import app.backends.cuda as cuda_pkg

    assert cuda_pkg.BACKEND.name == "cuda"
    try:
        import pycuda.driver  # noqa: F401
    except ImportError:
        reason = cuda_pkg.BACKEND.why_not()
        assert reason and "pycuda" in reason
        assert cuda_pkg.BACKEND.kernel_why_not("shared") == reason
        assert [r.name for r in cuda_pkg.BACKEND.kernels()] == [r.name for r in registry.RECORDS]


# --- SASS: the hot loop costs what DESIGN.md's FP32 issue limit assumes -------------------------------------
def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = find_nvcc()
    if nvcc:
        cand = Path(nvcc).resolve().parent / "cuobjdump"
        if cand.is_file():
            return str(cand)
    return None


def opcode_counts(loop: list[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in loop:
        op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
        counts[op] = counts.get(op, 0) + 1
    return counts


def rsqrt_loops(sass: str, function: str) -> list[list[str]]:
    """The instructions of every backward-branch loop of `function` that holds a MUFU.RSQ."""
    body = sass.split(f"Function : {function}", 1)[1].split("Function : ", 1)[0]
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", body)]
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA (?:0x)?([0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            loop = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
            if any("MUFU.RSQ" in t for t in loop):
                loops.append(loop)
    return loops


def inner_loop_counts(sass: str, function: str) -> tuple[int, dict[str, int]]:
    """(interactions, opcode counts) of the innermost backward-branch loop with MUFU.RSQ and no barrier."""
    best = None
    for loop in rsqrt_loops(sass, function):
        n = sum("MUFU.RSQ" in t for t in loop)
        if not any("BAR" in t for t in loop) and (best is None or n > best[0]):
            best = (n, loop)
    assert best, f"no inner loop found in {function}"
    return best[0], opcode_counts(best[1])


def kernel_sass(cache, source: str) -> str:
    """cuobjdump's SASS of kernels/`source` as the backend compiles it (the test skips without cuobjdump)."""
    tool = _cuobjdump()
    if tool is None:
        pytest.skip("cuobjdump not found (pip install nvidia-cuda-cuobjdump to run this check)")
    cubin = Path(cache) / (Path(source).stem + "_check.cubin")
    cubin.write_bytes(compiled(KERNELS / source).cubin)
    return subprocess.run([tool, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout


FP32_OPS = ("FADD", "FMUL", "FFMA", "FSEL", "FSETP", "FMNMX")


@needs_nvcc
@pytest.mark.parametrize(
    "source, function, fp32_per_interaction",
    [
        # the baseline as the CUDA sample builds it: d·d, then += eps² (one FADD more), and without
        # --use_fast_math rsqrtf keeps denormal handling (FSETP and two predicated FMULs)
        ("shared.cu", "shared_force_gravity_soft", 16),
        # the same tiled loop with eps² folded into the first FFMA: DESIGN.md's 12-instruction budget
        ("pair_matrix.cu", "pair_matrix_force_gravity_soft", 12),
    ],
)
def test_tiled_inner_loop_fp32_instruction_count(cache, source, function, fp32_per_interaction):
    sass = kernel_sass(cache, source)
    n, counts = inner_loop_counts(sass, function)
    fp32 = sum(counts.get(op, 0) for op in FP32_OPS)
    assert fp32 == fp32_per_interaction * n, f"{fp32 / n:.2f} FP32 instructions per interaction: {counts}"
    assert counts.get("MUFU") == n and counts.get("LDS") == n


@needs_nvcc
def test_tree_walk_body_cell_loops_take_30_fp32_instructions_an_interaction(cache):
    """The walk's gravity body-cell term in its short form (kernels/tree/walk.cu body_cell: 30 FP32
    instructions and the rsqrt; the textbook order took 33), in both cell loops of the groups-of-64 kernel:
    two targets a lane (a cell's three LDS.128 serve two rsqrts) and one (in_slots: groups of <= 32)."""
    sass = kernel_sass(cache, "tree/walk.cu")
    cell_loops = {}  # targets a lane -> opcode counts of an innermost loop over cells
    for loop in rsqrt_loops(sass, "tree_walk_g64_gravity_soft"):
        counts = opcode_counts(loop)
        rsqrt, loads = counts.get("MUFU", 0), counts.get("LDS", 0)
        if counts.get("BRA") == 1 and loads and loads % 3 == 0 and (3 * rsqrt) % loads == 0:
            cell_loops.setdefault(3 * rsqrt // loads, counts)  # (a body loop: one LDS.128 a body)
    assert set(cell_loops) >= {1, 2}, f"cell loops by targets a lane: {sorted(cell_loops)}"
    for per_lane, counts in cell_loops.items():
        fp32 = sum(counts.get(op, 0) for op in FP32_OPS)
        per_interaction = fp32 / counts["MUFU"]
        assert per_interaction == 30, f"{per_lane} a lane: {per_interaction:.2f} FP32 an interaction"
