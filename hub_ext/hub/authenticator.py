"""JupyterHub authenticators backed by the labfleet service.

The Hub never writes labfleet's database: every login and every refresh asks the labfleet service
(a Hub-managed service) over HTTP, authenticated with the service's own API token, which the Hub and
the service share. The service answers with a Hub auth model (name, admin, groups, roles, built by
:mod:`labfleet.core.hubmap`), so Hub groups (``domain:<d>``, ``project:<d>/<p>``) and roles
(``labfleet-user``, ``labfleet-monitor``, ``labfleet-domain-admin-<d>``) follow labfleet's tenancy.

Two ways of logging in:

- :class:`LabfleetAuthenticator`: the stock Hub login form; the service checks the password.
- :func:`labfleet_authenticator_for`: another authenticator (OAuthenticator's GenericOAuthenticator,
  GitHub, ...) proves who the user is, with its own login and callback handlers; labfleet then maps that
  identity to a labfleet user (optionally creating it, and syncing domain, projects and role from the
  identity provider's claims).
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any
from urllib.parse import quote

from jupyterhub import roles as hub_roles
from jupyterhub.auth import Authenticator
from jupyterhub.utils import maybe_future
from traitlets import Bool, Dict, Float, List, Unicode, default, import_item, validate

from labfleet.core.http import HTTPReply
from labfleet.hub import links, proxy_errors, users_api
from labfleet.hub.client import LabfleetServiceClient

LABFLEET_ROLES = ("superadmin", "admin", "user", "monitor")

_MISSING = object()


class LabfleetAuthModel(dict):
    """A Hub auth model issued by the labfleet service.

    A plain dict to JupyterHub; :meth:`LabfleetBaseAuthenticator.check_allowed` admits only models of this
    type, which only this module creates from a successful answer of the service.
    ``service_name`` is the name the service answered for, so a model whose name was changed afterwards
    (e.g. by ``normalize_username``) is refused instead of logging in a different Hub user.
    """

    __slots__ = ("service_name",)

    def __init__(self, *args: Any, service_name: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.service_name = service_name


def _remote_addr(handler: Any) -> str:
    request = getattr(handler, "request", None)
    return getattr(request, "remote_ip", None) or ""


def _lookup(claims: Any, path: str) -> Any:
    """A claim by key, or by dotted path (``realm_access.roles``); ``_MISSING`` when absent.

    An exact key wins, so claim names that contain dots (``https://example.org/roles``) work too.
    """
    if not isinstance(claims, dict):
        return _MISSING
    if path in claims:
        return claims[path]
    value: Any = claims
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            return _MISSING
        value = value[part]
    return value


def hub_state_matches(user: Any, model: dict) -> bool:
    """Whether the Hub's user already has the model's groups, roles (by name) and admin flag.

    A refresh that returns the model makes the Hub write every group and role again (once a minute
    per active user, and before each spawn); with nothing changed, True lets it skip that. Role
    scopes are not compared: labfleet's roles are named by what they grant (a domain admin's role
    carries the domain in its name), and every login writes them afresh."""
    groups = getattr(user, "groups", None)
    roles = getattr(user, "roles", None)
    if groups is None or roles is None:
        return False
    return (
        {g.name for g in groups} == set(model.get("groups", []))
        and {r.name for r in roles} == {r["name"] for r in model.get("roles", [])}
        and bool(getattr(user, "admin", False)) == bool(model.get("admin"))
    )


def _strings(value: Any) -> list[str]:
    """A claim value as a list of non-empty strings (a single string becomes a one-item list)."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple, set)):
        return []
    return [v.strip() for v in value if isinstance(v, str) and v.strip()]


class LabfleetBaseAuthenticator(LabfleetServiceClient, Authenticator):
    """What both ways of logging in share: talking to the labfleet service and mapping its answer.

    labfleet decides who exists, who is active and what their groups and roles are: ``check_allowed``
    admits only auth models that the service issued, and ``refresh_user`` re-reads them (every
    ``auth_refresh_age`` seconds and before each spawn), ending the Hub session of a user who was
    deactivated or deleted.
    """

    request_timeout = Float(
        10.0,
        help="""Seconds to wait for the labfleet service (connecting and answering) before a login or a
        refresh fails.""",
    ).tag(config=True)

    # labfleet owns groups and roles, and who may log in; re-read them often.
    @default("manage_groups")
    def _manage_groups_default(self) -> bool:
        return True

    @default("manage_roles")
    def _manage_roles_default(self) -> bool:
        return True

    @default("auth_refresh_age")
    def _auth_refresh_age_default(self) -> int:
        return 60

    @default("refresh_pre_spawn")
    def _refresh_pre_spawn_default(self) -> bool:
        return True

    @default("any_allow_config")
    def _any_allow_config_default(self) -> bool:
        # the labfleet service is the allow configuration: no "nobody can log in" warning
        return True

    # --- the service -----------------------------------------------------------------------------

    async def _service_call(self, method: str, path: str, body: dict | None = None) -> HTTPReply:
        return await self.service_request(method, path, body, timeout=self.request_timeout)

    def _hub_default_role(self, name: str) -> dict:
        """The Hub's own ``user`` or ``admin`` role spec, as the Hub loaded it at start-up.

        With ``manage_roles``, JupyterHub strips every role of the user that the auth model does not
        list, its default ``user`` and ``admin`` roles included; so the model lists them too, with the
        scopes the Hub gave them (``extra_user_scopes``, a ``user`` role in ``load_roles``), which
        leaves those roles exactly as they are.
        """
        spec = next(r for r in hub_roles.get_default_roles() if r["name"] == name)
        app = self.parent
        if name == "user" and app is not None:
            extra = getattr(app, "extra_user_scopes", None)
            if extra:
                spec["scopes"] = [*spec["scopes"], *extra]
            for role in getattr(app, "load_roles", None) or []:
                if isinstance(role, dict) and role.get("name") == "user":
                    spec.update({k: role[k] for k in ("description", "scopes") if k in role})
        return spec

    def _hub_model(self, data: Any, what: str) -> LabfleetAuthModel | None:
        """The Hub auth model from a 200 answer of the service (``{"auth_model": {...}}``)."""
        model = data.get("auth_model") if isinstance(data, dict) else None
        if not (
            isinstance(model, dict)
            and isinstance(model.get("name"), str)
            and model["name"]
            and isinstance(model.get("groups"), list)
            and all(isinstance(g, str) for g in model["groups"])
            and isinstance(model.get("roles", []), list)
            and all(isinstance(r, dict) and isinstance(r.get("name"), str) for r in model.get("roles", []))
        ):
            self.log.error("labfleet service sent a malformed auth model for %s; refusing", what)
            return None
        admin = bool(model.get("admin"))
        role_list = [dict(r) for r in model.get("roles", [])]
        names = {r["name"] for r in role_list}
        for default_role in ("user", "admin") if admin else ("user",):
            if default_role not in names:
                role_list.append(self._hub_default_role(default_role))
        return LabfleetAuthModel(
            {
                "name": model["name"],
                "admin": admin,
                "groups": list(model["groups"]),
                "roles": role_list,
            },
            service_name=model["name"],
        )

    async def _fetch_user_model(self, username: str) -> LabfleetAuthModel | None:
        """The user's current auth model (``GET /auth/users/{name}``), or None when they may not log in."""
        reply = await self._service_call("GET", f"/auth/users/{quote(username, safe='')}")
        if reply.code == 200:
            model = self._hub_model(reply.data, username)
            if model is not None and model["name"] != username:
                self.log.error(
                    "labfleet service answered for %r when asked about %r; refusing", model["name"], username
                )
                return None
            return model
        if reply.code in (403, 404):
            self.log.info(
                "labfleet user %s is %s: %s",
                username,
                "inactive" if reply.code == 403 else "unknown",
                reply.message or "-",
            )
        return None

    # --- the Hub's hooks -------------------------------------------------------------------------

    def check_allowed(self, username: str, authentication: dict | None = None) -> bool:
        """Only auth models the labfleet service issued are allowed, for the name it issued them for."""
        if not isinstance(authentication, LabfleetAuthModel):
            self.log.warning("User %s has no labfleet auth model; not allowed", username)
            return False
        if authentication.service_name != username:
            self.log.warning(
                "labfleet issued the auth model for %r, but the Hub would log in %r; not allowed",
                authentication.service_name,
                username,
            )
            return False
        return True

    async def refresh_user(self, user: Any, handler: Any = None) -> dict | bool:
        """Re-read the user's groups and roles from labfleet; False (new login needed) when they were
        deactivated or deleted, or when the service cannot be asked; True (nothing to write) when the
        Hub already has exactly those groups, roles and admin flag."""
        model = await self._fetch_user_model(user.name)
        if model is None:
            self.log.warning("labfleet: could not refresh %s; a new login is required", user.name)
            return False
        return True if hub_state_matches(user, model) else model

    def get_handlers(self, app: Any) -> list[tuple[str, Any]]:
        """The login handler, the Hub user API kept consistent with labfleet (labfleet.hub.users_api)
        and the proxy's error pages as JSON for the service's API (labfleet.hub.proxy_errors)."""
        return [
            *users_api.handlers(),
            *proxy_errors.handlers(),
            *links.handlers(),
            *super().get_handlers(app),
        ]

    async def load_managed_roles(self) -> list[dict]:
        """No roles at start-up: labfleet's roles are created at login from the auth model's role specs
        (``User.sync_roles``), and kept across restarts (``reset_managed_roles_on_startup`` stays False)."""
        if self.reset_managed_roles_on_startup:
            self.log.warning(
                "labfleet: reset_managed_roles_on_startup is set; labfleet roles are removed now and"
                " given back to each user at their next login or refresh"
            )
        return []


class LabfleetAuthenticator(LabfleetBaseAuthenticator):
    """Username and password, checked by the labfleet service (the stock Hub login page)."""

    async def authenticate(self, handler: Any, data: dict | None) -> LabfleetAuthModel | None:
        data = data or {}
        raw = data.get("username")
        password = data.get("password")
        if not isinstance(raw, str) or not raw.strip() or not isinstance(password, str):
            return None
        username = self.normalize_username(raw.strip())
        reply = await self._service_call(
            "POST",
            "/auth/password",
            {"username": username, "password": password, "remote_addr": _remote_addr(handler)},
        )
        if reply.code == 200:
            return self._hub_model(reply.data, username)
        if reply.code == 403:
            self.log.warning("labfleet refused the login of %s: %s", username, reply.message or "-")
        elif reply.code == 400:
            self.log.warning("labfleet refused the login of %s (bad request): %s", username, reply.message)
        return None


class LabfleetDelegatingMixin(LabfleetBaseAuthenticator):
    """Let another authenticator prove the identity, then map it to a labfleet user.

    Not used alone: :func:`labfleet_authenticator_for` puts it in front of the authenticator that proves
    the identity. Configure it as ``c.LabfleetDelegatingMixin.<trait>`` (or under the generated class's
    name, e.g. ``c.LabfleetGenericOAuthenticator.<trait>``). Claims are read from the identity's
    auth_state: ``auth_state[user_auth_state_key]`` (OAuthenticator: ``oauth_user``, the user info or the
    id token's claims), else auth_state itself.
    """

    delegate_class: type[Authenticator] | None = None

    create_users = Bool(
        False,
        help="""Create a labfleet user on the first login of an identity that labfleet does not know yet,
        in its claimed domain (else `default_domain`), projects (else `default_projects`) and role (else
        `default_role`). When False, only users that already exist in labfleet may log in.""",
    ).tag(config=True)

    default_domain = Unicode(
        "",
        help="""Domain of users created at login when `domain_claim` gives none. Required with
        `create_users` unless every identity carries `domain_claim`.""",
    ).tag(config=True)

    default_projects = List(
        Unicode(),
        help="""Projects (`DOMAIN/PROJECT`, or bare names in the user's domain) of users created at login
        when `projects_claim` gives none.""",
    ).tag(config=True)

    default_role = Unicode(
        "user",
        help="""labfleet role (superadmin, admin, user, monitor) of users created at login, and of users
        whose `role_claim` matches nothing in `role_map`.""",
    ).tag(config=True)

    domain_claim = Unicode(
        "",
        help="""Claim holding the user's labfleet domain (a key of the identity's claims; dotted paths such
        as `org.domain` reach nested claims). Empty: the domain does not come from claims.""",
    ).tag(config=True)

    projects_claim = Unicode(
        "",
        help="""Claim holding the user's labfleet projects: a list of `DOMAIN/PROJECT` or bare project
        names in the user's domain (a single string counts as one project). Dotted paths allowed.""",
    ).tag(config=True)

    role_claim = Unicode(
        "",
        help="""Claim holding what decides the user's labfleet role (a string or a list of strings, e.g.
        the identity provider's groups; dotted paths such as `realm_access.roles` allowed). Its values go
        through `role_map`; with an empty `role_map` a value that is itself a labfleet role name is taken.
        When set, the identity provider decides the role: no match gives `default_role`.""",
    ).tag(config=True)

    role_map = Dict(
        key_trait=Unicode(),
        value_trait=Unicode(),
        help="""Claim value -> labfleet role, e.g. {"fleet-root": "superadmin", "gpu-admins": "admin",
        "observers": "monitor"}. Entries are tried in order; the first one whose key is among the values
        of `role_claim` wins.""",
    ).tag(config=True)

    sync_from_claims = Bool(
        True,
        help="""Update an existing labfleet user's domain, projects and role from the claims at each
        login (and when a refresh brings changed claims). Claims that are not configured or absent leave
        the matching field as labfleet has it.""",
    ).tag(config=True)

    require_delegate_allowed = Bool(
        False,
        help="""Also require the delegate authenticator's own allow rules (e.g. GenericOAuthenticator's
        allowed_users, allowed_groups, allowed_scopes) to pass before the identity is mapped. Use it with
        `create_users` to limit who may get a labfleet account.""",
    ).tag(config=True)

    @validate("default_role")
    def _validate_default_role(self, proposal: Any) -> str:
        if proposal.value not in LABFLEET_ROLES:
            raise ValueError(
                f"default_role must be one of {', '.join(LABFLEET_ROLES)}, not {proposal.value!r}"
            )
        return proposal.value

    @validate("role_map")
    def _validate_role_map(self, proposal: Any) -> dict:
        bad = {k: v for k, v in proposal.value.items() if v not in LABFLEET_ROLES}
        if bad:
            raise ValueError(f"role_map values must be labfleet roles ({', '.join(LABFLEET_ROLES)}): {bad}")
        return proposal.value

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # the claim-derived fields last sent to labfleet, per user: a refresh re-maps only on change
        self._synced: dict[str, dict] = {}

    @property
    def _source(self) -> str:
        cls = self.delegate_class or type(self)
        return cls.__name__

    def identity_claims(self, identity: dict) -> dict:
        """The identity provider's claims for an auth model of the delegate authenticator."""
        auth_state = identity.get("auth_state")
        if not isinstance(auth_state, dict):
            return {}
        key = getattr(self, "user_auth_state_key", None)
        if key and isinstance(auth_state.get(key), dict):
            return auth_state[key]
        return auth_state

    def _claimed_role(self, claims: dict) -> str | None:
        if not self.role_claim:
            return None
        value = _lookup(claims, self.role_claim)
        values = [] if value is _MISSING else _strings(value)
        if self.role_map:
            for claim_value, role in self.role_map.items():
                if claim_value in values:
                    return role
        else:
            for v in values:
                if v in LABFLEET_ROLES:
                    return v
        return self.default_role

    def claimed_fields(self, claims: dict) -> dict:
        """Domain, projects and role as the claims give them (None: not given)."""
        domain = projects = None
        if self.domain_claim:
            value = _lookup(claims, self.domain_claim)
            if isinstance(value, str) and value.strip():
                domain = value.strip()
            elif value is not _MISSING:
                self.log.warning("labfleet: claim %s is not a domain name: %r", self.domain_claim, value)
        if self.projects_claim:
            value = _lookup(claims, self.projects_claim)
            if value is not _MISSING:
                projects = _strings(value)
        return {"domain": domain, "projects": projects, "role": self._claimed_role(claims)}

    async def _map_identity(
        self, username: str, claimed: dict, handler: Any, *, allow_create: bool
    ) -> LabfleetAuthModel | None:
        """``POST /auth/identity``: the labfleet user for a proven identity."""
        create = False
        fields = dict(claimed) if self.sync_from_claims else {"domain": None, "projects": None, "role": None}
        if allow_create and self.create_users:
            known = await self._service_call("GET", f"/auth/users/{quote(username, safe='')}")
            if known.code == 0:
                return None
            if known.code == 404:
                create = True
                fields = {
                    "domain": claimed["domain"] or self.default_domain or None,
                    "projects": claimed["projects"]
                    if claimed["projects"] is not None
                    else list(self.default_projects),
                    "role": claimed["role"] or self.default_role,
                }
                if not fields["domain"]:
                    self.log.error(
                        "labfleet: cannot create user %s: no domain (set default_domain or domain_claim)",
                        username,
                    )
                    return None
        reply = await self._service_call(
            "POST",
            "/auth/identity",
            {
                "username": username,
                "source": self._source,
                "remote_addr": _remote_addr(handler),
                "create": create,
                "sync": self.sync_from_claims,
                **fields,
            },
        )
        if reply.code == 200:
            model = self._hub_model(reply.data, username)
            if model is not None:
                self._synced[username] = dict(claimed)
                if create and reply.data.get("created", True):
                    self.log.info("labfleet created user %s from %s", username, self._source)
            return model
        if reply.code in (400, 403, 404):
            self.log.warning(
                "labfleet refused the %s identity %s (%s): %s",
                self._source,
                username,
                reply.code,
                reply.message or "-",
            )
        return None

    async def authenticate(self, handler: Any, data: dict | None = None) -> LabfleetAuthModel | None:
        """The delegate proves the identity; labfleet maps it to a user and gives its groups and roles."""
        identity = await maybe_future(super().authenticate(handler, data))
        if not identity:
            return None
        if isinstance(identity, str):
            identity = {"name": identity}
        username = self.normalize_username(identity["name"])
        if self.require_delegate_allowed:
            delegate_check = super(LabfleetBaseAuthenticator, self).check_allowed
            if not await maybe_future(delegate_check(username, identity)):
                self.log.warning("%s does not allow %s; not mapped to labfleet", self._source, username)
                return None
        claimed = self.claimed_fields(self.identity_claims(identity))
        model = await self._map_identity(username, claimed, handler, allow_create=True)
        if model is None:
            return None
        # keep what the delegate needs later (tokens for refresh, auth_state for spawners)
        model["auth_state"] = identity.get("auth_state")
        if identity.get("user_info") is not None:
            model["user_info"] = identity["user_info"]
        return model

    async def refresh_user(self, user: Any, handler: Any = None) -> dict | bool:
        """The delegate refreshes the identity (e.g. OAuth tokens); labfleet re-reads the user, re-mapping
        the claims when they changed since the last login or refresh."""
        delegate_refresh = super(LabfleetBaseAuthenticator, self).refresh_user
        refreshed = await maybe_future(delegate_refresh(user, handler))
        if not refreshed:
            self.log.info("%s needs a new login for %s", self._source, user.name)
            return False
        model = None
        if isinstance(refreshed, dict) and self.sync_from_claims:
            claimed = self.claimed_fields(self.identity_claims(refreshed))
            if claimed != self._synced.get(user.name):
                model = await self._map_identity(user.name, claimed, handler, allow_create=False)
                if model is None:
                    return False
        if model is None:
            model = await self._fetch_user_model(user.name)
        if model is None:
            self.log.warning("labfleet: could not refresh %s; a new login is required", user.name)
            return False
        if isinstance(refreshed, dict) and "auth_state" in refreshed:
            model["auth_state"] = refreshed["auth_state"]
        return model

    async def get_user_groups(self, auth_state: dict) -> set:
        """OAuthenticator's groups from claims, quietly empty when the claim is absent.

        labfleet replaces the Hub groups anyway; they only serve the delegate's own ``allowed_groups``
        (see ``require_delegate_allowed``). Without this, turning ``manage_groups`` on would log an error
        at each login of an identity provider that sends no groups claim.
        """
        key = getattr(self, "auth_state_groups_key", None)
        if isinstance(key, str) and _lookup(auth_state or {}, key) is _MISSING:
            return set()
        parent = super()
        if not hasattr(parent, "get_user_groups"):
            return set()
        return await maybe_future(parent.get_user_groups(auth_state))


_GENERATED: dict[type, type] = {}


def _resolve_authenticator(spec: type | str) -> type:
    if isinstance(spec, type):
        return spec
    if not isinstance(spec, str) or not spec:
        raise TypeError(f"expected an Authenticator class or an entry point name, not {spec!r}")
    registry = {ep.name.lower(): ep for ep in entry_points(group="jupyterhub.authenticators")}
    if spec.lower() in registry:
        return registry[spec.lower()].load()
    if "." in spec or ":" in spec:
        return import_item(spec.replace(":", "."))
    raise ValueError(
        f"no jupyterhub.authenticators entry point named {spec!r}; installed: {', '.join(sorted(registry))}"
    )


def labfleet_authenticator_for(spec: type | str) -> type:
    """A class ``Labfleet<Name>`` that lets ``spec`` prove identities and labfleet map them.

    ``spec``: an Authenticator class, a ``jupyterhub.authenticators`` entry point name ("generic-oauth",
    "github", "dummy", ...) or an import path ("oauthenticator.generic.GenericOAuthenticator"). The
    delegate's own login and callback handlers keep working (OAuthenticator's redirect flow included).
    The same delegate always gives the same class.
    """
    cls = _resolve_authenticator(spec)
    if not (isinstance(cls, type) and issubclass(cls, Authenticator)):
        raise TypeError(f"{cls!r} is not a JupyterHub Authenticator")
    if issubclass(cls, LabfleetBaseAuthenticator):
        raise ValueError(f"{cls.__name__} already maps identities through labfleet")
    if cls not in _GENERATED:
        name = f"Labfleet{cls.__name__}"
        _GENERATED[cls] = type(
            name,
            (LabfleetDelegatingMixin, cls),
            {
                "__module__": __name__,
                "__qualname__": name,
                "__doc__": f"{cls.__name__} proves the identity; labfleet maps it to a user, groups and roles.",
                "delegate_class": cls,
            },
        )
    return _GENERATED[cls]


# Classes for well-known delegates, importable (and usable as entry points) as
# labfleet.hub.authenticator:Labfleet<Name>; built on first access, so their packages stay optional.
_LAZY_DELEGATES = {
    "LabfleetGenericOAuthenticator": "generic-oauth",
    "LabfleetGitHubOAuthenticator": "github",
    "LabfleetGitLabOAuthenticator": "gitlab",
    "LabfleetGoogleOAuthenticator": "google",
    "LabfleetAzureAdOAuthenticator": "azuread",
    "LabfleetDummyAuthenticator": "dummy",
}


def __getattr__(name: str) -> type:
    if name in _LAZY_DELEGATES:
        return labfleet_authenticator_for(_LAZY_DELEGATES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
