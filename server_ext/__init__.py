"""labfleet server_ext: arrives with its own issue (see README)."""
