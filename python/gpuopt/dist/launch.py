"""``devices=`` of :func:`gpuopt.benchmark`: validated here, then run by torchrun -- started for the user
(``python -m torch.distributed.run ... -m gpuopt.dist SPEC.json``), or, in a process a launcher
already started (WORLD_SIZE, RANK, LOCAL_RANK set), by joining its job as one rank."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from .._checks import check_devices, cuda_indices
from ..report.results import Results
from ..run.bench import BenchmarkPlan
from . import split, worker
from .worker import RankFailedError

# torchrun() waits this many collective timeouts for a job of its own, then kills it (a benchmark's
# job: see _job_timeout_s).
_WAIT_TIMEOUTS = 3
START_S = 120.0  # on top of that: starting the processes and importing torch
_AGENT_STOP_S = 40.0  # torchrun gives its workers 30 s to stop after SIGTERM


def resolve(devices: Any, plan: BenchmarkPlan, call: dict[str, Any]) -> Callable[[BenchmarkPlan], Results]:
    """Check ``devices`` against what is visible (ValueError / TypeError naming it) and return what runs
    the plan: this process as one rank of a running torchrun job, or a torchrun job started here."""
    if not dist.is_available():
        raise ImportError("devices= runs through torch.distributed, which this torch build lacks")
    worker.timeout_s()  # a bad GPUOPT_DIST_TIMEOUT_S fails now
    cuda = plan.device.type == "cuda"
    if cuda and not dist.is_nccl_available():
        raise ImportError(f"devices= on CUDA runs over NCCL, which this torch build ({torch.__version__}) lacks; "
                           "install a CUDA build of torch with NCCL (pip install torch), or give device='cpu'")
    if cuda and plan.device.index is not None:
        raise ValueError(f"device={str(plan.device)!r} names one GPU; with devices= give device='cuda' (or none) "
                         "and the GPUs in devices, e.g. devices=[1, 2]")
    joined = worker.torchrun_env()
    if joined is not None:
        indices = joined_devices(devices, cuda, joined[1])
        if plan.strategy == "split":
            split.check_batches(plan.batch_sizes, joined[1])
        return functools.partial(worker.run_rank, cuda_indices=indices)
    if not cuda and call["device"] is None:  # no GPU visible: CPU ranks only when asked for by name
        visible = torch.cuda.device_count()
        raise ValueError(f"devices={devices!r} asks for GPUs and {visible} are visible; for ranks on the CPU give "
                         "device='cpu' (e.g. devices=2, device='cpu')")
    indices = cuda_indices("devices", devices) if cuda else list(range(cpu_ranks(devices)))
    if plan.strategy == "split":
        split.check_batches(plan.batch_sizes, len(indices))
    spec = _spec(call, plan)
    return functools.partial(launch_benchmark, spec=spec, cuda_indices=indices if cuda else None, nproc=len(indices))


def cpu_ranks(devices: Any) -> int:
    """The number of CPU ranks ``devices`` asks for (a count only)."""
    check_devices("devices", devices)
    if not isinstance(devices, int):
        raise ValueError(f"on the CPU devices is the number of ranks (e.g. devices=2), got {devices!r}")
    return devices


def joined_devices(devices: Any, cuda: bool, world: int) -> list[int] | None:
    """Inside a torchrun job: the world size is the launcher's; ``devices`` may name it, or on CUDA list
    the GPU of each local rank."""
    check_devices("devices", devices)
    if isinstance(devices, int) and devices != world:
        raise ValueError(f"devices={devices}, but this process is one of {world} ranks started by torchrun "
                         f"(WORLD_SIZE); give devices='all' or {world}")
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    if isinstance(devices, (list, tuple)) and (not cuda or len(devices) != local_world):
        raise ValueError(f"devices={list(devices)!r}: under torchrun a list gives the GPU of each of the "
                         f"{local_world} local ranks, on CUDA only")
    indices = list(devices) if isinstance(devices, (list, tuple)) else list(range(local_world))
    if cuda:
        cuda_indices("devices", indices)
    return indices if cuda else None


def _spec(call: dict[str, Any], plan: BenchmarkPlan) -> dict[str, Any]:
    """benchmark()'s arguments as the JSON the worker reads: fresh processes rebuild the model by name."""
    model = call["model_or_name"]
    if not isinstance(model, str) or call["inputs"] is not None or call["input_fn"] is not None:
        raise ValueError("devices= starts a process per device, which rebuilds the model from its zoo name: give "
                         "a zoo name (input_shape= at most); for your own module or inputs, run your script under "
                         "torchrun and call benchmark(..., devices='all') there (README: Several GPUs)")
    spec = {k: v for k, v in call.items() if k not in ("model_or_name", "inputs", "input_fn") and v is not None}
    spec.update(model=model, device=plan.device.type,
                configs=[{"config": str(c), "name": c.name} for c in plan.configs])
    try:
        json.dumps(spec)
    except TypeError as exc:
        raise ValueError(f"devices= hands benchmark()'s arguments to fresh processes as JSON; one is not: {exc}") from exc
    return spec


def launch_benchmark(plan: BenchmarkPlan, *, spec: dict[str, Any], nproc: int,
                     cuda_indices: Sequence[int] | None) -> Results:
    """Run the plan as ``nproc`` ranks under torchrun and return rank 0's Results (read from its
    folder: ``plan.output_dir``, else a temporary one removed afterwards)."""
    out = Path(plan.output_dir or tempfile.mkdtemp(prefix="gpuopt-dist-"))
    spec_path = worker.ranks_dir(out) / "spec.json"
    spec_path.parent.mkdir(parents=True, exist_ok=True)
    spec_path.write_text(json.dumps({**spec, "output_dir": str(out), "devices": nproc}, indent=1))
    env = environment(cuda_indices)
    try:
        torchrun(["-m", "gpuopt.dist", str(spec_path)], nproc, output_dir=out, env=env, echo=plan.progress,
                 timeout_s=_job_timeout_s(plan))
    except BaseException:  # torchrun saved the rows so far: the caller's plan.results, as after a plain run
        if (out / "results.json").exists():
            plan.results = Results.load(out / "results.json")
        raise
    results = Results.load(out / "results.json")
    if plan.output_dir is None:
        shutil.rmtree(out, ignore_errors=True)
    return results


def environment(cuda_indices: Sequence[int] | None) -> dict[str, str]:
    """This process's environment for a job's ranks: on CUDA only the GPUs ``cuda_indices`` names
    visible, in that order (local rank i takes the i-th)."""
    env = dict(os.environ)
    if cuda_indices is not None:
        given = os.environ.get("CUDA_VISIBLE_DEVICES")
        names = given.split(",") if given else [str(i) for i in range(torch.cuda.device_count())]
        env["CUDA_VISIBLE_DEVICES"] = ",".join(names[i] for i in cuda_indices)
    return env


def _job_timeout_s(plan: BenchmarkPlan) -> float:
    """How long the launcher waits for a benchmark's job (a net for a job hung on every rank): per cell
    (a config at a batch size) two collective timeouts -- rank 0 alone, which the others wait for at most
    one timeout, then all ranks, about as long -- one more for the first and last barriers and the
    gathering, and the start."""
    cells = len(plan.batch_sizes) * len(plan.configs)
    return (2 * cells + 1) * worker.timeout_s() + START_S


def torchrun(target: Sequence[str], nproc: int, *, output_dir: str | os.PathLike, env: dict[str, str] | None = None,
             echo: bool = True, timeout_s: float | None = None, keep: Callable[[], int] | None = None) -> None:
    """``python -m torch.distributed.run --nproc-per-node N --rdzv-backend c10d --rdzv-endpoint localhost:0
    TARGET`` (e.g. ``["-m", "gpuopt.dist", "spec.json"]``), its output in
    ``OUTPUT/ranks/torchrun.log`` (and on stderr with ``echo``), waited for at most ``timeout_s`` (default:
    three collective timeouts and two minutes). A rank that fails raises :class:`RankFailedError` naming
    it (torchrun's exit status per rank, the rank's own report); the rows finished so far are then in
    ``OUTPUT/results.json``, as after a timeout (the job is stopped: TimeoutError) or Ctrl-C -- written
    by ``keep``, which returns how many (default: a benchmark's rows from the ranks' files). The rank
    files of an earlier job in ``OUTPUT/ranks/`` are removed first."""
    if timeout_s is None:
        timeout_s = _WAIT_TIMEOUTS * worker.timeout_s() + START_S
    if keep is None:
        keep = functools.partial(_keep_rows, output_dir, nproc)
    log_path = worker.ranks_dir(output_dir) / "torchrun.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    worker.clear_rank_files(output_dir)
    run_id = uuid.uuid4().hex
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0", "--rdzv-id", run_id,
           "--max-restarts", "0", *target]
    with log_path.open("w") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                start_new_session=True)  # its own process group: killed as one on timeout
        copier = threading.Thread(target=_copy, args=(proc.stdout, log, echo), daemon=True)
        copier.start()
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill(proc, output_dir, nproc, run_id)
            copier.join(timeout=10)
            kept = keep()
            raise TimeoutError(f"the {nproc} ranks did not finish within {timeout_s:g} s and were stopped; the {kept} "
                               f"rows finished so far are in {Path(output_dir) / 'results.json'}") from None
        except BaseException:  # Ctrl-C: the job is in a session of its own, so the terminal's signal missed it
            _kill(proc, output_dir, nproc, run_id)
            keep()
            raise
        copier.join(timeout=10)
    if code == 0:
        return
    text = log_path.read_text(errors="replace")
    raise _failure(text, nproc, code, output_dir, log_path, keep)


def _keep_rows(output_dir: str | os.PathLike, nproc: int) -> int:
    return len(worker.save_rows_so_far(output_dir, nproc).rows)


def _copy(stream, log, echo: bool) -> None:
    for line in stream:
        log.write(line)
        log.flush()
        if echo:
            sys.stderr.write(line)
            sys.stderr.flush()


def _kill(proc: subprocess.Popen, output_dir: str | os.PathLike, nproc: int, run_id: str) -> None:
    """Stop the job: SIGTERM to torchrun, which stops its workers (waiting up to 30 s for them), SIGKILL
    to it after ``_AGENT_STOP_S``; then SIGKILL to any worker of this job still alive -- torch starts each
    in a session of its own, out of torchrun's process group (their pids are in their rank files)."""
    for sig, wait_s in ((signal.SIGTERM, _AGENT_STOP_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue
    for state in worker.reports(output_dir, nproc).values():
        if _of_job(state.get("pid"), run_id):
            try:
                os.kill(state["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


def _of_job(pid: Any, run_id: str) -> bool:
    """Whether ``pid`` is a live worker of torchrun job ``run_id`` (its environment says so; a pid
    reused by another process does not), on Linux."""
    if not isinstance(pid, int):
        return False
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return f"TORCHELASTIC_RUN_ID={run_id}".encode() in environ.split(b"\0")


# torchrun's summary of a failed job (torch.distributed.elastic ChildFailedError), one block per rank.
_FAILURE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
_ROOT = "Root Cause (first observed failure):"


def exit_codes(torchrun_output: str) -> tuple[int | None, dict[int, int]]:
    """``(first rank to fail, {rank: exit code})`` from torchrun's failure summary ((None, {}) if none).

    >>> exit_codes("Failures:\\n  <NO_OTHER_FAILURES>\\nRoot Cause (first observed failure):\\n[0]:\\n"
    ...            "  rank      : 1 (local_rank: 1)\\n  exitcode  : 3 (pid: 7)")
    (1, {1: 3})
    """
    codes = {int(r): int(c) for r, c in _FAILURE.findall(torchrun_output)}
    _, _, root_part = torchrun_output.rpartition(_ROOT)
    root = _FAILURE.search(root_part) if root_part else None
    return (int(root.group(1)) if root else None), codes


def _describe(code: int) -> str:
    if code < 0:
        try:
            return f"exit code {code}, {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def _failure(text: str, nproc: int, code: int, output_dir: str | os.PathLike, log_path: Path,
             keep: Callable[[], int] | None = None) -> RankFailedError:
    root, codes = exit_codes(text)
    states = worker.reports(output_dir, nproc)
    # The ranks that stopped on their own: the first torchrun saw fail, those that exited with a status of
    # their own or reported their own error; not those torchrun stopped afterwards (SIGTERM, then SIGKILL:
    # torch lists them too), those that aborted a collective because of another, nor, unless first, those
    # that had finished their part (done: a failing last barrier is another rank's doing).
    stopped_by_torchrun = {-signal.SIGTERM, -signal.SIGKILL}
    first = {root} if root is not None and states.get(root, {}).get("state") != "aborted" else set()
    culprits = sorted(first | {r for r, c in codes.items() if c not in stopped_by_torchrun
                               and states.get(r, {}).get("state") not in ("aborted", "done")}
                      | {r for r, s in states.items() if s.get("state") == "failed"},
                      key=lambda r: (r != root, r))
    if not culprits:
        culprits = [root] if root is not None else []
    parts = []
    for r in culprits:
        state = states.get(r, {})
        # A rank that reported its own error and was stopped by torchrun while it exited (another rank that
        # aborted because of it exited first): the signal is torchrun's, not the rank's; its error says why.
        own_then_stopped = state.get("state") == "failed" and codes.get(r) in stopped_by_torchrun
        how = f" ({_describe(codes[r])})" if r in codes and not own_then_stopped else ""
        error = state.get("error") or (f"it had finished its part and failed afterwards (its output: {log_path})"
                                       if state.get("state") == "done" else
                                       f"no report: killed or crashed (its output: {log_path})")
        parts.append(f"rank {r} stopped{how}: {error}")
    if not parts:
        parts.append(f"torchrun exited with code {code} (its output: {log_path})")
    kept = (keep or functools.partial(_keep_rows, output_dir, nproc))()
    done = states.get(0, {}).get("state") == "done"
    where = Path(output_dir) / "results.json"
    return RankFailedError(f"{'; '.join(parts)}; " + (f"rank 0 had finished: the complete results are in {where}" if done
                           else f"the {kept} rows finished so far are in {where}"), culprits)
