"""What the hot reload's sandbox relies on (app/backends/cuda/kernel_trial.py), measured on the device:

- how long a child process takes to have a CUDA context and a loaded module (the sandbox's start);
- how a parent's small launches fare while a child's kernel never ends (the GPU time-slices the two
  contexts);
- how long killing the child takes, and whether the parent's launches are back to normal at once (the
  driver frees the child's context, and the hung kernel with it).

    python3 bench/reload_hang_probe.py     # prints the four figures (bench/results/*-reload-facts.txt)
"""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pycuda.driver as drv
from pycuda.compiler import SourceModule

CHILD = r"""
import time
t0 = time.perf_counter()
import pycuda.driver as drv
drv.init()
context = drv.Device(0).retain_primary_context()
context.push()
from pycuda.compiler import SourceModule
module = SourceModule("__global__ void hang(int *f) { while (f[0] == 0) {} }")
flag = drv.mem_alloc(4)
drv.memset_d32(flag, 0, 1)
print(f"child ready {time.perf_counter() - t0:.3f} s", flush=True)
module.get_function("hang")(flag, block=(32, 1, 1), grid=(132, 1))
drv.Context.synchronize()
print("the child's kernel ended?!", flush=True)
"""


def main() -> None:
    drv.init()
    context = drv.Device(0).retain_primary_context()
    context.push()
    try:
        add = SourceModule(
            "__global__ void add(float *a) { a[threadIdx.x + blockIdx.x * blockDim.x] += 1.f; }"
        )
        buf = drv.mem_alloc(4 * 1024 * 1024)

        def tick() -> float:
            t = time.perf_counter()
            add.get_function("add")(buf, block=(256, 1, 1), grid=(4096, 1))
            drv.Context.synchronize()
            return (time.perf_counter() - t) * 1e3

        print(f"parent before: median {np.median([tick() for _ in range(50)]):.3f} ms a launch")
        t0 = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
        assert child.stdout is not None
        print(f"{child.stdout.readline().strip()} (spawn to ready, wall: {time.perf_counter() - t0:.3f} s)")
        time.sleep(0.5)
        during = [tick() for _ in range(20)]
        print(f"parent during the hang: median {np.median(during):.2f} ms, max {max(during):.2f} ms a launch")
        t0 = time.perf_counter()
        child.kill()
        child.wait()
        killed = time.perf_counter() - t0
        after = [tick() for _ in range(20)]
        first, median = after[0], np.median(after)
        print(f"kill + wait {killed:.3f} s; parent after: first {first:.2f} ms, median {median:.2f} ms")
    finally:
        context.pop()


if __name__ == "__main__":
    main()
