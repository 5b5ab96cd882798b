"""The package's error types: problems with the user's input, each reported
by the tools as one paragraph (never a traceback). The tools catch their
common base, :class:`XCiTDenseError`."""
import os.path as osp
import traceback


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


class InputError(XCiTDenseError, ValueError):
    """An input the model cannot take (not a batch of images, another
    dtype, an image too small for the pyramid's max-pooling)."""


class ExportError(XCiTDenseError):
    """An export that failed or that does not reproduce the model."""


def first_line(error: BaseException) -> str:
    """A foreign error (a compiler's, an exporter's, whose messages run to
    hundreds of lines) in one line: its type and the first non-empty line
    of its message."""
    lines = (line.strip() for line in str(error).splitlines())
    return f'{type(error).__name__}: ' + next(
        (line for line in lines if line), '(no message)')


def first_cause(error: BaseException) -> BaseException:
    """The first error of ``error``'s chain as a traceback shows it (its
    ``__cause__``, else its ``__context__`` unless ``from None`` hid it):
    ``error`` itself if there is none.
    A CUDA graph's capture that a forward's error broke ends with an error
    of its own ("operation failed due to a previous error during
    capture"), raised while the forward's was handled: that first error
    says what broke it."""
    seen = {id(error)}
    while True:
        earlier = error.__cause__ or (
            None if error.__suppress_context__ else error.__context__)
        if earlier is None or id(earlier) in seen:
            return error
        seen.add(id(earlier))
        error = earlier


def cause_line(error: BaseException, library: str) -> str:
    """:func:`first_line` of :func:`first_cause`, and where it was raised:
    the innermost frame of its traceback outside the folder ``library``
    (PyTorch's, say: the line of the model's code that made the failing
    call)."""
    cause = first_cause(error)
    frames = [f for f in traceback.extract_tb(cause.__traceback__)
              if not osp.abspath(f.filename).startswith(library)]
    if not frames:
        return first_line(cause)
    frame = frames[-1]
    path = osp.relpath(frame.filename)
    if path.startswith('..'):
        path = frame.filename
    return f'{first_line(cause)}, at {path}:{frame.lineno} in {frame.name}'
