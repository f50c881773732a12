"""tests/mutation_score.py: the score table of ``make mutation`` from mutmut's ``results --all true`` lines."""

from __future__ import annotations

from tests.mutation_score import table, tally

RESULTS = """\
    pretrain_exp.data.rows.xǁTrainingRowsǁ__getitem____mutmut_1: killed
    pretrain_exp.data.rows.xǁTrainingRowsǁ__getitem____mutmut_2: survived
    pretrain_exp.data.order.x_build_permutation__mutmut_1: killed
    pretrain_exp.data.order.x_build_permutation__mutmut_2: killed
    pretrain_exp.data.order.xǁDataOrderǁprepare__mutmut_3: timeout
    pretrain_exp.data.order.xǁDataOrderǁprepare__mutmut_4: no tests
some other line
"""


def test_the_table_counts_each_file_and_the_total():
    by_module = tally(RESULTS)
    assert {m: dict(c) for m, c in by_module.items()} == {
        "pretrain_exp.data.rows": {"killed": 1, "survived": 1},
        "pretrain_exp.data.order": {"killed": 2, "timeout": 1, "no tests": 1}}
    assert table(by_module).splitlines() == [
        "| file | killed / total | score | survived | timeout | no tests |",
        "| --- | --- | --- | --- | --- | --- |",
        "| pretrain_exp/data/order.py | 2 / 4 | 50.0% | 0 | 1 | 1 |",
        "| pretrain_exp/data/rows.py | 1 / 2 | 50.0% | 1 | 0 | 0 |",
        "| **total** | 3 / 6 | 50.0% | 1 | 1 | 1 |"]
