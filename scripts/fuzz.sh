#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ (cargo-fuzz, libFuzzer, on the nightly
# toolchain) for a while each: `scripts/fuzz.sh [seconds-per-target]`, 20 by
# default. Installs cargo-fuzz when it is missing.
#
# Each target starts from its committed seed corpus (fuzz/corpus/<target>),
# which it only reads: what a run adds goes to a temporary directory, so CI
# never grows the repository. Memory is capped (RSS and any single
# allocation), so a reader that trusts a length it was sent fails the run.
#
# Exits non-zero on the first crash, leak, timeout or memory overrun, after
# libFuzzer has written the input to fuzz/artifacts/<target>/; minimise it
# with `cargo +nightly fuzz tmin <target> <file>`, fix the bug with a
# regression test in the library, and add the input to the target's corpus.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${1:-20}"
case "$seconds" in
  '' | *[!0-9]*) echo "usage: $0 [seconds-per-target]" >&2; exit 2 ;;
esac

command -v rustup >/dev/null || { echo "error: rustup is required for the nightly toolchain" >&2; exit 1; }
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked

# Fuzz builds (nightly, sanitizers) share nothing with the workspace's: keep
# them apart, and out of the fresh clone CI runs in.
export CARGO_TARGET_DIR="${KUBE_INFORMER_FUZZ_TARGET_DIR:-$HOME/.cache/kube-informer/fuzz-target}"
# A warm fuzz build holds about 2 GiB; older dependency versions are never
# collected, so start over once it has grown well past that.
if [ -d "$CARGO_TARGET_DIR" ]; then
  fuzz_cache_kib=$(du -sk "$CARGO_TARGET_DIR" | cut -f1)
  if [ "$fuzz_cache_kib" -gt $(( ${KUBE_INFORMER_FUZZ_CACHE_LIMIT_GIB:-6} * 1024 * 1024 )) ]; then
    echo "==> clearing the fuzz build cache ($(( fuzz_cache_kib / 1024 )) MiB)"
    rm -rf "$CARGO_TARGET_DIR"
  fi
fi

targets=$(cargo +nightly fuzz list --fuzz-dir fuzz)
echo "==> building the fuzz targets"
cargo +nightly fuzz build --fuzz-dir fuzz

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

for target in $targets; do
  echo "==> fuzzing $target for ${seconds}s"
  mkdir -p "$scratch/$target" "fuzz/corpus/$target"
  cargo +nightly fuzz run --fuzz-dir fuzz "$target" "$scratch/$target" "fuzz/corpus/$target" -- \
    -max_total_time="$seconds" -timeout=30 -rss_limit_mb=512 -malloc_limit_mb=256 -print_final_stats=1
done
echo "==> every target ran ${seconds}s without a failure"
