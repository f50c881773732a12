#!/usr/bin/env bash
# report.sh <run or sweep dir> [--out DIR]: report.csv, report.md and effect_vs_dup.png of every job.
set -euo pipefail
exec "${PYTHON:-python}" -m pretrain_exp.report "$@"
