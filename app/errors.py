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
