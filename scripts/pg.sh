#!/bin/bash
# A throwaway PostgreSQL 15 with the real pgvector extension, for the
# PostgreSQL memory store's tests and benchmark (.ci/run uses it too):
#
#   scripts/pg.sh install     PostgreSQL 15 from Debian, and pgvector built
#                             from Debian's current stable source package
#                             (0.8.0; Debian 12 ships none); as root, and a
#                             no-op when both are there
#   scripts/pg.sh start DIR   a new cluster in DIR (initdb the first time),
#                             listening on a unix socket in DIR only; prints
#                             the export line of AGEMEM_TEST_PG_DSN
#   scripts/pg.sh stop DIR    stops it (fast shutdown)
#
# As root the server runs as the postgres user (initdb refuses root).
# PG_SETTINGS adds server settings, e.g. PG_SETTINGS="-c shared_buffers=2GB".
set -euo pipefail
PGBIN=/usr/lib/postgresql/15/bin
cmd=${1:-}

# as runs a command as the cluster's owner.
as() {
	if [ "$(id -u)" = 0 ]; then
		runuser -u postgres -- "$@"
	else
		"$@"
	fi
}

# debsrc writes a deb-src entry for Debian's current stable (trixie) from
# the machine's own Debian sources, whatever mirror they name: pgvector's
# source package is there, and its binary packages are built for other
# PostgreSQL versions than Debian 12's 15.
debsrc() {
	local out=/etc/apt/sources.list.d/agemem-src
	local f
	for f in /etc/apt/sources.list.d/*.sources; do
		[ -f "$f" ] && [[ "$f" != "$out.sources" ]] || continue
		# each stanza naming a Debian mirror, not the security archive
		awk 'BEGIN { RS = ""; ORS = "\n\n" } /URIs:[^\n]*debian/ && !/URIs:[^\n]*security/' "$f" |
			sed -e 's/^Types:.*/Types: deb-src/' -e 's/^Suites:.*/Suites: trixie/' -e 's/^Components:.*/Components: main/'
	done >"$out.sources.tmp"
	mv "$out.sources.tmp" "$out.sources"
	if [ -f /etc/apt/sources.list ]; then
		sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\?\([^[:space:]]*debian[^[:space:]]*\)[[:space:]].*/deb-src \1\2 trixie main/p' \
			/etc/apt/sources.list | grep -v security >"$out.list" || true
	fi
}

install() {
	local have_pg=1 have_vector=1
	[ -x $PGBIN/postgres ] || have_pg=0
	[ -f /usr/share/postgresql/15/extension/vector.control ] || have_vector=0
	[ -f /usr/lib/postgresql/15/lib/pgxs/src/makefiles/pgxs.mk ] || have_vector=0
	if [ $have_pg = 1 ] && [ $have_vector = 1 ]; then
		return
	fi
	if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
		echo "scripts/pg.sh install: needs root and apt-get (PostgreSQL 15: $have_pg, pgvector: $have_vector)" >&2
		return 1
	fi
	debsrc
	apt-get update -qq
	apt-get install -y -qq postgresql-15 postgresql-server-dev-15 build-essential dpkg-dev >/dev/null
	if [ ! -f /usr/share/postgresql/15/extension/vector.control ]; then
		local src
		src=$(mktemp -d)
		(cd "$src" && apt-get source -qq pgvector >/dev/null 2>&1 && cd pgvector-*/ &&
			make -s -j"$(nproc)" PG_CONFIG=$PGBIN/pg_config >/dev/null &&
			make -s install PG_CONFIG=$PGBIN/pg_config >/dev/null)
		rm -rf "$src"
	fi
	test -f /usr/share/postgresql/15/extension/vector.control
}

start() {
	local dir=$1
	mkdir -p "$dir"
	dir=$(cd "$dir" && pwd)
	if [ "$(id -u)" = 0 ]; then
		chown postgres "$dir"
		chmod 755 "$dir"
	fi
	if [ ! -f "$dir/data/PG_VERSION" ]; then
		as $PGBIN/initdb -D "$dir/data" -A trust -U agemem -E UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 ||
			{ cat "$dir/initdb.log" >&2; return 1; }
	fi
	# No TCP: the socket in DIR is the only way in.
	# shellcheck disable=SC2086
	as $PGBIN/pg_ctl -D "$dir/data" status >/dev/null 2>&1 ||
		as $PGBIN/pg_ctl -D "$dir/data" -l "$dir/server.log" -w -t 60 \
		-o "-c listen_addresses= -k $dir -c max_connections=200 ${PG_SETTINGS:-}" start >/dev/null ||
		{ cat "$dir/server.log" >&2; return 1; }
	echo "export AGEMEM_TEST_PG_DSN='host=$dir user=agemem dbname=postgres'"
}

stop() {
	local dir=$1
	[ -f "$dir/data/postmaster.pid" ] || return 0
	as $PGBIN/pg_ctl -D "$dir/data" -m fast -w stop >/dev/null
}

case "$cmd" in
install) install ;;
start) start "${2:?scripts/pg.sh start DIR}" ;;
stop) stop "${2:?scripts/pg.sh stop DIR}" ;;
*)
	echo "usage: scripts/pg.sh install | start DIR | stop DIR" >&2
	exit 2
	;;
esac
