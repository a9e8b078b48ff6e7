#!/usr/bin/env bash
# One 10-minute device run of the demo-voice recipe, from the repository root:
#   bash recipes/demo-voice/gpu_run.sh MINUTES [TRANSCRIPTS]
# Installs the carried wheels (.whl) and espeak-ng (.deb), makes the data if
# runs/data is missing or incomplete (make_data.py skips finished WAVs; the
# mel cache is rebuilt only when missing), then trains Tacotron2 and WaveGlow
# side by side for MINUTES each (on two GPUs when there are two), resuming
# from runs/*/checkpoint.pt or, on a fresh machine, from .resume/ (or, with
# neither, from the snapshot committed in recipes/demo-voice/snapshot/), and puts
# the logs (logs.tar) and packed checkpoints under $OUT (in 15 MB parts: the
# device returns files of at most 16 MiB). Copy the parts into .resume/ here;
# the next run carries them. WG_B_ARGS="..." trains a second WaveGlow beside
# the first (runs/waveglow_b), for comparisons; MODELS="waveglow" leaves
# Tacotron2 out (see the recipe README's "On the GPU machine" for the other variables).
# With EVAL=1 in the environment it then also synthesizes the held-out lines
# (with the constructed WaveGlow unless EVAL_WAVEGLOW names another).
set -uo pipefail
minutes=${1:?minutes}
transcripts=${2:-}
R=recipes/demo-voice
OUT=${OUT:-runs/out}
mkdir -p "$OUT" runs
# The image lacks tts_cli's small dependencies; install the carried wheels
# only where they are missing (so the script also runs on a dev machine).
if ! python3 -c "import unidecode, inflect, soundfile" 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
. $R/espeak_env.sh .deb /tmp/espeak || exit 1
nvidia-smi --query-gpu=name,memory.used --format=csv,noheader
start=$(date +%s)
python3 $R/make_data.py --out runs/data --espeak "$ESPEAK" ${transcripts:+--transcripts "$transcripts"} || exit 1
# The mel cache is remade only when the file lists changed since it was made.
[ runs/data/mels.pt -nt runs/data/train.psv ] || python3 $R/mel.py --data runs/data || exit 1
# espeak-ng's word starts, which Tacotron2's attention is guided towards (--guide words)
[ runs/data/word_starts.pt -nt runs/data/train.psv ] || python3 $R/word_timings.py --data runs/data || exit 1
echo "data ready after $(( $(date +%s) - start )) s"
# MODELS: the trainings of this call (default both; WG_B_ARGS adds the
# second WaveGlow). MODELS=waveglow gives WaveGlow the GPU alone.
models=${MODELS:-tacotron2 waveglow}
# On a fresh machine, resume from the packed checkpoints an earlier run
# returned (carried in .resume/; see portable.py).
# WG_B_ARGS="...": a second WaveGlow trains beside the first, in
# runs/waveglow_b with these options (never from the snapshot: it is the
# other arm of a comparison, measured side by side on the same GPU).
runs_here="$models${WG_B_ARGS:+ waveglow_b}"
for m in $runs_here; do
    if [ ! -f runs/$m/checkpoint.pt ] && ls .resume/$m.resume.pt.part-* >/dev/null 2>&1; then
        cat .resume/$m.resume.pt.part-* > /tmp/$m.resume.pt
        python3 $R/portable.py unpack /tmp/$m.resume.pt runs/$m/checkpoint.pt || exit 1
        echo "$m: resumed from .resume/"
    fi
done
# With two GPUs each model gets its own (their processes would otherwise
# take turns on one); T2_GPU / WG_GPU override.
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
t2_gpu=${T2_GPU:-0}
wg_gpu=${WG_GPU:-$([ "$gpus" -ge 2 ] && echo 1 || echo 0)}
# train MODEL GPU BATCH: train_MODEL.py on GPU for MINUTES. Both trainers
# replay their steps from CUDA graphs; should a process fail on this
# machine, the rest of its budget runs eagerly (slower, not lost), except
# after a divergence (exit status 3: the last good checkpoint is kept, and
# rerunning at the same --lr would diverge again; pass a lower one in
# TACOTRON2_ARGS / WAVEGLOW_ARGS).
# left: what is left of MINUTES since the trainings were due to start.
left() { python3 -c "print(max(0, $minutes - ($(date +%s) - $started) / 60))"; }
started=$(date +%s)
train() {
    local run=$1 model=${1%_b}
    export CUDA_VISIBLE_DEVICES=$2
    local args=(--data runs/data --out runs/$run --batch-size "$3")
    # With no checkpoint (neither runs/ nor .resume/), start from the
    # committed snapshot (the trainer reads it only then), for the runs
    # named in SNAPSHOT (default both; SNAPSHOT=tacotron2 starts a WaveGlow
    # of another objective or size from scratch).
    [[ " ${SNAPSHOT:-tacotron2 waveglow} " == *" $run "* ]] && [ -f $R/snapshot/demo_$model.pt ] \
        && args+=(--init-from $R/snapshot/demo_$model.pt)
    # TACOTRON2_ARGS / WAVEGLOW_ARGS / WG_B_ARGS: more options for one run (word-split)
    local extra_name="${model^^}_ARGS"
    [ "$run" = waveglow_b ] && extra_name=WG_B_ARGS
    args+=(${!extra_name:-})
    python3 $R/train_$model.py "${args[@]}" --minutes "$(left)"
    local status=$?
    [ $status = 0 ] || [ $status = 3 ] \
    || python3 $R/train_$model.py "${args[@]}" --no-graphs --minutes "$(left)"
}
# T2_AFTER=FILE / WG_AFTER=FILE: that model's GPU first serves another job
# (a benchmark in the same device call); its training waits for FILE and
# takes what is left.
wait_for() {
    [ -n "$1" ] || return 0
    while [ ! -e "$1" ] && [ "$(left)" != 0 ]; do sleep 2; done
}
pids=()
if [[ " $runs_here " == *" tacotron2 "* ]]; then
    ( wait_for "${T2_AFTER:-}"; train tacotron2 "$t2_gpu" 128 ) > runs/tacotron2.out 2>&1 &
    pids+=($!)
fi
# The WaveGlows' training audio (runs/data/audio.pt), read once here: two
# trainers each reading the 12,400 WAVs took 190 s of a call.
if [[ " $runs_here " == *" waveglow"* ]]; then
    python3 -c "import sys, pathlib; sys.path[:0] = ['$R']; import train_waveglow as w; w.AudioSegments.read_clips(pathlib.Path('runs/data'))" || exit 1
fi
for run in waveglow waveglow_b; do
    [[ " $runs_here " == *" $run "* ]] || continue
    ( wait_for "${WG_AFTER:-}"; train $run "$wg_gpu" 64 ) > runs/$run.out 2>&1 &
    pids+=($!)
done
wait "${pids[@]}"
for m in $runs_here; do tail -n 4 runs/$m.out; done
# What comes back (at most 8 files of 16 MiB): the logs (one tar), and the
# checkpoints packed for the next run (carry them as .resume/); the exports
# are made from them here: train_*.py --minutes 0 resumes, trains nothing and
# exports.
for m in $runs_here; do cp runs/$m/log.jsonl "runs/${m}_log.jsonl"; done
tar -C runs -cf "$OUT/logs.tar" $(for m in $runs_here; do echo "${m}_log.jsonl"; done)
for m in $runs_here; do
    python3 $R/portable.py pack runs/$m/checkpoint.pt /tmp/$m.resume.pt || exit 1
    split -b 15M /tmp/$m.resume.pt "$OUT/$m.resume.pt.part-"
done
# EVAL=1: also speak the 100 held-out lines with the exports; the WAVs and
# synth.json come back as a .tgz in 15 MB parts (23 MB for the 100 lines)
# for `evaluate.py score`, which runs where the recognizer is. Leave it
# 3 minutes or more of the call: 110-140 s left after training were not
# enough once (then in batches of 20; cause not measured), and scoring on
# the CPU (the recipe README's Evaluation; 100 s on 2 cores) costs no device
# time.
# The WaveGlow is the demo's constructed one (construct_waveglow.py, seconds),
# or with EVAL_WAVEGLOW=runs/waveglow/demo_waveglow.pt the one this call trained.
if [ "${EVAL:-0}" = 1 ]; then
    # (each step says when it starts, to find where the time goes)
    waveglow=${EVAL_WAVEGLOW:-runs/constructed_waveglow.pt}
    echo "eval: WaveGlow at $(( $(date +%s) - start )) s"
    [ -f "$waveglow" ] || python3 $R/construct_waveglow.py --data runs/data --out "$waveglow" || exit 1
    echo "eval: speaking at $(( $(date +%s) - start )) s"
    # 50 lines a batch: synth decodes eagerly, step by step, so its time goes
    # with the number of batches times their longest line, and its default of
    # 20 lines is for a small CPU's memory (100 lines took more than the
    # 23 GB of the dev machine, with the tests running beside them:
    # WaveGlow's upsampled mel alone is 80 values a sample, 8 GB for 100
    # lines of 10 s).
    python3 $R/evaluate.py synth --data runs/data --out runs/eval --batch-size 50 \
        --tacotron2 runs/tacotron2/demo_tacotron2.pt --waveglow "$waveglow" || exit 1
    echo "eval: packing at $(( $(date +%s) - start )) s"
    tar -C runs -czf - eval | split -b 15M - "$OUT/eval.tgz.part-"
fi
# The device returns at most 64 MiB in all, and what is over it is lost
# (a second WaveGlow of 7.4 M parameters was once lost that way: 44 MB
# packed, beside Tacotron2's 25 and WaveGlow's 19). Say so loudly.
total=$(du -cb "$OUT"/* | tail -1 | cut -f1)
[ "$total" -le $(( 64 * 1024 * 1024 )) ] || echo "WARNING: $OUT holds $total bytes, over the 64 MiB that" \
    "comes back: some packed checkpoints will be lost; train fewer models per call (MODELS=...) or leave EVAL out"
ls -la "$OUT"
