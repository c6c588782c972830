"""Tasks spread over workers for the commands that outgrow one process (`npu regress`, `npu build
--seeds`): Ray (the `cluster` extra; a local instance, or a cluster at `--address`/RAY_ADDRESS) or
local processes. Tasks are module-level functions of picklable arguments; results come back as they
finish, a task's own exception in place of its result (reported by the caller, never dropped), and
leaving the iteration (Ctrl-C) cancels what is still running."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from .common import CliError, int_in


def add_arguments(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--engine",
        choices=["auto", "ray", "local"],
        default="auto",
        help=f"where {what} run: ray (pip install -e '.[cluster]'), local processes, or auto (default: "
        "Ray when it is installed)",
    )
    p.add_argument(
        "--address", help="Ray: a cluster's HOST:PORT (default: RAY_ADDRESS, else a local instance)"
    )
    p.add_argument("--workers", type=int_in(1, 4096), help="local workers or CPUs (default: all cores)")


def _have_ray() -> bool:
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def engine_of(args: argparse.Namespace) -> str:
    """ "ray" or "local", as `--engine` and what is installed decide."""
    if args.engine == "ray" and not _have_ray():
        raise CliError("--engine ray needs Ray: pip install -e '.[cluster]'")
    if args.engine == "ray" or (args.engine == "auto" and _have_ray()):
        return "ray"
    if args.address:
        raise CliError("--address needs Ray (pip install -e '.[cluster]')")
    return "local"


def run_tasks(fn: Callable, items: Iterable, args: argparse.Namespace) -> Iterator[tuple[Any, Any]]:
    """(item, fn(item) or the exception it raised), as the tasks finish."""
    items = list(items)
    if not items:
        return iter(())
    if engine_of(args) == "ray":
        return _ray(fn, items, args.address, args.workers)
    return _local(fn, items, args.workers)


def _local(fn: Callable, items: list, workers: int | None) -> Iterator[tuple[Any, Any]]:
    from concurrent.futures import ProcessPoolExecutor, as_completed

    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()  # a forked worker must not inherit Ray's client threads (it crashes in gRPC)
    pool = ProcessPoolExecutor(max_workers=workers or os.cpu_count())
    try:
        futures = {pool.submit(fn, x): x for x in items}
        for f in as_completed(futures):
            try:
                yield futures[f], f.result()
            except Exception as e:  # the task's own failure: the caller reports it
                yield futures[f], e
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _ray(fn: Callable, items: list, address: str | None, workers: int | None) -> Iterator[tuple[Any, Any]]:
    import ray

    if ray.is_initialized() and address and ray.get_runtime_context().gcs_address != address:
        ray.shutdown()  # an earlier run's instance in this process: join the cluster asked for
    if not ray.is_initialized():
        kw = {} if address or os.environ.get("RAY_ADDRESS") else {"num_cpus": workers}
        if kw:  # a local instance: its workers run at normal priority (Ray's default niceness of 15
            # starved simulations 20x behind any other work on the machine, docs/scale-out.md)
            os.environ.setdefault("RAY_worker_niceness", "0")
        ray.init(address=address, include_dashboard=False, log_to_driver=False, **kw)
    task = ray.remote(max_retries=3)(fn)  # a task whose worker is lost runs again
    pending = {task.remote(x): x for x in items}
    # Ray prints its notices (a task retried after its node was lost) on stdout, which belongs to
    # the command's output (--json): they go to stderr while the tasks run
    with contextlib.redirect_stdout(sys.stderr):
        try:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    x = pending.pop(ref)
                    try:
                        yield x, ray.get(ref)
                    except Exception as e:  # RayTaskError: the task raised; the caller reports it
                        yield x, e
        finally:
            for ref in pending:
                ray.cancel(ref, force=True)


def progress(total: int, desc: str, unit: str):
    """A progress bar on stderr (tqdm, with the cluster extra), or None: the caller prints lines."""
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, unit=unit, desc=desc, file=sys.stderr)


def run_cached(fn: Callable, tasks: list, cache, args: argparse.Namespace, desc: str, unit: str = "task"
               ) -> tuple[dict, list[tuple[Any, Exception]], bool]:  # fmt: skip
    """Run `fn` over `tasks` (each with a `key()`), results taken from and put in `cache` (a
    npu.files.JsonCache; None: no cache): (task -> result, the tasks that raised with their errors,
    whether Ctrl-C stopped the run, keeping what finished)."""
    results: dict = {}
    for t in tasks:
        hit = cache.get(t.key()) if cache is not None else None
        if hit is not None:
            results[t] = hit
    todo = [t for t in tasks if t not in results]
    bar = progress(len(tasks), desc, unit) if todo else None
    if bar is not None:
        bar.update(len(results))
    errors, interrupted = [], False
    try:
        for task, res in run_tasks(fn, todo, args):
            if isinstance(res, Exception):
                errors.append((task, res))
            else:
                results[task] = res
                if cache is not None:
                    cache.put(task.key(), res)
            if bar is not None:
                bar.update(1)
            else:
                print(f"{desc}: {len(results) + len(errors)}/{len(tasks)}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        if bar is not None:
            bar.close()
    return results, errors, interrupted
