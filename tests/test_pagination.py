"""Pages of the list endpoints (GET /api/sessions, /users, /audit, /vfolders, /nodes), like the Hub's REST
API: offset and limit, the pagination media type, the Link header.

On SQLite: the SQL that says who sees what gives the same rows as the Python rules it replaced
(``authz.can_read_user``, ``can_read_audit_entry``, ``vfolders.access_of``), for every kind of caller and
filter; pages walk the whole list once; a page costs the same few statements whatever its size.
Behind a real Hub: 1,100 rows and more of each kind, default and largest pages, first, middle and last
pages with their totals and next links, bad arguments (400, nothing changes), authorization on every
page, filters with pages.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlparse

import jsonschema
import pytest
import requests
import yaml
from sqlalchemy import event, select

from labfleet.compute import nodes, sessionlist
from labfleet.compute.devices.base import NodeInfo
from labfleet.compute.devices.mock import MockPlugin
from labfleet.core import audit, authz, database, unitofwork
from labfleet.core.authz import Actor
from labfleet.core.errors import Forbidden, NotFound
from labfleet.core.models import (
    Allocation,
    AuditEntry,
    ComputeSession,
    Device,
    Domain,
    Node,
    Project,
    ResourceGroup,
    StorageHost,
    User,
    VFolder,
    VFolderMount,
    VFolderPermission,
)
from labfleet.core.pages import Page, page_of
from labfleet.core.rights import RIGHTS
from labfleet.core.vocab import HOLDING_STATUSES
from labfleet.service.handlers import SPEC_FILE
from labfleet.storage import hosts, vfolders
from labfleet.tenancy import directory, userlist
from labfleet.tenancy.policies import ensure_default_keypair_policy
from tests.dbfixture import fresh_db
from tests.hubfixture import start_hub

CLI = Actor.cli()
PAGINATION = "application/jupyterhub-pagination+json"
STATUSES = ("PENDING", "RUNNING", "TERMINATED", "ERROR", "CANCELLED")


# ---------------------------------------------------------------- on SQLite: the queries


def _actors(db) -> dict[str, Actor]:
    out = {
        name: directory.actor_for(directory.get_user(db, name))
        for name in ("alice", "bob", "erin", "carol", "dave", "gina", "mona", "root")
    }
    out["cli"] = CLI
    out["hub"] = Actor.hub()
    # Made by hand (no user id), and an admin without a domain: the rules must hold for them too.
    out["alice-by-name"] = Actor(name="alice", role="user", domain="acme")
    out["admin-nowhere"] = Actor(name="nobody", role="admin", domain=None)
    return out


@pytest.fixture
def world(tmp_path, monkeypatch):
    """acme (projects ml, viz): alice (ml), bob (ml, viz), erin, carol (admin); globex (x): dave (admin),
    gina (x); root: mona (monitor), root (superadmin).  Sessions of each, some holding a device share
    and mounting folders; folders of users and projects, shared in every way the rules tell apart."""
    engine, factory = fresh_db(f"sqlite:///{tmp_path / 'lf.sqlite'}", tmp_path, monkeypatch)
    with database.session_scope(factory) as db:
        ensure_default_keypair_policy(db)
        nodes.ensure_default_group(db)
        for d in ("root", "acme", "globex"):
            directory.create_domain(db, CLI, {"name": d})
        for d, p in (("acme", "ml"), ("acme", "viz"), ("globex", "x")):
            directory.create_project(db, CLI, {"domain": d, "name": p})
        for name, d, role, projects in (
            ("alice", "acme", "user", ["ml"]),
            ("bob", "acme", "user", ["ml", "viz"]),
            ("erin", "acme", "user", []),
            ("carol", "acme", "admin", []),
            ("dave", "globex", "admin", []),
            ("gina", "globex", "user", ["x"]),
            ("mona", "root", "monitor", []),
            ("root", "root", "superadmin", []),
        ):
            directory.create_user(
                db, CLI, {"username": name, "domain": d, "role": role, "projects": projects}
            )
        devs = MockPlugin(devices=[{"model": "A100-80GB", "memory": "80g", "count": 2}], node="n1").discover()
        nodes.register_node(db, NodeInfo(name="n1", cpu=64, mem=512 * 2**30, devices=devs, plugin="mock"))
        nodes.register_node(db, NodeInfo(name="n0", cpu=8, mem=2**34, devices=[], plugin="mock"))
        hosts.create_host(
            db, CLI, {"name": "h", "path": str(tmp_path / "vf"), "default_permissions": list(RIGHTS)}
        )
    with database.session_scope(factory) as db:
        a = _actors(db)
        made = {}
        for who, name, project in (
            ("alice", "a1", None),
            ("alice", ".auto", None),
            ("bob", "b1", None),
            ("bob", "b2", None),
            ("gina", "g1", None),
            ("carol", "pm", "acme/ml"),
            ("carol", "pv", "acme/viz"),
            ("dave", "px", "globex/x"),
        ):
            body = {"name": name, **({"project": project} if project else {})}
            made[name] = vfolders.create(db, a[who], body, default_host="h")
        # b1 shared with alice; px (globex/x) "shared" with alice, who is no member: she must not see it;
        # pv (acme/viz) with alice too, no member either; pm overridden for bob; g1 shared with dave.
        for folder, user, perm in (("b1", "alice", "ro"), ("px", "alice", "rw"), ("pv", "alice", "ro")):
            db.add(VFolderPermission(vfolder_id=made[folder].id, user_id=a[user].user_id, permission=perm))
        db.add(VFolderPermission(vfolder_id=made["pm"].id, user_id=a["bob"].user_id, permission="ro"))
        db.add(VFolderPermission(vfolder_id=made["g1"].id, user_id=a["dave"].user_id, permission="ro"))
        made["b2"].status = "DELETE_PENDING"
        # Sessions: created out of order, statuses cycling; every third mounts a folder, and holds a share of a GPU while live.
        group = db.scalar(select(ResourceGroup))
        dev = db.scalar(select(Device))
        start = datetime(2026, 1, 1, tzinfo=timezone.utc)
        k = 0
        for who, project, n in (("alice", "acme/ml", 9), ("bob", "acme/viz", 7), ("gina", "globex/x", 6)):
            user = directory.get_user(db, who)
            dname, pname = project.split("/")
            proj = db.scalar(select(Project).join(Domain).where(Domain.name == dname, Project.name == pname))
            for i in range(n):
                k += 1
                s = ComputeSession(
                    id=str(uuid.uuid4()),
                    name=f"{who}-{i}",
                    user_id=user.id,
                    keypair_id=user.main_keypair.id,
                    project_id=proj.id,
                    domain_id=proj.domain_id,
                    resource_group_id=group.id,
                    requested_slots={"cpu": "1"},
                    status=STATUSES[k % len(STATUSES)],
                    # Ties on created_at: the id orders them.
                    created_at=start + timedelta(minutes=(k * 7) % 11),
                )
                db.add(s)
                if i % 3 == 0:
                    if s.status in HOLDING_STATUSES:  # an ended session has given its allocation back
                        db.add(
                            Allocation(
                                session=s,
                                node_id=dev.node_id,
                                device_id=dev.id,
                                cpu_milli=100,
                                shares_centi=5,
                            )
                        )
                    mount = made["b1"] if who == "bob" else made["g1"] if who == "gina" else made["a1"]
                    db.add(VFolderMount(session_id=s.id, vfolder_id=mount.id, permission="rw"))
        # Audit entries the rule tells apart: no actor domain, no target domain, both, neither.
        for actor_name, actor_domain, target_domain in (
            ("system", None, None),
            ("zed", "globex", None),
            ("zed", None, "acme"),
            ("yan", "acme", "globex"),
            ("alice", "acme", None),
        ):
            db.add(
                AuditEntry(
                    actor=actor_name, actor_domain=actor_domain, target_domain=target_domain, action="t.x"
                )
            )
    yield factory
    engine.dispose()


def _ids(rows):
    return [getattr(r, "id", None) or getattr(r, "username", None) for r in rows]


SESSION_FILTERS = [
    {},
    {"user": "alice"},
    {"user": "gina"},
    {"user": "nobody"},
    {"project": "acme/ml"},
    {"project": "ml"},
    {"project": "acme/"},
    {"domain": "globex"},
    {"domain": "acme", "status": "RUNNING"},
    {"status": "PENDING", "user": "bob", "project": "acme/viz"},
    {"user": "", "status": ""},
]


def test_sessions_sql_matches_the_authz_rule(world):
    with database.session_scope(world) as db:
        everything = list(
            db.scalars(select(ComputeSession).order_by(ComputeSession.created_at, ComputeSession.id))
        )
        for name, actor in _actors(db).items():
            for f in SESSION_FILTERS:
                expected = [
                    s.id
                    for s in everything
                    if (not f.get("status") or s.status == f["status"])
                    and (not f.get("user") or s.user.username == f["user"])
                    and (not f.get("domain") or s.domain.name == f["domain"])
                    and (not f.get("project") or s.project.full_name == f["project"])
                    and (
                        actor.kind in ("hub", "cli")
                        or authz.can_read_user(actor, s.user.username, s.domain.name)
                    )
                ]
                got = sessionlist.all_sessions(db, actor, f)
                assert [s.id for s in got] == expected, (name, f)
                page = sessionlist.page_sessions(db, actor, f, offset=1, limit=3)
                assert page.total == len(expected) and [s.id for s in page.items] == expected[1:4], (name, f)
                assert sessionlist.readable_ids(db, actor, f) == set(expected)
        # Every kind of caller sees something different here.
        seen = {n: len(sessionlist.all_sessions(db, a, {})) for n, a in _actors(db).items()}
        assert seen["root"] == seen["mona"] == seen["cli"] == 22
        assert (seen["alice"], seen["alice-by-name"], seen["bob"], seen["erin"]) == (9, 9, 7, 0)
        assert (seen["carol"], seen["dave"], seen["admin-nowhere"]) == (16, 6, 0)


def test_users_sql_matches_the_authz_rule(world):
    with database.session_scope(world) as db:
        everything = list(db.scalars(select(User).order_by(User.username)))
        for name, actor in _actors(db).items():
            for domain in (None, "acme", "globex"):
                expected = [
                    u.username
                    for u in everything
                    if (domain is None or u.domain.name == domain)
                    and authz.can_read_user(actor, u.username, u.domain.name)
                ]
                if domain is not None and not authz.can_read_domain(actor, domain):
                    with pytest.raises(NotFound, match="no domain"):
                        userlist.page_users(db, actor, domain, offset=0, limit=5)
                    continue
                assert [u.username for u in directory.list_users(db, actor, domain)] == expected, (
                    name,
                    domain,
                )
                page = userlist.page_users(db, actor, domain, offset=2, limit=2)
                assert page.total == len(expected) and [u.username for u in page.items] == expected[2:4]


@pytest.mark.parametrize(
    "search, role, status",
    [("", None, None), ("a", None, None), ("AC", "user", None), ("o r", None, "active"), ("", "admin", None)],
)
def test_users_filter_in_sql_matches_the_consoles_rule(world, search, role, status):
    from labfleet.console.userforms import matches

    wanted = userlist.UserFilter.parse(search, role, status)
    with database.session_scope(world) as db:
        for name, actor in _actors(db).items():
            views = [directory.user_view(u) for u in directory.list_users(db, actor, None)]
            expected = [v["username"] for v in views if matches(v, search, role, status)]
            page = userlist.page_users(db, actor, None, offset=0, limit=100, wanted=wanted)
            assert [u.username for u in page.items] == expected, (name, search, role, status)
            assert page.total == len(expected)


def test_audit_sql_matches_the_authz_rule(world):
    with database.session_scope(world) as db:
        everything = list(db.scalars(select(AuditEntry).order_by(AuditEntry.id.desc())))
        assert len(everything) > 20
        for name, actor in _actors(db).items():
            for action in (None, "t.x", "user.create"):
                expected = [
                    e.id
                    for e in everything
                    if (not action or e.action == action)
                    and authz.can_read_audit_entry(actor, e.actor, e.actor_domain, e.target_domain)
                ]
                page = audit.page_entries(db, actor, offset=0, limit=1000, action=action)
                assert [e.id for e in page.items] == expected and page.total == len(expected), (name, action)
                assert [e.id for e in audit.list_entries(db, actor, limit=3, action=action)] == expected[:3]
                page = audit.page_entries(db, actor, offset=3, limit=4, action=action)
                assert [e.id for e in page.items] == expected[3:7] and page.total == len(expected)


def _folders_before(db, actor, filters):
    """What list_folders answered before its rule moved into SQL: a wide query, then access_of per row."""
    q = vfolders.folders_query(db, Actor.cli(), {**filters, "scope": "all"})
    return [
        v.id
        for v in db.scalars(q)
        if vfolders.access_of(actor, vfolders.facts_of(db, actor, v)).sees
        and _in_scope(db, actor, v, filters)
    ]


def _in_scope(db, actor, v, filters):
    scope = filters.get("scope") or "mine"
    if scope == "mine":
        if actor.user_id is None:
            return False
        shared = db.scalar(
            select(VFolderPermission).where(
                VFolderPermission.vfolder_id == v.id, VFolderPermission.user_id == actor.user_id
            )
        )
        member = v.project is not None and any(u.id == actor.user_id for u in v.project.members)
        return v.user_id == actor.user_id or shared is not None or member
    if scope == "domain":
        return v.domain.name == (filters.get("domain") or actor.domain)
    return True


def test_vfolders_sql_matches_access_of(world):
    with database.session_scope(world) as db:
        for name, actor in _actors(db).items():
            for filters in (
                {},
                {"status": "READY"},
                {"status": "DELETE_PENDING"},
                {"scope": "domain"},
                {"scope": "domain", "domain": "globex"},
                {"scope": "all", "status": "READY"},
            ):
                try:
                    got = vfolders.list_folders(db, actor, filters)
                except Forbidden:  # scope=domain / all for those who may not: refused, as before
                    assert filters.get("scope") in ("domain", "all") and not actor.reads_everything
                    continue
                expected = _folders_before(db, actor, filters)
                assert [v.id for v, _ in got] == expected, (name, filters)
                page = vfolders.page_folder_views(db, actor, filters, offset=1, limit=2)
                assert page.total == len(expected) and [f["id"] for f in page.items] == expected[1:3]
                # The page renders each folder exactly as view_for does, one at a time.
                views = vfolders.page_folder_views(db, actor, filters, offset=0, limit=1000).items
                assert views == [vfolders.view_for(db, actor, v) for v, _ in got], (name, filters)
        a = _actors(db)
        mine = {v.name for v, _ in vfolders.list_folders(db, a["alice"], {})}
        assert mine == {"a1", ".auto", "b1", "pm"}  # not px or pv: shared, but she is in neither project
        assert {v.name for v, _ in vfolders.list_folders(db, a["carol"], {})} == set()
        dave = {v.name for v, _ in vfolders.list_folders(db, a["dave"], {})}
        assert dave == {"g1"}  # a user folder shared with him


@pytest.mark.parametrize("needle", ["a", "B1", "acme/", "globex", "h", "p", "%", "zz"])
def test_vfolders_search_in_sql_matches_the_consoles_rule(world, needle):
    from labfleet.console.storage import matches

    with database.session_scope(world) as db:
        for name, actor in _actors(db).items():
            for scope in ("mine", "domain", "all"):
                try:
                    views = vfolders.page_folder_views(
                        db, actor, {"scope": scope}, offset=0, limit=1000
                    ).items
                except Forbidden:
                    continue
                expected = [f["id"] for f in views if matches(f, needle)]
                filters = {"scope": scope, "search": needle}
                page = vfolders.page_folder_views(db, actor, filters, offset=0, limit=1000)
                assert [f["id"] for f in page.items] == expected, (name, scope, needle)
                assert page.total == len(expected)


def test_nodes_page_matches_the_groups_rule(world):
    with database.session_scope(world) as db:
        for name, actor in _actors(db).items():
            expected = [n.name for n in db.scalars(select(Node).order_by(Node.name))]
            expected = [
                n
                for n in expected
                if any(n in [x.name for x in g.nodes] for g in nodes.list_groups(db, actor))
            ]
            page = nodes.page_node_views(db, actor, offset=0, limit=1000)
            assert [v["name"] for v in page.items] == expected and page.total == len(expected)
            assert page.items == [nodes.node_view(db, n) for n in nodes.list_nodes(db, actor)], name
        held = next(v for v in nodes.page_node_views(db, CLI, offset=0, limit=5).items if v["name"] == "n1")
        assert held["allocated"]["gpu.shares"] > 0


def test_pages_walk_the_list_once(world):
    with database.session_scope(world) as db:
        root = _actors(db)["root"]
        whole = [s.id for s in sessionlist.all_sessions(db, root, {})]
        walked, offset, pages = [], 0, 0
        while True:
            page = sessionlist.page_sessions(db, root, {}, offset=offset, limit=5)
            walked += [s.id for s in page.items]
            pages += 1
            assert page.total == len(whole) and len(page.items) <= 5
            if page.next_offset is None:
                break
            offset = page.next_offset
        assert walked == whole and pages == 5  # 22 rows: 5, 5, 5, 5, 2
        past = sessionlist.page_sessions(db, root, {}, offset=100, limit=5)
        assert past.items == [] and past.total == 22 and past.next_offset is None


def test_page_of_counts_only_when_it_must(world):
    with database.session_scope(world) as db:
        statements = _counter(db)
        q = select(User).order_by(User.username, User.id)
        p = page_of(db, q, 0, 1000)  # one short page: its length is the total
        assert (p.total, p.next_offset, len(statements)) == (8, None, 1)
        statements.clear()
        p = page_of(db, q, 6, 3)  # the last, partial page: offset + length
        assert (p.total, len(p.items), len(statements)) == (8, 2, 1)
        statements.clear()
        p = page_of(db, q, 0, 3)  # a full page: counted
        assert (p.total, p.next_offset, len(statements)) == (8, 3, 2)
        statements.clear()
        p = page_of(db, q, 50, 3)  # past the end: counted
        assert (p.total, p.items, len(statements)) == (8, [], 2)
        assert Page([1, 2], 2, 0, 2).map(str) == Page(["1", "2"], 2, 0, 2)


def _counter(db) -> list[str]:
    seen: list[str] = []

    def count(conn, cursor, statement, *rest):
        if statement.lstrip().upper().startswith("SELECT"):  # not SQLite's BEGIN IMMEDIATE
            seen.append(statement)

    event.listen(db.get_bind(), "before_cursor_execute", count)
    return seen


def test_a_page_costs_a_few_statements_whatever_its_size(world):
    """No N+1: a page of 2 and a page of everything cost about the same statements, a handful."""
    from labfleet.compute import sessions

    def cost(fn):
        with database.session_scope(world) as db:
            a = _actors(db)
            statements = _counter(db)
            fn(db, a)
            return len(statements)

    cases = {
        "sessions": lambda db, a, n: [
            sessions.session_view(s)
            for s in sessionlist.page_sessions(db, a["root"], {}, offset=0, limit=n).items
        ],
        "users": lambda db, a, n: [
            directory.user_view(u) for u in userlist.page_users(db, a["carol"], None, offset=0, limit=n).items
        ],
        "vfolders": lambda db, a, n: (
            vfolders.page_folder_views(db, a["root"], {"scope": "all"}, offset=0, limit=n).items
        ),
        "nodes": lambda db, a, n: nodes.page_node_views(db, a["root"], offset=0, limit=n).items,
        "audit": lambda db, a, n: [
            audit.entry_view(e) for e in audit.page_entries(db, a["carol"], offset=0, limit=n).items
        ],
    }
    for what, fn in cases.items():
        small = cost(lambda db, a, fn=fn: fn(db, a, 2))
        big = cost(lambda db, a, fn=fn: fn(db, a, 1000))
        # (A bigger page may reach one more kind of row, e.g. project folders beside user folders.)
        assert small <= 10 and big <= small + 2, (what, small, big)


# ---------------------------------------------------------------- behind a real Hub: the endpoints

BULK = 1100


@pytest.fixture(scope="module")
def hub_world(tmp_path_factory):
    """A real Hub; acme: alice, bob, carol (admin); globex: gina.  Then, straight into the DB: 1,100
    users, 1,150 sessions (alice 650, bob 300, gina 200), 1,100 audit entries of alice's, 1,100 folders
    of alice's and 1,100 nodes."""
    hub = start_hub(tmp_path_factory.mktemp("hub"))
    root = hub.wait_token("root")
    for path, body in [
        ("/domains", {"name": "acme"}),
        ("/domains", {"name": "globex"}),
        ("/projects", {"domain": "acme", "name": "ml"}),
        ("/projects", {"domain": "globex", "name": "x"}),
        ("/users", {"username": "alice", "domain": "acme", "projects": ["ml"]}),
        ("/users", {"username": "bob", "domain": "acme", "projects": ["ml"]}),
        ("/users", {"username": "carol", "domain": "acme", "role": "admin"}),
        ("/users", {"username": "gina", "domain": "globex", "projects": ["x"]}),
    ]:
        r = hub.api("POST", path, root, json=body)
        assert r.status_code == 201, r.text
    tokens = {"root": root, **{n: hub.wait_token(n) for n in ("alice", "bob", "carol", "gina")}}
    if not hub.api("GET", "/storage-hosts", root).json():
        r = hub.api("POST", "/storage-hosts", root, json={"name": "bulk", "path": str(hub.state / "bulk")})
        assert r.status_code == 201, r.text
    engine = database.make_engine(hub.db_url)
    factory = unitofwork.make_session_factory(engine)
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with database.session_scope(factory) as db:
        acme = db.scalar(select(Domain).where(Domain.name == "acme"))
        group = db.scalar(select(ResourceGroup).order_by(ResourceGroup.id))
        host = db.scalar(select(StorageHost).order_by(StorageHost.id))
        db.add_all(User(username=f"bulk{i:04d}", domain_id=acme.id) for i in range(BULK))
        k = 0
        for who, n in (("alice", 650), ("bob", 300), ("gina", 200)):
            user = db.scalar(select(User).where(User.username == who))
            project = user.projects[0]
            for _ in range(n):
                k += 1
                db.add(
                    ComputeSession(
                        id=str(uuid.uuid4()),
                        name=f"{who}-{k}",
                        user_id=user.id,
                        keypair_id=user.main_keypair.id,
                        project_id=project.id,
                        domain_id=project.domain_id,
                        resource_group_id=group.id,
                        requested_slots={"cpu": "1"},
                        status=ENDED[k % len(ENDED)],
                        created_at=start + timedelta(seconds=k),
                    )
                )
        alice = db.scalar(select(User).where(User.username == "alice"))
        db.add_all(AuditEntry(actor="alice", actor_domain="acme", action="bulk.entry") for _ in range(BULK))
        db.add_all(
            VFolder(
                id=str(uuid.uuid4()),
                name=f"f{i:04d}",
                host_id=host.id,
                domain_id=acme.id,
                owner_kind="user",
                user_id=alice.id,
                creator="alice",
            )
            for i in range(BULK)
        )
        db.add_all(
            Node(
                name=f"bulk-{i:04d}", resource_group_id=group.id, cpu="1", mem=2**30, labels={}, plugin="mock"
            )
            for i in range(BULK)
        )
    engine.dispose()
    yield hub, tokens
    hub.stop()


ROUTES = ["/sessions", "/users", "/audit?action=bulk.entry", "/vfolders?scope=all", "/nodes"]
# Ended sessions only in the Hub's DB: the service's job loop leaves them as they are.
ENDED = ("TERMINATED", "ERROR", "CANCELLED")


def _get(hub, path, token, paginated=False, **kw):
    headers = {"Accept": PAGINATION} if paginated else {}
    return hub.api("GET", path, token, headers=headers, **kw)


def _with(path, **args):
    return path + ("&" if "?" in path else "?") + "&".join(f"{k}={v}" for k, v in args.items())


def _as_the_spec_says(path, media, body):
    """``body`` matches openapi.yaml's 200 answer of GET ``path`` for ``media``."""
    spec = yaml.safe_load(SPEC_FILE.read_text())
    schema = spec["paths"][path.split("?")[0]]["get"]["responses"]["200"]["content"][media]["schema"]
    jsonschema.Draft202012Validator({**schema, "components": spec["components"]}).validate(body)


def _key(item):
    return item.get("id") or item.get("username") or item.get("name")


def _next_link(r):
    link = r.headers.get("Link")
    if link is None:
        return None
    url, rel = link.split(";")
    assert rel.strip() == 'rel="next"' and url.startswith("<") and url.endswith(">")
    return url[1:-1]


@pytest.mark.hub
@pytest.mark.parametrize("path", ROUTES)
def test_default_and_largest_pages(hub_world, path):
    hub, tokens = hub_world
    r = _get(hub, path, tokens["root"])
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    assert isinstance(r.json(), list) and len(r.json()) == 200  # the default limit
    assert _next_link(r) is not None
    _as_the_spec_says(path, "application/json", r.json()[:20])
    r = _get(hub, _with(path, limit=1000), tokens["root"], paginated=True)
    assert r.headers["Content-Type"].startswith(PAGINATION)
    body = r.json()
    _as_the_spec_says(path, PAGINATION, {**body, "items": body["items"][:20]})
    total = body["_pagination"]["total"]
    assert total > 1000 and len(body["items"]) == 1000
    assert body["_pagination"]["next"]["offset"] == 1000
    # The last page: what is left, no next page, no Link.
    r = _get(hub, _with(path, offset=1000, limit=1000), tokens["root"], paginated=True)
    last = r.json()
    assert len(last["items"]) == total - 1000 and last["_pagination"]["next"] is None
    assert "Link" not in r.headers
    assert not {_key(x) for x in last["items"]} & {_key(x) for x in body["items"]}


@pytest.mark.hub
@pytest.mark.parametrize("path", ROUTES)
def test_following_next_walks_every_item_once(hub_world, path):
    hub, tokens = hub_world
    first = _get(hub, _with(path, limit=1000), tokens["root"]).json()
    r = _get(hub, _with(path, limit=300), tokens["root"], paginated=True)
    items, pages = [], 0
    while True:
        assert r.status_code == 200, r.text
        body = r.json()
        pag = body["_pagination"]
        assert len(body["items"]) <= 300 and pag["limit"] == 300
        items += body["items"]
        pages += 1
        link = _next_link(r)
        if pag["next"] is None:
            assert link is None
            break
        # The Link header and next.url agree: this request's path and query, with offset and limit set.
        assert link == pag["next"]["url"] and link.startswith("/services/labfleet/api/")
        q = parse_qs(urlparse(link).query)
        assert q["offset"] == [str(pag["offset"] + 300)] and q["limit"] == ["300"]
        if "action" in path:
            assert q["action"] == ["bulk.entry"]  # the other query arguments stay
        headers = {"Accept": PAGINATION, "Authorization": f"token {tokens['root']}"}
        r = requests.get(hub.url + link, headers=headers, timeout=30)
    assert len(items) == pag["total"] and pages == -(-pag["total"] // 300)
    assert len({_key(x) for x in items}) == len(items)
    assert [_key(x) for x in items[:1000]] == [_key(x) for x in first]  # the same order as the plain array


@pytest.mark.hub
@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize(
    "args",
    [
        "offset=-1",
        "offset=abc",
        "offset=",
        "offset=1.5",
        "offset=99999999999",
        "limit=0",
        "limit=1001",
        "limit=",
        "limit=-5",
        "limit=2.0",
        "limit=%2B5",
    ],
)
def test_bad_page_arguments_are_400(hub_world, path, args):
    hub, tokens = hub_world
    name = args.split("=")[0]
    r = _get(hub, path + ("&" if "?" in path else "?") + args, tokens["alice"])
    assert r.status_code == 400, r.text
    assert r.headers["Content-Type"].startswith("application/json")
    body = r.json()
    assert body["status"] == 400 and body["message"].startswith(f"{name} must be")


@pytest.mark.hub
def test_audit_default_is_200_and_keeps_its_filter(hub_world):
    hub, tokens = hub_world
    entries = _get(hub, "/audit", tokens["root"]).json()
    assert len(entries) == 200 and [e["id"] for e in entries] == sorted(
        (e["id"] for e in entries), reverse=True
    )
    body = _get(hub, "/audit?action=user.create&limit=2", tokens["root"], paginated=True).json()
    assert body["_pagination"]["total"] >= 4 and all(e["action"] == "user.create" for e in body["items"])


@pytest.mark.hub
def test_authorization_holds_on_every_page(hub_world):
    hub, tokens = hub_world

    def walk(path, token):
        out, offset = [], 0
        while True:
            body = _get(hub, _with(path, offset=offset, limit=250), token, paginated=True).json()
            out += body["items"]
            if body["_pagination"]["next"] is None:
                return out, body["_pagination"]["total"]
            offset = body["_pagination"]["next"]["offset"]

    mine, total = walk("/sessions", tokens["alice"])
    assert total == len(mine) == 650 and {s["user"] for s in mine} == {"alice"}
    acme, total = walk("/sessions", tokens["carol"])
    assert total == len(acme) == 950 and {s["domain"] for s in acme} == {"acme"}
    assert {s["user"] for s in acme} == {"alice", "bob"}
    globex, total = walk("/sessions", tokens["gina"])
    assert total == 200 and {s["user"] for s in globex} == {"gina"}
    # Another user's sessions by filter: none, and the total says so.
    body = _get(hub, "/sessions?user=alice", tokens["gina"], paginated=True).json()
    assert body == {"items": [], "_pagination": {"offset": 0, "limit": 200, "total": 0, "next": None}}
    # Users: a plain user sees themselves; the acme admin acme's users, bulk ones included.
    assert [u["username"] for u in _get(hub, "/users", tokens["alice"]).json()] == ["alice"]
    users, total = walk("/users", tokens["carol"])
    assert total == len(users) == BULK + 3 and {u["domain"] for u in users} == {"acme"}
    assert _get(hub, "/users?domain=globex", tokens["carol"]).status_code == 404
    # Audit: gina sees none of alice's entries; alice all of hers.
    assert _get(hub, "/audit?action=bulk.entry", tokens["gina"]).json() == []
    body = _get(hub, "/audit?action=bulk.entry&limit=1", tokens["alice"], paginated=True).json()
    assert body["_pagination"]["total"] == BULK
    # Folders: bob sees none of alice's; alice all of them, 1,000 at most a page.
    assert _get(hub, "/vfolders", tokens["bob"]).json() == []
    assert len(_get(hub, "/vfolders?limit=1000", tokens["alice"]).json()) == 1000


@pytest.mark.hub
def test_filters_with_pages(hub_world):
    hub, tokens = hub_world
    everything = []
    for offset in (0, 1000):
        everything += _get(hub, f"/sessions?limit=1000&offset={offset}", tokens["root"]).json()
    assert len(everything) == 1150
    created = [s["created_at"] for s in everything]
    assert created == sorted(created)  # oldest first
    for query, keep in [
        ("user=alice&status=ERROR", lambda s: s["user"] == "alice" and s["status"] == "ERROR"),
        ("domain=acme&status=CANCELLED", lambda s: s["domain"] == "acme" and s["status"] == "CANCELLED"),
        ("project=globex/x", lambda s: s["project"] == "globex/x"),
        ("project=acme/ml&user=gina", lambda s: False),
    ]:
        expected = [s["id"] for s in everything if keep(s)]
        body = _get(hub, f"/sessions?{query}&limit=40&offset=40", tokens["root"], paginated=True).json()
        assert body["_pagination"]["total"] == len(expected), query
        assert [s["id"] for s in body["items"]] == expected[40:80], query
        nxt = body["_pagination"]["next"]
        assert (nxt is not None) == (len(expected) > 80), query
    body = _get(hub, "/vfolders?status=READY&limit=5&offset=1095", tokens["alice"], paginated=True).json()
    assert [f["name"] for f in body["items"]] == [f"f{i:04d}" for i in range(1095, 1100)]
    assert body["_pagination"]["total"] == BULK


@pytest.mark.hub
def test_users_search_role_and_status_with_pages(hub_world):
    hub, tokens = hub_world
    everything = []
    for offset in (0, 1000):
        everything += _get(hub, f"/users?limit=1000&offset={offset}", tokens["root"]).json()
    for query, keep in [
        ("search=ALI", lambda u: "ali" in u["username"]),
        ("role=admin", lambda u: u["role"] == "admin"),
        ("role=user&status=active&search=k00", lambda u: u["role"] == "user" and "k00" in u["username"]),
        ("search=%25", lambda u: "%" in u["username"]),  # LIKE's wildcards are plain characters
    ]:
        expected = [u["username"] for u in everything if keep(u)]
        body = _get(hub, f"/users?{query}&limit=20&offset=1", tokens["root"], paginated=True).json()
        assert body["_pagination"]["total"] == len(expected), query
        assert [u["username"] for u in body["items"]] == expected[1:21], query
    for bad in ("role=wizard", "status=asleep", "role="):
        r = _get(hub, f"/users?{bad}", tokens["root"])
        assert r.status_code == 400 and "must be one of" in r.json()["message"], (bad, r.text)


@pytest.mark.hub
def test_bad_page_arguments_change_nothing(hub_world):
    hub, tokens = hub_world

    def totals():
        return {
            path: _get(hub, _with(path, limit=1), tokens["root"], paginated=True).json()["_pagination"][
                "total"
            ]
            for path in [*ROUTES, "/audit"]
        }

    before = totals()
    for path in ROUTES:
        for args in ("offset=-1", "limit=0", "limit=5000", "offset=x&limit=2"):
            assert _get(hub, path + ("&" if "?" in path else "?") + args, tokens["root"]).status_code == 400
    assert totals() == before


def test_a_page_shows_each_session_as_its_own_view_does(world):
    """The page loads allocations and mounts its own way: every view equals the one a session
    read alone gives (devices of holding sessions, mounts of every session)."""
    from labfleet.compute import sessions

    with database.session_scope(world) as db:
        a = _actors(db)
        paged = [
            sessions.session_view(s)
            for s in sessionlist.page_sessions(db, a["root"], {}, offset=0, limit=1000).items
        ]
    assert any(v["devices"] for v in paged) and any(v["mounts"] for v in paged)
    with database.session_scope(world) as db:
        alone = [sessions.session_view(db.get(ComputeSession, v["id"])) for v in paged]
    assert paged == alone
