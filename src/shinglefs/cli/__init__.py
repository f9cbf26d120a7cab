"""The ``shinglefs`` command: a thin typer boundary over the layers.

Owns: argument parsing, progress display, and the one mapping of typed errors
to a one-line message and a documented exit code (a user never sees a
traceback for a mistake of theirs).

May call: every layer.
"""
