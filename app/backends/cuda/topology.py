"""`info`'s GPU table: every GPU, which pairs have peer access, and the link between each pair.

The link comes from `nvidia-smi topo -m` (NV<k>: NVLink with k links; PIX / PXB / PHB / NODE / SYS: PCIe
paths of growing length), which every driver install carries; where it is missing or fails, the link is
"?" and peer access (from the driver, through pycuda) is still shown. Parsing and formatting are pure
functions (`parse_topo_matrix`, `format_topology`), tested on the CPU with nvidia-smi's text.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass, field

# nvidia-smi's legend, shortened: what each path between two GPUs goes through
PCIE_PATHS = {
    "PIX": "PCIe, one switch",
    "PXB": "PCIe, several switches",
    "PHB": "PCIe through the CPU's host bridge",
    "NODE": "PCIe between host bridges of one NUMA node",
    "SYS": "PCIe across NUMA nodes (SMP interconnect)",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class Topology:
    names: list[str]  # "NVIDIA H200", by ordinal
    memory_bytes: list[int]
    peer: list[list[bool]]  # peer[a][b]: GPU a can access GPU b's memory
    links: dict[tuple[int, int], str] = field(default_factory=dict)  # (a, b) -> "NV18", "SYS", ...
    links_source: str = "nvidia-smi topo -m"


def parse_topo_matrix(text: str) -> dict[tuple[int, int], str]:
    """The GPU-to-GPU cells of `nvidia-smi topo -m` ({(0, 1): "NV18", ...}; NIC and affinity columns
    ignored, colour codes stripped)."""
    rows = [[c.strip() for c in _ANSI.sub("", line).rstrip().split("\t")] for line in text.splitlines()]
    # the header: GPU names as columns after an empty first cell (a matrix row starts with its GPU's name)
    columns = next((r for r in rows if "GPU0" in r[1:] and not re.fullmatch(r"GPU\d+", r[0])), None)
    if columns is None:
        return {}
    gpu_columns = {i: int(c[3:]) for i, c in enumerate(columns) if re.fullmatch(r"GPU\d+", c)}
    links = {}
    for cells in rows:
        if not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        row = int(cells[0][3:])
        for i, col in gpu_columns.items():
            if i < len(cells) and cells[i]:
                links[row, col] = cells[i]
    return links


def describe_link(code: str) -> str:
    """'NV18' -> 'NVLink, 18 links'; 'SYS' -> its PCIe path; 'X' -> 'itself'."""
    if code == "X":
        return "itself"
    m = re.fullmatch(r"NV(\d+)", code)
    if m:
        return f"NVLink, {m.group(1)} links"
    return PCIE_PATHS.get(code, code)


def format_topology(topo: Topology) -> list[str]:
    """Lines for `info`: the GPUs, then (with two or more) each pair's peer access and link."""
    k = len(topo.names)
    lines = [f"GPUs: {k} (--gpus 1..{k} or all)" if k else "GPUs: none"]
    for i, (name, memory) in enumerate(zip(topo.names, topo.memory_bytes, strict=True)):
        lines.append(f"  GPU {i}: {name}, {memory / 2**30:,.1f} GiB")
    if k < 2:
        return lines
    width = max(12, *(len(_cell(topo, a, b)) + 2 for a in range(k) for b in range(k)))
    lines.append(f"  peer access and link, row to column ({topo.links_source}):")
    lines.append(("  " + " " * 6 + "".join(f"GPU{b}".ljust(width) for b in range(k))).rstrip())
    for a in range(k):
        cells = "".join(_cell(topo, a, b).ljust(width) for b in range(k))
        lines.append((f"  GPU{a}".ljust(8) + cells).rstrip())
    kinds = sorted({topo.links.get((a, b), "?") for a in range(k) for b in range(k) if a != b})
    lines.append("  links: " + "; ".join(f"{code} = {describe_link(code)}" for code in kinds))
    blocked = [(a, b) for a in range(k) for b in range(k) if a != b and not topo.peer[a][b]]
    if blocked:
        lines.append(
            "  without peer access: "
            + ", ".join(f"{a}->{b}" for a, b in blocked)
            + " (--exchange auto then goes through host memory)"
        )
    return lines


def _cell(topo: Topology, a: int, b: int) -> str:
    if a == b:
        return "-"
    return f"{'peer' if topo.peer[a][b] else 'no peer'} · {topo.links.get((a, b), '?')}"


def nvidia_smi_links() -> tuple[dict[tuple[int, int], str], str]:
    """(links, source) from `nvidia-smi topo -m`; ({}, why not) where it cannot run."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {}, "links unknown: nvidia-smi not found"
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as e:
        return {}, f"links unknown: nvidia-smi topo -m failed ({e})"
    if out.returncode != 0:
        return {}, f"links unknown: nvidia-smi topo -m exited {out.returncode}"
    return parse_topo_matrix(out.stdout), "nvidia-smi topo -m"


def query_topology() -> Topology:
    """Every GPU the driver sees (no context is made), peer access between each pair, and the links."""
    from app.backends.cuda.context import driver

    drv = driver()
    devices = [drv.Device(i) for i in range(drv.Device.count())]
    peer = [[a is b or a.can_access_peer(b) for b in devices] for a in devices]
    links, source = nvidia_smi_links() if len(devices) > 1 else ({}, "")
    return Topology([d.name() for d in devices], [d.total_memory() for d in devices], peer, links, source)
