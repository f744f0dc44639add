#!/usr/bin/env bash
# Coverage-guided fuzzing of Berth's parsers with cargo-fuzz (libFuzzer); the targets are in
# fuzz/fuzz_targets/, their harnesses in fuzz/src/lib.rs.
#
#   bash hack/fuzz.sh smoke [TARGET...]   each target for a few seconds (`make test` runs this)
#   bash hack/fuzz.sh long [TARGET...]    each target for 10 minutes (`make fuzz`)
#
# FUZZ_SECONDS overrides the time per target. The seeds in fuzz/corpus/<target>/ are only read;
# the inputs a run adds go to fuzz/found/<target>/ and its log to fuzz/found/<target>.log (both
# ignored by git), a crashing input to fuzz/artifacts/<target>/. Reproduce a crash with
# `RUSTC_BOOTSTRAP=1 cargo fuzz run -O -a <target> <file>` in fuzz/; once fixed, copy the input
# to fuzz/regressions/<target>/, where tests/fuzz_regressions.rs replays it.
# layer_unpack needs root: it unpacks into a tmpfs in its own mount namespace, chrooted.
set -euo pipefail

cd "$(dirname "$0")/../fuzz"

mode=${1:-}
case "$mode" in
smoke) seconds=${FUZZ_SECONDS:-5} ;;
long) seconds=${FUZZ_SECONDS:-600} ;;
*)
	echo "usage: $0 smoke|long [TARGET...]" >&2
	exit 2
	;;
esac
shift

# cargo-fuzz passes nightly-only flags (-Zsanitizer=..., sanitizer coverage); this lets the
# stable toolchain accept them.
export RUSTC_BOOTSTRAP=1

# The instrumented build is long on 2 cores: its target directory is kept across checkouts.
cache=${FUZZ_TARGET_CACHE:-/var/cache/berth/fuzz-target}
if [ ! -e target ]; then
	mkdir -p "$cache"
	ln -s "$cache" target
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
	cargo install --locked cargo-fuzz
fi

# Optimised, with debug assertions and overflow checks (-a), and AddressSanitizer (cargo-fuzz's
# default sanitizer: it builds and runs on the stable toolchain without -Zbuild-std).
flags=(-O -a)

if [ $# -gt 0 ]; then
	targets=("$@")
else
	mapfile -t targets < <(cargo fuzz list)
fi

cargo fuzz build "${flags[@]}"

failed=()
for t in "${targets[@]}"; do
	mkdir -p "found/$t"
	echo "== $t: ${seconds}s"
	# -timeout: one input running that long is a hang. -rss_limit_mb/-malloc_limit_mb: memory
	# must stay bounded whatever a length field announces.
	if cargo fuzz run "${flags[@]}" "$t" "found/$t" "corpus/$t" -- \
		-max_total_time="$seconds" -timeout=30 -rss_limit_mb=2048 -malloc_limit_mb=512 \
		-print_final_stats=1 >"found/$t.log" 2>&1; then
		runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "found/$t.log")
		rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "found/$t.log")
		echo "   ok: ${runs:-?} runs, ${rate:-?} exec/s"
	else
		echo "   FAILED (log: fuzz/found/$t.log; input in fuzz/artifacts/$t/):"
		grep -E -m 5 "panicked at|ERROR: libFuzzer|ERROR: AddressSanitizer|SUMMARY" "found/$t.log" | sed 's/^/   /' || true
		failed+=("$t")
	fi
done

if [ ${#failed[@]} -gt 0 ]; then
	echo "fuzz targets that failed: ${failed[*]}" >&2
	exit 1
fi
