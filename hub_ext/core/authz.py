"""Who may do what: pure functions over an :class:`Actor` and a target's domain.

Roles: ``superadmin`` (everything), ``admin`` (a domain admin: everything inside
their domain), ``user`` (their own things), ``monitor`` (reads everything, changes
nothing).  Targets outside what an actor may read are reported as *not found*
by the callers, so that existence does not leak across tenants.
"""

from __future__ import annotations

from dataclasses import dataclass

ROLES = ("superadmin", "admin", "user", "monitor")


@dataclass(frozen=True)
class Actor:
    name: str
    role: str
    domain: str | None = None
    user_id: int | None = None
    remote_addr: str = ""
    # "user" (a person), "cli" (the labfleet command, trusted like a superadmin),
    # "hub" (the Hub process, through the service's own token: authenticator and spawners),
    # "metrics" (a Prometheus server with the metrics token: reads /metrics only, as a monitor).
    kind: str = "user"
    # The access key of the keypair that signed the request; None for tokens and logins
    # (those count against the user's main keypair).
    keypair: str | None = None

    @classmethod
    def cli(cls) -> Actor:
        return cls(name="cli", role="superadmin", kind="cli")

    @classmethod
    def hub(cls, remote_addr: str = "") -> Actor:
        return cls(name="hub", role="superadmin", kind="hub", remote_addr=remote_addr)

    @property
    def is_superadmin(self) -> bool:
        return self.role == "superadmin"

    @property
    def reads_everything(self) -> bool:
        return self.role in ("superadmin", "monitor")

    def is_domain_admin_of(self, domain: str | None) -> bool:
        return self.role == "admin" and domain is not None and self.domain == domain


def can_read_domain(actor: Actor, domain: str) -> bool:
    return actor.reads_everything or actor.domain == domain


def can_manage_domains(actor: Actor) -> bool:
    return actor.is_superadmin


def can_read_project(actor: Actor, domain: str, member_names: set[str] | frozenset[str]) -> bool:
    if actor.reads_everything or actor.is_domain_admin_of(domain):
        return True
    return actor.domain == domain and actor.name in member_names


def can_manage_in_domain(actor: Actor, domain: str) -> bool:
    """Create, change and delete projects, users and memberships in ``domain``."""
    return actor.is_superadmin or actor.is_domain_admin_of(domain)


def can_read_user(actor: Actor, username: str, domain: str) -> bool:
    if actor.reads_everything or actor.is_domain_admin_of(domain):
        return True
    return actor.name == username


def can_grant_role(actor: Actor, role: str) -> bool:
    """A domain admin may make users and admins of their domain, never superadmins or monitors."""
    if actor.is_superadmin:
        return True
    return actor.role == "admin" and role in ("user", "admin")


def can_read_policies(actor: Actor) -> bool:
    # Policies are fleet-wide settings, not tenant data; admins need them to assign them.
    return actor.role in ("superadmin", "monitor", "admin")


def can_manage_policies(actor: Actor) -> bool:
    return actor.is_superadmin


def can_read_keypairs_of(actor: Actor, owner: str, owner_domain: str) -> bool:
    return can_read_user(actor, owner, owner_domain)


def can_manage_keypairs_of(actor: Actor, owner: str, owner_domain: str) -> bool:
    if actor.role == "monitor":
        return False
    return actor.name == owner or can_manage_in_domain(actor, owner_domain)


def can_read_audit_entry(
    actor: Actor, actor_name: str, actor_domain: str | None, target_domain: str | None
) -> bool:
    if actor.reads_everything:
        return True
    if actor.role == "admin" and actor.domain in (actor_domain, target_domain):
        return True
    return actor.name == actor_name


def can_run_maintenance(actor: Actor) -> bool:
    """Fleet-wide repairs (recalculating the usage ledger): a superadmin or the CLI; not the Hub's
    own token (its spawners and authenticator never need them), not monitors."""
    return actor.is_superadmin and actor.kind in ("user", "cli")


def inactive_reason(
    username: str, role: str, user_active: bool, domain: str, domain_active: bool
) -> str | None:
    """Why a person may not log in or call the API now, or None when they may.

    A deactivated domain suspends its people (logins, refreshes, tokens, keypairs) until it is
    active again; superadmins are kept, so someone can reactivate it."""
    if not user_active:
        return f"user {username} is inactive"
    if not domain_active and role != "superadmin":
        return f"domain {domain} is inactive"
    return None
