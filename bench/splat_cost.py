"""The splat draw style's cost per stage on one GPU (issue 24's "draw <= 1.0 ms at 16M, <= 0.3 ms at 1M,
1920x1080"), and a look at the frames it draws.

The scene is the `collision` preset's bodies (its own generator, seeded, at --base N) with the preset's
camera and render settings (colour by speed, inferno). Larger N are that state with each body copied
N / base times, every copy moved by a seeded Gaussian of --jitter times the 90%-radius: the same density
profile with more bodies, so that the cost is measured on the crowding a real collision has, without
generating 16M bodies on the CPU for minutes. Each size is drawn in the state's own order and, with
--sorted, in Morton order (what a spatially sorted state would buy in atomic contention).

    python3 bench/splat_cost.py --sizes 1M,8M,16M --out results.json --png-dir DIR
prints one line per (N, order) and writes the medians (ms) per stage plus the frames' look figures, the
file rewritten after each size (an interrupted run keeps the sizes done). Every body is drawn (the
preset's hidden halos too): the cost of all N.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from app.commands.options import parse_size
from app.core.errors import RuntimeFault
from app.core.outputs import atomic_write, check_output
from app.model import components as comps
from app.model.bodies import speeds as body_speeds
from app.render.camera import OrbitCamera
from app.render.canvas import bodies_extent
from app.render.splat import SOURCE, SplatParams, SplatView
from app.render.splat_cuda import STAGES, CudaSplatter, chunk_for
from app.render.splat_light import body_light
from app.scene import load_scene, make_bodies


def size_arg(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 1 << 10, "M": 1 << 20}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)


def base_state(name: str, n: int, seed: int):
    """The scene `name` with N bodies from `seed`, as `run` and `record` make them (app.scene.make_bodies):
    (scene, float32 [x, y, z, m] rows, float32 speeds, components)."""
    scene = load_scene(name, {"initial.n": n, "initial.seed": seed})
    b = make_bodies(scene)
    return scene, b.pos4(), body_speeds(b.vel), b.components


def grown(pos4: np.ndarray, speeds: np.ndarray, n: int, jitter: float, seed: int):
    """`pos4` copied to n rows, each copy moved by a seeded Gaussian of `jitter` (absolute) per axis."""
    reps = -(-n // len(pos4))
    pos = np.tile(pos4, (reps, 1))[:n]
    rng = np.random.default_rng(seed)
    pos[len(pos4) :, :3] += rng.normal(scale=jitter, size=(n - len(pos4), 3)).astype(np.float32)
    pos[:, 3] = pos4[:, 3].sum() / n
    return pos, np.tile(speeds, reps)[:n]


def morton_order(pos: np.ndarray) -> np.ndarray:
    lo, hi = pos[:, :3].min(axis=0), pos[:, :3].max(axis=0)
    q = ((pos[:, :3] - lo) / np.maximum(hi - lo, 1e-30) * 1023).astype(np.uint64)
    key = np.zeros(len(pos), np.uint64)
    for bit in range(10):
        for axis in range(3):
            key |= ((q[:, axis] >> np.uint64(bit)) & np.uint64(1)) << np.uint64(3 * bit + axis)
    return np.argsort(key, kind="stable")


class StageTimer:
    """CUDA events around each stage on the splatter's stream; ms per stage of the last frame."""

    def __init__(self, drv, stream, breakdown: bool):
        self.drv, self.stream, self.ms, self.breakdown = drv, stream, {}, breakdown

    @contextmanager
    def __call__(self, stage: str):
        if "." in stage and not self.breakdown:  # a part of a stage: timing it syncs in between
            yield
            return
        a, b = self.drv.Event(), self.drv.Event()
        a.record(self.stream)
        yield
        b.record(self.stream)
        b.synchronize()
        self.ms[stage] = a.time_till(b)


def time_one(splatter, timer, pos_ptr, n, view, light, params, spd_ptr, method, reps) -> dict:
    """Medians over `reps` frames (3 more first, untimed) of each stage's GPU time and the wall time."""
    for _ in range(3):
        splatter.draw(pos_ptr, n, view, light, params, values=spd_ptr, method=method)
    per_stage: dict[str, list[float]] = {}
    walls = []
    for _ in range(reps):
        w0 = time.perf_counter()
        frame = splatter.draw(pos_ptr, n, view, light, params, values=spd_ptr, timer=timer, method=method)
        frame.exposure  # noqa: B018 - draw queues the frame; the wall time is until it is done
        walls.append(1e3 * (time.perf_counter() - w0))
        for s, ms in timer.ms.items():
            per_stage.setdefault(s, []).append(ms)
        timer.ms = {}
    med = {s: statistics.median(v) for s, v in per_stage.items()}
    return {
        "n": n, "method": method, "width": params.width, "height": params.height, "ms": med,
        "gpu_ms": sum(v for k, v in med.items() if k in STAGES),  # (the exposure is a kernel too)
        "wall_ms": statistics.median(walls),
        "image": splatter.read_image(frame),
    }  # fmt: skip


def look(image: np.ndarray) -> dict:
    rgb = image[..., :3]
    lit = rgb.max(axis=2) > 0
    white = (rgb == 255).all(axis=2)
    return {
        "lit_fraction": float(lit.mean()),
        "white_of_lit": float(white[lit].mean()) if lit.any() else 0.0,
        "mean_of_lit": float(rgb[lit].mean()) if lit.any() else 0.0,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scene", default="collision")
    ap.add_argument("--sizes", default="1M,8M,16M")
    ap.add_argument("--base", default="1M", help="bodies generated; larger sizes copy them (default 1M)")
    ap.add_argument("--jitter", type=float, default=0.004, help="copies' offset, times the 90%% radius")
    ap.add_argument("--size", default="1920x1080")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--sorted", action="store_true", help="also time each size in Morton order")
    ap.add_argument("--methods", default="binned,direct", help="accumulations to time (splat_cuda.METHODS)")
    ap.add_argument(
        "--chunks", default="auto", help="splat_tiles' records per block to time: auto or numbers"
    )
    ap.add_argument(
        "--bloom", type=float, default=0.0, help="render.bloom (0: off); its kernels: stage 'bloom'"
    )
    ap.add_argument("--bloom-radius", type=float, default=6.0, help="render.bloom_radius, pixels (default 6)")
    ap.add_argument("--breakdown", action="store_true", help="also time the binned path's kernels (syncs)")
    ap.add_argument("--define", action="append", default=[], help="a -D for splat.cu (a variant to time)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--png-dir", type=Path)
    args = ap.parse_args(argv)
    width, height = parse_size(args.size)
    try:
        check_output(args.out, "the results")  # before minutes of work, not after them
    except RuntimeFault as e:
        print(f"splat_cost: {e}", file=sys.stderr)
        return 2

    from app.backends.cuda.device import CudaDevice

    device = CudaDevice(0)
    from app.backends.cuda.compile import FILE_OPTIONS

    defines = tuple(f"-D{d}" for d in args.define)
    splatter = CudaSplatter(device, options=FILE_OPTIONS[SOURCE] + defines if defines else None)
    timer = StageTimer(device.drv, splatter.stream, args.breakdown)
    t0 = time.perf_counter()
    scene, pos0, speeds0, parts = base_state(args.scene, size_arg(args.base), args.seed)
    print(f"{args.scene}: {len(pos0):,} bodies generated in {time.perf_counter() - t0:.1f} s", flush=True)
    ext, com = bodies_extent(pos0)
    cam = OrbitCamera.from_settings(scene.camera, ext, com, aspect=width / height)
    view = SplatView.of(cam, (width, height))
    params = SplatParams(width, height, bloom=args.bloom, bloom_radius=args.bloom_radius)
    speed_scale = float(np.percentile(speeds0, 95))
    rows: list[dict] = []
    facts = {"device": device.name, "scene": args.scene, "jitter": args.jitter, "defines": args.define}
    facts |= {"bloom": args.bloom, "bloom_radius": args.bloom_radius}
    for n in (size_arg(s) for s in args.sizes.split(",")):
        pos, spd = grown(pos0, speeds0, n, args.jitter * ext, args.seed + n)
        for order in ("state", "morton") if args.sorted else ("state",):
            if order == "morton":
                perm = morton_order(pos)
                pos, spd = pos[perm], spd[perm]
            drawn = comps.drawn(None, {})
            light = body_light(scene.render, drawn, n, speed_scale=speed_scale, mean_mass=float(pos[0, 3]))
            pos_ptr = device.scratch("bench-pos", pos.nbytes)
            spd_ptr = device.scratch("bench-speed", spd.nbytes)
            with device.scope:
                device.drv.memcpy_htod(pos_ptr, np.ascontiguousarray(pos))
                device.drv.memcpy_htod(spd_ptr, np.ascontiguousarray(spd))
            methods = args.methods.split(",")
            tries = [(m, None) for m in methods if m != "binned"]
            if "binned" in methods:
                tries += [("binned", None if c == "auto" else int(c)) for c in args.chunks.split(",")]
            for method, chunk in tries:
                splatter.chunk = chunk
                row = time_one(splatter, timer, pos_ptr, n, view, light, params, spd_ptr, method, args.reps)
                rows.append(row)
                row.update(order=order, chunk=chunk or chunk_for(n), **look(row.pop("image")))
                med = row["ms"]
                stages = ", ".join(f"{k} {v:.3f}" for k, v in med.items())
                print(
                    f"N={n:>10,} {order:6s} {method:6s} chunk {row['chunk']:>5} gpu {row['gpu_ms']:.3f} ms "
                    f"({stages}), "
                    f"wall {row['wall_ms']:.3f} ms; lit {row['lit_fraction']:.1%}, "
                    f"white {row['white_of_lit']:.2%}",
                    flush=True,
                )
            if args.png_dir:
                from PIL import Image

                args.png_dir.mkdir(parents=True, exist_ok=True)
                image = splatter.read_image(splatter.draw(pos_ptr, n, view, light, params, values=spd_ptr))
                Image.fromarray(image[..., :3]).save(args.png_dir / f"splat-{args.scene}-{n}-{order}.png")
        with atomic_write(args.out, "w", what="the results") as f:  # after each size: Ctrl-C keeps these
            json.dump({**facts, "rows": rows}, f, indent=1)
    device.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
