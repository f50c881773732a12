"""``python -m pretrain_exp.inspect <run dir or official run> step=K [row=R] | item=ID | search=TEXT [--html OUT]``: see
:mod:`pretrain_exp.app.inspect`."""

import sys

from pretrain_exp.app.inspect import main

if __name__ == "__main__":
    sys.exit(main())
