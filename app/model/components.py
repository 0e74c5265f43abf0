"""Components: which part of a model each body belongs to (a galaxy's disk, bulge or halo; Tipsy's gas,
dark and star), and how each part is drawn. Gravity never looks at them: hidden bodies still feel and
exert every force; only the renderer reads them.

    comp = Components.from_sizes([("bulge", 2000), ("disk", 8000)])   # contiguous blocks of rows
    comp.names, comp.index                                             # ("bulge", "disk"), (N,) uint8

Where they come from:

* Tipsy files: one component per non-empty section (gas, dark, star). When the file carries Bonsai's
  particle IDs (see app.model.formats), their ranges name the parts instead: IDs below 100,000,000 are disk,
  100,000,000 to 199,999,999 bulge, 200,000,000 and up dark-matter halo (Bonsai's DISKID, BULGEID and
  DARKMATTERID offsets for 32-bit IDs).
* Generators: `disk` makes a bulge and a disk; `collision` makes both for each galaxy (galaxy1-bulge,
  galaxy1-disk, galaxy2-bulge, galaxy2-disk). Generators without parts give none.
* A scene's ``[[components]]`` tables (any format; they replace what the file says): each has ``name``
  and ``rows = [first, end)``; rows not covered by a table form a component named "other".
* npz snapshots keep them (arrays ``component`` and ``component_names``).

How they are drawn: ``render.components.KEY.visible`` (bool), ``.brightness`` (>= 0, multiplies the
scene's render.brightness) and ``.color`` (RGB in [0, 1]). KEY is a component's name, a shell-style
pattern over names (``galaxy1-*``, ``*``) or its index; matching ignores case, and a later key wins
over an earlier one for the same field. In TOML: ``[render.components.halo]`` then ``visible = false``;
on the command line ``--set render.components.halo.visible=false``. `render.color_by` = component
draws each body in its component's colour; component-speed / component-mass shade that colour by
speed / mass. Bodies without components are one unnamed part.
"""

from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field, replace

import numpy as np

from app.core.errors import ConfigError

MAX_COMPONENTS = 16  # the size of the shader's per-component tables (shaders/particles.vert)
OTHER = "other"  # rows no [[components]] table covers

# Bonsai's 32-bit particle-ID offsets: disk from 0, bulge from BULGEID, dark matter from DARKMATTERID
BONSAI_BULGE_ID = 100_000_000
BONSAI_DARK_ID = 200_000_000
BONSAI_PARTS = (
    ("disk", 0, BONSAI_BULGE_ID),
    ("bulge", BONSAI_BULGE_ID, BONSAI_DARK_ID),
    ("halo", BONSAI_DARK_ID, 2**63 - 1),
)

# default colours: by name where the name says what the part is, else a palette by index
NAMED_COLORS = {
    "disk": (1.00, 0.72, 0.38),
    "star": (1.00, 0.72, 0.38),
    "bulge": (1.00, 0.90, 0.55),
    "halo": (0.42, 0.55, 1.00),
    "dark": (0.42, 0.55, 1.00),
    "gas": (0.40, 0.95, 0.85),
}
PALETTE = (
    (1.00, 0.62, 0.28),
    (0.40, 0.62, 1.00),
    (0.55, 0.95, 0.45),
    (1.00, 0.40, 0.62),
    (0.95, 0.90, 0.35),
    (0.70, 0.50, 1.00),
    (0.35, 0.95, 0.95),
    (1.00, 1.00, 1.00),
)
STYLE_FIELDS = ("visible", "brightness", "color")
BRIGHTNESS_MAX = 100.0


@dataclass(frozen=True, eq=False)
class Components:
    """Component names and, per body, the index of its component (uint8, in the bodies' row order)."""

    names: tuple[str, ...]
    index: np.ndarray

    def __post_init__(self):
        names = tuple(str(n) for n in self.names)
        index = np.ascontiguousarray(self.index, dtype=np.uint8).reshape(-1)
        if not names or len(names) > MAX_COMPONENTS:
            raise ConfigError(f"{len(names)} components: between 1 and {MAX_COMPONENTS} are drawn apart")
        if len(set(names)) != len(names):
            raise ConfigError(f"component names must differ: {', '.join(names)}")
        if index.size and int(index.max()) >= len(names):
            raise ConfigError(f"component index {int(index.max())} but only {len(names)} names")
        object.__setattr__(self, "names", names)
        object.__setattr__(self, "index", index)

    @property
    def n(self) -> int:
        return int(self.index.size)

    def counts(self) -> np.ndarray:
        return np.bincount(self.index, minlength=len(self.names))

    @classmethod
    def from_sizes(cls, parts) -> Components | None:
        """Contiguous blocks [(name, count), ...] in row order; empty ones are left out. None when there
        is at most one part (one part says nothing a plain scene does not)."""
        parts = [(str(name), int(count)) for name, count in parts if count > 0]
        if len(parts) < 2:
            return None
        index = np.repeat(np.arange(len(parts), dtype=np.uint8), [c for _, c in parts])
        return cls(tuple(name for name, _ in parts), index)

    def take(self, rows) -> Components:
        """The components of a subset of the bodies (e.g. initial.subsample), names kept."""
        return Components(self.names, self.index[np.asarray(rows)])

    def copy(self) -> Components:
        return Components(self.names, self.index.copy())

    def rows(self, name: str) -> np.ndarray:
        return np.flatnonzero(self.index == self.names.index(name))

    def describe(self) -> str:
        return ", ".join(f"{name} {count:,}" for name, count in zip(self.names, self.counts(), strict=True))


def same(a: Components | None, b: Components | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.names == b.names and np.array_equal(a.index, b.index)


# --------------------------------------------------------------------------------------- from the data


def from_tipsy(sections: list[tuple[str, int]], ids: np.ndarray | None) -> Components | None:
    """Bonsai's ID ranges (disk, bulge, halo) when the file's IDs fall in two or more of them, else one
    component per non-empty section; names in the order their first body appears."""
    if ids is not None:
        parts = [
            (int(np.argmax(mask)), name, mask)
            for name, lo, hi in BONSAI_PARTS
            if (mask := (ids >= lo) & (ids < hi)).any()
        ]
        if len(parts) >= 2:
            index = np.zeros(ids.size, dtype=np.uint8)
            for k, (_, _, mask) in enumerate(sorted(parts, key=lambda p: p[0])):
                index[mask] = k
            return Components(tuple(name for _, name, _ in sorted(parts, key=lambda p: p[0])), index)
    return Components.from_sizes(sections)


def from_table(tables, n: int, origin: str = "[[components]]") -> Components:
    """A scene's [[components]] tables ({name, rows = [first, end)}) for `n` bodies; rows left over are
    "other". ConfigError naming the table for a bad name, range or an overlap."""
    where = f"{origin}: " if origin else ""
    index = np.full(n, 255, dtype=np.uint8)
    names: list[str] = []
    for i, (name, first, end) in enumerate(parse_table(tables, origin)):
        if end > n:
            raise ConfigError(
                f"{where}components[{i}] ({name}): rows = [{first}, {end}) but there are only {n:,} bodies"
            )
        if (index[first:end] != 255).any():
            other = names[int(index[first:end][index[first:end] != 255][0])]
            raise ConfigError(
                f"{where}components[{i}] ({name}): rows [{first}, {end}) overlap component {other!r}"
            )
        index[first:end] = len(names)
        names.append(name)
    left = index == 255
    if left.any():
        if OTHER in names:
            raise ConfigError(
                f"{where}rows {int(np.argmax(left))}.. are in no component, and the name "
                f"{OTHER!r} that would hold them is taken"
            )
        index[left] = len(names)
        names.append(OTHER)
    return Components(tuple(names), index)


def parse_table(tables, origin: str = "") -> tuple[tuple[str, int, int], ...]:
    """Check [[components]] tables without knowing N: ((name, first, end), ...)."""
    where = f"{origin}: " if origin else ""
    if isinstance(tables, tuple) and all(isinstance(t, tuple) for t in tables):
        return tables
    if not isinstance(tables, list | tuple) or not tables:
        raise ConfigError(
            f'{where}[[components]] must be tables, each with name = "..." and rows = [first, end)'
        )
    if len(tables) > MAX_COMPONENTS:
        raise ConfigError(f"{where}{len(tables)} [[components]] tables; at most {MAX_COMPONENTS}")
    out = []
    for i, t in enumerate(tables):
        key = f"{where}components[{i}]"
        if not isinstance(t, dict):
            raise ConfigError(f"{key}: expected a table with name and rows")
        unknown = sorted(set(t) - {"name", "rows"})
        if unknown:
            raise ConfigError(f"{key}: unknown key {unknown[0]!r}; a component has name and rows")
        name = t.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ConfigError(f"{key}.name must be a non-empty text")
        rows = t.get("rows")
        if not (
            isinstance(rows, list | tuple)
            and len(rows) == 2
            and all(isinstance(r, int) and not isinstance(r, bool) for r in rows)
            and 0 <= rows[0] < rows[1]
        ):
            raise ConfigError(
                f"{key}.rows = {rows!r}: expected [first, end) with 0 <= first < end, e.g. rows = [0, 20000]"
            )
        out.append((name.strip(), int(rows[0]), int(rows[1])))
    names = [o[0] for o in out]
    if len(set(names)) != len(names):
        raise ConfigError(f"{where}[[components]] names must differ: {', '.join(names)}")
    return tuple(out)


# --------------------------------------------------------------------------------------------- styles


@dataclass(frozen=True)
class Style:
    """What the scene or the panel set for the components matching one key; None: not set there."""

    visible: bool | None = None
    brightness: float | None = None
    color: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class Drawn:
    """How one component is drawn after every matching key was applied."""

    name: str
    visible: bool = True
    brightness: float = 1.0
    color: tuple[float, float, float] = (1.0, 1.0, 1.0)
    count: int = 0

    @property
    def gain(self) -> float:
        """The light factor the shader uses: 0 hides."""
        return self.brightness if self.visible else 0.0


def default_color(name: str, i: int) -> tuple[float, float, float]:
    return NAMED_COLORS.get(name.lower(), PALETTE[i % len(PALETTE)])


def matches(key: str, name: str, i: int) -> bool:
    return key == str(i) or fnmatch.fnmatchcase(name.lower(), key.lower())


def drawn(components: Components | None, styles: dict[str, Style]) -> list[Drawn]:
    """Each component's effective style: defaults, then every matching key in order (later wins)."""
    names = components.names if components is not None else ("bodies",)
    counts = components.counts() if components is not None else [0]
    out = []
    for i, name in enumerate(names):
        d = Drawn(
            name, color=default_color(name, i) if components is not None else PALETTE[0], count=int(counts[i])
        )
        for key, style in styles.items():
            if matches(key, name, i):
                set_here = {f: getattr(style, f) for f in STYLE_FIELDS if getattr(style, f) is not None}
                d = replace(d, **set_here)
        out.append(d)
    return out


def set_style(styles: dict[str, Style], name: str, value, origin: str = "") -> dict[str, Style]:
    """Apply one `render.<name>` setting, name = "components", "components.KEY" or "components.KEY.FIELD";
    returns the new dict (a changed key moves to the end: it now wins over earlier patterns)."""
    prefix = f"{origin}: " if origin else ""
    full = f"render.{name}"
    rest = name[len("components") :].lstrip(".")
    if not rest:  # [render.components] as a whole: {KEY: {field: value}}
        if not isinstance(value, dict):
            raise ConfigError(
                f"{prefix}{full}: expected tables, e.g. [render.components.halo] visible = false"
            )
        for key, table in value.items():
            styles = set_style(styles, f"components.{key}", table, origin)
        return styles
    key, _, fld = rest.rpartition(".")
    if fld not in STYLE_FIELDS:  # components.KEY = {table}
        key, fld = rest, ""
    if not key:
        raise ConfigError(f"{prefix}{full}: name a component, e.g. render.components.halo.visible")
    if not fld:
        if not isinstance(value, dict):
            raise ConfigError(
                f"{prefix}{full}: expected a table with {', '.join(STYLE_FIELDS)}, or a key "
                f"such as {full}.visible"
            )
        for f, v in value.items():
            if f not in STYLE_FIELDS:
                raise ConfigError(f"{prefix}{full}.{f}: unknown; a component has {', '.join(STYLE_FIELDS)}")
            styles = set_style(styles, f"components.{key}.{f}", v, origin)
        return styles
    typed = coerce_field(f"{full}", fld, value, prefix)
    old = styles.get(key, Style())
    new = {k: v for k, v in styles.items() if k != key}
    new[key] = replace(old, **{fld: typed})
    return new


def coerce_field(key: str, fld: str, value, prefix: str = ""):
    from app.model import config

    specs = {
        "visible": config.Field("bool", "drawn or hidden"),
        "brightness": config.Field("float", "light factor", lo=0.0, hi=BRIGHTNESS_MAX),
        "color": config.Field("color", "RGB", lo=0.0, hi=1.0),
    }
    try:
        return config.coerce(key, value, specs[fld])
    except ConfigError as e:
        raise ConfigError(prefix + str(e)) from None


def style_value(styles: dict[str, Style], components: Components | None, key: str):
    """What `render.components.KEY.FIELD` is in effect for the first component KEY matches (the panel's
    messages); the value set under KEY when no component matches."""
    rest = key.split(".", 2)[2] if key.count(".") >= 2 else ""
    name, _, fld = rest.rpartition(".")
    for d in drawn(components, styles):
        if matches(name, d.name, 0 if components is None else components.names.index(d.name)):
            return getattr(d, fld)
    return getattr(styles.get(name, Style()), fld, None)


def check_styles(styles: dict[str, Style], components: Components | None) -> list[str]:
    """Keys that match no component (a warning for the log: a typo would otherwise do nothing)."""
    names = components.names if components is not None else ()
    return [k for k in styles if not any(matches(k, n, i) for i, n in enumerate(names))]


@dataclass
class StyleTable:
    """The shader's per-component tables: colour (MAX, 3) and gain (MAX,) float32."""

    color: np.ndarray = field(default_factory=lambda: np.ones((MAX_COMPONENTS, 3), np.float32))
    gain: np.ndarray = field(default_factory=lambda: np.ones(MAX_COMPONENTS, np.float32))

    @classmethod
    def of(cls, rows: list[Drawn]) -> StyleTable:
        t = cls()
        for i, d in enumerate(rows[:MAX_COMPONENTS]):
            t.color[i] = d.color
            t.gain[i] = d.gain if math.isfinite(d.gain) else 0.0
        return t


def visible_rows(components: Components | None, rows: list[Drawn]) -> np.ndarray | None:
    """Boolean mask of the bodies drawn, or None when every body is (or there are no components)."""
    if components is None:
        return None
    shown = np.array([d.gain > 0 for d in rows], dtype=bool)
    if shown.all():
        return None
    return shown[components.index]
