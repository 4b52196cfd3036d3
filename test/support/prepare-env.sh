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

# Installs a Debian package when its binary is missing (as root), or says the one command to run.
ensure_debian_package() {
  local binary=$1 package=$2
  if command -v "$binary" >/dev/null 2>&1 || [ -x "/usr/sbin/$binary" ] || [ -x "/usr/bin/$binary" ]; then return 0; fi
  if [ "$(id -u)" = "0" ]; then
    echo "prepare-env: installing Debian's $package" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "$package" >&2
  else
    echo "prepare-env: $package is missing. Install it, then run this command again:" >&2
    echo "    sudo apt-get install -y $package" >&2
    exit 1
  fi
}

ensure_debian_package nats-server nats-server
# The telemetry e2e test scrapes the processes with a real Prometheus; the demo does not need it.
# The https upstream test of the attach proxy makes its certificate with openssl.
if [ "${1:-test}" = "test" ]; then
  ensure_debian_package prometheus prometheus
  ensure_debian_package openssl openssl
fi
