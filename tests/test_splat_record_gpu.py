"""Issue 24's recording acceptance on a GPU (gpu-marked; the 8M cases also `slow`): `record` as a user runs
it, in processes of its own, drawing the default style (`auto`: splat from 262,144 bodies on CUDA).

- Two recordings of the same command are the same bytes (the splat's integer sums are order-free;
  app/render/splat.py), at 1M and at 8M bodies: 1920x1080, 30 frames, the tree.
- The collision preset is not burnt out at 1M and at 8M bodies, at the start and after the galaxies' first
  passage (pericentre at t ~ 6 on the parabolic orbit, separation 6 and pericentre 1: frame 1 is t = 7,
  3,500 steps of dt 0.002): under 2% of the lit pixels white, and the mean brightness over the pixels lit
  in either frame within 20% between 1M and 8M (tests/test_splat_look.py's figures, which the CPU twin
  checks at the start in CI).

The 8M recordings take minutes (3,500 tree steps at 8M), hence `slow`: `pytest -m "gpu and slow"`. The
figures go to $NBODY_RESULTS/splat-record-gpu.txt when that is set (the device scripts set it).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image
from test_splat_look import look_figures

pytestmark = pytest.mark.gpu  # (skipped where CUDA cannot run: tests/conftest.py)

SIZE = "1920x1080"
PASSAGE_STEPS = 3500  # t = 7: past the pericentre at t ~ 6 (the module docstring)
MILLION, EIGHT_MILLION = 1 << 20, 1 << 23
SIZES = [MILLION, pytest.param(EIGHT_MILLION, marks=pytest.mark.slow)]


def results(line: str) -> None:
    folder = os.environ.get("NBODY_RESULTS")
    print(line)
    if folder:
        with open(os.path.join(folder, "splat-record-gpu.txt"), "a") as f:
            f.write(line + "\n")


def record(*argv: str, timeout: float = 900) -> str:
    """`nbody-live record ARGV` in a process of its own; its output, or a failure with its last lines."""
    env = {**os.environ, "NBODY_HEADLESS": "1"}
    cmd = [sys.executable, "-m", "app", "record", "--no-progress", *argv]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(cmd[2:])}: exit {done.returncode}\n{out[-2000:]}"
    return out


@pytest.mark.parametrize("n", SIZES)
def test_two_recordings_of_the_same_command_are_the_same_bytes(tmp_path, n):
    pytest.importorskip("av", reason="recording H.264 needs PyAV (the device kit's .kit-av wheel)")
    args = ("collision", "--n", str(n), "--kernel", "tree", "--size", SIZE, "--fps", "60", "--frames", "30")
    digests = []
    for run in (1, 2):
        out = tmp_path / f"run{run}.mp4"
        said = record(*args, "--out", str(out))
        assert "CUDA-GL interop" in said, said  # the splat draws from the interop buffers
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
        rate = next((line for line in said.splitlines() if "per wall second" in line), "no rate line")
        results(f"N = {n:,} recording {run}: sha256 {digests[-1]} ({rate})")
    assert digests[0] == digests[1]


@pytest.fixture(scope="module")
def passage_frames(tmp_path_factory):
    """N -> [the frame at the start, the frame after the first passage], as PNGs of `record --frames-dir`
    (frame i is the state after i x --steps-per-frame steps), decoded."""
    frames: dict[int, list[np.ndarray]] = {}

    def of(n: int) -> list[np.ndarray]:
        if n not in frames:
            folder = tmp_path_factory.mktemp(f"collision-{n}")
            record(
                "collision", "--n", str(n), "--kernel", "tree", "--size", SIZE, "--fps", "1",
                "--frames", "2", "--steps-per-frame", str(PASSAGE_STEPS), "--frames-dir", str(folder),
            )  # fmt: skip
            frames[n] = [np.asarray(Image.open(folder / f"frame_{i:06d}.png")) for i in (0, 1)]
        return frames[n]

    return of


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("when", [0, 1], ids=["start", "after-passage"])
def test_the_recorded_collision_is_not_burnt_out(passage_frames, n, when):
    lit, white, _ = look_figures({n: passage_frames(n)[when]})
    results(f"N = {n:,} frame {when}: {lit[n]:.2%} of the frame lit, {white[n]:.2%} of the lit pixels white")
    assert lit[n] > 0.01, f"N = {n:,}: {lit[n]:.2%} of the frame lit"  # a scene, not a black frame
    assert white[n] < 0.02, f"N = {n:,}: {white[n]:.2%} of the lit pixels white"


@pytest.mark.slow
@pytest.mark.parametrize("when", [0, 1], ids=["start", "after-passage"])
def test_the_recorded_collision_is_as_bright_at_1m_as_at_8m(passage_frames, when):
    _, _, means = look_figures({n: passage_frames(n)[when] for n in (MILLION, EIGHT_MILLION)})
    ratio = means[EIGHT_MILLION] / means[MILLION]
    results(f"frame {when}: mean over the pixels lit in either, 1M {means[MILLION]:.1f}, 8M "
            f"{means[EIGHT_MILLION]:.1f}: {ratio:.2f}x")  # fmt: skip
    assert 0.8 < ratio < 1.2, means
