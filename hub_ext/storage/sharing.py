"""Sharing folders: invitations to user folders, and per-user permissions.

A user folder's owner invites a user of the same domain with a permission; the invitee accepts
(a permission row) or declines; the owner may cancel a pending invitation, change an accepted
share's permission or revoke it, and the invitee may leave.  A project folder is open to the
project's members with the project's permission; an admin may override it per member.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from labfleet.core import audit
from labfleet.core.authz import Actor
from labfleet.core.errors import Conflict, Forbidden, InvalidInput, NotFound
from labfleet.core.models import User, VFolderInvitation, VFolderPermission
from labfleet.core.validate import check_fields
from labfleet.storage import hosts
from labfleet.storage.vfolders import check_permission, find_user, host_rights, need_ready, readable


def _grant(db: Session, folder_id: str, user_id: int) -> VFolderPermission | None:
    return db.get(VFolderPermission, (folder_id, user_id))


def invite(db: Session, actor: Actor, folder_id: str, body: Any) -> VFolderInvitation:
    body = check_fields(body, required=["invitee"], optional=["permission"])
    permission = check_permission(body.get("permission", "rw"))
    v, acc = readable(db, actor, folder_id)
    if v.owner_kind != "user":
        raise InvalidInput(
            "project folders are shared with the project's members; an admin sets per-user permissions"
        )
    if not acc.owner:
        raise Forbidden(f"only the owner can invite others to vfolder {v.name}")
    hosts.need_right(host_rights(db, actor, v), "invite-others", v.host)
    need_ready(v)
    invitee = find_user(db, body["invitee"])
    if invitee.domain_id != v.domain_id:
        # Do not tell whether a user exists in another domain.
        raise NotFound(f"no user {invitee.username!r}")
    if invitee.id == v.user_id:
        raise InvalidInput("you cannot invite yourself to your own folder")
    if not invitee.is_active:
        raise Conflict(f"user {invitee.username} is inactive")
    if _grant(db, v.id, invitee.id):
        raise Conflict(f"{invitee.username} already has this folder: change the permission instead")
    pending = db.scalar(
        select(VFolderInvitation).where(
            VFolderInvitation.vfolder_id == v.id,
            VFolderInvitation.invitee_id == invitee.id,
            VFolderInvitation.state == "pending",
        )
    )
    if pending is not None:
        raise Conflict(f"{invitee.username} already has a pending invitation to {v.name}")
    inv = VFolderInvitation(
        id=str(uuid.uuid4()),
        vfolder_id=v.id,
        inviter_id=actor.user_id,
        invitee_id=invitee.id,
        permission=permission,
        state="pending",
    )
    db.add(inv)
    db.flush()
    audit.record(
        db,
        actor,
        "vfolder.invite",
        v.id,
        target_domain=v.domain.name,
        details={"invitee": invitee.username, "permission": permission},
    )
    return inv


def list_invitations(db: Session, actor: Actor, *, state: str | None = "pending") -> list[VFolderInvitation]:
    """Invitations the caller received or sent."""
    if actor.user_id is None:
        return []
    q = select(VFolderInvitation).where(
        or_(VFolderInvitation.invitee_id == actor.user_id, VFolderInvitation.inviter_id == actor.user_id)
    )
    if state:
        q = q.where(VFolderInvitation.state == state)
    return list(db.scalars(q.order_by(VFolderInvitation.created_at)))


def _invitation(db: Session, actor: Actor, invitation_id: str) -> VFolderInvitation:
    inv = db.get(VFolderInvitation, invitation_id) if isinstance(invitation_id, str) else None
    if inv is None or actor.user_id not in (inv.invitee_id, inv.inviter_id):
        raise NotFound(f"no invitation {invitation_id!r:.60}")
    return inv


def answer(db: Session, actor: Actor, invitation_id: str, accept: bool) -> VFolderInvitation:
    inv = _invitation(db, actor, invitation_id)
    if inv.invitee_id != actor.user_id:
        raise Forbidden("only the invitee can answer an invitation")
    if inv.state != "pending":
        raise Conflict(f"this invitation is already {inv.state}")
    inv.state = "accepted" if accept else "declined"
    if accept:
        if inv.vfolder.status != "READY":
            raise Conflict(f"vfolder {inv.vfolder.name} is in the trash")
        db.add(
            VFolderPermission(vfolder_id=inv.vfolder_id, user_id=inv.invitee_id, permission=inv.permission)
        )
    audit.record(
        db, actor, f"vfolder.invitation.{inv.state}", inv.vfolder_id, target_domain=inv.vfolder.domain.name
    )
    return inv


def cancel(db: Session, actor: Actor, invitation_id: str) -> VFolderInvitation:
    inv = _invitation(db, actor, invitation_id)
    if inv.inviter_id != actor.user_id:
        raise Forbidden("only the one who sent an invitation can cancel it")
    if inv.state != "pending":
        raise Conflict(f"this invitation is already {inv.state}")
    inv.state = "cancelled"
    audit.record(
        db, actor, "vfolder.invitation.cancel", inv.vfolder_id, target_domain=inv.vfolder.domain.name
    )
    return inv


def invitation_view(inv: VFolderInvitation) -> dict[str, Any]:
    return {
        "id": inv.id,
        "vfolder": inv.vfolder_id,
        "vfolder_name": inv.vfolder.name,
        "inviter": inv.inviter.username,
        "invitee": inv.invitee.username,
        "permission": inv.permission,
        "state": inv.state,
        "created_at": inv.created_at.isoformat() if inv.created_at else None,
    }


# ---------------------------------------------------------------- permissions


def list_permissions(db: Session, actor: Actor, folder_id: str) -> list[dict[str, Any]]:
    v, acc = readable(db, actor, folder_id)
    if not acc.manage:
        raise Forbidden(f"only the owner or an admin can see who shares vfolder {v.name}")
    return [
        {"user": g.user.username, "permission": g.permission}
        for g in sorted(v.grants, key=lambda g: g.user.username)
    ]


def set_permission(db: Session, actor: Actor, folder_id: str, username: str, body: Any) -> dict[str, Any]:
    body = check_fields(body, required=["permission"])
    permission = check_permission(body["permission"])
    v, acc = readable(db, actor, folder_id)
    if not acc.manage:
        raise Forbidden(f"only the owner or an admin can change permissions on vfolder {v.name}")
    user = find_user(db, username)
    grant = _grant(db, v.id, user.id)
    if v.owner_kind == "user":
        if grant is None:
            raise NotFound(f"{user.username} does not share vfolder {v.name}: invite them first")
        grant.permission = permission
    else:
        if not acc.admin:
            raise Forbidden("only an admin can set a member's permission on a project folder")
        if user not in v.project.members:  # type: ignore[union-attr]
            raise InvalidInput(f"{user.username} is not a member of project {v.project.full_name}")  # type: ignore[union-attr]
        if grant is None:
            db.add(VFolderPermission(vfolder_id=v.id, user_id=user.id, permission=permission))
        else:
            grant.permission = permission
    audit.record(
        db,
        actor,
        "vfolder.permission.set",
        v.id,
        target_domain=v.domain.name,
        details={"user": user.username, "permission": permission},
    )
    return {"user": user.username, "permission": permission}


def revoke(db: Session, actor: Actor, folder_id: str, username: str) -> None:
    v, acc = readable(db, actor, folder_id)
    user: User = find_user(db, username)
    leaving = actor.user_id == user.id
    if not (acc.manage or leaving):
        raise Forbidden(f"only the owner or an admin can revoke permissions on vfolder {v.name}")
    grant = _grant(db, v.id, user.id)
    if grant is None:
        raise NotFound(f"{user.username} has no permission of their own on vfolder {v.name}")
    if v.owner_kind == "project" and not (acc.admin or leaving):
        raise Forbidden("only an admin can remove a member's permission on a project folder")
    db.delete(grant)
    audit.record(
        db,
        actor,
        "vfolder.permission.revoke",
        v.id,
        target_domain=v.domain.name,
        details={"user": user.username},
    )
