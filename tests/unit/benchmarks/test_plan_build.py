"""``benchmarks/plan_build.py``: the texts spec file (``--make-texts``) and the one-run comparison of the
tokenizer's own call with ``encode_texts`` (``--compare-encode``), on real text with the real SmolLM2 tokenizer."""

from __future__ import annotations

import importlib.util
import json
import sys
from types import SimpleNamespace

from tests.conftest import CACHE_DIR, ROOT

spec = importlib.util.spec_from_file_location("plan_build", ROOT / "benchmarks" / "plan_build.py")
bench = importlib.util.module_from_spec(spec)
sys.modules["plan_build"] = bench
spec.loader.exec_module(bench)


def test_texts_spec_file_and_compare_encode(tmp_path, tiny_model_dir, capsys):
    f = tmp_path / "texts.jsonl"
    size = bench.make_texts(60, str(f), str(CACHE_DIR))
    texts = [json.loads(line)["text"] for line in f.read_text().splitlines()]
    assert size == f.stat().st_size and len(texts) == 60 == len(set(texts))
    assert all(len(t) >= 470 for t in texts)
    args = SimpleNamespace(jsonl=str(f), tokenizer=str(tiny_model_dir), cache_dir=str(CACHE_DIR), repeat=1)
    bench.compare_encode(args)
    out = capsys.readouterr().out
    assert "60 texts of" in out and "ratio now / before:" in out and "same ids: True" in out
