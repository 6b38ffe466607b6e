#!/usr/bin/env bash
# GPU tests and benchmarks, run on the H200 through the device tool; results land under $OUT.
#   [QUICK=1] bash scripts/gpu_check.sh [tests] [repeat] [parity] [profile] [timeline] [decode] [kernels] [tiles]
#                                      [balance] [reduce] [lm_head] [logprobs] [sampling] [prefill] [prefill_e2e]
#                                      [sampled] [arrivals] [serving] [soak] [soak_replay]
#                                      [moe_tune] [moe_decode] [moe_logprobs] [moe_profile] [moe_prefill]
#   (prefill_e2e, arrivals, serving and soak need the server's wheels: bench_prefill and bench_serve parse with
#   pydantic_core)
#   (default: all; QUICK=1: decode and logprobs with fewer tokens and repetitions, a few minutes)
# Pass GIT_COMMIT=<sha> (the device machine has no .git) so results name their commit.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1  # keeps carried wheels (/tmp/site) visible
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
if [ -n "${QUICK:-}" ]; then default="decode logprobs"; else default="tests repeat parity profile timeline decode sampled kernels reduce lm_head logprobs sampling prefill prefill_e2e arrivals serving soak soak_replay"; fi
steps=${*:-$default}
status=0
run() { echo "== $*"; "$@" || { status=1; echo "!! failed: $*"; }; }
exec > >(tee "$OUT/gpu_check.log") 2>&1
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
for step in $steps; do
  case $step in
    # tests/server, tests/scripts and tests/structured have no GPU test, and collecting them needs the server's
    # packages and xgrammar
    tests)  run python3 -m pytest -m gpu -p no:cacheprovider -rs --ignore=tests/server --ignore=tests/scripts \
              --ignore=tests/structured ;;
    repeat) run python3 -m scripts.repeat_check --config qwen3-0.6b --repeats 5 ;;
    parity) run python3 -m scripts.gpu_parity --config qwen3-0.6b --out "$OUT" ;;
    profile) run python3 -m scripts.profile_decode --config qwen3-4b --batch 1 8 32 64 --out "$OUT" ;;
    timeline) run python3 -m scripts.step_timeline --config qwen3-4b --batch 1 8 32 --out "$OUT" ;;
    decode) run python3 -m scripts.bench_decode --config qwen3-4b ${QUICK:+--quick} --out "$OUT" ;;
    sampled) run python3 -m scripts.bench_decode --config qwen3-4b --quick --hf-batch --batch 1 8 32 64 128 256 \
               --sampling greedy temperature filtered top_p penalized min_p --out "$OUT/sampled" ;;
    kernels) run python3 -m scripts.bench_kernels --out "$OUT" ;;
    tiles) run python3 -m scripts.bench_kernels --parts tiles --out "$OUT/tiles" ;;
    balance) run python3 -m scripts.bench_kernels --parts balance --out "$OUT/balance" ;;
    reduce) run python3 -m scripts.bench_reduce ${QUICK:+--quick} --out "$OUT" ;;
    lm_head) run python3 -m scripts.bench_lm_head --out "$OUT" ;;
    logprobs) run python3 -m scripts.bench_logprobs ${QUICK:+--quick} --out "$OUT" ;;
    sampling) run python3 -m scripts.sampling_check --out "$OUT" ;;
    prefill) run python3 -m scripts.bench_prefill_attention --out "$OUT" ;;
    prefill_e2e) run python3 -m scripts.bench_prefill --config qwen3-4b ${QUICK:+--quick} --out "$OUT" ;;
    arrivals) run python3 -m scripts.bench_prefill --config qwen3-4b --parts arrivals --server \
                --set engine.max_num_batched_tokens=256 --chunk-sizes 512 --out "$OUT/arrivals" ;;
    serving) run python3 -m scripts.bench_serving --config qwen3-4b ${QUICK:+--quick} --out "$OUT/serving" ;;
    # The 10,000-request soak outlasts one device call: the load (its results kept on the machine's disk),
    # then, in the next call while the machine is warm, the offline replay and every check. Both run
    # batch-invariant (engine.batch_invariant): a request's bits then do not depend on what ran beside it, so the
    # replay, 64 requests at a time, must match exactly (no near-tie allowance). A KV cache of 4,096 blocks
    # (65,536 tokens), so that the bursts of long prompts (near a max_model_len of 4,096: the workload's lengths
    # follow it, and the model's own 40,960 would outlast the run) preempt.
    soak) run python3 -m scripts.soak --serve "$OUT/soak_server.log" --config qwen3-4b --requests 10000 \
            --set engine.num_kv_blocks=4096 --set engine.max_model_len=4096 --set engine.batch_invariant=true \
            --concurrency 64 --duration-limit 430 --save /tmp/soak_load.pkl --replay-max 0 --out "$OUT/soak_load.json" ;;
    soak_replay) run python3 -m scripts.soak --replay-from /tmp/soak_load.pkl --config qwen3-4b \
                   --set engine.num_kv_blocks=4096 --set engine.max_model_len=4096 --set engine.batch_invariant=true \
                   --replay-group 64 --tie-tol 0 --out "$OUT/soak.json" ;;
    # Qwen3-30B-A3B (random bf16 weights): the expert kernels' tiles tuned for this GPU (the files' names carry '='
    # and ',', which $OUT does not bring back: a tar does), then its decode, logprobs, profile and prefill.
    moe_tune) run python3 -m scripts.tune_moe && tar -C qwen3_runtime/ops -cf "$OUT/moe_configs.tar" moe_configs ;;
    moe_decode) run python3 -m scripts.bench_decode --config qwen3-30b-a3b --modes graph-async --repeats 3 \
                  --max-tokens 64 --batch 1 8 32 64 --hf-batch 1 8 --out "$OUT/moe_decode" ;;
    moe_logprobs) run python3 -m scripts.bench_logprobs --config qwen3-30b-a3b --quick --out "$OUT/moe_logprobs" ;;
    moe_profile) run python3 -m scripts.profile_decode --config qwen3-30b-a3b --batch 1 8 32 64 --out "$OUT/moe_profile" ;;
    moe_prefill) run python3 -m scripts.bench_prefill --config qwen3-30b-a3b --parts shapes --shapes 1x4096 8x1024 \
                   --out "$OUT/moe_prefill" ;;
    *) echo "unknown step $step"; status=1 ;;
  esac
done
exit $status
