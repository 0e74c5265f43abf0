"""Soak: many kernel switches, reloads with varied N and long stepping leave memory flat and the state finite.

GPU (marked gpu and slow; run on the GPU machine whenever the CUDA backend changes): 1,000 kernel
switches over every record at N = 65,536 (one step after each), 50 reloads with varied N, 3,000 steps;
the device's free memory must end within 64 MiB of where it started after the first load (compiled
modules, the tuning cache and scratch buffers are allocated once and reused).

CPU (CI): the same cycle over the CPU records at a size CI can afford; the process's peak traced Python
allocations must stay flat across the cycle (a leak of one state per reload would show), the state
finite.
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from app.backends import backend_class
from app.model.physics import Physics
from app.tools.bench import bench_bodies

PHYSICS = Physics(softening=0.05, dt=1e-4)


def _soak(backend, names: list[str], n: int, switches: int, reloads: int, steps: int, sizes) -> None:
    backend.load(bench_bodies(n), PHYSICS, kernel=names[0])
    for i in range(switches):
        backend.set_kernel(names[i % len(names)])
        backend.step(1)
    for i in range(reloads):
        backend.load(bench_bodies(sizes[i % len(sizes)], seed=i), PHYSICS, kernel=names[i % len(names)])
        backend.step(1)
    backend.load(bench_bodies(n), PHYSICS, kernel=names[0])
    for _ in range(steps // 100):
        backend.step(100)
    state = backend.state()
    assert np.isfinite(state.pos).all() and np.isfinite(state.vel).all()


def test_cpu_soak_keeps_memory_flat():
    cls = backend_class("cpu")
    if cls.why_not():
        pytest.skip(cls.why_not())
    names = [r.name for r in cls.kernels() if r.max_n is None or r.max_n >= 1024]
    backend = cls()
    try:
        sizes = [4096, 300, 2048, 512, 3001]  # a state of 4,096 bodies is 0.4 MiB: a leaked one shows
        _soak(backend, names, 512, 40, 5, 200, sizes)  # warm: compiles, caches, first buffers
        tracemalloc.start()
        _soak(backend, names, 512, 40, 5, 200, sizes)
        first = tracemalloc.get_traced_memory()[0]
        _soak(backend, names, 512, 200, 25, 600, sizes)
        grown = tracemalloc.get_traced_memory()[0] - first
        tracemalloc.stop()
    finally:
        backend.close()
    assert grown < 2**20, f"traced Python memory grew by {grown / 2**20:.2f} MiB over the soak"


@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_soak_keeps_device_memory_flat():
    cls = backend_class("cuda")
    n = 65536
    names = [r.name for r in cls.kernels() if r.max_n is None or r.max_n >= n]
    backend = cls()
    try:
        backend.load(bench_bodies(n), PHYSICS, kernel=names[0])
        for name in names:  # every module loaded and every plan's scratch allocated once
            backend.set_kernel(name)
            backend.step(1)
        free_start, _total = backend.device.mem_get_info()
        _soak(backend, names, n, 1000, 50, 3000, [4096, 65536, 100_000, 12_345, 131_072])
        free_end, _total = backend.device.mem_get_info()
    finally:
        backend.close()
    lost = free_start - free_end
    print(f"\nGPU soak: device memory fell by {lost / 2**20:.1f} MiB ({len(names)} records, 1,000 switches)")
    assert lost < 64 * 2**20, f"device memory fell by {lost / 2**20:.1f} MiB over the soak"
