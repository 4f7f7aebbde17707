"""Compute: sessions (admit, release, reconcile), nodes and resource groups, images, the cluster
cache, launch options, what each scope holds (``quota``), the pure scheduler (``scheduler/``) and
the device plugins (``devices/``).

Imports from ``core``, ``tenancy`` and ``storage`` (a session mounts folders).
"""
