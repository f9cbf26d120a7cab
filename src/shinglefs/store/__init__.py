"""The slice log, one per drive.

Owns: self-describing checksummed records in sequential zones, lifetime groups
mapped to zones, the compact slice index with its checkpoints, recovery after a
crash, zone GC, and the per-drive write scheduler that coalesces concurrent
writers into long sequential appends.

May call: ``shinglefs.zoned``.
"""
