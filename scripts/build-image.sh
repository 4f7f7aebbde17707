#!/usr/bin/env bash
# Build labfleet's single-user test image locally, with no registry; idempotent, quick on re-runs.
#
#   bash scripts/build-image.sh [--tag NAME]      (default tag: labfleet/singleuser:test)
#
# Three layers of images, each skipped when it is up to date:
#   labfleet/debian-base:bookworm     debootstrap --variant=minbase from this machine's Debian mirror, then
#                                     `docker import` (built once; delete the image to rebuild it)
#   labfleet/singleuser-deps:<hash>   /opt/venv with the Hub's JupyterHub version, JupyterLab,
#                                     jupyter-server-proxy and labfleet's runtime dependencies, pinned to the
#                                     versions of the project's .venv; <hash> is of those pins + the Dockerfile
#   NAME                              the deps image + labfleet's wheel built from the working tree; rebuilt
#                                     only when the label ai.labfleet.source-hash (the wheel's content) changes
# Starts the Docker engine itself (scripts/docker.sh). Needs root (or passwordless sudo) for debootstrap.
# Prints the time of each step. No stdin needed (CI).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$REPO/.labfleet-tools"
WORK="$TOOLS/build-image"
SUITE="bookworm"
BASE_IMAGE="labfleet/debian-base:$SUITE"
DEPS_REPO="labfleet/singleuser-deps"
TAG="labfleet/singleuser:test"
CA_BUNDLE="/etc/ssl/certs/ca-certificates.crt"
HASH_LABEL="ai.labfleet.source-hash"
PY="$REPO/.venv/bin/python"
DEPS_EXTRA_REQUIREMENTS="jupyterhub jupyterlab jupyter-server-proxy"

usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
    case "$1" in
        --tag) [ $# -ge 2 ] || { echo "build-image.sh: --tag needs a value" >&2; exit 2; }; TAG="$2"; shift 2 ;;
        --tag=*) TAG="${1#--tag=}"; shift ;;
        -h | --help) usage; exit 0 ;;
        *) echo "build-image.sh: unknown argument: $1 (try --help)" >&2; exit 2 ;;
    esac
done
exec </dev/null

now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
T_START="$(now)"
T_STEP="$T_START"
log() { echo "[build-image] $*"; }
step_done() {
    local t
    t="$(now)"
    awk -v a="$T_STEP" -v b="$t" -v m="$1" 'BEGIN { printf "[build-image] %-66s %6.1fs\n", m, b - a }'
    T_STEP="$t"
}
die() { echo "[build-image] ERROR: $*" >&2; exit 1; }
as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@" || die "need root for: $* (run as root, or allow passwordless sudo)"
    else
        die "need root for: $* (run as root)"
    fi
}
image_exists() { docker image inspect "$1" >/dev/null 2>&1; }

[ -x "$PY" ] || die "$PY not found: run bash scripts/setup.sh --test first"
[ -f "$CA_BUNDLE" ] || die "no CA bundle at $CA_BUNDLE (apt-get install ca-certificates)"
mkdir -p "$WORK"
exec 7>"$TOOLS/.build-image.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w 1200 7 || die "another build-image.sh holds $TOOLS/.build-image.lock"
fi

# --- 0. the engine ---------------------------------------------------------------------------------------
bash "$REPO/scripts/docker.sh" >/dev/null || die "no Docker engine (scripts/docker.sh failed: see its message above)"
step_done "engine answers"

# --- 1. base image ---------------------------------------------------------------------------------------
debian_mirror() { # the Debian archive URI that apt uses here (deb822 .sources and one-line .list files)
    "$PY" - "$SUITE" <<'PYEOF'
import glob, re, sys

suite = sys.argv[1]
entries = []  # (uri, suites)
for path in sorted(glob.glob("/etc/apt/sources.list") + glob.glob("/etc/apt/sources.list.d/*")):
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        continue
    if path.endswith(".sources"):
        for para in re.split(r"\n\s*\n", text):
            fields = {}
            for line in para.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if fields.get("enabled", "yes").lower() == "no" or "deb" not in fields.get("types", "").split():
                continue
            for uri in fields.get("uris", "").split():
                entries.append((uri, fields.get("suites", "").split()))
    elif path.endswith(".list"):
        for line in text.splitlines():
            line = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
            if len(line) >= 3 and line[0] == "deb":
                entries.append((line[1], [line[2]]))
entries = [(u.rstrip("/"), s) for u, s in entries if re.match(r"^https?://", u)]
archive = [(u, s) for u, s in entries if not any(x.endswith(("-security", "/updates")) for x in s)]
for candidates in ([u for u, s in archive if suite in s], [u for u, s in archive if "/debian" in u]):
    if candidates:
        print(candidates[0])
        sys.exit(0)
sys.exit(1)
PYEOF
}

if image_exists "$BASE_IMAGE"; then
    step_done "base $BASE_IMAGE present (skipped)"
else
    if ! command -v debootstrap >/dev/null 2>&1; then
        log "installing debootstrap"
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap \
            || { as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q \
                && as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap; } \
            || die "apt-get could not install debootstrap"
        hash -r
    fi
    MIRROR="$(debian_mirror)" || die "found no Debian mirror serving $SUITE in /etc/apt/sources.list*"
    ROOTFS="$WORK/rootfs"
    as_root rm -rf "$ROOTFS"
    keyring=()
    [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] && keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
    log "debootstrap $SUITE from $MIRROR"
    if ! as_root debootstrap --variant=minbase "${keyring[@]}" \
        --include=python3,python3-venv,python3-pip,ca-certificates,bash \
        "$SUITE" "$ROOTFS" "$MIRROR" >"$WORK/debootstrap.log" 2>&1; then
        tail -n 30 "$WORK/debootstrap.log" >&2
        die "debootstrap failed (full log: $WORK/debootstrap.log)"
    fi
    # What a container does not need: downloaded packages, package lists, docs, man pages.
    as_root rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
        "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/* "$ROOTFS"/tmp/*
    # Sessions that apt-get inside use the same mirror.
    echo "deb $MIRROR $SUITE main" | as_root tee "$ROOTFS/etc/apt/sources.list" >/dev/null
    as_root tar -C "$ROOTFS" -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/bin/bash"]' \
        --message "debootstrap --variant=minbase $SUITE" - "$BASE_IMAGE" >/dev/null
    as_root rm -rf "$ROOTFS"
    step_done "base $BASE_IMAGE built (debootstrap + import)"
fi

# --- 2. labfleet's wheel from the working tree (its METADATA lists the runtime dependencies) ---------------
rm -rf "$WORK/wheels"
mkdir -p "$WORK/wheels"
(cd "$REPO" && "$PY" -m pip wheel -q --no-deps --progress-bar off -w "$WORK/wheels" .) \
    || die "could not build labfleet's wheel from $REPO"
WHEEL="$(ls "$WORK"/wheels/*.whl)"
step_done "wheel $(basename "$WHEEL")"

# Pins for the deps image: every runtime dependency (and JupyterHub, JupyterLab, jupyter-server-proxy) at the
# version installed in the project's venv where it is installed there, else as the wheel asks for it.
"$PY" - "$WHEEL" "$DEPS_EXTRA_REQUIREMENTS" >"$WORK/requirements.txt" <<'PYEOF' || die "could not read the wheel's dependencies"
import importlib.metadata as md
import sys
import zipfile

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

wheel, extra = sys.argv[1], sys.argv[2].split()
with zipfile.ZipFile(wheel) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
reqs = {}
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue  # an optional extra, or not for this platform
    reqs[canonicalize_name(req.name)] = str(req)
for name in extra:
    reqs.setdefault(canonicalize_name(name), name)
out = []
for name, spec in sorted(reqs.items()):
    try:
        out.append(f"{name}=={md.version(name)}")
    except md.PackageNotFoundError:
        out.append(spec)
print("\n".join(out))
PYEOF
grep -q '^jupyterhub==' "$WORK/requirements.txt" || die "jupyterhub is not installed in $REPO/.venv: run bash scripts/setup.sh"

# --- 3. deps image ---------------------------------------------------------------------------------------
BASE_ID="$(docker image inspect -f '{{.Id}}' "$BASE_IMAGE")"
DEPS_HASH="$({ cat "$REPO/dockerfiles/singleuser-deps.Dockerfile" "$WORK/requirements.txt"; echo "$BASE_ID"; } | sha256sum | cut -c1-16)"
DEPS_IMAGE="$DEPS_REPO:$DEPS_HASH"
if image_exists "$DEPS_IMAGE"; then
    step_done "deps $DEPS_IMAGE present (skipped)"
else
    CTX="$WORK/deps-context"
    rm -rf "$CTX"
    mkdir -p "$CTX"
    cp "$CA_BUNDLE" "$CTX/ca-certificates.crt"
    cp "$WORK/requirements.txt" "$CTX/requirements.txt"
    log "building $DEPS_IMAGE: $(grep -E '^(jupyterhub|jupyterlab|jupyter-server-proxy)[=<>~ ]' "$CTX/requirements.txt" | tr '\n' ' ')"
    if ! DOCKER_BUILDKIT=0 docker build --network=host --build-arg "BASE=$BASE_IMAGE" \
        -f "$REPO/dockerfiles/singleuser-deps.Dockerfile" -t "$DEPS_IMAGE" "$CTX" >"$WORK/deps-build.log" 2>&1; then
        tail -n 40 "$WORK/deps-build.log" >&2
        die "building $DEPS_IMAGE failed (full log: $WORK/deps-build.log)"
    fi
    rm -rf "$CTX"
    # Older deps images (other versions) only untagged: images built on them keep their layers.
    docker image ls --format '{{.Repository}}:{{.Tag}}' "$DEPS_REPO" | grep -vx "$DEPS_IMAGE" \
        | xargs -r docker image rm >/dev/null 2>&1 || true
    step_done "deps $DEPS_IMAGE built"
fi

# --- 4. the image ----------------------------------------------------------------------------------------
SOURCE_HASH="$(
    {
        "$PY" - "$WHEEL" <<'PYEOF'
import hashlib, sys, zipfile

h = hashlib.sha256()
with zipfile.ZipFile(sys.argv[1]) as z:
    for name in sorted(z.namelist()):
        h.update(name.encode() + b"\0" + z.read(name) + b"\0")
print(h.hexdigest())
PYEOF
        cat "$REPO/dockerfiles/singleuser.Dockerfile"
        echo "$DEPS_IMAGE"
    } | sha256sum | cut -c1-32
)"
CURRENT="$(docker image inspect -f "{{ index .Config.Labels \"$HASH_LABEL\" }}" "$TAG" 2>/dev/null || true)"
if [ "$CURRENT" = "$SOURCE_HASH" ]; then
    step_done "image $TAG up to date ($HASH_LABEL=$SOURCE_HASH, skipped)"
else
    CTX="$WORK/context"
    rm -rf "$CTX"
    mkdir -p "$CTX/wheels"
    cp "$WHEEL" "$CTX/wheels/"
    OLD_ID="$(docker image inspect -f '{{.Id}}' "$TAG" 2>/dev/null || true)"
    if ! DOCKER_BUILDKIT=0 docker build --network=host --build-arg "DEPS=$DEPS_IMAGE" \
        --build-arg "SOURCE_HASH=$SOURCE_HASH" -f "$REPO/dockerfiles/singleuser.Dockerfile" -t "$TAG" "$CTX" \
        >"$WORK/build.log" 2>&1; then
        tail -n 40 "$WORK/build.log" >&2
        die "building $TAG failed (full log: $WORK/build.log)"
    fi
    rm -rf "$CTX"
    # The image this build replaced, if nothing else uses it (its containers keep it otherwise).
    if [ -n "$OLD_ID" ] && [ "$OLD_ID" != "$(docker image inspect -f '{{.Id}}' "$TAG")" ]; then
        docker image rm "$OLD_ID" >/dev/null 2>&1 || true
    fi
    step_done "image $TAG built ($HASH_LABEL=$SOURCE_HASH)"
fi
awk -v a="$T_START" -v b="$(now)" -v t="$TAG" 'BEGIN { printf "[build-image] %s ready in %.1fs\n", t, b - a }'
