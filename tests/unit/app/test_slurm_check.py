"""SLURM limits read from ``sinfo`` output and the launcher settings SLURM would refuse, as one line per option."""

from __future__ import annotations

import pytest

from pretrain_exp.app.slurm_check import gres_gpus, launcher_problems, parse_sinfo, sinfo_minutes

#: ``sinfo -h -o '%P|%D|%c|%m|%G|%l'`` of a cluster with a default CPU partition and two GPU partitions
SINFO = """cpu*|12|64|256000|(null)|1-00:00:00
gpu|4|96+|1024000+|gpu:a100:8(S:0-1)|2:00:00
gpu|2|96|512000|gpu:a100:4(S:0-1)|2:00:00
small|1|8|32000|gpu:1,shard:4|30
"""


@pytest.mark.parametrize("text, minutes", [("infinite", None), ("UNLIMITED", None), ("1-00:00:00", 1440),
                                           ("2:00:00", 120), ("30", 30), ("5:30", 6), ("2-12", 3600)])
def test_sinfo_time_limits_in_minutes(text, minutes):
    assert sinfo_minutes(text) == minutes


def test_gpus_from_generic_resources():
    assert [gres_gpus(t) for t in ("(null)", "gpu:8", "gpu:a100:8(S:0-1)", "gpu:2,shard:4", "shard:4")] == \
        [0, 8, 8, 2, 0]


def test_partitions_merge_their_node_groups():
    parts = parse_sinfo(SINFO)
    assert list(parts) == ["cpu", "gpu", "small"]
    gpu = parts["gpu"]
    assert (gpu.nodes, gpu.cpus, gpu.mem_mb, gpu.gpus, gpu.time_min, gpu.default) == (6, 96, 1024000, 8, 120, False)
    assert parts["cpu"].default and parts["cpu"].gpus == 0
    assert parts["gpu"].describe() == "partition 'gpu' (sinfo): 6 node(s) of 96 CPUs, 1000.0 GB, 8 GPU(s); " \
        "time limit 120 min"


def test_what_slurm_would_refuse_names_each_option_and_the_partitions_limits():
    parts = parse_sinfo(SINFO)
    ok = {"partition": "gpu", "gpus_per_node": 8, "cpus_per_task": 64, "tasks_per_node": 1, "mem_gb": 512,
          "nodes": 2, "timeout_min": 120}
    assert launcher_problems(ok, parts) == []
    # the slurm preset's 1 GPU on the default CPU partition: the partition with GPUs, or no GPU request
    gpus = launcher_problems({"partition": None, "gpus_per_node": 1, "cpus_per_task": 16, "mem_gb": 64,
                              "nodes": 1, "timeout_min": 240}, parts)
    assert gpus[0] == ("hydra.launcher.gpus_per_node=1: partition 'cpu' has no GPUs; set hydra.launcher.partition=gpu "
                       "(partitions with 1 GPU(s): gpu, small) or hydra.launcher.gpus_per_node=null "
                       "(hydra/launcher=slurm_cpu) to run on CPUs")
    assert gpus[1:] == ["partition 'cpu' (sinfo): 12 node(s) of 64 CPUs, 250.0 GB, no GPU; time limit 1440 min"]
    over = launcher_problems({**ok, "gpus_per_node": 16, "mem_gb": 2048, "timeout_min": 240, "nodes": 8,
                              "cpus_per_task": 64, "tasks_per_node": 2}, parts)
    assert over == [
        "hydra.launcher.gpus_per_node=16: partition 'gpu' has 8 GPU(s) per node; no partition has 16 GPU(s) per "
        "node: set hydra.launcher.gpus_per_node=8",
        "hydra.launcher.cpus_per_task=64 x tasks_per_node=2: 128 CPUs, more than a node of partition 'gpu' has (96)",
        "hydra.launcher.mem_gb=2048: more than a node of partition 'gpu' has (1000.0 GB)",
        "hydra.launcher.nodes=8: partition 'gpu' has 6 node(s)",
        "hydra.launcher.timeout_min=240: over the time limit of partition 'gpu' (120 min)",
        "partition 'gpu' (sinfo): 6 node(s) of 96 CPUs, 1000.0 GB, 8 GPU(s); time limit 120 min"]
    assert launcher_problems({**ok, "partition": "gpus"}, parts) == [
        "hydra.launcher.partition=gpus: no such partition (sinfo: cpu, gpu, small); did you mean "
        "hydra.launcher.partition=gpu?"]
    assert launcher_problems({**ok, "partition": "cpu,gpu", "gpus_per_node": 99}, parts) == []  # SLURM picks one
