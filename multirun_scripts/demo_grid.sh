#!/usr/bin/env bash
# Sweep conf/sweep/demo_grid.yaml: demo_grid.sh [overrides...], e.g. experiment=tiny or a launcher (hydra/launcher=...).
set -euo pipefail
exec "${PYTHON:-python}" -m pretrain_exp -m +sweep=demo_grid "$@"
