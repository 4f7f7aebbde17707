"""The labfleet authenticators (hub_ext/hub/authenticator.py).

Part A drives the authenticators against a small HTTP fake of the labfleet service's three internal
auth endpoints (the service itself is tested for real elsewhere; the fake only lives in this file).
Part B runs a real OAuth2 authorization-code flow (with PKCE) against a small OAuth2 provider on
127.0.0.1, through OAuthenticator's own GenericOAuthenticator code, with labfleet mapping the identity.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import logging
import secrets
import socket
import threading
import time
from urllib.parse import parse_qs, urlparse

import pytest
import requests
from jupyterhub import orm
from jupyterhub import roles as jh_roles
from jupyterhub.handlers.base import BaseHandler
from jupyterhub.scopes import get_scopes_for
from jupyterhub.user import User
from oauthenticator.generic import GenericOAuthenticator
from oauthenticator.oauth2 import OAuthCallbackHandler, OAuthLoginHandler, _serialize_state
from tornado import web
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.httputil import url_concat
from tornado.netutil import bind_sockets
from traitlets import List as TList
from traitlets import Set
from traitlets.config import Configurable

from labfleet.core import hubmap
from labfleet.hub import authenticator as lfauth
from labfleet.hub.authenticator import (
    LabfleetAuthenticator,
    LabfleetAuthModel,
    LabfleetDelegatingMixin,
    labfleet_authenticator_for,
)
from labfleet.hub.client import DEFAULT_SERVICE_URL

TOKEN = "svc-" + secrets.token_hex(16)
API = "/services/labfleet/api"
CLIENT_ADDR = "127.0.0.5"
_NO_DEFAULT = object()


# --- a fake of the labfleet service's internal auth endpoints ---------------------------------------


class FakeLabfleet:
    def __init__(self) -> None:
        self.users = {
            "alice": {
                "password": "pw-alice",
                "active": True,
                "role": "user",
                "domain": "acme",
                "projects": ["acme/ml"],
            },
            "root": {
                "password": "pw-root",
                "active": True,
                "role": "superadmin",
                "domain": "acme",
                "projects": [],
            },
            "dora": {
                "password": "pw-dora",
                "active": True,
                "role": "admin",
                "domain": "acme",
                "projects": ["acme/cv"],
            },
            "ivan": {
                "password": "pw-ivan",
                "active": False,
                "role": "user",
                "domain": "acme",
                "projects": [],
            },
        }
        self.calls: list[dict] = []
        self.fail_with: int | None = None
        self.url = ""

    def model(self, name: str) -> dict:
        u = self.users[name]
        return {"auth_model": hubmap.auth_model(name, u["role"], u["domain"], u["projects"])}

    def bodies(self, path: str) -> list[dict]:
        return [c["body"] for c in self.calls if c["path"] == path]


class _FakeHandler(web.RequestHandler):
    def initialize(self, fake: FakeLabfleet) -> None:
        self.fake = fake

    def prepare(self) -> None:
        body = json.loads(self.request.body) if self.request.body else None
        path = self.request.path[len(API) :]
        self.fake.calls.append(
            {
                "method": self.request.method,
                "path": path,
                "auth": self.request.headers.get("Authorization"),
                "body": body,
            }
        )
        if self.request.headers.get("Authorization") != f"token {TOKEN}":
            self.fail(401, "bad token")
        elif self.fake.fail_with:
            self.fail(self.fake.fail_with, "boom")
        self.body = body

    def fail(self, status: int, message: str) -> None:
        self.set_status(status)
        self.finish({"status": status, "message": message})

    def answer(self, name: str) -> None:
        u = self.fake.users.get(name)
        if u is None:
            self.fail(404, "no such user")
        elif not u["active"]:
            self.fail(403, "user is inactive")
        else:
            self.finish(self.fake.model(name))


class _Password(_FakeHandler):
    def post(self) -> None:
        u = self.fake.users.get(self.body["username"])
        if u is None or not u["active"] or u["password"] != self.body["password"]:
            self.fail(403, "wrong username or password")
        else:
            self.answer(self.body["username"])


class _Identity(_FakeHandler):
    def post(self) -> None:
        b = self.body
        name = b["username"]
        if name not in self.fake.users:
            if not b["create"]:
                return self.fail(403, "unknown user")
            if not b["domain"]:
                return self.fail(400, "domain required")
            self.fake.users[name] = {
                "password": None,
                "active": True,
                "role": "user",
                "domain": b["domain"],
                "projects": [],
            }
        elif not b["sync"] or not self.fake.users[name]["active"]:
            return self.answer(name)
        u = self.fake.users[name]
        if b["domain"] is not None:
            u["domain"] = b["domain"]
        if b["projects"] is not None:
            u["projects"] = [p if "/" in p else f"{u['domain']}/{p}" for p in b["projects"]]
        if b["role"] is not None:
            u["role"] = b["role"]
        self.answer(name)


class _Users(_FakeHandler):
    def get(self, name: str) -> None:
        self.answer(name)


async def _serve(app: web.Application) -> tuple[HTTPServer, str]:
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app)
    server.add_sockets(sockets)
    return server, f"http://127.0.0.1:{sockets[0].getsockname()[1]}"


@pytest.fixture
async def labfleet():
    fake = FakeLabfleet()
    app = web.Application(
        [
            (API + "/auth/password", _Password, {"fake": fake}),
            (API + "/auth/identity", _Identity, {"fake": fake}),
            (API + "/auth/users/([^/]+)", _Users, {"fake": fake}),
        ]
    )
    server, base = await _serve(app)
    fake.url = base + API
    yield fake
    server.stop()


@pytest.fixture
def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}{API}"


class FakeRequest:
    remote_ip = CLIENT_ADDR


class LoginHandlerStub:
    """What an authenticator reads from the Hub's login handler."""

    request = FakeRequest()


class UserStub:
    def __init__(self, name: str, auth_state: dict | None = None) -> None:
        self.name = name
        self.auth_state = auth_state

    async def get_auth_state(self):
        return self.auth_state


def password_auth(fake: FakeLabfleet, **kw) -> LabfleetAuthenticator:
    return LabfleetAuthenticator(service_url=fake.url, service_token=TOKEN, **kw)


def role_names(model: dict) -> list[str]:
    return sorted(r["name"] for r in model["roles"])


# --- Part A: password login, check_allowed, refresh, failures ---------------------------------------


async def test_defaults_and_traits(monkeypatch):
    monkeypatch.setenv("LABFLEET_SERVICE_API_URL", "http://127.0.0.1:1/services/labfleet/api")
    monkeypatch.setenv("LABFLEET_SERVICE_TOKEN", "from-env")
    a = LabfleetAuthenticator()
    assert (a.manage_groups, a.manage_roles, a.auth_refresh_age, a.refresh_pre_spawn) == (
        True,
        True,
        60,
        True,
    )
    assert a.service_url == "http://127.0.0.1:1/services/labfleet/api"
    assert a.service_token == "from-env"
    assert await a.load_managed_roles() == []
    monkeypatch.delenv("LABFLEET_SERVICE_API_URL")
    assert LabfleetAuthenticator().service_url == DEFAULT_SERVICE_URL
    for name in ("service_url", "service_token", "request_timeout"):
        assert len(LabfleetAuthenticator.class_traits()[name].help) > 40


async def test_password_login(labfleet):
    a = password_auth(labfleet)
    model = await a.get_authenticated_user(
        LoginHandlerStub(), {"username": " Alice ", "password": "pw-alice"}
    )
    assert model["name"] == "alice"
    assert model["admin"] is False
    assert model["groups"] == ["domain:acme", "project:acme/ml"]
    # labfleet's role, plus the Hub's default 'user' role so that sync_roles keeps it
    assert role_names(model) == ["labfleet-user", "user"]
    [call] = labfleet.calls
    assert call["method"] == "POST" and call["path"] == "/auth/password"
    assert call["auth"] == f"token {TOKEN}"
    assert call["body"] == {"username": "alice", "password": "pw-alice", "remote_addr": CLIENT_ADDR}


async def test_superadmin_and_domain_admin_models(labfleet):
    a = password_auth(labfleet)
    root = await a.get_authenticated_user(LoginHandlerStub(), {"username": "root", "password": "pw-root"})
    assert root["admin"] is True
    assert role_names(root) == ["admin", "labfleet-user", "user"]
    dora = await a.get_authenticated_user(LoginHandlerStub(), {"username": "dora", "password": "pw-dora"})
    assert dora["admin"] is False
    assert dora["groups"] == ["domain:acme", "project:acme/cv"]
    [domain_admin] = [r for r in dora["roles"] if r["name"] == "labfleet-domain-admin-acme"]
    assert "admin:users!group=domain:acme" in domain_admin["scopes"]


@pytest.mark.parametrize(
    "username,password,why",
    [("alice", "nope", "wrong password"), ("ivan", "pw-ivan", "inactive"), ("zed", "x", "unknown")],
)
async def test_password_login_refused(labfleet, caplog, username, password, why):
    a = password_auth(labfleet)
    with caplog.at_level(logging.INFO):
        assert (
            await a.get_authenticated_user(LoginHandlerStub(), {"username": username, "password": password})
            is None
        )
    assert f"labfleet refused the login of {username}" in caplog.text
    assert password not in caplog.text


async def test_token_sent_and_never_logged(labfleet, caplog, closed_port_url):
    a = password_auth(labfleet)
    with caplog.at_level(logging.DEBUG):
        await a.get_authenticated_user(LoginHandlerStub(), {"username": "alice", "password": "pw-alice"})
        await a.get_authenticated_user(LoginHandlerStub(), {"username": "alice", "password": "bad-secret"})
        await a.refresh_user(UserStub("alice"))
        labfleet.fail_with = 500
        await a.refresh_user(UserStub("alice"))
        labfleet.fail_with = None
        a.service_token = "not-the-token"
        await a.refresh_user(UserStub("alice"))
        a.service_token = TOKEN
        a.service_url = closed_port_url
        await a.get_authenticated_user(LoginHandlerStub(), {"username": "alice", "password": "pw-alice"})
    assert all(c["auth"] in (f"token {TOKEN}", "token not-the-token") for c in labfleet.calls)
    assert len(labfleet.calls) == 5
    assert "rejected the Hub's token" in caplog.text
    assert TOKEN not in caplog.text
    assert "not-the-token" not in caplog.text
    assert "pw-alice" not in caplog.text and "bad-secret" not in caplog.text


async def test_check_allowed_only_for_service_models(labfleet):
    a = password_auth(labfleet)
    assert a.check_allowed("alice", {"name": "alice", "groups": [], "roles": []}) is False
    assert a.check_allowed("alice", None) is False
    model = await a.authenticate(LoginHandlerStub(), {"username": "alice", "password": "pw-alice"})
    assert isinstance(model, LabfleetAuthModel)
    assert a.check_allowed("alice", model) is True
    # a model renamed after the service issued it is not allowed
    assert a.check_allowed("mallory", model) is False

    class Sneaky(LabfleetAuthenticator):
        async def authenticate(self, handler, data):
            return {"name": "mallory", "groups": [], "roles": []}

    sneaky = Sneaky(service_url=labfleet.url, service_token=TOKEN)
    assert await sneaky.get_authenticated_user(LoginHandlerStub(), {"username": "x", "password": "y"}) is None


async def test_service_name_must_survive_normalization(labfleet, caplog):
    labfleet.users["Bob"] = dict(labfleet.users["alice"], password="pw-bob")

    class CaseKeeping(LabfleetAuthenticator):
        def normalize_username(self, username):
            return username if username == "Bob" else username.lower()

    a = CaseKeeping(service_url=labfleet.url, service_token=TOKEN)
    model = await a.authenticate(LoginHandlerStub(), {"username": "Bob", "password": "pw-bob"})
    assert model["name"] == "Bob"
    assert a.check_allowed("bob", model) is False
    assert "labfleet issued the auth model for 'Bob'" in caplog.text


async def test_refresh_follows_labfleet(labfleet, caplog):
    a = password_auth(labfleet)
    first = await a.refresh_user(UserStub("alice"))
    assert first["groups"] == ["domain:acme", "project:acme/ml"]
    assert labfleet.calls[-1]["method"] == "GET" and labfleet.calls[-1]["path"] == "/auth/users/alice"

    labfleet.users["alice"]["projects"] = ["acme/ml", "acme/cv"]
    labfleet.users["alice"]["role"] = "monitor"
    changed = await a.refresh_user(UserStub("alice"))
    assert changed["groups"] == ["domain:acme", "project:acme/cv", "project:acme/ml"]
    assert role_names(changed) == ["labfleet-monitor", "user"]
    assert "auth_state" not in changed  # the Hub keeps the stored auth_state

    labfleet.users["alice"]["active"] = False
    with caplog.at_level(logging.INFO):
        assert await a.refresh_user(UserStub("alice")) is False
        del labfleet.users["alice"]
        assert await a.refresh_user(UserStub("alice")) is False
    assert "labfleet user alice is inactive" in caplog.text
    assert "labfleet user alice is unknown" in caplog.text


async def test_service_down(closed_port_url, caplog):
    a = LabfleetAuthenticator(service_url=closed_port_url, service_token=TOKEN, request_timeout=2)
    model = await a.get_authenticated_user(LoginHandlerStub(), {"username": "alice", "password": "pw-alice"})
    assert model is None
    assert await a.refresh_user(UserStub("alice")) is False
    assert f"labfleet service unreachable: POST {closed_port_url}/auth/password failed" in caplog.text
    assert f"GET {closed_port_url}/auth/users/alice failed" in caplog.text


async def test_service_errors(labfleet, caplog):
    a = password_auth(labfleet)
    labfleet.fail_with = 500
    assert await a.authenticate(LoginHandlerStub(), {"username": "alice", "password": "pw-alice"}) is None
    assert "labfleet service answered 500" in caplog.text
    labfleet.fail_with = None
    no_token = LabfleetAuthenticator(service_url=labfleet.url, service_token="")
    assert (
        await no_token.authenticate(LoginHandlerStub(), {"username": "alice", "password": "pw-alice"}) is None
    )
    assert "no service token configured" in caplog.text
    assert await a.authenticate(LoginHandlerStub(), {"username": "", "password": "x"}) is None
    assert await a.authenticate(LoginHandlerStub(), {}) is None


class HubStub:
    """Just what JupyterHub's own BaseHandler.auth_to_user uses, over a real Hub database."""

    def __init__(self, authenticator):
        self.db = orm.new_session_factory("sqlite:///:memory:")()
        for spec in jh_roles.get_default_roles():
            jh_roles.create_role(self.db, spec)
        self.authenticator = authenticator
        self.settings = {"config_role_names": []}

    def find_user(self, name):
        orm_user = orm.User.find(self.db, name)
        return orm_user and User(orm_user, self.settings)

    def user_from_username(self, name):
        orm_user = orm.User(name=name)
        self.db.add(orm_user)
        self.db.commit()
        return User(orm_user, self.settings)

    async def login(self, model):
        return await BaseHandler.auth_to_user(self, model)


async def test_models_persist_through_jupyterhub_auth_to_user(labfleet):
    """The auth model works with JupyterHub 6.1's own auth_to_user / sync_groups / sync_roles."""
    a = password_auth(labfleet)
    hub = HubStub(a)
    login = {"username": "dora", "password": "pw-dora"}

    user = await hub.login(await a.get_authenticated_user(LoginHandlerStub(), login))
    assert sorted(g.name for g in user.groups) == ["domain:acme", "project:acme/cv"]
    assert sorted(r.name for r in user.roles) == ["labfleet-domain-admin-acme", "user"]
    scopes = get_scopes_for(user.orm_user)
    assert "admin:users!group=domain:acme" in scopes
    assert "access:services!service=labfleet" in scopes
    assert "servers!user=dora" in scopes  # the Hub's 'user' role survived sync_roles
    assert orm.Role.find(hub.db, "labfleet-domain-admin-acme").managed_by_auth

    # nothing changed in labfleet: the refresh tells the Hub so (True), and it writes nothing
    assert await a.refresh_user(user) is True
    # demoted and moved in labfleet: the next refresh strips the old role (and deletes it, now unused)
    labfleet.users["dora"].update(role="user", projects=["acme/ml"])
    user = await hub.login(await a.refresh_user(user))
    assert sorted(g.name for g in user.groups) == ["domain:acme", "project:acme/ml"]
    assert sorted(r.name for r in user.roles) == ["labfleet-user", "user"]
    assert orm.Role.find(hub.db, "labfleet-domain-admin-acme") is None

    # promoted to superadmin: Hub admin, and the 'admin' role is kept too
    labfleet.users["dora"]["role"] = "superadmin"
    user = await hub.login(await a.refresh_user(user))
    assert user.admin is True
    assert sorted(r.name for r in user.roles) == ["admin", "labfleet-user", "user"]
    assert await a.refresh_user(user) is True
    assert orm.Role.find(hub.db, "user").scopes == ["self"]  # untouched
    hub.db.close()


async def test_hub_user_role_customizations_are_kept():
    """The 'user' role in the model carries the Hub's own scopes, so sync_roles leaves it as it is."""

    class App(Configurable):
        extra_user_scopes = Set()
        load_roles = TList()

    assert LabfleetAuthenticator()._hub_default_role("user")["scopes"] == ["self"]
    app = App(extra_user_scopes={"read:hub"})
    assert LabfleetAuthenticator(parent=app)._hub_default_role("user")["scopes"] == ["self", "read:hub"]
    app.load_roles = [{"name": "user", "scopes": ["self", "list:users"]}]
    assert LabfleetAuthenticator(parent=app)._hub_default_role("user")["scopes"] == ["self", "list:users"]


# --- delegation -------------------------------------------------------------------------------------


def test_generated_classes():
    dummy = labfleet_authenticator_for("dummy")
    assert dummy.__name__ == "LabfleetDummyAuthenticator"
    assert dummy is labfleet_authenticator_for("DUMMY") is lfauth.LabfleetDummyAuthenticator
    generic = labfleet_authenticator_for(GenericOAuthenticator)
    assert generic is labfleet_authenticator_for("generic-oauth") is lfauth.LabfleetGenericOAuthenticator
    assert generic is labfleet_authenticator_for("oauthenticator.generic:GenericOAuthenticator")
    assert generic.__mro__[1:3] == (LabfleetDelegatingMixin, lfauth.LabfleetBaseAuthenticator)
    assert generic.login_url is GenericOAuthenticator.login_url  # its redirect flow is kept
    with pytest.raises(ValueError, match="no jupyterhub.authenticators entry point named 'nope'"):
        labfleet_authenticator_for("nope")
    with pytest.raises(ValueError, match="already maps"):
        labfleet_authenticator_for(LabfleetAuthenticator)
    with pytest.raises(ValueError, match="role_map values"):
        generic(role_map={"x": "root"})
    with pytest.raises(AttributeError):
        lfauth.LabfleetNoSuchAuthenticator  # noqa: B018


async def test_delegate_dummy_maps_existing_users_only(labfleet, caplog):
    cls = labfleet_authenticator_for("dummy")
    a = cls(service_url=labfleet.url, service_token=TOKEN)
    model = await a.get_authenticated_user(LoginHandlerStub(), {"username": "alice", "password": ""})
    assert model["groups"] == ["domain:acme", "project:acme/ml"]
    assert labfleet.bodies("/auth/identity")[-1] == {
        "username": "alice",
        "source": "DummyAuthenticator",
        "remote_addr": CLIENT_ADDR,
        "create": False,
        "sync": True,
        "domain": None,
        "projects": None,
        "role": None,
    }
    assert await a.get_authenticated_user(LoginHandlerStub(), {"username": "zed", "password": ""}) is None
    assert "labfleet refused the DummyAuthenticator identity zed (403)" in caplog.text
    assert "zed" not in labfleet.users


# --- Part B: a real OAuth2 authorization-code flow ----------------------------------------------------


class FakeIdP:
    client_id = "labfleet-hub"
    client_secret = "s3cret-" + secrets.token_hex(4)

    def __init__(self) -> None:
        self.claims = {
            "olivia": {
                "preferred_username": "olivia",
                "groups": ["staff", "gpu-admins"],
                "lf_domain": "acme",
                "lf_projects": ["ml"],
            }
        }
        self.codes: dict[str, dict] = {}
        self.tokens: dict[str, str] = {}
        self.next_user = "olivia"
        self.url = ""


class _Authorize(web.RequestHandler):
    def initialize(self, idp: FakeIdP) -> None:
        self.idp = idp

    def get(self) -> None:
        # "the user logs in at the IdP": issue a code for next_user and send the browser back
        args = {k: self.get_argument(k) for k in ("client_id", "redirect_uri", "state", "response_type")}
        assert args["client_id"] == self.idp.client_id and args["response_type"] == "code"
        code = secrets.token_urlsafe(8)
        self.idp.codes[code] = {
            "user": self.idp.next_user,
            "redirect_uri": args["redirect_uri"],
            "challenge": self.get_argument("code_challenge"),
            "method": self.get_argument("code_challenge_method"),
        }
        self.redirect(url_concat(args["redirect_uri"], {"code": code, "state": args["state"]}))


class _Token(web.RequestHandler):
    def initialize(self, idp: FakeIdP) -> None:
        self.idp = idp

    def post(self) -> None:
        grant = self.idp.codes.pop(self.get_argument("code"), None)
        verifier = self.get_argument("code_verifier", "")
        challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")
        if (
            grant is None
            or self.get_argument("grant_type") != "authorization_code"
            or self.get_argument("redirect_uri") != grant["redirect_uri"]
            or self.get_argument("client_id") != self.idp.client_id
            or self.get_argument("client_secret") != self.idp.client_secret
            or grant["method"] != "S256"
            or challenge != grant["challenge"]
        ):
            self.set_status(400)
            return self.finish({"error": "invalid_grant", "error_description": "bad code exchange"})
        token = secrets.token_urlsafe(16)
        self.idp.tokens[token] = grant["user"]
        self.finish(
            {"access_token": token, "token_type": "Bearer", "scope": "openid profile", "expires_in": 300}
        )


class _UserInfo(web.RequestHandler):
    def initialize(self, idp: FakeIdP) -> None:
        self.idp = idp

    def get(self) -> None:
        scheme, _, token = self.request.headers.get("Authorization", "").partition(" ")
        user = self.idp.tokens.get(token) if scheme == "Bearer" else None
        if user is None:
            self.set_status(401)
            return self.finish({"error": "invalid_token"})
        self.finish(self.idp.claims[user])


@pytest.fixture
async def idp():
    provider = FakeIdP()
    app = web.Application(
        [
            ("/authorize", _Authorize, {"idp": provider}),
            ("/token", _Token, {"idp": provider}),
            ("/userinfo", _UserInfo, {"idp": provider}),
        ]
    )
    server, provider.url = await _serve(app)
    yield provider
    server.stop()


class CallbackHandlerStub:
    """What OAuthenticator reads from the Hub's OAuth callback handler (/hub/oauth_callback)."""

    request = FakeRequest()
    log = logging.getLogger("test.oauth_callback")

    def __init__(self, callback_url: str, state_cookie: str) -> None:
        self.query = parse_qs(urlparse(callback_url).query)
        self.state_cookie = state_cookie

    def get_argument(self, name, default=_NO_DEFAULT):
        if name in self.query:
            return self.query[name][-1]
        if default is _NO_DEFAULT:
            raise web.MissingArgumentError(name)
        return default

    def get_state_cookie(self):
        return self.state_cookie

    # OAuthenticator's own callback checks and next-url logic, run on this stub
    check_arguments = OAuthCallbackHandler.check_arguments
    check_error = OAuthCallbackHandler.check_error
    check_code = OAuthCallbackHandler.check_code
    check_state = OAuthCallbackHandler.check_state
    get_state_url = OAuthCallbackHandler.get_state_url
    get_next_url = OAuthCallbackHandler.get_next_url


def oauth_authenticator(labfleet: FakeLabfleet, idp: FakeIdP, **kw):
    cls = labfleet_authenticator_for("generic-oauth")
    settings = dict(
        client_id=idp.client_id,
        client_secret=idp.client_secret,
        authorize_url=f"{idp.url}/authorize",
        token_url=f"{idp.url}/token",
        userdata_url=f"{idp.url}/userinfo",
        oauth_callback_url="http://127.0.0.1:8000/hub/oauth_callback",
        username_claim="preferred_username",
        service_url=labfleet.url,
        service_token=TOKEN,
        create_users=True,
        default_domain="lab",
        domain_claim="lf_domain",
        projects_claim="lf_projects",
        role_claim="groups",
        role_map={"gpu-admins": "admin", "auditors": "monitor"},
    )
    settings.update(kw)
    return cls(**settings)


async def oauth_login(authenticator) -> dict | None:
    """The browser's round trip: /hub/oauth_login -> IdP /authorize -> /hub/oauth_callback."""
    # what OAuthLoginHandler.get does: state in a cookie, PKCE, redirect to the IdP
    state_id = secrets.token_hex(16)
    verifier, challenge = OAuthLoginHandler._generate_pkce_params(None)
    state_cookie = _serialize_state(
        {"state_id": state_id, "next_url": "/hub/spawn", "code_verifier": verifier}
    )
    authorize = url_concat(
        authenticator.authorize_url,
        {
            "response_type": "code",
            "client_id": authenticator.client_id,
            "redirect_uri": authenticator.get_callback_url(None),
            "scope": " ".join(authenticator.scope),
            "state": _serialize_state({"state_id": state_id}),
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        },
    )
    resp = await AsyncHTTPClient().fetch(authorize, follow_redirects=False, raise_error=False)
    assert resp.code == 302
    callback_url = resp.headers["Location"]
    assert callback_url.startswith(authenticator.get_callback_url(None) + "?")
    handler = CallbackHandlerStub(callback_url, state_cookie)
    # OAuthCallbackHandler.get: its own checks (error, code, state), then login_user -> the authenticator
    handler.check_arguments()
    assert handler.get_next_url() == "/hub/spawn"
    return await authenticator.get_authenticated_user(handler, None)


async def test_oauth_login_creates_and_maps_user(labfleet, idp):
    a = oauth_authenticator(labfleet, idp)
    model = await oauth_login(a)

    assert labfleet.bodies("/auth/identity") == [
        {
            "username": "olivia",
            "source": "GenericOAuthenticator",
            "remote_addr": CLIENT_ADDR,
            "create": True,
            "sync": True,
            "domain": "acme",
            "projects": ["ml"],
            "role": "admin",
        }
    ]
    assert labfleet.users["olivia"] == {
        "password": None,
        "active": True,
        "role": "admin",
        "domain": "acme",
        "projects": ["acme/ml"],
    }
    assert model["name"] == "olivia"
    assert model["admin"] is False
    assert model["groups"] == ["domain:acme", "project:acme/ml"]  # labfleet's, not the IdP's groups
    assert role_names(model) == ["labfleet-domain-admin-acme", "user"]
    assert model["auth_state"]["oauth_user"]["preferred_username"] == "olivia"
    assert model["auth_state"]["access_token"] in idp.tokens

    # next login: the user exists, so no creation, and the IdP's changes are synced
    idp.claims["olivia"].update(groups=["staff"], lf_projects=["ml", "acme/cv"])
    model = await oauth_login(a)
    body = labfleet.bodies("/auth/identity")[-1]
    assert (body["create"], body["role"], body["projects"]) == (False, "user", ["ml", "acme/cv"])
    assert model["groups"] == ["domain:acme", "project:acme/cv", "project:acme/ml"]
    assert role_names(model) == ["labfleet-user", "user"]


async def test_oauth_without_creation_or_sync(labfleet, idp, caplog):
    a = oauth_authenticator(labfleet, idp, create_users=False)
    assert await oauth_login(a) is None
    assert labfleet.bodies("/auth/identity")[-1]["create"] is False
    assert "olivia" not in labfleet.users
    assert "labfleet refused the GenericOAuthenticator identity olivia (403)" in caplog.text

    labfleet.users["olivia"] = {
        "password": None,
        "active": True,
        "role": "user",
        "domain": "acme",
        "projects": [],
    }
    a = oauth_authenticator(labfleet, idp, sync_from_claims=False)
    model = await oauth_login(a)
    body = labfleet.bodies("/auth/identity")[-1]
    assert (body["create"], body["sync"], body["domain"], body["projects"], body["role"]) == (
        False,
        False,
        None,
        None,
        None,
    )
    assert model["groups"] == ["domain:acme"]
    assert role_names(model) == ["labfleet-user", "user"]


async def test_oauth_creation_uses_defaults_and_delegate_gate(labfleet, idp, caplog):
    idp.claims["olivia"] = {"preferred_username": "olivia"}
    a = oauth_authenticator(labfleet, idp, default_projects=["onboarding"], require_delegate_allowed=True)
    assert await oauth_login(a) is None  # GenericOAuthenticator itself allows nobody here
    assert "GenericOAuthenticator does not allow olivia" in caplog.text
    assert labfleet.bodies("/auth/identity") == []

    a = oauth_authenticator(
        labfleet,
        idp,
        default_projects=["onboarding"],
        require_delegate_allowed=True,
        allowed_users={"olivia"},
    )
    model = await oauth_login(a)
    body = labfleet.bodies("/auth/identity")[-1]
    assert (body["create"], body["domain"], body["projects"], body["role"]) == (
        True,
        "lab",
        ["onboarding"],
        "user",
    )
    assert model["groups"] == ["domain:lab", "project:lab/onboarding"]


async def test_oauth_refresh(labfleet, idp):
    a = oauth_authenticator(labfleet, idp, enable_auth_state=True)
    model = await oauth_login(a)
    user = UserStub("olivia", model["auth_state"])
    n_identity = len(labfleet.bodies("/auth/identity"))

    # nothing changed at the IdP: labfleet is only read
    refreshed = await a.refresh_user(user)
    assert role_names(refreshed) == ["labfleet-domain-admin-acme", "user"]
    assert len(labfleet.bodies("/auth/identity")) == n_identity
    assert labfleet.calls[-1]["method"] == "GET"
    assert refreshed["auth_state"]["access_token"] == model["auth_state"]["access_token"]

    # the IdP moved her out of gpu-admins: the refresh re-maps (never creates)
    idp.claims["olivia"]["groups"] = ["auditors"]
    refreshed = await a.refresh_user(user)
    body = labfleet.bodies("/auth/identity")[-1]
    assert (body["create"], body["role"]) == (False, "monitor")
    assert role_names(refreshed) == ["labfleet-monitor", "user"]

    # deactivated in labfleet: a new login is required (and refused)
    labfleet.users["olivia"]["active"] = False
    assert await a.refresh_user(user) is False
    assert await oauth_login(a) is None

    # the IdP no longer accepts the token: a new login is required
    labfleet.users["olivia"]["active"] = True
    idp.tokens.clear()
    assert await a.refresh_user(user) is False


async def test_claim_paths_and_role_map_order(labfleet, idp):
    a = oauth_authenticator(
        labfleet,
        idp,
        role_claim="realm_access.roles",
        domain_claim="https://labfleet.example/domain",
        role_map={"fleet-root": "superadmin", "gpu-admins": "admin"},
    )
    claims = {
        "realm_access": {"roles": ["gpu-admins", "fleet-root"]},
        "https://labfleet.example/domain": "acme",
        "lf_projects": "ml",
    }
    assert a.claimed_fields(claims) == {"domain": "acme", "projects": ["ml"], "role": "superadmin"}
    assert a.claimed_fields({})["role"] == "user"
    a.role_map = {}
    assert a.claimed_fields({"realm_access": {"roles": ["staff", "monitor"]}})["role"] == "monitor"
    a.role_claim = ""
    assert a.claimed_fields(claims)["role"] is None


# --- Part B, through a real Hub: the browser's redirects, the Hub's own OAuth handlers ---------------


class ThreadedIdP:
    """The fake OAuth2 provider on its own event loop thread, for a test that drives a Hub with requests."""

    def __enter__(self) -> FakeIdP:
        self.idp = FakeIdP()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        app = web.Application(
            [
                (path, cls, {"idp": self.idp})
                for path, cls in (("/authorize", _Authorize), ("/token", _Token), ("/userinfo", _UserInfo))
            ]
        )
        self.server, self.idp.url = asyncio.run_coroutine_threadsafe(_serve(app), self.loop).result(10)
        return self.idp

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.server.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.mark.hub
def test_real_hub_oauth_login(tmp_path, monkeypatch):
    """A real Hub (jupyterhub_config.py + the labfleet service) logging a browser in through the IdP."""
    from labfleet.core import database, unitofwork
    from labfleet.core.authz import Actor
    from labfleet.core.secretbox import KEY_FILE_ENV, ensure_key_file
    from labfleet.tenancy import directory
    from tests.hubfixture import seed, start_hub

    with ThreadedIdP() as idp:
        extra = "\n".join(
            [
                "from labfleet.hub.authenticator import labfleet_authenticator_for",
                "c.JupyterHub.authenticator_class = labfleet_authenticator_for('generic-oauth')",
                f"c.GenericOAuthenticator.client_id = {idp.client_id!r}",
                f"c.GenericOAuthenticator.client_secret = {idp.client_secret!r}",
                f"c.GenericOAuthenticator.authorize_url = '{idp.url}/authorize'",
                f"c.GenericOAuthenticator.token_url = '{idp.url}/token'",
                f"c.GenericOAuthenticator.userdata_url = '{idp.url}/userinfo'",
                "c.GenericOAuthenticator.username_claim = 'preferred_username'",
                "c.LabfleetDelegatingMixin.create_users = True",
                "c.LabfleetDelegatingMixin.domain_claim = 'lf_domain'",
                "c.LabfleetDelegatingMixin.projects_claim = 'lf_projects'",
                "c.LabfleetDelegatingMixin.role_claim = 'groups'",
                "c.LabfleetDelegatingMixin.role_map = {'gpu-admins': 'admin'}",
                "",
            ]
        )
        # tenants exist before the Hub starts (a domain and a project for the IdP's claims)
        state = tmp_path / "hub"
        state.mkdir()
        db_url = f"sqlite:///{state / 'labfleet.sqlite'}"
        monkeypatch.setenv(KEY_FILE_ENV, str(state / "labfleet_secret.key"))
        ensure_key_file(state / "labfleet_secret.key")
        seed(db_url)
        engine = database.make_engine(db_url)
        with database.session_scope(unitofwork.make_session_factory(engine)) as db:
            directory.create_domain(db, Actor.cli(), {"name": "acme"})
            directory.create_project(db, Actor.cli(), {"domain": "acme", "name": "ml"})
        engine.dispose()
        hub = start_hub(state, db_url=db_url, extra_config=extra, do_seed=False)
        try:
            browser = requests.Session()
            deadline = time.monotonic() + 30
            while (login_page := browser.get(f"{hub.url}/hub/login", timeout=30)).status_code == 404:
                assert time.monotonic() < deadline, "the proxy never routed /hub/"
                time.sleep(0.1)  # start_hub may return before the proxy has its routes
            assert "/hub/oauth_login" in login_page.text  # the IdP's button, not the password form
            to_idp = browser.get(
                f"{hub.url}/hub/oauth_login?next=%2Fhub%2Fhome", allow_redirects=False, timeout=30
            )
            assert to_idp.status_code == 302 and to_idp.headers["Location"].startswith(
                idp.url + "/authorize?"
            )
            back = browser.get(to_idp.headers["Location"], allow_redirects=False, timeout=30)
            assert back.status_code == 302 and back.headers["Location"].startswith(
                f"{hub.url}/hub/oauth_callback?"
            )
            done = browser.get(back.headers["Location"], allow_redirects=False, timeout=30)
            assert done.status_code == 302, hub.log_text()[-3000:]
            assert done.headers["Location"] == "/hub/home"
            assert browser.get(f"{hub.url}/hub/home", allow_redirects=False, timeout=30).status_code == 200

            olivia = hub.hub_api("GET", "/users/olivia").json()
            assert sorted(olivia["groups"]) == ["domain:acme", "project:acme/ml"]
            assert sorted(olivia["roles"]) == ["labfleet-domain-admin-acme", "user"]
            assert olivia["admin"] is False
            entries = hub.api("GET", "/audit?action=user.login", hub.service_token).json()
            assert any(e["target"] == "olivia" and e["success"] for e in entries)
            assert idp.client_secret not in hub.log_text() and hub.service_token not in hub.log_text()
        finally:
            hub.stop()
