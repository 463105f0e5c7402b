#!/bin/sh
# fi_pingpong between two emulated DPUs through the libfabric provider's
# DPU backend. The QEMU harness runs it with `--exec`, passing each node's
# shared-memory file and address: SHM0 ADDR0 SHM1 ADDR1.
#
# The server drives DPU 0 and the client DPU 1 (FI_METAROCE_DEVICE); the
# two fi_pingpong processes exchange their names over a TCP control
# connection on the host, and their messages through the DPUs and the
# emulated fabric: every size fi_pingpong knows (`-S all`, 1 B to 6 MiB),
# with its data check (-c). A DPU serves one listening process for its
# life, so one boot runs one pair: PINGPONG_MODE picks plain (`msg`,
# the default) or `tagged` messages. Prints "N passed, M failed".
#
# Environment: FI_PROVIDER_PATH (the directory holding libmetaroce-fi.so),
# PINGPONG_MODE (msg | tagged), PINGPONG_ITERS (default 5).
set -u
if [ $# -lt 4 ]; then
    echo "usage: $0 SHM0 ADDR0 SHM1 ADDR1" >&2
    exit 2
fi
shm0=$1
shm1=$3
mode=${PINGPONG_MODE:-msg}
iters=${PINGPONG_ITERS:-5}
port=$((30000 + $$ % 20000))
log=$(mktemp)
FI_METAROCE_DEVICE=$shm0 timeout 600 fi_pingpong -p metaroce -e rdm -m "$mode" \
    -I "$iters" -S all -c -B "$port" >"$log.server" 2>&1 &
server=$!
sleep 1
FI_METAROCE_DEVICE=$shm1 timeout 600 fi_pingpong -p metaroce -e rdm -m "$mode" \
    -I "$iters" -S all -c -P "$port" 127.0.0.1 >"$log" 2>&1
client_rc=$?
wait "$server"
server_rc=$?
sed 's/^/  /' "$log"
sizes=$(grep -cE "^[0-9]" "$log")
if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && [ "$sizes" -gt 0 ]; then
    echo "dpu fi_pingpong $mode: $sizes sizes, data checked: ok"
    echo "1 passed, 0 failed"
    status=0
else
    echo "dpu fi_pingpong $mode: FAILED (client $client_rc, server $server_rc)"
    sed 's/^/  server: /' "$log.server"
    echo "0 passed, 1 failed"
    status=1
fi
rm -f "$log" "$log.server"
exit $status
