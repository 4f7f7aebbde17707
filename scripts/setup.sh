#!/usr/bin/env bash
# labfleet installer: idempotent, safe to re-run, skips whatever is already there.
#
#   bash scripts/setup.sh          # runtime: Debian packages, .venv with `pip install -e .`, configurable-http-proxy
#   bash scripts/setup.sh --test   # also what the test suite needs: PostgreSQL server binaries, `-e '.[test]'`
#
# Works on a fresh Debian 12 machine as root with no stdin (CI). As a normal user it uses sudo for apt-get,
# and only when a Debian package is missing.
#
# Results:
#   <repo>/.venv                           venv built from Debian's /usr/bin/python3 (readable by every user)
#   <repo>/.labfleet-tools/node_modules    configurable-http-proxy 5.x from npm
# Then `source scripts/env.sh` puts both on PATH.
#
# Environment knobs:
#   LABFLEET_SETUP_FORCE_PIP=1    re-run the pip step even if the stamp matches
#   LABFLEET_SYSTEM_PYTHON=PATH   interpreter for the venv (default /usr/bin/python3)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$REPO/.venv"
TOOLS="$REPO/.labfleet-tools"
SYSTEM_PYTHON="${LABFLEET_SYSTEM_PYTHON:-/usr/bin/python3}"
CHP_SPEC="configurable-http-proxy@5"
CHP_MAJOR="5"

# ---------------------------------------------------------------------------------------------------------
# Debian packages, one variable per group. To add a group: define APT_<NAME>, then append it in
# `wanted_packages` below (unconditionally or behind a flag). Each entry is a Debian package name.
# ---------------------------------------------------------------------------------------------------------
APT_RUNTIME="python3 python3-venv python3-dev gcc git ca-certificates"
APT_NODE="nodejs npm"        # only when `node` is missing (a NodeSource nodejs already ships npm)
APT_SANDBOX="bubblewrap"     # the local backend sandboxes sessions with bwrap
APT_TEST="postgresql"        # server binaries under /usr/lib/postgresql/*/bin (tests/postgres_server.py)
APT_DOCKER="docker.io"       # the docker backend's tests run a real engine (scripts/docker.sh starts it)
APT_IMAGES="debootstrap"     # the test image is built from a debootstrapped Debian, no registry
# Planned groups (add them to `wanted_packages` when the features land):
# APT_BROWSER="chromium"

WITH_TEST=0
usage() {
    sed -n '2,17p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}
for arg in "$@"; do
    case "$arg" in
        --test) WITH_TEST=1 ;;
        -h | --help) usage; exit 0 ;;
        *) echo "setup.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------
now() { echo "${EPOCHREALTIME:-$(date +%s.%N)}"; }
T_START="$(now)"
T_STEP="$T_START"
log() { echo "[setup] $*"; }
step_done() { # step_done MESSAGE: prints MESSAGE with the time since the previous step
    local t
    t="$(now)"
    awk -v a="$T_STEP" -v b="$t" -v m="$1" 'BEGIN { printf "[setup] %-60s %6.1fs\n", m, b - a }'
    T_STEP="$t"
}
die() { echo "[setup] ERROR: $*" >&2; exit 1; }

pkg_installed() { # pkg_installed NAME
    dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q 'install ok installed'
}

# Some groups are satisfied by what is on disk even if the Debian package under this exact name is not
# installed (e.g. postgresql-16 from PGDG without the `postgresql` metapackage).
pkg_satisfied() { # pkg_satisfied NAME
    case "$1" in
        postgresql)
            compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && return 0 ;;
    esac
    pkg_installed "$1"
}

wanted_packages() {
    local pkgs="$APT_RUNTIME $APT_SANDBOX"
    if ! command -v node >/dev/null 2>&1; then
        pkgs="$pkgs $APT_NODE"
    fi
    if [ "$WITH_TEST" = 1 ]; then
        pkgs="$pkgs $APT_TEST $APT_DOCKER $APT_IMAGES"
    fi
    echo "$pkgs"
}

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@" || die "need root for: $* (run this script as root, or allow passwordless sudo)"
    else
        die "need root for: $* (run this script as root)"
    fi
}

# One setup at a time (scripts/test and scripts/up may run side by side).
mkdir -p "$TOOLS"
exec 9>"$TOOLS/.setup.lock"
if command -v flock >/dev/null 2>&1; then
    flock 9
fi

# ---------------------------------------------------------------------------------------------------------
# 1. Debian packages
# ---------------------------------------------------------------------------------------------------------
missing=()
for p in $(wanted_packages); do
    pkg_satisfied "$p" || missing+=("$p")
done
if [ "${#missing[@]}" -eq 0 ]; then
    step_done "apt: all packages present (skipped)"
else
    command -v apt-get >/dev/null 2>&1 || die "missing packages ${missing[*]} and no apt-get (Debian 12 expected)"
    log "apt: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
        -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold "${missing[@]}" </dev/null
    for p in "${missing[@]}"; do
        pkg_satisfied "$p" || die "apt-get did not install $p"
    done
    step_done "apt: installed ${missing[*]}"
fi
command -v node >/dev/null 2>&1 || die "node is still missing after the apt step"
command -v npm >/dev/null 2>&1 || die "node is installed but npm is not: install npm for this node (e.g. 'apt-get install npm' for Debian's nodejs; NodeSource's nodejs ships it)"
[ -x "$SYSTEM_PYTHON" ] || die "$SYSTEM_PYTHON not found (apt-get install python3 python3-venv)"

# ---------------------------------------------------------------------------------------------------------
# 2. venv from Debian's python (a pyenv python under /root is mode 0700: other users could not run it)
# ---------------------------------------------------------------------------------------------------------
venv_ok() {
    [ -x "$VENV/bin/python" ] || return 1
    [ -f "$VENV/pyvenv.cfg" ] || return 1
    # the venv must come from SYSTEM_PYTHON's directory, not e.g. /root/.pyenv/...
    local home
    home="$(sed -n 's/^home *= *//p' "$VENV/pyvenv.cfg" | head -n1)"
    [ "$home" = "$(dirname "$SYSTEM_PYTHON")" ] || return 1
    "$VENV/bin/python" -c 'import sys, pip' >/dev/null 2>&1 || return 1
}
if venv_ok; then
    step_done "venv: $VENV present (skipped)"
else
    if [ -e "$VENV" ]; then
        log "venv: $VENV is broken or not built from $SYSTEM_PYTHON: rebuilding it"
        rm -rf "$VENV"
    fi
    "$SYSTEM_PYTHON" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade pip </dev/null
    step_done "venv: created $VENV from $SYSTEM_PYTHON"
fi

# ---------------------------------------------------------------------------------------------------------
# 3. pip install -e .[extras]; skipped when a stamp records the same pyproject.toml + extras.
#    A test install (`.[test]`) is a superset of the runtime one, so it satisfies a runtime run too:
#    alternating scripts/test and scripts/up does not reinstall.
# ---------------------------------------------------------------------------------------------------------
[ -f "$REPO/pyproject.toml" ] || die "$REPO/pyproject.toml not found"
stamp_hash() { # stamp_hash EXTRAS
    { cat "$REPO/pyproject.toml"; printf '\n--extras=%s\n' "$1"; } | sha256sum | cut -d' ' -f1
}
stamp_file() { echo "$VENV/.labfleet-pip-stamp-${1:-runtime}"; }
stamp_matches() { # stamp_matches EXTRAS
    [ -f "$(stamp_file "$1")" ] && [ "$(cat "$(stamp_file "$1")")" = "$(stamp_hash "$1")" ]
}
if [ "$WITH_TEST" = 1 ]; then
    EXTRAS="test"
    SPEC=".[test]"
    satisfied() { stamp_matches test; }
else
    EXTRAS=""
    SPEC="."
    satisfied() { stamp_matches "" || stamp_matches test; }
fi
if [ "${LABFLEET_SETUP_FORCE_PIP:-0}" != 1 ] && satisfied; then
    step_done "pip: -e '$SPEC' up to date with pyproject.toml (skipped)"
else
    rm -f "$VENV"/.labfleet-pip-stamp-*
    (cd "$REPO" && "$VENV/bin/python" -m pip install --progress-bar off -e "$SPEC" </dev/null)
    stamp_hash "$EXTRAS" >"$(stamp_file "$EXTRAS")"
    step_done "pip: installed -e '$SPEC'"
fi

# ---------------------------------------------------------------------------------------------------------
# 4. configurable-http-proxy 5.x from npm (the PyPI one breaks on escaped base URLs, see NOTES.md)
# ---------------------------------------------------------------------------------------------------------
chp_version() {
    local pj="$TOOLS/node_modules/configurable-http-proxy/package.json"
    [ -x "$TOOLS/node_modules/.bin/configurable-http-proxy" ] && [ -f "$pj" ] || return 1
    node -p "require(process.argv[1]).version" "$pj" 2>/dev/null
}
if v="$(chp_version)" && [ "${v%%.*}" = "$CHP_MAJOR" ]; then
    step_done "npm: configurable-http-proxy $v present (skipped)"
else
    (cd "$REPO" && npm install --prefix "$TOOLS" --no-audit --no-fund --no-update-notifier \
        --loglevel=error "$CHP_SPEC" </dev/null)
    v="$(chp_version)" || die "configurable-http-proxy did not install into $TOOLS"
    step_done "npm: installed configurable-http-proxy $v"
fi

awk -v a="$T_START" -v b="$(now)" -v t="$WITH_TEST" \
    'BEGIN { printf "[setup] done (%s) in %.1fs. Use it: source scripts/env.sh\n", (t == 1 ? "runtime + test" : "runtime"), b - a }'
