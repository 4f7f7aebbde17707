#!/usr/bin/env bash
# Make sure a Docker engine answers: idempotent, safe to re-run, no stdin needed (CI).
#
#   bash scripts/docker.sh            # start (if needed)
#   bash scripts/docker.sh --stop     # stop the dockerd this script started (nothing else); idempotent
#
# 1. `docker info` answers: nothing to do.
# 2. No dockerd: install Debian's docker.io (as root, or with passwordless sudo).
# 3. Start dockerd in the background with no bridge and no iptables rules (this workplace sends test
#    traffic to 127.0.0.1 only: sessions use host networking), log and pidfile under
#    <repo>/.labfleet-tools/, and wait for `docker info` (bounded). Who started it is written to
#    <repo>/.labfleet-tools/dockerd.owner ($LABFLEET_DOCKER_OWNER: scripts/test sets it, and at its end
#    stops the engine only if the owner is its own run).
#
# Environment knobs:
#   LABFLEET_DOCKER_WAIT=60      seconds to wait for the engine to answer (and, with --stop, to exit)
#   LABFLEET_DOCKERD_ARGS=...    extra dockerd arguments (added after the defaults)
#   LABFLEET_DOCKER_OWNER=...    recorded as the starter of a dockerd this run starts
# Exits non-zero with the reason when no engine answers.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$REPO/.labfleet-tools"
LOG="$TOOLS/dockerd.log"
PIDFILE="$TOOLS/dockerd.pid"
OWNERFILE="$TOOLS/dockerd.owner"
WAIT="${LABFLEET_DOCKER_WAIT:-60}"
STOP=0
for arg in "$@"; do
    case "$arg" in
        --stop) STOP=1 ;;
        -h | --help) sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "docker.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

say() { echo "[docker] $*"; }
die() {
    echo "[docker] ERROR: $*" >&2
    exit 1
}

as_root() {
    if [ "$(id -u)" = 0 ]; then
        "$@"
    elif command -v sudo >/dev/null 2>&1; then
        sudo -n "$@" || die "need root for: $* (run as root, or allow passwordless sudo)"
    else
        die "need root for: $* (run as root)"
    fi
}

engine_answers() { docker info >/dev/null 2>&1 </dev/null; }

running_pid() { # the pid of a dockerd this script started that still runs
    local pid
    [ -f "$PIDFILE" ] || return 1
    pid="$(cat "$PIDFILE" 2>/dev/null)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] || return 1
    echo "$pid"
}

if [ "$STOP" = 1 ]; then
    # --- stop: only the dockerd whose pidfile is ours; nothing running is fine -----------------------
    if ! pid="$(running_pid)"; then
        rm -f "$OWNERFILE"
        say "no dockerd started by scripts/docker.sh runs (nothing to stop)"
        exit 0
    fi
    say "stopping dockerd (pid $pid)"
    as_root kill -TERM "$pid" 2>/dev/null || true
    deadline=$((SECONDS + WAIT))
    while kill -0 "$pid" 2>/dev/null; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            say "dockerd (pid $pid) still runs after ${WAIT}s: killing it"
            as_root kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.2
    done
    rm -f "$OWNERFILE"
    say "dockerd stopped"
    exit 0
fi

if command -v docker >/dev/null 2>&1 && engine_answers; then
    say "engine answers (nothing to do)"
    exit 0
fi

mkdir -p "$TOOLS"
# One starter at a time (several test runs may call this side by side).
exec 8>"$TOOLS/.docker.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w "$((WAIT + 300))" 8 || die "another scripts/docker.sh holds $TOOLS/.docker.lock"
fi
if command -v docker >/dev/null 2>&1 && engine_answers; then
    say "engine answers (started by another run)"
    exit 0
fi

# --- install -------------------------------------------------------------------------------------------
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    command -v apt-get >/dev/null 2>&1 || die "no dockerd and no apt-get to install docker.io (Debian 12 expected)"
    say "installing docker.io"
    apt_install() {
        as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
            -o Dpkg::Options::=--force-confdef -o Dpkg::Options::=--force-confold docker.io </dev/null
    }
    if ! apt_install; then
        # The package lists may be missing or stale: refresh them once and retry.
        as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q </dev/null
        apt_install || die "apt-get could not install docker.io"
    fi
    hash -r
    command -v dockerd >/dev/null 2>&1 || die "docker.io is installed but dockerd is not on PATH"
    command -v docker >/dev/null 2>&1 || die "docker.io is installed but the docker client is not on PATH"
fi

# --- start ---------------------------------------------------------------------------------------------
if [ -n "${DOCKER_HOST:-}" ] && [ "${DOCKER_HOST#unix://}" = "$DOCKER_HOST" ]; then
    die "DOCKER_HOST=$DOCKER_HOST does not answer and is not a local socket: start that engine yourself"
fi

if pid="$(running_pid)"; then
    say "dockerd (pid $pid) is starting; waiting for it"
    starter=""
else
    # A daemon that died uncleanly leaves its pidfile behind, and dockerd refuses to start over a pidfile
    # whose pid now belongs to another process; ours is ours alone, remove it.
    rm -f "$PIDFILE"
    # shellcheck disable=SC2206
    extra=(${LABFLEET_DOCKERD_ARGS:-})
    say "starting dockerd --bridge=none --iptables=false --ip-masq=false (log: $LOG)"
    {
        echo "=== $(date -u +%FT%TZ) scripts/docker.sh starts dockerd"
    } >>"$LOG"
    # Who started it: scripts/test stops it at its end only when this is its own run's mark.
    printf '%s\n' "${LABFLEET_DOCKER_OWNER:-}" >"$OWNERFILE"
    # The lock fds (8: ours; 7, 9: build-image.sh and setup.sh, when they call this) are closed for the
    # daemon: it must not hold a lock for its whole life.
    as_root setsid nohup dockerd --bridge=none --iptables=false --ip-masq=false \
        --pidfile="$PIDFILE" "${extra[@]}" </dev/null >>"$LOG" 2>&1 7>&- 8>&- 9>&- &
    starter=$!
fi

deadline=$((SECONDS + WAIT))
while ! engine_answers; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "[docker] last lines of $LOG:" >&2
        tail -n 30 "$LOG" >&2 || true
        die "the Docker engine did not answer within ${WAIT}s (see $LOG)"
    fi
    # The daemon we started (or found starting) is gone: it will not answer.
    if { [ -n "$starter" ] && ! kill -0 "$starter" 2>/dev/null; } || { [ -z "$starter" ] && ! running_pid >/dev/null; }; then
        echo "[docker] last lines of $LOG:" >&2
        tail -n 30 "$LOG" >&2 || true
        die "dockerd exited before answering (see $LOG)"
    fi
    sleep 0.5
done
say "engine answers: $(docker version --format 'server {{.Server.Version}}, API {{.Server.APIVersion}}' 2>/dev/null </dev/null || echo '?')"
