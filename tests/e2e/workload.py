"""The end-to-end workload: every kind of task history a Ray user produces.

Thousands of short tasks, named tasks, tasks raising exceptions, a retry that fails then
succeeds (and one whose worker crashes first), nested tasks, actors with methods, an actor that
exits itself and one that is killed, a cancelled task, a task still running when the job ends,
and tasks that print known lines (one then fails, one then kills its worker). Run as a Ray
driver (RAY_ADDRESS set); N_TASKS sets the number of short tasks; the printing tasks' ids and
lines are written to the JSON file AFTERGLOW_E2E_PRINTS names.
"""
import json
import os
import sys
import tempfile
import time

import ray

N_TASKS = int(os.environ.get("N_TASKS", "2000"))
# Tasks that print a line of their own on each stream.
PRINTERS = 20
STATE_DIR = tempfile.mkdtemp(prefix="afterglow-e2e-")


@ray.remote
def short(i):
    return i * i


@ray.remote
def fails(i):
    raise ValueError(f"e2e failure number {i}")


@ray.remote
def child(x):
    time.sleep(0.01)
    return x + 1


@ray.remote
def parent(x):
    return ray.get(child.remote(x)) * 2


@ray.remote
def sleeps(seconds):
    time.sleep(seconds)
    return seconds


@ray.remote(max_retries=3, retry_exceptions=True)
def flaky_exception(path):
    n = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    if n == 0:
        raise RuntimeError(f"flaky_exception: attempt {n} fails on purpose")
    return n


# Its own runtime env gives it a worker of its own: os._exit() kills the worker process, and
# on a reused worker that also loses task events other tasks left buffered there (Ray then
# lists such a task as RUNNING forever, while the exported worker death fails it here).
@ray.remote(max_retries=2, runtime_env={"env_vars": {"AFTERGLOW_E2E_CRASH_WORKER": "1"}})
def flaky_crash(path):
    n = int(open(path).read()) if os.path.exists(path) else 0
    with open(path, "w") as f:
        f.write(str(n + 1))
    if n == 0:
        os._exit(1)
    return n


@ray.remote
def prints(i):
    print(f"afterglow e2e: printer {i} on stdout")
    print(f"afterglow e2e: printer {i} on stderr", file=sys.stderr)
    return i


@ray.remote(max_retries=0)
def prints_then_fails():
    print("afterglow e2e: about to fail")
    raise ValueError("afterglow e2e: failing after printing")


# A worker of its own (see flaky_crash): os._exit() kills it mid-task, so Ray never reports
# where this attempt's output ends.
@ray.remote(max_retries=0, runtime_env={"env_vars": {"AFTERGLOW_E2E_EXIT_WORKER": "1"}})
def prints_then_exits():
    print("afterglow e2e: last words before os._exit")
    sys.stdout.flush()
    os._exit(3)


def printing_tasks():
    """Runs the printing tasks; returns what each attempt printed, by task id."""
    printed = {}
    # Several to a worker, so each one's output is cut from a file other tasks wrote to too;
    # where Ray exports no RUNNING event (and so no offsets) for one, it is cut at Ray's marker
    # lines, and the comparison says how many were.
    refs = [prints.remote(i) for i in range(PRINTERS)]
    for i, ref in enumerate(refs):
        printed[ref.task_id().hex()] = {
            "stdout": f"afterglow e2e: printer {i} on stdout\n",
            "stderr": f"afterglow e2e: printer {i} on stderr\n",
        }
    ray.get(refs)
    for task, line in [(prints_then_fails, "afterglow e2e: about to fail\n"),
                       (prints_then_exits, "afterglow e2e: last words before os._exit\n")]:
        ref = task.remote()
        printed[ref.task_id().hex()] = {"stdout": line}
        try:
            ray.get(ref)
        except Exception:
            pass
    return printed


@ray.remote
class Counter:
    def __init__(self, start=0):
        self.n = start

    def incr(self, k=1):
        self.n += k
        return self.n

    def boom(self):
        raise KeyError("actor method failure on purpose")


@ray.remote
class Doomed:
    def ping(self):
        return "pong"

    def die(self):
        ray.actor.exit_actor()


def main():
    ray.init()
    cancelled = sleeps.remote(60)

    refs = [short.remote(i) for i in range(N_TASKS)]
    named = [short.options(name=f"named-short-{i}").remote(i) for i in range(5)]
    time.sleep(1.0)
    # A graceful cancel does not interrupt a sleeping task in Ray 2.60 (it would finish after
    # its sleep); force kills the worker, and Ray records the task as cancelled.
    ray.cancel(cancelled, force=True)
    try:
        ray.get(cancelled)
    except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError):
        pass

    failing = [fails.remote(i) for i in range(20)]
    nested = [parent.remote(i) for i in range(5)]

    counter = Counter.remote(10)
    actor_refs = [counter.incr.remote(i) for i in range(20)]
    boom = counter.boom.remote()

    exits, killed = Doomed.remote(), Doomed.remote()
    ray.get([exits.ping.remote(), killed.ping.remote()])
    try:
        ray.get(exits.die.remote())
    except ray.exceptions.RayActorError:
        pass
    ray.kill(killed)

    retried = flaky_exception.remote(os.path.join(STATE_DIR, "exception.cnt"))
    crashed = flaky_crash.remote(os.path.join(STATE_DIR, "crash.cnt"))

    ray.get(refs + named + nested + actor_refs + [retried, crashed])
    printed = printing_tasks()
    prints_file = os.environ.get("AFTERGLOW_E2E_PRINTS")
    if prints_file:
        with open(prints_file, "w") as f:
            json.dump(printed, f)
    for ref in failing + [boom]:
        try:
            ray.get(ref)
        except Exception:
            pass
    # Still running when the driver exits: Ray fails it at job end.
    sleeps.remote(600)
    time.sleep(1.0)
    print(f"workload done: {N_TASKS} short tasks")


if __name__ == "__main__":
    main()
    sys.exit(0)
