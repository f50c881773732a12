"""``python -m pretrain_exp.release <run or sweep dir> <out dir> [--push REPO_ID] ...``: see
:mod:`pretrain_exp.report.release`."""

import sys

from pretrain_exp.report.release import main

if __name__ == "__main__":
    sys.exit(main())
