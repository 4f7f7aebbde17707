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
#   <repo>/.labfleet-tools/apps/bin        (--test) tensorboard, mlflow, code-server for the app launchers
#   <repo>/labextension/build              the JupyterLab extension, linked into the venv's labextensions
# Then `source scripts/env.sh` puts both on PATH.
#
# Environment knobs:
#   LABFLEET_SETUP_FORCE_PIP=1    re-run the pip step even if the stamp matches
#   LABFLEET_SETUP_FORCE_LABEXT=1 rebuild the JupyterLab extension even if its stamp matches
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
APT_SANDBOX="bubblewrap iproute2 nftables"  # local sessions: bwrap, a network namespace each, their firewall
APT_TEST="postgresql"        # server binaries under /usr/lib/postgresql/*/bin (tests/postgres_server.py)
APT_DOCKER="docker.io docker-registry"  # a real engine (scripts/docker.sh) and the fleet registry (scripts/registry.sh)
APT_IMAGES="debootstrap"     # the test image is built from a debootstrapped Debian, no registry
APT_APPS="libkrb5-dev g++ make"  # code-server's native modules build here (kerberos needs gssapi.h)
APT_BROWSER="chromium"       # the browser tests drive Debian's Chromium with Playwright (no `playwright install`)

WITH_TEST=0
usage() {
    sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
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
        pkgs="$pkgs $APT_TEST $APT_DOCKER $APT_IMAGES $APT_APPS $APT_BROWSER"
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
# 1b. The account local sessions run as (spawner/local.py, LabfleetLocalSpawner.session_user): a system
#     account with no home and no shell. Only a Hub run as root switches to it; as another user, sessions
#     run as that user.
# ---------------------------------------------------------------------------------------------------------
SESSION_ACCOUNT="labfleet-session"
if getent passwd "$SESSION_ACCOUNT" >/dev/null 2>&1; then
    step_done "session account $SESSION_ACCOUNT present (skipped)"
elif [ "$(id -u)" = 0 ]; then
    useradd --system --user-group --no-create-home --home-dir /nonexistent \
        --shell /usr/sbin/nologin "$SESSION_ACCOUNT"
    step_done "session account $SESSION_ACCOUNT created"
fi

# ---------------------------------------------------------------------------------------------------------
# 5. (--test) the programs of the app launchers (server_ext/apps.py), for their tests: TensorBoard and
#    MLflow in a venv of their own (their many dependencies never meet the project's), code-server from npm
#    with the node major it requires (node@24, also from npm). Only `apps/bin` goes on a PATH: it holds
#    these three programs and nothing else of the venv.
#    They share nothing with steps 2-4: both installs run in the background from the start (about 90 s
#    of the ~170 s a fresh setup takes), each with its own log, and the end of this script waits for them.
# ---------------------------------------------------------------------------------------------------------
APPS="$TOOLS/apps"
APPS_PY_SPEC="tensorboard mlflow"
APPS_NODE_SPEC="node@24"
APPS_CODE_SERVER_SPEC="code-server@4"

apps_python() {
    if [ -x "$APPS/venv/bin/tensorboard" ] && [ -x "$APPS/venv/bin/mlflow" ] \
        && [ "$(cat "$APPS/venv/.labfleet-spec" 2>/dev/null)" = "$APPS_PY_SPEC" ]; then
        step_done "apps: $APPS_PY_SPEC present (skipped)"
    else
        rm -rf "$APPS/venv"
        "$SYSTEM_PYTHON" -m venv "$APPS/venv"
        "$APPS/venv/bin/python" -m pip install -q --progress-bar off --upgrade pip </dev/null
        # shellcheck disable=SC2086 # one word per package
        "$APPS/venv/bin/python" -m pip install -q --progress-bar off $APPS_PY_SPEC </dev/null
        echo "$APPS_PY_SPEC" >"$APPS/venv/.labfleet-spec"
        step_done "apps: installed $APPS_PY_SPEC into $APPS/venv"
    fi
    ln -sfn ../venv/bin/tensorboard "$APPS/bin/tensorboard"
    ln -sfn ../venv/bin/mlflow "$APPS/bin/mlflow"
}

apps_code_server() {
    apps_node() { "$APPS/node/node_modules/.bin/node" "$@" 2>/dev/null; }
    if [ "$(apps_node -p 'process.versions.node.split(".")[0]')" = "${APPS_NODE_SPEC#node@}" ]; then
        step_done "apps: node $(apps_node --version) present (skipped)"
    else
        rm -rf "$APPS/node"
        npm install --prefix "$APPS/node" --no-audit --no-fund --no-update-notifier --loglevel=error \
            "$APPS_NODE_SPEC" </dev/null
        apps_node --version >/dev/null || die "node from npm ($APPS_NODE_SPEC) does not run"
        step_done "apps: installed node $(apps_node --version)"
    fi
    # The node release with its headers (node-gyp builds code-server's native modules against them).
    APPS_NODE_BIN="$(apps_node -p process.execPath)"
    APPS_NODE_DIR="$(dirname "$(dirname "$(dirname "$(find "$APPS/node/node_modules" \
        -path '*/include/node/node_api.h' | head -n1)")")")"

    CODE_SERVER_JS="$APPS/code-server/node_modules/code-server/out/node/entry.js"
    # Any run of code-server writes a config file: keep it out of the installing user's home.
    code_server() { XDG_CONFIG_HOME="$APPS/code-server/.config" "$APPS_NODE_BIN" "$CODE_SERVER_JS" "$@"; }
    if [ -f "$CODE_SERVER_JS" ] && code_server --version >/dev/null 2>&1; then
        step_done "apps: code-server present (skipped)"
    else
        rm -rf "$APPS/code-server"
        # The nested npm install of its postinstall must run on node 24 too: that node first on PATH.
        # --unsafe-perm: as root, npm would otherwise run that postinstall as nobody, which fails.
        PATH="$(dirname "$APPS_NODE_BIN"):$PATH" npm_config_nodedir="$APPS_NODE_DIR" \
            npm install --prefix "$APPS/code-server" --unsafe-perm --no-audit --no-fund \
            --no-update-notifier --loglevel=error "$APPS_CODE_SERVER_SPEC" </dev/null
        code_server --version >/dev/null || die "code-server did not install"
        step_done "apps: installed code-server $(code_server --version | head -n1)"
    fi
    # code-server's own launcher runs `node` from PATH; this one runs it on the node it was built for.
    printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$APPS_NODE_BIN" "$CODE_SERVER_JS" >"$APPS/bin/code-server"
    chmod 0755 "$APPS/bin/code-server"
}

declare -A APPS_JOBS=()
if [ "$WITH_TEST" = 1 ]; then
    mkdir -p "$APPS/bin"
    for job in apps_python apps_code_server; do
        ( "$job" ) >"$APPS/$job.log" 2>&1 &
        APPS_JOBS[$job]=$!
    done
fi
# Waits for the background installs of step 5; a failed one prints its log and fails the setup.
wait_for_apps() {
    local job rc
    for job in "${!APPS_JOBS[@]}"; do
        rc=0
        wait "${APPS_JOBS[$job]}" || rc=$?
        if [ "$rc" -ne 0 ]; then
            cat "$APPS/$job.log" >&2
            die "$job failed (exit $rc): its output is above"
        fi
        grep '^\[setup\]' "$APPS/$job.log" || true
    done
}

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
LABEXT_SRC="$REPO/labextension"
LABEXT_BUILD="$LABEXT_SRC/build"
LABEXT_LINK="$VENV/share/jupyter/labextensions/@labfleet/labextension"
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
    # Step 3b builds and links the JupyterLab extension, not pip's build hook; and pip must not write or
    # remove files through that link (they would land in labextension/build).
    [ -L "$LABEXT_LINK" ] && rm -f "$LABEXT_LINK"
    (cd "$REPO" && SKIP_JUPYTER_BUILDER=1 "$VENV/bin/python" -m pip install --progress-bar off -e "$SPEC" </dev/null)
    stamp_hash "$EXTRAS" >"$(stamp_file "$EXTRAS")"
    step_done "pip: installed -e '$SPEC'"
fi

# ---------------------------------------------------------------------------------------------------------
# 3b. The JupyterLab extension (labextension/): `jlpm install` and `jlpm build:prod` when its sources changed
#     (stamp: a hash of src, style, schema, package.json, yarn.lock and the build configs), then a link
#     from the venv's share/jupyter/labextensions/@labfleet/labextension to labextension/build, so a rebuild
#     shows at the next page load (a wheel install copies the build there instead).
#     LABFLEET_SETUP_FORCE_LABEXT=1 rebuilds even if the stamp matches.
# ---------------------------------------------------------------------------------------------------------
labext_hash() {
    (
        cd "$LABEXT_SRC" || exit 1
        find src style schema -type f -not -path 'src/__tests__/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
        sha256sum package.json yarn.lock .yarnrc.yml install.json tsconfig.json
    ) | sha256sum | cut -d' ' -f1
}
LABEXT_STAMP="$VENV/.labfleet-labext-stamp"
labext_want="$(labext_hash)" || die "cannot read the sources in $LABEXT_SRC"
if [ "${LABFLEET_SETUP_FORCE_LABEXT:-0}" != 1 ] && [ -f "$LABEXT_BUILD/package.json" ] \
    && [ "$(cat "$LABEXT_STAMP" 2>/dev/null)" = "$labext_want" ]; then
    step_done "labextension: build up to date with its sources (skipped)"
else
    [ -x "$VENV/bin/jlpm" ] || die "$VENV/bin/jlpm is missing (it comes with jupyterlab, from the pip step)"
    rm -f "$LABEXT_STAMP"
    (cd "$LABEXT_SRC" && PATH="$VENV/bin:$PATH" jlpm install </dev/null \
        && PATH="$VENV/bin:$PATH" jlpm build:prod </dev/null) || die "the JupyterLab extension did not build"
    [ -f "$LABEXT_BUILD/package.json" ] || die "the build left no $LABEXT_BUILD/package.json"
    echo "$labext_want" >"$LABEXT_STAMP"
    step_done "labextension: built (jlpm install + build:prod)"
fi
if [ "$(readlink "$LABEXT_LINK" 2>/dev/null)" = "$LABEXT_BUILD" ]; then
    step_done "labextension: linked into the venv (skipped)"
else
    mkdir -p "$(dirname "$LABEXT_LINK")"
    rm -rf "$LABEXT_LINK"
    ln -s "$LABEXT_BUILD" "$LABEXT_LINK"
    step_done "labextension: linked $LABEXT_LINK"
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

wait_for_apps

awk -v a="$T_START" -v b="$(now)" -v t="$WITH_TEST" \
    'BEGIN { printf "[setup] done (%s) in %.1fs. Use it: source scripts/env.sh\n", (t == 1 ? "runtime + test" : "runtime"), b - a }'
