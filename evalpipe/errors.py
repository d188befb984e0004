"""Errors a stage can end with, each carrying the exit code a cron job can act on."""

EXIT_OK = 0
EXIT_INCOMPLETE = 3  # some selected tasks are not done yet: rerun the same command
EXIT_BAD_INPUT = 2  # bad flags or bad input file (argparse also exits 2)
EXIT_ENDPOINT_REFUSED = 4  # 401/403/404/quota: rerunning will not help until fixed
EXIT_LOCKED = 5  # another run is writing the same output
EXIT_WAITING = 75  # --backend batch: batches submitted, still waiting (EX_TEMPFAIL: run again later)
EXIT_INTERRUPTED = 130  # SIGINT or SIGTERM


class StageError(Exception):
    """An error that ends a stage with a one-line reason and a specific exit code."""

    exit_code = 1


class BadInput(StageError):
    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, path=None, line: int | None = None):
        where = ""
        if path is not None:
            where = f"{path}:{line}: " if line is not None else f"{path}: "
        super().__init__(where + message)
        self.path = path
        self.line = line


class Locked(StageError):
    exit_code = EXIT_LOCKED


class EndpointRefused(StageError):
    """The endpoint refused us for a reason no retry can fix (auth, permission, model, quota)."""

    exit_code = EXIT_ENDPOINT_REFUSED


class CallFailed(Exception):
    """A model call did not succeed in this run; the task stays pending for the next run."""


class ContextTooLong(Exception):
    """The request does not fit the model's context: final, retrying cannot help."""
