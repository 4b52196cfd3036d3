#!/usr/bin/env bash
# Makes a fresh clone ready to test or demo: npm packages, then Debian's nats-server.
# Idempotent and quiet when everything is already there.
set -euo pipefail
cd "$(dirname "$0")/../.."

lock_hash() { sha256sum package-lock.json 2>/dev/null | cut -c1-64; }
if [ ! -d node_modules ] || [ ! -f node_modules/.gym-ckpt-lock ] || [ "$(cat node_modules/.gym-ckpt-lock)" != "$(lock_hash)" ]; then
  echo "prepare-env: installing npm packages" >&2
  # Not `npm ci`: one of vite's optional, Windows-only dependencies is absent from this registry,
  # which `npm ci` treats as a lock mismatch. `npm install` follows the lock and skips it.
  npm install --no-audit --no-fund --no-save --loglevel=error >&2
  lock_hash > node_modules/.gym-ckpt-lock
fi

# On a systemd host a package's install starts and enables its daemons (prometheus on :9090, ...),
# which would outlive the tests: stop and disable every unit the package just installed.
disable_package_units() {
  if [ ! -d /run/systemd/system ] || ! command -v systemctl >/dev/null 2>&1; then return 0; fi
  local units
  units=$(dpkg -L "$1" 2>/dev/null | grep -E '^(/usr)?/lib/systemd/system/[^/]+\.(service|socket|timer)$' | xargs -r -n1 basename || true)
  # shellcheck disable=SC2086 # one word per unit
  [ -z "$units" ] || systemctl disable --now $units >/dev/null 2>&1 || true
}

# Installs a Debian package when its binary is missing (as root), or says the commands to run.
# The third argument names the package's daemon, if it has one.
ensure_debian_package() {
  local binary=$1 package=$2 service=${3:-}
  if command -v "$binary" >/dev/null 2>&1 || [ -x "/usr/sbin/$binary" ] || [ -x "/usr/bin/$binary" ]; then return 0; fi
  if [ "$(id -u)" = "0" ]; then
    echo "prepare-env: installing Debian's $package" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "$package" >&2
    disable_package_units "$package"
  else
    echo "prepare-env: $package is missing. Install it and run this command again:" >&2
    echo "    sudo apt-get update && sudo apt-get install -y --no-install-recommends $package" >&2
    if [ -n "$service" ]; then
      echo "  then, on a systemd host, stop the daemon the install started (the tests run their own):" >&2
      echo "    sudo systemctl disable --now $service" >&2
    fi
    exit 1
  fi
}

ensure_debian_package nats-server nats-server nats-server
# The telemetry e2e test scrapes the processes with a real Prometheus; the demo does not need it.
# The https upstream test of the attach proxy makes its certificate with openssl.
# The Python controller example's e2e test (test/e2e/python-controller.test.ts) runs it with python3,
# which a minimal Debian image lacks.
if [ "${1:-test}" = "test" ]; then
  ensure_debian_package prometheus prometheus prometheus
  ensure_debian_package openssl openssl
  ensure_debian_package python3 python3
fi
