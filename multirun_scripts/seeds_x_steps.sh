#!/usr/bin/env bash
# Sweep conf/sweep/seeds_x_steps.yaml: seeds_x_steps.sh [overrides...], e.g. experiment=tiny or a launcher (hydra/launcher=...).
set -euo pipefail
exec "${PYTHON:-python}" -m pretrain_exp -m +sweep=seeds_x_steps "$@"
