#!/usr/bin/env bash
# The README's quick start, run as a newcomer runs it: berthd started as `make run` starts it
# (the default pod network, then berthd with its defaults: /run/berth, /var/lib/berth, the agent
# reading /etc/berth/manifests, its control socket /run/berth/agent/agent.sock), then every command of the README's block
# after "Then, in another shell:", unchanged, from a fresh directory. Then checks what they did:
# the container's log line, the pod's web server on its IP, the agent's pod running. Whatever
# the run added to the machine is removed afterwards, and only that.
# Usage: hack/quickstart.sh [BIN_DIR]   (holds berthd, berthctl, berth-shim; default
# target/release, as `make run` builds them). Needs root and the registry `make test` starts.
set -euo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
bin=$(cd "${1:-$top/target/release}" && pwd)
sock=/run/berth/berth.sock

if [ -S "$sock" ] && "$bin/berthctl" version >/dev/null 2>&1; then
  echo "quickstart: a berthd already serves $sock; stop it first" >&2
  exit 1
fi
# What the run may create, so that only what it created is removed.
created=()
for p in /var/lib/berth /run/berth /etc/berth /etc/cni/net.d/10-berth.conflist /tmp/demo; do
  [ -e "$p" ] || created+=("$p")
done
had_bridge=0
ip link show berth0 >/dev/null 2>&1 && had_bridge=1
work=$(mktemp -d /tmp/berth-quickstart.XXXXXX)
berthd_pid=

cleanup() {
  set +e
  rm -f /etc/berth/manifests/hello.yaml
  if [ -n "$berthd_pid" ]; then
    # The agent ends the pod of the removed manifest (a pod it still wants would be made
    # again if removed under it); then whatever pods are left go.
    for _ in $(seq 120); do
      curl -s --unix-socket /run/berth/agent/agent.sock http://localhost/pods | jq -e '.items[] | select(.metadata.name == "hello")' \
        >/dev/null 2>&1 || break
      sleep 0.5
    done
    for _ in $(seq 60); do
      [ -z "$("$bin/berthctl" pods -q 2>/dev/null | head -1)" ] && break
      "$bin/berthctl" pods -q 2>/dev/null | xargs -r "$bin/berthctl" rmp >/dev/null 2>&1
      sleep 0.5
    done
    kill -TERM "$berthd_pid" 2>/dev/null
    wait "$berthd_pid" 2>/dev/null
  fi
  # Shims outlive berthd by design: one left under this run's root is a pod that escaped the
  # clean-up. It is ended (with its container, its pid namespace's init) and reported.
  local leaked status=0
  if [[ " ${created[*]} " == *" /var/lib/berth "* ]]; then
    leaked=$(pgrep -f -- "--bundle /var/lib/berth/containers/" || true)
    if [ -n "$leaked" ]; then
      echo "quickstart: shims left after the clean-up: $(echo $leaked)" >&2
      for s in $leaked; do pkill -KILL -P "$s"; kill -KILL "$s"; done
      status=1
    fi
  fi
  for p in "${created[@]}"; do
    grep -F " $p/" /proc/self/mountinfo | awk '{print $5}' | sort -r | xargs -r umount -l
    rm -rf "$p"
  done
  [ "$had_bridge" = 1 ] || ip link del berth0 2>/dev/null
  rm -rf "$work"
  [ "$status" = 0 ] || exit "$status"
}
trap cleanup EXIT

# On a disk with less free space than the agent's eviction thresholds the README's remedy is
# applied as it is written there (its lowered thresholds in /etc/berth/config.toml).
free_pct=$(df --output=avail,size -B1 /var/lib | awk 'NR == 2 { printf "%d", $1 * 100 / $2 }')
if [ "$free_pct" -lt 20 ] && [ ! -e /etc/berth/config.toml ]; then
  mkdir -p /etc/berth
  awk '/lower the thresholds/ { want = 1 }
    want && /^```toml/ { inside = 1; next }
    inside && /^```/ { exit }
    inside { print }' "$top/README.md" >/etc/berth/config.toml
  echo "quickstart: $free_pct % free under /var/lib: the README's lowered thresholds are used" >&2
fi

# `make run`: the default pod network, then berthd with its defaults.
bash "$top/hack/default-cni.sh" >/dev/null
"$bin/berthd" >"$work/berthd.log" 2>&1 &
berthd_pid=$!
for _ in $(seq 200); do
  [ -S "$sock" ] && "$bin/berthctl" version >/dev/null 2>&1 && break
  kill -0 "$berthd_pid" 2>/dev/null || { cat "$work/berthd.log" >&2; exit 1; }
  sleep 0.1
done

# The README's block, unchanged, from a fresh directory whose ./target/release holds the binaries.
block=$(awk '/Then, in another shell:$/ { want = 1; next }
  want && /^```sh/ { inside = 1; next }
  inside && /^```/ { exit }
  inside { print }' "$top/README.md")
[ -n "$block" ] || { echo "quickstart: no block after 'Then, in another shell:' in README.md" >&2; exit 1; }
mkdir -p "$work/run/target"
ln -s "$bin" "$work/run/target/release"
if ! (cd "$work/run" && bash -euo pipefail -c "$block") >"$work/out" 2>&1; then
  echo "quickstart: the README's commands failed:" >&2
  cat "$work/out" >&2
  tail -20 "$work/berthd.log" >&2
  exit 1
fi
cat "$work/out"

# What they should have done.
grep -qxF "$(hostname)" "$work/out" ||
  { echo "quickstart: the pod's web server did not answer with the node's hostname" >&2; exit 1; }
grep -q ' stdout F hello$' /tmp/demo/web.log ||
  { echo "quickstart: the container's 'hello' is not in /tmp/demo/web.log" >&2; exit 1; }
for _ in $(seq 120); do
  phase=$(curl -s --unix-socket /run/berth/agent/agent.sock http://localhost/pods |
    jq -r '.items[] | select(.metadata.name == "hello") | .status.phase')
  [ "$phase" = Running ] && break
  sleep 0.5
done
[ "$phase" = Running ] ||
  { echo "quickstart: the agent's pod hello is '$phase', not Running" >&2; tail -20 "$work/berthd.log" >&2; exit 1; }
echo "quickstart: ok"
