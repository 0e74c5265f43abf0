"""`info`'s GPU table from nvidia-smi's text and the driver's peer answers, on the CPU
(app/backends/cuda/topology.py; the query itself runs on a GPU machine)."""

from __future__ import annotations

from app.backends.cuda.topology import Topology, describe_link, format_topology, parse_topo_matrix

# `nvidia-smi topo -m` on a two-H200 machine, tabs and the underline codes of newer drivers included
TWO_H200 = (
    "\x1b[4m\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tSYS\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tSYS\t0-47\t0\t\tN/A\n"
    "NIC0\tSYS\tSYS\t X \t\t\t\t\n\n"
    "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
)
PCIE_FOUR = (
    "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
    "GPU0\t X \tPIX\tSYS\tSYS\t0-15\n"
    "GPU1\tPIX\t X \tSYS\tSYS\t0-15\n"
    "GPU2\tSYS\tSYS\t X \tPIX\t16-31\n"
    "GPU3\tSYS\tSYS\tPIX\t X \t16-31\n"
)


def test_the_gpu_cells_of_nvidia_smi_topo_are_read():
    links = parse_topo_matrix(TWO_H200)
    assert links == {(0, 0): "X", (0, 1): "NV18", (1, 0): "NV18", (1, 1): "X"}
    four = parse_topo_matrix(PCIE_FOUR)
    assert four[0, 1] == "PIX" and four[1, 2] == "SYS" and len(four) == 16
    assert parse_topo_matrix("No devices were found") == {}


def test_links_are_named():
    assert describe_link("NV18") == "NVLink, 18 links"
    assert describe_link("SYS").startswith("PCIe") and describe_link("PIX").startswith("PCIe")
    assert describe_link("X") == "itself"


def test_the_table_shows_every_gpu_the_peer_matrix_and_the_links():
    topo = Topology(
        ["NVIDIA H200"] * 2, [150_000_000_000] * 2, [[True, True], [True, True]], parse_topo_matrix(TWO_H200)
    )
    text = "\n".join(format_topology(topo))
    assert "GPUs: 2 (--gpus 1..2 or all)" in text and "GPU 1: NVIDIA H200, 139.7 GiB" in text
    rows = [ln for ln in text.splitlines() if ln.startswith(("  GPU0 ", "  GPU1 "))]
    assert len(rows) == 2 and all("peer · NV18" in r for r in rows)
    assert "NV18 = NVLink, 18 links" in text and "without peer access" not in text


def test_gpus_without_peer_access_are_named_with_the_consequence():
    peer = [[True, False, True, True], [False, True, True, True], [True] * 4, [True] * 4]
    topo = Topology(["GPU"] * 4, [2**34] * 4, peer, parse_topo_matrix(PCIE_FOUR))
    text = "\n".join(format_topology(topo))
    assert "no peer · PIX" in text and "without peer access: 0->1, 1->0" in text and "host memory" in text
    assert "SYS = PCIe across NUMA nodes" in text


def test_one_gpu_has_no_matrix_and_unknown_links_say_so():
    one = format_topology(Topology(["NVIDIA H100"], [80 * 2**30], [[True]]))
    assert one == ["GPUs: 1 (--gpus 1..1 or all)", "  GPU 0: NVIDIA H100, 80.0 GiB"]
    two = format_topology(
        Topology(["A", "B"], [2**30] * 2, [[True] * 2] * 2, {}, "links unknown: nvidia-smi not found")
    )
    assert any("links unknown: nvidia-smi not found" in ln for ln in two)
    assert any("peer · ?" in ln for ln in two)
