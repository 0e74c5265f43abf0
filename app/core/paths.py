"""Where the project's non-Python resources live.

shaders/, kernels/ and assets/ sit beside the `app` package at the top of the checkout (the client's layout);
the project is installed editable, so these resolve to the checkout's own folders.
"""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # app/core/paths.py -> the checkout
SHADERS = ROOT / "shaders"
KERNELS = ROOT / "kernels"
ASSETS = ROOT / "assets"
SCENES = ASSETS / "scenes"
# Published initial conditions shared beside the checkout; tests and demos read them, never copy them.
SHARED_DATA = ROOT.parent / "shared" / "data"


def cache_dir(kind: str) -> Path:
    """The user cache folder for one kind of cached thing ('cuda' cubins, 'tune' results):
    $NBODY_CACHE_DIR/<kind>, else platformdirs' user cache dir, else ~/.cache/nbody-live/<kind>."""
    env = os.environ.get("NBODY_CACHE_DIR")
    if env:
        return Path(env) / kind
    try:
        from platformdirs import user_cache_dir

        return Path(user_cache_dir("nbody-live")) / kind
    except ImportError:
        return Path.home() / ".cache" / "nbody-live" / kind
