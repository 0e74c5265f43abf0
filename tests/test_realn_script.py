"""bench/realn.sh (run on the GPU machine) parses, and its scene is what it says: bodies reach |x| ≈ 20."""

import re
import subprocess
from pathlib import Path

import numpy as np

from app.scene import load_scene, make_bodies

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "realn.sh"


def test_script_parses():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True)


def test_scene_reaches_twenty():
    text = SCRIPT.read_text()
    sets = dict(re.findall(r"--set (initial\.\w+)=([\d.]+)", text))
    assert {"initial.separation", "initial.radius", "initial.pericentre"} <= set(sets)
    bodies = make_bodies(load_scene("collision", {**sets, "initial.n": 8192}))
    assert 17 < np.abs(bodies.pos).max() < 23
