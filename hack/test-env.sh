#!/usr/bin/env bash
# Starts the test registries (plain and htpasswd) and pushes the test images. Idempotent.
# Prints the environment the tests read (BERTH_TEST_*), one `export` per line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
PLAIN_PORT=${BERTH_TEST_REGISTRY_PORT:-5050}
AUTH_PORT=${BERTH_TEST_AUTH_REGISTRY_PORT:-5051}
PLAIN_DIR=${BERTH_TEST_REGISTRY_DIR:-/tmp/berth-reg-plain}
AUTH_DIR=${BERTH_TEST_AUTH_REGISTRY_DIR:-/tmp/berth-reg-auth}
CREDS=${BERTH_TEST_AUTH_CREDS:-berth:berth-secret}
bash "$here/registry.sh" start plain "$PLAIN_PORT" "$PLAIN_DIR" >&2
bash "$here/registry.sh" start auth "$AUTH_PORT" "$AUTH_DIR" --htpasswd "$CREDS" >&2
bash "$here/make-test-images.sh" "127.0.0.1:$PLAIN_PORT" "127.0.0.1:$AUTH_PORT" "$CREDS" >&2
cat <<ENV
export BERTH_TEST_REGISTRY=127.0.0.1:$PLAIN_PORT
export BERTH_TEST_REGISTRY_DIR=$PLAIN_DIR
export BERTH_TEST_AUTH_REGISTRY=127.0.0.1:$AUTH_PORT
export BERTH_TEST_AUTH_CREDS=$CREDS
ENV
