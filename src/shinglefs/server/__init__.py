"""Storage nodes: the drives of one process and slice placement across them.

Owns: opening a set of drives as slice stores, choosing the drive of a new
slice, and serving slices over the network (the slice protocol: ``wire``,
``auth``, ``service``, ``remote``; docs/network.md).

May call: ``shinglefs.store``, ``shinglefs.zoned``.
"""
