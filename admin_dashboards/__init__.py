"""labfleet admin_dashboards: arrives with its own issue (see README)."""
