"""Benchmarks: commands, not tests.

Each benchmark is a module ``shinglefs.bench.<name>`` (a dash in the name
becomes an underscore) exposing::

    def run(quick: bool, workdir: pathlib.Path, **options) -> dict

that returns one JSON-serialisable dict of figures, always including the
baseline measured in the same run on the same machine and the ratio to it.
``shinglefs bench NAME --json`` prints that dict; ``shinglefs bench all``
runs every benchmark listed in ``BENCHMARKS``.
"""

BENCHMARKS = ["store", "index-scale", "meta", "mount", "smr", "wire", "cluster"]
