#!/usr/bin/env bash
# On one device machine (after ../shared/tools/tf-gpu's device-setup.sh, with build/sok_pkg
# carried: tools/stage_gpu_package.sh), the tiered tables' figures
# on one GPU (the README of benchmarks/embedding, Tiered tables (GPU), records them):
#   core   benchmarks/gpu/tier_bench, the framework-free CUDA core, 26 tables (TIER_BENCH: the
#          binary, default benchmarks/gpu/build/tier/tier_bench, built with -DSOK_STATIC_CUDART=ON
#          as build_harness.sh does)
#   onetable  the same ids as one table of 26 x the vocabulary: what the per-table work costs
#   tf     benchmarks/embedding's criteo26 step at batch 65,536 in a TF1 graph: sok (all in GPU
#          memory) against sok_tier (HBM_DRAM, a cache of 10%), LFU then LRU, uniform and
#          power-law ids, plus one --check run per strategy (sok_tier's rows equal sok's);
#          TIER_STRATEGIES="lfu" runs one strategy
#   ssd    the same step with HBM_DRAM_SSDHASH (HBM 10%, DRAM 30%, the rest in files under
#          /tmp), LFU, timed and checked
#   trace  the tf step's per-op GPU times (--profile 3), sok against sok_tier (HBM_DRAM LFU),
#          power-law ids
#   ncu    per-kernel GPU time of tier_bench's LFU step on power-law ids (Nsight Compute's
#          summary; where the machine's runtime lets it read the GPU)
#   ab     the tf step (LFU) of build/sok_pkg_base (tools/stage_gpu_package.sh --base REV)
#          and of build/sok_pkg alternating, TIER_AB_ROUNDS rounds (default 2), then traced
#          power-law steps of each (--profile 3: their three costliest op types): a tier change
#          against the code before it
# Full logs go to $OUT (or build/gpu_logs); the summary lines go to stdout.
#   bash benchmarks/gpu/run_tiers.sh [core|onetable|tf|ssd|trace|ncu|ab ...]   (default: core tf)
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-build/gpu_logs}"; mkdir -p "$out"
bench=${TIER_BENCH:-benchmarks/gpu/build/tier/tier_bench}

core() {
  "$bench" > "$out/tier_bench.txt" 2>&1
  echo "core exit=$?"; grep -E "^(COPY|KEYS|TIER)" "$out/tier_bench.txt"
}

onetable() {
  TIER_IMPLS=hbm,host_only,hbm_dram_lfu "$bench" 1 8 5200000 52 > "$out/tier_bench_1table.txt" 2>&1
  echo "core one table exit=$?"; grep -E "^TIER" "$out/tier_bench_1table.txt"
}

# The TF step with HBM_DRAM tables (cache 10%), run on package $1 (build/sok_pkg or a base's);
# the other arguments add the strategy, the impls, the ids and what to do.
tier_step() {
  local pkg=$1; shift
  PYTHONPATH="$pkg${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2 python3 \
    benchmarks/embedding/run.py --config criteo26 --device gpu --batch 65536 \
    --storage hbm_dram --cache-fraction 0.1 --inputs resident --mode graph "$@"
}

tf() {
  . /opt/tfgpu/env.sh
  local cs log main="$PWD/build/sok_pkg"
  for cs in ${TIER_STRATEGIES:-lfu lru}; do
    log="$out/tier_tf_$cs.txt"
    tier_step "$main" --cache-strategy "$cs" --impls sok,sok_tier --dists uniform,powerlaw \
      --steps 10 --rounds 3 > "$log" 2>&1
    echo "tf $cs exit=$?"; grep -E "^(graph|  graph)|Error" "$log"
  done
  for cs in ${TIER_STRATEGIES:-lfu lru}; do
    log="$out/tier_tf_check_$cs.txt"
    tier_step "$main" --cache-strategy "$cs" --impls sok,sok_tier --dists uniform,powerlaw \
      --check 6 > "$log" 2>&1
    echo "tf check $cs exit=$?"; grep -E "^TIER|check|Error" "$log" | tail -n 8
  done
}

ssd() {
  . /opt/tfgpu/env.sh
  export PYTHONPATH="$PWD/build/sok_pkg${PYTHONPATH:+:$PYTHONPATH}" TF_CPP_MIN_LOG_LEVEL=2
  local log="$out/tier_tf_ssd.txt" run
  for run in "--steps 10 --rounds 3" "--check 6"; do
    # shellcheck disable=SC2086  # $run: several flags
    python3 benchmarks/embedding/run.py --config criteo26 --device gpu --batch 65536 \
      --storage hbm_dram_ssd --cache-fraction 0.1 --dram-fraction 0.3 --cache-strategy lfu \
      --storage-path /tmp/sok_tier --impls sok,sok_tier --inputs resident --mode graph \
      --dists uniform,powerlaw $run >> "$log" 2>&1
    echo "tf ssd ($run) exit=$?"
  done
  grep -E "^(graph|  graph|TIER)|check|Error" "$log"
}

trace() {
  . /opt/tfgpu/env.sh
  local log="$out/tier_tf_trace.txt"
  tier_step "$PWD/build/sok_pkg" --cache-strategy lfu --impls sok,sok_tier --dists powerlaw \
    --profile 3 > "$log" 2>&1
  echo "trace exit=$? ($log)"
}

ab() {
  . /opt/tfgpu/env.sh
  local base="$PWD/build/sok_pkg_base" r v
  [ -d "$base" ] || { echo "ab: no $base (tools/stage_gpu_package.sh --base REV)"; return 1; }
  local -A pkg=([base]="$base" [main]="$PWD/build/sok_pkg")
  for r in $(seq "${TIER_AB_ROUNDS:-2}"); do
    for v in base main; do
      tier_step "${pkg[$v]}" --cache-strategy lfu --impls sok,sok_tier --dists uniform,powerlaw \
        --steps 10 --rounds 3 > "$out/tier_ab_${v}_$r.txt" 2>&1
      echo "ab $v round=$r exit=$?"; grep -E "^graph .*wall" "$out/tier_ab_${v}_$r.txt"
    done
  done
  for v in base main; do
    tier_step "${pkg[$v]}" --cache-strategy lfu --impls sok_tier --dists powerlaw --profile 3 \
      > "$out/tier_ab_trace_$v.txt" 2>&1
    echo "ab trace $v exit=$?"; grep -E "traced step|SokEmbeddingVariable" "$out/tier_ab_trace_$v.txt"
  done
}

ncu_profile() {
  local log="$out/tier_ncu.txt"
  TIER_IMPLS=hbm_dram_lfu TIER_DISTS=zipf1.15 timeout 150 ncu --clock-control none \
    --metrics gpu__time_duration.sum --print-summary per-kernel "$bench" 26 2 > "$log" 2>&1
  echo "ncu exit=$? ($log)"
}

for job in ${@:-core tf}; do
  case $job in
    core) core ;;
    onetable) onetable ;;
    ssd) ssd ;;
    tf) tf ;;
    trace) trace ;;
    ncu) ncu_profile ;;
    ab) ab ;;
    *) echo "unknown job $job"; exit 2 ;;
  esac
done
