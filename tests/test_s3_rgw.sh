#!/bin/sh
# test_s3's checks against Ceph's RADOS Gateway (tests/rgw.sh) in place of moto: a
# real S3 server that checks the signed payload hash of every body. RGW that cannot
# start is a failure.
# tsr-timeout: 900
S3_SERVER=rgw exec sh "$TSR_ROOT/tests/test_s3.sh"
