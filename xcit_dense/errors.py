"""The package's error types: problems with the user's input, each reported
by the tools as one paragraph (never a traceback). The tools catch their
common base, :class:`XCiTDenseError`."""


class XCiTDenseError(Exception):
    """Base of every error the tools report as one paragraph.

    Raised in a DataLoader worker, an error reaches the main process as
    PyTorch re-creates it there: its type called with the worker's formatted
    traceback (``torch._utils.ExceptionWrapper.reraise``). The error then
    keeps that traceback in ``worker_traceback`` and its own paragraph as
    its message, so that ``str(error)`` is the paragraph wherever it was
    raised.
    """

    def __init__(self, message: str = '') -> None:
        message = str(message)
        self.worker_traceback = None
        cls = type(self)
        if message.startswith(f'Caught {cls.__name__} in DataLoader worker'):
            # the traceback ends with "<module>.<name>: <the paragraph>"
            raised = f'\n{cls.__module__}.{cls.__qualname__}: '
            if raised in message:
                self.worker_traceback = message
                message = message.rsplit(raised, 1)[1].strip()
        super().__init__(message)


class UserError(XCiTDenseError):
    """A problem with the user's input (command line, config, paths)."""


class CheckpointError(XCiTDenseError, ValueError):
    """A checkpoint that cannot be imported into the backbone."""


class DataError(XCiTDenseError, ValueError):
    """A data file that does not fit the dataset's definition."""


class ExportError(XCiTDenseError):
    """An export that failed or that does not reproduce the model."""


def first_line(error: BaseException) -> str:
    """A foreign error (a compiler's, an exporter's, whose messages run to
    hundreds of lines) in one line: its type and the first non-empty line
    of its message."""
    lines = (line.strip() for line in str(error).splitlines())
    return f'{type(error).__name__}: ' + next(
        (line for line in lines if line), '(no message)')
