"""``pretrain-exp-release`` on real tiny runs built by the CLI: the bundle checked by the libraries that will read
it (``ModelCard.load``, ``DatasetCard.load``, ``datasets.load_dataset`` per config,
``AutoModelForCausalLM.from_pretrained`` on the model dir and on each revision's files), its numbers against the run's
``results.json``, and the push recorded by a local Hub endpoint (:mod:`tests.hub_server`)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from pretrain_exp.core.io import sha256_file
from pretrain_exp.report.release import revision_name
from tests.conftest import CACHE_DIR, ROOT
from tests.hub_server import HubServer

TOKEN = "hf_" + "releaseTestToken" * 3  # the shape of a real token, so redaction by shape is exercised too
REPO = "lab/tiny-insertion"


def run_module(module: str, *args: str, env: dict | None = None,
               check: bool = True) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env = base | {"PRETRAIN_EXP_CACHE": str(CACHE_DIR), "WANDB_SILENT": "true", "HF_HUB_OFFLINE": "1",
                  "HF_DATASETS_OFFLINE": "1"} | (env or {})
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def tiny_run(runs: Path, *overrides: str) -> Path:
    proc = run_module("pretrain_exp", *overrides, "training.num_steps=4", "training.checkpoint_interval=2",
                      "insertion.experiments.fictional_bios.repetitions=[0,1,4]", "training.num_threads=1",
                      "wandb=disabled",
                      env={"PRETRAIN_EXP_RUNS": str(runs)})
    return Path(proc.stdout.strip().splitlines()[-1].removeprefix("run dir: "))


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory, tiny_model_dir) -> Path:
    """experiment=tiny, 4 steps in 2 segments (dup counts 0/1/4), every HF Trainer checkpoint kept (2 revisions)."""
    return tiny_run(tmp_path_factory.mktemp("runs"), "experiment=tiny", "training.keep_last_checkpoints=0")


def check_bundle(run_dir: Path, out: Path, steps: list, repo: str | None = None) -> None:
    """The library checks of a bundle and its numbers against the run's results.json."""
    import datasets
    import transformers
    from huggingface_hub import DatasetCard, ModelCard

    res = json.loads((run_dir / "results.json").read_text())
    cfg = res["plan"]
    plan_sha, config_sha = sha256_file(run_dir / "plan.npz"), sha256_file(run_dir / "config.resolved.yaml")
    tokens_per_step = 8 * 128
    revisions = {revision_name(s, s * tokens_per_step): s for s in steps}
    assert sorted(p.name for p in (out / "revisions").iterdir()) == sorted(revisions)

    card = ModelCard.load(out / "model" / "README.md")
    meta = card.data.to_dict()
    assert meta["library_name"] == "transformers" and meta["license"] == "other"
    assert meta["datasets"] == [repo or res["run_name"]]
    assert "pretrain_exp" in meta["tags"]
    ours = meta["pretrain_exp"]
    assert ours["plan_sha256"] == plan_sha and ours["config_sha256"] == config_sha
    assert ours["per_dup"] == res["per_dup"] and ours["step"] == res["step"] == steps[-1]
    assert ours["plan"]["inserted_tokens"] == cfg["inserted_tokens"]
    assert ours["revisions"] == revisions
    for r in res["per_dup"]:  # the body's eval table, with the CI, its method and the small-group flag
        assert (f"| {r['experiment']} | {r['dup_count']} | {r['n_items']}{'*' if r['small_n'] else ''} | "
                f"{r['mean_loss']:.3f} | [{r['ci_low']:.3f}, {r['ci_high']:.3f}] | {r['ci_method']} |") in card.text
    assert plan_sha in card.text and "## Natural-duplicate audit" in card.text and "pretrain-exp experiment=" \
        in card.text

    dcard = DatasetCard.load(out / "dataset" / "README.md")
    dmeta = dcard.data.to_dict()
    assert [c["config_name"] for c in dmeta["configs"]] == ["items", "placements", "evals"]
    assert dmeta["pretrain_exp"]["plan_sha256"] == plan_sha and dmeta["pretrain_exp"]["config_sha256"] == config_sha
    loaded = {name: datasets.load_dataset(str(out / "dataset"), name, split="train").to_pandas()
              for name in ("items", "placements", "evals")}
    items, placements, evals = loaded["items"], loaded["placements"], loaded["evals"]
    assert len(items) == cfg["num_items"] and len(placements) == cfg["num_insertions"]
    assert int(placements["length"].sum()) == cfg["inserted_tokens"]
    assert (items["control"] == (items["dup_count"] == 0)).all() and items["control"].any()
    assert not placements["item_id"].isin(items.loc[items["control"], "item_id"]).any()
    counts = placements.groupby("item_id").size()
    for _, it in items.iterrows():
        assert counts.get(it["item_id"], 0) == it["dup_count"]
        assert len(it["token_ids"]) == it["length"]
    final = evals[(evals["step"] == res["step"]) & (evals["eval"] == "insertion_loss")]
    for r in res["per_dup"]:
        g = final[(final["experiment"] == r["experiment"]) & (final["dup_count"] == r["dup_count"])]
        assert len(g) == r["n_items"] and g["loss"].mean() == pytest.approx(r["mean_loss"], rel=1e-12)
    names = sorted(p.name.split("-")[0] for p in (out / "dataset").rglob("*")
                   if p.is_file() and p.parent.name != "inputs")
    assert names == ["README.md", "config.resolved.yaml", "evals", "items", "placements", "plan.npz"]

    m = transformers.AutoModelForCausalLM.from_pretrained(out / "model")
    assert m.num_parameters() > 0
    for name in revisions:
        transformers.AutoModelForCausalLM.from_pretrained(out / "revisions" / name)
        assert ModelCard.load(out / "revisions" / name / "README.md").data.to_dict()["pretrain_exp"] == ours
    transformers.AutoTokenizer.from_pretrained(out / "model")


@pytest.mark.slow  # its fixture trains a tiny run through the CLI (a subprocess)
def test_release_of_a_tiny_hf_run(hf_run, tmp_path):
    out = tmp_path / "bundle"
    proc = run_module("pretrain_exp.release", str(hf_run), str(out))
    assert f"wrote {out}" in proc.stdout
    check_bundle(hf_run, out, steps=[2, 4])
    # the final model is the run's last checkpoint, byte for byte; no training state is released
    assert sha256_file(out / "model" / "model.safetensors") == sha256_file(
        hf_run / "checkpoints" / "checkpoint-4" / "model.safetensors")
    assert not list(out.rglob("optimizer*")) and not list(out.rglob("trainer_state*"))
    # again into the same dir: the same bundle is reused; another repo id is refused, naming the dir
    assert run_module("pretrain_exp.release", str(hf_run), str(out)).returncode == 0
    bad = run_module("pretrain_exp.release", str(hf_run), str(out), "--repo-id", "x/y", check=False)
    assert bad.returncode == 2 and bad.stderr.startswith(f"error: {out} exists")


@pytest.mark.slow  # its fixture trains a tiny run through the CLI (a subprocess)
def test_bad_input_is_one_clear_error(hf_run, tmp_path):
    proc = run_module("pretrain_exp.release", str(tmp_path / "nope"), str(tmp_path / "out"), check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == f"error: {tmp_path / 'nope'}: no such run or sweep dir"
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.resolved.yaml").write_text((hf_run / "config.resolved.yaml").read_text())
    proc = run_module("pretrain_exp.release", str(partial), str(tmp_path / "out"), check=False)
    assert proc.returncode == 2 and "results.json: missing" in proc.stderr and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_push_offline_refused_token_and_retry(hf_run, tmp_path):
    out = tmp_path / "bundle"
    offline = run_module("pretrain_exp.release", str(hf_run), str(out), "--push", REPO, check=False,
                         env={"HF_TOKEN": TOKEN})
    assert offline.returncode == 2 and "HF_HUB_OFFLINE" in offline.stderr and "HF_TOKEN" in offline.stderr
    assert not out.exists()  # refused before anything is written

    with HubServer(TOKEN) as hub:
        env = {"HF_ENDPOINT": hub.base, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1",
               "HF_HOME": str(tmp_path / "hf_home")}
        wrong = "hf_" + "notTheRightToken" * 3
        refused = run_module("pretrain_exp.release", str(hf_run), str(out), "--push", REPO, "--private",
                             check=False, env=env | {"HF_TOKEN": wrong})
        assert refused.returncode == 2, refused.stderr
        assert "refused the token (HTTP 401)" in refused.stderr and "HF_TOKEN" in refused.stderr
        assert wrong not in refused.stdout + refused.stderr
        assert (out / "release.json").is_file()  # the bundle stays, whole
        files_before = {p: sha256_file(p) for p in out.rglob("*") if p.is_file()}

        ok = run_module("pretrain_exp.release", str(hf_run), str(out), "--push", REPO, "--private",
                        env=env | {"HF_TOKEN": TOKEN})
        assert f"pushed {REPO}" in ok.stdout
        assert TOKEN not in ok.stdout + ok.stderr
        assert {p: sha256_file(p) for p in out.rglob("*") if p.is_file()} == files_before
        for p in out.rglob("*"):
            if p.is_file():
                assert TOKEN.encode() not in p.read_bytes()

        def tree(folder: Path) -> dict:
            return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

        model, dataset = hub.repos[("model", REPO)], hub.repos[("dataset", REPO)]
        assert model["private"] and dataset["private"]
        revisions = json.loads((out / "release.json").read_text())["revisions"]
        assert set(model["branches"]) == {"main", *revisions}
        assert model["branches"]["main"] == tree(out / "model")
        for name in revisions:
            assert model["branches"][name] == tree(out / "revisions" / name)
        assert dataset["branches"]["main"] == tree(out / "dataset")
        assert set(dataset["branches"]) == {"main"}
        # what was sent: large files through LFS, every write authenticated with the token
        assert any(m == "PUT" and p.startswith("/lfs/") for m, p, _, _ in hub.requests)
        sent = {h.get("authorization") for m, _, h, _ in hub.requests if m == "POST"}  # every write
        assert sent == {f"Bearer {wrong}", f"Bearer {TOKEN}"}
    check_bundle(hf_run, out, steps=[2, 4], repo=REPO)


def commit_paths(hub: HubServer, since: int = 0) -> list:
    """The paths of the files the commit requests after ``hub.requests[since]`` carried (inline or LFS)."""
    return sorted(json.loads(line)["value"]["path"] for m, p, _, body in hub.requests[since:]
                  if m == "POST" and "/commit/" in p for line in body.decode().splitlines()
                  if json.loads(line)["key"] in ("file", "lfsFile"))


@pytest.mark.slow
def test_push_to_an_existing_repo_and_branch_with_revision_and_license(hf_run, tmp_path):
    """``--revision`` and ``--license`` on repos that already exist (``create_repo`` answers ``409``) and a branch
    that exists with a file of its own (``create_branch`` answers ``409``): the final model lands on that branch,
    beside its file, and ``main`` is left alone; the cards carry the license. The same push again commits nothing
    (the Hub's preupload ``oid`` of each unchanged file); a bundle with another license commits only the cards.
    ``--private`` is refused on the existing public repo, before anything is uploaded."""
    from huggingface_hub import DatasetCard, HfApi, ModelCard
    from huggingface_hub.errors import HfHubHTTPError

    def tree(folder: Path) -> dict:
        return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}

    with HubServer(TOKEN) as hub:
        api = HfApi(endpoint=hub.base, token=TOKEN)
        api.create_repo(REPO)
        api.create_repo(REPO, repo_type="dataset")
        api.create_branch(REPO, branch="candidate")
        api.upload_file(path_or_fileobj=b"kept\n", path_in_repo="NOTES.md", repo_id=REPO, revision="candidate")
        with pytest.raises(HfHubHTTPError) as conflict:  # what the Hub answers for an existing repo / branch
            api.create_repo(REPO)
        assert conflict.value.response.status_code == 409
        with pytest.raises(HfHubHTTPError) as conflict:
            api.create_branch(REPO, branch="candidate")
        assert conflict.value.response.status_code == 409

        env = {"HF_ENDPOINT": hub.base, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1",
               "HF_HOME": str(tmp_path / "hf_home"), "HF_TOKEN": TOKEN}
        push = ["--push", REPO, "--revision", "candidate"]
        out = tmp_path / "apache"
        private = run_module("pretrain_exp.release", str(hf_run), str(out), *push, "--license", "apache-2.0",
                             "--private", env=env, check=False)  # would not make the existing public repo private
        last = private.stderr.splitlines()[-1]  # after huggingface_hub's request log
        assert private.returncode == 2 and last.startswith(f"error: model repo {REPO} exists and is public"), last
        assert "--private" in last and hub.commits == [("model", REPO, "candidate")]  # the NOTES.md one
        run_module("pretrain_exp.release", str(hf_run), str(out), *push, "--license", "apache-2.0", env=env)
        model, dataset = hub.repos[("model", REPO)], hub.repos[("dataset", REPO)]
        assert model["branches"]["main"] == {} and not model["private"]
        assert model["branches"]["candidate"] == tree(out / "model") | {"NOTES.md": b"kept\n"}
        revisions = json.loads((out / "release.json").read_text())["revisions"]
        assert set(model["branches"]) == {"main", "candidate", *revisions}
        assert dataset["branches"]["main"] == tree(out / "dataset")
        for card in (ModelCard(model["branches"]["candidate"]["README.md"].decode()),
                     ModelCard(model["branches"][next(iter(revisions))]["README.md"].decode()),
                     DatasetCard(dataset["branches"]["main"]["README.md"].decode())):
            assert card.data.license == "apache-2.0"
            assert "`apache-2.0` (set with `--license`)" in card.text

        commits, sent = len(hub.commits), len(hub.requests)
        again = run_module("pretrain_exp.release", str(hf_run), str(out), *push, "--license", "apache-2.0", env=env)
        assert f"pushed {REPO}" in again.stdout
        assert len(hub.commits) == commits and commit_paths(hub, sent) == []

        sent = len(hub.requests)
        out_mit = tmp_path / "mit"
        run_module("pretrain_exp.release", str(hf_run), str(out_mit), *push, "--license", "mit", env=env)
        assert commit_paths(hub, sent) == sorted(["README.md"] * (2 + len(revisions)))
        assert model["branches"]["candidate"] == tree(out_mit / "model") | {"NOTES.md": b"kept\n"}
        assert ModelCard(model["branches"]["candidate"]["README.md"].decode()).data.license == "mit"
        assert DatasetCard(dataset["branches"]["main"]["README.md"].decode()).data.license == "mit"
        assert model["branches"]["main"] == {}


@pytest.mark.slow
def test_release_of_an_olmo_core_run_with_every_export(tmp_path):
    """framework=olmo_core: the kept exports hf/step<N>/ (training.export_hf=every) become the revisions."""
    run_dir = tiny_run(tmp_path / "runs", "experiment=scratch_olmo_core", "training.export_hf=every")
    out = tmp_path / "bundle"
    run_module("pretrain_exp.release", str(run_dir), str(out))
    check_bundle(run_dir, out, steps=[2, 4])
    assert sha256_file(out / "model" / "model.safetensors") == sha256_file(run_dir / "hf" / "step4" /
                                                                           "model.safetensors")


@pytest.mark.slow
def test_a_sweep_dir_gives_one_bundle_per_job(hf_run, tmp_path):
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    shutil.copytree(hf_run, sweep / "0")
    (sweep / "multirun.yaml").write_text("hydra: {}\n")
    proc = run_module("pretrain_exp.release", str(sweep), str(tmp_path / "out"), "--repo-id", REPO)
    assert "wrote" in proc.stdout
    card = (tmp_path / "out" / "0" / "model" / "README.md").read_text()
    assert f"{REPO}-0" in card
    assert pd.read_parquet(next((tmp_path / "out" / "0" / "dataset" / "data").glob("items-*.parquet"))).shape[0] > 0


@pytest.mark.slow
def test_a_run_releases_itself_at_its_end(tmp_path, tiny_model_dir):
    """``release.push_to_hub=true``: refused before training without a repo id, offline or without a token; with
    a token the finished run's bundle (``<run_dir>/release``) arrives on the local Hub endpoint."""
    runs = tmp_path / "runs"
    push = ["experiment=tiny", "training.num_steps=2", "training.checkpoint_interval=2", "training.num_threads=1",
            "insertion.experiments.fictional_bios.repetitions=[0,1]", "wandb=disabled", "release.push_to_hub=true"]
    no_repo = run_module("pretrain_exp", *push, check=False, env={"PRETRAIN_EXP_RUNS": str(runs)})
    assert no_repo.returncode == 2 and "error: release.repo_id:" in no_repo.stderr
    offline = run_module("pretrain_exp", *push, f"release.repo_id={REPO}", check=False,
                         env={"PRETRAIN_EXP_RUNS": str(runs), "HF_TOKEN": TOKEN})
    assert offline.returncode == 2 and "HF_HUB_OFFLINE" in offline.stderr, offline.stderr[-2000:]
    assert not list(runs.rglob("checkpoint-*"))  # nothing trained
    with HubServer(TOKEN) as hub:
        env = {"PRETRAIN_EXP_RUNS": str(runs), "HF_ENDPOINT": hub.base, "HF_HUB_OFFLINE": "0",
               "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(tmp_path / "hf_home"), "HF_TOKEN": TOKEN}
        ok = run_module("pretrain_exp", *push, f"release.repo_id={REPO}", env=env)
        run_dir = Path(ok.stdout.strip().splitlines()[-1].removeprefix("run dir: "))
        assert TOKEN not in ok.stdout + ok.stderr
        bundle = run_dir / "release"
        rec = json.loads((bundle / "release.json").read_text())
        model, dataset = hub.repos[("model", REPO)], hub.repos[("dataset", REPO)]
        assert model["private"] and set(model["branches"]) == {"main", *rec["revisions"]}
        assert model["branches"]["main"] == {str(p.relative_to(bundle / "model")): p.read_bytes()
                                             for p in (bundle / "model").rglob("*") if p.is_file()}
        assert set(dataset["branches"]["main"]) == {str(p.relative_to(bundle / "dataset"))
                                                    for p in (bundle / "dataset").rglob("*") if p.is_file()}


# --- the card: code version, reproduce command on the bundle's files, no local path ------------------------------
UNIQUE = "zz-unique-dir-name-r37"  # in no path the bundle may name


def checkout_commit() -> str | None:
    """HEAD of this checkout with ``-dirty`` for changed tracked files (``git diff``), None without git."""
    try:
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()
        changed = subprocess.run(["git", "-C", str(ROOT), "diff", "--quiet", "HEAD"], timeout=30).returncode
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("-dirty" if changed else "")


@pytest.fixture(scope="module")
def file_run(tmp_path_factory, tiny_model_dir) -> tuple:
    """experiment=tiny with its 16 items read from a local file, run under a distinctively named dir: (run dir,
    items file)."""
    root = tmp_path_factory.mktemp("release") / UNIQUE
    root.mkdir()
    items = root / "my-items.jsonl"
    items.write_text("".join(json.dumps({"text": f"Item {i}: the {UNIQUE} archive keeps record number {i * 37}."})
                             + "\n" for i in range(20)).replace(UNIQUE, "local"))
    run_dir = tiny_run(root / "runs", "experiment=tiny", "training.keep_last_checkpoints=0",
                       "insertion.experiments.fictional_bios.generator=null",
                       f"insertion.experiments.fictional_bios.file={items}")
    return run_dir, items


def reproduce_block(card_text: str) -> list:
    section = card_text.split("## How to reproduce", 1)[1]
    return section.split("```bash\n", 1)[1].split("```", 1)[0].strip().splitlines()


@pytest.mark.slow  # its fixture trains a tiny run through the CLI (a subprocess)
def test_release_card_names_the_code_and_the_bundle_files_and_no_local_path(file_run, tmp_path):
    from huggingface_hub import DatasetCard, ModelCard

    import pretrain_exp

    run_dir, items_file = file_run
    res = json.loads((run_dir / "results.json").read_text())
    code = {"version": pretrain_exp.__version__, "commit": checkout_commit()}
    assert res["pretrain_exp"] == code  # results.json records the code that ran

    out = run_dir.parent.parent / "bundle"  # under the distinctive dir too
    run_module("pretrain_exp.release", str(run_dir), str(out))
    # revision names tell the steps of a small run apart (1,024 tokens per step)
    assert sorted(p.name for p in (out / "revisions").iterdir()) == ["step2-tokens2K", "step4-tokens4.1K"]
    check_bundle(run_dir, out, steps=[2, 4])

    # no local absolute path anywhere in the bundle, text or binary
    local = [UNIQUE, str(run_dir), str(items_file), str(run_dir.resolve()), str(CACHE_DIR)]
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 20
    for p in files:
        data = p.read_bytes()
        for s in local:
            assert s.encode() not in data, f"{p.relative_to(out)} holds {s}"

    # both cards print the version and the commit; their metadata holds them
    model, dataset = ModelCard.load(out / "model" / "README.md"), DatasetCard.load(out / "dataset" / "README.md")
    commit = f"`{code['commit']}`" if code["commit"] else "not recorded"
    line = f"- code: pretrain_exp {code['version']}, git commit {commit}"
    for card in (model, dataset):
        assert line in card.text
        assert card.data.to_dict()["pretrain_exp"]["code"] == code
    rec = json.loads((out / "release.json").read_text())
    assert rec["code"] == code and "run_dir" not in rec

    # the bundle's config: placeholders, the experiment reading the bundle's own input file; sha256 consistent
    cfg = yaml.safe_load((out / "dataset" / "config.resolved.yaml").read_text())
    assert cfg["run_dir"] == "<run_dir>" and cfg["cache_dir"] == "<cache_dir>"
    assert cfg["insertion"]["experiments"]["fictional_bios"]["file"] == "inputs/fictional_bios.jsonl"
    assert rec["files"]["dataset/config.resolved.yaml"] == rec["bundle_config_sha256"] == \
        model.data.to_dict()["pretrain_exp"]["bundle_config_sha256"]
    assert rec["config_sha256"] == sha256_file(run_dir / "config.resolved.yaml")
    shipped = [json.loads(x) for x in (out / "dataset" / "inputs" / "fictional_bios.jsonl").read_text().splitlines()]
    assert shipped == [json.loads(x) for x in items_file.read_text().splitlines()[:16]]

    # the reproduce command: the release's dataset, the pinned version, no local file
    block = reproduce_block(model.text)
    data_dir = f"{res['run_name']}-dataset"
    assert block[0].startswith(f"pip install pretrain_exp=={code['version']}")
    assert block[1] == f"hf download {res['run_name']} --repo-type dataset --local-dir {data_dir}"
    assert block[2].startswith("pretrain-exp experiment=tiny ")
    assert f"insertion.experiments.fictional_bios.file={data_dir}/inputs/fictional_bios.jsonl" in block[2]
    assert items_file.name not in model.text and "items.jsonl" not in block[2]


@pytest.mark.slow
def test_the_cards_reproduce_command_rebuilds_the_plan_from_the_bundle(file_run, tmp_path):
    """The card's command, run on the bundle's dataset dir, inserts the same tokens at the same positions."""
    import numpy as np

    run_dir, _ = file_run
    out = tmp_path / "bundle"
    run_module("pretrain_exp.release", str(run_dir), str(out))
    res = json.loads((run_dir / "results.json").read_text())
    block = reproduce_block((out / "model" / "README.md").read_text())
    command = block[2].replace(f"{res['run_name']}-dataset/", f"{out / 'dataset'}/")
    args = shlex.split(command)
    assert args[0] == "pretrain-exp"
    proc = run_module("pretrain_exp", *args[1:], env={"PRETRAIN_EXP_RUNS": str(tmp_path / "again")})
    again = Path(proc.stdout.strip().splitlines()[-1].removeprefix("run dir: "))
    with np.load(run_dir / "plan.npz") as a, np.load(out / "dataset" / "plan.npz") as b, \
            np.load(again / "plan.npz") as c:
        assert sorted(a.files) == sorted(c.files)
        for k in a.files:
            assert np.array_equal(a[k], b[k]) and np.array_equal(a[k], c[k]), k
