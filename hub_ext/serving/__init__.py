"""Model serving: endpoints of inference-session replicas behind one URL (issue 20).

- :mod:`definition`: Backend.AI's ``model-definition.yaml`` subset, parsed and checked (pure).
- :mod:`endpoints`: endpoints, routes (replicas) and tokens in the DB; who may see and change them.
- :mod:`engine`: the service job that keeps each endpoint's replicas at the wanted count and checks
  their health; it holds the routing table the router reads.
- :mod:`router`: ``/services/labfleet/serve/<endpoint>/...``, spread over the healthy replicas.
"""
