"""The node agent (``labfleet agent``): registers its node with the labfleet service, heartbeats and
samples the sessions that run there. It talks to the service over HTTP only, never to the DB."""
