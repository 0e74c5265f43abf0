"""Errors a user can act on. The CLI prints their message as one line and exits with `exit_code`."""


class UserError(Exception):
    """A problem with what the user asked for (bad flag, bad scene key, bad file). Exit status 2."""

    exit_code = 2


class InputFileError(UserError):
    """A malformed or physically invalid input file; the message names the file and the line or record."""


class ConfigError(UserError):
    """An invalid scene/CLI setting; the message names the key and the allowed values or range."""


class BackendUnavailable(UserError):
    """An explicitly requested backend or kernel cannot run here; the message carries its why_not."""


class RuntimeFault(Exception):
    """A failure while running (unwritable output, device out of memory). Exit status 1."""

    exit_code = 1


class StateOutOfMemory(RuntimeFault):
    """A device has too little free memory for the bodies' state. A backend whose current state still
    holds memory there may give it back and try once more (the current state is then gone)."""


class NonFiniteState(RuntimeFault):
    """A position, mass or velocity became NaN/inf; the viewer turns this into a pause.

    `index` is the first non-finite body the check found (-1 when unknown), `step` the step count at
    which it was reported; with several devices (`--gpus`) `device` is the index of the device whose
    share holds the body (its name in `device_name`), None on one device; under MPI `rank` is the rank
    whose share holds it (every rank raises the same report: app.backends.distributed.fail_together lets that
    rank alone say it), None in one process.
    """

    def __init__(
        self,
        index: int,
        step: int | None = None,
        time: float | None = None,
        detail: str = "",
        device: int | None = None,
        device_name: str = "",
        rank: int | None = None,
    ):
        self.index = int(index)
        self.step = step
        self.time = time
        self.device = device
        self.rank = rank
        on = "" if device is None else f" on device {device}" + (f" ({device_name})" if device_name else "")
        on += "" if rank is None else f" on rank {rank}"
        where = f" after step {step}" if step is not None else ""
        when = f" (t = {time:.6g})" if time is not None else ""
        msg = (
            f"non-finite position or velocity at body {self.index}{on}{where}{when}: the simulation "
            "blew up; lower dt or raise the softening"
        )
        super().__init__(msg + (f" ({detail})" if detail else ""))
