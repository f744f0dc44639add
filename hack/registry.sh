#!/usr/bin/env bash
# Run a local OCI/Docker registry (Debian's docker-registry, CNCF distribution
# 2.8) for Berth's tests, in the background, without systemd.
#
#   hack/registry.sh start NAME PORT STORAGE_DIR [--htpasswd USER:PASS]
#       Serve plain HTTP on 127.0.0.1:PORT with filesystem storage under
#       STORAGE_DIR/data and deletes enabled.  With --htpasswd, require basic
#       auth for USER:PASS (bcrypt).  Waits until /v2/ answers (200, or 401
#       with --htpasswd).  Idempotent: if the same registry already runs from
#       STORAGE_DIR with the same settings, says so and exits 0.
#   hack/registry.sh stop STORAGE_DIR
#       Stop the registry started from STORAGE_DIR (no error if none runs).
#   hack/registry.sh status STORAGE_DIR
#       Exit 0 and print the pid if it runs, exit 1 otherwise.
#
# STORAGE_DIR holds config.yml, registry.pid, registry.log, registry.settings,
# htpasswd (if any) and data/.  NAME only labels the log lines.
# Environment: BERTH_REGISTRY_START_TIMEOUT (seconds, default 30).
set -euo pipefail

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//' >&2
    exit 2
}

log() { printf 'registry.sh: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

REGISTRY_BIN=/usr/bin/docker-registry

ensure_installed() {
    [[ -x $REGISTRY_BIN ]] && return 0
    log "installing docker-registry"
    export DEBIAN_FRONTEND=noninteractive
    if ! apt-get install -y docker-registry >/dev/null; then
        apt-get update >/dev/null
        apt-get install -y docker-registry >/dev/null
    fi
    [[ -x $REGISTRY_BIN ]] || die "docker-registry is not installed at $REGISTRY_BIN"
}

# Absolute path of a directory (created if missing).
abs_dir() {
    mkdir -p -- "$1"
    (cd -- "$1" && pwd -P)
}

# Pid of the registry running from storage dir $1, or nothing.  Checks that
# the pid still belongs to docker-registry serving our config (pid reuse).
running_pid() {
    local dir=$1 pid cmdline
    [[ -f $dir/registry.pid ]] || return 0
    pid=$(<"$dir/registry.pid")
    [[ $pid =~ ^[0-9]+$ ]] || return 0
    [[ -r /proc/$pid/cmdline ]] || return 0
    cmdline=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null || true)
    if [[ $cmdline == *docker-registry*" $dir/config.yml"* ]]; then
        echo "$pid"
    fi
}

# Is something listening on 127.0.0.1:$1?
port_busy() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

http_code() {
    curl -s -o /dev/null -m 2 -w '%{http_code}' "http://127.0.0.1:$1/v2/" 2>/dev/null || true
}

# YAML single-quoted scalar.
yaml_str() { printf "'%s'" "${1//\'/\'\'}"; }

cmd_start() {
    [[ $# -ge 3 ]] || usage
    local name=$1 port=$2 dir=$3 auth="" user="" pass=""
    shift 3
    while [[ $# -gt 0 ]]; do
        case $1 in
            --htpasswd)
                [[ $# -ge 2 ]] || usage
                auth=$2
                shift 2
                ;;
            --htpasswd=*)
                auth=${1#--htpasswd=}
                shift
                ;;
            *) usage ;;
        esac
    done
    if ! [[ $port =~ ^[0-9]{1,5}$ ]] || ((10#$port < 1 || 10#$port > 65535)); then
        die "bad port: $port"
    fi
    port=$((10#$port))
    if [[ -n $auth ]]; then
        [[ $auth == *:* ]] || die "--htpasswd wants USER:PASS"
        user=${auth%%:*}
        pass=${auth#*:}
        [[ -n $user && -n $pass ]] || die "--htpasswd wants a non-empty USER and PASS"
    fi
    dir=$(abs_dir "$dir")
    local want_code=200
    [[ -n $auth ]] && want_code=401

    # What identifies "the same registry": port, auth user, hash of password.
    local settings
    settings="port=$port user=$user pass_sha256=$(printf '%s' "$pass" | sha256sum | cut -d' ' -f1)"

    local pid
    pid=$(running_pid "$dir")
    if [[ -n $pid ]]; then
        if [[ -f $dir/registry.settings && $(<"$dir/registry.settings") == "$settings" ]]; then
            if [[ $(http_code "$port") == "$want_code" ]]; then
                log "$name already running on 127.0.0.1:$port from $dir (pid $pid)"
                return 0
            fi
            log "$name (pid $pid) runs from $dir but does not answer; restarting it"
        else
            log "$name (pid $pid) runs from $dir with other settings; restarting it"
        fi
        cmd_stop "$dir"
    fi

    if port_busy "$port"; then
        die "127.0.0.1:$port is already in use by another process (not a registry from $dir)"
    fi

    ensure_installed
    mkdir -p "$dir/data"

    local auth_yaml=""
    rm -f "$dir/htpasswd"
    if [[ -n $auth ]]; then
        command -v htpasswd >/dev/null || {
            log "installing apache2-utils (htpasswd)"
            DEBIAN_FRONTEND=noninteractive apt-get install -y apache2-utils >/dev/null
        }
        (umask 077 && htpasswd -Bbn "$user" "$pass" >"$dir/htpasswd")
        auth_yaml="auth:
  htpasswd:
    realm: $(yaml_str "berth-$name")
    path: $(yaml_str "$dir/htpasswd")"
    fi

    local secret
    secret=$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')
    # Written from scratch on every start: Debian's /etc/docker/registry
    # config (port 5000, auth to a directory) is never read.
    cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: info
  formatter: text
  fields:
    service: $(yaml_str "berth-registry-$name")
storage:
  filesystem:
    rootdirectory: $(yaml_str "$dir/data")
  delete:
    enabled: true
  cache:
    blobdescriptor: inmemory
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: $(yaml_str "127.0.0.1:$port")
  secret: $(yaml_str "$secret")
  headers:
    X-Content-Type-Options: [nosniff]
$auth_yaml
EOF
    printf '%s\n' "$settings" >"$dir/registry.settings"

    # A clean environment: distribution reads REGISTRY_* variables as config
    # overrides, so none of the caller's may leak in.  setsid detaches it from
    # our process group and terminal; the inner shell records its own pid and
    # execs the registry, so the pid file names the registry itself.
    : >>"$dir/registry.log"
    printf '\n=== %s start %s on 127.0.0.1:%s\n' "$(date -u +%FT%TZ)" "$name" "$port" >>"$dir/registry.log"
    # shellcheck disable=SC2016 # $$ and $1.. are for the inner shell
    setsid env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ \
        /bin/sh -c 'echo $$ >"$1"; exec "$2" serve "$3"' sh \
        "$dir/registry.pid" "$REGISTRY_BIN" "$dir/config.yml" \
        </dev/null >>"$dir/registry.log" 2>&1 &

    local timeout=${BERTH_REGISTRY_START_TIMEOUT:-30} waited=0 code=""
    while :; do
        code=$(http_code "$port")
        if [[ $code == "$want_code" ]]; then
            break
        fi
        pid=$(running_pid "$dir")
        if ((waited > 2)) && [[ -z $pid ]]; then
            tail -n 20 "$dir/registry.log" >&2 || true
            die "$name exited during startup (log: $dir/registry.log)"
        fi
        if ((waited >= timeout * 10)); then
            tail -n 20 "$dir/registry.log" >&2 || true
            die "$name did not answer on http://127.0.0.1:$port/v2/ within ${timeout}s (last HTTP code: ${code:-none})"
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    pid=$(running_pid "$dir")
    [[ -n $pid ]] || die "127.0.0.1:$port answers, but not from the registry started from $dir"
    log "$name running on 127.0.0.1:$port (pid $pid, storage $dir, auth: ${user:-none})"
}

cmd_stop() {
    [[ $# -eq 1 ]] || usage
    local dir pid i
    [[ -d $1 ]] || { log "no registry directory $1; nothing to stop"; return 0; }
    dir=$(abs_dir "$1")
    pid=$(running_pid "$dir")
    if [[ -z $pid ]]; then
        log "no registry running from $dir"
        rm -f "$dir/registry.pid"
        return 0
    fi
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        [[ -n $(running_pid "$dir") ]] || break
        sleep 0.1
    done
    if [[ -n $(running_pid "$dir") ]]; then
        log "pid $pid ignored SIGTERM; sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.2
    fi
    rm -f "$dir/registry.pid"
    log "stopped registry (pid $pid) from $dir"
}

cmd_status() {
    [[ $# -eq 1 ]] || usage
    local dir pid
    [[ -d $1 ]] || exit 1
    dir=$(abs_dir "$1")
    pid=$(running_pid "$dir")
    if [[ -n $pid ]]; then
        echo "running pid $pid ($(<"$dir/registry.settings"))"
    else
        echo "not running"
        exit 1
    fi
}

[[ $# -ge 1 ]] || usage
sub=$1
shift
case $sub in
    start) cmd_start "$@" ;;
    stop) cmd_stop "$@" ;;
    status) cmd_status "$@" ;;
    -h | --help | help) usage ;;
    *) usage ;;
esac
