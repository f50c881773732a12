"""``python -m pretrain_exp``: the command line (:mod:`pretrain_exp.app.cli`)."""

from pretrain_exp.app.cli import main

if __name__ == "__main__":
    main()
