"""Storage nodes: the drives of one process and slice placement across them.

Owns: opening a set of drives as slice stores, choosing the drive of a new
slice, and (later steps) serving slices over the network.

May call: ``shinglefs.store``, ``shinglefs.zoned``.
"""
