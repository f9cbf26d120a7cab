"""The ``shinglefs`` command: a thin typer boundary over the layers.

Owns: argument parsing, the configuration file (``configfile.py``:
``shinglefs.toml`` merged under the flags into ``StoreConfig``,
``ClientConfig`` and the format and mount settings), progress display, the
errors only a command meets (``errors.py``), and the one mapping of typed
errors to a one-line message and a documented exit code (``main.py``; a user
never sees a traceback for a mistake of theirs). One module per group of
commands: ``filesystem`` (format, mount, umount, up), ``status``,
``recovery`` (fsck, scrub, dump, load), ``bench``, ``demo``.

May call: every layer.
"""
