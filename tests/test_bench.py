"""The bench engine on the CPU: result layout, skip reasons, JSON and the PNG plot (no GPU needed)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from fakes import BackendDouble

from app.backends import backend_class
from app.backends.base import Backend, KernelRecord, StepTimings
from app.core.errors import RuntimeFault
from app.engine.forces import Span, all_pairs_work
from app.model.physics import Physics
from app.tools import bench


class ToyBackend(BackendDouble, Backend):
    """Reports a fixed force time per N so medians are predictable; some kernels misbehave on purpose."""

    name = "toy"
    RECORDS = [
        KernelRecord(name="toy-fast", doc="fine", backend="toy"),
        KernelRecord(name="toy-small", doc="max_n 100", backend="toy", max_n=100),
        KernelRecord(name="toy-broken", doc="never compiles", backend="toy"),
        KernelRecord(name="toy-crash", doc="raises while stepping", backend="toy"),
        KernelRecord(name="toy-tree", doc="evaluates a quarter of the pairs, like a tree", backend="toy"),
        KernelRecord(name="toy-mute", doc="counts no interactions", backend="toy"),
    ]
    closed = 0

    def __init__(self):
        self._kernel, self._n, self._physics, self._calls = "toy-fast", 0, Physics(), 0

    @classmethod
    def why_not(cls):
        return None

    @classmethod
    def kernels(cls):
        return list(cls.RECORDS)

    @classmethod
    def kernel_why_not(cls, name):
        return "toy-broken.cu(3): error: nope" if name == "toy-broken" else None

    def load(self, bodies, physics, kernel=None):
        if bodies.n > 1000:
            raise RuntimeFault(
                f"out of GPU memory: N = {bodies.n:,} bodies need more; at most N ≈ 1,000 fits"
            )
        self._n, self._physics, self._kernel, self._calls = bodies.n, physics, kernel, 0

    @property
    def kernel(self):
        return self._kernel

    def set_kernel(self, name):
        self._kernel = name

    @property
    def n(self):
        return self._n

    def step(self, steps=1):
        if self._kernel == "toy-crash":
            raise ValueError("boom")
        self._calls += 1
        # 1 ms per 1e6 interactions, with a slow first call that warm-up must absorb
        ms = self._n * self._n * 1e-6 * (50 if self._calls == 1 else 1)
        work = all_pairs_work(Span.all(self._n), Span.all(self._n))
        done = {"toy-tree": work.interactions // 4, "toy-mute": 0}.get(self._kernel, work.interactions)
        return StepTimings(
            kernel=self._kernel,
            steps=steps,
            n=self._n,
            force_ms=ms,
            integrate_ms=0.01,
            interactions=done * steps,
            pair_equivalent=work.pair_equivalent * steps,
        )

    def accelerations(self):
        return np.zeros((self._n, 3))

    def state(self):
        raise NotImplementedError

    def device_info(self):
        return {
            "name": "Toy GPU",
            "sm_clock_max_mhz": 1980.0,
            "driver_version": "1.0",
            "fp32_issue_limit_interactions_per_s": 2.79e12,
        }

    def close(self):
        ToyBackend.closed += 1


def by(result, kernel, n):
    return next(r for r in result["results"] if r["kernel"] == kernel and r["n"] == n)


def test_run_bench_layout_and_skips():
    kernels = ["toy-fast", "toy-small", "toy-broken", "toy-crash", "nope"]
    result = bench.run_bench(ToyBackend, kernels, [64, 512, 2000], warmup=2, repeats=10, progress=False)
    assert result["schema"] == bench.SCHEMA and result["backend"] == "toy"
    assert result["device"]["name"] == "Toy GPU" and result["date"] and "commit" in result["git"]
    assert result["flops_per_interaction"] == 20 and result["repeats"] == 10
    assert len(result["results"]) == len(kernels) * 3  # nothing dropped silently

    ok = by(result, "toy-fast", 512)
    assert ok["status"] == "ok" and len(ok["samples_ms"]) == 10
    assert ok["median_ms"] == pytest.approx(512 * 512 * 1e-6)  # the slow first call was warm-up
    assert ok["interactions_per_s"] == pytest.approx(1e9)
    assert ok[bench.GFLOPS_FIELD] == pytest.approx(20.0)
    assert "20_flops" in bench.GFLOPS_FIELD

    assert "max_n" in by(result, "toy-small", 512)["reason"]
    assert by(result, "toy-small", 64)["status"] == "ok"
    assert "error: nope" in by(result, "toy-broken", 64)["reason"]
    assert "fits" in by(result, "toy-fast", 2000)["reason"]
    crash = by(result, "toy-crash", 64)
    assert crash["status"] == "failed" and "boom" in crash["reason"]
    assert "not a toy kernel" in by(result, "nope", 64)["reason"]
    for r in result["results"]:
        assert r["status"] == "ok" or r["reason"]

    table = bench.format_table(result)
    assert "toy-fast" in table and "skipped" in table and "Toy GPU" in table


def test_rates_come_from_the_counted_interactions_and_a_tree_gets_its_all_pairs_equivalent():
    result = bench.run_bench(
        ToyBackend, ["toy-fast", "toy-tree", "toy-mute"], [512], warmup=1, repeats=3, progress=False
    )
    fast, tree, mute = (by(result, k, 512) for k in ("toy-fast", "toy-tree", "toy-mute"))
    assert fast["interactions"] == 512 * 512 and bench.EQUIVALENT_FIELD not in fast  # all-pairs: one rate
    assert tree["interactions"] == 512 * 512 // 4 and tree["pair_equivalent"] == 512 * 512
    assert tree["interactions_per_s"] == pytest.approx(0.25e9)  # what it evaluated, over the same time
    assert tree[bench.EQUIVALENT_FIELD] == pytest.approx(1e9)  # labelled: equivalent_all_pairs_...
    assert tree[bench.GFLOPS_FIELD] == pytest.approx(5.0)
    assert mute["status"] == "failed" and "counted no interactions" in mute["reason"]
    head, *rows = bench.format_table(result).splitlines()[1:]
    assert "eq. all-pairs G/s" in head
    tree_row = next(r for r in rows if r.startswith("toy-tree"))
    assert tree_row.split()[-2:] == ["5.0", "1.00"]  # GFLOP/s, then the equivalent all-pairs G/s
    assert "eq. all-pairs" not in bench.format_table(
        bench.run_bench(ToyBackend, ["toy-fast"], [64], warmup=0, repeats=1, progress=False)
    )


def test_backend_closed_after_run():
    before = ToyBackend.closed
    bench.run_bench(ToyBackend, ["toy-fast"], [8], warmup=0, repeats=1, progress=False)
    assert ToyBackend.closed == before + 1


def test_unavailable_backend_records_why():
    class Nope(ToyBackend):
        @classmethod
        def why_not(cls):
            return "no GPU here"

    result = bench.run_bench(Nope, ["toy-fast"], [8, 16], progress=False)
    assert [r["status"] for r in result["results"]] == ["skipped", "skipped"]
    assert all(r["reason"] == "no GPU here" for r in result["results"])


def test_json_round_trip(tmp_path):
    result = bench.run_bench(ToyBackend, ["toy-fast"], [32, 64], warmup=1, repeats=3, progress=False)
    path = tmp_path / "bench.json"
    bench.write_json(result, path)
    back = json.loads(path.read_text())
    assert back["results"] == result["results"] and back == bench.load_json(path)


def test_plot_is_a_log_log_png_of_every_kernel_with_the_references(tmp_path):
    from PIL import Image

    from app.tools.bench_plot import SIZE_PX, bench_figure, plot

    result = bench.run_bench(
        ToyBackend,
        ["toy-fast", "toy-small", "toy-tree", "toy-broken"],
        [16, 64, 256, 1000],
        warmup=1,
        repeats=3,
        progress=False,
    )
    limit = result["references"][0]
    assert limit["interactions_per_s"] == 2.79e12 and "FP32 issue limit" in limit["label"]  # the device's
    result["references"] += bench.reference_lines(True, None)  # the estimate and the CUDA samples series
    fig = bench_figure(result)
    ax = fig.axes[0]
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    assert ax.get_xlabel() == "N (bodies)" and ax.get_ylabel() == "G interactions / s"
    assert "Toy GPU" in ax.get_title()
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [
        "toy-fast",
        "toy-small",
        "toy-tree",
        "toy-tree (equivalent all-pairs)",
        limit["label"],
        "FP32 issue limit H100/H200 ≈ 2,788 G/s (12 FP32 instr./interaction)",
        "CUDA samples nbody, H200 (DESIGN.md)",
    ]
    lines = dict(zip(labels, ax.get_legend().legend_handles, strict=True))
    kernels = [lines[k] for k in ("toy-fast", "toy-small", "toy-tree")]
    assert len({(h.get_color(), h.get_marker()) for h in kernels}) == 3  # each kernel its own look
    assert all(lines[k].get_linestyle() == "-" for k in ("toy-fast", "toy-small", "toy-tree"))
    assert lines["toy-tree (equivalent all-pairs)"].get_linestyle() == ":"
    assert all(lines[r["label"]].get_linestyle() == "--" for r in result["references"])  # dashed references
    fast = next(line for line in ax.get_lines() if line.get_label() == "toy-fast")
    assert fast.get_xdata().tolist() == [16, 64, 256, 1000]
    assert fast.get_ydata()[0] == pytest.approx(1.0)  # the toy's 1e9 interactions/s, plotted in G/s
    assert any("6 run(s) not measured" in t.get_text() for t in ax.texts)  # toy-broken; toy-small over max_n

    out = plot(result, tmp_path / "plot.png")
    img = Image.open(out)
    assert img.format == "PNG" and img.size == SIZE_PX
    colors = {c for _count, c in img.convert("RGB").getcolors(maxcolors=1 << 20)}
    assert len(colors) > 20  # axes, text, lines: not a blank canvas
    assert any(r > 150 and g < 80 and b < 90 for r, g, b in colors)  # the crimson dashed FP32 limit


def test_plot_with_nothing_measured(tmp_path):
    from PIL import Image

    from app.tools.bench_plot import SIZE_PX, bench_figure, plot

    result = bench.run_bench(ToyBackend, ["toy-broken"], [16], progress=False)
    result["references"] = []
    ax = bench_figure(result).axes[0]
    assert ax.get_legend() is None and ax.get_xscale() == "log" and "1 run(s)" in ax.texts[0].get_text()
    assert Image.open(plot(result, tmp_path / "empty.png")).size == SIZE_PX


def test_bench_bodies_are_app_ics_plummer_and_seeded():
    from app.model.ics import generate

    a, b = bench.bench_bodies(500, seed=3), bench.bench_bodies(500, seed=3)
    assert np.array_equal(a.pos, b.pos) and np.array_equal(a.vel, b.vel)  # deterministic
    ref = generate("plummer", 500, 3)
    assert np.array_equal(a.pos, ref.pos) and np.array_equal(a.mass, ref.mass)  # one Plummer generator
    assert a.n == 500 and a.mass.sum() == pytest.approx(1.0)
    assert not np.array_equal(bench.bench_bodies(500, seed=4).pos, a.pos)


def test_cpu_backend_at_tiny_n():
    cls = backend_class("cpu")
    if cls.why_not():
        pytest.skip(f"cpu backend unavailable: {cls.why_not()}")
    name = cls.kernels()[0].name
    result = bench.run_bench(cls, [name], [64, 128], warmup=1, repeats=3, progress=False)
    for r in result["results"]:
        assert r["status"] == "ok", r
        assert r["interactions_per_s"] > 0 and r[bench.GFLOPS_FIELD] > 0
    assert result["device"]["name"]


def test_a_tree_row_has_its_stages_body_cells_and_both_rates(tmp_path):
    from app.engine.forces import STAGES

    cls = backend_class("cpu")
    if cls.why_not():
        pytest.skip(f"cpu backend unavailable: {cls.why_not()}")
    result = bench.run_bench(cls, ["cpu-simd", "cpu-tree"], [2048], warmup=1, repeats=3, progress=False)
    simd, tree = by(result, "cpu-simd", 2048), by(result, "cpu-tree", 2048)
    assert bench.STAGES_FIELD not in simd and "body_cell" not in simd
    stages = tree[bench.STAGES_FIELD]
    assert tuple(stages) == STAGES and all(v > 0 for v in stages.values())
    assert sum(stages.values()) <= tree["max_ms"]
    assert 0 < tree["body_cell"] < tree["interactions"] < tree["pair_equivalent"] == 2048**2
    assert tree[bench.EQUIVALENT_FIELD] == pytest.approx(2048**2 / (tree["median_ms"] * 1e-3))
    bb, bc = tree["walk_flops"]
    assert (bb, bc) == (23, 51) and bench.WALK_TFLOPS_FIELD not in simd
    want = ((tree["interactions"] - tree["body_cell"]) * bb + tree["body_cell"] * bc) / (stages["walk"] * 1e9)
    assert tree[bench.WALK_TFLOPS_FIELD] == pytest.approx(want)
    assert "walk_fp32_peak_fraction" not in tree  # the CPU states no FP32 peak
    table = bench.format_table(result)
    assert "stages (median ms): keys " in table and "· walk " in table
    walk = f"walk {tree[bench.WALK_TFLOPS_FIELD]:.1f} TFLOP/s FP32 (23 flops per body-body, 51 per body-cell)"
    assert walk in table
    per_body = tree["interactions"] / 2048
    assert f"{per_body:,.0f} interactions/body (body-body + body-cell" in table
    assert "equivalent all-pairs N²/t" in table
    path = tmp_path / "tree.json"
    bench.write_json(result, path)
    assert bench.load_json(path)["results"][1][bench.STAGES_FIELD] == stages


def test_a_tree_refitted_between_builds_is_timed_in_whole_cycles(monkeypatch):
    """rebuild_every = R (the record's period tunable): each sample is the mean of R consecutive steps,
    one build and R - 1 refits, so the build counts at its share; R = 1 rows time single steps."""
    cls = backend_class("cpu")
    if cls.why_not():
        pytest.skip(f"cpu backend unavailable: {cls.why_not()}")
    seen = []
    step = cls.step

    def counted(self, steps=1):
        timings = step(self, steps)
        seen.append((self.tunables()["rebuild_every"], self.evaluator().since_build, timings.extra))
        return timings

    monkeypatch.setattr(cls, "step", counted)
    result = bench.run_bench(
        cls, ["cpu-tree"], [2048], warmup=1, repeats=2, progress=False, tunables={"rebuild_every": [1, 4]}
    )
    one, four = (next(r for r in result["results"] if r["tunables"]["rebuild_every"] == e) for e in (1, 4))
    assert len(one["samples_ms"]) == len(four["samples_ms"]) == 2
    cycles = [s for e, s, _ in seen if e == 4]
    assert len(cycles) == 1 + 2 * 4 and sorted(cycles[1:5]) == [0, 1, 2, 3]  # each sample: one build
    timed = seen[-8:]  # the two cycles the row's samples are the means of
    assert all(x.get("stage:keys", 0.0) == 0.0 for _, s, x in timed if s > 0)  # a refit computes no keys
    means = sorted(sum(x.get("stage:keys", 0.0) for _, _, x in timed[i : i + 4]) / 4 for i in (0, 4))
    assert four[bench.STAGES_FIELD]["keys"] == pytest.approx((means[0] + means[1]) / 2)  # a build's quarter


def test_the_fp32_peak_is_every_lane_an_fma_per_cycle_at_the_max_clock():
    from app.backends.cuda.context import DeviceFacts

    def facts(cc, sms, mhz):
        return DeviceFacts(
            ordinal=0,
            name="GPU",
            compute_capability=cc,
            sms=sms,
            total_memory=1,
            memory_clock_mhz=None,
            memory_bus_bits=None,
            sm_clock_max_mhz=mhz,
            sm_clock_mhz=None,
            driver_version=None,
            cuda_driver_api="13.0",
            pci_bus_id=None,
        )

    h200 = facts((9, 0), 132, 1980.0)
    assert h200.fp32_peak_tflops == pytest.approx(66.9, abs=0.05)  # 128 lanes x 2 flops x 132 SMs x 1.98 GHz
    assert h200.as_dict()["fp32_peak_tflops"] == h200.fp32_peak_tflops
    assert facts((8, 0), 108, 1410.0).fp32_peak_tflops == pytest.approx(19.5, abs=0.05)  # A100: 64 lanes
    assert facts((9, 0), 132, None).fp32_peak_tflops is None
