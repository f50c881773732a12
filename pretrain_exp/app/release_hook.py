"""``release.push_to_hub``: a finished run pushes itself to the Hub (rank 0).

:class:`Release` is the loop's ``post_train`` component after the results, which it bundles
(:func:`~pretrain_exp.report.release.release_run`: the bundle in ``release.out_dir``, default the run dir's
``release/``, then the model and dataset repos ``release.repo_id``); the cleanup comes after it. Whether a push is
possible at all (online, a token) is checked before anything is trained (:meth:`Experiment.run
<pretrain_exp.app.experiment.Experiment.run>`).
"""

from __future__ import annotations

from pretrain_exp.app.hooks import RunHook
from pretrain_exp.core.config import ReleaseConf
from pretrain_exp.core.rundir import RunDir


class Release(RunHook):
    """The hook (module docstring): :meth:`post_train` pushes the finished run.

    :param rundir: the run dir; ``conf``: the ``release`` node; ``run_name``: the run's name (for the log line).
    :param main: whether this process is rank 0 (the only one that pushes).
    """

    def __init__(self, rundir: RunDir, conf: ReleaseConf, run_name: str, main: bool = True):
        self.rundir, self.conf, self.run_name, self.main = rundir, conf, run_name, main

    def post_train(self) -> None:
        """Bundle and push the finished run (``release.push_to_hub``, rank 0).

        :raises PushError: if the push fails (:func:`~pretrain_exp.report.release.release_run`).
        """
        if self.conf.push_to_hub and self.main:
            from pretrain_exp.report.release import release_run

            release_run(self.rundir, self.conf, self.run_name)
