"""The result record: one versioned JSON file per run, its shape, and where it came from (provenance)."""
