"""A kernel file's hot reload on one GPU (issue 27, item 2): the CUDA backend's stages of
app.engine.kernel_reload's Reloader.

    hooks = backend.kernel_reload()       # a CudaReload; its sandbox process starts now (~1 s)
    Reloader(FileWatch(hooks.paths()), hooks.build, hooks.validate, hooks.swap, hooks.snapshot)

- build (worker thread): the header read again (a bad one, or a new name, is the build's error) and the
  file compiled for the form the run launches (reload_build.py: NVRTC where cuda-core imports);
- snapshot (the stepping thread): the state's float4 rows copied to the host, with the physics and the
  kernel's tunables as the run has them;
- validate (worker): the build launched in the sandbox over that copy (kernel_trial.py: bounded against a
  hang, canaries against a stray write, every acceleration finite), its sampled targets judged against
  float64 within the record's budget (app.engine.kernel_reload.judge);
- swap (the stepping thread, between two steps): the record and the module replaced on every device of
  the run (CudaBackend.install_build), the state untouched; then the file's other forms compiled in
  the background by nvcc (its disk cache serves a later physics change).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from app.backends.cuda.compile import compile_file
from app.backends.cuda.errors import KernelCompileError
from app.backends.cuda.kernel_trial import Sandbox, TrialRequest, TrialResult
from app.backends.cuda.policy_base import force_arguments
from app.backends.cuda.reload_build import Built, build, form_of
from app.backends.cuda.user_kernels import first_compile_error, is_user
from app.core.errors import ConfigError
from app.engine.forces import KernelRecord
from app.engine.kernel_reload import Validation, judge, sample_targets
from app.model.physics import Physics

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Snapshot:
    rows_path: str  # the state's rows, N float4, in a file the sandbox reads (Sandbox.rows_file)
    n: int
    physics: Physics
    tunables: dict  # kernel name -> the values the run has set over its record's defaults


class CudaReload:
    """The Reloader's stages for `backend` (a CudaBackend on one GPU); `sanitizer`: trials under
    compute-sanitizer."""

    def __init__(self, backend, sanitizer: bool = False):
        self.backend = backend
        self.arch = backend.device.facts.arch
        self.sandbox = Sandbox(backend.device.ordinal, sanitizer)
        self._background = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kernel-forms")
        self.last_trial: TrialResult | None = None  # its phases: what the last validation cost

    def paths(self) -> list[Path]:
        return [Path(str(r.source)) for r in self.backend.kernels() if is_user(r)]

    def _loaded(self, path: Path) -> KernelRecord | None:
        return next((r for r in self.backend.kernels() if r.source == str(path)), None)

    # --- the stages ------------------------------------------------------------------------------
    def build(self, path: Path) -> Built:
        before = self._loaded(path)
        return build(path, self.arch, self.backend.physics, before.name if before is not None else None)

    def snapshot(self) -> Snapshot:
        backend = self.backend
        n = backend.n
        path, rows = self.sandbox.rows_file(n)
        with backend.state_arrays() as (precision, pos, _vel):
            if precision == "fp64":  # the fp64 record's double rows, rounded as a switch to fp32 would
                double = np.empty((n, 4))
                backend.device.drv.memcpy_dtoh(double, pos)
                rows[:] = double
            else:
                backend.device.drv.memcpy_dtoh(rows, pos)
        rows.flush()
        del rows
        tunables = {name: dict(values) for name, values in backend._tunable_store().items()}
        return Snapshot(path, n, backend.physics, tunables)

    def validate(self, built: Built, snap: Snapshot) -> Validation:
        try:
            return self._validate(built, snap)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(snap.rows_path)

    def _validate(self, built: Built, snap: Snapshot) -> Validation:
        record = built.record
        repulsion, soft, *_ = force_arguments(snap.physics)
        if built.build.form != form_of(repulsion, soft):
            return Validation(
                False, -1, float("nan"), float("nan"), "the physics changed while it compiled: save again"
            )
        try:
            tunables = record.with_tunables(snap.tunables.get(record.name, {}))
        except ConfigError:  # the header changed the tunables' values: its defaults
            tunables = record.default_tunables()
        targets = sample_targets(snap.n)
        result = self.sandbox.trial(
            TrialRequest(
                record,
                built.build.cubin,
                built.symbols,
                snap.physics,
                tunables,
                snap.rows_path,
                snap.n,
                targets,
            )
        )
        self.last_trial = result
        if result.problem:
            return Validation(False, result.worst_body, float("nan"), float("nan"), result.problem)
        assert result.got is not None and result.ref is not None
        return judge(result.got, result.ref, targets, record.error_budget.max_rel)

    def swap(self, built: Built) -> None:
        self.backend.install_build(built.record, built.build.cubin, built.symbols)
        self._background.submit(self._other_forms, built.record)

    def _other_forms(self, record: KernelRecord) -> None:
        """The whole file by nvcc into the compile cache, so that a later change of the physics loads
        the other forms from there instead of compiling while a frame waits."""
        try:
            compile_file(str(record.source), self.arch, record.policy.nvcc_options)
        except KernelCompileError as e:  # it compiled one form: the others should too; say so if not
            log.warning("%s: the other forms did not compile: %s", record.source, first_compile_error(e.log))

    def close(self) -> None:
        self._background.shutdown(wait=False, cancel_futures=True)
        self.sandbox.close()
