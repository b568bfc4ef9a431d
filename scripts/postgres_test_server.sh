#!/usr/bin/env bash
# A throwaway PostgreSQL server for the database tests (tests/db), on a machine without systemd: Debian's `postgresql`
# package (installed if missing), one private cluster in DIR started with pg_ctl, listening on 127.0.0.1:PORT and a
# socket in DIR, with a role and database "appliance" (password "appliance": the server is for tests only).
#
#   scripts/postgres_test_server.sh start [DIR] [PORT]   # prints the URL once the server answers
#   scripts/postgres_test_server.sh stop [DIR]
#
#   export APPLIANCE_TEST_PG_URL=$(scripts/postgres_test_server.sh start) && python -m pytest -q tests/db
#
# Durability is off (fsync, synchronous_commit): a crash may lose the cluster, which the tests never need to keep.
set -euo pipefail
cmd=${1:-}
dir=${2:-${TMPDIR:-/tmp}/appliance-test-postgres}
port=${3:-55432}  # not 5432: leave the default port to a system cluster
data=$dir/data
user=appliance

log() { echo "postgres_test_server: $*" >&2; }

# PostgreSQL refuses to run as root: as root, the cluster belongs to the package's `postgres` user.
as_owner() {
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

bin_dir() {  # the newest installed major version
  ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1
}

install() {
  [ -n "$(bin_dir)" ] && return
  [ "$(id -u)" = 0 ] || { log "PostgreSQL is not installed; run as root or 'apt-get install postgresql'"; exit 1; }
  log "installing the Debian postgresql package"
  # The package's own cluster (port 5432) cannot be started without an init system here; it stays unused.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
}

running() { [ -f "$data/PG_VERSION" ] && as_owner "$(bin_dir)/pg_ctl" -D "$data" status >/dev/null 2>&1; }

psql_admin() {  # over the socket, as the cluster's superuser
  as_owner "$(bin_dir)/psql" -h "$dir" -p "$port" -U postgres -d postgres -v ON_ERROR_STOP=1 -qtA "$@"
}

start() {
  install
  local bin
  bin=$(bin_dir)
  mkdir -p "$dir"
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  chmod 700 "$dir"  # the socket lives here: only the cluster's owner (and root) reach it, with no password
  if [ ! -f "$data/PG_VERSION" ]; then
    log "creating a cluster in $data"
    as_owner "$bin/initdb" -D "$data" -U postgres -E UTF8 --locale=C.UTF-8 \
      --auth-local=trust --auth-host=scram-sha-256 >/dev/null
  fi
  if ! running; then
    # One line: pg_ctl hands -o to a shell, where a newline would end the server's command.
    local opts="-c listen_addresses=127.0.0.1 -c port=$port -c unix_socket_directories=$dir"
    opts+=" -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    as_owner "$bin/pg_ctl" -D "$data" -l "$dir/server.log" -w -t 60 -o "$opts" start >/dev/null \
      || { log "server did not start; end of $dir/server.log:"; tail -20 "$dir/server.log" >&2; exit 1; }
  fi
  # CREATEDB: a test may want a database of its own; each tests/db test makes its own schema in this one.
  if [ -z "$(psql_admin -c "SELECT 1 FROM pg_roles WHERE rolname = '$user'")" ]; then
    psql_admin -c "CREATE ROLE $user LOGIN CREATEDB PASSWORD '$user'"
  fi
  if [ -z "$(psql_admin -c "SELECT 1 FROM pg_database WHERE datname = '$user'")" ]; then
    psql_admin -c "CREATE DATABASE $user OWNER $user"
  fi
  echo "postgresql+psycopg://$user:$user@127.0.0.1:$port/$user"
}

stop() {
  if running; then
    as_owner "$(bin_dir)/pg_ctl" -D "$data" -m fast -w stop >/dev/null
    log "stopped"
  fi
}

case "$cmd" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop [DIR] [PORT]" >&2; exit 2 ;;
esac
