# Sourced by the scripts/run-*.sh recipes: `launch_train FLAGS...` runs the recipe's training command.
#
#   LAUNCH=python (default)  python train.py FLAGS...             (Ray starts a local instance by itself)
#   LAUNCH=ray               slime's way: start a local Ray head if none answers, then
#                            `ray job submit -- python train.py FLAGS...` (scripts/ray/submit.sh)
# TRAIN_SCRIPT=train_async.py selects the pipelined loop in both modes; PYTHON picks the interpreter.
launch_train() {
  local repo
  repo="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")/../.." && pwd)"
  case "${LAUNCH:-python}" in
    python) "${PYTHON:-python}" "${repo}/${TRAIN_SCRIPT:-train.py}" "$@" ;;
    ray)
      # a head of our own on RAY_PORT (not whichever cluster `ray status` would find by itself)
      if ! RAY_AUTH_MODE=token ray status --address "${RAY_HEAD_IP:-127.0.0.1}:${RAY_PORT:-6379}" >/dev/null 2>&1; then
        bash "${repo}/scripts/ray/start-head.sh"
      fi
      bash "${repo}/scripts/ray/submit.sh" "$@" ;;
    *) echo "LAUNCH=${LAUNCH}: choose python or ray" >&2; return 2 ;;
  esac
}
