"""Launch policies of the CUDA kernel suite (issue 5), mixed into CudaBackend.

Every force record has a `registry.LaunchPolicy` whose `kind` says how it is launched:

    grid              one thread per body, ceil(N / B) blocks (naive, shared, shared-unroll, ...)
    block-template    the same, with the compile-time specialisation block_template_b<B>
    multi-thread      q threads per body: ceil(N * q / B) blocks, symbol multi_thread_q<q>
    register-blocked  2D grid (body tiles of B*K) x (j-slices); with more than one slice a second tiny
                      kernel (regblock_reduce) adds the partial sums from a scratch buffer
    n3l               memset(acc) then one warp per (i-tile, chunk of j-tiles); float4 atomics
    streams           main kernel on stream 1, remainder kernel on stream 2, concurrently
    fp64              double state (pos64, vel64, acc64) with its own integrators (kernels/fp64.cu)
    best              resolved at load time to another record + tunables from the tuning cache

Tunables: each record's `tunables` lists the allowed values; `registry.default_tunables` gives the
record's own; `set_tunables()` overrides them for the current kernel (what `nbody-live tune` does).
Everything here runs inside the backend's context scope, like the rest of the backend.
"""

from __future__ import annotations

import logging
import math

import numpy as np

from app.backends.base import KernelRecord
from app.backends.cuda import registry
from app.backends.cuda.errors import KernelCompileError
from app.errors import ConfigError

log = logging.getLogger(__name__)

FALLBACK_KERNEL = "register-blocked"  # what `best` runs when the tuning cache has no entry
MAX_SCRATCH_BYTES = 512 * 2**20
REDUCE_BLOCK = 256


# --- launch geometry (pure functions: unit-tested on the CPU) ------------------------------------------
def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def slice_plan(n: int, block: int, slices: int) -> tuple[int, int]:
    """(slice_len, slices actually used): slice_len is a multiple of `block` covering n in `slices`."""
    slices = max(1, min(int(slices), _ceil_div(max(n, 1), block)))
    slice_len = _ceil_div(_ceil_div(max(n, 1), slices), block) * block
    return slice_len, _ceil_div(max(n, 1), slice_len)


def auto_slices(n: int, block: int, k: int, sms: int, warps_per_sm: int = 16) -> int:
    """How many j-slices register-blocked needs so that every SM has enough warps and equal work.

    Scores each distinct slice count by (blocks per SM / its ceiling: the balance of the last wave) x
    (resident warps per SM / warps_per_sm, capped at 1), with a small preference for fewer slices
    (less partial-sum traffic); at large N this is 1.
    """
    body_blocks = _ceil_div(max(n, 1), block * k)
    best, best_score = 1, -1.0
    seen = set()
    for s in range(1, 129):
        slice_len, used = slice_plan(n, block, s)
        if used in seen:
            continue
        seen.add(used)
        total = body_blocks * used
        per_sm = total / max(sms, 1)
        balance = per_sm / math.ceil(per_sm)
        occupancy = min(1.0, per_sm * (block // 32) / warps_per_sm)
        score = balance * occupancy / (1.0 + 0.003 * used)
        if score > best_score + 1e-9:
            best, best_score = used, score
    return best


def n3l_tasks(n: int, ki: int, chunk: int) -> int:
    """Non-empty warp tasks of atomics-n3l: rows of 32*ki bodies x chunks of 64-body j-tiles."""
    ntj = _ceil_div(n, 64)
    nti = _ceil_div(n, 32 * ki)
    r = ki // 2
    return sum(_ceil_div(ntj - row * r, chunk) for row in range(nti) if ntj - row * r > 0)


def auto_chunk(n: int, ki: int, sms: int, tasks_per_sm: int = 64) -> int:
    """The largest chunk (fewest atomics) that still gives every SM `tasks_per_sm` warp tasks."""
    for chunk in (64, 32, 16, 8, 4, 2):
        if n3l_tasks(n, ki, chunk) >= sms * tasks_per_sm:
            return chunk
    return 1


def n3l_geometry(n: int, ki: int, chunk: int, block: int) -> tuple[int, int, int]:
    """(chunk, chunks_per_row, blocks), chunk raised if needed to keep the thread count below 2^31."""
    ntj = _ceil_div(n, 64)
    nti = _ceil_div(n, 32 * ki)
    chunk = max(1, chunk)
    while nti * _ceil_div(ntj, chunk) * 32 >= 2**31 - block:
        chunk *= 2
    cpr = _ceil_div(ntj, chunk)
    return chunk, cpr, _ceil_div(nti * cpr * 32, block)


def _suffix(repulsion: bool, soft: bool) -> str:
    return f"{'repulsion' if repulsion else 'gravity'}_{'soft' if soft else 'plain'}"


# --- the mixin ---------------------------------------------------------------------------------------------
class KernelPolicies:
    """Launch policies, tunables, `best` resolution and the fp64 state, for CudaBackend."""

    def _init_policies(self) -> None:
        self._tunables: dict[str, dict[str, int]] = {}
        self._resolved: tuple[KernelRecord, dict, int] | None = None
        self._extra: dict[str, object] = {}  # scratch and fp64 buffers (not part of _allocate's set)
        self._extra_sizes: dict[str, int] = {}
        self._streams = None
        self._fp64_valid = False
        self._plans: dict[tuple, object] = {}  # launch plans (see _force_plan)

    def _close_policies(self) -> None:
        for alloc in self._extra.values():
            alloc.free()
        self._extra.clear()
        self._extra_sizes.clear()
        self._streams = None
        self._fp64_valid = False
        self._plans.clear()

    # --- which kernel and settings run ----------------------------------------------------------
    def _merged_tunables(self, rec: KernelRecord) -> dict[str, int]:
        tun = registry.default_tunables(rec)
        tun.update(self._tunables.get(rec.name, {}))
        allowed = rec.tunables.get("block_size")
        if self._block_override is not None and (allowed is None or self._block_override in allowed):
            tun["block_size"] = self._block_override
        return tun

    def _active(self) -> tuple[KernelRecord, dict[str, int]]:
        """The record and tunables the next force launch uses (`best` resolved for the current N)."""
        rec = self.record(self._kernel)
        if registry.launch_policy(rec).kind != "best":
            return rec, self._merged_tunables(rec)
        if self._resolved is None or self._resolved[2] != self._n:
            self._resolved = self._resolve_best(self._n)
        return self._resolved[0], dict(self._resolved[1])

    def _resolve_best(self, n: int) -> tuple[KernelRecord, dict, int]:
        from app import tune

        fallback = self.record(FALLBACK_KERNEL)
        try:
            choice, why = tune.lookup(n, self._facts)
        except Exception as e:  # a broken cache must never stop the viewer
            choice, why = None, f"tuning cache unreadable ({e})"
        if choice is not None:
            try:
                rec = self.record(choice["variant"])
                tun = registry.default_tunables(rec)
                tun.update({k: int(v) for k, v in choice.get("tunables", {}).items() if k in rec.tunables})
                self.compiled(rec.source)
            except (ConfigError, KernelCompileError, KeyError, TypeError, ValueError) as e:
                why = f"the cached choice cannot be used ({e})"
            else:
                log.info("best: N = %d -> %s %s (tuned at N = %d: %.0f G interactions/s)", n, rec.name,
                         _fmt(tun), choice.get("n", 0), choice.get("interactions_per_s", 0) / 1e9)
                return rec, tun, n
        tun = registry.default_tunables(fallback)
        log.info("best: %s; using %s %s (run `nbody-live tune` to measure this GPU)", why, fallback.name,
                 _fmt(tun))
        return fallback, tun, n

    def set_tunables(self, **values: int) -> None:
        """Override tunables of the current kernel (validated against its record's allowed values)."""
        rec = self.record(self._kernel)
        for key, value in values.items():
            allowed = rec.tunables.get(key)
            if allowed is None:
                keys = ", ".join(rec.tunables) or "none"
                raise ConfigError(f"{rec.name}: no tunable {key!r} (tunables: {keys})")
            if value not in allowed:
                raise ConfigError(f"{rec.name}.{key}: {value} is not one of {', '.join(map(str, allowed))}")
        self._tunables[rec.name] = {**self._tunables.get(rec.name, {}), **values}

    def clear_tunables(self) -> None:
        self._tunables.clear()

    def tunables(self) -> dict[str, int]:
        """The tunables the next launch uses (for `best`: the resolved variant's)."""
        return dict(self._active()[1])

    @property
    def resolved_kernel(self) -> str:
        """'register-blocked block_size=128 k=4 slices=0': what actually runs (useful for `best`)."""
        rec, tun = self._active()
        return f"{rec.name} {_fmt(tun)}".strip()

    def _prepare_active(self) -> None:
        """Compile and load the active record's entries (called after load / set_kernel)."""
        rec, tun = self._active()
        policy = registry.launch_policy(rec)
        for repulsion in (False, True):
            for soft in (True, False):
                symbol = registry.launch_symbol(rec, repulsion, soft, tun)
                self._function(rec.source, symbol, policy.arg_types)

    def _after_kernel_change(self, bodies=None, precision_before: str | None = None) -> None:
        """Resolve `best`, load the entries and, for fp64, bring the double state up to date."""
        self._resolved = None
        if not self._n:
            return
        with self._scope:
            self._prepare_active()
            rec, _ = self._active()
            if rec.precision != precision_before:
                self._acc_valid = False  # the cached acceleration belongs to the other precision
            if rec.precision == "fp64":
                if bodies is not None:
                    self._upload_fp64(bodies.pos, bodies.vel, bodies.mass)
                elif not self._fp64_valid:
                    self._promote_fp64()

    def _active_precision(self) -> str | None:
        try:
            return self._active()[0].precision if self._n else None
        except ConfigError:
            return None

    # --- scratch and streams ---------------------------------------------------------------------
    def _scratch(self, key: str, nbytes: int) -> int:
        nbytes = max(int(nbytes), 16)
        if self._extra_sizes.get(key, 0) < nbytes:
            if key in self._extra:
                self._extra.pop(key).free()
            self._extra[key] = self._drv.mem_alloc(nbytes)
            self._extra_sizes[key] = nbytes
        return int(self._extra[key])

    def _stream_pair(self):
        if self._streams is None:
            self._streams = (self._drv.Stream(), self._drv.Stream())  # blocking: ordered with stream 0
        return self._streams

    # --- the force launch --------------------------------------------------------------------------
    def _force_plan(self):
        """`run(pos_ptr, acc_ptr)` for the current kernel, tunables, N and physics, cached.

        All the Python (record and tunables, symbols, grid geometry, N3L task counts) happens here,
        once per configuration, so that between the two CUDA events of the force timing only the
        driver calls remain: at N = 4,096 a kernel runs for ~10 µs, and a few hundred µs of Python
        between the start event and the launch would otherwise be timed as GPU time.
        """
        from app.backends.cuda.backend import force_arguments

        rec, tun = self._active()
        args = force_arguments(self._physics)
        key = (rec.name, tuple(sorted(tun.items())), self._n, args)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) > 64:
                self._plans.clear()
            plan = self._plans[key] = self._build_plan(rec, tun, args)
        return plan

    def _build_plan(self, rec, tun, args):
        repulsion, soft, eps2, g, h = args
        policy = registry.launch_policy(rec)
        n = self._n
        block = int(tun.get("block_size") or rec.block_size or 256)
        fn = self._function(rec.source, registry.launch_symbol(rec, repulsion, soft, tun), policy.arg_types)
        shared = policy.shared_bytes_per_thread * block
        kind = policy.kind
        drv = self._drv
        if kind == "register-blocked":
            k = int(tun["k"])
            slices = int(tun.get("slices", 0)) or auto_slices(n, block, k, self._facts.sms)
            body_blocks = _ceil_div(n, block * k)
            npad = body_blocks * block * k
            while slices > 1 and slices * npad * 16 > MAX_SCRATCH_BYTES:
                slices //= 2
            slice_len, slices = slice_plan(n, block, slices)
            if slices == 1:
                def run(pos, acc):
                    fn.prepared_call((body_blocks, 1), (block, 1, 1), pos, acc, n, eps2, g, h, 0, slice_len)
                return run
            red = self._function(rec.source, "regblock_reduce", "PPiiif")
            nbytes, scale, rgrid = slices * npad * 16, 1.0 if repulsion else g, _ceil_div(n, REDUCE_BLOCK)

            def run(pos, acc):
                partial = self._scratch("partial", nbytes)  # looked up per launch: it may have grown
                fn.prepared_call((body_blocks, slices), (block, 1, 1), pos, acc, n, eps2, g, h, partial,
                                 slice_len)
                red.prepared_call((rgrid, 1), (REDUCE_BLOCK, 1, 1), partial, acc, n, npad, slices, scale)
            return run
        if kind == "n3l":
            ki = int(tun["ki"])
            chunk = int(tun.get("chunk", 0)) or auto_chunk(n, ki, self._facts.sms)
            chunk, cpr, blocks = n3l_geometry(n, ki, chunk, block)

            def run(pos, acc):
                drv.memset_d32(acc, 0, 4 * n)
                fn.prepared_call((blocks, 1), (block, 1, 1), pos, acc, n, eps2, g, h, chunk, cpr)
            return run
        if kind == "multi-thread":
            grid = (_ceil_div(n * int(tun["q"]), block), 1)

            def run(pos, acc):
                fn.prepared_call(grid, (block, 1, 1), pos, acc, n, eps2, g, h, shared_size=shared)
            return run
        if kind == "streams":
            s1, s2 = self._stream_pair()
            nfull = (n // block) * block
            tail = self._function(rec.source, f"streams_remainder_tail_{_suffix(repulsion, soft)}",
                                  policy.arg_types)

            def run(pos, acc):
                if nfull:
                    fn.prepared_async_call((nfull // block, 1), (block, 1, 1), s1, pos, acc, n, eps2, g, h,
                                           shared_size=shared)
                if n > nfull:
                    tail.prepared_async_call((1, 1), (block, 1, 1), s2, pos, acc, n, eps2, g, h,
                                             shared_size=shared)
            return run
        if kind == "fp64":
            grid = (_ceil_div(n, block), 1)

            def run(pos, acc):
                pos64, _vel64, acc64 = self._fp64_ptrs()
                fn.prepared_call(grid, (block, 1, 1), pos64, acc, n, eps2, g, h, acc64, shared_size=shared)
            return run
        # grid, block-template: one thread per body
        block = self._force_block_for(fn, block)
        grid, shared = (_ceil_div(n, block), 1), policy.shared_bytes_per_thread * block

        def run(pos, acc):
            fn.prepared_call(grid, (block, 1, 1), pos, acc, n, eps2, g, h, shared_size=shared)
        return run

    def _force_block_for(self, fn, block: int) -> int:
        try:
            limit = fn.get_attribute(self._drv.function_attribute.MAX_THREADS_PER_BLOCK)
            block = min(block, int(limit))
        except Exception:
            pass
        return block

    # --- fp64 state ----------------------------------------------------------------------------------
    def _fp64_ptrs(self) -> tuple[int, int, int]:
        size = 32 * max(self._n, 1)
        return tuple(self._scratch(key, size) for key in ("pos64", "vel64", "acc64"))

    def _upload_fp64(self, pos, vel, mass) -> None:
        pos64, vel64, _acc64 = self._fp64_ptrs()
        p = np.zeros((self._n, 4), dtype=np.float64)
        p[:, :3] = pos
        p[:, 3] = mass
        v = np.zeros((self._n, 4), dtype=np.float64)
        v[:, :3] = vel
        self._drv.memcpy_htod(pos64, p)
        self._drv.memcpy_htod(vel64, v)
        self._fp64_valid = True

    def _promote_fp64(self) -> None:
        """The double state from the float32 one (positions/velocities promoted, masses exact)."""
        pos4, _speed = self._read_render_arrays()
        vel4 = np.empty((self._n, 4), dtype=np.float32)
        self._drv.memcpy_dtoh(vel4, self._ptr("vel"))
        self._upload_fp64(pos4[:, :3].astype(np.float64), vel4[:, :3].astype(np.float64), self._mass)

    def _fp64_state(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(pos, vel) in float64 when fp64 runs and its state is current, else None."""
        if self._active_precision() != "fp64" or not self._fp64_valid:
            return None
        pos64, vel64, _acc64 = self._fp64_ptrs()
        p = np.empty((self._n, 4), dtype=np.float64)
        v = np.empty((self._n, 4), dtype=np.float64)
        with self._scope:
            self._drv.memcpy_dtoh(p, pos64)
            self._drv.memcpy_dtoh(v, vel64)
        return p[:, :3], v[:, :3]

    def _read_acc64(self) -> np.ndarray:
        out = np.empty((self._n, 4), dtype=np.float64)
        self._drv.memcpy_dtoh(out, self._fp64_ptrs()[2])
        return out[:, :3].copy()

    def _advance_fp64(self, pos: int, speed: int) -> None:
        """One integrator step in double precision (kernels/fp64.cu), mirroring _advance."""
        p = self._physics
        n, dt = self._n, float(p.dt)
        pos64, vel64, acc64 = self._fp64_ptrs()
        vel = self._ptr("vel")
        src = "fp64.cu"
        grid, blk = (_ceil_div(n, 256), 1), (256, 1, 1)
        if p.integrator == "leapfrog":
            if not self._acc_valid:
                self._force(pos)
            self._acc_valid = False
            with self._timer.time("integrate"):
                self._function(src, "fp64_kick_drift", "PPPPPidd").prepared_call(
                    grid, blk, pos64, vel64, acc64, pos, vel, n, 0.5 * dt, dt)
            self._force(pos)
            self._acc_valid = True
            with self._timer.time("integrate"):
                self._function(src, "fp64_kick", "PPPPid").prepared_call(
                    grid, blk, vel64, acc64, vel, speed, n, 0.5 * dt)
        else:
            self._acc_valid = False
            self._force(pos)
            with self._timer.time("integrate"):
                self._function(src, "fp64_euler_damped", "PPPPPPidd").prepared_call(
                    grid, blk, pos64, vel64, acc64, pos, vel, speed, n, dt, float(p.damping))

    # --- the interaction matrix ----------------------------------------------------------------------
    def interaction_matrix(self) -> np.ndarray:
        """(N, N) float32 |a_ij| (body j's pull on body i) for the heatmap; N <= 8,192."""
        from app.backends.cuda.backend import force_arguments

        self._require_state()
        n = self._n
        if n > registry.PAIR_MATRIX_MAX_N:
            raise ConfigError(f"interaction matrix: N = {n:,} is over {registry.PAIR_MATRIX_MAX_N:,} "
                              f"(it would take {4 * n * n / 2**30:.1f} GiB)")
        repulsion, soft, eps2, g, h = force_arguments(self._physics)
        out = np.empty((n, n), dtype=np.float32)
        with self._scope:
            fn = self._function(registry.PAIR_MATRIX_SOURCE, f"pair_matrix_fill_{_suffix(repulsion, soft)}",
                                "PPifff")
            buf = self._drv.mem_alloc(max(4 * n * n, 16))
            try:
                with self._device_arrays() as (pos, _speed):
                    grid = (_ceil_div(n, 16), _ceil_div(n, 16))
                    fn.prepared_call(grid, (16, 16, 1), pos, int(buf), n, eps2, g, h)
                self._drv.memcpy_dtoh(out, buf)
            finally:
                buf.free()
        return out


def _fmt(tun: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(tun.items()))
