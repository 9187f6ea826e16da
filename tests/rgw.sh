# rgw.sh: a real S3 server for the tests and make bench: Ceph's RADOS Gateway on a
# single-node cluster made from scratch on 127.0.0.1. Sourced by tests/s3.sh (which
# calls it when S3_SERVER=rgw); needs TSR_TMP and S3_PY (s3.sh sets both).
#   rgw_start BUCKET  in $TSR_TMP/rgw: one monitor, one manager, one OSD (BlueStore
#       on a sparse file, so the cluster needs no disk of its own and little memory),
#       pools of size 1, radosgw with the beast frontend on a free port, an S3 user
#       made with radosgw-admin and BUCKET made with that user's key (an object put
#       and deleted in it, so that RGW's data pools exist). Deleted objects
#       are freed within seconds (rgw_gc_obj_min_wait, 2 hours by default), so runs
#       do not fill the OSD. Sets S3_PORT, S3_PID (radosgw's), AWS_ENDPOINT_URL,
#       _rgw_keys ("KEY SECRET"). Every daemon runs in the foreground as a child of
#       this shell, logs in $TSR_TMP/rgw/log.
#   rgw_stop  stops every daemon (SIGTERM to all, then s3.sh's _s3_kill on each) and
#       reaps it: nothing is left running. s3_stop calls it.
# A missing package or a cluster that does not come up within RGW_START_SECONDS
# (default 240) is a failure that prints the daemons' logs, never a skip.
_rgw_pids=''

_rgw_fail() {
    echo "FAIL: RGW: $*" >&2
    for _rgw_l in "$RGW_DIR"/log/*.log "$RGW_DIR"/*.out; do
        [ -s "$_rgw_l" ] || continue
        echo "  $_rgw_l ends:" >&2
        tail -n 15 "$_rgw_l" | sed 's/^/    /' >&2
    done
    rgw_stop
    exit 1
}

_rgw_daemon() { # name command...: started in the foreground, as a child of this shell
    _rgw_name=$1; shift
    "$@" >"$RGW_DIR/$_rgw_name.out" 2>&1 &
    _rgw_pids="$_rgw_pids $!"
    eval "_rgw_pid_$_rgw_name=$!"
}

_rgw_wait() { # what command...: until the command succeeds, or fail
    _rgw_what=$1; shift
    _rgw_end=$(($(date +%s) + ${RGW_START_SECONDS:-240}))
    until "$@" >/dev/null 2>&1; do
        for _rgw_p in $_rgw_pids; do
            kill -0 "$_rgw_p" 2>/dev/null || _rgw_fail "a daemon (pid $_rgw_p) exited while waiting for $_rgw_what"
        done
        [ "$(date +%s)" -lt "$_rgw_end" ] || _rgw_fail "$_rgw_what: not within ${RGW_START_SECONDS:-240} s"
        sleep 0.5
    done
}

_rgw_ceph() { timeout 20 ceph -c "$RGW_DIR/ceph.conf" --connect-timeout 10 "$@"; }

rgw_start() { # bucket
    for _rgw_b in ceph-mon ceph-mgr ceph-osd radosgw radosgw-admin monmaptool ceph; do
        command -v $_rgw_b >/dev/null 2>&1 ||
            { echo "FAIL: RGW: $_rgw_b is not on PATH (Debian's ceph-mon ceph-mgr ceph-osd radosgw ceph-common: make deps)" >&2; exit 1; }
    done
    RGW_DIR=$TSR_TMP/rgw
    rm -rf "$RGW_DIR" && mkdir -p "$RGW_DIR/log" "$RGW_DIR/run" "$RGW_DIR/mon-a" "$RGW_DIR/mgr-x" "$RGW_DIR/osd-0" "$RGW_DIR/rgw" || exit 1
    _rgw_mon_port=$(s3_free_port) && S3_PORT=$(s3_free_port) || _rgw_fail "no free port"
    _rgw_fsid=$("$S3_PY" -c 'import uuid; print(uuid.uuid4())')
    _rgw_osd_uuid=$("$S3_PY" -c 'import uuid; print(uuid.uuid4())')
    cat >"$RGW_DIR/ceph.conf" <<EOF
[global]
fsid = $_rgw_fsid
mon_host = [v2:127.0.0.1:$_rgw_mon_port]
public_addr = 127.0.0.1
cluster_addr = 127.0.0.1
ms_bind_msgr1 = false
keyring = $RGW_DIR/keyring
run_dir = $RGW_DIR/run
admin_socket = $RGW_DIR/run/\$name.asok
log_file = $RGW_DIR/log/\$name.log
pid_file = $RGW_DIR/run/\$name.pid
crash_dir = $RGW_DIR/crash
mon_data = $RGW_DIR/mon-\$id
mgr_data = $RGW_DIR/mgr-\$id
osd_data = $RGW_DIR/osd-\$id
rgw_data = $RGW_DIR/rgw
mon_data_avail_crit = 1
mon_data_avail_warn = 2
mon_allow_pool_size_one = true
mon_allow_pool_delete = true
mon_warn_on_pool_no_redundancy = false
mon_max_pg_per_osd = 1000
mgr_initial_modules = iostat
osd_pool_default_size = 1
osd_pool_default_min_size = 1
osd_pool_default_pg_num = 8
osd_pool_default_pgp_num = 8
osd_pool_default_pg_autoscale_mode = off
osd_crush_chooseleaf_type = 0
osd_objectstore = bluestore
bluestore_block_create = true
bluestore_block_size = 32212254720
osd_memory_target = 939524096
bluestore_cache_autotune = false
bluestore_cache_size = 268435456
osd_max_backfills = 1
rgw_frontends = beast endpoint=127.0.0.1:$S3_PORT
rgw_dns_name = localhost
rgw_gc_obj_min_wait = 2
rgw_gc_processor_period = 5
rgw_thread_pool_size = 64
EOF
    # one keyring for every daemon and the admin, imported into the monitor at mkfs
    ceph-authtool --create-keyring "$RGW_DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null &&
        for _rgw_e in client.admin mgr.x osd.0 client.rgw.x; do
            ceph-authtool "$RGW_DIR/keyring" --gen-key -n $_rgw_e --cap mon 'allow *' --cap osd 'allow *' \
                --cap mgr 'allow *' >/dev/null || exit 1
        done || _rgw_fail "ceph-authtool"
    monmaptool --create --fsid "$_rgw_fsid" --addv a "[v2:127.0.0.1:$_rgw_mon_port]" "$RGW_DIR/monmap" \
        >"$RGW_DIR/monmap.out" 2>&1 || _rgw_fail "monmaptool"
    ceph-mon -c "$RGW_DIR/ceph.conf" --mkfs -i a --monmap "$RGW_DIR/monmap" --keyring "$RGW_DIR/keyring" >"$RGW_DIR/mkfs-mon.out" 2>&1 ||
        _rgw_fail "ceph-mon --mkfs"
    _rgw_daemon mon ceph-mon -c "$RGW_DIR/ceph.conf" -f -i a
    _rgw_wait "the monitor" _rgw_ceph mon stat
    _rgw_daemon mgr ceph-mgr -c "$RGW_DIR/ceph.conf" -f -i x
    _rgw_id=$(_rgw_ceph osd new "$_rgw_osd_uuid" 2>>"$RGW_DIR/osd-new.out") && [ "$_rgw_id" = 0 ] ||
        _rgw_fail "ceph osd new: '$_rgw_id'"
    ceph-osd -c "$RGW_DIR/ceph.conf" -i 0 --mkfs --osd-uuid "$_rgw_osd_uuid" >"$RGW_DIR/mkfs-osd.out" 2>&1 ||
        _rgw_fail "ceph-osd --mkfs"
    _rgw_daemon osd ceph-osd -c "$RGW_DIR/ceph.conf" -f -i 0
    _rgw_wait "the OSD up" sh -c "timeout 20 ceph -c '$RGW_DIR/ceph.conf' osd dump 2>/dev/null | grep -q '^osd.0 up '"
    _rgw_daemon rgw radosgw -c "$RGW_DIR/ceph.conf" -f -n client.rgw.x
    S3_PID=$_rgw_pid_rgw
    AWS_ENDPOINT_URL=http://127.0.0.1:$S3_PORT
    _rgw_wait "radosgw answering on $AWS_ENDPOINT_URL" curl -sf -o /dev/null "$AWS_ENDPOINT_URL/"
    _rgw_keys=$("$S3_PY" -c 'import secrets; print("TSR" + secrets.token_hex(8).upper(), secrets.token_urlsafe(30))')
    radosgw-admin -c "$RGW_DIR/ceph.conf" user create --uid=tessera --display-name=tessera \
        --access-key="${_rgw_keys% *}" --secret-key="${_rgw_keys#* }" >"$RGW_DIR/user.out" 2>&1 ||
        _rgw_fail "radosgw-admin user create"
    AWS_ACCESS_KEY_ID=${_rgw_keys% *} AWS_SECRET_ACCESS_KEY=${_rgw_keys#* } AWS_REGION=us-east-1 \
        AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL "$S3_PY" - "$1" >"$RGW_DIR/bucket.out" 2>&1 <<'PYEOF' || _rgw_fail "bucket $1 and the signature check"
import os, sys, boto3
from botocore.config import Config
from botocore.exceptions import ClientError
cfg = Config(retries={"mode": "standard", "max_attempts": 1})
def client(secret):
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id=os.environ["AWS_ACCESS_KEY_ID"], aws_secret_access_key=secret, config=cfg)
try:
    client("not-" + os.environ["AWS_SECRET_ACCESS_KEY"]).list_buckets()
    sys.exit("RGW accepted a request signed with a wrong secret")
except ClientError as e:
    if e.response["Error"]["Code"] != "SignatureDoesNotMatch":
        sys.exit("a wrong secret got %s, not SignatureDoesNotMatch" % e.response["Error"]["Code"])
c = client(os.environ["AWS_SECRET_ACCESS_KEY"])
c.create_bucket(Bucket=sys.argv[1])
# RGW makes its data pools at the first object written (seconds): not in a test's time
c.put_object(Bucket=sys.argv[1], Key="rgw-warm-up", Body=b"x" * 65536)
c.delete_object(Bucket=sys.argv[1], Key="rgw-warm-up")
PYEOF
}

rgw_stop() {
    [ -n "$_rgw_pids" ] || return 0
    for _rgw_p in $_rgw_pids; do kill "$_rgw_p" 2>/dev/null; done # all stop at once
    for _rgw_p in $_rgw_pids; do _s3_kill "$_rgw_p"; done
    _rgw_pids=''
    # the OSD's 30 GB block file is sparse; what it holds goes with the directory
    rm -f "$RGW_DIR/osd-0/block"
}
