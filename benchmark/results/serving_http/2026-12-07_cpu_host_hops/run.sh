# usage: run.sh TREE PORT N
HERE=$(cd "$(dirname "$0")" && pwd); REPO=${REPO:-$(git -C "$HERE" rev-parse --show-toplevel)}; PY=${PY:-$REPO/.venv/bin/python}; WORK=${WORK:-/tmp/hopsrun}
TREE=$1; PORT=$2; N=${3:-300}
rm -f /tmp/stamps.*
(cd $TREE && OMP_NUM_THREADS=1 exec $PY -m flide_ext.entrypoints.cli serve --model-path ${MODEL:-$WORK/llama} --context-length 2000 --port $PORT $EXTRA > $WORK/server.$PORT.log 2>&1) &
SP=$!
for i in $(seq 120); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 0.5; done
$PY $HERE/client.py http://127.0.0.1:$PORT $N
kill $SP; wait $SP 2>/dev/null
for i in $(seq 40); do pgrep -f "port $PORT" >/dev/null || break; sleep 0.25; done
rm -rf $WORK/st.$PORT; mkdir -p $WORK/st.$PORT; mv /tmp/stamps.* $WORK/st.$PORT/
