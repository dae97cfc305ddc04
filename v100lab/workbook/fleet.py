"""Run the batch on a Ray cluster: ``v100lab batch PARAMS... --engine ray [--address auto|HOST:PORT|ray://HOST:PORT]``.

**One Ray task per run** (parameter file × notebook), so a fleet balances notebook by notebook, a retry
repeats one notebook, and each report reaches the index as soon as its run ends. A task needs what its
scenario declares (``resources``, ``accelerator_type``, ``node_labels``; :mod:`v100lab.workbook.scenario`, group
"fleet"); a scenario that declares nothing needs one CPU. Give each box one ``bench`` resource and let
every timing scenario ask for ``bench: 1``: two measurements then never share a box (llama.cpp's threads
spin, and two runs on one machine ruin each other's figures).

The task executes the notebook with papermill on the node that runs it (:func:`v100lab.workbook.runner.execute_run`
in a temporary folder, the parameter file's and the notebook's bytes sent with the task), exports its
HTML reports there, and returns the files' bytes and the result; the driver writes them into the same
``reports/`` tree and ``index.html`` as the local engine, with the node that ran each run. No shared
filesystem is assumed; every node has the same v100lab installed (and builds or downloads its models
into its own cache).

Faults:

* a scenario no live node can satisfy (a resource, accelerator type or label nobody has) fails at once
  with that reason — it is checked against the cluster before submitting, and again while tasks wait,
  so a task is never queued forever behind a node that died;
* a node that dies mid-run: Ray retries the task once (``max_retries=1``) on another node that has the
  resources; when none has, or the retry dies too, the run is failed with the reason;
* a run that takes longer than ``task_timeout`` seconds after it started is cancelled (``ray.cancel``
  with ``force=True`` kills its worker) and recorded as a timeout;
* the registry of starts (a small actor: which run started where) lives on the head node and is restarted
  by Ray if its process dies; it only informs the driver, so a run never fails because the registry is
  unreachable (the start of a run then shows when its result arrives);
* Ctrl-C cancels every task still out; the runs already returned were written as they arrived, and
  ``run_batch`` rewrites the index with them.

Without ``address`` a local Ray instance is started for the batch (``num_cpus`` CPUs, default one: the
runs then follow one another, as with the local engine, and one ``bench``) and stopped after it.
"""

from __future__ import annotations

import logging
import re
import socket
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from v100lab.base.errors import ConfigError, OutputError
from v100lab.base.safeio import term_text, write_atomic
from v100lab.workbook.scenario import Scenario, load_scenario
from v100lab.workbook.runner import (Run, RunResult, cached_run, execute_run, inputs_digest, now_iso, one_line,
                              write_record)

log = logging.getLogger(__name__)

POLL_S = 1.0                       # how often the driver looks at starts, deadlines and the nodes
LOCAL_CPUS = 1                     # a local instance runs one notebook at a time, like the local engine
LOCAL_RESOURCES = {"bench": 1.0}   # ... and offers the one `bench` every box of a fleet should offer
MAX_RETRIES = 1                    # a node that dies mid-run: one more try elsewhere
REGISTRY_WAIT_S = 60.0             # the longest a task or the driver waits for the registry of starts (its
                                   # start takes tens of seconds on a loaded box; a task that runs before its
                                   # start is recorded shows up only when it ends)
# The registry of starts asks for a sliver of the resource only the head node has (Ray Train's state actor
# does the same). It must ask for *some* resource: Ray places an actor that needs none (num_cpus=0 and
# nothing else) on a random node whatever its scheduling strategy, bar a hard node affinity
# (ray/src/ray/raylet/scheduling/cluster_resource_scheduler.cc, GetBestSchedulableNode), so a soft affinity
# to the driver's node let it land on a worker node, and die with it.
HEAD_RESOURCE = "node:__internal_head__"
_OUTPUTS = (".ipynb", ".html", ".reader.html", ".kernel.log")   # the files of one run a task returns
CONNECT_TIMEOUT_S = 10.0   # a cluster's head that does not accept a connection in this long is not there
_ADDRESS = re.compile(r"(auto|(ray://)?[A-Za-z0-9.\[\]:_-]+:\d{1,5})")


def _ray():
    try:
        import ray  # optional dependency (the [ray] extra): only the Ray engine needs it
    except ImportError:
        raise ConfigError("--engine ray needs Ray: pip install 'v100lab[ray]'") from None
    return ray


def check_address(address: str | None) -> str | None:
    """``auto``, ``HOST:PORT`` or ``ray://HOST:PORT`` (None: start a local instance); ConfigError otherwise."""
    if address is not None and not _ADDRESS.fullmatch(address):
        raise ConfigError(f"--address must be auto, HOST:PORT or ray://HOST:PORT, "
                          f"got {term_text(repr(address[:80]))}")
    if address not in (None, "auto") and not 0 < int(address.rpartition(":")[2]) < 65536:
        raise ConfigError(f"--address {address}: the port must be in 1-65535")
    return address


def probe_address(address: str, timeout: float = CONNECT_TIMEOUT_S) -> None:
    """ConfigError (one line) unless something accepts a TCP connection at ``address`` (HOST:PORT or
    ray://HOST:PORT) within ``timeout`` seconds — so a wrong address fails at once instead of in Ray's
    own connection retries (minutes)."""
    hostport = address.removeprefix("ray://")
    host, _, port = hostport.rpartition(":")
    host = host.strip("[]")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        why = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise ConfigError(f"--address {address}: no Ray cluster reachable at {hostport} ({why} within "
                          f"{timeout:g} s)") from None


# --------------------------------------------------------------------------------------------
# what a scenario needs from a node
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Demand:
    """What one run of a scenario needs from the node that runs it."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: Mapping[str, float] = field(default_factory=dict)   # custom resources
    accelerator_type: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, scenario: Scenario) -> "Demand":
        res = dict(scenario.resources)
        return cls(num_cpus=res.pop("CPU", 1.0), num_gpus=res.pop("GPU", 0.0), resources=res,
                   accelerator_type=scenario.accelerator_type, labels=dict(scenario.node_labels))

    def amounts(self) -> dict[str, float]:
        """Every resource with its amount, as a node lists them (``accelerator_type:X`` as Ray spells it)."""
        out = {"CPU": self.num_cpus, "GPU": self.num_gpus, **self.resources}
        if self.accelerator_type:
            out[f"accelerator_type:{self.accelerator_type}"] = 0.001   # what Ray's accelerator_type option asks
        return {k: v for k, v in out.items() if v}

    def describe(self) -> str:
        parts = [f"{k} {v:g}" for k, v in self.amounts().items()]
        parts += [f"label {k}={v}" for k, v in self.labels.items()]
        return ", ".join(parts) or "nothing"

    def task_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                                "resources": dict(self.resources), "max_retries": MAX_RETRIES,
                                "retry_exceptions": False}
        if self.accelerator_type:
            opts["accelerator_type"] = self.accelerator_type
        if self.labels:
            opts["label_selector"] = dict(self.labels)
        return opts

    def fits(self, node: Mapping[str, Any]) -> bool:
        """Whether a node (an entry of ``ray.nodes()``) could ever run it: alive, enough of every resource in
        total, every label."""
        if not node.get("Alive"):
            return False
        have, labels = node.get("Resources") or {}, node.get("Labels") or {}
        return (all(have.get(k, 0.0) >= v for k, v in self.amounts().items())
                and all(labels.get(k) == v for k, v in self.labels.items()))


def unmet(demand: Demand, nodes: Sequence[Mapping[str, Any]]) -> str | None:
    """Why no live node can run ``demand`` (one line), or None when one can."""
    if any(demand.fits(n) for n in nodes):
        return None
    alive = [n for n in nodes if n.get("Alive")]
    offered = sorted({k for n in alive for k in (n.get("Resources") or {})
                      if not k.startswith(("node:", "memory", "object_store_memory"))})
    return (f"no live node of the Ray cluster offers {demand.describe()} ({len(alive)} live node"
            f"{'s' if len(alive) != 1 else ''}; resources offered: {', '.join(offered) or 'none'})")


def node_name(node_id: str, host: str) -> str:
    """How the index names a node: its host name and the start of its Ray node id."""
    return f"{host} {node_id[:12]}"


# --------------------------------------------------------------------------------------------
# the task (runs on a worker node)
# --------------------------------------------------------------------------------------------

def run_task(job: Mapping[str, Any]) -> dict[str, Any]:
    """Execute one run where this process is, from the bytes in ``job``; the result and the output files'
    bytes. The Ray task body (also callable without Ray)."""
    node = job.get("node") or node_name("-", socket.gethostname())
    starts = job.get("starts")
    if starts is not None:
        ray = _ray()
        try:
            ray.get(starts.started.remote(job["index"], node, job.get("worker", "")), timeout=REGISTRY_WAIT_S)
        except ray.exceptions.RayError as exc:   # it only informs the driver: the run goes on without it
            log.warning("could not report the start of run %s: %s", job["index"], one_line(str(exc), 200))
    with tempfile.TemporaryDirectory(prefix="v100lab-run-") as tmp:
        root = Path(tmp)
        src = root / "in"
        src.mkdir()
        params = src / job["params_name"]
        params.write_bytes(job["params_bytes"])
        notebook = src / job["notebook_name"]
        notebook.write_bytes(job["notebook_bytes"])
        run = Run(params=params, notebook=notebook, scenario=load_scenario(job["parameters"]),
                  parameters=dict(job["parameters"]), folder=job["folder"], stem=job["stem"])
        result = execute_run(run, root / "out", timeout=job["timeout"], no_input=job["no_input"], force=True)
        files = {}
        for suffix in _OUTPUTS:
            path = root / "out" / run.rel(suffix)
            if path.is_file():
                files[run.rel(suffix)] = path.read_bytes()
    return {"result": result.as_dict(), "files": files, "node": node}


def _remote_task(job: dict) -> dict:
    import ray  # optional dependency: this body only ever runs inside a Ray worker

    ctx = ray.get_runtime_context()
    return run_task({**job, "node": node_name(ctx.get_node_id(), socket.gethostname()),
                     "worker": ctx.get_worker_id()})


class _Starts:
    """A small actor on the head node: each task reports here when it starts (and again on a retry), with
    the node and the worker process it runs in (a retry always runs in another worker)."""

    def __init__(self):
        self.starts: dict[int, tuple[str, str, int]] = {}

    def started(self, index: int, node: str, worker: str) -> None:
        self.starts[index] = (node, worker, self.starts.get(index, ("", "", 0))[2] + 1)

    def snapshot(self) -> dict[int, tuple[str, str, int]]:
        return dict(self.starts)


def registry_options() -> dict[str, Any]:
    """The Ray actor options of the registry of starts: on the head node (whose loss ends the cluster
    anyway), no CPU, restarted there if its process dies, and calls to it retried across a restart."""
    return {"num_cpus": 0, "resources": {HEAD_RESOURCE: 0.001}, "max_restarts": -1, "max_task_retries": -1}


# --------------------------------------------------------------------------------------------
# the driver
# --------------------------------------------------------------------------------------------

@dataclass
class _Out:
    """A task that was submitted and has not ended."""

    index: int
    demand: Demand
    node: str = ""             # where it started last
    worker: str = ""           # ... and in which worker process
    attempt: int = 0           # starts seen
    since: float | None = None  # driver's monotonic clock at the last start seen


class RayEngine:
    """The Ray engine for :func:`v100lab.workbook.runner.run_batch` (``engine=RayEngine(...)``).

    ``address``: None starts a local Ray instance with ``num_cpus`` CPUs for the batch; ``auto`` or
    ``HOST:PORT`` joins the cluster this machine belongs to; ``ray://HOST:PORT`` connects through Ray
    Client. When Ray is already initialised in this process, that connection is used (and left open).
    ``task_timeout``: seconds a run may take once it started (None: no limit; papermill's per-cell
    timeout still applies). ``running`` maps each run in flight to the node it started on."""

    def __init__(self, address: str | None = None, *, task_timeout: float | None = None,
                 num_cpus: int = LOCAL_CPUS, poll_s: float = POLL_S):
        self.address = check_address(address)
        if task_timeout is not None and not (task_timeout > 0 and task_timeout < float("inf")):
            raise ConfigError(f"--task-timeout must be a finite number of seconds > 0, got {task_timeout}")
        if num_cpus < 1:
            raise ConfigError(f"num_cpus must be >= 1, got {num_cpus}")
        self.task_timeout = task_timeout
        self.num_cpus = num_cpus
        self.poll_s = poll_s
        self.running: dict[int, str] = {}
        self._registry_ok = True   # the last look at the registry of starts worked

    # ---- connection ---------------------------------------------------------------------------
    def _connect(self, ray) -> bool:
        """Connect (or start a local instance); True when this engine must disconnect afterwards."""
        if ray.is_initialized():
            return False
        quiet = {"log_to_driver": False, "logging_level": logging.WARNING}
        if self.address is None:
            log.info("starting a local Ray instance (%d CPU)", self.num_cpus)
            ray.init(address="local", num_cpus=self.num_cpus, resources=dict(LOCAL_RESOURCES),
                     include_dashboard=False, **quiet)
        else:
            log.info("connecting to the Ray cluster at %s", self.address)
            if self.address != "auto":
                probe_address(self.address)
            try:
                ray.init(address=self.address, **quiet)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                hint = ("; a cluster with token authentication needs RAY_AUTH_MODE=token and its token in "
                        "~/.ray/auth_token" if self.address.startswith("ray://") else "")
                raise ConfigError(f"--address {self.address}: cannot connect to a Ray cluster "
                                  f"({one_line(str(exc), 200)}){hint}") from None
        return True

    def run(self, runs: Sequence[Run], out: Path, *, timeout: float | None, no_input: bool, force: bool,
            started: Callable[[int], None], finished: Callable[[int, RunResult], None]) -> None:
        ray = _ray()
        owns = self._connect(ray)
        try:
            self._run(ray, runs, out, timeout=timeout, no_input=no_input, force=force, started=started,
                      finished=finished)
        finally:
            self.running.clear()
            if owns:
                ray.shutdown()

    def _run(self, ray, runs, out, *, timeout, no_input, force, started, finished) -> None:
        starts = ray.remote(_Starts).options(**registry_options()).remote()
        self._registry_ok = True
        task = ray.remote(_remote_task)
        pending: dict[Any, _Out] = {}
        begun: set[int] = set()

        def end(i: int, result: RunResult) -> None:
            self.running.pop(i, None)
            if i not in begun:
                begun.add(i)
                started(i)
            finished(i, result)

        try:
            nodes = ray.nodes()
            for i, run in enumerate(runs):
                if not force:
                    reused = cached_run(run, out, no_input=no_input)
                    if reused is not None:
                        end(i, reused)
                        continue
                demand = Demand.of(run.scenario)
                why = unmet(demand, nodes)
                if why:
                    end(i, _failed(out, run, "failed", why))
                    continue
                job = {"index": i, "starts": starts, "params_name": run.params.name,
                       "params_bytes": run.params.read_bytes(), "notebook_name": run.notebook.name,
                       "notebook_bytes": run.notebook.read_bytes(), "parameters": dict(run.parameters),
                       "folder": run.folder, "stem": run.stem, "timeout": timeout, "no_input": no_input}
                pending[task.options(**demand.task_options()).remote(job)] = _Out(i, demand)
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=self.poll_s)
                for ref in ready:
                    o = pending.pop(ref)
                    end(o.index, self._collect(ray, ref, out, runs[o.index], o))
                if not pending:
                    break
                self._watch(ray, starts, pending, out, runs, started, begun, end)
        except BaseException as exc:   # Ctrl-C above all: no task may outlive the batch that wanted it
            log.warning("%s: cancelling %d Ray task(s)", "interrupted" if isinstance(exc, KeyboardInterrupt)
                        else type(exc).__name__, len(pending))
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
        finally:
            try:
                ray.kill(starts)
            except Exception:   # the connection is gone too: the registry goes with the cluster or session
                log.debug("could not stop the registry of starts", exc_info=True)

    def _collect(self, ray, ref, out: Path, run: Run, o: _Out) -> RunResult:
        try:
            payload = ray.get(ref)
        except ray.exceptions.TaskCancelledError:
            return _failed(out, run, "failed", "cancelled", node=o.node)
        except ray.exceptions.RayTaskError as exc:   # the task body raised: a bug or a broken install there
            cause = exc.cause if getattr(exc, "cause", None) is not None else exc
            return _failed(out, run, "failed", f"{type(cause).__name__} on {o.node or 'a worker'}: "
                           f"{str(cause).strip().splitlines()[-1] if str(cause).strip() else ''}", node=o.node)
        except ray.exceptions.RayError as exc:       # the worker or its node died, and so did the retry
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return _failed(out, run, "failed", f"{type(exc).__name__} after {o.attempt} start(s), last on "
                           f"{o.node or 'no node'}: {first}", node=o.node)
        return _deliver(out, run, payload)

    def _watch(self, ray, starts, pending, out, runs, started, begun, end) -> None:
        """Starts seen (and the node each run is on), deadlines, and tasks no live node can run any more."""
        now = time.monotonic()
        try:
            seen = ray.get(starts.snapshot.remote(), timeout=REGISTRY_WAIT_S)
            self._registry_ok = True
        except ray.exceptions.RayError as exc:   # restarting (it forgot the starts the driver had not seen)
            if self._registry_ok:                # or gone: runs go on, their starts show with their results
                log.warning("the registry of starts is unreachable: %s", one_line(str(exc), 200))
            self._registry_ok, seen = False, {}
        for i, (node, worker, attempt) in seen.items():
            o = next((o for o in pending.values() if o.index == i), None)
            if o is not None and (node, worker) != (o.node, o.worker):
                o.node, o.worker, o.attempt, o.since = node, worker, max(attempt, o.attempt + 1), now
                self.running[i] = node
                if i not in begun:
                    begun.add(i)
                    started(i)
        nodes = ray.nodes()
        dead = {node_name(n["NodeID"], n.get("NodeManagerHostname", "")) for n in nodes if not n.get("Alive")}
        for ref, o in list(pending.items()):
            on_dead = bool(o.node) and any(o.node.split()[-1] == d.split()[-1] for d in dead)
            why = None
            if self.task_timeout and o.since is not None and not on_dead and now - o.since > self.task_timeout:
                why = ("timeout", f"the run took longer than the {self.task_timeout:g} s task timeout on "
                                  f"{o.node}; cancelled")
            elif o.since is None or on_dead:
                gone = unmet(o.demand, nodes)
                if gone:
                    why = ("failed", (f"node {o.node} died while running it and " if on_dead else "") + gone)
            if why:
                ray.cancel(ref, force=True)
                del pending[ref]
                end(o.index, _failed(out, runs[o.index], why[0], why[1], node=o.node,
                                     duration=now - o.since if o.since is not None else 0.0))


def _clear(out: Path, run: Run) -> None:
    (out / run.folder).mkdir(parents=True, exist_ok=True)
    for suffix in _OUTPUTS:
        (out / run.rel(suffix)).unlink(missing_ok=True)   # a run must not leave an old report behind


def _deliver(out: Path, run: Run, payload: Mapping[str, Any]) -> RunResult:
    """Write what a task returned into the output folder, with this side's paths and digest."""
    _clear(out, run)
    expected = {run.rel(s) for s in _OUTPUTS}
    for rel, data in payload["files"].items():
        if rel not in expected:   # a task names only its own run's files
            log.warning("ignoring an unexpected file from the task: %r", rel)
            continue
        write_atomic(out / rel, data, what="report file", error=OutputError)
    result = replace(RunResult(**payload["result"]), params=str(run.params), notebook=str(run.notebook),
                     digest=inputs_digest(run.params, run.notebook), node=str(payload.get("node") or ""),
                     cached=False)
    for name in ("executed", "report", "reader", "kernel_log"):
        rel = getattr(result, name)
        if rel is not None and rel not in payload["files"]:
            result = replace(result, **{name: None})
    write_record(out, run, result)
    return result


def _failed(out: Path, run: Run, status: str, reason: str, *, node: str = "", duration: float = 0.0) -> RunResult:
    """The record of a run that produced nothing (no node, cancelled, timed out, its node died)."""
    _clear(out, run)
    result = RunResult(params=str(run.params), notebook=str(run.notebook), scenario=run.scenario.scenario,
                       model=run.scenario.model, device=run.scenario.device, status=status,
                       reason=one_line(reason), duration_s=round(duration, 3), started=now_iso(),
                       digest=inputs_digest(run.params, run.notebook), executed=None, report=None, node=node)
    write_record(out, run, result)
    return result
