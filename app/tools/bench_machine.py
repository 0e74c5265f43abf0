"""What a `bench` result (app.tools.bench) records about where it ran, and what it is compared with: the
git commit, the backend's device facts, and the reference lines its plot draws dashed (the FP32 issue
limit, the CUDA samples' nbody on an H200).
"""

from __future__ import annotations

import os
import subprocess

from app.core.paths import ROOT

# DESIGN.md: 12 FP32 instructions per interaction, 128 lanes x 132 SMs x 1.98 GHz (H100/H200).
DEFAULT_GPU_FP32_LIMIT = 128 / 12 * 132 * 1.98e9
# DESIGN.md: the NVIDIA CUDA-samples nbody kernel on a lent H200 (fp32, block 256), interactions/s.
CUDA_SAMPLES_H200 = {4096: 120e9, 16384: 495e9, 65536: 1409e9, 131072: 1461e9, 1048576: 1575e9}


def git_commit() -> dict:
    def run(*args):
        try:
            out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.SubprocessError):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    # A stated commit wins: a copied checkout may come without .git, or with a stale one.
    if os.environ.get("NBODY_GIT_COMMIT"):
        return {"commit": os.environ["NBODY_GIT_COMMIT"], "dirty": None}
    commit = run("rev-parse", "HEAD")
    status = run("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def device_info(backend) -> dict:
    """The backend's own device facts (Backend.device_info), or its name alone."""
    try:
        info = backend.device_info()
    except Exception as e:  # facts are nice to have; the numbers still count
        return {"name": f"unknown ({e})"}
    return (
        dict(info)
        if info is not None
        else {"name": f"unknown ({backend.name} says nothing)", "backend": backend.name}
    )


def reference_lines(gpu: bool, fp32_limit: float | None) -> list[dict]:
    """What a result is compared with, stored in its JSON (`references`) and drawn dashed by the plot:
    `{"label", "interactions_per_s"}` is a constant, `{"label", "points": [[N, rate], ...]}` a series."""
    refs = []
    if fp32_limit:
        refs.append(
            {
                "label": f"FP32 issue limit {fp32_limit / 1e9:,.0f} G/s (12 FP32 instr./interaction)",
                "interactions_per_s": fp32_limit,
            }
        )
    elif gpu:  # the device did not say: DESIGN.md's estimate for the GPUs we are lent
        refs.append(
            {
                "label": f"FP32 issue limit H100/H200 ≈ {DEFAULT_GPU_FP32_LIMIT / 1e9:,.0f} G/s "
                "(12 FP32 instr./interaction)",
                "interactions_per_s": DEFAULT_GPU_FP32_LIMIT,
            }
        )
    if gpu:
        refs.append(
            {
                "label": "CUDA samples nbody, H200 (DESIGN.md)",
                "points": [[n, v] for n, v in sorted(CUDA_SAMPLES_H200.items())],
            }
        )
    return refs
