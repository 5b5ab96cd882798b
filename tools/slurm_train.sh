#!/usr/bin/env bash
# Training on Slurm: GPUS=16 bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [ARGS]
#
# Interruption-proof: SLURM sends SIGUSR1 SIGNAL_TIME seconds (default 120)
# before the step's time limit (srun --signal); training saves a checkpoint of
# the iteration in flight and exits with status 75. Inside a batch job
# (sbatch) the job is then requeued (REQUEUE=0 to not), and when it starts
# again it resumes by itself: --resume takes the newest complete checkpoint
# of WORK_DIR, or starts from the beginning if there is none.
if [ "$#" -lt 4 ]; then
  echo "error: GPUS=N bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR [ARGS] takes the partition, a job name, a config and the work dir, then tools/train.py's options; got $# argument(s)." >&2
  exit 2
fi
SIGNAL_TIME=${SIGNAL_TIME:-120}
SRUN_ARGS="--signal=USR1@${SIGNAL_TIME} ${SRUN_ARGS:-}" \
  bash "$(dirname "$0")/srun.sh" "$1" "$2" train.py "$3" --work-dir="$4" \
  --resume "${@:5}"
status=$?
if [ "$status" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ] && [ "${REQUEUE:-1}" = 1 ]; then
  echo "Pre-empted with a checkpoint: requeueing job ${SLURM_JOB_ID}, which resumes from it."
  scontrol requeue "${SLURM_JOB_ID}"
fi
exit "$status"
