# Local PostgreSQL and Redis for the idempotency-store contract tests. Sourced, not run:
#   source scripts/services.sh; ensure_postgres; ensure_redis
# Each function installs the Debian package when missing, starts a private server on a port
# of its own (so it never collides with a system service), skips whatever already runs, and
# exports the URL the tests read (KWORKERS_PG_DSN, KWORKERS_REDIS_URL); a URL already set that
# answers is used as it is (an external server). Expects to run as root;
# PostgreSQL itself runs as user postgres because it refuses to run as root.

KW_PG_PORT=${KW_PG_PORT:-55432}
KW_PG_HOME=${KW_PG_HOME:-/var/tmp/kworkers-pg}
KW_REDIS_PORT=${KW_REDIS_PORT:-56379}

_kw_say() { printf '[kworkers setup] %s\n' "$*" >&2; }

# apt-get install the packages that are not installed yet; `apt-get update` only once per machine.
_kw_apt_install() {
  local missing=() pkg
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  _kw_say "installing Debian packages: ${missing[*]}"
  if [ ! -f /var/lib/apt/periodic/kworkers-updated ]; then
    apt-get update -qq >&2 && mkdir -p /var/lib/apt/periodic \
      && touch /var/lib/apt/periodic/kworkers-updated
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
}

# Run a command as user postgres from a directory it can read (runuser, else su).
_kw_as_postgres() {
  if command -v runuser >/dev/null 2>&1; then
    (cd / && runuser -u postgres -- "$@")
  else
    (cd / && su postgres -s /bin/sh -c "$(printf '%q ' "$@")")
  fi
}

# The newest installed server's bin directory (/usr/lib/postgresql/<major>/bin), or nothing.
_kw_pg_bindir() {
  local d
  d=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  [ -n "$d" ] && [ -x "$d/pg_ctl" ] && printf '%s\n' "$d"
  return 0
}

ensure_postgres() {
  local bindir data log
  if [ -n "${KWORKERS_PG_DSN:-}" ] && command -v psql >/dev/null 2>&1 \
      && psql "$KWORKERS_PG_DSN" -tAc 'SELECT 1' >/dev/null 2>&1; then
    _kw_say "using the PostgreSQL at KWORKERS_PG_DSN=$KWORKERS_PG_DSN"
    return 0
  fi
  bindir=$(_kw_pg_bindir)
  if [ -z "$bindir" ]; then
    _kw_apt_install postgresql || { _kw_say "could not install postgresql"; return 1; }
    bindir=$(_kw_pg_bindir)
    [ -n "$bindir" ] || { _kw_say "postgresql installed but no /usr/lib/postgresql/*/bin"; return 1; }
  fi
  data="$KW_PG_HOME/data"
  log="$KW_PG_HOME/postgres.log"
  export KWORKERS_PG_DSN="postgresql://postgres@127.0.0.1:$KW_PG_PORT/kworkers"

  if "$bindir/pg_isready" -q -h 127.0.0.1 -p "$KW_PG_PORT"; then
    _kw_say "PostgreSQL already runs on 127.0.0.1:$KW_PG_PORT"
  else
    if [ ! -f "$data/PG_VERSION" ]; then
      _kw_say "initdb $data (trust auth on loopback)"
      mkdir -p "$KW_PG_HOME"
      chown postgres:postgres "$KW_PG_HOME"
      _kw_as_postgres "$bindir/initdb" -D "$data" -U postgres --encoding=UTF8 \
        --auth-local=trust --auth-host=trust >/dev/null \
        || { _kw_say "initdb failed"; return 1; }
    fi
    _kw_say "starting PostgreSQL on 127.0.0.1:$KW_PG_PORT (log: $log)"
    # The socket goes to our own directory: /var/run/postgresql may not exist in a container.
    _kw_as_postgres "$bindir/pg_ctl" -D "$data" -l "$log" -w -t 60 start \
      -o "-c listen_addresses=127.0.0.1 -p $KW_PG_PORT -k $KW_PG_HOME" >/dev/null \
      || { _kw_say "PostgreSQL did not start; see $log"; return 1; }
  fi

  if [ "$("$bindir/psql" -h 127.0.0.1 -p "$KW_PG_PORT" -U postgres -d postgres -tAc \
        "SELECT 1 FROM pg_database WHERE datname = 'kworkers'")" != 1 ]; then
    _kw_say "creating database kworkers"
    "$bindir/createdb" -h 127.0.0.1 -p "$KW_PG_PORT" -U postgres kworkers \
      || { _kw_say "createdb kworkers failed"; return 1; }
  fi
  _kw_say "KWORKERS_PG_DSN=$KWORKERS_PG_DSN"
}

_kw_redis_up() {
  command -v redis-cli >/dev/null 2>&1 \
    && [ "$(redis-cli -h 127.0.0.1 -p "$KW_REDIS_PORT" ping 2>/dev/null)" = PONG ]
}

ensure_redis() {
  if [ -n "${KWORKERS_REDIS_URL:-}" ] && command -v redis-cli >/dev/null 2>&1 \
      && [ "$(redis-cli -u "$KWORKERS_REDIS_URL" ping 2>/dev/null)" = PONG ]; then
    _kw_say "using the Redis at KWORKERS_REDIS_URL=$KWORKERS_REDIS_URL"
    return 0
  fi
  export KWORKERS_REDIS_URL="redis://127.0.0.1:$KW_REDIS_PORT/0"
  command -v redis-server >/dev/null 2>&1 || _kw_apt_install redis-server \
    || { _kw_say "could not install redis-server"; return 1; }
  if _kw_redis_up; then
    _kw_say "Redis already runs on 127.0.0.1:$KW_REDIS_PORT"
  else
    _kw_say "starting Redis on 127.0.0.1:$KW_REDIS_PORT (no persistence)"
    redis-server --port "$KW_REDIS_PORT" --bind 127.0.0.1 --daemonize yes --save "" \
      --dir /var/tmp --logfile "/var/tmp/kworkers-redis-$KW_REDIS_PORT.log" >/dev/null \
      || { _kw_say "redis-server failed to start"; return 1; }
    local _i
    for _i in $(seq 1 50); do _kw_redis_up && break; sleep 0.1; done
    _kw_redis_up || { _kw_say "Redis did not answer PING on port $KW_REDIS_PORT"; return 1; }
  fi
  _kw_say "KWORKERS_REDIS_URL=$KWORKERS_REDIS_URL"
}
