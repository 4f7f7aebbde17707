"""labfleet widgets: arrives with its own issue (see README)."""
