#!/bin/sh
# fi_pingpong between two emulated DPUs through the libfabric provider's
# DPU backend. The QEMU harness runs it with `--exec`, passing each node's
# shared-memory file and address: SHM0 ADDR0 SHM1 ADDR1.
#
# The server drives DPU 0 and the client DPU 1 (FI_METAROCE_DEVICE); the
# two fi_pingpong processes exchange their names over a TCP control
# connection on the host, and their messages through the DPUs and the
# emulated fabric. Plain and tagged messages, 8 B to 1 MiB, with the data
# check (-c). Prints one line per run and "N passed, M failed".
#
# Environment: FI_PROVIDER_PATH (the directory holding libmetaroce-fi.so),
# PINGPONG_SIZES (default "8 4096 65536 1048576"), PINGPONG_ITERS (20).
set -u
if [ $# -lt 4 ]; then
    echo "usage: $0 SHM0 ADDR0 SHM1 ADDR1" >&2
    exit 2
fi
shm0=$1
shm1=$3
sizes=${PINGPONG_SIZES:-8 4096 65536 1048576}
iters=${PINGPONG_ITERS:-20}
passed=0
failed=0
port=$((30000 + $$ % 20000))
for mode in msg tagged; do
    for size in $sizes; do
        port=$((port + 1))
        log=$(mktemp)
        FI_METAROCE_DEVICE=$shm0 timeout 120 fi_pingpong -p metaroce -e rdm -m "$mode" \
            -I "$iters" -S "$size" -c -B "$port" >"$log.server" 2>&1 &
        server=$!
        sleep 1
        FI_METAROCE_DEVICE=$shm1 timeout 120 fi_pingpong -p metaroce -e rdm -m "$mode" \
            -I "$iters" -S "$size" -c -P "$port" 127.0.0.1 >"$log" 2>&1
        client_rc=$?
        wait "$server"
        server_rc=$?
        result=$(grep -E "^[0-9]" "$log" | tail -1)
        if [ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] && [ -n "$result" ]; then
            passed=$((passed + 1))
            echo "dpu fi_pingpong $mode $size B: ok: $result"
        else
            failed=$((failed + 1))
            echo "dpu fi_pingpong $mode $size B: FAILED (client $client_rc, server $server_rc)"
            sed 's/^/  client: /' "$log"
            sed 's/^/  server: /' "$log.server"
        fi
        rm -f "$log" "$log.server"
    done
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
