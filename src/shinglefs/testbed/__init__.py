"""Test beds on one machine, shared by the tests and the benchmarks.

``netns``: hosts as Linux network namespaces on a bridge (as root);
``pgcluster``: a private PostgreSQL server. Neither is used by the file
system itself.
"""
