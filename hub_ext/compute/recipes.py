"""Recipes: the files a user's own environment image is built from ("My Environments").

A recipe is a registered base image plus any of these files, as repo2docker reads them::

    apt.txt            Debian packages, one name per line (``name`` or ``name=version``)
    environment.yml    a conda environment, only where the caller says the base has conda or mamba
    requirements.txt   pip requirements, from the configured package index only
    postBuild          a script, run as the image's unprivileged user (never as root)

Everything here is pure: plain values in, plain values out; no files, no Docker. The service
checks a recipe with :func:`parse_recipe`, names the image by :func:`recipe_hash` (the same base
and the same files give the same hash, so the second build of a recipe reuses its image) and hands
:func:`context_files` (the Dockerfile and the files it copies) to whoever builds.

The build cache, as users are told it
-------------------------------------
The image is built in layers, in this order, each on top of the one before::

    1. apt       apt.txt           (as root: the only layer that is)
    2. conda     environment.yml
    3. pip       requirements.txt
    4. postBuild postBuild         (as the unprivileged user, like 2 and 3)

A layer is rebuilt when the base or the file of that layer *or of any layer before it* changes;
the layers before it are reused. So a change in requirements.txt alone reinstalls the pip packages
and reruns postBuild, but keeps the apt packages; a change in apt.txt (or a new base) rebuilds
everything. :func:`layer_keys` computes exactly this: layer i's key covers the base and the files of
layers 1..i, nothing else. The Dockerfile follows it: each file is copied into the build right
before the layer that uses it, and the labels that name the whole recipe come last.

Build settings that are not the user's (the unprivileged user, the package index, an apt proxy,
``own_env``) are arguments of :func:`dockerfile`, not part of the recipe or of its hash.

A base whose Python environment the unprivileged user cannot write (a venv or conda env owned by
root, as in an image that installs its venv as root and then switches user) fails at the pip layer.
``dockerfile(..., own_env=True)`` adds one step as root before the apt layer, of fixed text (the
base and the user only, nothing of the recipe): when the ``pip`` on PATH belongs to a venv or conda
env (``pyvenv.cfg`` or ``conda-meta/`` in its prefix, never /usr or /usr/local), the env's
directories (and conda's records) that are not the user's become theirs. That is enough for pip to
add, upgrade and remove packages (it unlinks a file before writing or removing it), and costs
metadata only: no file's data is copied into the layer. The Docker cache keeps the step once per
base and user, shared by every recipe on that base; where the env already is the user's, it
changes nothing.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

import yaml

from labfleet.core.errors import InvalidInput

APT_FILE = "apt.txt"
CONDA_FILE = "environment.yml"
PIP_FILE = "requirements.txt"
POSTBUILD_FILE = "postBuild"
# The layers of an image built from a recipe, in build order: (layer name, the file it uses).
LAYERS: tuple[tuple[str, str], ...] = (
    ("apt", APT_FILE),
    ("conda", CONDA_FILE),
    ("pip", PIP_FILE),
    ("postBuild", POSTBUILD_FILE),
)
RECIPE_FILES: tuple[str, ...] = tuple(file for _, file in LAYERS)
MAX_RECIPE_BYTES = 256 * 1024
DEFAULT_USER = "1000:1000"
# Where the build copies the recipe's files (and the directory postBuild runs in).
RECIPE_DIR = "/tmp/labfleet-recipe"
LABEL_RECIPE_HASH = "ai.labfleet.recipe-hash"
LABEL_BASE = "ai.labfleet.base"
_HASH_VERSION = 1  # bump when the serialisation below changes (every hash changes with it)

# A Docker image reference: [registry[:port]/]path[:tag][@digest], path components lowercase.
_HOST_PART = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_PATH_PART = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_IMAGE_REF = re.compile(
    rf"^(?:(?P<registry>{_HOST_PART}(?:\.{_HOST_PART})*(?::[0-9]{{1,5}})?)/)?"
    rf"(?P<path>{_PATH_PART}(?:/{_PATH_PART})*)"
    r"(?::(?P<tag>[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}))?"
    r"(?:@(?P<digest>sha256:[0-9a-f]{64}))?$"
)
MAX_IMAGE_REF = 255
# A Debian package name (policy 5.6.1), optionally pinned: name=version.
APT_PACKAGE = re.compile(r"^[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9][A-Za-z0-9.+~:-]*)?$")
# The unprivileged user: uid[:gid] or name[:group], as Docker's USER takes it.
_USER = re.compile(r"^(?:[0-9]{1,10}|[a-z_][a-z0-9_-]{0,31})(?::(?:[0-9]{1,10}|[a-z_][a-z0-9_-]{0,31}))?$")
# A URL that can go into a Dockerfile and a shell word as it is: no quotes, `$`, `\`, spaces.
_SAFE_URL = re.compile(r"^https?://[A-Za-z0-9._~:/?#\[\]@!&+,;=%-]+$")

# requirements.txt: a requirement by name (PEP 508 without a URL), its markers after ";".
_PIP_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_PIP_VERSION = r"\s*(?:===|~=|==|!=|<=|>=|<|>)\s*[A-Za-z0-9_.*+!-]+\s*"
_PIP_REQUIREMENT = re.compile(
    rf"^{_PIP_NAME}\s*(?:\[\s*{_PIP_NAME}(?:\s*,\s*{_PIP_NAME})*\s*\])?\s*"
    rf"(?:\(?(?:{_PIP_VERSION})(?:,{_PIP_VERSION})*\)?)?$"
)
# Names pip would take for a local archive file, not a package on the index.
_ARCHIVE_SUFFIXES = (".whl", ".zip", ".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz", ".tar.xz", ".txz")
# Options a recipe's requirements.txt may use (a whole line of them, or --hash after a requirement).
_PIP_FLAGS = {"--pre", "--prefer-binary", "--require-hashes"}
_PIP_VALUE_OPTIONS = {"--only-binary", "--no-binary"}
_PIP_BINARY_VALUE = re.compile(r"^(?::all:|:none:|[A-Za-z0-9._-]+(?:,[A-Za-z0-9._-]+)*)$")
_PIP_HASH = re.compile(r"^--hash[= ](sha256|sha384|sha512):[0-9a-f]{64,128}$")
# Why the others are refused, by what they do.
_FETCH_ELSEWHERE = "changes where pip fetches packages from; a recipe uses the configured package index"
_REFUSED_PIP_OPTIONS = {
    "-i": _FETCH_ELSEWHERE,
    "--index-url": _FETCH_ELSEWHERE,
    "--extra-index-url": _FETCH_ELSEWHERE,
    "--no-index": _FETCH_ELSEWHERE,
    "--trusted-host": _FETCH_ELSEWHERE,
    "-f": _FETCH_ELSEWHERE,
    "--find-links": _FETCH_ELSEWHERE,
    "-e": "installs from a local folder or a version-control URL; packages come from the package index",
    "--editable": "installs from a local folder or a version-control URL; packages come from the package index",
    "-r": "includes another file; a recipe has no other files (put its lines here)",
    "--requirement": "includes another file; a recipe has no other files (put its lines here)",
    "-c": "includes another file; a recipe has no other files (put its lines here)",
    "--constraint": "includes another file; a recipe has no other files (put its lines here)",
}
_VCS = re.compile(r"(^|@\s*)(git|hg|svn|bzr)\+", re.IGNORECASE)
# What pip reads as a comment, and a line that is one (never continued by a trailing backslash).
_PIP_COMMENT = re.compile(r"(^|\s+)#.*$")
_PIP_COMMENT_LINE = re.compile(r"^\s*#")
# pip decodes a requirements file in the encoding that a "# coding: ..." line names, if one of its
# first two lines (split at LF only) is one; a recipe's files are UTF-8.
_PIP_CODING = re.compile(r"^#.*coding[:=]")
# Environment markers after ";": names, quoted strings, comparisons; nothing pip could read otherwise.
_PIP_MARKERS = re.compile(r"^[A-Za-z0-9_.\s'\"<>=!~(),-]*$")


@dataclass(frozen=True)
class Recipe:
    """A checked recipe: the base image reference and its files (name -> text), from :func:`parse_recipe`."""

    base: str
    files: Mapping[str, str]


# --- checks --------------------------------------------------------------------------------------


def check_base_image(value: Any) -> str:
    """The base image reference, or InvalidInput: ``[registry[:port]/]path[:tag][@sha256:digest]``."""
    m = _IMAGE_REF.match(value) if isinstance(value, str) and len(value) <= MAX_IMAGE_REF else None
    registry = m.group("registry") if m else None
    if m and registry and not ("." in registry or ":" in registry or registry == "localhost"):
        # Docker reads a first component without "." or ":" as part of the path: lowercase only.
        m = m if registry == registry.lower() else None
    if not m:
        raise InvalidInput(
            f"base image {str(value)[:80]!r} is not an image reference "
            "(like registry.example.com/team/image:tag, lowercase, no spaces)"
        )
    return str(value)


def _shown(line: str) -> str:
    return repr(line if len(line) <= 80 else line[:77] + "...")


def _normalised(text: str) -> str:
    """The text with a leading byte-order mark dropped and CRLF / CR line ends made LF."""
    return text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def _apt_problem(line: str) -> str | None:
    if APT_PACKAGE.match(line):
        return None
    return (
        f"{_shown(line)} is not a Debian package name "
        "(one name per line, like curl or libgl1=1.7.0-1, lowercase; # starts a comment)"
    )


def _apt_entries(text: str) -> list[tuple[int, str]]:
    """(line number, the line without its comment and spaces) for each line of apt.txt that says something."""
    out = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if line:
            out.append((number, line))
    return out


def apt_packages(text: str) -> list[str]:
    """The packages apt.txt names, in order, each once; InvalidInput names the first bad line."""
    packages: list[str] = []
    for number, line in _apt_entries(text):
        problem = _apt_problem(line)
        if problem:
            raise InvalidInput(f"{APT_FILE} line {number}: {problem}")
        if line not in packages:
            packages.append(line)
    return packages


def _pip_logical_lines(text: str) -> list[tuple[int, str]]:
    """(first line number, the line) as pip reads requirements.txt: lines split as ``str.splitlines``
    does, a line ending in a backslash joined with the next (unless it is a comment line),
    comments dropped."""
    out: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        comment = _PIP_COMMENT_LINE.match(raw) is not None
        if raw.endswith("\\") and not comment:
            if not pending:
                start = number
            pending.append(raw.strip("\\"))
            continue
        joined = "".join([*pending, " " + raw if comment else raw])
        out.append((start if pending else number, joined))
        pending = []
    if pending:
        out.append((start, "".join(pending)))
    stripped = [(number, _PIP_COMMENT.sub("", line).strip()) for number, line in out]
    return [(number, line) for number, line in stripped if line]


def _pip_option_name(token: str) -> str:
    if token.startswith("--"):
        return token.split("=", 1)[0]
    return token[:2]


def _pip_options_problem(tokens: list[str], *, after_requirement: bool) -> str | None:
    """Why these option tokens are refused, or None; ``after_requirement``: only --hash may follow one."""
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name = _pip_option_name(token)
        if name in _REFUSED_PIP_OPTIONS:
            return f"{name} {_REFUSED_PIP_OPTIONS[name]}"
        if name == "--hash":
            value = token if "=" in token else f"{token} {tokens[i + 1] if i + 1 < len(tokens) else ''}"
            i += 1 if "=" in token else 2
            if not _PIP_HASH.match(value.strip()):
                return "--hash needs a value like sha256:<64 hex digits>"
            continue
        if after_requirement:
            return f"{name} may not follow a requirement (only --hash may)"
        if name in _PIP_FLAGS and token == name:
            i += 1
            continue
        if name in _PIP_VALUE_OPTIONS:
            value = token.split("=", 1)[1] if "=" in token else (tokens[i + 1] if i + 1 < len(tokens) else "")
            i += 1 if "=" in token else 2
            if not _PIP_BINARY_VALUE.match(value):
                return f"{name} takes :all:, :none: or package names separated by commas"
            continue
        allowed = ", ".join(sorted(_PIP_FLAGS | _PIP_VALUE_OPTIONS | {"--hash"}))
        return f"option {name} is not allowed in a recipe (only {allowed})"
    return None


def _pip_problem(line: str) -> str | None:
    """Why pip's logical line is refused in a recipe, or None when it may stay."""
    tokens = line.split()
    if tokens[0].startswith("-"):
        return _pip_options_problem(tokens, after_requirement=False)
    first_option = next((i for i, t in enumerate(tokens) if t.startswith("-")), len(tokens))
    requirement = " ".join(tokens[:first_option])
    spec, _, markers = requirement.partition(";")
    spec = spec.strip()
    lowered = spec.lower()
    if _VCS.search(spec):
        return f"{_shown(spec)} installs from a version-control URL; packages come from the package index"
    if lowered.startswith("file:") or "@ file:" in lowered or "@file:" in lowered:
        return f"{_shown(spec)} installs from a local file; a recipe has no other files"
    if "://" in spec or "@" in spec:
        return f"{_shown(spec)} installs from a URL; packages come from the package index (give a name and version)"
    if spec.startswith((".", "/", "~")) or "/" in spec or "\\" in spec:
        return f"{_shown(spec)} is a local path; a recipe has no other files"
    if lowered.endswith(_ARCHIVE_SUFFIXES):
        return f"{_shown(spec)} names an archive file; packages come from the package index"
    if not _PIP_REQUIREMENT.match(spec):
        return f"{_shown(spec)} is not a requirement (like numpy, pandas>=2.1 or torch[cuda]==2.5.1)"
    if ";" in requirement and not (markers.strip() and _PIP_MARKERS.match(markers)):
        return f'{_shown(markers.strip())} are not environment markers (like python_version >= "3.10")'
    return _pip_options_problem(tokens[first_option:], after_requirement=True)


def pip_requirements(text: str) -> list[str]:
    """The requirement lines of requirements.txt that name a package (options left out), checked."""
    for number, raw in enumerate(text.split("\n")[:2], start=1):
        if _PIP_CODING.match(raw):
            raise InvalidInput(
                f"{PIP_FILE} line {number}: an encoding declaration; a recipe's files are UTF-8"
            )
    out = []
    for number, line in _pip_logical_lines(text):
        problem = _pip_problem(line)
        if problem:
            raise InvalidInput(f"{PIP_FILE} line {number}: {problem}")
        if not line.startswith("-"):
            out.append(line)
    return out


def _check_conda_env(text: str) -> None:
    """environment.yml: a YAML mapping; its ``pip:`` list is held to requirements.txt's rules.

    (Its conda channels are the caller's to trust: a recipe has environment.yml only where the
    caller says the base has conda.)
    """
    try:
        env = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise InvalidInput(f"{CONDA_FILE}{where}: not valid YAML") from None
    if not isinstance(env, dict):
        raise InvalidInput(
            f"{CONDA_FILE}: not a conda environment (a mapping with name, channels, dependencies)"
        )
    dependencies = env.get("dependencies") or []
    if not isinstance(dependencies, list):
        raise InvalidInput(f"{CONDA_FILE}: dependencies must be a list")
    for dep in dependencies:
        if not isinstance(dep, dict) or "pip" not in dep:
            continue
        items = dep["pip"] or []
        if not isinstance(items, list):
            raise InvalidInput(f"{CONDA_FILE}: the pip dependencies must be a list")
        for number, item in enumerate(items, start=1):
            if not isinstance(item, str) or "\n" in item or "\r" in item or not item.strip():
                raise InvalidInput(f"{CONDA_FILE}: pip item {number} must be one line of text")
            line = _PIP_COMMENT.sub("", item).strip()
            problem = _pip_problem(line) if line else f"{_shown(item)} is only a comment"
            if problem:
                raise InvalidInput(f"{CONDA_FILE}: pip item {number}: {problem}")


def parse_recipe(
    base: str,
    files: Mapping[str, Any],
    *,
    conda: bool = False,
    max_bytes: int = MAX_RECIPE_BYTES,
) -> Recipe:
    """Check a recipe (untrusted input) and return it; InvalidInput names the file (and line) that is wrong.

    ``files``: recipe file name -> its text (none at all is a recipe too: just the base). ``conda``:
    the caller knows the base has conda or mamba (only then may the recipe have environment.yml).
    ``max_bytes``: the most all files may hold together (UTF-8). Line ends become LF and a
    file that holds only white space counts as absent, so the same recipe always hashes the same.
    """
    base = check_base_image(base)
    if not isinstance(files, Mapping):
        raise InvalidInput(f"a recipe's files are a mapping of file name to text ({', '.join(RECIPE_FILES)})")
    texts: dict[str, str] = {}
    total = 0
    for name in sorted(files, key=str):
        if name not in RECIPE_FILES:
            raise InvalidInput(
                f"{str(name)[:60]!r} is not a recipe file; a recipe has only {', '.join(RECIPE_FILES)}"
            )
        text = files[name]
        if not isinstance(text, str):
            raise InvalidInput(f"{name} must be text")
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidInput(f"{name} is not valid UTF-8 text") from None
        if "\x00" in text:
            line = text.count("\n", 0, text.index("\x00")) + 1
            raise InvalidInput(f"{name} line {line}: a NUL character; a recipe file is text")
        total += size
        texts[name] = _normalised(text)
    if total > max_bytes:
        sizes = ", ".join(f"{name} {len(files[name].encode('utf-8'))} bytes" for name in texts)
        raise InvalidInput(
            f"the recipe is {total} bytes, over the limit of {max_bytes} bytes ({sizes}); "
            "keep large files in a folder and fetch them from postBuild"
        )
    texts = {name: text for name, text in texts.items() if text.strip()}
    if CONDA_FILE in texts:
        if not conda:
            raise InvalidInput(f"{CONDA_FILE} needs a base image with conda or mamba; {base} has neither")
        _check_conda_env(texts[CONDA_FILE])
    if APT_FILE in texts:
        apt_packages(texts[APT_FILE])
    if PIP_FILE in texts:
        pip_requirements(texts[PIP_FILE])
    ordered = {name: texts[name] for name in RECIPE_FILES if name in texts}
    return Recipe(base=base, files=MappingProxyType(ordered))


# --- hashes --------------------------------------------------------------------------------------


def _digest(base: str, files: Mapping[str, str], layer: str | None = None) -> str:
    doc: dict[str, Any] = {"v": _HASH_VERSION, "base": base, "files": dict(files)}
    if layer is not None:
        doc["layer"] = layer
    canonical = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def recipe_hash(recipe: Recipe) -> str:
    """sha256 (hex) of the base and the files, whatever order they came in: the image's identity."""
    return _digest(recipe.base, recipe.files)


def layer_keys(recipe: Recipe) -> list[str]:
    """One key per layer of :data:`LAYERS` (apt, conda, pip, postBuild), in that order.

    Layer i's key covers the base and the files of layers 0..i only: a change in requirements.txt
    changes the pip and postBuild keys and leaves apt's and conda's as they were; a change in
    apt.txt or in the base changes them all. A layer whose file is absent still has a key.
    """
    keys = []
    for i, (layer, _) in enumerate(LAYERS):
        used = {file: recipe.files[file] for _, file in LAYERS[: i + 1] if file in recipe.files}
        keys.append(_digest(recipe.base, used, layer))
    return keys


# --- the Dockerfile ------------------------------------------------------------------------------


def check_build_user(value: Any) -> str:
    """The unprivileged user the image ends as (uid[:gid] or name[:group]); never root."""
    if not isinstance(value, str) or not _USER.match(value):
        raise InvalidInput(f"build user {str(value)[:40]!r} is not uid[:gid] or name[:group]")
    who = value.split(":", 1)[0]
    if who == "root" or (who.isdigit() and int(who) == 0):
        raise InvalidInput("the build user may not be root: postBuild and pip run as an unprivileged user")
    return value


def _check_url(value: Any, what: str) -> str:
    parts = urlsplit(value) if isinstance(value, str) and _SAFE_URL.match(value) else None
    if parts is None or not parts.hostname:
        raise InvalidInput(f"{what} {str(value)[:80]!r} is not an http(s) URL without spaces or quotes")
    return str(value)


def check_index_url(value: Any) -> str:
    """A package index URL as :func:`dockerfile` takes it (http or https; no spaces, quotes or ``$``)."""
    return _check_url(value, "package index")


def _host_port(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{parts.port}" if parts.port else host


def _layers_used(recipe: Recipe) -> dict[str, bool]:
    """Which layers the Dockerfile has: a file that says nothing to install makes no layer."""
    files = recipe.files
    return {
        "apt": APT_FILE in files and bool(apt_packages(files[APT_FILE])),
        "conda": CONDA_FILE in files,
        "pip": PIP_FILE in files and bool(pip_requirements(files[PIP_FILE])),
        "postBuild": POSTBUILD_FILE in files,
    }


def _own_env_step(user: str) -> str:
    """The root step of ``own_env``: in the env of the ``pip`` on PATH (a venv or conda env, found
    by its prefix; never /usr or /usr/local, whose prefix has neither mark), every directory and
    conda's records (``conda-meta/``) not ``user``'s become theirs; nothing otherwise (no pip, a
    system Python, an env the user owns). Directories suffice for pip: it adds files, and it
    unlinks a file before it writes or removes it (no file's data is copied into the layer)."""
    owner = shlex.quote(user.split(":", 1)[0])
    return (
        'RUN pip="$(command -v pip || true)" \\\n'
        ' && prefix="$(if [ -n "$pip" ]; then dirname "$(dirname "$(readlink -f "$pip")")"; fi)" \\\n'
        ' && if [ -n "$prefix" ] && { [ -f "$prefix/pyvenv.cfg" ] || [ -d "$prefix/conda-meta" ]; }; then \\\n'
        f'        find "$prefix" ! -user {owner} \\( -type d -o -path "$prefix/conda-meta/*" \\) \\\n'
        f"            -exec chown {shlex.quote(user)} {{}} +; \\\n"
        "    fi"
    )


def dockerfile(
    recipe: Recipe,
    *,
    user: str = DEFAULT_USER,
    index_url: str | None = None,
    apt_proxy: str | None = None,
    own_env: bool = False,
) -> str:
    """The Dockerfile that builds ``recipe`` (see the module's notes on layers and the build cache).

    Only the apt layer runs as root; conda, pip and postBuild run as ``user``, which the image ends
    as. ``index_url``: pip's package index (``PIP_INDEX_URL``, a build argument, so it stays out of
    the sessions' environment, though ``docker history`` shows it: give one without credentials;
    the host is trusted too when the URL is http); None: pip's default, the public index. ``apt_proxy``: an http(s) proxy for apt (a cache such as apt-cacher-ng).
    ``own_env``: first give ``user`` the folders of the base's Python environment when it is a venv
    or conda env the user does not own (see the module's notes), for recipes with a conda, pip or
    postBuild layer.
    The base, the user and the URLs are checked here again; apt package names are checked when
    read, and every other file is copied, never written into the Dockerfile.
    """
    base = check_base_image(recipe.base)
    user = check_build_user(user)
    index_url = _check_url(index_url, "package index") if index_url is not None else None
    apt_proxy = _check_url(apt_proxy, "apt proxy") if apt_proxy is not None else None
    used = _layers_used(recipe)
    lines = [f"# labfleet recipe {recipe_hash(recipe)}", f"FROM {base}"]
    as_user = used["conda"] or used["pip"] or used["postBuild"]
    if own_env and as_user:
        # Before apt: the step depends on the base and the user only, so every recipe shares it.
        lines += ["USER root", _own_env_step(user)]
    if used["apt"]:
        if not (own_env and as_user):
            lines.append("USER root")
        apt = "apt-get"
        if apt_proxy:
            proxy = f"Acquire::http::Proxy={apt_proxy}"
            apt = f"apt-get -o {shlex.quote(proxy)}"
        packages = " \\\n        ".join(shlex.quote(p) for p in apt_packages(recipe.files[APT_FILE]))
        lines += [
            f"RUN {apt} update \\\n"
            f" && DEBIAN_FRONTEND=noninteractive {apt} install -y --no-install-recommends \\\n"
            f"        {packages} \\\n"
            " && rm -rf /var/lib/apt/lists/*",
        ]
    lines.append(f"USER {user}")
    if index_url and as_user:  # postBuild's pip too
        lines.append(f'ARG PIP_INDEX_URL="{index_url}"')
        if urlsplit(index_url).scheme == "http":
            lines.append(f'ARG PIP_TRUSTED_HOST="{_host_port(index_url)}"')
    if used["conda"]:
        env = f"{RECIPE_DIR}/{CONDA_FILE}"
        lines += [
            f"COPY --chown={user} {CONDA_FILE} {env}",
            "RUN if command -v mamba >/dev/null 2>&1; then conda=mamba; else conda=conda; fi \\\n"
            f' && "$conda" env update -n base -f {env} \\\n'
            ' && "$conda" clean -afy',
        ]
    if used["pip"]:
        requirements = f"{RECIPE_DIR}/{PIP_FILE}"
        lines += [
            f"COPY --chown={user} {PIP_FILE} {requirements}",
            f"RUN pip install --no-cache-dir -r {requirements}",
        ]
    if used["postBuild"]:
        script = f"{RECIPE_DIR}/{POSTBUILD_FILE}"
        lines += [
            f"COPY --chown={user} {POSTBUILD_FILE} {script}",
            f"RUN chmod +x {script} && cd {RECIPE_DIR} && ./{POSTBUILD_FILE}",
        ]
    labels = {LABEL_RECIPE_HASH: recipe_hash(recipe), LABEL_BASE: base}
    # Last, so that a new hash leaves every layer above in the cache.
    lines.append("LABEL " + " ".join(f"{key}={json.dumps(value)}" for key, value in labels.items()))
    return "\n".join(lines) + "\n"


def context_files(
    recipe: Recipe,
    *,
    user: str = DEFAULT_USER,
    index_url: str | None = None,
    apt_proxy: str | None = None,
    own_env: bool = False,
) -> dict[str, bytes]:
    """The build context: ``Dockerfile`` (:func:`dockerfile` with these arguments) and the files it copies."""
    used = _layers_used(recipe)
    text = dockerfile(recipe, user=user, index_url=index_url, apt_proxy=apt_proxy, own_env=own_env)
    out = {"Dockerfile": text.encode()}
    for layer, file in LAYERS:
        if used[layer] and layer != "apt":  # apt's packages are in the Dockerfile itself
            out[file] = recipe.files[file].encode("utf-8")
    return out


# --- "Save as environment" -----------------------------------------------------------------------


def pip_packages_recipe(pip_freeze: str, apt_manual: str) -> dict[str, str]:
    """requirements.txt and apt.txt for a recipe from a running session's ``pip freeze`` and ``apt-mark showmanual``.

    Both are untrusted text the session reports. Only lines that pass a recipe's own checks stay
    (editable installs, file: and VCS lines, options and anything else are dropped, silently), each
    once, sorted by name. A file with no lines left is left out.
    """
    requirements = {
        line
        for _, line in _pip_logical_lines(_normalised(str(pip_freeze)))
        if not line.startswith("-") and "\x00" not in line and _pip_problem(line) is None
    }
    packages = {
        line
        for _, line in _apt_entries(_normalised(str(apt_manual)))
        if "\x00" not in line and _apt_problem(line) is None
    }
    out = {}
    if packages:
        out[APT_FILE] = "\n".join(sorted(packages)) + "\n"
    if requirements:
        out[PIP_FILE] = "\n".join(sorted(requirements, key=lambda r: (r.lower(), r))) + "\n"
    return out
