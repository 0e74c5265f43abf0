"""Compare per-frame timings CSVs (`run --timings`) against a base: the median frame time of each and
what it adds over the base, with a bound.

    python3 bench/frames_compare.py BASE.csv OTHER.csv [MORE.csv ...] [--max-extra-ms 0.1] [--skip 5]

Prints one line per file (median frame, force, map+unmap, draw, outside the force, over the frames after
the first `--skip`), then for each other file its median frame minus the base's. Exit status 0 when every
one adds at most `--max-extra-ms`, 1 when one adds more, 2 for a missing or unreadable file.
Issue 15's bar: `run --gpus 1` (the driver, GPU 0's interop) at most 0.1 ms a frame over one GPU at 65,536.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere in the checkout

from app.core.errors import RuntimeFault  # noqa: E402
from app.render.frames import FrameLog  # noqa: E402


def line(name: str, m: dict) -> str:
    return (
        f"{name}: {m['frames']} frames, median frame {m['frame_ms']:.3f} ms, force {m['force_ms']:.3f}, "
        f"map+unmap {m['map_ms'] + m['unmap_ms']:.3f}, draw {m['draw_ms']:.3f}, "
        f"upload {m['upload_ms']:.3f}, outside force {m['outside_force_ms']:.3f}"
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="the base CSV (e.g. one GPU without the driver)")
    parser.add_argument("others", nargs="+", help="CSVs compared with it (e.g. --gpus 1)")
    parser.add_argument("--max-extra-ms", type=float, default=0.1, help="bound on median frame - base's")
    parser.add_argument("--skip", type=int, default=5, help="warm-up frames left out (default 5)")
    args = parser.parse_args(argv)
    try:
        medians = {p: FrameLog.read_csv(p).medians(args.skip) for p in (args.base, *args.others)}
    except RuntimeFault as e:
        print(f"frames_compare: {e}", file=sys.stderr)
        return 2
    if not all(medians.values()):
        empty = [p for p, m in medians.items() if not m]
        print(f"frames_compare: no frames in {', '.join(empty)}", file=sys.stderr)
        return 2
    for path, m in medians.items():
        print(line(path, m))
    base = medians[args.base]
    worst = 0.0
    for path in args.others:
        extra = medians[path]["frame_ms"] - base["frame_ms"]
        extra_outside = medians[path]["outside_force_ms"] - base["outside_force_ms"]
        worst = max(worst, extra)
        verdict = "ok" if extra <= args.max_extra_ms else f"OVER the {args.max_extra_ms} ms bound"
        print(
            f"{path}: {extra:+.3f} ms a frame over the base (outside the force {extra_outside:+.3f} ms): "
            f"{verdict}"
        )
    return 0 if worst <= args.max_extra_ms else 1


if __name__ == "__main__":
    sys.exit(main())
