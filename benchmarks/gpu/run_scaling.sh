#!/usr/bin/env bash
# On one device machine with N GPUs (see tests/gpu/device_env.sh for what it needs), the
# several-GPU figures, each on 1, 2, 4, ... GPUs of the same machine (one rank per GPU):
#   criteo       the Criteo job at per-GPU batch 65,536, with and without --xla, its input
#                through tf.data (dataset) and GPU-resident (resident)
#   embedding    benchmarks/embedding's 26-field step at per-GPU batch 8,192 and 65,536
#   profile      the 26-field step's per-op GPU time on every rank (--profile), 2 and 4 GPUs
#   collectives  SOK's and Horovod's all-to-all and all-reduce against NCCL's own (PyTorch)
#   fields100    the seed's synthetic case (100 fields x 10 ids, vocab 8,192, an MLP of six
#                1,024-wide layers) at a FIXED global batch (strong scaling) on 1, 2 and 4 GPUs,
#                plus sok and tf in one process on 1 GPU (the "x over TensorFlow" baseline)
#   trace        the Criteo job's traced steps on 1, 2, 4, ... GPUs, summarised per rank
#   ab           base against main on the same machine: AB_JOB (criteo, fields100 or embedding)
#                at AB_GPUS GPUs, AB_ROUNDS alternating runs of each (build/sok_pkg_base, made
#                by tools/stage_gpu_package.sh --base REV, with REV's benchmark scripts; main:
#                build/sok_pkg and this checkout's scripts)
# Full logs go to $OUT (or build/gpu_logs); the summary lines go to stdout.
#   bash benchmarks/gpu/run_scaling.sh [criteo|embedding|collectives|fields100 ...]
#   (default: criteo embedding collectives)
set -uo pipefail
cd "$(dirname "$0")/../.."
. tests/gpu/device_env.sh
out="${OUT:-build/gpu_logs}"; mkdir -p "$out"
ngpu=$(nvidia-smi -L | wc -l)
sizes=""; for n in 1 2 4 8; do [ "$n" -le "$ngpu" ] && sizes="$sizes $n"; done
sizes=${SCALING_SIZES:-$sizes}  # e.g. "2": one GPU count only
launch() {  # launch N cmd...: one process on GPU 0, or horovodrun over N GPUs
  local n=$1; shift
  if [ "$n" = 1 ]; then CUDA_VISIBLE_DEVICES=0 python3 "$@"
  else horovodrun -np "$n" -H "localhost:$n" --gloo python3 "$@" --horovod; fi
}

criteo() {  # CRITEO_INPUTS (default: dataset resident), CRITEO_XLA=0 leaves --xla out, CRITEO_ARGS
            # more flags for every run (e.g. "--threads 16": TF's thread pools per rank);
            # CRITEO_STEPS (default 200), CRITEO_DATA_STEPS: the synthetic split holds that many
            # steps' batches (default: CRITEO_STEPS, one pass); fewer make a longer timed window
            # over several passes without drawing more rows
  local xlas="none --xla"; [ "${CRITEO_XLA:-1}" = 0 ] && xlas="none"
  for input in ${CRITEO_INPUTS:-dataset resident}; do
    for n in $sizes; do
      for xla in $xlas; do
        [ "$xla" = none ] && xla=""
        log="$out/criteo_${input}_np${n}${xla:+_xla}.txt"
        launch "$n" benchmarks/criteo/run.py --batch_size $((65536 * n)) --steps "${CRITEO_STEPS:-200}" \
          --synthetic_train_samples $((65536 * n * ${CRITEO_DATA_STEPS:-${CRITEO_STEPS:-200}})) \
          --warmup_steps 30 --log_every 0 --eval_every 0 --no_plot --input "$input" $xla \
          ${CRITEO_ARGS:-} > "$log" 2>&1
        echo "criteo input=$input gpus=$n ${xla:-no-xla} exit=$? $(grep -o 'RESULT.*' "$log" | tail -n 1)"
      done
    done
  done
}

trace() {  # the Criteo job's traced steps (resident input) at every GPU count, per rank: where the
           # step's time goes (GPU work, idle gaps and the host ops beside them; timeline.py)
  for n in $sizes; do
    log="$out/criteo_trace_np$n.txt"
    launch "$n" benchmarks/criteo/run.py --batch_size $((65536 * n)) --steps 200 --warmup_steps 40 \
      --log_every 0 --eval_every 0 --no_plot --input resident --trace_dir "/tmp/sok_trace_np$n" \
      > "$log" 2>&1
    echo "criteo trace gpus=$n exit=$? $(grep -o 'samples_per_sec=[0-9]*' "$log" | tail -n 1)"
    python3 benchmarks/common/timeline.py "/tmp/sok_trace_np$n" --top 40 >> "$log" 2>&1
    grep -h "median wall" "$log"
  done
}

ab() {  # AB_JOB, AB_GPUS (default 2), AB_ROUNDS (default 2): base and main alternate
  local n=${AB_GPUS:-2} job=${AB_JOB:-criteo} base="$PWD/build/sok_pkg_base" t
  [ -d "$base" ] || { echo "ab: no $base (tools/stage_gpu_package.sh --base REV)"; return 1; }
  local -a args
  case $job in
    criteo) args=(benchmarks/criteo/run.py --batch_size $((65536 * n)) --steps 120 --warmup_steps 30
                  --log_every 0 --eval_every 0 --no_plot --input resident) ;;
    fields100) args=(benchmarks/embedding/run.py --config fields100 --device gpu
                     --mlp 1024,1024,1024,1024,1024,1024 --global-batch 65536 --mode graph
                     --inputs resident --rounds 2 --steps 10 --num-batches 2 --impls sok
                     --dists uniform) ;;
    embedding) args=(benchmarks/embedding/run.py --config criteo26 --device gpu --impls sok
                     --batch 65536 --mode graph --inputs resident --dists uniform) ;;
    *) echo "ab: unknown AB_JOB $job"; return 1 ;;
  esac
  for r in $(seq "${AB_ROUNDS:-2}"); do
    for v in base main; do
      log="$out/ab_${job}_np${n}_${v}_$r.txt"
      if [ $v = base ]; then  # the base's package and, where staged, its own benchmark script
        local script="${args[0]}"; [ -f "$base/$script" ] && script="$base/$script"
        PYTHONPATH="$base:$PYTHONPATH" launch "$n" "$script" "${args[@]:1}" > "$log" 2>&1
      else launch "$n" "${args[@]}" > "$log" 2>&1; fi
      rc=$?
      # " step_ms": the slowest rank's (rank_step_ms lists every rank's own)
      t=$(grep -oE 'samples_per_sec=[0-9]+| step_ms=[0-9.]+' "$log" | tail -n 1 | tr -d ' ')
      # One process (no HOROVOD line): the table's median wall time of SOK's step.
      [ -n "$t" ] || t=$(awk '$3 == "wall" {print "step_ms=" $NF}' "$log" | tail -n 1)
      echo "ab $job gpus=$n $v round=$r exit=$rc $t"
    done
  done
}

embedding() {  # under horovodrun at every size (1 rank: the one-process lookup); EMB_BATCHES, EMB_MODES
  for batch in ${EMB_BATCHES:-8192 65536}; do
    for n in $sizes; do
      log="$out/embedding_np${n}_b${batch}.txt"
      horovodrun -np "$n" -H "localhost:$n" --gloo python3 benchmarks/embedding/run.py --horovod \
        --config criteo26 --device gpu --impls sok --batch "$batch" --mode "${EMB_MODES:-both}" --inputs resident \
        --rounds 3 --steps 10 > "$log" 2>&1
      echo "embedding gpus=$n batch=$batch exit=$?"; grep -o 'HOROVOD .*' "$log"
    done
  done
}

profile() {  # one traced step per rank after warm-up; every rank prints its op table
  for n in $sizes; do
    [ "$n" = 1 ] && continue
    log="$out/embedding_profile_np${n}.txt"
    horovodrun -np "$n" -H "localhost:$n" --gloo python3 benchmarks/embedding/run.py --horovod \
      --config criteo26 --device gpu --impls sok --batch 65536 --mode function --inputs resident \
      --dists uniform --warmup 3 --profile 25 > "$log" 2>&1
    echo "profile gpus=$n exit=$?"; grep -o "traced step.*wall" "$log"
  done
}

fields100() {  # F100_BATCH: the global batch on every GPU count (default 65,536); F100_DISTS
  local batch="${F100_BATCH:-65536}" mlp=1024,1024,1024,1024,1024,1024
  local common=(--config fields100 --device gpu --mlp "$mlp" --global-batch "$batch" --mode graph
                --inputs resident --rounds 2 --steps 10 --num-batches 2
                --dists "${F100_DISTS:-uniform}")
  for n in $sizes; do
    [ "$n" -gt 4 ] && continue
    log="$out/fields100_np${n}.txt"
    horovodrun -np "$n" -H "localhost:$n" --gloo python3 benchmarks/embedding/run.py --horovod \
      "${common[@]}" --impls sok > "$log" 2>&1
    echo "fields100 gpus=$n global_batch=$batch exit=$?"; grep -o 'HOROVOD .*' "$log"
  done
  log="$out/fields100_sok_tf_np1.txt"  # one process, no Horovod: the TensorFlow baseline
  CUDA_VISIBLE_DEVICES=0 python3 benchmarks/embedding/run.py "${common[@]}" --impls sok,tf \
    > "$log" 2>&1
  echo "fields100 sok,tf gpus=1 batch=$batch exit=$?"; grep -E '^(config=|mode |graph )' "$log"
}

collectives() {  # COLL_SIZES: what a rank sends per call (default 1MiB,16MiB,64MiB)
  local bytes="${COLL_SIZES:-1MiB,16MiB,64MiB}"
  for n in $sizes; do
    [ "$n" = 1 ] && continue
    log="$out/collectives_np$n.txt"
    horovodrun -np "$n" -H "localhost:$n" --gloo python3 benchmarks/collectives/run.py \
      --sizes "$bytes" --impls sok,sok_sized,horovod > "$log" 2>&1
    echo "collectives gpus=$n exit=$?"; grep -o 'COLL .*' "$log"
    python3 -m torch.distributed.run --nproc_per_node="$n" benchmarks/collectives/torch_nccl.py \
      --sizes "$bytes" > "$out/collectives_nccl_np$n.txt" 2>&1
    grep -o 'COLL .*' "$out/collectives_nccl_np$n.txt"
  done
}

for stage in "${@:-criteo embedding collectives}"; do
  for s in $stage; do "$s"; done
done
