#!/usr/bin/env bash
# System tools the deployment tests need, from Debian's packages (idempotent, quick when present):
#
#   prometheus, promtool   a real Prometheus scrapes a worker; promtool checks the shipped files
#   docker-compose         `docker-compose config` validates docker-compose.yml without an engine
#   postgresql             initdb and postgres for the log store's PostgreSQL tests, which start a
#                          throwaway server of their own (tests/pg_server.py) as user postgres
#   chromium               the console's browser tests (Playwright drives this browser: no
#   chromium-driver        download); chromedriver for anyone who drives it with Selenium
#   stunnel4               a TLS-terminating proxy in front of the embedded broker (which serves
#                          no TLS itself), for the secured-Kafka tests
#
# Run as root (CI is). The packages' services are never started: a policy-rc.d that refuses is in
# place for the install (the one Docker images ship already does; otherwise one is added and removed).
# Exits non-zero with a message naming what is missing when the install is impossible.
set -euo pipefail

missing=()
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then
    missing+=(docker-compose)
fi
if ! compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null && ! command -v initdb >/dev/null 2>&1; then
    missing+=(postgresql)
fi
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
command -v stunnel4 >/dev/null 2>&1 || command -v stunnel >/dev/null 2>&1 || missing+=(stunnel4)
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
mapfile -t packages < <(printf '%s\n' "${missing[@]}" | sort -u)

if [ "$(id -u)" -ne 0 ]; then
    echo "setup_system.sh: need root to install ${packages[*]} (apt-get); or install them yourself" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "setup_system.sh: no apt-get here; install ${packages[*]} by other means" >&2
    exit 1
fi

added_policy=""
if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    added_policy=1
fi
cleanup() { if [ -n "$added_policy" ]; then rm -f /usr/sbin/policy-rc.d; fi; }
trap cleanup EXIT

echo "setup_system.sh: installing ${packages[*]} from Debian's packages" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -q >&2
apt-get install -y -q --no-install-recommends "${packages[@]}" >&2
