"""Values as they are typed on a command line or in a scene file, before a key's type is known: a device
count (`--gpus N|all`), a [run.tunables] table, a scalar (a number, else text), a KEY=VALUE assignment."""

from __future__ import annotations

from app.core.errors import ConfigError


def parse_device_count(text, key: str = "--gpus") -> int | str:
    """A `--gpus` / run.gpus value: a whole number >= 1, or "all"; ConfigError naming `key` and the forms."""
    value = str(text).strip().lower()
    if value == "all":
        return "all"
    if value.isdigit() and int(value) >= 1 and not isinstance(text, bool):
        return int(value)
    raise ConfigError(f"{key} = {text!r}: expected a number of devices >= 1, or all (e.g. --gpus 2)")


def tunables_table(key: str, value) -> dict:
    """A [run.tunables] table: names to whole numbers, numbers or text (a string from the command line
    becomes the first of those it reads as). The kernel's own record validates the values, once the run
    knows which kernel it takes (KernelRecord.validate_tunables, naming record.key and the range)."""
    if not isinstance(value, dict):
        raise ConfigError(
            f"{key} = {value!r}: expected a table of NAME = VALUE, e.g. [run.tunables] theta = 0.6"
        )
    out = {}
    for name, item in value.items():
        if isinstance(item, bool) or not isinstance(item, int | float | str):
            raise ConfigError(f"{key}.{name} = {item!r}: expected a number or text")
        out[str(name)] = scalar_value(item) if isinstance(item, str) else item
    return out


def scalar_value(text: str):
    """A whole number, else a number, else the text itself (a Choice's option)."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def parse_assignment(text: str) -> tuple[str, str]:
    """'physics.dt=0.002' -> ('physics.dt', '0.002') for the CLI's --set."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip():
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. --set physics.dt=0.002")
    return key.strip(), value.strip()
