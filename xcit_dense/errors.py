"""The package's error types: problems with the user's input, each reported
by the tools as one paragraph (never a traceback). The tools catch their
common base, :class:`XCiTDenseError`."""


class XCiTDenseError(Exception):
    """Base of every error the tools report as one paragraph."""


class UserError(XCiTDenseError):
    """A problem with the user's input (command line, config, paths)."""


class CheckpointError(XCiTDenseError, ValueError):
    """A checkpoint that cannot be imported into the backbone."""


class DataError(XCiTDenseError, ValueError):
    """A data file that does not fit the dataset's definition."""


class ExportError(XCiTDenseError):
    """An export that failed or that does not reproduce the model."""
