"""labfleet spawner: arrives with its own issue (see README)."""
