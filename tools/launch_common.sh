# Sourced by torchrun.sh and srun.sh (ROOT set): the Python they run and the
# check of the counts a user gives them.

# PYTHON: the project's environment (ROOT/.venv) unless one is active or
# PYTHON is set.
if [ -z "${PYTHON:-}" ]; then
  if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$ROOT/.venv/bin/python" ]; then
    PYTHON="$ROOT/.venv/bin/python"
  else
    PYTHON=python
  fi
fi

# require_positive WHAT VALUE: one line and exit status 2 unless VALUE is a
# positive integer (a user's mistake, before anything starts).
require_positive() {
  case "$2" in
    ''|*[!0-9]*) ;;
    *) [ "$((10#$2))" -ge 1 ] && return 0 ;;
  esac
  echo "error: $1 must be a positive integer; got '$2'." >&2
  exit 2
}
