#!/usr/bin/env bash
# The GPU check of the embedded engine (issue 12), on a CUDA machine with no network, from the repository root.
# Needs .gpu/ from scripts/gpu_prepare.sh (carried along: 23 MB) and the machine's own python3 with CUDA torch.
# Writes JSON and logs under $OUT (default /tmp/gpu-check). Stages (default: all, about 25 minutes):
#   tests    pytest -m cuda (CUDA graphs, exact fp32 / bounded bf16 logprobs, train in place, LoRA)   ~3 min
#   gen135   benchmarks/serving/engine.py --device cuda --model 135m (c1, c8, c64, c256; fixed and mixed)     ~8 min
#   gen17    benchmarks/serving/engine.py --device cuda --model 1.7b (c1, c8, c64)                             ~8 min
#   train    benchmarks/serving/engine.py --train for 135m and 1.7b (16 x 1024; checkpointing for 1.7b)        ~3 min
#   server   benchmarks/serving/server_throughput.py --device cuda --model 135m (c1, c8, c64)                  ~3 min
# With a 10-minute limit per command, run it as: `scripts/gpu_check.sh tests train`, then `... gen135`, then
# `... gen17`, then `... server`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-check}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/aj-site \
  .gpu/wheels/*.whl || { echo "install of .gpu/wheels failed"; exit 1; }
export PYTHONPATH="/tmp/aj-site:$PWD/src" PYTHONUNBUFFERED=1 AGENTJET_HOME=/tmp/aj-home \
  AGENTJET_SMOLLM2_TOKENIZER="$PWD/.gpu/smollm2-tokenizer" AGENTJET_BENCH_MODELS=/tmp/aj-models
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" \
  | tee -a "$OUT/gpu.txt"
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(tests gen135 gen17 train server)
status=0
for stage in "${stages[@]}"; do
  echo "==> $stage $(date +%T)"
  case $stage in
    tests) AGENTJET_CUDA_REPORT="$OUT/cuda_report.jsonl" python3 -m pytest -q -s -m cuda -p no:cacheprovider \
             tests/test_engine_cuda.py 2>&1 | tee "$OUT/tests.log" ;;
    gen135) python3 benchmarks/serving/engine.py --device cuda --model 135m --output "$OUT/engine_cuda_135m.json" \
              2>&1 | tail -40 ;;
    gen17) python3 benchmarks/serving/engine.py --device cuda --model 1.7b --concurrency 1,8,64 \
             --output "$OUT/engine_cuda_17b.json" 2>&1 | tail -40 ;;
    train) python3 benchmarks/serving/engine.py --device cuda --model 135m --train --output "$OUT/train_cuda_135m.json" \
             2>&1 | tail -20
           python3 benchmarks/serving/engine.py --device cuda --model 1.7b --train --output "$OUT/train_cuda_17b.json" \
             2>&1 | tail -20 ;;
    server) python3 benchmarks/serving/server_throughput.py --device cuda --model 135m \
              --output "$OUT/server_cuda_135m.json" 2>&1 | tail -20 ;;
    *) echo "unknown stage $stage"; status=2 ;;
  esac
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
echo "==> done $(date +%T), status $status; files in $OUT:"; ls -la "$OUT"
exit $status
