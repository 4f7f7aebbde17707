"""How much each folder holds on disk: rescans, and the per-folder locks that keep them right.

A rescan measures a folder (in a thread) and records its usage; an upload turns its reservation
into usage (labfleet.storage.uploads.finish). One lock per folder, held by a rescan from measuring
to recording and by an upload while it finishes: a measurement taken before an upload landed can
then never overwrite the usage that upload added. (One service process holds the locks.)
"""

from __future__ import annotations

import asyncio
import logging

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from labfleet.core import database
from labfleet.core.errors import LabfleetError
from labfleet.core.models import ComputeSession, VFolder
from labfleet.core.vocab import FINAL_STATUSES
from labfleet.storage import uploads, vfolders, vfquota


class FolderUsage:
    """Owns the per-folder locks and the rescans of one service."""

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        log: logging.Logger,
        *,
        trash_retention: int = 0,
        upload_expiry: int = 24 * 3600,
    ) -> None:
        self.session_factory = session_factory
        self.log = log
        self.trash_retention = trash_retention
        self.upload_expiry = upload_expiry
        self._locks: dict[str, asyncio.Lock] = {}

    def lock(self, folder_id: str) -> asyncio.Lock:
        lock = self._locks.get(folder_id)
        if lock is None:
            lock = self._locks[folder_id] = asyncio.Lock()
        return lock

    async def rescan(self, folder_id: str) -> None:
        """Measure one folder on disk (in a thread) and record its usage."""
        async with self.lock(folder_id):
            with database.session_scope(self.session_factory) as db:
                v = db.get(VFolder, folder_id)
                if v is None:
                    self._locks.pop(folder_id, None)
                    return
                store = vfolders.store_of(v)
            try:
                usage = await asyncio.get_running_loop().run_in_executor(None, store.usage)
            except LabfleetError as e:  # e.g. the tree changed under the walk: the next scan counts it
                self.log.warning("Could not measure vfolder %s: %s", folder_id, e.message)
                return
            except OSError as e:
                self.log.warning("Could not measure vfolder %s: %s", folder_id, e)
                return
            with database.session_scope(self.session_factory) as db:
                vfquota.set_usage(db, folder_id, usage)

    async def rescan_session_mounts(self, session_id: str) -> None:
        """Measure the folders an ended session could write."""
        with database.session_scope(self.session_factory) as db:
            s = db.get(ComputeSession, session_id)
            if s is None or s.status not in FINAL_STATUSES:
                return
            ids = [m.vfolder_id for m in s.mounts if m.permission != "ro"]
        for folder_id in ids:
            await self.rescan(folder_id)

    async def housekeeping(self) -> None:
        """Expire idle uploads, purge old trash, rescan every folder."""
        with database.session_scope(self.session_factory) as db:
            for upload_id in uploads.expire(db, self.upload_expiry):
                self.log.info("Cancelled idle upload %s", upload_id)
            ids = [(v.id, vfolders.store_of(v)) for v in db.scalars(select(VFolder))]
        for folder_id, store in ids:
            if self.trash_retention:
                try:
                    store.purge_trash_older_than(self.trash_retention)
                except OSError as e:
                    self.log.warning("Could not purge the trash of vfolder %s: %s", folder_id, e)
            await self.rescan(folder_id)
