#!/usr/bin/env bash
# The fleet's image registry: Debian's docker-registry (the distribution registry 2.x), where the
# labfleet service pushes the environments it builds ("My Environments") and every node pulls them.
# Idempotent, no stdin needed (CI). Tests start their own on a port they pick.
#
#   bash scripts/registry.sh --addr IP --port PORT --state DIR [--start]   # make sure it answers
#   bash scripts/registry.sh --addr IP --port PORT --state DIR --stop      # stop it, forget its CA
#
# It serves HTTPS with a certificate made here for IP (openssl, self-signed, kept in DIR), which the
# Docker engines of this machine trust through /etc/docker/certs.d/IP:PORT/ca.crt (read at each pull
# and push: no engine restart; engine 2 of scripts/swarm.sh reads the same file). Its images are
# under DIR/data; its log is DIR/registry.log. On success it prints LABFLEET_ENVIRONMENT_REGISTRY=IP:PORT
# (the service's setting). Exits non-zero with the reason when it cannot answer.
set -euo pipefail

ADDR=""
PORT=""
STATE=""
MODE=start
while [ $# -gt 0 ]; do
    case "$1" in
        --addr) ADDR="$2"; shift 2 ;;
        --port) PORT="$2"; shift 2 ;;
        --state) STATE="$2"; shift 2 ;;
        --start) MODE=start; shift ;;
        --stop) MODE=stop; shift ;;
        -h | --help) sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "registry.sh: unknown argument: $1 (try --help)" >&2; exit 2 ;;
    esac
done
die() { echo "registry.sh: $*" >&2; exit 1; }
[ -n "$ADDR" ] && [ -n "$PORT" ] && [ -n "$STATE" ] || die "--addr, --port and --state are needed (try --help)"
case "$PORT" in *[!0-9]*) die "--port must be a number, not $PORT" ;; esac
CERTS="/etc/docker/certs.d/$ADDR:$PORT"
PIDFILE="$STATE/registry.pid"

running() { [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; }

if [ "$MODE" = stop ]; then
    if running; then
        kill "$(cat "$PIDFILE")" || true
        for _ in $(seq 50); do running || break; sleep 0.1; done
    fi
    rm -f "$PIDFILE"
    rm -rf "$CERTS"
    exit 0
fi

command -v docker-registry >/dev/null 2>&1 || die "docker-registry is not installed (bash scripts/setup.sh --test installs it; or apt-get install docker-registry)"
command -v openssl >/dev/null 2>&1 || die "openssl is not installed"
mkdir -p "$STATE/data"
if [ ! -s "$STATE/cert.pem" ] || ! openssl x509 -in "$STATE/cert.pem" -noout -ext subjectAltName 2>/dev/null | grep -q "IP Address:$ADDR\$"; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=labfleet registry $ADDR" \
        -addext "subjectAltName=IP:$ADDR" -addext "basicConstraints=critical,CA:TRUE" \
        -keyout "$STATE/key.pem" -out "$STATE/cert.pem" 2>/dev/null || die "openssl could not make a certificate"
fi
mkdir -p "$CERTS"
cp "$STATE/cert.pem" "$CERTS/ca.crt"
cat > "$STATE/config.yml" <<YAML
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $STATE/data
  delete:
    enabled: true
http:
  addr: $ADDR:$PORT
  tls:
    certificate: $STATE/cert.pem
    key: $STATE/key.pem
YAML
answers() { curl -fsS --max-time 2 --cacert "$STATE/cert.pem" "https://$ADDR:$PORT/v2/" >/dev/null 2>&1; }
if ! running || ! answers; then
    running && kill "$(cat "$PIDFILE")" 2>/dev/null || true
    setsid docker-registry serve "$STATE/config.yml" </dev/null >>"$STATE/registry.log" 2>&1 &
    echo $! >"$PIDFILE"
    for _ in $(seq 100); do answers && break; sleep 0.1; done
    answers || die "the registry does not answer at https://$ADDR:$PORT/v2/ (its log: $STATE/registry.log)"
fi
echo "LABFLEET_ENVIRONMENT_REGISTRY=$ADDR:$PORT"
