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

LOCK="$ROOT/requirements/constraints.txt"

ensure_python() {
  local stamp="$VENV/.kworkers-installed" want
  want=$(cat "$ROOT/pyproject.toml" "$LOCK" | sha256sum | cut -c1-16)
  if [ -x "$PY" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "Python environment .venv is up to date"
    return
  fi
  say "creating the Python environment in .venv (kworkers and its test dependencies, locked)"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install -q -c "$LOCK" -U pip >&2
  "$PY" -m pip install -q -c "$LOCK" -e "$ROOT[test]" >&2
  echo "$want" > "$stamp"
}

# pip-audit over the lock (scripts/audit.py says what fails): under CI every run, elsewhere
# once a day per lock.
ensure_audit() {
  local stamp="$VENV/.kworkers-audited" want
  want="$(sha256sum "$LOCK" | cut -c1-16) $(date +%F)"
  if [ -z "${KWORKERS_CI:-}" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
    say "dependency audit: done today for this lock"
    return
  fi
  say "dependency audit (pip-audit over requirements/constraints.txt)"
  "$PY" "$ROOT/scripts/audit.py" && echo "$want" > "$stamp"
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

# Sets KWORKERS_REGISTRY_IMAGE (or KWORKERS_REGISTRY=process when the broker runs as a process):
# Apicurio Registry, the Confluent-compatible schema registry the payload tests decode through.
# Built from Maven Central and PyPI by deploy/images/registry/build, skipped when up to date.
ensure_registry() {
  if [ -n "${KWORKERS_SCHEMA_REGISTRY_URL:-}" ]; then
    say "using the schema registry at KWORKERS_SCHEMA_REGISTRY_URL=$KWORKERS_SCHEMA_REGISTRY_URL"
    return
  fi
  command -v mvn >/dev/null 2>&1 || ensure_java_maven
  if [ "${KWORKERS_BROKER:-}" = process ] || [ "${KWORKERS_REGISTRY:-}" = process ] \
      || ! docker_up; then
    say "no Docker engine: the schema registry runs as a local process"
    KWORKERS_PYTHON="$PY" "$ROOT/deploy/images/registry/build" --home-only >/dev/null
    export KWORKERS_REGISTRY=process
    return
  fi
  if [ -n "${KWORKERS_REGISTRY_IMAGE:-}" ]; then
    say "using KWORKERS_REGISTRY_IMAGE=$KWORKERS_REGISTRY_IMAGE"; return
  fi
  command -v debootstrap >/dev/null 2>&1 || apt_install debootstrap  # the shared Debian base
  local image
  image=$(KWORKERS_PYTHON="$PY" "$ROOT/deploy/images/registry/build")
  export KWORKERS_REGISTRY_IMAGE=$image
  say "schema registry image: $KWORKERS_REGISTRY_IMAGE"
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

# KEDA's own Kafka scaler as a program the autoscaling tests drive (deploy/keda/scaler-probe),
# and KEDA's CRDs from the same module (the rendered ScaledObjects are validated against them).
# Built once per machine into ~/.cache/kworkers/keda-probe-<hash of its go.mod, go.sum and
# source> (minutes the first time, a ~125 MB binary; never in the clone). Needs Go >= 1.24.7
# (/usr/local/go or PATH) and the Go module proxy. Where it cannot be built this says why and
# carries on: the tests that need it fail under CI (kworkers.testing.keda_probe).
KEDA_PROBE_SRC="$ROOT/deploy/keda/scaler-probe"
keda_probe_dir() {
  local hash
  hash=$(cat "$KEDA_PROBE_SRC/go.mod" "$KEDA_PROBE_SRC/go.sum" "$KEDA_PROBE_SRC/main.go" \
    | sha256sum | cut -c1-16)
  echo "${XDG_CACHE_HOME:-$HOME/.cache}/kworkers/keda-probe-$hash"
}
ensure_keda_probe() {
  local dir go moddir
  dir=$(keda_probe_dir)
  if [ -x "$dir/keda-scaler-probe" ] && [ -f "$dir/crds/keda.sh_scaledobjects.yaml" ]; then
    say "KEDA scaler probe: $dir"
  else
    go=$(command -v go || echo /usr/local/go/bin/go)
    if [ ! -x "$go" ]; then
      say "no Go toolchain: the KEDA scaler probe cannot be built (its tests fail under CI)"
      return 0
    fi
    say "building KEDA's Kafka scaler probe into $dir (minutes, once per machine)"
    mkdir -p "$dir.tmp/crds"
    if ! (cd "$KEDA_PROBE_SRC" && "$go" build -trimpath \
          -o "$dir.tmp/keda-scaler-probe" .) >&2; then
      say "the KEDA scaler probe did not build (its tests fail under CI)"
      rm -rf "$dir.tmp"; return 0
    fi
    moddir=$(cd "$KEDA_PROBE_SRC" && "$go" list -m -f '{{.Dir}}' github.com/kedacore/keda/v2)
    cp "$moddir/config/crd/bases/keda.sh_scaledobjects.yaml" \
       "$moddir/config/crd/bases/keda.sh_triggerauthentications.yaml" "$dir.tmp/crds/"
    chmod -R u+w "$dir.tmp"
    rm -rf "$dir"; mv "$dir.tmp" "$dir"
  fi
  export KWORKERS_KEDA_PROBE="$dir/keda-scaler-probe" KWORKERS_KEDA_CRDS="$dir/crds"
}

# Debian's Prometheus for the autoscaling tests: each test runs its own server (its own
# scrape targets, a temporary data directory), never the packaged service.
ensure_prometheus() {
  command -v prometheus >/dev/null 2>&1 || apt_install prometheus
}
