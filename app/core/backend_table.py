"""The one table of backends: each backend's name and the module that defines it (its `BACKEND` class).

Best first: "auto" picks the first available one. The settings read the names from here (run.backend's
choices), app/backends/__init__.py imports the modules from here, and nothing else lists them. A new
backend is one module defining `BACKEND` (a Backend subclass whose `name` is its key here) plus one line:

    register_backend("mine", "my_package.my_backend")

Kept free of imports so that the lowest layer (the settings) can read it.
"""

from __future__ import annotations

_MODULES: dict[str, str] = {"cuda": "app.backends.cuda", "cpu": "app.backends.cpu"}


def register_backend(name: str, module: str, first: bool = False) -> None:
    """Add (or move) backend `name`, defined by `module`'s BACKEND; `first`: before the others, so that
    "auto" tries it first. ValueError for a name that the settings could not tell from "auto"."""
    if not name or name == "auto" or not name.replace("-", "").isalnum():
        raise ValueError(f"backend name {name!r}: letters, digits and '-', and not 'auto'")
    _MODULES.pop(name, None)
    items = {name: module, **_MODULES} if first else {**_MODULES, name: module}
    _MODULES.clear()
    _MODULES.update(items)


def backend_names() -> tuple[str, ...]:
    """Every registered backend, best first."""
    return tuple(_MODULES)


def backend_module(name: str) -> str | None:
    return _MODULES.get(name)


def backend_choices() -> tuple[str, ...]:
    """What run.backend / --backend accept: auto, then every registered backend."""
    return ("auto", *_MODULES)
