"""Storage nodes and servers: the drives of one process, slice placement across
them, and serving them to other processes and hosts.

Owns: opening a set of drives as slice stores, choosing the drive of a new
slice (``node``), serving slices over the network (the slice protocol:
``wire``, ``auth``, ``service``, ``remote``; docs/network.md), and the
storage server as a process (``process``: ``shinglefs server``, its
membership in the metadata database).

May call: ``shinglefs.store``, ``shinglefs.zoned``; ``process`` alone also
calls ``shinglefs.meta`` (registration, heartbeats, the cluster secret) —
the node and the protocol never do.
"""
