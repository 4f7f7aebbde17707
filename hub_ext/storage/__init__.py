"""Virtual folders: storage hosts and their rights (``hosts``), folders and who reaches their
files (``folders``), sharing (``sharing``), quotas (``quota``), the file operations of the API
(``files``), uploads from reservation to file (``uploads``), rescans and the per-folder locks
(``usage``), the symlink-safe file store (``store``) and its fd-level steps (``fdops``).

Imports from ``core`` and ``tenancy``; never from ``compute`` (sessions mount folders, folders do
not know sessions).
"""
