"""The package's error types: problems with the user's input, each reported
by the tools as one paragraph (never a traceback)."""


class UserError(Exception):
    """A problem with the user's input (command line, config, paths)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be imported into the backbone."""


class DataError(ValueError):
    """A data file that does not fit the dataset's definition."""


class ExportError(Exception):
    """An export that failed or that does not reproduce the model."""
