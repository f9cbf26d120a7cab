"""Test support shared across layers: the private PostgreSQL cluster (pgcluster)."""
