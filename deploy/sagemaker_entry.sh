#!/usr/bin/env bash
# Entry point for a SageMaker training container: SageMaker sets SM_HOSTS and
# SM_CURRENT_HOST on every host. The distribution JSON comes as the first
# argument or in PSRT_DISTRIBUTION; the training command follows.
set -euo pipefail
distribution="${1:-${PSRT_DISTRIBUTION:-{\"parameter_server\": {\"enabled\": true}}}}"
shift || true
: "${PSRT_JOB_TOKEN:?set PSRT_JOB_TOKEN in the estimator environment}"
exec psrt-run --distribution="$distribution" -- "$@"
