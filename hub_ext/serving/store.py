"""The Model Store: the team's shared model folders as cards, each with its README and its model.

A card is a READY folder with usage_mode ``model``: a project's, or the viewer's own (any user may
make one; its card has no project, and its deploy picks one of the user's).  A user sees the ones
they can mount (their own, project membership or a share, with the host's mount right): the rule
``endpoints._folder`` applies, so "Deploy" never offers what creating an endpoint would refuse.  A domain admin sees
their domain's, a monitor and a superadmin all; ``can_deploy`` says which of those they may deploy.

The DB part (``candidates``) runs in the request's transaction; reading the files (``cards``) runs
in a thread.  A file that cannot be read never breaks the listing: its card says why.  The README's
title and summary come from pure functions (``title_and_summary``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from sqlalchemy.orm import Session

from labfleet.core.authz import Actor
from labfleet.core.errors import LabfleetError, NotFound
from labfleet.core.models import VFolder
from labfleet.core.validate import parse_project_ref
from labfleet.serving import definition
from labfleet.storage import vfolders
from labfleet.storage.store import FolderStore

README_FILES = ("README.md", "Readme.md", "readme.md")
MAX_README_BYTES = 64 * 1024
MAX_TITLE = 200
MAX_SUMMARY = 300


# ---------------------------------------------------------------- README text (pure)


def decode_readme(data: bytes, *, truncated: bool) -> tuple[str | None, str | None]:
    """(text, None), or (None, why) when ``data`` is not UTF-8.  A ``truncated`` read may end inside
    a character: that tail is dropped rather than called an error."""
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        if truncated and e.reason == "unexpected end of data" and e.start >= len(data) - 3:
            try:
                return data[: e.start].decode("utf-8"), None
            except UnicodeDecodeError:
                pass
    return None, "README.md is not UTF-8 text"


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
_ATX = re.compile(r"^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$")
_SETEXT = re.compile(r"^ {0,3}(=+|-+)[ \t]*$")
_RULE = re.compile(r"^ {0,3}([-*_])([ \t]*\1){2,}[ \t]*$")
_LIST = re.compile(r"^ {0,3}([-+*]|\d{1,9}[.)])([ \t]|$)")
_LINK_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:")
# A line of badges or images only: nothing worth reading in a summary.
_BADGES = re.compile(r"^(\s*\[?!\[[^\]]*\]\([^)]*\)(\]\([^)]*\))?\s*)+$")


def _blocks(text: str) -> Iterable[tuple[str, str]]:
    """The README's headings and paragraphs in order: ("h1" | "h" | "p", text).  Code, HTML,
    tables, lists, rules, front matter and badge lines are skipped: a summary is prose."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    i, n = 0, len(lines)
    if lines and lines[0].strip() == "---":  # YAML front matter
        for j in range(1, n):
            if lines[j].strip() in ("---", "..."):
                i = j + 1
                break
    para: list[str] = []

    def flush() -> Iterable[tuple[str, str]]:
        if para:
            yield "p", " ".join(para)
            para.clear()

    fence: str | None = None
    in_comment = False
    while i < n:
        line = lines[i]
        i += 1
        if fence is not None:
            if line.strip().startswith(fence):
                fence = None
            continue
        if in_comment:
            in_comment = "-->" not in line
            continue
        stripped = line.strip()
        if not stripped:
            yield from flush()
            continue
        m = _FENCE.match(line)
        if m:
            yield from flush()
            fence = m.group(1)[0] * 3
            continue
        if stripped.startswith("<!--"):
            yield from flush()
            in_comment = "-->" not in stripped
            continue
        m = _ATX.match(line)
        if m:
            yield from flush()
            yield ("h1" if len(m.group(1)) == 1 else "h"), m.group(2) or ""
            continue
        m = _SETEXT.match(line)
        if m and para:  # the paragraph above is a heading ("===" level 1, "---" level 2)
            yield ("h1" if m.group(1)[0] == "=" else "h"), " ".join(para)
            para.clear()
            continue
        if (
            _RULE.match(line)
            or _LIST.match(line)
            or _LINK_DEF.match(line)
            or _BADGES.match(line)
            or stripped.startswith(("<", "|"))
            or (line.startswith(("    ", "\t")) and not para)  # indented code
        ):
            yield from flush()
            continue
        para.append(stripped.lstrip(">").strip() if stripped.startswith(">") else stripped)
    yield from flush()


_INLINE = (
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),  # images: their alt text
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),  # links: their text
    (re.compile(r"\[([^\]]+)\]\[[^\]]*\]"), r"\1"),  # reference links
    (re.compile(r"<(https?://[^>\s]+)>"), r"\1"),  # autolinks
    (re.compile(r"<[^>\n]+>"), ""),  # inline HTML
    (re.compile(r"`+([^`]+?)`+"), r"\1"),  # code spans
    (re.compile(r"(\*\*|__)(?=\S)(.+?)(?<=\S)\1"), r"\2"),  # strong
    (re.compile(r"(?<![\w*])\*(?=\S)(.+?)(?<=\S)\*(?![\w*])"), r"\1"),  # emphasis
    (re.compile(r"(?<!\w)_(?=\S)(.+?)(?<=\S)_(?!\w)"), r"\1"),  # emphasis, not snake_case
)
_ESCAPED = re.compile(r"\\([\\`*_{}\[\]()#+\-.!<>|~])")
_HIDDEN = re.compile("[\ue000-\ue07f]")


def plain_text(markdown: str) -> str:
    """One line of Markdown as plain text: links, emphasis, code marks and HTML taken out."""
    # Escaped marks are hidden in the private use area while the rules run, then put back as text.
    out = _ESCAPED.sub(lambda m: chr(0xE000 + ord(m.group(1))), _HIDDEN.sub("", markdown))
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    out = _HIDDEN.sub(lambda m: chr(ord(m.group(0)) - 0xE000), out)
    return " ".join(out.split())


def _cap(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rfind(" ")
    return (cut[:space] if space > limit // 2 else cut).rstrip(" ,;:.") + "…"


def title_and_summary(readme: str | None, fallback_title: str) -> tuple[str, str]:
    """The README's first ``# `` heading and its first paragraph, as plain text; the folder's
    name and "" where it has none."""
    title, summary = "", ""
    for kind, text in _blocks(readme or ""):
        if kind == "h1" and not title:
            title = plain_text(text)
        elif kind == "p" and not summary:
            summary = plain_text(text)
        if title and summary:
            break
    return _cap(title, MAX_TITLE) or fallback_title, _cap(summary, MAX_SUMMARY)


def matches(card: dict[str, Any], search: str | None) -> bool:
    """``search`` in the card's folder name or title, ignoring case; no search matches all."""
    needle = (search or "").strip().casefold()
    return not needle or needle in card["name"].casefold() or needle in card["title"].casefold()


# ---------------------------------------------------------------- which folders (DB)


@dataclass(frozen=True)
class Candidate:
    """A model folder to show, with what reading its files needs (no DB object crosses threads)."""

    id: str
    name: str
    project: str | None  # DOMAIN/PROJECT; None: the viewer's own folder
    owner: str  # vfolders.owner_label: ``project:DOMAIN/PROJECT`` or ``user:NAME``
    host: str
    permission: str | None
    can_deploy: bool
    store: FolderStore


def candidates(db: Session, actor: Actor, *, project: str | None = None) -> list[Candidate]:
    """The project model folders ``actor`` may see in the store (see the module's doc), optionally
    of one ``project`` (DOMAIN/PROJECT; 400 when malformed)."""
    wanted = parse_project_ref(project) if project is not None else None
    user = vfolders.actor_user(db, actor)
    deployer = user is not None and actor.kind == "user" and actor.role != "monitor"
    reach = vfolders.mountable_for(db, user) if deployer and user is not None else []
    mountable = {v.id: can for v, _, can in reach}
    if actor.reads_everything or actor.role == "admin":
        scope = "all" if actor.reads_everything else "domain"
        q = vfolders.folders_query(db, actor, {"scope": scope, "status": "READY"}).where(
            VFolder.owner_kind == "project", VFolder.usage_mode == "model"
        )
        found = list(db.scalars(q.options(*vfolders.FOLDER_LOADS)).unique())
        rows = list(zip(found, vfolders.accesses(db, actor, found), strict=True))
    else:
        rows = [(v, acc) for v, acc, can in reach if can]
    out = []
    for v, acc in rows:
        p = v.project
        if v.usage_mode != "model" or v.status != "READY":
            continue
        own = v.owner_kind == "user" and user is not None and v.user_id == user.id
        if not own and (p is None or v.owner_kind != "project"):
            continue  # another user's folder shared with the viewer is theirs to publish, not a card
        if wanted is not None and (p is None or (p.domain.name, p.name) != wanted):
            continue
        out.append(
            Candidate(
                id=v.id,
                name=v.name,
                project=p.full_name if p is not None else None,
                owner=vfolders.owner_label(v),
                host=v.host.name,
                permission=acc.permission,
                can_deploy=bool(mountable.get(v.id)),
                store=vfolders.store_of(v),
            )
        )
    return out


# ---------------------------------------------------------------- the cards (files)


def _why(e: Exception, name: str) -> str:
    """Why ``name`` could not be read: the store's messages name the file (never a host path)."""
    if isinstance(e, LabfleetError):
        return e.message
    return f"{name}: cannot read it ({getattr(e, 'strerror', None) or type(e).__name__})"


def _readme(store: FolderStore) -> dict[str, Any]:
    for name in README_FILES:
        try:
            f, st = store.open_read(name)
        except NotFound:
            continue
        except (LabfleetError, OSError) as e:
            return {"readme": None, "readme_truncated": False, "readme_error": _why(e, name)}
        try:
            with f:
                data = f.read(MAX_README_BYTES + 1)
        except OSError as e:
            return {"readme": None, "readme_truncated": False, "readme_error": _why(e, name)}
        truncated = len(data) > MAX_README_BYTES or st.st_size > MAX_README_BYTES
        text, error = decode_readme(data[:MAX_README_BYTES], truncated=truncated)
        if error:
            error = error.replace("README.md", name)
        return {"readme": text, "readme_truncated": truncated and text is not None, "readme_error": error}
    return {"readme": None, "readme_truncated": False, "readme_error": None}


def _model(store: FolderStore) -> dict[str, Any]:
    for name in definition.DEFINITION_FILES:
        try:
            f, st = store.open_read(name)
        except NotFound:
            continue
        except (LabfleetError, OSError) as e:
            return {"has_definition": True, "model": None, "definition_error": _why(e, name)}
        try:
            with f:
                if st.st_size > definition.MAX_DEFINITION_BYTES:
                    raise LabfleetError(f"{name} is larger than {definition.MAX_DEFINITION_BYTES} bytes")
                service = definition.parse_definition(f.read(definition.MAX_DEFINITION_BYTES + 1))
        except (LabfleetError, OSError) as e:
            return {"has_definition": True, "model": None, "definition_error": _why(e, name)}
        return {
            "has_definition": True,
            "model": {"name": service.name, "port": service.port},
            "definition_error": None,
        }
    return {"has_definition": False, "model": None, "definition_error": None}


def card(c: Candidate) -> dict[str, Any]:
    """One folder's card: who owns it, its README (capped) with title and summary, its model."""
    readme = _readme(c.store)
    title, summary = title_and_summary(readme["readme"], c.name)
    return {
        "id": c.id,
        "name": c.name,
        "project": c.project,
        "owner": c.owner,
        "host": c.host,
        "permission": c.permission,
        "can_deploy": c.can_deploy,
        "title": title,
        "summary": summary,
        **readme,
        **_model(c.store),
    }


def cards(found: list[Candidate], *, search: str | None = None) -> list[dict[str, Any]]:
    """The cards of ``found`` that match ``search``, by title."""
    out = [x for x in map(card, found) if matches(x, search)]
    out.sort(key=lambda x: (x["title"].casefold(), x["project"] or "", x["name"]))
    return out
