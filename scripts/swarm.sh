#!/usr/bin/env bash
# Two real Docker Swarm nodes on this one machine: idempotent, safe to re-run, no stdin needed (CI).
#
#   bash scripts/swarm.sh [--start]     # make sure both nodes are Ready (start what is missing)
#   bash scripts/swarm.sh --stop        # leave the swarm on both engines, stop engine 2, remove netns + veth
#   bash scripts/swarm.sh --env         # print where things are (KEY=value lines), start nothing
#
# Node 1 is the main engine (scripts/docker.sh starts it), the swarm's manager, advertised on $ADDR1.
# Node 2 is a second dockerd inside the network namespace $NETNS, reached from the root namespace
# through a veth pair ($VETH1 = $ADDR1 here, $VETH2 = $ADDR2 there). It is started with
# `nsenter --net=/var/run/netns/$NETNS dockerd --bridge=none --iptables=false ...` (not `ip netns exec`,
# which remounts /sys and then dockerd fails with "Devices cgroup isn't mounted"), its data, exec root,
# socket, pidfile and log under $STATE. It joins the swarm as a worker; the images named in
# $LABFLEET_SWARM_IMAGES that engine 1 has are copied into it (`docker save | docker load`) when they differ.
# Test traffic goes only to 127.0.0.1, $ADDR1 and $ADDR2; sessions use host networking (no overlay, no
# ingress: this kernel has no IPVS, and Swarm's own networks get no traffic from labfleet).
# --stop only undoes what this script made: a swarm on engine 1 advertised elsewhere is left alone.
# Engine 2's data root (its copy of the images, about 0.8 GB) stays for the next start: rm -rf $STATE.
# Who started it is written to $STATE/owner ($LABFLEET_DOCKER_OWNER, as scripts/docker.sh does).
#
# Environment knobs (defaults in brackets):
#   LABFLEET_SWARM_NETNS [lfswarm2]           the network namespace of node 2
#   LABFLEET_SWARM_ADDR1 [10.77.0.1]          node 1's address (root namespace side of the veth)
#   LABFLEET_SWARM_ADDR2 [10.77.0.2]          node 2's address (inside the namespace)
#   LABFLEET_SWARM_PREFIX [30]                the veth's prefix length
#   LABFLEET_SWARM_VETH [lfsw]                veth names: <VETH>0 (root side), <VETH>1 (namespace side)
#   LABFLEET_SWARM_STATE [<repo>/.labfleet-tools/swarm2]   engine 2's files
#   LABFLEET_SWARM_IMAGES [labfleet/singleuser:test]       images node 2 gets from node 1 (space separated)
#   LABFLEET_SWARM_WAIT [60]                  seconds to wait for an engine or a node
# Exits non-zero with the reason when a node cannot be made Ready.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$REPO/.labfleet-tools"
NETNS="${LABFLEET_SWARM_NETNS:-lfswarm2}"
ADDR1="${LABFLEET_SWARM_ADDR1:-10.77.0.1}"
ADDR2="${LABFLEET_SWARM_ADDR2:-10.77.0.2}"
PREFIX="${LABFLEET_SWARM_PREFIX:-30}"
VETH="${LABFLEET_SWARM_VETH:-lfsw}"
VETH1="${VETH}0"
VETH2="${VETH}1"
STATE="${LABFLEET_SWARM_STATE:-$TOOLS/swarm2}"
IMAGES="${LABFLEET_SWARM_IMAGES-labfleet/singleuser:test}"
WAIT="${LABFLEET_SWARM_WAIT:-60}"
SOCK2="$STATE/docker.sock"
PID2="$STATE/dockerd.pid"
LOG2="$STATE/dockerd.log"
DATA2="$STATE/data"
# containerd's sockets live under the exec root: keep it short (unix socket paths are limited to 108 bytes)
EXEC2="/run/labfleet-$NETNS"
OWNERFILE="$STATE/owner"
MODE=start
for arg in "$@"; do
    case "$arg" in
        --start) MODE=start ;;
        --stop) MODE=stop ;;
        --env) MODE=env ;;
        -h | --help) sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "swarm.sh: unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done
exec </dev/null

say() { echo "[swarm] $*"; }
die() {
    echo "[swarm] ERROR: $*" >&2
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

d1() { docker "$@"; }
d2() { docker -H "unix://$SOCK2" "$@"; }
engine2_answers() { [ -S "$SOCK2" ] && d2 info >/dev/null 2>&1; }
swarm_state() { "$@" info --format '{{.Swarm.LocalNodeState}}' 2>/dev/null || echo unknown; }
node_id() { "$@" info --format '{{.Swarm.NodeID}}' 2>/dev/null || true; }
netns_exists() { [ -e "/var/run/netns/$NETNS" ]; }
running_pid2() { # the pid of engine 2 when it still runs
    local pid
    [ -f "$PID2" ] || return 1
    pid="$(cat "$PID2" 2>/dev/null)"
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] || return 1
    echo "$pid"
}
print_env() {
    echo "LABFLEET_SWARM_NETNS=$NETNS"
    echo "LABFLEET_SWARM_ADDR1=$ADDR1"
    echo "LABFLEET_SWARM_ADDR2=$ADDR2"
    echo "LABFLEET_SWARM_SOCK2=$SOCK2"
    echo "LABFLEET_SWARM_NODE1_ID=$(node_id d1)"
    echo "LABFLEET_SWARM_NODE2_ID=$(node_id d2)"
}

if [ "$MODE" = env ]; then
    print_env
    exit 0
fi

mkdir -p "$TOOLS"
exec 8>"$TOOLS/.swarm.lock"
if command -v flock >/dev/null 2>&1; then
    flock -w "$((WAIT * 4 + 120))" 8 || die "another scripts/swarm.sh holds $TOOLS/.swarm.lock"
fi

if [ "$MODE" = stop ]; then
    # --- stop: node 2 leaves and stops, engine 1 leaves the swarm we made, the namespace goes -------------
    if engine2_answers; then
        if [ "$(swarm_state d2)" != inactive ]; then
            say "node 2 leaves the swarm"
            d2 swarm leave --force >/dev/null 2>&1 || say "node 2 could not leave the swarm (stopping it anyway)"
        fi
    fi
    if pid="$(running_pid2)"; then
        say "stopping engine 2 (pid $pid)"
        as_root kill -TERM "$pid" 2>/dev/null || true
        deadline=$((SECONDS + WAIT))
        while kill -0 "$pid" 2>/dev/null; do
            if [ "$SECONDS" -ge "$deadline" ]; then
                say "engine 2 (pid $pid) still runs after ${WAIT}s: killing it"
                as_root kill -KILL "$pid" 2>/dev/null || true
                break
            fi
            sleep 0.2
        done
    fi
    if command -v docker >/dev/null 2>&1 && d1 info >/dev/null 2>&1; then
        state1="$(swarm_state d1)"
        addr1="$(d1 info --format '{{.Swarm.NodeAddr}}' 2>/dev/null || true)"
        if [ "$state1" != inactive ] && [ "$addr1" = "$ADDR1" ]; then
            say "engine 1 leaves the swarm (advertised on $ADDR1)"
            d1 swarm leave --force >/dev/null || die "engine 1 could not leave the swarm"
        elif [ "$state1" != inactive ]; then
            say "engine 1 is in a swarm advertised on '$addr1', not $ADDR1: not ours, left alone"
        fi
    fi
    if netns_exists; then
        say "removing network namespace $NETNS"
        as_root ip netns del "$NETNS" || die "could not remove network namespace $NETNS"
    fi
    if ip link show "$VETH1" >/dev/null 2>&1; then
        as_root ip link del "$VETH1" || true
    fi
    # engine 2 bind-mounts its namespace files under its exec root, and its data root onto itself:
    # unmount them (deepest first), or the exec root cannot go and the checkout cannot be removed
    for m in $(awk -v a="$EXEC2" -v b="$DATA2" 'index($2, a) == 1 || index($2, b) == 1 { print $2 }' /proc/mounts | sort -r); do
        as_root umount -l "$m" 2>/dev/null || true
    done
    as_root rm -rf "$EXEC2" || say "could not remove $EXEC2 (left behind)"
    rm -f "$OWNERFILE" "$PID2"
    say "stopped: no engine 2, no namespace $NETNS, engine 1 out of our swarm"
    exit 0
fi

# --- start ---------------------------------------------------------------------------------------------
command -v nsenter >/dev/null 2>&1 || die "nsenter is missing (apt-get install util-linux)"
command -v ip >/dev/null 2>&1 || die "ip is missing (apt-get install iproute2)"
bash "$REPO/scripts/docker.sh" >/dev/null || die "no Docker engine (scripts/docker.sh failed: see above)"

# 1. the namespace and the veth pair
if ! netns_exists; then
    say "creating network namespace $NETNS"
    as_root ip netns add "$NETNS"
fi
if ! ip link show "$VETH1" >/dev/null 2>&1; then
    say "veth $VETH1 ($ADDR1/$PREFIX) <-> $VETH2 in $NETNS ($ADDR2/$PREFIX)"
    as_root ip link add "$VETH1" type veth peer name "$VETH2" netns "$NETNS"
fi
ip -o addr show dev "$VETH1" | grep -q " $ADDR1/" || as_root ip addr add "$ADDR1/$PREFIX" dev "$VETH1"
as_root ip link set "$VETH1" up
as_root ip -n "$NETNS" link set lo up
ip -n "$NETNS" -o addr show dev "$VETH2" | grep -q " $ADDR2/" || as_root ip -n "$NETNS" addr add "$ADDR2/$PREFIX" dev "$VETH2"
as_root ip -n "$NETNS" link set "$VETH2" up

# 2. engine 2 inside the namespace
mkdir -p "$STATE" "$DATA2"
if engine2_answers; then
    say "engine 2 answers ($SOCK2)"
else
    if pid="$(running_pid2)"; then
        say "engine 2 (pid $pid) is starting; waiting for it"
    else
        rm -f "$PID2" "$SOCK2"
        echo "=== $(date -u +%FT%TZ) scripts/swarm.sh starts engine 2 in $NETNS" >>"$LOG2"
        printf '%s\n' "${LABFLEET_DOCKER_OWNER:-}" >"$OWNERFILE"
        as_root setsid nohup nsenter "--net=/var/run/netns/$NETNS" dockerd --bridge=none --iptables=false \
            --ip-masq=false --ip6tables=false --data-root "$DATA2" --exec-root "$EXEC2" --pidfile "$PID2" \
            -H "unix://$SOCK2" </dev/null >>"$LOG2" 2>&1 7>&- 8>&- 9>&- &
    fi
    deadline=$((SECONDS + WAIT))
    while ! engine2_answers; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            tail -n 30 "$LOG2" >&2 || true
            die "engine 2 did not answer within ${WAIT}s (see $LOG2)"
        fi
        sleep 0.5
    done
    say "engine 2 answers ($SOCK2)"
fi

# 3. the swarm: engine 1 is its manager, advertised on ADDR1
state1="$(swarm_state d1)"
if [ "$state1" = inactive ]; then
    say "docker swarm init --advertise-addr $ADDR1 --listen-addr $ADDR1:2377"
    d1 swarm init --advertise-addr "$ADDR1" --listen-addr "$ADDR1:2377" >/dev/null \
        || die "docker swarm init failed on engine 1"
else
    addr1="$(d1 info --format '{{.Swarm.NodeAddr}}' 2>/dev/null || true)"
    manager="$(d1 info --format '{{.Swarm.ControlAvailable}}' 2>/dev/null || true)"
    [ "$state1" = active ] || die "engine 1's swarm state is '$state1' (run: bash scripts/swarm.sh --stop)"
    [ "$addr1" = "$ADDR1" ] || die "engine 1 is already in a swarm advertised on '$addr1', not $ADDR1: leave it first (docker swarm leave --force) or set LABFLEET_SWARM_ADDR1"
    [ "$manager" = true ] || die "engine 1 is in a swarm but not a manager"
fi
NODE1="$(node_id d1)"

# 4. engine 2 joins as a worker
state2="$(swarm_state d2)"
if [ "$state2" = active ] && ! d1 node inspect "$(node_id d2)" >/dev/null 2>&1; then
    say "engine 2 is in another swarm: it leaves it"
    d2 swarm leave --force >/dev/null 2>&1 || true
    state2="$(swarm_state d2)"
fi
if [ "$state2" != active ]; then
    [ "$state2" = inactive ] || d2 swarm leave --force >/dev/null 2>&1 || true
    token="$(d1 swarm join-token -q worker)"
    say "engine 2 joins the swarm at $ADDR1:2377 (advertised on $ADDR2)"
    d2 swarm join --token "$token" --advertise-addr "$ADDR2" --listen-addr "$ADDR2:2377" "$ADDR1:2377" >/dev/null \
        || die "engine 2 could not join the swarm at $ADDR1:2377"
fi
NODE2="$(node_id d2)"

# 5. both nodes Ready (nodes of earlier runs that are down are removed)
for stale in $(d1 node ls --format '{{.ID}} {{.Status}}' | awk '$2 == "Down" { print $1 }'); do
    [ "$stale" = "$NODE2" ] || d1 node rm --force "$stale" >/dev/null 2>&1 || true
done
deadline=$((SECONDS + WAIT))
while :; do
    s1="$(d1 node inspect -f '{{.Status.State}}' "$NODE1" 2>/dev/null || true)"
    s2="$(d1 node inspect -f '{{.Status.State}}' "$NODE2" 2>/dev/null || true)"
    [ "$s1" = ready ] && [ "$s2" = ready ] && break
    if [ "$SECONDS" -ge "$deadline" ]; then
        d1 node ls >&2 || true
        die "the nodes are not Ready within ${WAIT}s (node 1: '$s1', node 2: '$s2')"
    fi
    sleep 0.5
done
say "nodes Ready: $NODE1 ($ADDR1, manager), $NODE2 ($ADDR2, worker)"

# 6. images for node 2
for image in $IMAGES; do
    id1="$(d1 image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
    if [ -z "$id1" ]; then
        say "engine 1 has no image $image: not copied (build it first, e.g. bash scripts/build-image.sh)"
        continue
    fi
    id2="$(d2 image inspect -f '{{.Id}}' "$image" 2>/dev/null || true)"
    if [ "$id1" = "$id2" ]; then
        say "node 2 has $image"
    else
        t0=$SECONDS
        d1 save "$image" | d2 load >/dev/null || die "could not copy $image to node 2"
        say "copied $image to node 2 ($((SECONDS - t0))s)"
    fi
done
print_env | sed 's/^/[swarm] /'
