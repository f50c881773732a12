"""``python -m pretrain_exp.report``: the report command line (:func:`pretrain_exp.report.cli.main`)."""

import sys

from pretrain_exp.report.cli import main

if __name__ == "__main__":
    sys.exit(main())
