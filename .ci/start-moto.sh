#!/usr/bin/env bash
# Start one loopback moto S3 server for a whole CI session and print the environment for it.
#   eval "$(.ci/start-moto.sh)"     # exports PCK_TEST_S3_ENDPOINT and PCK_MOTO_PID
#   ... pytest -m s3 ...            # tests/s3/conftest.py reuses the server
#   kill "$PCK_MOTO_PID"
# Without it, tests/s3/conftest.py starts (and stops) its own server per session.
set -euo pipefail
PY="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
[ -x "$PY" ] || PY=python3
PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
LOG="${TMPDIR:-/tmp}/pck-moto-$PORT.log"
# run_moto.py imports crc32c before the first request and checks moto's CRC32C (see there).
"$PY" "$(dirname "$0")/../tests/s3/run_moto.py" -H 127.0.0.1 -p "$PORT" >"$LOG" 2>&1 &
PID=$!
for _ in $(seq 1 300); do
  if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/moto-api/', timeout=1)" 2>/dev/null; then
    echo "export PCK_TEST_S3_ENDPOINT=http://127.0.0.1:$PORT PCK_MOTO_PID=$PID"
    exit 0
  fi
  kill -0 "$PID" 2>/dev/null || { echo "moto server exited; see $LOG" >&2; exit 1; }
  sleep 0.1
done
kill "$PID"; echo "moto server did not answer within 30 s; see $LOG" >&2; exit 1
