#!/usr/bin/env bash
# The GPU check: one command of at most 8 minutes on a CUDA machine with no network, run from the repository root.
# Needs the kit .gpu/ from scripts/gpu_prepare.sh (carried along with the working tree) and the machine's own
# python3 with CUDA torch.
#
#   scripts/gpu_check.sh                  # the default stages, most valuable first, in BUDGET_S seconds (450)
#   scripts/gpu_check.sh train_compile gen135   # a second command: what the first had no time for
#   REHEARSE=1 scripts/gpu_check.sh       # on a CPU machine: the same stages on the CPU with small sizes
#
# Default order (issue 52, GPU round 4): tests, serverproc (the engine process, stage 1), replicas (two replicas,
# stage 2), loop, train, train_compile, serverprocload, then the older stages as time allows.
#
# Stages (each under its own time cap, cut to what is left of BUDGET_S; one that no longer fits is skipped):
#   tests    pytest -m cuda: CUDA graphs across a train step, fp32 exact / bf16 bounded logprobs, LoRA, the NCCL group,
#            the train step's options (flat fp32 masters, compiled logprob chunks) against the default in bf16
#   loop     the RL loop's own throughput: ajet server with the embedded engine at SmolLM2-1.7B shapes, 64 scripted
#            episodes at once (groups of 8, 128 tokens each, rewards that differ inside each group), a 180 s
#            window (LOOP_S); trained and generated tokens/s, the shares of wall time in generation, train steps
#            and weight pushes, against the ceilings measured first in the same stage (generation alone, the
#            train step alone): benchmarks/training/rl_loop.py
#   gen135   the embedded engine at SmolLM2-135M shapes, bf16, c1 and c64 (and hf-generate on the same requests),
#            and one 64-row admission timed and profiled (its op calls: is a prefill dispatch-bound?)
#   server   ajet server end to end at c64 against the same generations engine-direct (prefills and decode
#            steps counted on each side)
#   train    the train step at 135M against the bare-torch floor (the learner sizes its micro-batch itself): the
#            default, and with flat fp32 masters (learner.flat_masters), in one run
#   train_compile the same with the logprob chunks through torch.compile (learner.compile_logprobs), alone and with
#            flat masters, beside the default (the first step of each compiles; reported apart)
#   serverload the same with 4 calls per client one after the other (a sustained load: the burst's arrival
#            spread is paid once), then one more round under py-spy: which thread holds the GIL
#   serverload_gil1 the same with the server's GIL switch interval at 1 ms instead of Python's 5 (is the
#            server's slower decode step the engine thread waiting for the GIL behind the event loop?)
#   serverload_wait30 the same with an idle engine waiting up to 30 ms (not 5) for the next calls to gather: do
#            fewer, larger prefills pay for the wait?
#   server512  the same at 512 new tokens a request (is the server's cost per request or per token?)
#   train8k  the train step with 8,192-token logprob chunks instead of 1,024 (both train stages profile a step)
#   group    the trainer group (1 rank, NCCL) sharing the GPU with the generator (--colocate) beside the in-process
#            learner: step and push times
#   snapshot the recovery snapshot's write alone (model + AdamW state, 135M): one thread and synced, as the ranks
#            wrote it before, against several threads unsynced, as they write it now
#   gen17    the embedded engine at SmolLM2-1.7B shapes, c1 and c64: last, in whatever time is left
#   train17  the train step at 1.7B shapes (gradient checkpointing on both sides), in whatever time is left
#   replicas two generator replicas (engine processes) on the one GPU against one generator, through ajet server,
#            c64 and c128: tokens/s and demo rollouts per minute
#
# Everything lands in $OUT (default /tmp/gpu-check) as it is made, at most 8 files: summary.json (device,
# versions, each stage's status and seconds, the figures the CUDA tests report, and every benchmark stage's JSON
# under "results"; rewritten after every stage), log.txt, cuda_tests.xml, and the py-spy profiles of the server
# process (serverload*_gil.txt, serverload*_all.txt; py-spy comes in the kit). A run cut short keeps what the
# finished stages wrote.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
BUDGET_S=${BUDGET_S:-450}
REHEARSE=${REHEARSE:-0}
KIT=${KIT:-.gpu}
WHEELS=${WHEELS:-$KIT/wheels}
SITE=${SITE:-/tmp/aj-site}
RES=${RES:-/tmp/aj-results}  # each benchmark stage's JSON; summary.json takes them in
mkdir -p "$OUT" && rm -rf "$RES" && mkdir -p "$RES"
START=$(date +%s)
LOG="$OUT/log.txt"
: >"$LOG"
say() { echo "==> $* (t+$(($(date +%s) - START)) s)" | tee -a "$LOG"; }

say "installing the kit ($WHEELS)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
  "$WHEELS"/*.whl >>"$LOG" 2>&1 || { say "install of $WHEELS failed"; tail -20 "$LOG"; exit 1; }
export PATH="$SITE/bin:$PATH" PYTHONPATH="$SITE:$PWD/src:$PWD" PYTHONUNBUFFERED=1 AGENTJET_HOME=/tmp/aj-home AGENTJET_TEST_HOME=/tmp/aj-home \
  AGENTJET_SMOLLM2_TOKENIZER="$PWD/$KIT/smollm2-tokenizer" AGENTJET_BENCH_MODELS=/tmp/aj-models
export AGENTJET_CUDA_REPORT=/tmp/aj-cuda-report.jsonl  # the CUDA tests' figures; summary.json takes them in
rm -f "$AGENTJET_CUDA_REPORT"
[ -f "$KIT/commit" ] && export AGENTJET_COMMIT=${AGENTJET_COMMIT:-$(cat "$KIT/commit")}

LOOP_S=${LOOP_S:-}  # the loop stage's measured window, seconds (default 180; 20 when rehearsing)
if [ "$REHEARSE" = 1 ]; then  # the same commands on the CPU, small: a typo costs no GPU minute
  DEV=cpu; MODEL=tiny-random; MODEL17=tiny-random; GEN_C=1,4; SRV_C=4; NEW=(--new-tokens 16)
  TRAIN=(--batch 2 --length 64 --steps 1 --dtype bfloat16)  # bf16 weights: the fp32 masters exist, as on CUDA
  LOOP=(--concurrency 8 --group-size 4 --new-tokens 16 --seconds "${LOOP_S:-20}" --train-steps 2)
else
  DEV=cuda; MODEL=135m; MODEL17=1.7b; GEN_C=1,64; SRV_C=64; TRAIN=(); NEW=()
  LOOP=(--concurrency 64 --group-size 8 --new-tokens 128 --seconds "${LOOP_S:-180}")
fi

# the rollout fleet (issue 49): two replicas on the one GPU against one, at c64 and c128
if [ "$REHEARSE" = 1 ]; then REP_C=4,8; REP_EPISODES=16; else REP_C=64,128; REP_EPISODES=128; fi

STAGES=/tmp/aj-gpu-stages.txt  # one line per finished stage: name, status, seconds
: >"$STAGES"
summary() {
  python3 - "$OUT/summary.json" "$START" "$BUDGET_S" "$STAGES" "$RES" <<'PY'
import json, os, subprocess, sys, time
path, start, budget, stages_file, res = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
stages = {}
for line in open(stages_file).read().splitlines():
    name, seconds, status = line.split(" ", 2)
    stages[name] = {"status": status, "seconds": int(seconds)}
env = {"elapsed_s": int(time.time()) - start, "budget_s": budget, "stages": stages,
       "commit": os.environ.get("AGENTJET_COMMIT", "unknown")}
if os.path.exists(os.environ["AGENTJET_CUDA_REPORT"]):  # the figures the CUDA tests measured
    env["cuda_report"] = [json.loads(x) for x in open(os.environ["AGENTJET_CUDA_REPORT"]) if x.strip()]
env["results"] = {}  # every benchmark stage's JSON, by file name (one file to bring back instead of one per stage)
for name in sorted(os.listdir(res)):
    try:
        env["results"][name] = json.load(open(os.path.join(res, name)))
    except ValueError as exc:
        env["results"][name] = {"unreadable": repr(exc)}
try:
    import torch, transformers
    env.update(torch=torch.__version__, transformers=transformers.__version__, cuda=torch.version.cuda,
               device=torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20)
    env["nvidia_smi"] = smi.stdout.strip()
except Exception as exc:  # noqa: BLE001 - the summary is written whatever is missing
    env["env_error"] = repr(exc)
json.dump(env, open(path, "w"), indent=2)
PY
}

# run_stage NAME CAP_S COMMAND...: runs COMMAND under min(CAP_S, what is left), logs it, records its status
run_stage() {
  local name=$1 cap=$2; shift 2
  local left=$((BUDGET_S - ($(date +%s) - START)))
  if [ "$left" -lt 30 ]; then
    say "$name: skipped ($left s left of the budget)"; echo "$name 0 skipped" >>"$STAGES"; summary; return
  fi
  local limit=$((cap < left ? cap : left)) t0=$(date +%s) status
  say "$name: start (limit $limit s)"
  STAGE_LIMIT_S=$limit timeout --kill-after=15 "$limit" "$@" >>"$LOG" 2>&1  # a stage may fit itself to it
  local rc=$?
  case $rc in 0) status=ok ;; 124|137) status="timeout after $limit s" ;; *) status="failed rc=$rc" ;; esac
  echo "$name $(($(date +%s) - t0)) $status" >>"$STAGES"
  say "$name: $status in $(($(date +%s) - t0)) s"
  summary
}

stage() {
  case $1 in
    tests) run_stage tests 170 python3 -m pytest -q -s -m cuda \
             -p no:cacheprovider -o addopts="" --junitxml="$OUT/cuda_tests.xml" --timeout 150 \
             tests/layouts/test_engine_cuda.py tests/distributed/test_cuda_group.py ;;
    gen135) run_stage gen135 100 python3 benchmarks/serving/engine.py --device $DEV --model $MODEL \
              --concurrency $GEN_C --variants continuous,hf-generate --workloads fixed --repeats 3 --profile "${NEW[@]}" \
              --output "$RES/engine_cuda_135m.json" ;;
    server) run_stage server 150 python3 benchmarks/serving/server_throughput.py --device $DEV --model $MODEL \
              --concurrency $SRV_C --repeats 3 --output "$RES/server_cuda_135m.json" ;;
    serverload) run_stage serverload 150 python3 benchmarks/serving/server_throughput.py --device $DEV --model $MODEL \
                  --concurrency $SRV_C --repeats 2 --calls 4 --py-spy "$OUT/serverload" \
                  --output "$RES/server_cuda_135m_load.json" ;;
    serverload_gil1) run_stage serverload_gil1 150 python3 benchmarks/serving/server_throughput.py --device $DEV \
                       --model $MODEL --concurrency $SRV_C --repeats 2 --calls 4 \
                       --server-generator '{"gil_switch_interval_ms": 1}' --py-spy "$OUT/serverload_gil1" \
                       --output "$RES/server_cuda_135m_load_gil1.json" ;;
    serverload_wait30) run_stage serverload_wait30 150 python3 benchmarks/serving/server_throughput.py --device $DEV \
                         --model $MODEL --concurrency $SRV_C --repeats 2 --calls 4 \
                         --server-generator '{"batch_wait_ms": 30}' --output "$RES/server_cuda_135m_load_wait30.json" ;;
    server512) run_stage server512 120 python3 benchmarks/serving/server_throughput.py --device $DEV --model $MODEL \
                 --concurrency $SRV_C --repeats 2 --max-tokens 512 --output "$RES/server_cuda_135m_512.json" ;;
    loop) run_stage loop 345 python3 benchmarks/training/rl_loop.py --device $DEV --model $MODEL17 "${LOOP[@]}" \
            --output "$RES/rl_loop_cuda_17b.json" ;;
    train) run_stage train 90 python3 benchmarks/serving/engine.py --device $DEV --model $MODEL --train "${TRAIN[@]}" \
             --train-variants default,flat --profile --output "$RES/train_cuda_135m.json" ;;
    train_compile) run_stage train_compile 150 python3 benchmarks/serving/engine.py --device $DEV --model $MODEL --train \
                     "${TRAIN[@]}" --train-variants default,compile,flat+compile \
                     --output "$RES/train_cuda_135m_compile.json" ;;
    train8k) run_stage train8k 90 python3 benchmarks/serving/engine.py --device $DEV --model $MODEL --train \
               "${TRAIN[@]}" --profile --logprob-chunk 8192 --output "$RES/train_cuda_135m_chunk8192.json" ;;
    group) run_stage group 150 python3 benchmarks/training/layouts.py --device $DEV --model $MODEL --procs 1 \
             --layouts hf+in-process,hf+trainer-group --rounds 3 --no-baseline --output "$RES/layouts_cuda_135m.json" ;;
    snapshot) run_stage snapshot 90 python3 benchmarks/training/snapshot_write.py --device $DEV --model $MODEL \
                --output "$RES/snapshot_cuda_135m.json" ;;
    gen17) run_stage gen17 150 python3 benchmarks/serving/engine.py --device $DEV --model $MODEL17 --concurrency $GEN_C \
             --variants continuous --workloads fixed "${NEW[@]}" --output "$RES/engine_cuda_17b.json" ;;
    train17) run_stage train17 180 python3 benchmarks/serving/engine.py --device $DEV --model $MODEL17 --train "${TRAIN[@]}" \
               --output "$RES/train_cuda_17b.json" ;;
    *) engine_process_stage "$1" || { say "unknown stage $1"; echo "$1 0 unknown" >>"$STAGES"; } ;;
  esac
}

# ---- the engine process and the replicas (issue 49): their stages in a block of their own
#   serverproc     ajet server with the embedded engine in an engine process of its own and ajet server with it in
#                  process, side by side in the same rounds, at c64, one burst, against the same generations
#                  engine-direct (server_over_direct for each); confirms (or not) generator.engine_process's GPU
#                  default (auto: on on CUDA)
#   serverprocload the same, sustained: 4 calls per client, one after the other
engine_process_stage() {
  local tokens=()
  [ "$REHEARSE" = 1 ] && tokens=(--max-tokens 16)
  case $1 in
    serverproc) run_stage serverproc 240 python3 benchmarks/serving/server_throughput.py --device $DEV --model $MODEL \
                  --concurrency $SRV_C --repeats 3 --engine-process off,on "${tokens[@]}" \
                  --output "$RES/server_cuda_135m_engine_process.json" ;;
    serverprocload) run_stage serverprocload 300 python3 benchmarks/serving/server_throughput.py --device $DEV \
                      --model $MODEL --concurrency $SRV_C --repeats 2 --calls 4 --engine-process off,on \
                      "${tokens[@]}" --output "$RES/server_cuda_135m_engine_process_load.json" ;;
    replicas) run_stage replicas 300 python3 benchmarks/serving/replicas.py --device $DEV --model $MODEL \
                --concurrency $REP_C --rounds 1 --episodes $REP_EPISODES --output "$RES/replicas_cuda_135m.json" ;;
    *) return 1 ;;
  esac
}

summary
say "$(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__, "cuda", torch.cuda.is_available())' 2>&1)"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests serverproc replicas loop train train_compile serverprocload gen135 serverload group snapshot server train17 gen17)  # the last ones: if time is left
for s in "${stages[@]}"; do stage "$s"; done
say "done; files in $OUT:"
ls -la "$OUT" | tee -a "$LOG"
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.pop(\"results\", None); print(json.dumps(d, indent=1))" "$OUT/summary.json"
