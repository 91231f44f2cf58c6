#!/usr/bin/env bash
# Installs what the broker and its test suite need, idempotently: Debian packages (when
# missing: etcd, chromium, and Java 17 for Spark unless one is found), the project's virtualenv (.venv) and the official danube-client's own virtualenv
# (.venv-official, used by the conformance tests). Safe to run again; quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
OFFICIAL_CLIENT="danube-client==0.5.0"
APT_UPDATED=0

say() { printf 'bootstrap: %s\n' "$*" >&2; }

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if ! command -v apt-get >/dev/null 2>&1; then
    say "missing system packages ${missing[*]} and no apt-get: install them by hand"; exit 1
  fi
  local sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  if [ $APT_UPDATED -eq 0 ]; then
    say "apt-get update"; $sudo apt-get update -qq; APT_UPDATED=1
  fi
  say "installing ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  say "Python 3.11 or newer is required ($("$PYTHON" --version 2>&1) found)"; exit 1; }

if ! "$PYTHON" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  apt_install python3-venv
fi
# The etcd server the metadata tests start on free ports (a cluster's metadata store).
apt_install etcd-server
# Debian's browser and its WebDriver for the web console's tests (tests/console, selenium):
# no browser download at test time.
apt_install chromium chromium-driver
# Java 17 or newer for Spark (the audits in spark/, issue 7).
java_major() {
  "$1" -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -1
}
JAVA_BIN=""
for candidate in "${JAVA_HOME:+$JAVA_HOME/bin/java}" "$(command -v java || true)"; do
  if [ -n "$candidate" ] && [ -x "$candidate" ] && [ "$(java_major "$candidate")" -ge 17 ] 2>/dev/null; then
    JAVA_BIN=$candidate; break
  fi
done
if [ -z "$JAVA_BIN" ]; then
  apt_install openjdk-17-jre-headless
  JAVA_BIN=/usr/lib/jvm/java-17-openjdk-amd64/bin/java
fi
say "java for Spark: $JAVA_BIN (version $(java_major "$JAVA_BIN"))"

make_venv() {  # dir, stamp text, pip args...
  local dir=$1 stamp=$2; shift 2
  if [ -f "$dir/.stamp" ] && [ "$(cat "$dir/.stamp")" = "$stamp" ]; then
    return 0
  fi
  say "preparing $dir"
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --disable-pip-version-check --upgrade pip
  "$dir/bin/python" -m pip install -q --disable-pip-version-check "$@"
  printf '%s' "$stamp" > "$dir/.stamp"
}

# The broker and every tool the tests use, at the exact versions of constraints.txt (the
# ranges in pyproject.toml are for applications installing the client).
project_stamp=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
make_venv .venv "$project_stamp" -c constraints.txt -e ".[broker,dev,audit,bench]"
# The broker's kernels compiled ahead of time for this machine (danube/kernels/_aot*.so,
# `python -m danube.cli.build_kernels`): a broker then imports neither numba nor LLVM, about
# 125 MiB less RSS (issue 28, spec/memory.md). It needs a C compiler and Python's headers:
# installed with apt when missing (gcc and the headers are small next to chromium and Java);
# where that is not possible, one line says so and brokers keep numba's JIT kernels.
if ! .venv/bin/python -m danube.cli.build_kernels --check 2>/dev/null && command -v apt-get >/dev/null 2>&1; then
  kernel_tools=(gcc)
  case "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" in
    /usr/include/*) kernel_tools+=(python3-dev) ;;  # Debian's python3: its headers' package
  esac
  ( apt_install "${kernel_tools[@]}" ) || say "could not install ${kernel_tools[*]}"
fi
.venv/bin/python -m danube.cli.build_kernels 2>&1 | tail -1 | sed 's/^/bootstrap: /' >&2 || true
# The JIT kernels compiled into numba's cache now (next to their sources here), so
# a broker without the ahead-of-time module (DANUBE_KERNELS=jit, or a stale build) does not
# spend 5-20 s compiling before it is ready; quick (about a second) when the cache is current.
DANUBE_KERNELS=jit .venv/bin/danube-broker --warm-kernels --log-level warning
make_venv .venv-official "$OFFICIAL_CLIENT" "$OFFICIAL_CLIENT"
# The peers of the benchmark harness (bench/peers_run.py; CI runs its smoke): nats-server and
# redis-server, installed without starting their system services.
.venv/bin/python -c 'from bench.peer_servers import ensure_installed; ensure_installed()'
say "ready: .venv (project) and .venv-official ($OFFICIAL_CLIENT)"
