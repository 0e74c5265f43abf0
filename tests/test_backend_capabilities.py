"""Backends answer by capability, never by name (issue 26, docs/architecture.md "The contracts").

1. The rule, read from the sources with `ast`: outside app/backends/ nothing compares a value with a
   backend's name, and nowhere is a backend probed with hasattr/getattr (its capabilities have defaults
   in app/backends/base.py). A test of the test shows that both checks catch what they are for.
2. The proof: tests/toy_backend.py is a backend defined outside the package, added by one line,
   `register_backend("toy", "toy_backend")`; `run --headless`, `simulate`, `bench`, `validate`, `info`,
   `--gpus 2`, MPI ranks and the panel take it, and nothing in app/ names it.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from app.cli import main
from app.core import backend_table
from app.core.backend_table import register_backend

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
BACKEND_NAMES = ("cuda", "cpu")  # the package's own: what a dispatch on names would spell
# an object that is a backend or a backend class, by the names the code gives them
BACKEND_OBJECT = re.compile(r"(^|\.)(backend|backend_cls|cls|inner|base|b)$")


# --- 1. the rule -------------------------------------------------------------------------------------------
def name_comparisons(source: str) -> list[str]:
    """Comparisons with a backend's name spelled out ("cuda", "cpu", or a tuple/list/set holding one)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            items = side.elts if isinstance(side, ast.Tuple | ast.List | ast.Set) else [side]
            if any(isinstance(e, ast.Constant) and e.value in BACKEND_NAMES for e in items):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
                break
    return found


def backend_probes(source: str) -> list[str]:
    """hasattr/getattr on a backend (or a backend class): what capabilities with defaults replace."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")
            and node.args
            and BACKEND_OBJECT.search(ast.unparse(node.args[0]))
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _app_sources():
    for path in sorted((ROOT / "app").rglob("*.py")):
        yield path.relative_to(ROOT), path.read_text()


def test_nothing_outside_the_backends_compares_a_backend_name():
    found = {
        str(p): hits
        for p, src in _app_sources()
        if p.parts[:2] != ("app", "backends") and (hits := name_comparisons(src))
    }
    assert not found, f"dispatch on backend names (ask a capability, app/backends/base.py): {found}"


def test_no_backend_is_probed_with_hasattr_or_getattr():
    found = {str(p): hits for p, src in _app_sources() if (hits := backend_probes(src))}
    assert not found, f"backend probes (declare the capability with a default in Backend): {found}"


def test_the_rule_catches_what_it_is_for():
    """A test of the test: the dispatches and probes this issue removed are caught; their replacements and
    look-alikes that are not about backends are not."""
    assert name_comparisons('if backend.name == "cuda":\n    pass')
    assert name_comparisons('x = cls.name in ("cpu", "gpu")')
    assert backend_probes('info = getattr(backend, "device_info", None)')
    assert backend_probes('if hasattr(self.backend, "diagnostics"):\n    pass')
    assert backend_probes('getattr(backend_cls, "timing", None)')
    assert not name_comparisons('if backend.memory == "device":\n    pass')
    assert not name_comparisons('if engine == "numpy":\n    pass')
    assert not backend_probes("getattr(self.backend.physics, name)")
    assert not backend_probes('getattr(module, "BACKEND", None)')


# --- 2. the proof: a backend from tests/ -------------------------------------------------------------------
@pytest.fixture
def toy(monkeypatch):
    """The toy backend registered (tests/ importable as a top-level package path), the table restored
    afterwards."""
    monkeypatch.syspath_prepend(str(TESTS))
    monkeypatch.setattr(backend_table, "_MODULES", dict(backend_table._MODULES))
    register_backend("toy", "toy_backend")  # the one line
    return "toy"


def test_app_never_names_the_toy():
    hits = [str(p) for p, src in _app_sources() if "toy" in re.findall(r"[a-z]+", src)]
    assert not hits


def test_simulate_and_several_devices_take_the_toy(toy, tmp_path, capsys):
    """`simulate --backend toy` steps with its kernel; `--gpus 2` splits it into two CPU "devices" (its
    device kind), bitwise one device's run (each row summed by the same kernel in the same order)."""
    common = ["simulate", "plummer", "--n", "512", "--steps", "4", "--backend", "toy", "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "one.npz")]) == 0
    assert "with toy-fp32" in capsys.readouterr().out
    assert main([*common, "--gpus", "2", "--out", str(tmp_path / "two.npz")]) == 0
    one, two = np.load(tmp_path / "one.npz"), np.load(tmp_path / "two.npz")
    assert np.array_equal(one["pos"], two["pos"]) and np.array_equal(one["vel"], two["vel"])
    assert (
        main(
            [
                "simulate",
                "plummer",
                "--n",
                "512",
                "--steps",
                "4",
                "--backend",
                "cpu",
                "--kernel",
                "cpu-fp64",
                "--no-progress",
                "--out",
                str(tmp_path / "ref.npz"),
            ]
        )
        == 0
    )
    ref = np.load(tmp_path / "ref.npz")["pos"]
    assert 0 < np.abs(one["pos"] - ref).max() <= 1e-5 * np.abs(ref).max()  # float32 against float64


def test_bench_validate_and_info_take_the_toy(toy, tmp_path, capsys):
    out = tmp_path / "toy.json"
    assert (
        main(
            [
                "bench",
                "--backend",
                "toy",
                "--kernels",
                "toy-fp32",
                "--n",
                "256",
                "--warmup",
                "1",
                "--repeats",
                "2",
                "--json",
                str(out),
                "--no-progress",
            ]
        )
        == 0
    )
    result = json.loads(out.read_text())
    (row,) = result["results"]
    assert row["kernel"] == "toy-fp32" and row["interactions_per_s"] > 0
    assert result["timing"] == "time.perf_counter around each force evaluation"  # Backend.timing
    capsys.readouterr()
    assert main(["validate", "plummer", "--n", "256", "--backend", "toy", "--kernel", "toy-fp32"]) == 0
    said = capsys.readouterr().out
    assert "toy/toy-fp32" in said and " ok " in said  # judged within its budget by the float64 reference
    assert main(["info", "--no-gl"]) == 0
    assert "backend toy: available" in capsys.readouterr().out
    assert main(["info", "--kernels"]) == 0
    assert "[toy] available" in capsys.readouterr().out


def test_an_unknown_backend_lists_the_registered_ones(toy, capsys):
    assert main(["simulate", "--backend", "nope", "--steps", "1", "--out", "never.npz"]) == 2
    assert "one of: auto, cuda, cpu, toy" in capsys.readouterr().err


@pytest.mark.gl
def test_run_headless_and_the_panel_take_the_toy(toy, capsys):
    from app.render import gl_setup

    try:
        gl_setup.configure(headless=True)
    except Exception as e:  # noqa: BLE001 - no GL here: skip with the reason
        pytest.skip(f"no headless GL context: {e}")
    assert (
        main(
            [
                "run",
                "plummer",
                "--n",
                "256",
                "--backend",
                "toy",
                "--headless",
                "--frames",
                "6",
                "--size",
                "320x200",
            ]
        )
        == 0
    )
    assert "toy-fp32 N=256" in capsys.readouterr().out


def test_mpi_ranks_take_the_toy(toy, tmp_path):
    """Two MPI ranks of the toy (its device kind's rank devices) write what one process writes."""
    from test_mpi import HAVE_MPI4PY, MPIEXEC, job_env

    if MPIEXEC is None or not HAVE_MPI4PY:
        pytest.skip("no mpiexec / mpi4py here")
    boot = (
        "import sys; sys.path.insert(0, 'tests'); from app.core.backend_table import register_backend; "
        "register_backend('toy', 'toy_backend'); from app.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    args = ["simulate", "plummer", "--n", "301", "--steps", "20", "--backend", "toy", "--no-progress"]

    def job(out, launcher=()):
        return subprocess.run(
            [*launcher, sys.executable, "-c", boot, *args, "--out", str(out)],
            capture_output=True,
            text=True,
            timeout=120,
            env=job_env(),
            cwd=ROOT,
        )

    one, many = job(tmp_path / "one.npz"), job(tmp_path / "many.npz", (MPIEXEC, "-n", "2"))
    assert one.returncode == 0 and many.returncode == 0, many.stderr
    assert "on 2 ranks" in many.stdout
    a, b = np.load(tmp_path / "one.npz"), np.load(tmp_path / "many.npz")
    assert np.array_equal(a["pos"], b["pos"]) and np.array_equal(a["vel"], b["vel"])


# --- tunables: one store, one rule for what a change invalidates ----------------------------------------
def _tree_backends():
    from app.backends.cpu import CPUBackend
    from app.backends.multi import multi_backend_class

    yield pytest.param(CPUBackend, id="cpu")
    yield pytest.param(multi_backend_class(CPUBackend, 2, "single"), id="cpu-devices-2")
    yield pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)


@pytest.mark.parametrize("cls", list(_tree_backends()))
def test_a_tunables_change_drops_the_cached_forces(cls):
    """The rule of TunablesPerKernel, on each backend: after set_tunables the next step evaluates a(x)
    afresh with the new values, so it continues exactly as a fresh load of the same state with those
    values does (a kept a(x) from the old theta would make the first kick differ)."""
    from app.backends import backend_class
    from app.model.ics import generate
    from app.model.physics import Physics

    cls = backend_class(cls) if isinstance(cls, str) else cls
    kernel = next(r.name for r in cls.kernels() if r.approximate)  # the tree: theta changes its a(x)
    physics = Physics(softening=0.05, dt=0.01)
    changed, fresh = cls(), cls()
    try:
        changed.load(generate("plummer", 2048, 3), physics, kernel=kernel)
        changed.set_tunables(theta=0.9, rebuild_every=1)
        changed.step(1)
        fresh.load(changed.state(), physics, kernel=kernel)
        fresh.set_tunables(theta=0.3, rebuild_every=1)
        changed.set_tunables(theta=0.3)
        assert changed.tunables()["theta"] == fresh.tunables()["theta"] == 0.3
        changed.step(1)
        fresh.step(1)
        a, b = changed.state(), fresh.state()
        assert np.array_equal(a.vel, b.vel) and np.array_equal(a.pos, b.pos)
        changed.clear_tunables()  # back to the record's defaults, by the same rule
        assert changed.tunables() == changed.record(kernel).default_tunables()
    finally:
        changed.close()
        fresh.close()
