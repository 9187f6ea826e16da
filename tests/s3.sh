# s3.sh: sourced by the S3 tests, after common.sh. The server is moto unless
# S3_SERVER=rgw: then Ceph's RADOS Gateway on a single-node cluster (tests/rgw.sh).
#   s3_start [BUCKET]  runs the server on a free 127.0.0.1 port, checking the
#       SigV4 signature of every request, with one user allowed everything and one
#       bucket (default bkt); installs s3_stop as the EXIT trap (a test with an
#       EXIT trap of its own calls s3_stop in it) and exports
#         AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY   that user's key
#         AWS_REGION=us-east-1 (and AWS_DEFAULT_REGION)
#         AWS_ENDPOINT_URL=http://127.0.0.1:$S3_PORT   S3_PORT S3_PID S3_BUCKET
#       so that plain `aws s3 ...`, boto3 and tessera talk to it.
#   proxy_start FLAGS...  starts tests/s3proxy.py (fault injection: see its
#       --help) in front of the server; prints and exports PROXY_URL, and PROXY_PORT,
#       PROXY_PID, PROXY_LOG (one line per request, then "# summary ..." once
#       stopped). A second proxy_start replaces the first.   proxy_stop
#   s3_stop  stops the proxy and the server.
# Call them directly, not in $(...), or their exports are lost. Logs: moto's in
# $TSR_TMP/moto.log, RGW's in $TSR_TMP/rgw/, the proxy's in $TSR_TMP/proxy-N.{log,out,err}.
# Whatever the user's AWS setup (profile, ~/.aws, session token, HTTP proxy), it
# stays out, and nothing here reaches past the loopback interface. A server that
# is missing or does not start is a failure, not a skip.
: "${TSR_TMP:?TSR_TMP must name the per-test temporary directory}"
# moto and boto3 live in the first python3 on PATH (the image's, not /usr/bin's)
S3_SERVER=${S3_SERVER:-moto}
[ "$S3_SERVER" = rgw ] || command -v moto_server >/dev/null 2>&1 ||
    { echo "FAIL: moto_server is not on PATH: the S3 tests need moto's server (pip install 'moto[server]')" >&2; exit 1; }
S3_PY=$(command -v python3) ||
    { echo "FAIL: python3 is not on PATH" >&2; exit 1; }
"$S3_PY" -c "import boto3, moto" 2>/dev/null ||
    { echo "FAIL: $S3_PY cannot import boto3 and moto (the python3 that moto_server runs under is not first on PATH?)" >&2; exit 1; }

# Everything stays on the loopback interface and nothing of the user's AWS setup
# leaks in: no profile, no config or credentials files, no instance metadata
# lookups (169.254.169.254), no HTTP proxy between the clients and moto.
unset AWS_PROFILE AWS_DEFAULT_PROFILE AWS_SESSION_TOKEN AWS_SECURITY_TOKEN \
    AWS_ENDPOINT_URL_S3 AWS_CA_BUNDLE http_proxy HTTP_PROXY https_proxy HTTPS_PROXY \
    all_proxy ALL_PROXY
export AWS_CONFIG_FILE="$TSR_TMP/aws-config-none" AWS_SHARED_CREDENTIALS_FILE="$TSR_TMP/aws-credentials-none"
export AWS_EC2_METADATA_DISABLED=true no_proxy=127.0.0.1,localhost NO_PROXY=127.0.0.1,localhost
S3_PID='' PROXY_PID='' _s3_nproxy=0

s3_free_port() { # a TCP port free on 127.0.0.1 just now
    "$S3_PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

_s3_kill() { # pid: SIGTERM, SIGKILL after 5 s, and reap it
    kill "$1" 2>/dev/null || return 0
    _s3_n=0
    while kill -0 "$1" 2>/dev/null && [ $_s3_n -lt 50 ]; do sleep 0.1; _s3_n=$((_s3_n + 1)); done
    kill -9 "$1" 2>/dev/null
    wait "$1" 2>/dev/null
    return 0
}

# Setup, run once moto is up. Exactly S3_NOAUTH requests go out before the first
# signed one: moto verifies signatures from request S3_NOAUTH + 1 on, so the IAM
# user and key must be made in those. Retries are off so that nothing is counted
# twice; the wrong-secret request checks that verification is on (and so that
# S3_NOAUTH is not too high); the bucket is made with the new key.
S3_NOAUTH=4
_s3_setup() { # endpoint bucket pid; prints "KEY SECRET"
    "$S3_PY" - "$@" <<'PYEOF'
import json, os, sys, time, urllib.request
import boto3
from botocore.config import Config
from botocore.exceptions import ClientError
endpoint, bucket, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
deadline = time.time() + 60
while True:  # /moto-api/ is not an AWS action: it does not count
    try:
        urllib.request.urlopen(endpoint + "/moto-api/", timeout=2).read()
        break
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            sys.exit("moto_server exited")
        if time.time() > deadline:
            sys.exit("moto_server did not answer within 60 s")
        time.sleep(0.1)
cfg = Config(retries={"mode": "standard", "max_attempts": 1})
def client(service, key, secret):
    return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1",
                        aws_access_key_id=key, aws_secret_access_key=secret, config=cfg)
iam = client("iam", "setup", "setup")
iam.create_user(UserName="tessera")                                        # 1
key = iam.create_access_key(UserName="tessera")["AccessKey"]               # 2
arn = iam.create_policy(PolicyName="s3-all", PolicyDocument=json.dumps({   # 3
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))["Policy"]["Arn"]
iam.attach_user_policy(UserName="tessera", PolicyArn=arn)                 # 4
try:
    client("s3", key["AccessKeyId"], "not-" + key["SecretAccessKey"]).list_buckets()
    sys.exit("moto accepted a request signed with a wrong secret: signatures are not checked")
except ClientError as e:
    if e.response["Error"]["Code"] != "SignatureDoesNotMatch":
        sys.exit("a wrong secret got %s, not SignatureDoesNotMatch" % e.response["Error"]["Code"])
client("s3", key["AccessKeyId"], key["SecretAccessKey"]).create_bucket(Bucket=bucket)
print(key["AccessKeyId"], key["SecretAccessKey"])
PYEOF
}

# moto checks a signature against werkzeug's request.url, which is decoded: any
# key or query value that URI-encoding changes ('+', '=', '&', '%', non-ASCII,
# and '/' in a query value, as in ListObjectsV2 prefix=ckpt/ or delimiter=/)
# fails with SignatureDoesNotMatch however well it is signed. moto_server runs
# with this sitecustomize (on its PYTHONPATH only), which makes the check use the
# request-target as received, as S3 does. S3_MOTO_RAW_URI=0: stock moto.
_s3_site() {
    mkdir -p "$TSR_TMP/moto-site"
    cat >"$TSR_TMP/moto-site/sitecustomize.py" <<'PYEOF'
# written by tests/s3.sh for moto_server: signatures checked on the raw URI
import sys
try:
    from moto.core.authorization import ActionAuthenticatorMixin as _M
    _orig = _M._authenticate_and_authorize_action

    def _raw_uri_check(self, iam_request_cls, resource="*"):
        req = getattr(self, "request", None)       # set by moto's S3 responses
        raw = getattr(req, "environ", {}).get("RAW_URI")
        if not raw:
            return _orig(self, iam_request_cls, resource)
        decoded, self.uri = self.uri, raw          # the check parses self.uri
        try:
            return _orig(self, iam_request_cls, resource)
        finally:
            self.uri = decoded
    _M._authenticate_and_authorize_action = _raw_uri_check
except Exception as e:  # an unknown moto: say so, run stock
    print("tests/s3.sh sitecustomize: not applied: %r" % (e,), file=sys.stderr)
PYEOF
}

s3_start() { # [bucket]
    S3_BUCKET=${1:-bkt}
    trap 's3_stop' EXIT
    trap 'exit 143' TERM    # so that the EXIT trap runs on these too
    trap 'exit 130' INT
    if [ "$S3_SERVER" = rgw ]; then
        . "$TSR_ROOT/tests/rgw.sh"
        rgw_start "$S3_BUCKET"
        _s3_keys=$_rgw_keys
        _s3_export
        return
    fi
    _s3_pypath=${PYTHONPATH:-}
    if [ "${S3_MOTO_RAW_URI:-1}" = 1 ]; then
        _s3_site
        _s3_pypath=$TSR_TMP/moto-site${PYTHONPATH:+:$PYTHONPATH}
    fi
    _s3_try=0
    while :; do
        _s3_try=$((_s3_try + 1))
        S3_PORT=$(s3_free_port) || { echo "FAIL: no free port" >&2; exit 1; }
        AWS_ENDPOINT_URL=http://127.0.0.1:$S3_PORT
        echo "== moto_server on 127.0.0.1:$S3_PORT" >>"$TSR_TMP/moto.log"
        INITIAL_NO_AUTH_ACTION_COUNT=$S3_NOAUTH PYTHONPATH=$_s3_pypath \
            moto_server -H 127.0.0.1 -p "$S3_PORT" >>"$TSR_TMP/moto.log" 2>&1 &
        S3_PID=$!
        _s3_keys=$(_s3_setup "$AWS_ENDPOINT_URL" "$S3_BUCKET" "$S3_PID" 2>>"$TSR_TMP/moto.log") && break
        _s3_kill "$S3_PID"; S3_PID=
        # the port may have been taken meanwhile: try another, twice
        [ $_s3_try -lt 3 ] && continue
        echo "FAIL: could not start moto_server with a signature-checking S3 user; $TSR_TMP/moto.log ends:" >&2
        tail -n 20 "$TSR_TMP/moto.log" | sed 's/^/    /' >&2
        exit 1
    done
    _s3_export
}

_s3_export() {
    AWS_ACCESS_KEY_ID=${_s3_keys% *} AWS_SECRET_ACCESS_KEY=${_s3_keys#* }
    export AWS_ACCESS_KEY_ID AWS_SECRET_ACCESS_KEY AWS_REGION=us-east-1 AWS_DEFAULT_REGION=us-east-1 \
        AWS_ENDPOINT_URL S3_PORT S3_PID S3_BUCKET
}

proxy_start() { # s3proxy.py flags, as words or as one string: --fail-rate 0.1 --seed 3
    [ -n "$S3_PID" ] || { echo "FAIL: proxy_start before s3_start" >&2; exit 1; }
    proxy_stop
    if [ $# = 1 ]; then # one string: split it at blanks, with no globbing
        set -f
        # shellcheck disable=SC2086
        set -- $1
        set +f
    fi
    _s3_nproxy=$((_s3_nproxy + 1))
    PROXY_LOG=$TSR_TMP/proxy-$_s3_nproxy.log
    "$S3_PY" "$TSR_ROOT/tests/s3proxy.py" --upstream "$AWS_ENDPOINT_URL" --port 0 \
        --log "$PROXY_LOG" "$@" >"$TSR_TMP/proxy-$_s3_nproxy.out" 2>"$TSR_TMP/proxy-$_s3_nproxy.err" &
    PROXY_PID=$!
    _s3_n=0 PROXY_PORT=
    while [ -z "$PROXY_PORT" ]; do
        PROXY_PORT=$(sed -n 's/^PORT \([0-9][0-9]*\)$/\1/p' "$TSR_TMP/proxy-$_s3_nproxy.out" 2>/dev/null)
        [ -n "$PROXY_PORT" ] && break
        if ! kill -0 "$PROXY_PID" 2>/dev/null || [ $_s3_n -ge 200 ]; then
            echo "FAIL: s3proxy.py $* did not start:" >&2
            sed 's/^/    /' "$TSR_TMP/proxy-$_s3_nproxy.err" >&2
            _s3_kill "$PROXY_PID"; PROXY_PID=
            exit 1
        fi
        sleep 0.05; _s3_n=$((_s3_n + 1))
    done
    PROXY_URL=http://127.0.0.1:$PROXY_PORT
    export PROXY_URL PROXY_PORT PROXY_PID PROXY_LOG
    echo "PROXY_URL=$PROXY_URL"
}

proxy_stop() { # the counts go to the end of $PROXY_LOG ("# summary ...")
    [ -n "$PROXY_PID" ] || return 0
    _s3_kill "$PROXY_PID"
    PROXY_PID=
}

s3_stop() {
    proxy_stop
    if [ "$S3_SERVER" = rgw ]; then
        rgw_stop
        S3_PID=
        return 0
    fi
    [ -n "$S3_PID" ] || return 0
    _s3_kill "$S3_PID"
    S3_PID=
}
