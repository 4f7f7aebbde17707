"""Usage accounting: what the fleet holds and how it is used, for people and for monitoring.

Owns the Prometheus metrics (``metrics``: the series ``/services/labfleet/metrics`` answers, read
from the DB at each scrape, and the service's own histograms of admission latency and queue wait).
Later parts of the usage issue live here too: trusted samples, usage records and their rollups,
and the usage statistics API's queries.

Imports from ``core``, ``tenancy``, ``storage`` and ``compute``; ``service`` and ``cli`` import it.
"""
