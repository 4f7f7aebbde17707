"""How labfleet tenancy shows in JupyterHub: group names and managed roles.

Pure functions shared by the authenticator (at login and refresh) and the service
(when tenants change, it pushes group membership to the Hub's REST API).
"""

from __future__ import annotations

from collections.abc import Mapping

SERVICE_NAME = "labfleet"
ADMIN_SERVICE_NAME = "labfleet-admin"  # the admin console (admin_dashboards/)
ADMIN_CONSOLE_ENV = "LABFLEET_ADMIN_CONSOLE"  # 0, false, no or off: no admin console
DOMAIN_GROUP_PREFIX = "domain:"
PROJECT_GROUP_PREFIX = "project:"
ROLE_PREFIX = "labfleet-"
# The Docker network of the Docker backend's sessions (nftables-guarded by the spawner), unless
# DOCKER_NETWORK_ENV names another; environment builds run there too, reaching what a session reaches.
DOCKER_NETWORK_ENV = "LABFLEET_DOCKER_NETWORK"
DEFAULT_DOCKER_NETWORK = "labfleet-sessions"
# The label the Docker and Swarm spawners give a session's container: its labfleet session id.
SESSION_ID_LABEL = "ai.labfleet.session-id"

# Every queued session is a spawn the Hub has pending, and the Hub refuses every spawn (429) once
# concurrent_spawn_limit are pending. So the fleet queues at most DEFAULT_MAX_QUEUED_SESSIONS (the
# service's max_queued_sessions), one user at most DEFAULT_MAX_PENDING_PER_USER of them, and the Hub's
# limit is raised by the queue's size: the Hub's own default is left for sessions that start at once.
HUB_SPAWN_LIMIT = 100  # JupyterHub's default concurrent_spawn_limit
DEFAULT_MAX_QUEUED_SESSIONS = 200
DEFAULT_MAX_PENDING_PER_USER = 20


def concurrent_spawn_limit(max_queued_sessions: int) -> int:
    """The Hub's concurrent_spawn_limit for a fleet that queues at most ``max_queued_sessions``
    (0: the queue has no limit, so neither may the Hub's: 0)."""
    return HUB_SPAWN_LIMIT + max_queued_sessions if max_queued_sessions > 0 else 0


def domain_group(domain: str) -> str:
    return f"{DOMAIN_GROUP_PREFIX}{domain}"


def project_group(domain: str, project: str) -> str:
    return f"{PROJECT_GROUP_PREFIX}{domain}/{project}"


def is_labfleet_group(name: str) -> bool:
    return name.startswith((DOMAIN_GROUP_PREFIX, PROJECT_GROUP_PREFIX))


def hub_groups(domain: str, projects: list[str]) -> list[str]:
    """A user's Hub groups: their domain and each of their projects (``DOMAIN/PROJECT`` names)."""
    groups = [domain_group(domain)]
    for full in sorted(projects):
        d, _, p = full.partition("/")
        groups.append(project_group(d, p))
    return groups


def _service_access() -> str:
    return f"access:services!service={SERVICE_NAME}"


def _console_access() -> str:
    return f"access:services!service={ADMIN_SERVICE_NAME}"


def hub_roles(role: str, domain: str) -> list[dict]:
    """Authenticator-managed Hub roles for a labfleet role.

    A domain admin's role filters every user and server scope with
    ``!group=domain:<d>``, so the stock Hub admin page shows them their domain only.
    """
    if role == "admin":
        g = f"!group={domain_group(domain)}"
        return [
            {
                "name": f"{ROLE_PREFIX}domain-admin-{domain}",
                "description": f"labfleet domain admin of {domain}",
                "scopes": [
                    _service_access(),
                    _console_access(),
                    "admin-ui",
                    f"list:users{g}",
                    f"admin:users{g}",
                    f"admin:servers{g}",
                    f"access:servers{g}",
                    f"read:groups{g}",
                    f"list:groups{g}",
                ],
            }
        ]
    if role == "monitor":
        return [
            {
                "name": f"{ROLE_PREFIX}monitor",
                "description": "labfleet monitor: reads the whole fleet, changes nothing",
                "scopes": [
                    _service_access(),
                    _console_access(),
                    "admin-ui",
                    "list:users",
                    "read:users",
                    "read:servers",
                    "list:groups",
                    "read:groups",
                    "read:hub",
                ],
            }
        ]
    # Superadmins are Hub admins (auth_model["admin"]); they and users need only the service.
    return [
        {
            "name": f"{ROLE_PREFIX}user",
            "description": "labfleet user: may use the labfleet service",
            "scopes": [_service_access()],
        }
    ]


def auth_model(username: str, role: str, domain: str, projects: list[str]) -> dict:
    """The auth model the authenticator hands to JupyterHub for a labfleet user."""
    return {
        "name": username,
        "admin": role == "superadmin",
        "groups": hub_groups(domain, projects),
        "roles": hub_roles(role, domain),
    }


def console_wanted(environ: Mapping[str, str]) -> bool:
    """Whether ``$LABFLEET_ADMIN_CONSOLE`` asks for the admin console (anything but 0, false, no,
    off): the Hub starts it (``configure``) and the service links it (the Fleet home) by this rule."""
    return environ.get(ADMIN_CONSOLE_ENV, "").strip().lower() not in ("0", "false", "no", "off")
