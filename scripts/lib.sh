# Shared set-up for scripts/test and scripts/demo: everything a fresh Debian machine needs, each
# step skipped when already done. Sourced, not run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV="$ROOT/.venv"
PY="$VENV/bin/python"
KAFKA_VERSION=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$ROOT/deploy/images/kafka/pom.xml")
OFFICIAL_IMAGE="apache/kafka:$KAFKA_VERSION"
LOCAL_IMAGE="kworkers/kafka:$KAFKA_VERSION-local"
export TESTCONTAINERS_RYUK_DISABLED=true

say() { printf '\033[1m[kworkers setup]\033[0m %s\n' "$*" >&2; }

apt_install() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  say "installing Debian packages: ${missing[*]}"
  if [ ! -f /var/lib/apt/periodic/kworkers-updated ]; then
    apt-get update -qq >&2 && mkdir -p /var/lib/apt/periodic && touch /var/lib/apt/periodic/kworkers-updated
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
}

ensure_python() {
  local stamp="$VENV/.kworkers-installed" want
  want=$(sha256sum "$ROOT/pyproject.toml" | cut -c1-16)
  if [ -x "$PY" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "Python environment .venv is up to date"
    return
  fi
  say "creating the Python environment in .venv (kworkers and its test dependencies)"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q -U pip >&2
  "$PY" -m pip install -q -e "$ROOT[test]" >&2
  echo "$want" > "$stamp"
}

docker_up() { timeout 10 docker info >/dev/null 2>&1; }

ensure_docker() {
  if docker_up; then say "Docker engine is running"; return 0; fi
  command -v dockerd >/dev/null 2>&1 || apt_install docker.io
  # A daemon killed earlier leaves pid files that make the next one refuse to start.
  for pidfile in /var/run/docker.pid /var/run/docker/containerd/containerd.pid; do
    if [ -f "$pidfile" ] && ! kill -0 "$(cat "$pidfile")" 2>/dev/null; then
      say "removing stale $pidfile"; rm -f "$pidfile"
    fi
  done
  say "starting dockerd --bridge=none (log: /var/log/kworkers-dockerd.log)"
  setsid nohup dockerd --bridge=none --iptables=false >/var/log/kworkers-dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do docker_up && { say "Docker engine is up"; return 0; }; sleep 1; done
  say "the Docker engine did not start; see /var/log/kworkers-dockerd.log"
  return 1
}

ensure_java_maven() {
  command -v java >/dev/null 2>&1 || apt_install openjdk-17-jre-headless
  command -v mvn >/dev/null 2>&1 || apt_install maven
}

# Sets KWORKERS_KAFKA_IMAGE (or KWORKERS_BROKER=process when no engine can run).
ensure_kafka() {
  if [ -n "${KWORKERS_BOOTSTRAP:-}" ]; then
    say "using the broker at KWORKERS_BOOTSTRAP=$KWORKERS_BOOTSTRAP"; return
  fi
  if [ "${KWORKERS_BROKER:-}" = process ] || ! ensure_docker; then
    say "no Docker engine: the broker runs as a local process from the same Kafka jars"
    ensure_java_maven
    "$ROOT/deploy/images/kafka/build" --jars-only >/dev/null
    export KWORKERS_BROKER=process
    return
  fi
  if [ -n "${KWORKERS_KAFKA_IMAGE:-}" ]; then
    say "using KWORKERS_KAFKA_IMAGE=$KWORKERS_KAFKA_IMAGE"; return
  fi
  if docker image inspect "$OFFICIAL_IMAGE" >/dev/null 2>&1; then
    export KWORKERS_KAFKA_IMAGE=$OFFICIAL_IMAGE
  elif docker image inspect "$LOCAL_IMAGE" >/dev/null 2>&1; then
    export KWORKERS_KAFKA_IMAGE=$("$ROOT/deploy/images/kafka/build")
  elif say "pulling $OFFICIAL_IMAGE" && timeout 60 docker pull -q "$OFFICIAL_IMAGE" >/dev/null 2>&1; then
    export KWORKERS_KAFKA_IMAGE=$OFFICIAL_IMAGE
  else
    say "no registry reachable: building $LOCAL_IMAGE from Debian packages and Maven Central jars"
    ensure_java_maven
    apt_install debootstrap
    export KWORKERS_KAFKA_IMAGE=$("$ROOT/deploy/images/kafka/build")
  fi
  say "Kafka image: $KWORKERS_KAFKA_IMAGE"
}

source "$ROOT/scripts/services.sh"

ensure_all() {
  ensure_python
  ensure_kafka
  # docker-compose.yml's end-to-end test needs a compose tool (Debian's docker-compose here)
  if docker_up && ! docker compose version >/dev/null 2>&1; then
    command -v docker-compose >/dev/null 2>&1 || apt_install docker-compose || true
  fi
}

# iproute2 for the network-partition fault test (network namespaces, veth pairs; needs root).
ensure_iproute() {
  command -v ip >/dev/null 2>&1 || apt_install iproute2
}

# Debian's Chromium for the console's browser tests (Playwright drives it by its path; it never
# downloads a browser of its own).
ensure_browser() {
  [ -x /usr/bin/chromium ] || apt_install chromium
}

# PostgreSQL and Redis for the idempotency-store tests (Debian packages, loopback only).
ensure_stores() {
  ensure_postgres
  ensure_redis
}
