"""The kernel suite of issue 5: every variant and tunable agrees with float64, and the tuning cache.

CPU-side (CI): registry and compiled specialisations, SASS instruction budgets of the hot loops (needs
nvcc and cuobjdump), launch geometry (j-slices, the N3L task triangle covers every pair exactly once),
the tuning cache (keyed by GPU name, driver and kernel-source hash; stale or corrupt files are ignored
and rewritten) and `best`'s choice of entry. GPU-marked: every variant's tunables at awkward N within
1e-4 of float64, fp64 within 1e-10, pair-matrix entries, `best` resolving from the cache.
"""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import needs_nvcc
from summation import far_cluster

from app.backends import backend_class
from app.backends.cuda import registry, tune
from app.backends.cuda import tuning_cache as cache
from app.backends.cuda.compile import compile_file, find_nvcc
from app.backends.cuda.policies import (
    BestPolicy,
    RegisterBlockedPolicy,
    auto_chunk,
    auto_slices,
    n3l_geometry,
    n3l_tasks,
    slice_plan,
)
from app.core.errors import ConfigError
from app.core.paths import KERNELS
from app.engine.forces import format_tunables

ARCH = "sm_90"
# every all-pairs record (issue 5's variants): the registry's, less the approximate methods (the tree)
SUITE = tuple(r.name for r in registry.RECORDS if not r.approximate)


# --- the registry ---------------------------------------------------------------------------------------
def test_every_issue5_variant_has_a_record():
    recs = {r.name: r for r in registry.RECORDS}
    assert set(SUITE) <= set(recs), set(SUITE) - set(recs)
    for name in SUITE:
        rec = recs[name]
        assert rec.doc and "\n" not in rec.doc and rec.origin, name
        assert rec.validate_tunables(rec.default_tunables()) == rec.default_tunables(), name
        assert rec.policy is not None, name
    assert recs["fp64"].precision == "fp64"
    assert recs["pair-matrix"].max_n == 8192
    assert isinstance(recs["best"].policy, BestPolicy)


def test_tunables_are_typed_and_checked():
    rec = next(r for r in registry.RECORDS if r.name == "register-blocked")
    assert rec.with_tunables({"k": 6}) == {"block_size": 128, "k": 6, "slices": 0}
    with pytest.raises(ConfigError, match="register-blocked.k: 5 is not one of 1, 2, 4, 6"):
        rec.validate_tunables({"k": 5})
    with pytest.raises(ConfigError, match="no tunable 'theta'"):
        rec.validate_tunables({"theta": 0.5})


@pytest.fixture(scope="module")
def nvcc_cache(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("NBODY_CACHE_DIR", str(tmp_path_factory.mktemp("nvcc-cache")))
    yield
    mp.undo()


_modules: dict = {}


def _compiled(source: str, options=None):
    if source not in _modules:
        _modules[source] = compile_file(KERNELS / source, ARCH, options)
    return _modules[source]


@needs_nvcc
@pytest.mark.parametrize("rec", registry.RECORDS, ids=lambda r: r.name)  # every record: a new one too
def test_every_specialisation_is_compiled(nvcc_cache, rec):
    module = _compiled(rec.source, rec.policy.nvcc_options)
    missing = [s for s in rec.policy.symbols(rec) if s not in module.functions]
    assert not missing, f"{rec.source} lacks {missing}"
    if isinstance(rec.policy, RegisterBlockedPolicy):
        assert "regblock_reduce" in module.functions
    if rec.name == "fp64":
        assert {"fp64_kick_drift", "fp64_kick", "fp64_euler_damped"} <= set(module.functions)
    if rec.name == "pair-matrix":
        assert {
            f"pair_matrix_fill_{m}_{s}" for m in ("gravity", "repulsion") for s in ("soft", "plain")
        } <= set(module.functions)


# --- SASS budgets -----------------------------------------------------------------------------------------
def _cuobjdump() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    nvcc = find_nvcc()
    cand = Path(nvcc).resolve().parent / "cuobjdump" if nvcc else None
    return str(cand) if cand and cand.is_file() else None


def innermost_loops(sass: str, function: str) -> list[dict[str, int]]:
    """Opcode counts of every backward-branch loop of `function` with a MUFU.RSQ and no barrier."""
    body = sass.split(f"Function : {function}\n", 1)[1].split("Function : ", 1)[0]
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", body)]
    loops = []
    for addr, text in ins:
        m = re.search(r"BRA (?:0x)?([0-9a-f]+)", text)
        if not m or int(m.group(1), 16) >= addr:
            continue
        loop = [t for a, t in ins if int(m.group(1), 16) <= a <= addr]
        if any("BAR" in t for t in loop) or not any("MUFU.RSQ" in t for t in loop):
            continue
        counts: dict[str, int] = {}
        for t in loop:
            op = re.sub(r"^@!?U?P\w+\s+", "", t).split()[0].split(".")[0]
            counts[op] = counts.get(op, 0) + 1
        loops.append(counts)
    return loops


FP32 = ("FADD", "FMUL", "FFMA", "FSEL", "FSETP", "FMNMX")


def _per_interaction(counts: dict[str, int], interactions: int) -> dict[str, float]:
    fp32 = sum(counts.get(op, 0) for op in FP32)
    return {
        "fp32": fp32 / interactions,
        "mufu": counts.get("MUFU", 0) / interactions,
        "lds": counts.get("LDS", 0) / interactions,
        "shfl": counts.get("SHFL", 0) / interactions,
        "slots": sum(counts.values()) / interactions,
    }


@pytest.fixture(scope="module")
def sass_of(nvcc_cache, tmp_path_factory):
    tool = _cuobjdump()
    if tool is None or find_nvcc() is None:
        pytest.skip("nvcc and cuobjdump are needed to read the SASS")
    out = tmp_path_factory.mktemp("sass")
    cache: dict[str, str] = {}

    def get(source: str) -> str:
        if source not in cache:
            cubin = out / (Path(source).stem + ".cubin")
            options = next((r.policy.nvcc_options for r in registry.RECORDS if r.source == source), None)
            cubin.write_bytes(_compiled(source, options).cubin)
            cache[source] = subprocess.run(
                [tool, "-sass", str(cubin)], capture_output=True, text=True, check=True
            ).stdout
        return cache[source]

    return get


@pytest.mark.parametrize("k", [4, 6])
def test_register_blocked_is_11_fp32_and_1_mufu_per_interaction(sass_of, k):
    """The mass-scaled hot loop: 11 FP32 + 1 MUFU, LDS and loop overhead amortised over K bodies."""
    loops = innermost_loops(sass_of("register_blocked.cu"), f"regblock_k{k}_b128_gravity_soft")
    fast = [c for c in loops if c.get("FADD", 0) == 0]  # the scaled loop has no FADD at all
    assert fast, loops
    per = _per_interaction(fast[0], fast[0]["MUFU"])
    assert per["fp32"] == 11 and per["mufu"] == 1, per
    assert per["slots"] <= 12.5, per  # 12 + LDS/K + loop overhead


def test_shared_ptx_fma_has_the_same_count_as_the_fmaf_form(sass_of):
    """PTX fma.rn compiles to what fmaf() in C++ gives (12 FP32); `shared` (+= eps², no fast math) 16."""
    folded = innermost_loops(sass_of("pair_matrix.cu"), "pair_matrix_force_gravity_soft")[0]
    ptx = innermost_loops(sass_of("shared_ptx_fma.cu"), "shared_ptx_force_gravity_soft")[0]
    base = innermost_loops(sass_of("shared.cu"), "shared_force_gravity_soft")[0]
    a, b, c = (_per_interaction(x, x["MUFU"]) for x in (folded, ptx, base))
    assert a["fp32"] == b["fp32"] == 12 and a["lds"] == b["lds"] == 1, (a, b)
    assert c["fp32"] == 16 and c["lds"] == 1, c


def test_n3l_pair_costs_16_fp32_for_two_interactions(sass_of):
    loops = innermost_loops(sass_of("atomics_n3l.cu"), "n3l_ki4_gravity_soft")
    both = [c for c in loops if c.get("SHFL", 0) and _per_interaction(c, 2 * c["MUFU"])["fp32"] == 8]
    assert both, loops  # per pair: 16 FP32 + 1 MUFU for a_i and the reaction on a_j
    per = _per_interaction(both[0], 2 * both[0]["MUFU"])
    assert per["mufu"] == 0.5 and per["slots"] < 10.5, per


# --- launch geometry ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 2, 31, 127, 128, 129, 4096, 4097, 16384, 131072])
@pytest.mark.parametrize("block", [64, 128, 256])
def test_slices_cover_every_source_once(n, block):
    for s in (1, 2, 3, 7, 64, auto_slices(n, n, block, 4, 132)):
        slice_len, used = slice_plan(n, block, s)
        assert slice_len % block == 0 and used >= 1
        assert (used - 1) * slice_len < n <= used * slice_len


def test_auto_slices_fill_the_gpu_at_small_n():
    s = auto_slices(4096, 4096, 64, 4, 132)
    blocks = (4096 // (64 * 4)) * s
    assert blocks >= 132 * 4  # at least 4 blocks (8 warps) per SM
    assert auto_slices(1 << 20, 1 << 20, 128, 4, 132) <= 4  # large N: a few slices at most, for the last wave
    assert auto_slices(512, 1 << 20, 128, 4, 132) > 1  # few targets, many sources: split the sources


def _n3l_pairs(n: int, ki: int, chunk: int) -> np.ndarray:
    """How often each ordered pair (i, j) is added by the N3L warp tasks (kernels/atomics_n3l.cu)."""
    ti, r = 32 * ki, ki // 2
    ntj, nti = -(-n // 64), -(-n // ti)
    _chunk, cpr, _blocks = n3l_geometry(n, ki, chunk, 128)
    count = np.zeros((n, n), dtype=np.int64)
    for row in range(nti):
        for c in range(cpr):
            jt0 = row * r + c * _chunk
            if jt0 >= ntj:
                continue
            ii = [i for i in range(row * ti, row * ti + ti) if i < n]
            for jt in range(jt0, min(jt0 + _chunk, ntj)):
                jj = [j for j in range(jt * 64, jt * 64 + 64) if j < n]
                for i in ii:
                    for j in jj:
                        count[i, j] += 1  # a_i += f(i, j)
                        if jt >= (row + 1) * r:
                            count[j, i] += 1  # the reaction, off the diagonal
    return count


@pytest.mark.parametrize(
    "n,ki,chunk", [(1, 2, 1), (31, 4, 1), (200, 2, 2), (300, 4, 1), (300, 4, 3), (257, 2, 64)]
)
def test_n3l_tasks_add_every_pair_exactly_once(n, ki, chunk):
    count = _n3l_pairs(n, ki, chunk)
    assert (count == 1).all(), np.argwhere(count != 1)[:5]
    tasks = n3l_tasks(n, ki, chunk)
    assert tasks >= 1


def test_n3l_chunk_choice():
    assert auto_chunk(4096, 4, 132) == 1
    assert auto_chunk(131072, 4, 132) == 64
    chunk, cpr, blocks = n3l_geometry(1 << 21, 2, 1, 128)
    assert blocks * 128 < 2**31 and chunk > 1


# --- the tuning cache -----------------------------------------------------------------------------------
FACTS = SimpleNamespace(name="NVIDIA H200", driver_version="580.159.04", sms=132)


@pytest.fixture
def tune_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path))
    return tmp_path / "tune"


HASH = cache.source_hash(registry.RECORDS)


def _cache(best, **over):
    data = {
        "schema": cache.SCHEMA,
        "gpu": FACTS.name,
        "driver": FACTS.driver_version,
        "source_hash": HASH,
        "best": best,
        "measurements": [],
    }
    data.update(over)
    return data


ENTRIES = [
    {
        "n": 4096,
        "variant": "register-blocked",
        "tunables": {"k": 2, "block_size": 64, "slices": 16},
        "interactions_per_s": 1.5e12,
        "median_ms": 0.011,
    },
    {
        "n": 131072,
        "variant": "atomics-n3l",
        "tunables": {"ki": 4, "chunk": 64},
        "interactions_per_s": 2.9e12,
        "median_ms": 5.9,
    },
]


def test_cache_is_in_the_user_cache_dir_keyed_by_gpu_and_driver(tune_dir, monkeypatch):
    path = cache.write_cache(_cache(ENTRIES))
    assert path.parent == tune_dir and "nvidia-h200" in path.name and "580.159.04" in path.name
    data, why = cache.read_cache(FACTS.name, FACTS.driver_version, HASH)
    assert why == "" and data["best"] == ENTRIES
    assert cache.read_cache("NVIDIA H100 80GB HBM3", FACTS.driver_version, HASH)[0] is None
    assert cache.read_cache(FACTS.name, "575.1", HASH)[0] is None
    monkeypatch.delenv("NBODY_CACHE_DIR")
    import platformdirs

    assert cache.cache_dir() == Path(platformdirs.user_cache_dir("nbody-live")) / "tune"


def test_stale_cache_is_ignored_then_rewritten(tune_dir):
    cache.write_cache(_cache(ENTRIES, source_hash="0" * 64))
    data, why = cache.read_cache(FACTS.name, FACTS.driver_version, HASH)
    assert data is None and "stale" in why
    assert cache.lookup(4096, FACTS, registry.RECORDS) == (None, why)
    cache.write_cache(_cache(ENTRIES))  # what the next `nbody-live tune` does
    assert cache.lookup(4096, FACTS, registry.RECORDS)[0]["variant"] == "register-blocked"


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        json.dumps({"schema": "other"}),
        json.dumps([1, 2]),
        json.dumps({"schema": cache.SCHEMA, "best": [{"n": "x"}]}),
        "",
    ],
)
def test_corrupt_cache_is_ignored_then_rewritten(tune_dir, text):
    path = cache.cache_path(FACTS.name, FACTS.driver_version)
    path.parent.mkdir(parents=True)
    path.write_text(text)
    data, why = cache.read_cache(FACTS.name, FACTS.driver_version, HASH)
    assert data is None and "corrupt" in why
    cache.write_cache(_cache(ENTRIES))
    assert cache.read_cache(FACTS.name, FACTS.driver_version, HASH)[0]["best"] == ENTRIES


def test_kernel_edit_makes_the_cache_stale(tmp_path):
    for name in ("common.cuh", "shared.cu"):
        shutil.copy(KERNELS / name, tmp_path / name)
    before = cache.source_hash(registry.RECORDS, tmp_path)
    (tmp_path / "shared.cu").write_text((tmp_path / "shared.cu").read_text() + "\n// edit\n")
    assert cache.source_hash(registry.RECORDS, tmp_path) != before


def test_best_entry_for_n():
    assert cache.choose(ENTRIES, 4096)["n"] == 4096
    assert cache.choose(ENTRIES, 6000)["n"] == 4096  # within an octave
    assert cache.choose(ENTRIES, 1 << 20)["n"] == 131072  # above the largest: the asymptotic winner
    assert cache.choose(ENTRIES, 1000) is None  # two octaves below anything tuned
    assert cache.choose(ENTRIES, 30000) is None
    assert cache.choose([], 4096) is None


def test_candidate_configs_are_allowed_and_start_with_the_defaults():
    swept = tune.candidates(registry.RECORDS)
    assert swept[:2] == ["register-blocked", "atomics-n3l"]
    assert not {"best", "fp64", "pair-matrix"} & set(swept)
    for rec in registry.RECORDS:
        if rec.name not in swept:
            continue
        for n in (4096, 131072):
            configs = rec.policy.candidates(rec, n, 132)
            assert configs[0] == rec.default_tunables()
            assert len(configs) == len({json.dumps(c, sort_keys=True) for c in configs})
            for cfg in configs:
                assert rec.validate_tunables(cfg) == cfg, (rec.name, cfg)


def test_tune_command_is_registered():
    from app.cli import build_parser

    args = build_parser().parse_args(["tune", "--n", "4096,16384", "--budget-s", "30"])
    assert args.command == "tune" and args.n == [4096, 16384] and args.budget_s == 30


# --- on the GPU ---------------------------------------------------------------------------------------------
CUDA = backend_class("cuda")


on_gpu = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)

CONFIGS = {
    "gravity-soft": ("gravity", 0.01, 0.0),
    "gravity-eps0": ("gravity", 0.0, 0.0),
    "repulsion-soft": ("gravity-repulsion", 0.01, 1e-4),
}


def _physics(config: str, **kw):
    from app.model.physics import Physics

    model, eps, h = CONFIGS[config]
    return Physics(G=1.0, softening=eps, model=model, repulsion=h, **kw)


_REF: dict = {}


def _reference(n: int, config: str, exact: bool = False) -> np.ndarray:
    """float64 accelerations of the bench state (fp32-rounded unless `exact`)."""
    from app.model.physics import accelerations
    from app.tools.bench import bench_bodies

    key = (n, config, exact)
    if key not in _REF:
        b = bench_bodies(n)
        pos = b.pos if exact else b.pos.astype(np.float32).astype(np.float64)
        mass = b.mass if exact else b.mass.astype(np.float32).astype(np.float64)
        try:
            from app.backends.cpu_forces import cpu_accelerations_fp64

            _REF[key] = cpu_accelerations_fp64(pos, mass, _physics(config))
        except Exception:
            _REF[key] = accelerations(pos, mass, _physics(config))
    return _REF[key]


@pytest.fixture
def backend():
    b = CUDA()
    yield b
    b.close()


def _sweep():
    for rec in registry.RECORDS:
        if not rec.tuned:
            continue
        for cfg in rec.policy.candidates(rec, 4097, 132):
            yield pytest.param(rec.name, cfg, id=f"{rec.name}-{'-'.join(f'{k}{v}' for k, v in cfg.items())}")


@on_gpu
@pytest.mark.parametrize("name,cfg", list(_sweep()))
@pytest.mark.parametrize("config", ["gravity-soft", "repulsion-soft"])
def test_every_tunable_agrees_with_float64(backend, name, cfg, config):
    from app.model.physics import relative_error
    from app.tools.bench import bench_bodies

    n = 4097
    backend.load(bench_bodies(n), _physics(config), kernel=name)
    backend.set_tunables(**cfg)
    worst, rms = relative_error(backend.accelerations(), _reference(n, config))
    assert worst <= 1e-4, f"{name} {cfg} {config}: max rel err {worst:.3g} (rms {rms:.3g})"


# The fp32 variants whose per-target sum is the two-level one of kernels/common.cuh (`partial_sums`), at
# the test scene's N (pair-matrix sums that way but refuses it); register-blocked's source slices and
# atomics-n3l's tasks are partial sums of their own lengths.
TWO_LEVEL = tuple(
    r.name
    for r in registry.RECORDS
    if r.partial_sums and (r.max_n is None or r.max_n >= far_cluster().shape[0])
)


@on_gpu
@pytest.mark.parametrize("name", TWO_LEVEL)
def test_partial_sums_keep_a_distant_clusters_pull(backend, name):
    """tests/summation.py's scene: with one running sum these variants lose the cluster (8.4e-4 in a
    CPU emulation of their arithmetic); with partial sums, 2.6e-5."""
    from summation import TARGETS

    from app.engine.forces import FP32_BUDGET
    from app.model.bodies import Bodies
    from app.model.physics import Physics, accelerations, relative_errors

    rows = far_cluster()
    pos, mass = rows[:, :3].astype(np.float64), rows[:, 3].astype(np.float64)
    phys = Physics(softening=0.01)
    backend.load(Bodies.from_arrays(pos, np.zeros_like(pos), mass), phys, kernel=name)
    worst = relative_errors(backend.accelerations()[TARGETS], accelerations(pos, mass, phys, targets=TARGETS))
    assert worst.max() <= FP32_BUDGET.max_rel, f"{name}: max rel err {worst.max():.3g}"


@on_gpu
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("n", [1, 31, 4097])
def test_fp64_within_1e10_of_float64(backend, n, config):
    from app.model.physics import relative_error
    from app.tools.bench import bench_bodies

    backend.load(bench_bodies(n), _physics(config), kernel="fp64")
    acc = backend.accelerations()
    if n == 1:
        assert np.array_equal(acc, np.zeros((1, 3)))
        return
    worst, _ = relative_error(acc, _reference(n, config, exact=True))
    assert worst <= 1e-10, f"fp64 N={n} {config}: {worst:.3g}"


@on_gpu
@pytest.mark.parametrize("integrator", ["leapfrog", "euler-damped"])
def test_fp64_integrates_in_double(backend, integrator):
    from app.engine.integrator import integrate
    from app.model.physics import relative_error
    from app.tools.bench import bench_bodies

    bodies = bench_bodies(500)
    phys = _physics("gravity-soft", dt=1e-3, integrator=integrator, damping=0.999)
    backend.load(bodies, phys, kernel="fp64")
    backend.step(10)
    got = backend.state()
    ref = bodies.copy()
    integrate(ref, phys, 10)
    assert relative_error(got.pos, ref.pos)[0] <= 1e-9
    assert relative_error(got.vel, ref.vel)[0] <= 1e-9
    pos4, speed = backend.host_render_arrays()  # the float32 copies follow the double state
    np.testing.assert_allclose(pos4[:, :3], got.pos, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(speed, np.linalg.norm(got.vel, axis=1), rtol=1e-6)
    backend.set_kernel("shared")  # and back to fp32 from the same state
    backend.step(1)


@on_gpu
@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("n", [31, 1000])
def test_pair_matrix_entries_match_float64(backend, n, config):
    from app.tools.bench import bench_bodies

    bodies = bench_bodies(n)
    phys = _physics(config)
    backend.load(bodies, phys, kernel="pair-matrix")
    m = backend.interaction_matrix()
    pos = bodies.pos.astype(np.float32).astype(np.float64)
    mass = bodies.mass.astype(np.float32).astype(np.float64)
    d = pos[None, :, :] - pos[:, None, :]
    r2 = np.einsum("ijk,ijk->ij", d, d)
    s2 = r2 + phys.softening**2
    with np.errstate(divide="ignore", invalid="ignore"):
        inv3 = np.where(s2 > 0, s2**-1.5, 0.0)
        w = phys.G * inv3 - phys.h * inv3 / s2 if phys.h else phys.G * inv3
    ref = np.abs(w) * mass[None, :] * np.sqrt(r2)
    np.fill_diagonal(ref, 0.0)
    assert m.shape == (n, n) and m.dtype == np.float32
    np.testing.assert_allclose(m, ref, rtol=2e-5, atol=1e-6 * ref.max())
    assert (np.diag(m) == 0).all()


@on_gpu
def test_pair_matrix_refuses_large_n(backend):
    from app.core.errors import ConfigError
    from app.tools.bench import bench_bodies

    backend.load(bench_bodies(8193), _physics("gravity-soft"), kernel="pair-matrix")
    with pytest.raises(ConfigError, match="8,192"):
        backend.interaction_matrix()


@on_gpu
@pytest.mark.parametrize("n", [255, 256, 257, 4096])
def test_streams_remainder_at_block_multiples(backend, n):
    from app.model.physics import relative_error
    from app.tools.bench import bench_bodies

    backend.load(bench_bodies(n), _physics("gravity-soft"), kernel="streams-remainder")
    worst, _ = relative_error(backend.accelerations(), _reference(n, "gravity-soft"))
    assert worst <= 1e-4


@on_gpu
def test_best_uses_the_cache_and_falls_back_with_a_log_line(backend, tmp_path, monkeypatch, caplog):
    from app.model.physics import relative_error
    from app.tools.bench import bench_bodies

    monkeypatch.setattr(cache, "cache_dir", lambda: tmp_path)
    facts = backend.device.facts
    records = {r.name: r for r in registry.RECORDS}
    rec, tun, source, _ = records["best"].policy.resolve(records, facts, 4096)  # the heuristic or safe pick
    with caplog.at_level(logging.INFO, logger="app"):
        backend.load(bench_bodies(4096), _physics("gravity-soft"), kernel="best")
    assert backend.resolved_kernel == f"{rec.name} {format_tunables(tun)}".strip()
    assert any(r.getMessage().startswith(f"best: {source}") for r in caplog.records)
    assert not source.startswith("tuned cache") and "nbody-live tune" in source
    entry = {
        "n": 4096,
        "variant": "multi-thread-per-body",
        "tunables": {"q": 8, "block_size": 128},
        "interactions_per_s": 1e12,
        "median_ms": 0.02,
    }
    cache.write_cache(
        {
            "schema": cache.SCHEMA,
            "gpu": facts.name,
            "driver": facts.driver_version,
            "source_hash": HASH,
            "best": [entry],
            "measurements": [],
        }
    )
    backend.load(bench_bodies(4096), _physics("gravity-soft"), kernel="best")
    assert backend.resolved_kernel == "multi-thread-per-body block_size=128 q=8"
    worst, _ = relative_error(backend.accelerations(), _reference(4096, "gravity-soft"))
    assert worst <= 1e-4
    t = backend.step(2)
    assert t.kernel == "best" and t.force_ms > 0
    cache.cache_path(facts.name, facts.driver_version).write_text("{corrupt")
    backend.load(bench_bodies(4096), _physics("gravity-soft"), kernel="best")
    assert backend.resolved_kernel == f"{rec.name} {format_tunables(tun)}".strip()


# --- the tuner's logic, on a stand-in backend (CI) ----------------------------------------------------------
class _TunedStandIn:
    """Times a configuration by a rule of its tunables, so that the tuner's choice is known: atomics-n3l
    with ki = 2 (not its default 4) is the fastest; every step records the tunables it really ran with."""

    FASTEST = {"block_size": 128, "ki": 2, "chunk": 0}

    def __init__(self):
        from app.model.physics import Physics

        self.device = SimpleNamespace(facts=SimpleNamespace(name="stand-in GPU", driver_version="1", sms=132))
        self.kernel, self.n, self._tun, self.ran, self._physics = None, 0, {}, [], Physics()

    @classmethod
    def kernels(cls):
        return list(registry.RECORDS)

    def load(self, bodies, physics, kernel):
        self.kernel, self.n, self._bodies, self._physics = kernel, bodies.n, bodies, physics
        self._tun = {}

    def clear_tunables(self):
        self._tun = {}

    def set_tunables(self, **values):
        rec = next(r for r in registry.RECORDS if r.name == self.kernel)
        self._tun = rec.validate_tunables(values)

    def step(self, steps):
        from app.engine.timing import StepTimings

        rec = next(r for r in registry.RECORDS if r.name == self.kernel)
        tun = rec.with_tunables(self._tun)
        self.ran.append((self.kernel, tun))
        fast = self.kernel == "atomics-n3l" and tun == self.FASTEST
        return StepTimings(
            kernel=self.kernel,
            steps=steps,
            n=self.n,
            force_ms=1.0 if fast else 2.0,
            interactions=self.n * self.n,
            pair_equivalent=self.n * self.n,
            force_evals=1,
        )

    def accelerations(self):
        from app.model.physics import accelerations

        return accelerations(self._bodies.pos, self._bodies.mass, self._physics)

    def close(self):
        pass


def test_tune_applies_every_swept_configuration_and_picks_the_fastest(tmp_path, monkeypatch):
    """Each measured row ran with the tunables it is recorded under (a sweep that silently ran the
    defaults made every configuration look alike and `best` slower), and the winner is the fastest."""
    monkeypatch.setenv("NBODY_CACHE_DIR", str(tmp_path))
    made = []

    def factory():
        made.append(_TunedStandIn())
        return made[-1]

    factory.kernels = _TunedStandIn.kernels
    factory.k, factory.base = 1, None  # (Backend's: one device, no wrapped backend)
    data = tune.run_tune(
        factory, [256], variants=["atomics-n3l", "naive"], budget_s=30, repeats=1, say=lambda _line: None
    )
    ran = made[0].ran
    for row in data["measurements"]:
        if row["status"] == "ok":
            rec = next(r for r in registry.RECORDS if r.name == row["variant"])
            assert (row["variant"], rec.with_tunables(row["tunables"])) in ran, row
    assert len({json.dumps(t, sort_keys=True) for name, t in ran if name == "atomics-n3l"}) > 3
    assert data["best"][0]["variant"] == "atomics-n3l"
    assert data["best"][0]["tunables"] == _TunedStandIn.FASTEST
