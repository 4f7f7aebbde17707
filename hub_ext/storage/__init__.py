"""Virtual folders: storage hosts and their rights (``hosts``), folders (``folders``), sharing
(``sharing``), quotas (``quota``), the symlink-safe file store (``store``).

Imports from ``core`` and ``tenancy``; never from ``compute`` (sessions mount folders, folders do
not know sessions).
"""
