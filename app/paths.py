"""Where the project's non-Python resources live.

shaders/, kernels/ and assets/ sit beside the `app` package at the top of the checkout (the client's layout);
the project is installed editable, so these resolve to the checkout's own folders.
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHADERS = ROOT / "shaders"
KERNELS = ROOT / "kernels"
ASSETS = ROOT / "assets"
SCENES = ASSETS / "scenes"
# Published initial conditions shared beside the checkout; tests and demos read them, never copy them.
SHARED_DATA = ROOT.parent / "shared" / "data"
