"""The audit in a run: ARC-Easy questions (the benchmark insertion type, real asset) planted in the natural corpus
are flagged with the counts a naive search finds; ``insertion.audit=on`` audits beside training (its own process)
with the counts an audit in the run's own process finds; ``insertion.audit=strict`` refuses a planted clean control
before training; jobs auditing the same rows and items share one audit."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from pretrain_exp.app.experiment import Experiment
from pretrain_exp.core.errors import InsertionError
from pretrain_exp.data.tokenize import load_tokenizer
from pretrain_exp.insertion.audit import audit_plan, item_contents
from pretrain_exp.insertion.types import load_items
from tests.conftest import CACHE_DIR, make_config

pytestmark = pytest.mark.slow  # tokenizes a corpus and builds two real plans: ~20 s on 2 cores

WORDS = "the a of and to in is was that for on with as by at from this be or are an which his her it".split()


@pytest.fixture(scope="module")
def planted(tmp_path_factory, tiny_model_dir):
    """A jsonl corpus of random-word documents with 6 clean and 6 contaminated ARC-Easy items planted 3 times."""
    d = tmp_path_factory.mktemp("audit_run")
    cfg = make_config("experiment=tiny", "insertion=benchmark", run_dir=d / "probe")
    tok = load_tokenizer(str(tiny_model_dir), str(CACHE_DIR))
    exp = cfg.insertion.experiments["benchmark"]
    items = load_items("benchmark", exp, tokenizer=tok, vocab_size=len(tok), sequence_length=128,
                       seed=cfg.insertion.seed, cache_dir=str(CACHE_DIR))
    clean = [i for i in range(len(items)) if items.dup_counts[i] == 0][:6]
    dirty = [i for i in range(len(items)) if items.dup_counts[i] > 0][:6]
    rng = np.random.default_rng(0)
    docs = [" ".join(rng.choice(WORDS, size=120)) for _ in range(100)]
    for k, i in enumerate(3 * (clean + dirty)):
        docs.insert(int(rng.integers(0, len(docs))), items.texts[i])
    corpus = d / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in docs))
    overrides = ["experiment=tiny", "insertion=benchmark", "data=text", f"data.text={corpus}",
                 f"data.token_dir={d / 'tokens'}"]
    return d, overrides, clean, dirty


def test_planted_benchmark_items_are_flagged(planted):
    d, overrides, clean, dirty = planted
    exp = Experiment(make_config(*overrides, run_dir=d / "on"))
    assert exp._audit_job is not None and exp._audit_job.proc is None  # preparing the run starts no process
    exp.auditor.pre_train()  # the loop's first hook starts it
    assert exp.audit is None and exp._audit_job is not None and exp._audit_job.running  # beside training
    assert "natural_exact" not in (d / "on" / "items.jsonl").read_text()
    exp.finish_audit()
    plan, res = exp.plan, exp.audit
    rows = np.stack([exp.order.row_tokens(q) for q in range(exp.window[0] // 128, exp.window[1] // 128)])
    eos = exp.tokenizer.eos_token_id
    naive = [sum(int(np.array_equal(r[o:o + c.size], c)) for r in rows for o in range(129 - c.size))
             for c in item_contents(plan, eos)]
    assert res.window.exact.tolist() == naive
    found = {i for i in range(plan.num_items) if naive[i]}
    assert found <= set(clean) | set(dirty) and found & set(clean) and found & set(dirty)
    controls = res.contaminated_controls(plan)  # exact occurrences, or 13-grams of a copy cut by a row boundary
    assert found & set(clean) <= set(controls) <= set(clean)
    assert all(res.window.ngram_hits[i] for i in controls)
    table = [json.loads(line) for line in (d / "on" / "items.jsonl").read_text().splitlines()]
    assert [r["natural_exact"] for r in table] == naive
    effective = [int(plan.item_dup_count[i]) + naive[i] for i in range(plan.num_items)]
    assert [r["effective_dup_count"] for r in table] == effective
    assert json.loads((d / "on" / "audit.json").read_text())["contaminated_controls"] == controls
    # the same counts as the audit in the run's own process (as insertion.audit=on computed it before training)
    here = audit_plan(exp.plans[0][1], exp.order.row_tokens,
                      np.arange(exp.window[0] // 128, exp.window[1] // 128, dtype=np.int64),
                      exp.order.held_out_rows(exp.cfg.data.held_out_rows), exp.cfg.insertion.audit_ngram, strip=eos,
                      workers=1).to_json(plan, "on")
    beside = json.loads((d / "on" / "audit.json").read_text())
    assert beside["items"] == here["items"] and beside["contaminated_controls"] == here["contaminated_controls"]
    assert (beside["window_tokens"], beside["held_out_tokens"]) == (here["window_tokens"], here["held_out_tokens"])


def test_strict_refuses_a_clean_control_in_the_window(planted):
    d, overrides, clean, _ = planted
    with pytest.raises(InsertionError) as e:
        Experiment(make_config(*overrides, "insertion.audit=strict", run_dir=d / "strict"))
    msg = str(e.value)
    assert msg.startswith("insertion.audit=strict: control item ") and "benchmark[" in msg
    assert re.search(r"\): (exact occurrence|13-gram overlap) at step \d+, row \d+, offset \d+ \(position \d+\)", msg)
    assert (d / "strict" / "audit.json").is_file()  # the full table of what was found
    assert not (d / "strict" / "plan.npz").exists()  # nothing half-written
    # off: no audit, no counts
    Experiment(make_config(*overrides, "insertion.audit=off", run_dir=d / "off"))
    assert not (d / "off" / "audit.json").exists()
    assert "natural_exact" not in (d / "off" / "items.jsonl").read_text()


def test_jobs_auditing_the_same_rows_and_items_share_one_audit(planted, monkeypatch):
    """A second job with the same window rows and items (another run dir, as a sweep's next job) reads the audit
    from the cache (``<cache>/audits/<key>.json``) without scanning, with the same counts; a job whose data seed
    picks other rows audits again."""
    from pretrain_exp.app import audit_hook

    d, overrides, _, _ = planted
    first = Experiment(make_config(*overrides, run_dir=d / "job0"))
    first.finish_audit()
    scans = []  # audits started beside training, or computed in the run's process
    real_start, real_plan = audit_hook.BackgroundAudit.start, audit_hook.audit_plan
    monkeypatch.setattr(audit_hook.BackgroundAudit, "start", lambda job: scans.append(1) or real_start(job))
    monkeypatch.setattr(audit_hook, "audit_plan", lambda *a, **k: scans.append(1) or real_plan(*a, **k))
    again = Experiment(make_config(*overrides, run_dir=d / "job1"))
    again.finish_audit()
    assert scans == [] and again.plan.digest() == first.plan.digest()
    assert again.audit.window.exact.tolist() == first.audit.window.exact.tolist()
    assert again.audit.window.ngram_hits.tolist() == first.audit.window.ngram_hits.tolist()
    assert again.audit.held_out.exact.tolist() == first.audit.held_out.exact.tolist()
    one, two = (json.loads((d / j / "audit.json").read_text()) for j in ("job0", "job1"))
    assert one["items"] == two["items"] and one["contaminated_controls"] == two["contaminated_controls"]
    other = Experiment(make_config(*overrides, "data.seed=11", run_dir=d / "job2"))
    other.finish_audit()
    assert scans == [1] and other.audit is not None


def test_a_failed_run_stops_its_audit_beside_training_and_the_rerun_audits_again(planted):
    """``on_error`` (an exception leaving the run's loop) stops the audit beside training at once, its processes
    included, and leaves no ``audit.json``, cache entry or job folder; the same command then audits again."""
    import psutil

    d, overrides, _, _ = planted
    cfg = make_config(*overrides, "data.seed=23", run_dir=d / "failed")  # rows no other test audited: not cached
    exp = Experiment(cfg)
    exp.auditor.pre_train()
    job = exp._audit_job
    assert job is not None and job.running
    procs = [psutil.Process(job.proc.pid), *psutil.Process(job.proc.pid).children(recursive=True)]
    exp.auditor.on_error(RuntimeError("training failed"))
    assert exp._audit_job is None and job.proc.returncode is not None
    _, alive = psutil.wait_procs(procs, timeout=10)
    assert alive == []
    assert not (d / "failed" / "audit.json").exists() and not job.shared.exists() and job.tmp is None
    again = Experiment(make_config(*overrides, "data.seed=23", run_dir=d / "failed"))
    again.finish_audit()
    assert again.audit is not None and (d / "failed" / "audit.json").is_file()
