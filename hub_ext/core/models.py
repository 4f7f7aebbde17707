"""labfleet's data model (SQLAlchemy 2).

Tenancy (domains, projects, users, memberships), resource policies, keypairs and
the audit log.  Resource slot mappings are stored as JSON objects of decimal
strings (see :mod:`labfleet.core.slots`), never as floats.

The schema is created and upgraded by the Alembic migrations in
``hub_ext/core/migrations``; ``tests/test_migrations.py`` checks that they match
these classes.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
    text,
)
from sqlalchemy import true as sa_true
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from labfleet.core.slots import ResourceSlots


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class UTCDateTime(TypeDecorator):
    """A timezone-aware UTC datetime on every backend (SQLite hands back naive values)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class Role(str, enum.Enum):
    superadmin = "superadmin"
    admin = "admin"  # domain admin
    user = "user"
    monitor = "monitor"


class UserStatus(str, enum.Enum):
    active = "active"
    inactive = "inactive"


# Enums are stored as plain strings with CHECK-free columns: the validation layer
# owns the allowed values, and new values need no table rebuild on SQLite.
_ENUM_LEN = 16


class Domain(Base):
    __tablename__ = "domains"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    total_resource_slots: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # {storage host: [rights]} granted to everyone in the domain (see labfleet.storage.hosts).
    allowed_vfolder_hosts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    # Names of the keypair policies the domain's admins may hand out, set by superadmins
    # (labfleet.tenancy.keypairs; migration 0013).
    allowed_keypair_policies: Mapped[list[str]] = mapped_column(JSON, server_default="[]")
    # Hosts the domain's imports may or may not fetch from: {"allow": [...], "deny": [...]} (0017).
    import_hosts: Mapped[dict[str, Any]] = mapped_column(JSON, server_default="{}")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    projects: Mapped[list[Project]] = relationship(back_populates="domain", cascade="all, delete-orphan")
    users: Mapped[list[User]] = relationship(back_populates="domain")

    @property
    def slots(self) -> ResourceSlots:
        return ResourceSlots.parse(self.total_resource_slots)


class _FolderPolicy:
    """Columns shared by user and project resource policies (virtual folders, storage)."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    max_vfolder_count: Mapped[int] = mapped_column(Integer, default=0)  # 0 = unlimited
    max_quota_scope_size: Mapped[int] = mapped_column(BigInteger, default=0)  # bytes, 0 = unlimited
    # One folder's size limit, bytes; 0 = only the scope's limit.
    max_vfolder_size: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    # The owner's environments (labfleet.compute.environments; 0 = unlimited) and their images' bytes (0018).
    max_environments: Mapped[int] = mapped_column(Integer, default=3, server_default="3")
    max_environment_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class ProjectResourcePolicy(_FolderPolicy, Base):
    __tablename__ = "project_resource_policies"


class UserResourcePolicy(_FolderPolicy, Base):
    __tablename__ = "user_resource_policies"

    # Model serving's limits (labfleet.serving), 0 = unlimited (migration 0011).
    max_endpoints: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_replicas_per_endpoint: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Active keypairs the user may mint, the main one included; 0 = unlimited (migration 0013).
    # A user with no user policy may mint labfleet.tenancy.keypairs.DEFAULT_MAX_KEYPAIRS.
    max_keypairs: Mapped[int] = mapped_column(Integer, server_default="10")


class KeypairResourcePolicy(Base):
    __tablename__ = "keypair_resource_policies"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    total_resource_slots: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    default_for_unspecified: Mapped[str] = mapped_column(String(_ENUM_LEN), default="UNLIMITED")
    max_concurrent_sessions: Mapped[int] = mapped_column(Integer, default=0)  # 0 = unlimited
    max_pending_sessions: Mapped[int] = mapped_column(Integer, default=0)  # 0 = unlimited
    max_session_lifetime: Mapped[int] = mapped_column(Integer, default=0)  # seconds, 0 = off
    idle_timeout: Mapped[int] = mapped_column(Integer, default=-1)  # s; 0 never, <0 global default
    # Storage hosts the keypair's user may use: a list of names (every right) or {host: [rights]}.
    allowed_storage_hosts: Mapped[Any] = mapped_column(JSON, default=list)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    @property
    def slots(self) -> ResourceSlots:
        return ResourceSlots.parse(self.total_resource_slots)


class Project(Base):
    __tablename__ = "projects"
    __table_args__ = (UniqueConstraint("domain_id", "name", name="uq_projects_domain_name"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    domain_id: Mapped[int] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    description: Mapped[str] = mapped_column(Text, default="")
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    total_resource_slots: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    resource_policy_id: Mapped[int | None] = mapped_column(
        ForeignKey("project_resource_policies.id", ondelete="RESTRICT"), nullable=True
    )
    # {storage host: [rights]} granted for this project's folders (see labfleet.storage.hosts).
    allowed_vfolder_hosts: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    domain: Mapped[Domain] = relationship(back_populates="projects")
    resource_policy: Mapped[ProjectResourcePolicy | None] = relationship()
    members: Mapped[list[User]] = relationship(
        secondary="project_members", back_populates="projects", order_by="User.username"
    )

    @property
    def full_name(self) -> str:
        return f"{self.domain.name}/{self.name}"

    @property
    def slots(self) -> ResourceSlots:
        return ResourceSlots.parse(self.total_resource_slots)


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    # The JupyterHub user name: the same string on both sides.
    username: Mapped[str] = mapped_column(String(255), unique=True)
    email: Mapped[str] = mapped_column(String(255), default="")
    full_name: Mapped[str] = mapped_column(String(255), default="")
    domain_id: Mapped[int] = mapped_column(ForeignKey("domains.id", ondelete="RESTRICT"), index=True)
    role: Mapped[str] = mapped_column(String(_ENUM_LEN), default="user")
    status: Mapped[str] = mapped_column(String(_ENUM_LEN), default="active")
    # A PBKDF2 hash (see labfleet.core.passwords); NULL when the user logs in through another authenticator.
    password_hash: Mapped[str | None] = mapped_column(String(255), nullable=True)
    resource_policy_id: Mapped[int | None] = mapped_column(
        ForeignKey("user_resource_policies.id", ondelete="RESTRICT"), nullable=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    last_login: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    domain: Mapped[Domain] = relationship(back_populates="users")
    resource_policy: Mapped[UserResourcePolicy | None] = relationship()
    projects: Mapped[list[Project]] = relationship(
        secondary="project_members", back_populates="members", order_by="Project.name"
    )
    keypairs: Mapped[list[Keypair]] = relationship(back_populates="user", cascade="all, delete-orphan")

    @property
    def is_active(self) -> bool:
        return self.status == UserStatus.active.value

    @property
    def main_keypair(self) -> Keypair | None:
        for kp in self.keypairs:
            if kp.is_main and kp.is_active:
                return kp
        return None


class ProjectMember(Base):
    __tablename__ = "project_members"

    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class Keypair(Base):
    __tablename__ = "keypairs"
    __table_args__ = (
        # One main keypair per user, enforced by the database too (partial unique index).
        Index(
            "uq_keypairs_one_main_per_user",
            "user_id",
            unique=True,
            sqlite_where=text("is_main = 1 AND is_active = 1"),
            postgresql_where=text("is_main AND is_active"),
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    access_key: Mapped[str] = mapped_column(String(20), unique=True)
    # The secret, encrypted with the service's key (labfleet.core.secretbox): never stored in plain text.
    secret_key_encrypted: Mapped[str] = mapped_column(Text)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    resource_policy_id: Mapped[int] = mapped_column(
        ForeignKey("keypair_resource_policies.id", ondelete="RESTRICT")
    )
    is_main: Mapped[bool] = mapped_column(Boolean, default=False)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    rate_limit: Mapped[int] = mapped_column(Integer, default=10000)  # requests per 15-minute window
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    user: Mapped[User] = relationship(back_populates="keypairs")
    resource_policy: Mapped[KeypairResourcePolicy] = relationship()


class ImportCredential(Base):
    """A user's token for one host that imports clone from (labfleet.storage.imports), encrypted like a
    keypair's secret; never shown again once stored."""

    __tablename__ = "import_credentials"
    __table_args__ = (UniqueConstraint("user_id", "host", name="uq_import_credentials_user_host"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    host: Mapped[str] = mapped_column(String(253))
    username: Mapped[str] = mapped_column(String(128), default="")
    token_encrypted: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class AuditEntry(Base):
    __tablename__ = "audit_log"
    __table_args__ = (Index("ix_audit_log_timestamp", "timestamp"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    timestamp: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    actor: Mapped[str] = mapped_column(String(255))  # a user name, or "cli", "system"
    # The actor's domain at the time, so a domain admin can read their domain's log.
    actor_domain: Mapped[str | None] = mapped_column(String(64), nullable=True)
    target_domain: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    action: Mapped[str] = mapped_column(String(64))  # e.g. "domain.create", "user.login"
    target: Mapped[str] = mapped_column(String(255), default="")
    details: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    remote_addr: Mapped[str] = mapped_column(String(64), default="")
    success: Mapped[bool] = mapped_column(Boolean, default=True)


# ---------------------------------------------------------------- scheduler: groups, nodes, sessions

# Why the service itself stopped a running session (labfleet.reclaim; gpu-overuse: labfleet.usage.enforce):
# the first word of its status reason, which the spawner's later reports of the stop keep.
RECLAIM_REASONS = ("idle-timeout", "idle-utilization", "lifetime", "gpu-overuse")


class ResourceGroup(Base):
    __tablename__ = "resource_groups"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    # Public groups are open to everyone; others to the union of their grants.
    is_public: Mapped[bool] = mapped_column(Boolean, default=False)
    scheduler: Mapped[str] = mapped_column(String(_ENUM_LEN), default="fifo")  # fifo | lifo | drf
    placement: Mapped[str] = mapped_column(
        String(_ENUM_LEN), default="fgd"
    )  # whole-gpu | spread | pack | fgd
    allowed_session_types: Mapped[list[Any]] = mapped_column(JSON, default=list)
    pending_timeout: Mapped[int] = mapped_column(Integer, default=0)  # seconds; 0 = wait forever
    gpu_overuse: Mapped[str] = mapped_column(String(_ENUM_LEN), server_default="auto")  # GPU_OVERUSE_POLICIES
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Bumped by every transaction that changes the group's allocations, nodes or devices, so
    # a process's cached placement state (labfleet.compute.clustercache) knows when it is out of date.
    alloc_version: Mapped[int] = mapped_column(Integer, default=0, server_default="0")

    nodes: Mapped[list[Node]] = relationship(back_populates="resource_group", order_by="Node.name")
    grants: Mapped[list[ResourceGroupGrant]] = relationship(cascade="all, delete-orphan")


class ResourceGroupGrant(Base):
    __tablename__ = "resource_group_grants"
    __table_args__ = (UniqueConstraint("resource_group_id", "kind", "target", name="uq_rg_grants"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    resource_group_id: Mapped[int] = mapped_column(
        ForeignKey("resource_groups.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(_ENUM_LEN))  # domain | project | user
    target: Mapped[str] = mapped_column(String(255))  # domain name, DOMAIN/PROJECT, or user name


class Node(Base):
    __tablename__ = "nodes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)
    resource_group_id: Mapped[int] = mapped_column(
        ForeignKey("resource_groups.id", ondelete="RESTRICT"), index=True
    )
    cpu: Mapped[str] = mapped_column(String(32))  # cores, a decimal string
    mem: Mapped[int] = mapped_column(BigInteger)  # bytes
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    status: Mapped[str] = mapped_column(String(_ENUM_LEN), default="ALIVE")  # ALIVE | LOST | DISABLED
    plugin: Mapped[str] = mapped_column(String(64), default="")
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # False: drained, no new placement (its running sessions stay).
    schedulable: Mapped[bool] = mapped_column(Boolean, default=True, server_default=sa_true())
    # The node token whose agent registered it (labfleet.compute.agents); None: the service's own node,
    # kept alive by the service. No foreign key: the column is added in place on SQLite (migration 0010).
    agent_token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Its MPS daemon as the node reports it (labfleet.compute.devices.mps): on | off | failed, why it
    # is not on, and the pipe directory its clients reach it through (when on). Migration 0015.
    mps: Mapped[str] = mapped_column(String(16), default="off", server_default="off")
    mps_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    mps_pipe_dir: Mapped[str | None] = mapped_column(String(1024), nullable=True)

    resource_group: Mapped[ResourceGroup] = relationship(back_populates="nodes")
    devices: Mapped[list[Device]] = relationship(
        back_populates="node", cascade="all, delete-orphan", order_by="Device.index"
    )


class NodeToken(Base):
    """A token a node agent (``labfleet agent``) presents to the service: shown once, stored hashed.

    ``node``: the only node name it may register (None: any name no other token's agent holds);
    ``resource_group``: the group its nodes join (None: the agent's request, else ``default``).
    """

    __tablename__ = "node_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(255))  # labfleet.core.passwords format
    node: Mapped[str | None] = mapped_column(String(255), nullable=True)
    resource_group: Mapped[str | None] = mapped_column(String(64), nullable=True)
    note: Mapped[str] = mapped_column(Text, default="")
    created_by: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    last_used: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


class Device(Base):
    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    uuid: Mapped[str] = mapped_column(String(128), unique=True)
    index: Mapped[int] = mapped_column(Integer)
    model: Mapped[str] = mapped_column(String(128))
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    kind: Mapped[str] = mapped_column(String(_ENUM_LEN), default="gpu")  # gpu | mig
    parent_uuid: Mapped[str | None] = mapped_column(String(128), nullable=True)

    node: Mapped[Node] = relationship(back_populates="devices")


class ComputeSession(Base):
    __tablename__ = "sessions"
    __table_args__ = (
        Index("ix_sessions_status_group", "status", "resource_group_id"),
        Index("ix_sessions_created_id", "created_at", "id"),  # the order of GET /api/sessions pages
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # a UUID
    name: Mapped[str] = mapped_column(String(255), default="")  # the Hub server name
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    keypair_id: Mapped[int] = mapped_column(ForeignKey("keypairs.id", ondelete="CASCADE"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    domain_id: Mapped[int] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"), index=True)
    resource_group_id: Mapped[int] = mapped_column(ForeignKey("resource_groups.id", ondelete="RESTRICT"))
    type: Mapped[str] = mapped_column(String(_ENUM_LEN), default="interactive")
    image: Mapped[str | None] = mapped_column(String(255), nullable=True)
    requested_slots: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    gpu_models: Mapped[list[Any]] = mapped_column(JSON, default=list)
    status: Mapped[str] = mapped_column(String(_ENUM_LEN), default="PENDING")
    status_reason: Mapped[str] = mapped_column(Text, default="")
    status_history: Mapped[list[Any]] = mapped_column(JSON, default=list)
    node_id: Mapped[int | None] = mapped_column(ForeignKey("nodes.id", ondelete="SET NULL"), nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    status_changed_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # Where it runs on its node, as the Hub's spawner reported it: {"pid": N} or {"container": ID};
    # the usage sampler measures it from outside (never what the session says of itself).
    runtime: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)

    user: Mapped[User] = relationship()
    keypair: Mapped[Keypair] = relationship()
    project: Mapped[Project] = relationship()
    domain: Mapped[Domain] = relationship()
    resource_group: Mapped[ResourceGroup] = relationship()
    node: Mapped[Node | None] = relationship()
    allocations: Mapped[list[Allocation]] = relationship(
        back_populates="session", cascade="all, delete-orphan"
    )
    mounts: Mapped[list[VFolderMount]] = relationship(cascade="all, delete-orphan")

    @property
    def slots(self) -> ResourceSlots:
        return ResourceSlots.parse(self.requested_slots)


class Allocation(Base):
    """What a session holds on a node: CPU and memory, and a share of each device it uses.

    Amounts are integers in the slots' quanta (milli-cores, bytes, hundredths of a device),
    so sums in SQL are exact on every backend.
    """

    __tablename__ = "allocations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), index=True)
    node_id: Mapped[int] = mapped_column(ForeignKey("nodes.id", ondelete="CASCADE"), index=True)
    device_id: Mapped[int | None] = mapped_column(
        ForeignKey("devices.id", ondelete="CASCADE"), nullable=True, index=True
    )
    cpu_milli: Mapped[int] = mapped_column(Integer, default=0)
    mem: Mapped[int] = mapped_column(BigInteger, default=0)
    shares_centi: Mapped[int] = mapped_column(Integer, default=0)

    session: Mapped[ComputeSession] = relationship(back_populates="allocations")
    node: Mapped[Node] = relationship()
    device: Mapped[Device | None] = relationship()


class Image(Base):
    """An environment admins registered: only these can be started.

    ``min_slots`` is what a session of this image must ask at least; ``accelerators`` the
    device kinds it can use (e.g. ``cuda``; empty: CPU only); ``service_ports`` the apps it
    serves, as ``{"name", "protocol", "port"}``.  ``projects`` and ``domains`` restrict who may
    use it (both empty: everyone).  ``labels`` keeps what the image itself declared.
    """

    __tablename__ = "images"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(255), unique=True)  # the reference, e.g. repo/name:tag
    display_name: Mapped[str] = mapped_column(String(255), default="")
    min_resource_slots: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    accelerators: Mapped[list[Any]] = mapped_column(JSON, default=list)
    service_ports: Mapped[list[Any]] = mapped_column(JSON, default=list)
    projects: Mapped[list[Any]] = mapped_column(JSON, default=list)  # DOMAIN/PROJECT names
    domains: Mapped[list[Any]] = mapped_column(JSON, default=list)
    labels: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    @property
    def min_slots(self) -> ResourceSlots:
        return ResourceSlots.parse(self.min_resource_slots)


# ---------------------------------------------------------------- virtual folders


class StorageHost(Base):
    """A named root where folders live: a local directory, or a file system mounted at the same
    path on every node (NFS, CephFS, ...).  ``default_permissions`` are the rights everyone has on
    it; domains, projects and keypair policies add theirs (labfleet.storage.hosts)."""

    __tablename__ = "storage_hosts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    path: Mapped[str] = mapped_column(Text)
    capacity: Mapped[int] = mapped_column(BigInteger, default=0)  # bytes; 0 = as much as the disk has
    description: Mapped[str] = mapped_column(Text, default="")
    default_permissions: Mapped[list[Any]] = mapped_column(JSON, default=list)
    # Who owns what the API writes, so a session running as another uid can change it.
    owner_uid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    owner_gid: Mapped[int | None] = mapped_column(Integer, nullable=True)
    is_active: Mapped[bool] = mapped_column(Boolean, default=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


VFOLDER_STATUSES = ("READY", "DELETE_PENDING")


class VFolder(Base):
    """A virtual folder, owned by a user or by a project; its data is ``<host path>/<id>/data``."""

    __tablename__ = "vfolders"
    __table_args__ = (
        UniqueConstraint("user_id", "name", name="uq_vfolders_user_name"),
        UniqueConstraint("project_id", "name", name="uq_vfolders_project_name"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # a UUID
    name: Mapped[str] = mapped_column(String(64))
    host_id: Mapped[int] = mapped_column(ForeignKey("storage_hosts.id", ondelete="RESTRICT"), index=True)
    domain_id: Mapped[int] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"), index=True)
    owner_kind: Mapped[str] = mapped_column(String(_ENUM_LEN))  # user | project
    # Exactly one of these is set, by owner_kind.
    user_id: Mapped[int | None] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), nullable=True, index=True
    )
    project_id: Mapped[int | None] = mapped_column(
        ForeignKey("projects.id", ondelete="CASCADE"), nullable=True, index=True
    )
    creator: Mapped[str] = mapped_column(String(255), default="")
    usage_mode: Mapped[str] = mapped_column(String(_ENUM_LEN), default="general")  # general | model | data
    # What project members get (ro | rw | wd); a user folder's owner always has wd.
    permission: Mapped[str] = mapped_column(String(_ENUM_LEN), default="rw")
    max_size: Mapped[int] = mapped_column(BigInteger, default=0)  # bytes; 0 = only the scope's limit
    status: Mapped[str] = mapped_column(String(_ENUM_LEN), default="READY")
    usage_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # data and trash, as last scanned
    usage_files: Mapped[int] = mapped_column(Integer, default=0)
    trash_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    usage_scanned_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    deleted_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    host: Mapped[StorageHost] = relationship()
    domain: Mapped[Domain] = relationship()
    user: Mapped[User | None] = relationship()
    project: Mapped[Project | None] = relationship()
    grants: Mapped[list[VFolderPermission]] = relationship(cascade="all, delete-orphan")


class VFolderPermission(Base):
    """A user's permission on a folder: an accepted invitation (user folders) or an admin's
    override of the project's permission (project folders)."""

    __tablename__ = "vfolder_permissions"

    vfolder_id: Mapped[str] = mapped_column(ForeignKey("vfolders.id", ondelete="CASCADE"), primary_key=True)
    user_id: Mapped[int] = mapped_column(
        ForeignKey("users.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    permission: Mapped[str] = mapped_column(String(_ENUM_LEN))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    user: Mapped[User] = relationship()


class VFolderInvitation(Base):
    __tablename__ = "vfolder_invitations"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    vfolder_id: Mapped[str] = mapped_column(ForeignKey("vfolders.id", ondelete="CASCADE"), index=True)
    inviter_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"))
    invitee_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    permission: Mapped[str] = mapped_column(String(_ENUM_LEN))
    state: Mapped[str] = mapped_column(
        String(_ENUM_LEN), default="pending"
    )  # pending|accepted|declined|cancelled
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)

    vfolder: Mapped[VFolder] = relationship()
    inviter: Mapped[User] = relationship(foreign_keys=[inviter_id])
    invitee: Mapped[User] = relationship(foreign_keys=[invitee_id])


class VFolderUpload(Base):
    """An upload in progress.  ``reserved`` counts against the folder's and the scope's limits:
    its whole size from the start and while a request writes it, so concurrent uploads can never
    pass a limit together; only the bytes it received while no request holds it (a resumable
    upload whose connection ended), so a dropped client holds no room it does not use."""

    __tablename__ = "vfolder_uploads"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)  # hex; the temp file's name
    vfolder_id: Mapped[str] = mapped_column(ForeignKey("vfolders.id", ondelete="CASCADE"), index=True)
    user_id: Mapped[int | None] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), nullable=True)
    path: Mapped[str] = mapped_column(Text)
    size: Mapped[int] = mapped_column(BigInteger)
    reserved: Mapped[int] = mapped_column(BigInteger, server_default="0")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class VFolderMount(Base):
    """A folder mounted in a session, with the permission it was mounted with."""

    __tablename__ = "vfolder_mounts"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    vfolder_id: Mapped[str] = mapped_column(
        ForeignKey("vfolders.id", ondelete="CASCADE"), primary_key=True, index=True
    )
    permission: Mapped[str] = mapped_column(String(_ENUM_LEN))

    vfolder: Mapped[VFolder] = relationship()


# ---------------------------------------------------------------- usage ledger, state versions

# Scopes a quota names, in the one order every ledger write takes their rows (no deadlock).
LEDGER_SCOPES = ("domain", "project", "user", "keypair", "resource_group")


class UsageLedger(Base):
    """What the live sessions of one scope hold: one row per (scope, slot), in integer quanta.

    ``slot`` is a slot name (``cpu``: milli-cores, ``mem``: bytes, ``gpu``: devices, ``gpu.shares``:
    hundredths, ``gpu:A100``: its base slot's quantum), ``gpu:*`` the sum of a base slot's per-model
    slots, ``@sessions`` the live sessions (admitted, not ended) and ``@pending`` the queued ones.
    Changed by :mod:`labfleet.compute.ledger` in the transaction that admits, places or ends a session.
    """

    __tablename__ = "usage_ledger"
    __table_args__ = (UniqueConstraint("scope_kind", "scope_id", "slot", name="uq_usage_ledger_scope_slot"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    scope_kind: Mapped[str] = mapped_column(String(16))  # one of LEDGER_SCOPES
    scope_id: Mapped[int] = mapped_column(Integer)
    slot: Mapped[str] = mapped_column(String(96))
    amount: Mapped[int] = mapped_column(BigInteger, default=0)


class StateVersion(Base):
    """A counter bumped by every transaction that changes one kind of state (``tenancy``, ``folders``),
    so each process can cache what it read and know when it went stale (see labfleet.core.versions)."""

    __tablename__ = "state_versions"

    name: Mapped[str] = mapped_column(String(32), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, default=0)


# ---------------------------------------------------------------- usage records


class UsageSessionState(Base):
    """Where the usage accounting of one session stands (labfleet.usage.records).

    One row per session that held slots, from the first accrual on: its names (kept: the records
    outlive the session, its user and its project), what it holds per second (``alloc_*``: cores,
    bytes, devices' worth of shares), how far its allocation was accrued, and the sampler's last
    reading of it (``cpu_total``: cumulative core-seconds; ``*_now``: the last figures, for the
    metrics). ``finished``: it ended and everything up to its end is accrued.
    """

    __tablename__ = "usage_session_state"
    __table_args__ = (Index("ix_usage_session_state_finished", "finished"),)

    session_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    user: Mapped[str] = mapped_column(String(255))
    project: Mapped[str] = mapped_column(String(130))  # DOMAIN/PROJECT
    domain: Mapped[str] = mapped_column(String(64))
    resource_group: Mapped[str] = mapped_column(String(64))
    alloc_cpu: Mapped[float] = mapped_column(Float, default=0.0)
    alloc_mem: Mapped[float] = mapped_column(Float, default=0.0)
    alloc_gpu: Mapped[float] = mapped_column(Float, default=0.0)
    held_from: Mapped[datetime] = mapped_column(UTCDateTime())
    held_until: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    accrued_until: Mapped[datetime] = mapped_column(UTCDateTime())
    sampled_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    cpu_total: Mapped[float | None] = mapped_column(Float, nullable=True)
    cpu_now: Mapped[float | None] = mapped_column(Float, nullable=True)  # cores, over the last interval
    mem_now: Mapped[float | None] = mapped_column(Float, nullable=True)  # bytes
    gpu_now: Mapped[float | None] = mapped_column(Float, nullable=True)  # devices' worth of busy time
    gpu_mem_now: Mapped[float | None] = mapped_column(Float, nullable=True)  # bytes
    mem_peak: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_mem_peak: Mapped[float] = mapped_column(Float, default=0.0)
    finished: Mapped[bool] = mapped_column(Boolean, default=False)


class _UsageAmounts:
    """What one session held and used in one bucket: amounts in slot-seconds (``alloc_cpu``/``used_cpu``
    core-seconds, ``alloc_mem``/``used_mem`` byte-seconds, ``alloc_gpu`` share-seconds: a whole device
    is 1 a second; ``used_gpu`` the device's busy time its processes took, in device-seconds), peaks
    in bytes. Names are copied, so a bucket outlives its session, user and project."""

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(36))
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime())
    user: Mapped[str] = mapped_column(String(255))
    project: Mapped[str] = mapped_column(String(130))
    domain: Mapped[str] = mapped_column(String(64))
    resource_group: Mapped[str] = mapped_column(String(64))
    alloc_cpu: Mapped[float] = mapped_column(Float, default=0.0)
    alloc_mem: Mapped[float] = mapped_column(Float, default=0.0)
    alloc_gpu: Mapped[float] = mapped_column(Float, default=0.0)
    used_cpu: Mapped[float] = mapped_column(Float, default=0.0)
    used_mem: Mapped[float] = mapped_column(Float, default=0.0)
    used_gpu: Mapped[float] = mapped_column(Float, default=0.0)
    mem_peak: Mapped[float] = mapped_column(Float, default=0.0)
    gpu_mem_peak: Mapped[float] = mapped_column(Float, default=0.0)


class UsageBucket(_UsageAmounts, Base):
    """One session in one 15-minute bucket (``bucket_start``, UTC); retention deletes old ones."""

    __tablename__ = "usage_buckets"
    __table_args__ = (
        UniqueConstraint("session_id", "bucket_start", name="uq_usage_buckets_session_bucket"),
        Index("ix_usage_buckets_bucket", "bucket_start"),
        Index("ix_usage_buckets_user_bucket", "user", "bucket_start"),
        Index("ix_usage_buckets_domain_bucket", "domain", "bucket_start"),
    )


class UsageDay(_UsageAmounts, Base):
    """The same, per UTC day (``bucket_start`` at midnight): the sum of the day's 15-minute buckets,
    written with them, so that a month's statistics read 96 times fewer rows."""

    __tablename__ = "usage_days"
    __table_args__ = (
        UniqueConstraint("session_id", "bucket_start", name="uq_usage_days_session_bucket"),
        Index("ix_usage_days_bucket", "bucket_start"),
        Index("ix_usage_days_user_bucket", "user", "bucket_start"),
        Index("ix_usage_days_domain_bucket", "domain", "bucket_start"),
    )


class UsageSample(Base):
    """One trusted reading of a live session (labfleet.usage.sampler), kept a day for the idle
    checkers' windows: ``cpu_total`` cumulative core-seconds, ``mem`` bytes, ``gpu`` devices' worth
    of busy time, ``gpu_mem`` bytes (None: not measured)."""

    __tablename__ = "usage_samples"
    __table_args__ = (
        Index("ix_usage_samples_session_at", "session_id", "at"),
        Index("ix_usage_samples_at", "at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    session_id: Mapped[str] = mapped_column(String(36))
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    cpu_total: Mapped[float | None] = mapped_column(Float, nullable=True)
    mem: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_mem: Mapped[float | None] = mapped_column(Float, nullable=True)


# ---------------------------------------------------------------- idle reclamation

IDLE_CHECKER_KINDS = ("activity", "utilization")
IDLE_BINDING_SCOPES = ("domain", "project", "resource_group")


class IdleChecker(Base):
    """A rule that reclaims idle sessions (labfleet.reclaim): ``kind`` activity (no traffic, no busy
    kernel for ``options.timeout`` seconds) or utilization (thresholds over a window); applies to the
    sessions of the scopes it is bound to."""

    __tablename__ = "idle_checkers"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    kind: Mapped[str] = mapped_column(String(_ENUM_LEN))
    options: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    description: Mapped[str] = mapped_column(Text, default="")
    # The domain whose admin made it (None: a superadmin's): a domain admin manages only theirs.
    owner_domain: Mapped[str | None] = mapped_column(String(64), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)

    bindings: Mapped[list[IdleCheckerBinding]] = relationship(
        back_populates="checker", cascade="all, delete-orphan"
    )


class IdleCheckerBinding(Base):
    """A checker applies to the sessions of a domain, a project (``DOMAIN/PROJECT``) or a resource group."""

    __tablename__ = "idle_checker_bindings"
    __table_args__ = (
        UniqueConstraint("checker_id", "scope_kind", "scope_name", name="uq_idle_checker_binding"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    checker_id: Mapped[int] = mapped_column(ForeignKey("idle_checkers.id", ondelete="CASCADE"), index=True)
    scope_kind: Mapped[str] = mapped_column(String(_ENUM_LEN))
    scope_name: Mapped[str] = mapped_column(String(130))

    checker: Mapped[IdleChecker] = relationship(back_populates="bindings")


class SessionActivity(Base):
    """What the session's own server extension last reported of its activity (jupyter-server's last
    activity and kernel states, as the Hub's activity reports), and when its user last said "I'm
    still here". Self-reported: it can only keep a session alive, never reclaim another's, and the
    utilization checkers and the max lifetime do not read it."""

    __tablename__ = "session_activity"

    session_id: Mapped[str] = mapped_column(ForeignKey("sessions.id", ondelete="CASCADE"), primary_key=True)
    last_activity: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    busy_kernels: Mapped[int] = mapped_column(Integer, default=0)
    reported_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    still_here_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


# ---------------------------------------------------------------- announcements

ANNOUNCEMENT_LEVELS = ("info", "warning")


class Announcement(Base):
    """A banner for everyone, on the Hub's pages and in the Fleet sidebar (labfleet.tenancy.announcements).

    Each publication is a row; the announcement in force is the newest one not cleared (publishing
    a new one clears the one before), so the table is also its history."""

    __tablename__ = "announcements"
    __table_args__ = (Index("ix_announcements_cleared_at", "cleared_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    text: Mapped[str] = mapped_column(Text)
    level: Mapped[str] = mapped_column(String(_ENUM_LEN))  # ANNOUNCEMENT_LEVELS
    published_by: Mapped[str] = mapped_column(String(255))
    published_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    cleared_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    cleared_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)


# ---------------------------------------------------------------- model serving (labfleet.serving)

ENDPOINT_STATUSES = ("PENDING", "DEPLOYING", "READY", "DEGRADED", "DESTROYING", "DESTROYED")
ROUTE_STATUSES = ("PROVISIONING", "RUNNING", "TERMINATING", "TERMINATED", "FAILED")


class ServingEndpoint(Base):
    """A model served by ``replicas`` inference sessions of its owner in ``project`` behind one URL,
    ``/services/labfleet/serve/<name>/``. A name is unique among the endpoints not DESTROYED; a
    destroyed endpoint stays as history."""

    __tablename__ = "serving_endpoints"
    __table_args__ = (Index("ix_serving_endpoints_name_status", "name", "status"),)

    id: Mapped[str] = mapped_column(String(36), primary_key=True)  # a UUID
    name: Mapped[str] = mapped_column(String(64))
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    domain_id: Mapped[int] = mapped_column(ForeignKey("domains.id", ondelete="CASCADE"), index=True)
    vfolder_id: Mapped[str | None] = mapped_column(
        ForeignKey("vfolders.id", ondelete="SET NULL"), nullable=True, index=True
    )
    folder_name: Mapped[str] = mapped_column(String(64))  # where it mounts: ~/vfolders/<folder_name>
    image: Mapped[str | None] = mapped_column(String(255), nullable=True)
    resource_group: Mapped[str | None] = mapped_column(String(64), nullable=True)
    slots: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    env: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    definition: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # the parsed model definition
    replicas: Mapped[int] = mapped_column(Integer, default=1)
    open_to_public: Mapped[bool] = mapped_column(Boolean, default=False)
    status: Mapped[str] = mapped_column(String(_ENUM_LEN), default="PENDING")
    status_reason: Mapped[str] = mapped_column(Text, default="")
    # Replicas that failed in a row (a healthy one resets it): the next start waits 2**n seconds, at most 60.
    failure_streak: Mapped[int] = mapped_column(Integer, default=0)
    next_start_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, default=0)
    latency_ms_total: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    modified_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow, onupdate=utcnow)
    destroyed_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    user: Mapped[User] = relationship()
    project: Mapped[Project] = relationship()
    domain: Mapped[Domain] = relationship()
    routes: Mapped[list[ServingRoute]] = relationship(
        back_populates="endpoint", cascade="all, delete-orphan", order_by="ServingRoute.id"
    )
    tokens: Mapped[list[ServingToken]] = relationship(
        back_populates="endpoint", cascade="all, delete-orphan", order_by="ServingToken.id"
    )


class ServingRoute(Base):
    """One replica of an endpoint: the owner's Hub server ``server`` (an inference session) listening
    on ``host:port``. ``health``: NOT_CHECKED | HEALTHY | UNHEALTHY; ``traffic``: ACTIVE | INACTIVE."""

    __tablename__ = "serving_routes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(
        ForeignKey("serving_endpoints.id", ondelete="CASCADE"), index=True
    )
    server: Mapped[str] = mapped_column(String(255))
    session_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    host: Mapped[str] = mapped_column(String(255), default="127.0.0.1")
    port: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(_ENUM_LEN), default="PROVISIONING")
    health: Mapped[str] = mapped_column(String(_ENUM_LEN), default="NOT_CHECKED")
    traffic: Mapped[str] = mapped_column(String(_ENUM_LEN), default="INACTIVE")
    failures: Mapped[int] = mapped_column(Integer, default=0)  # health checks failed in a row
    last_error: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ready_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    checked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)

    endpoint: Mapped[ServingEndpoint] = relationship(back_populates="routes")


class ServingToken(Base):
    """A token that calls an endpoint (``Authorization: Bearer``): shown once, stored hashed
    (:mod:`labfleet.core.passwords`); it reads ``lfsrv_<id>_<secret>``."""

    __tablename__ = "serving_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(
        ForeignKey("serving_endpoints.id", ondelete="CASCADE"), index=True
    )
    token_hash: Mapped[str] = mapped_column(String(255))
    note: Mapped[str] = mapped_column(Text, default="")
    rate_limit: Mapped[int] = mapped_column(Integer, default=600)  # requests per minute; 0 = unlimited
    created_by: Mapped[str] = mapped_column(String(255), default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    last_used: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    latency_ms_total: Mapped[float] = mapped_column(Float, default=0.0)

    endpoint: Mapped[ServingEndpoint] = relationship(back_populates="tokens")


class ServingUsage(Base):
    """Requests to one endpoint with one token (``token_id`` None: no token, an endpoint open to the
    public) in one 15-minute bucket (``bucket_start``, UTC), written by the serving controller each tick
    (labfleet.usage.serving_usage): how many, how many failed (5xx, or refused by the rate limit), their
    summed latency in ms. Names are copied, as in the usage buckets, so a row outlives its endpoint,
    owner and project; retention deletes old ones with the usage buckets."""

    __tablename__ = "serving_usage"
    __table_args__ = (
        Index("ix_serving_usage_bucket", "bucket_start"),
        Index("ix_serving_usage_endpoint_bucket", "endpoint_id", "bucket_start"),
        Index("ix_serving_usage_user_bucket", "user", "bucket_start"),
        Index("ix_serving_usage_domain_bucket", "domain", "bucket_start"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    endpoint_id: Mapped[str] = mapped_column(String(36))
    endpoint: Mapped[str] = mapped_column(String(64))
    token_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    bucket_start: Mapped[datetime] = mapped_column(UTCDateTime())
    user: Mapped[str] = mapped_column(String(255))
    project: Mapped[str] = mapped_column(String(130))  # DOMAIN/PROJECT
    domain: Mapped[str] = mapped_column(String(64))
    requests: Mapped[int] = mapped_column(BigInteger, default=0)
    errors: Mapped[int] = mapped_column(BigInteger, default=0)
    latency_ms_total: Mapped[float] = mapped_column(Float, default=0.0)


# Models kept in modules of their own (this one is near its size limit): imported here, so their tables
# are in Base.metadata wherever the models are (safe in either import order: only the module is taken).
from labfleet.core import envmodels  # noqa: E402

MODEL_MODULES = (envmodels,)
