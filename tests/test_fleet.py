"""``v100lab batch --engine ray`` on a real Ray cluster of processes on this machine (``ray.cluster_utils.Cluster``:
a head with no CPU for tasks and worker nodes started as ``ray start`` would start them), custom resources
standing in for GPU types, real papermill runs of the small test notebooks.

One cluster is shared by the module (starting it costs seconds); each test that kills a node adds its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
import pytest

from v100lab.workbook import runner
from v100lab.cli import main as cli
from v100lab.base.errors import ConfigError
from v100lab.workbook.fleet import (
    Demand,
    RayEngine,
    _Starts,
    check_address,
    registry_options,
    run_task,
    unmet,
)
from v100lab.workbook.scenario import load_scenario

try:
    import ray  # optional: the [ray] extra
except ImportError:
    ray = None

needs_ray = pytest.mark.skipif(ray is None, reason="Ray is not installed (pip install 'v100lab[ray]')")
NB = Path(__file__).parent / "data" / "notebooks"


def _params(path: Path, name: str, *extra: str) -> Path:
    path.write_text("\n".join([f"scenario: {name}", "model: default", "n_gen: 7", "n_prompt: 21", *extra]) + "\n")
    return path


def _rows(result: runner.BatchResult) -> list[tuple]:
    return [(r.scenario, Path(r.notebook).stem, r.status, r.reason, r.headline) for r in result.runs]


# ---- no cluster needed ----------------------------------------------------------------------------------

def test_fleet_keys_are_validated_naming_the_key():
    s = load_scenario({"resources": {"GPU": 1, "bench": 1}, "accelerator_type": "V100", "node_labels": {"box": "v100"}})
    assert s.resources == {"GPU": 1.0, "bench": 1.0} and s.to_parameters()["node_labels"] == {"box": "v100"}
    assert hash(s) == hash(load_scenario({"resources": {"bench": 1, "GPU": 1.0}, "accelerator_type": "V100",
                                          "node_labels": {"box": "v100"}}))
    for bad, words in (({"resources": {"GPU": 0}}, "resources: GPU: the amount must be > 0"),
                       ({"resources": ["GPU"]}, "resources: expected a mapping of strings to numbers"),
                       ({"resources": {"my gpu": 1}}, "resources: resource name 'my gpu'"),
                       ({"node_labels": {"box": 1}}, "node_labels: expected a mapping of strings to strings"),
                       ({"accelerator_type": "V 100"}, "accelerator_type: 'V 100' is not an accelerator type")):
        with pytest.raises(ConfigError, match=words):
            load_scenario(bad)


def test_demand_against_nodes():
    d = Demand.of(load_scenario({"resources": {"GPU": 1, "bench": 1}, "accelerator_type": "V100",
                                 "node_labels": {"box": "v100"}}))
    assert d.task_options()["num_gpus"] == 1.0 and d.task_options()["resources"] == {"bench": 1.0}
    assert d.task_options()["label_selector"] == {"box": "v100"} and d.task_options()["max_retries"] == 1
    v100 = {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0, "bench": 1.0, "accelerator_type:V100": 1.0},
            "Labels": {"box": "v100"}}
    t4 = {"Alive": True, "Resources": {"CPU": 8.0, "GPU": 1.0, "bench": 1.0, "accelerator_type:T4": 1.0},
          "Labels": {"box": "t4"}}
    assert d.fits(v100) and not d.fits(t4) and not d.fits({**v100, "Alive": False})
    assert unmet(d, [v100, t4]) is None
    why = unmet(d, [t4, {**v100, "Alive": False}])
    assert "accelerator_type:V100 0.001" in why and "label box=v100" in why and "1 live node" in why
    assert Demand.of(load_scenario({})).amounts() == {"CPU": 1.0}


def test_cli_engine_options_are_checked(tmp_path, capsys):
    p = _params(tmp_path / "p.yaml", "cli")
    base = ["batch", str(p), "--notebooks", str(NB / "ok.ipynb"), "--out", str(tmp_path / "o")]
    assert cli.main(base + ["--address", "auto"]) == 2
    assert "--address and --task-timeout go with --engine ray" in capsys.readouterr().err
    assert cli.main(base + ["--engine", "ray", "--address", "not an address"]) == 2
    assert "--address must be auto, HOST:PORT or ray://HOST:PORT" in capsys.readouterr().err
    assert check_address("ray://10.0.0.5:10001") and check_address("10.0.0.5:6379") and check_address(None) is None
    assert not (tmp_path / "o" / "index.html").exists()


# ---- a real cluster ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    # quick detection of a killed node (Ray's defaults wait tens of seconds)
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3,
                           "health_check_initial_delay_ms": 0}})
    a = c.add_node(num_cpus=1, resources={"box_a": 1, "bench": 1, "accelerator_type:V100": 1}, labels={"box": "a"})
    b = c.add_node(num_cpus=1, resources={"box_b": 1, "bench": 1}, labels={"box": "b"})
    ray.init(address=c.address, log_to_driver=False)
    c.wait_for_nodes()
    try:
        yield {"cluster": c, "a": a, "b": b}
    finally:
        ray.shutdown()
        c.shutdown()


@needs_ray
def test_fan_out_matches_the_local_engine_and_runs_where_pinned(cluster, tmp_path):
    """2 scenarios × 2 notebooks (ok, cell error): the same runs and statuses as the local engine; the scenario
    asking for a V100 runs on the one node that has it, the one asking for `box_b` on the other."""
    pa = _params(tmp_path / "va.yaml", "on-a", "accelerator_type: V100")
    pb = _params(tmp_path / "vb.yaml", "on-b", "resources: {box_b: 1, bench: 1}")
    notebooks = [NB / "ok.ipynb", NB / "raise.ipynb"]
    local = runner.run_batch([pa, pb], notebooks, tmp_path / "local", timeout=120)
    fleet = runner.run_batch([pa, pb], notebooks, tmp_path / "ray", timeout=120, engine=RayEngine())
    assert _rows(fleet) == _rows(local)
    assert [r.status for r in fleet.runs] == ["ok", "error", "ok", "error"]
    a_id, b_id = cluster["a"].node_id[:12], cluster["b"].node_id[:12]
    assert [r.node.split()[-1] for r in fleet.runs] == [a_id, a_id, b_id, b_id]
    assert all(not r.node for r in local.runs)
    out = tmp_path / "ray"
    for r in fleet.runs:     # the reports came back as bytes and were written here
        assert (out / r.report).is_file() and (out / r.executed).is_file()
        assert runner.read_headline(nbformat.read(out / r.executed, as_version=4)) == r.headline
    html = (out / "index.html").read_text()
    assert "4 runs, 2 ok, 2 failed" in html and "<th>node</th>" in html and a_id in html and b_id in html
    assert "<th>node</th>" not in (tmp_path / "local" / "index.html").read_text()
    assert "raise.html#papermill-error-cell" in html
    # a re-run reuses the ok runs' records (with their node) without submitting anything
    again = runner.run_batch([pa], [NB / "ok.ipynb"], out, engine=RayEngine())
    assert again.runs[0].cached and again.runs[0].node.split()[-1] == a_id


@needs_ray
def test_cli_engine_ray_runs_where_the_label_says(cluster, tmp_path, capsys):
    p = _params(tmp_path / "lab.yaml", "cli-ray", "node_labels: {box: b}")
    rc = cli.main(["batch", str(p), "--notebooks", str(NB / "ok.ipynb"), "--out", str(tmp_path / "o"),
                   "--engine", "ray", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and [r["status"] for r in doc["runs"]] == ["ok"]
    assert doc["runs"][0]["node"].split()[-1] == cluster["b"].node_id[:12]


@needs_ray
def test_a_scenario_no_node_can_run_fails_at_once(cluster, tmp_path):
    files = [_params(tmp_path / "gpu.yaml", "h100", "resources: {gpu_h100: 1}"),
             _params(tmp_path / "acc.yaml", "a100", "accelerator_type: A100"),
             _params(tmp_path / "lab.yaml", "zz", "node_labels: {box: zz}")]
    res = runner.run_batch(files, [NB / "ok.ipynb"], tmp_path / "out", engine=RayEngine())
    assert [r.status for r in res.runs] == ["failed"] * 3
    for r, words in zip(res.runs, ("gpu_h100 1", "accelerator_type:A100", "label box=zz")):
        assert "no live node of the Ray cluster offers" in r.reason and words in r.reason
        assert r.duration_s == 0 and r.report is None
    assert "gpu_h100" in (tmp_path / "out" / "index.html").read_text()


@needs_ray
def test_the_registry_of_starts_lives_on_the_head(cluster):
    """The registry needs no CPU; an actor that needs no resource at all lands on a random node whatever its
    (soft) scheduling strategy, and died with a killed worker node. Its options keep it on the head."""
    head = cluster["cluster"].head_node.node_id

    @ray.remote
    class Where:
        def node(self):
            return ray.get_runtime_context().get_node_id()

    actors = [Where.options(**registry_options()).remote() for _ in range(8)]
    try:
        assert ray.get([a.node.remote() for a in actors], timeout=120) == [head] * 8
    finally:
        for a in actors:
            ray.kill(a)


@needs_ray
def test_a_run_goes_on_when_the_registry_is_gone(cluster, tmp_path):
    """The registry only informs the driver: a task that cannot report its start still runs its notebook."""
    dead = ray.remote(_Starts).options(**registry_options()).remote()
    ray.get(dead.snapshot.remote())
    ray.kill(dead)
    p = _params(tmp_path / "gone.yaml", "gone")
    job = {"index": 0, "starts": dead, "params_name": p.name, "params_bytes": p.read_bytes(),
           "notebook_name": "ok.ipynb", "notebook_bytes": (NB / "ok.ipynb").read_bytes(),
           "parameters": {"scenario": "gone", "model": "default", "n_gen": 7, "n_prompt": 21},
           "folder": "gone", "stem": "ok", "timeout": 120, "no_input": False, "node": "here 0123456789ab",
           "worker": "w"}
    out = run_task(job)
    assert out["result"]["status"] == "ok", out["result"]["reason"]
    assert "gone/ok.html" in out["files"] and out["node"] == "here 0123456789ab"


def _free(resource: str) -> bool:
    """Whether a one-CPU task needing ``resource`` gets to run within a minute (nothing holds the node)."""
    probe = ray.remote(lambda: True).options(num_cpus=1, resources={resource: 1})
    ref = probe.remote()
    ready, _ = ray.wait([ref], timeout=60)
    if not ready:
        ray.cancel(ref, force=True)
    return bool(ready)


@needs_ray
def test_a_hung_run_times_out_and_frees_its_node(cluster, tmp_path):
    p = _params(tmp_path / "hang.yaml", "hang", "resources: {box_a: 1}")
    res = runner.run_batch([p], [NB / "sleep.ipynb"], tmp_path / "out", timeout=None,
                             engine=RayEngine(task_timeout=3, poll_s=0.5))
    (r,) = res.runs
    assert r.status == "timeout" and "3 s task timeout" in r.reason and cluster["a"].node_id[:12] in r.node
    assert _free("box_a")


@needs_ray
def test_ctrl_c_cancels_the_tasks_and_keeps_what_returned(cluster, tmp_path):
    p = _params(tmp_path / "int.yaml", "int", "resources: {box_b: 1}")
    out = tmp_path / "out"

    def interrupt(result, i, n):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        runner.run_batch([p], [NB / "ok.ipynb", NB / "sleep.ipynb"], out, timeout=None,
                           on_result=interrupt, engine=RayEngine(poll_s=0.5))
    html = (out / "index.html").read_text()
    assert "1 run, 1 ok, 0 failed" in html and "int/ok.html" in html
    assert (out / "int" / "ok.html").is_file() and not (out / "int" / "sleep.run.json").exists()
    assert _free("box_b")


@needs_ray
def test_a_node_killed_mid_run(cluster, tmp_path, caplog):
    """The run on a node that dies is retried on the other node with the same resource; a run pinned to a
    resource only the dead node had is failed with the reason. The registry of starts outlives the nodes."""
    c = cluster["cluster"]
    pool = [c.add_node(num_cpus=1, resources={"pool": 1}) for _ in range(2)]
    solo = c.add_node(num_cpus=1, resources={"solo": 1})
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import time\ntime.sleep(6)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    slow = tmp_path / "slow.ipynb"
    nbformat.write(nb, slow)
    pp = _params(tmp_path / "pool.yaml", "pool", "resources: {pool: 1}")
    ps = _params(tmp_path / "solo.yaml", "solo", "resources: {solo: 1}")
    engine = RayEngine(poll_s=0.5)
    killed = {}

    def kill_where_it_runs(run, i, n):
        where = engine.running[i].split()[-1]
        node = next(x for x in [*pool, solo] if x.node_id.startswith(where))
        killed[i] = where
        c.remove_node(node, allow_graceful=False)

    res = runner.run_batch([pp, ps], [slow], tmp_path / "out", timeout=120, on_start=kill_where_it_runs,
                             engine=engine)
    retried, lost = res.runs
    assert retried.status == "ok", retried.reason
    survivor = next(x for x in pool if not x.node_id.startswith(killed[0]))
    assert retried.node.split()[-1] == survivor.node_id[:12]
    assert lost.status == "failed" and killed[1] in lost.reason and "died" in lost.reason and "solo 1" in lost.reason
    assert "registry of starts is unreachable" not in caplog.text
