"""The GPU tree's accuracy and time split per θ (a supplement to `nbody-live bench`, which has no θ sweep
or error sample yet): for each N (the bench's seeded Plummer sphere) and θ, the mean time of 5
evaluations after one warm-up, the CUDA-event time per stage, interactions per body, and the relative
error of 4,096 random targets against the float64 all-pairs reference on the GPU.

    source .kit/setup.sh && python3 bench/tree_accuracy.py 1048576,8388608 0.3,0.5,0.6,0.7,0.9 OUT.json
"""
import json
import sys
import time

import numpy as np

from app.backends.cuda.device import CudaDevice
from app.backends.cuda.registry import RECORDS
from app.bench import bench_bodies
from app.commands.reference import reference_accelerations
from app.forces import Span
from app.outputs import atomic_write, check_output
from app.physics import Physics, relative_errors

out_path = check_output(sys.argv[3], "results") if len(sys.argv) > 3 else None  # before the work
rec = next(r for r in RECORDS if r.name == "tree")
dev = CudaDevice(0)
phys = Physics(softening=0.01)
rows_out = []
for n in [int(x) for x in sys.argv[1].split(",")]:
    b = bench_bodies(n)
    pos = b.pos4(np.float32)
    with dev.scope:
        p = dev.scratch("p", 16 * n)
        a = dev.scratch("a", 16 * n)
        dev.drv.memcpy_htod(p, pos)
    for theta in [float(x) for x in sys.argv[2].split(",")]:
        for group in (64,):
            ev = rec.policy.evaluator(rec, dev, {})
            ev.set_physics(phys)
            ev.set_tunables(theta=theta, group=group)
            ev.prepare(n)
            ev.evaluate(p, a, Span.all(n), Span.all(n))
            ev.stage_ms()
            reps = 5
            t0 = time.perf_counter()
            for _ in range(reps):
                w = ev.evaluate(p, a, Span.all(n), Span.all(n))
            wall = (time.perf_counter() - t0) / reps * 1e3
            st = {k: v / reps for k, v in ev.stage_ms().items()}
            acc = np.empty((n, 4), np.float32)
            with dev.scope:
                dev.drv.memcpy_dtoh(acc, a)
            rows = np.random.default_rng(1).choice(n, min(n, 4096), replace=False)
            pp = pos.astype(np.float64)
            ref = reference_accelerations(pp[:, :3], pp[:, 3], phys, rows, "cuda")
            rel = relative_errors(acc[rows, :3].astype(np.float64), ref)
            stages = " ".join(f"{k} {v:.2f}" for k, v in st.items())
            print(f"N={n:>9,} theta={theta} group={group}: mean wall {wall:7.2f} ms  "
                  f"gpu {sum(st.values()):7.2f}  "
                  f"{stages}  inter/body {w.interactions / n:.0f} cells {ev.levels[-1]} "
                  f"levels {len(ev.levels) - 1}  p50 {np.median(rel):.2e} p99 {np.percentile(rel, 99):.2e} "
                  f"max {rel.max():.2e}", flush=True)
            rows_out.append({"n": n, "theta": theta, "group": group, "wall_ms": wall, "stages_ms": st,
                             "interactions_per_body": w.interactions / n,
                             "body_cell_per_body": w.body_cell / n,
                             "cells": ev.levels[-1], "levels": len(ev.levels) - 1,
                             "rel_err": {"p50": float(np.median(rel)), "p99": float(np.percentile(rel, 99)),
                                         "max": float(rel.max())}, "sample": int(rows.size)})
if out_path is not None:
    with atomic_write(out_path, "w", "results") as f:
        json.dump({"device": dev.facts.name, "physics": "plummer (app.bench.bench_bodies), softening 0.01",
                   "rows": rows_out}, f, indent=1)
dev.close()
