# ab.sh ROUNDS TREE_A TREE_B : alternate A/B runs, print 'outside' per run
for r in $(seq $1); do
  for T in $2 $3; do
    bash /tmp/hopsrun/run.sh $T 31010 300 >/dev/null 2>&1
    echo "$(basename $T) $(/work/main/.venv/bin/python /tmp/hopsrun/an.py /tmp/hopsrun/st.31010 | tail -1)"
    mkdir -p /tmp/hopsrun/ab/$(basename $T).$r && cp /tmp/hopsrun/st.31010/* /tmp/hopsrun/ab/$(basename $T).$r/
  done
done
