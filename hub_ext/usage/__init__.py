"""Usage accounting: what the fleet holds and how it is used, for people and for monitoring.

- ``sampler``: what each session on a node uses, measured outside it (its process tree, its
  container's engine stats, the device plugins' per-process GPU figures); no DB, so a node agent
  can run it too;
- ``accrual``: the arithmetic (hold intervals, rates, 15-minute buckets), plain values only;
- ``records``: the usage records in the DB (per-session state, 15-minute and daily buckets),
  accrued by the service's ``usage`` job;
- ``stats``: the queries of ``GET /api/usage`` and ``/api/usage/me``;
- ``metrics``: the Prometheus series ``/services/labfleet/metrics`` answers.

Imports from ``core``, ``tenancy``, ``storage`` and ``compute``; ``service`` and ``cli`` import it.
"""
