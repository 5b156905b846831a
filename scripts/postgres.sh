#!/usr/bin/env bash
# Starts (or stops) a throwaway PostgreSQL server for the tests, from Debian's postgresql package.
#   scripts/postgres.sh start   -> prints `export TEST_DATABASE_URL=...` for eval
#   scripts/postgres.sh stop
# fsync is off (tests need no durability; it spares their disk) unless SANDFORK_PG_FSYNC=on,
# PostgreSQL's default, which the loadtest asks for: its figures are what a real server costs.
set -euo pipefail

PGDIR="${SANDFORK_PG_DIR:-/tmp/sandfork-test-pg}"
PGPORT="${SANDFORK_PG_PORT:-54331}"
PGFSYNC="${SANDFORK_PG_FSYNC:-off}"
case "$PGFSYNC" in
  on | off) ;;
  *) echo "scripts/postgres.sh: SANDFORK_PG_FSYNC is on or off, not $PGFSYNC" >&2; exit 2 ;;
esac

pg_bin() {
  local dir
  dir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$dir" ]; then
    echo "scripts/postgres.sh: no PostgreSQL server found; install Debian's package: apt-get install -y postgresql" >&2
    exit 1
  fi
  echo "$dir"
}

# initdb and postgres refuse to run as root: run them as the package's `postgres` user.
as_pg_user() {
  if [ "$(id -u)" = 0 ]; then
    su postgres -s /bin/bash -c "$*"
  else
    bash -c "$*"
  fi
}

case "${1:-}" in
  start)
    bin=$(pg_bin)
    if ! as_pg_user "'$bin/pg_ctl' -D '$PGDIR' status" >/dev/null 2>&1; then
      rm -rf "$PGDIR"
      mkdir -p "$PGDIR"
      [ "$(id -u)" = 0 ] && chown postgres: "$PGDIR"
      as_pg_user "'$bin/initdb' -D '$PGDIR' -U postgres --auth=trust --no-sync >/dev/null"
      as_pg_user "'$bin/pg_ctl' -D '$PGDIR' -o \"-p $PGPORT -k /tmp -c listen_addresses=127.0.0.1 -c fsync=$PGFSYNC -c max_connections=300\" -l '$PGDIR/server.log' -w start >/dev/null"
    fi
    echo "export TEST_DATABASE_URL=postgres://postgres@127.0.0.1:$PGPORT/postgres"
    ;;
  stop)
    bin=$(pg_bin)
    as_pg_user "'$bin/pg_ctl' -D '$PGDIR' -m fast stop" >/dev/null 2>&1 || true
    ;;
  *)
    echo "usage: scripts/postgres.sh start|stop" >&2
    exit 2
    ;;
esac
