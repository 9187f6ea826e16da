# bench_cluster.sh: sourced by the make bench sections on the virtual cluster
# of tests/vcluster.sh (needs root), with TSR_TMP set (emptied here): 3 hosts
# of 2 ranks, up until the script exits (or is interrupted), and JOB_CLUSTER:
# the small model at a global batch of 24 in micro-batches of 2 (it fits 6
# ranks and 4), a snapshot in each host's memory every 5 steps and a durable
# checkpoint every 10; a section adds its steps and its folder, and its
# supervisor's pid in sup (stopped with the cluster).
rm -rf "$TSR_TMP"
mkdir -p "$TSR_TMP"
. tests/vcluster.sh
trap '[ -z "${sup:-}" ] || kill "$sup" 2>/dev/null || true; vcluster_down' EXIT # (set -e holds in the trap)
trap 'exit 1' INT TERM # (the EXIT trap then removes the cluster)
vcluster_up 3
JOB_CLUSTER="--config train/configs/small.toml --training.local_batch_size=2 --training.global_batch_size=24 \
--metrics.log_freq=1 --checkpoint.interval=10 --checkpoint.local_interval=5"
