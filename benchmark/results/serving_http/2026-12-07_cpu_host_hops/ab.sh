# ab.sh ROUNDS TREE_A TREE_B: serve each tree in turn ROUNDS times (run.sh), keeping each run's
# stamps in $WORK/ab/<tree name>.<round>; then: python compare_hops.py <name A> <name B> [summary.json]
HERE=$(cd "$(dirname "$0")" && pwd); WORK=${WORK:-/tmp/hopsrun}; export WORK
for r in $(seq $1); do
  for T in $2 $3; do
    bash $HERE/run.sh $T 31010 300 >/dev/null 2>&1
    mkdir -p $WORK/ab/$(basename $T).$r && cp $WORK/st.31010/* $WORK/ab/$(basename $T).$r/
    echo "$(basename $T) round $r: done"
  done
done
