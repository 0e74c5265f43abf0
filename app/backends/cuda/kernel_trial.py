"""A new build of a kernel file tried in a sandbox process before the viewer runs it (issue 27, items 2
and 4): the hot reload's validation, and its safety.

    sandbox = Sandbox(ordinal)            # a child process with its own CUDA context, started at once
    result = sandbox.trial(request)       # the build launched over a copy of the state, judged here
    sandbox.close()

Why a process. A kernel that never ends (`while (1)`) cannot be stopped inside the context that
launched it: CUDA has no call that ends one kernel, and the context is only freed with everything in
it, the viewer's state and buffers included. In a child process the trial's context is its own: when the
build does not finish within the bound, the child is killed (the driver frees its context, and with it
the kernel: 0.06 s on an H200, bench/reload_hang_probe.py and its results
bench/results/h200-2026-11-26-reload-facts.txt), a new child is started,
and the viewer, whose kernels time-slice with the hung one meanwhile (2.4 ms per frame's launch instead
of 0.02 ms there), never ran the build. An illegal address kills only the child's context, too.

What a trial checks, in the child, on a copy of the state's float4 rows:
- the build's launch, timed, within the bound: over all N targets and sources, as the run launches it,
  where `shared` would take at most FULL_TRIAL_MS for that; else (a large N for an all-pairs kernel: at
  1M, 0.7 s a launch on an H200) over the 1,024 sampled targets against all N sources, so that a save
  is live within a few frames at any N. The bound is `HANG_FACTOR` times `shared`'s launch over the
  same targets (timed once per N), at least `FLOOR_S`: a build ten times slower than the plainest tiled
  kernel is taken for a hang (an all-pairs build that slow holds the viewer at a frame every few seconds).
  `shared` is timed over YARD_TARGETS targets (a wave of blocks: fewer would leave most multiprocessors
  idle and time latency, not throughput), and a full launch's time scaled from it;
- canary rows before and after its accelerations (a write past either end is reported, with how far);
- every acceleration it computed finite (a NaN refuses the build, naming the body; after a sampled
  launch, a NaN elsewhere is the run's non-finite check's to find);
- the float64 reference (the record in the role "reference") of the sampled targets, returned with the
  build's own accelerations of them for the parent to judge (app.engine.kernel_reload.judge).
With `sanitizer=True` the child runs under compute-sanitizer's memcheck, which names the faulting access
exactly (slower: for a kernel the canaries flagged, or in a gpu test).

Messages are pickles with a length prefix on the child's stdin and stdout; the state's rows go through
a file in shared memory (/dev/shm), written by the snapshot's one device-to-host copy, so that the
parent's worker thread sends a few hundred bytes. The child's stderr (and the sanitizer's report) go to files
whose tails explain a child that died.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import select
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.engine.forces import KernelRecord
from app.model.physics import Physics

FLOOR_S = 1.0  # the least time a trial's launch is given before it is taken for a hang
HANG_FACTOR = 10  # ... or this many times `shared`'s launch over as many rows
FULL_TRIAL_MS = 100.0  # launch over all N where `shared` would take this long at most, else the sample
YARD_TARGETS = 32768  # targets `shared` is timed over: 128 blocks of 256, a wave on an H100 / H200
READY_S = 120.0  # the child's start: a context, and the reference kernel (nvcc, if not in the cache)
GUARD_ROWS = 1024  # float4 canary rows before and after the accelerations
CANARY = 0x7FBADBAD  # a NaN's bits: no kernel computes it by accident
_LEN = struct.Struct("<Q")


@dataclass(frozen=True)
class TrialRequest:
    """What the child needs: the record (pickled: its policy and tunables), the build's cubin and the
    symbols it serves, the physics and tunables of the run, the state's float4 rows and the sampled
    targets."""

    record: KernelRecord
    cubin: bytes
    symbols: tuple[str, ...]
    physics: Physics
    tunables: dict
    rows_path: str  # the state's rows: N float4 (x, y, z, m), in a file of `Sandbox.rows_file`
    n: int
    targets: np.ndarray  # the sampled rows


@dataclass(frozen=True)
class TrialResult:
    """A trial's outcome: `problem` ("" when the launch returned, finite and within its rows) and, then,
    the build's and the float64 reference's accelerations of the sampled targets."""

    problem: str
    got: np.ndarray | None = None  # (K, 3) float64
    ref: np.ndarray | None = None
    launch_ms: float = 0.0
    bound_s: float = 0.0  # the hang bound it ran under
    worst_body: int = -1  # the first non-finite body, when that is the problem
    phases: dict | None = None  # seconds per phase, the child's and the round trip's (what a trial costs)
    rows: int = 0  # the targets the build was launched over: all N, or the sample


def _send(stream, message) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LEN.pack(len(data)) + data)
    stream.flush()


def _read_exactly(fd: int, n: int, deadline: float | None) -> bytes:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _receive(fd: int, deadline: float | None = None):
    (n,) = _LEN.unpack(_read_exactly(fd, _LEN.size, deadline))
    return pickle.loads(_read_exactly(fd, n, deadline))


class Sandbox:
    """The trial process on GPU `ordinal`, started at once (its context takes ~1 s) and again after a
    trial that hung or killed it."""

    def __init__(self, ordinal: int, sanitizer: bool = False):
        self.ordinal, self.sanitizer = int(ordinal), sanitizer
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self._dir = Path(tempfile.mkdtemp(prefix="nbody-trial-", dir=shm))
        self._files = 0
        self._proc: subprocess.Popen | None = None
        self._ready = False
        self.restarts = 0
        self._start()

    def _start(self) -> None:
        cmd = [sys.executable, "-m", "app.backends.cuda.kernel_trial", str(self.ordinal)]
        if self.sanitizer:
            tool = shutil.which("compute-sanitizer")
            if tool is None:
                raise RuntimeError("compute-sanitizer is not on PATH (it comes with the CUDA toolkit)")
            log = self._dir / "sanitizer.txt"
            cmd = [tool, "--tool", "memcheck", "--print-limit", "4", "--log-file", str(log), *cmd]
        root = str(Path(__file__).resolve().parents[3])  # the checkout: `-m app...` from anywhere
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        with open(self._dir / "stderr.txt", "wb") as err:
            self._proc = subprocess.Popen(
                cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env
            )
        self._ready = False

    def rows_file(self, n: int) -> tuple[str, np.memmap]:
        """A new file of n float4 rows for a trial's state, and the array mapped onto it to fill (its
        caller removes it after the trial; `close` removes any left)."""
        self._files += 1
        path = str(self._dir / f"rows-{self._files}.f32")
        return path, np.memmap(path, np.float32, "w+", shape=(n, 4))

    def _wait_ready(self) -> None:
        if self._ready:
            return
        assert self._proc is not None and self._proc.stdout is not None
        try:
            _receive(self._proc.stdout.fileno(), time.monotonic() + READY_S)
        except (TimeoutError, EOFError):
            why = self._died()
            raise RuntimeError(f"the kernel trial process did not start: {why}") from None
        self._ready = True

    def _died(self) -> str:
        """Why the child stopped: its last stderr lines (and the sanitizer's first report)."""
        lines = []
        report = self._dir / "sanitizer.txt"
        if report.is_file():
            found = [ln.strip("= \n") for ln in report.read_text(errors="replace").splitlines()]
            lines += [
                ln for ln in found if ln and ("Invalid" in ln or " at " in ln or "out of bounds" in ln)
            ][:3]
        err = (self._dir / "stderr.txt").read_text(errors="replace").strip().splitlines()
        lines += [ln for ln in err if ln.strip()][-2:]
        return "; ".join(lines) or "it exited without a word"

    def _restart(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        if self._proc is not None:
            self._proc.wait()
        self.restarts += 1
        self._start()

    def trial(self, request: TrialRequest) -> TrialResult:
        """Run `request` in the child; a hang (past the bound the child names first) or a child that died
        is the result's problem, and the child is started again for the next trial."""
        self._wait_ready()
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        t0 = time.perf_counter()
        bound, why = 0.0, ""
        try:
            _send(proc.stdin, ("trial", request))
            fd = proc.stdout.fileno()
            bound, why = _receive(fd, time.monotonic() + READY_S)  # (rows in, `shared` timed once per N)
            answer = _receive(fd, time.monotonic() + bound)
        except TimeoutError:
            self._restart()
            if not bound:
                return TrialResult("its trial process did not answer (it was started again)")
            return TrialResult(
                f"it did not finish within {bound:.1f} s ({why}): a loop that never ends? It was stopped "
                "with its sandbox process and never ran in the viewer",
                bound_s=bound,
            )
        except (EOFError, BrokenPipeError):
            proc.wait()
            why = self._died()
            self._restart()
            return TrialResult(f"its trial process died ({why}); it never ran in the viewer")
        if answer.get("fault"):  # an illegal address leaves the child's context unusable: a new child
            proc.stdin.close()  # (it ends by itself, and compute-sanitizer then writes its report)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            why = self._died()
            self._restart()
            return TrialResult(
                f"its launch failed: {answer['fault']} ({why}); it never ran in the viewer", bound_s=bound
            )
        phases = {**answer.get("phases", {}), "round trip": time.perf_counter() - t0}
        return TrialResult(
            answer.get("problem", ""),
            answer.get("got"),
            answer.get("ref"),
            answer["launch_ms"],
            bound,
            answer.get("body", -1),
            phases,
            answer["rows"],
        )

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            try:
                if proc.stdin is not None:
                    proc.stdin.close()
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                proc.kill()
                proc.wait()
        shutil.rmtree(self._dir, ignore_errors=True)


# --- the child --------------------------------------------------------------------------------------
def _serve(ordinal: int) -> None:
    """The child's loop: a context on GPU `ordinal`, the reference and `shared` loaded, then trials."""
    from app.backends.cuda import registry
    from app.backends.cuda.device import CudaDevice
    from app.backends.cuda.evaluator import make_evaluator
    from app.engine.forces import with_role

    records = {r.name: r for r in registry.RECORDS}
    device = CudaDevice(ordinal)
    reference = make_evaluator(with_role(registry.RECORDS, "reference"), device, records)
    shared = make_evaluator(records["shared"], device, records)
    with device.scope:
        reference.prepare(1)
        shared.prepare(1)
    # the messages get stdout's file; anything a library prints goes to stderr instead of into them
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    _send(out, "ready")
    fd = sys.stdin.buffer.fileno()
    yardsticks: dict[tuple, float] = {}  # (N, K, physics) -> `shared`'s ms over K sampled targets
    while True:
        try:
            _kind, request = _receive(fd)
        except EOFError:
            return
        _send(out, _run_trial(device, reference, shared, request, yardsticks, out))


class _Phases(dict):
    """Seconds per phase of a trial, each from the end of the one before."""

    def __init__(self):
        super().__init__()
        self._t = time.perf_counter()

    def __call__(self, name: str) -> None:
        now = time.perf_counter()
        self[name], self._t = now - self._t, now


def _run_trial(device, reference, shared, req: TrialRequest, yardsticks: dict, out) -> dict:
    """The trial's launches; its bound is sent first, then the answer (module doc). The rows are laid
    out as [sampled targets; every body]: the sample is the launch's targets against the N sources behind
    them, and the N bodies alone are the full launch's targets and sources."""
    from app.backends.cuda.evaluator import CudaEvaluator, reference_accelerations
    from app.engine.forces import Span

    drv = device.drv
    n, k = req.n, int(req.targets.size)
    phase = _Phases()
    rows4 = np.fromfile(req.rows_path, dtype=np.float32, count=4 * n).reshape(n, 4)
    stacked = np.concatenate([rows4[req.targets], rows4])
    with device.scope:
        pos = device.scratch("trial-pos", stacked.nbytes)
        drv.memcpy_htod(pos, stacked)
        whole = device.scratch("trial-acc", 16 * (max(n, k) + 2 * GUARD_ROWS))
        acc = whole + 16 * GUARD_ROWS
        phase("rows in")
        key = (n, req.physics)
        if key not in yardsticks:  # `shared` over enough targets to fill the GPU, against all N
            shared.set_physics(req.physics)
            body0, wave = pos + 16 * k, min(n, YARD_TARGETS)
            yardsticks[key] = _timed(device, lambda: shared.evaluate(body0, acc, Span(0, wave), Span.all(n)))
            phase("shared timed")
        wave_ms = yardsticks[key]  # what a launch over up to one wave of targets takes, a sample's too
        full_ms = wave_ms * max(1.0, n / YARD_TARGETS)
        full = full_ms <= FULL_TRIAL_MS
        expected = full_ms if full else wave_ms
        bound = max(FLOOR_S, HANG_FACTOR * expected / 1e3)
        said = "all" if full else "sampled"
        yardstick = (
            f"{HANG_FACTOR}x `shared`'s {expected:.1f} ms over the {said} targets, at least {FLOOR_S:g} s"
        )
        _send(out, (bound, yardstick))
        device.install(str(req.record.source), req.cubin, req.symbols)
        build = CudaEvaluator(req.record, device, {})
        build.set_physics(req.physics)
        build.set_tunables(**req.tunables)
        m = n if full else k  # the rows launched
        drv.memset_d32(whole, CANARY, 4 * (m + 2 * GUARD_ROWS))
        try:
            if full:  # the N bodies behind the sample, as targets and sources
                body0 = pos + 16 * k
                launch_ms = _timed(device, lambda: build.evaluate(body0, acc, Span.all(n), Span.all(n)))
            else:
                launch_ms = _timed(device, lambda: build.evaluate(pos, acc, Span(0, k), Span(k, n)))
            words = np.empty(4 * (m + 2 * GUARD_ROWS), dtype=np.uint32)
            drv.memcpy_dtoh(words, whole)
        except drv.Error as e:
            return {"fault": f"{type(e).__name__}: {e}"}
        phase("build launched")
        answer = {"launch_ms": launch_ms, "phases": dict(phase), "rows": m}
        problem = _outside(words, m)
        if problem:
            return {**answer, "problem": problem}
        got = words.view(np.float32).reshape(-1, 4)[GUARD_ROWS : GUARD_ROWS + m, :3]
        finite = np.isfinite(got).all(axis=1)
        if not finite.all():
            row = int(np.argmin(finite))
            body = row if full else int(req.targets[row])
            what = f"{(~finite).sum():,} of the {m:,} bodies launched"
            return {**answer, "problem": f"body {body}: a non-finite acceleration ({what})", "body": body}
        reference.set_physics(req.physics)
        ref = reference_accelerations(reference, device, stacked, k, key="trial-ref")
        phase("reference")
    sample = got[req.targets] if full else got
    return {**answer, "phases": dict(phase), "got": sample.astype(np.float64), "ref": ref}


def _timed(device, launch) -> float:
    drv = device.drv
    start, stop = drv.Event(), drv.Event()
    start.record()
    launch()
    stop.record()
    stop.synchronize()
    return stop.time_since(start)


def _outside(words: np.ndarray, m: int) -> str:
    """Which canary rows a launch over m rows changed: '' when none, else where its writes went."""
    rows = words.reshape(-1, 4)
    before = np.flatnonzero((rows[:GUARD_ROWS] != CANARY).any(axis=1))
    after = np.flatnonzero((rows[GUARD_ROWS + m :] != CANARY).any(axis=1))
    where = []
    if before.size:
        where.append(f"{GUARD_ROWS - before[0]} rows before the first body's")
    if after.size:
        where.append(f"{after[-1] + 1} rows past the last body's")
    if not where:
        return ""
    return f"it wrote outside its accelerations (up to {' and '.join(where)}): an out-of-bounds write"


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
