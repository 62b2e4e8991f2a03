"""The one error the history package raises: a single line naming the file or field and the fix
(the CLI prints it and exits 2; the gate reports it as `cannot evaluate`)."""

from __future__ import annotations


class HistoryError(Exception):
    """A store, run directory or export that cannot be used, in one line."""
