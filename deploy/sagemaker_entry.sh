#!/usr/bin/env bash
# Entry point for a SageMaker training container: SageMaker sets SM_HOSTS and
# SM_CURRENT_HOST on every host; the estimator's `distribution` argument is
# passed through SM_DISTRIBUTION or as the first argument.
set -euo pipefail
distribution="${1:-${SM_DISTRIBUTION:-{\"parameter_server\": {\"enabled\": true}}}}"
shift || true
: "${PSRT_JOB_TOKEN:?set PSRT_JOB_TOKEN in the estimator environment}"
exec psrt-run --distribution="$distribution" -- "$@"
