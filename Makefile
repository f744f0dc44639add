# Berth: build, run, test, bench, lint. `make run` and `make test` do all set-up on a fresh Debian 12 machine (as root).
CARGO ?= cargo
ROOT ?= /var/lib/berth
ARGS ?=

.PHONY: all deps build run test unit lint bench fuzz deb clean

all: build

deps:
	bash hack/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

# Builds and starts berthd with its defaults (socket /run/berth/berth.sock).
run: build
	bash hack/default-cni.sh
	./target/release/berthd $(ARGS)

# The whole suite: registries and test images, the stock kubelet and control plane (built once,
# cached), unit and integration tests, lints. One build per run: no incremental caches (GiBs of
# disk for a build made once), unless CARGO_INCREMENTAL says otherwise.
test: deps
	$(CARGO) fmt --all -- --check
	mkdir -p target
	bash hack/test-env.sh > target/test-env.sh
	bash hack/kubernetes.sh >> target/test-env.sh
	. target/test-env.sh && CARGO_INCREMENTAL=$${CARGO_INCREMENTAL:-0} $(CARGO) nextest run --workspace --no-fail-fast
	bash hack/fuzz.sh smoke
	$(CARGO) clippy --workspace --all-targets -- -D warnings

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The Debian package (cargo-deb): target/debian/berth_<version>_<arch>.deb; see hack/deb.sh.
deb: build
	bash hack/deb.sh

# Each fuzz target for 10 minutes (cargo-fuzz, libFuzzer); see hack/fuzz.sh.
fuzz:
	bash hack/fuzz.sh long

bench: build
	bash hack/install-deps.sh --bench
	bash hack/bench-pull.sh
	bash hack/bench-lifecycle.sh

clean:
	$(CARGO) clean
