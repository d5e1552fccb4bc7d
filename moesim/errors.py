"""The one error type users see: a clear, single-line message, no traceback."""


class MoesimError(Exception):
    """Bad input or an impossible request. The CLI prints it on one line and exits 2."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))
