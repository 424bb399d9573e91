# usage: run.sh TREE PORT N
TREE=$1; PORT=$2; N=${3:-300}
rm -f /tmp/stamps.*
(cd $TREE && OMP_NUM_THREADS=1 exec /work/main/.venv/bin/python -m flide_ext.entrypoints.cli serve --model-path ${MODEL:-/tmp/hopsrun/llama} --context-length 2000 --port $PORT $EXTRA > /tmp/hopsrun/server.$PORT.log 2>&1) &
SP=$!
for i in $(seq 120); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 0.5; done
/work/main/.venv/bin/python /tmp/hopsrun/client.py http://127.0.0.1:$PORT $N
kill $SP; wait $SP 2>/dev/null
for i in $(seq 40); do pgrep -f "port $PORT" >/dev/null || break; sleep 0.25; done
rm -rf /tmp/hopsrun/st.$PORT; mkdir -p /tmp/hopsrun/st.$PORT; mv /tmp/stamps.* /tmp/hopsrun/st.$PORT/
