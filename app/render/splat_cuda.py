"""The `splat` draw style's host side on one GPU: its buffers and the launches of kernels/splat.cu on the
device position rows the backend already keeps (app/render/splat.py has the arithmetic contract).

    splatter = CudaSplatter(device)
    frame = splatter.draw(pos_ptr, n, view, light, params, comp_ptr, values_ptr)
    frame.image      device pointer: RGBA8, top row first, params.width x params.height
    frame.exposure   the Exposure the tone map used (automatic: from this frame's histogram)

Per frame: clear (cuMemsetD32, no kernel), accumulate, histogram, the exposure (a kernel: frame_exposure
on the device, so that a recording's frame depends on its own bodies only and no host waits in between),
tone map, and the histogram and exposure copied behind them into pinned host memory. Every launch and copy
goes on one stream and `draw` returns without waiting for any of it; the caller waits once, when it reads
the frame's host figures (`exposure`, `hist`, `gpu_ms`; `ready()` says whether that would wait). The
viewer reads them right after queuing the texture copy (app/render/splat_style.py says why it waits).
They are the splatter's until its next `draw`, which first waits for the frame before (its pinned copies
and staged tables are then free to reuse; in a steady viewer it finished long before).

The buffers are the device's scratch buffers, grown and never shrunk: a window resized a hundred times
holds the largest frame's buffers, not a hundred (tests/test_splat_gpu.py). The light and tone tables
are uploaded when they change, not every frame, from pinned staging (an upload from pageable memory would
wait for the GPU).
"""

from __future__ import annotations

from contextlib import nullcontext

import numpy as np

from app.render import splat
from app.render.splat import Exposure, SplatParams, SplatView, manual_x_per_unit, tone_lut
from app.render.splat_bloom import Bloom, bloom_of
from app.render.splat_light import BodyLight

STAGES = ("clear", "accumulate", "histogram", "exposure", "bloom", "tonemap")  # the timed parts of a frame
# auto: binned where the frame's tiles fit its shared counters, else direct. direct: 12 global atomics a
# body; binned: bodies counted and gathered per 32x32 tile, each tile added up in shared memory
# (kernels/splat.cu says why; bench/splat_cost.py times both)
METHODS = ("auto", "binned", "direct")


class SplatFrame:
    """A frame queued by CudaSplatter.draw: its image on the device, and its host figures on request."""

    def __init__(self, splatter: CudaSplatter, image: int, width: int, height: int, generation: int):
        self.image = image  # device pointer, RGBA8 (height, width, 4), top row first
        self.width, self.height = width, height
        self._splatter, self._generation = splatter, generation
        self._figures: tuple[Exposure, np.ndarray, float] | None = None

    def ready(self) -> bool:
        """Whether the frame is complete on the GPU (its figures read without a wait)."""
        return self._figures is not None or self._splatter.frame_done(self._generation)

    def _read(self) -> tuple[Exposure, np.ndarray, float]:
        if self._figures is None:
            self._figures = self._splatter.figures(self._generation)
        return self._figures

    @property
    def exposure(self) -> Exposure:
        """The Exposure the tone map used (waits for the frame)."""
        return self._read()[0]

    @property
    def hist(self) -> np.ndarray:
        """The lit pixels' histogram (splat.HIST_BINS uint32), this frame's (waits for the frame)."""
        return self._read()[1]

    @property
    def gpu_ms(self) -> float:
        """The frame's kernels and copies on the GPU, from the first launch to the copies' end (waits)."""
        return self._read()[2]


class CudaSplatter:
    """The splat kernels on one app.backends.cuda.device.CudaDevice, with their buffers."""

    def __init__(self, device, stream=None, options: tuple[str, ...] | None = None):
        """`options`: nvcc's for kernels/splat.cu (None: its own, compile.FILE_OPTIONS; the bench passes
        them with a -D to time a variant, in a process of its own: a device loads a file once)."""
        self.device = device
        self.stream = stream if stream is not None else device.stream("splat")
        self._fn = {s: device.function(splat.SOURCE, s, t, options) for s, t in splat.KERNELS.items()}
        self._hist_host = device.pinned("splat-hist", splat.HIST_BINS, np.uint32)
        self._exposure_host = device.pinned("splat-exposure", 4, np.uint64)
        self._generation = 0  # frames drawn; a SplatFrame's figures are those of the newest only
        self._uploaded: dict[str, bytes] = {}  # table name -> the bytes on the device
        self._light: BodyLight | None = None  # whose bytes _light_bytes are
        self._light_bytes = (b"", b"")
        self._tone: tuple | None = None  # (tone map, background) of _lut_bytes
        self._lut_bytes = b""
        self.chunk: int | None = None  # records per block of splat_tiles; None: chunk_for(n)
        with device.scope:
            self._begin, self._end = device.drv.Event(), device.drv.Event()

    # --- buffers -----------------------------------------------------------------------------------
    def _table(self, key: str, data: bytes) -> int:
        """The device copy of a small host table, uploaded only when its bytes changed."""
        ptr = self.device.scratch(f"splat-{key}", len(data))
        if self._uploaded.get(key) != data:
            stage = self.device.pinned(f"splat-{key}-stage", len(data), np.uint8)[: len(data)]
            stage[:] = np.frombuffer(data, np.uint8)  # free: draw waited for the frame that last read it
            self.device.drv.memcpy_htod_async(ptr, stage, self.stream)
            self._uploaded[key] = data
        return ptr

    def _tables(self, light: BodyLight, view: SplatView, params: SplatParams) -> tuple[tuple[int, ...], int]:
        """((light, thresholds, view), tone LUT) device pointers. The light's and the LUT's bytes are made
        again only for another BodyLight or another tone map (the viewer keeps one BodyLight while its
        settings stay), not each frame."""
        if light is not self._light:
            table = light.table.astype(np.uint32).tobytes()
            self._light, self._light_bytes = light, (table, light.thresholds.astype(np.float32).tobytes())
        tone = (params.tone_map, params.background)
        if tone != self._tone:
            self._tone, self._lut_bytes = tone, tone_lut(*tone).tobytes()
        table, thresholds = self._light_bytes
        pointers = (self._table("light", table), self._table("thresholds", thresholds))
        return (*pointers, self._table("view", view.rows().tobytes())), self._table("lut", self._lut_bytes)

    def buffers(self, width: int, height: int) -> tuple[int, int, int]:
        """(accum, hist, image) device pointers with room for a width x height frame."""
        pixels = int(width) * int(height)
        dev = self.device
        return (
            dev.scratch("splat-accum", 8 * 3 * pixels),
            dev.scratch("splat-hist-dev", 4 * splat.HIST_BINS),
            dev.scratch("splat-image", 4 * pixels),
        )

    # --- a frame -----------------------------------------------------------------------------------
    def draw(
        self,
        pos: int,
        n: int,
        view: SplatView,
        light: BodyLight,
        params: SplatParams,
        comp: int = 0,
        values: int = 0,
        timer=None,
        method: str = "auto",
    ) -> SplatFrame:
        """The frame of the `n` float4 rows at device pointer `pos` (`comp` uint8 per body or 0, `values`
        float per body or 0: read when `light.value_kind` asks for them). `timer`, if given, is a
        callable(stage) returning a context manager that times the stage on this stream (the bench's).
        `method`: how the light is added (`METHODS`; the buffer is the same bit for bit)."""
        w, h = params.width, params.height
        pixels = w * h
        accum, hist, image = self.buffers(w, h)
        exposure = self.device.scratch("splat-exposure-dev", 8 * 4)
        with self.device.scope:
            self._end.synchronize()  # the frame before: its copies out and its tables' staging are done
            self._generation += 1
            tables, lut = self._tables(light, view, params)
            run = timer or _untimed
            self._begin.record(self.stream)
            with run("clear"):
                self.device.drv.memset_d32_async(accum, 0, 2 * 3 * pixels, self.stream)
                self.device.drv.memset_d32_async(hist, 0, splat.HIST_BINS, self.stream)
            if n > 0:
                with run("accumulate"):
                    body_args = (
                        pos,
                        comp,
                        values,
                        *tables,
                        n,
                        w,
                        h,
                        float(np.float32(view.w_min)),
                        light.value_kind,
                    )
                    if self.binned(w, h, method):
                        self._accumulate_binned(accum, body_args, tables[0], n, w, h, timer)
                    else:
                        self._launch("splat_accumulate", -(-n // splat.BLOCK), accum, *body_args)
            with run("histogram"):
                self._launch("splat_histogram", min(-(-pixels // splat.BLOCK), 1024), hist, accum, pixels)
            with run("exposure"):
                self._launch_exposure(exposure, hist, params, light.unit, n)
            bloom = bloom_of(params.bloom, params.bloom_threshold, params.bloom_radius)
            if bloom is None:
                with run("tonemap"):
                    grid = -(-pixels // splat.BLOCK)
                    self._launch("splat_tonemap", grid, image, accum, lut, pixels, exposure)
            else:  # the index and the glow's two passes, then the table (splat_bloom.py)
                index, glow = self._bloom(accum, exposure, bloom, w, h, run)
                with run("tonemap"):
                    self._launch(
                        "splat_tonemap_glow", -(-pixels // splat.BLOCK), image, index, glow, lut, pixels,
                        bloom.gain,
                    )  # fmt: skip
            self.device.drv.memcpy_dtoh_async(self._hist_host, hist, self.stream)
            self.device.drv.memcpy_dtoh_async(self._exposure_host, exposure, self.stream)
            self._end.record(self.stream)
        return SplatFrame(self, image, w, h, self._generation)

    def _launch_exposure(self, exposure: int, hist: int, params: SplatParams, unit: float, n: int) -> None:
        """splat_exposure: frame_exposure(params, hist, unit, n) into the 4 u64 at `exposure`."""
        automatic = params.exposure is None
        manual_x = 0.0 if automatic else manual_x_per_unit(params, unit, n)
        self._launch(
            "splat_exposure", 1, exposure, hist, int(automatic), float(params.auto_percentile),
            float(params.auto_level), float(manual_x), block=splat.HIST_BINS,
        )  # fmt: skip

    def device_exposure(self, hist: np.ndarray, params: SplatParams, unit: float, n: int) -> Exposure:
        """The exposure the kernel makes of a host histogram, waited for (tests: against frame_exposure)."""
        dev = self.device
        hist_ptr = dev.scratch("splat-hist-dev", 4 * splat.HIST_BINS)
        out = dev.scratch("splat-exposure-dev", 8 * 4)
        host = np.zeros(4, np.uint64)
        with dev.scope:
            dev.drv.memcpy_htod(hist_ptr, np.ascontiguousarray(hist, np.uint32))
            self._launch_exposure(out, hist_ptr, params, unit, n)
            self.stream.synchronize()
            dev.drv.memcpy_dtoh(host, out)
        return _exposure_of(host)

    def frame_done(self, generation: int) -> bool:
        """Whether frame `generation`, the newest, is complete on the GPU (False for an older one)."""
        with self.device.scope:
            return generation == self._generation and self._end.query()

    def figures(self, generation: int) -> tuple[Exposure, np.ndarray, float]:
        """(exposure, hist, gpu_ms) of frame `generation`, waiting for it; only the newest frame's exist."""
        if generation != self._generation:
            raise RuntimeError(
                f"splat frame {generation}'s figures were overwritten by frame {self._generation}: read a "
                "frame's exposure, hist or gpu_ms before the next draw"
            )
        with self.device.scope:
            self._end.synchronize()
            gpu_ms = self._begin.time_till(self._end)
        return _exposure_of(self._exposure_host[:4]), np.array(self._hist_host, copy=True), gpu_ms

    def _bloom(self, accum: int, exposure: int, bloom: Bloom, w: int, h: int, run) -> tuple[int, int]:
        """(index, glow) device pointers: the frame's tone-map indices (at the device `exposure`) and their
        glow (splat_bloom.py)."""
        pixels, dev = w * h, self.device
        index, rows, glow = (
            dev.scratch(f"splat-bloom-{k}", 4 * 3 * pixels) for k in ("index", "rows", "glow")
        )
        taps = self._table("bloom-taps", np.ascontiguousarray(bloom.taps, np.int32).tobytes())
        grid = -(-pixels // splat.BLOCK)
        with run("bloom"):
            self._launch("splat_indices", grid, index, accum, pixels, exposure)
            for out, src, along_rows, threshold in ((rows, index, 1, bloom.threshold), (glow, rows, 0, 0)):
                self._launch(
                    "splat_glow", grid, out, src, taps, bloom.reach, bloom.total, w, h, along_rows, threshold
                )
        return index, glow

    @staticmethod
    def binned(width: int, height: int, method: str = "auto") -> bool:
        if method not in METHODS:
            raise ValueError(f"splat: method {method!r}; choose from {', '.join(METHODS)}")
        fits = splat.tile_grid(width, height)[1] <= splat.MAX_TILES
        if method == "binned" and not fits:
            raise ValueError(f"splat: a {width}x{height} frame has more tiles than the binned path holds")
        return method == "binned" or (method == "auto" and fits)

    def _accumulate_binned(
        self, accum: int, body_args: tuple, light: int, n: int, w: int, h: int, timer
    ) -> None:
        """count -> offsets -> scatter -> tiles (kernels/splat.cu, "the binned accumulation"); `timer` times
        each as `binned.<kernel>` (the bench's breakdown)."""
        across, tiles = splat.tile_grid(w, h)
        dev = self.device
        counts, starts = dev.scratch("splat-counts", 4 * tiles), dev.scratch("splat-starts", 4 * tiles)
        cursor, chunks = dev.scratch("splat-cursor", 4 * tiles), dev.scratch("splat-chunks", 4 * (tiles + 1))
        placed, records = dev.scratch("splat-placed", 8 * n), dev.scratch("splat-records", 8 * n)
        run = timer or _untimed
        grid = min(-(-n // splat.BLOCK), 1024)
        rounds = -(-n // (splat.PER_THREAD * splat.BLOCK))
        with run("binned.count"):
            dev.drv.memset_d32_async(counts, 0, tiles, self.stream)
            self._launch("splat_count", grid, counts, placed, *body_args, across, tiles)
        with run("binned.offsets"):
            chunk = self.chunk or chunk_for(n)
            self._launch(
                "splat_offsets", 1, counts, starts, cursor, chunks, tiles, chunk, block=splat.OFFSETS_BLOCK
            )
        with run("binned.scatter"):
            self._launch("splat_scatter", min(rounds, 1024), records, cursor, placed, n, tiles)
        with run("binned.tiles"):
            self._launch("splat_tiles", tiles + -(-n // chunk), accum, records, starts, counts, chunks,
                         light, tiles, across, w, h, chunk)  # fmt: skip

    def _launch(self, name: str, blocks: int, *args, block: int = splat.BLOCK) -> None:
        self._fn[name].prepared_async_call((blocks, 1), (block, 1, 1), self.stream, *args)

    def read_image(self, frame: SplatFrame) -> np.ndarray:
        """The frame's image on the host, (height, width, 4) uint8 (tests, stills)."""
        out = np.empty((frame.height, frame.width, 4), np.uint8)
        with self.device.scope:
            self.device.drv.memcpy_dtoh(out, frame.image)
        return out

    def read_accum(self, frame: SplatFrame) -> np.ndarray:
        """The frame's integer buffer on the host, (height, width, 3) uint64 (tests)."""
        accum, _, _ = self.buffers(frame.width, frame.height)
        out = np.empty((frame.height, frame.width, 3), np.uint64)
        with self.device.scope:
            self.device.drv.memcpy_dtoh(out, accum)
        return out


def chunk_for(n: int) -> int:
    """Records per block of splat_tiles for N bodies: N / 1024 rounded down to a power of two, within
    4,096 .. splat.MAX_CHUNK. Smaller chunks share a galaxy's core tile among more blocks, larger ones
    add fewer partial tiles into the frame; this was the fastest of 1,024 .. 16,384 at 1M, 8M and 16M
    bodies (H200, 1920x1080: bench/results/h200-2026-11-26-splat-chunks.json)."""
    return int(min(max(1 << max(int(n) // 1024, 1).bit_length() - 1, 4096), splat.MAX_CHUNK))


def _exposure_of(words: np.ndarray) -> Exposure:
    """The Exposure in splat_exposure's 4 u64: scale, saturation, shift, the bits of x_per_unit."""
    scale, saturation, shift = (int(v) for v in words[:3])
    x = float(np.ascontiguousarray(words[3:4], np.uint64).view(np.float64)[0])
    return Exposure(scale, saturation, shift, x)


def _untimed(stage: str):
    return nullcontext()
