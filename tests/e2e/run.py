"""End to end with a real Ray cluster: Ray 2.60 exports to Afterglow, and Afterglow's answers
are compared with Ray's own state API.

One run of this script:
1. starts Afterglow behind a small proxy that can answer 503 for a while: `afterglow serve` on
   a fresh data directory (variants `serve` and `faults`; in `faults` the proxy refuses for
   15 s and Afterglow is restarted mid-run), or the three Lambda functions (the given
   binary, normally the built `bootstrap`, as a Lambda runtime under `cargo lambda watch`'s
   emulator) against SeaweedFS, with S3 notifications relayed to the compact function as SQS
   batches (variant `lambda`; see lambda_stack.py);
2. starts a single-node Ray head on 127.0.0.1 exporting every event type to the proxy, and runs
   `workload.py` as a driver;
3. captures Ray's answers (`ray list tasks --detail`, `summarize_tasks`, `ray list actors/jobs/
   nodes`), waits until Afterglow has as many attempts, stops Ray, and compares;
4. shows that the history is still served after the cluster is gone.

It prints one line per entity type (`tasks: N matched, M differ, K missing`) and exits 1 when
anything differs or is missing. Usage (tests/e2e/run does the setup):

    python run.py --afterglow target/release/afterglow --variant serve|faults --tasks 2000
    python run.py --afterglow ~/.cache/afterglow/target/lambda/afterglow/bootstrap --variant lambda
"""
import argparse
import http.server
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = "e2e"
# The fields of a task attempt compared with Ray's list.
TASK_FIELDS = [
    "state", "error_type", "name", "func_or_class_name", "type", "job_id", "actor_id",
    "parent_task_id", "node_id", "worker_id", "worker_pid",
]


def log(message):
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", flush=True)


def free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def http_json(url, timeout=30, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


class Api:
    """Afterglow's query API at `base`, with the bearer token when the deployment wants one."""

    def __init__(self, base, token=None):
        self.base = base
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    def get(self, path, timeout=30):
        return http_json(self.base + path, timeout, self.headers)


class Afterglow:
    """`afterglow serve` as a child process on a fixed port and data directory."""

    def __init__(self, binary, data_dir, port, log_path):
        self.binary, self.data_dir, self.port, self.log_path = binary, data_dir, port, log_path
        self.process = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    # What a deployment offers the test (LambdaStack offers the same): ingest serves
    # `/v1/events/{cluster}` under `ingest_base`, the query API lives under `query_base`.
    # `serve` on loopback needs neither token.
    ingest_token = query_token = None

    @property
    def ingest_base(self):
        return self.url

    @property
    def query_base(self):
        return self.url

    def start(self):
        log_file = open(self.log_path, "a")
        self.process = subprocess.Popen(
            [self.binary, "serve", "--addr", f"127.0.0.1:{self.port}", "--data-dir",
             self.data_dir, "--cluster", CLUSTER],
            stdout=log_file, stderr=subprocess.STDOUT,
        )
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                http_json(f"{self.url}/api/clusters", timeout=2)
                return
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        raise RuntimeError(f"afterglow did not start; see {self.log_path}")

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # graceful: compacts what is queued
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class FaultyProxy(http.server.ThreadingHTTPServer):
    """Forwards Ray's POSTs to Afterglow, or answers 503 while `failing` is set (and whenever
    Afterglow is down), counting what it did."""

    def __init__(self, port, upstream):
        self.upstream = upstream
        self.failing = threading.Event()
        self.counts = {"forwarded": 0, "refused": 0}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), ProxyHandler)

    def count(self, what):
        with self.lock:
            self.counts[what] += 1


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("content-length", "0")))
        if self.server.failing.is_set():
            self.server.count("refused")
            return self.answer(503, b'{"error": "injected outage"}')
        request = urllib.request.Request(
            self.server.upstream + self.path, data=body, method="POST",
            headers={"content-type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                self.server.count("forwarded")
                return self.answer(response.status, response.read())
        except urllib.error.HTTPError as err:
            return self.answer(err.code, err.read())
        except (urllib.error.URLError, ConnectionError, OSError):
            self.server.count("refused")
            return self.answer(503, b'{"error": "afterglow is restarting"}')

    def answer(self, status, body):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def ray_env(export_addr, temp_dir):
    env = dict(os.environ)
    env.update({
        "RAY_enable_ray_event": "true",
        "RAY_enable_core_worker_ray_event_to_aggregator": "true",
        "RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR": export_addr,
        "RAY_DASHBOARD_AGGREGATOR_AGENT_EXPOSABLE_EVENT_TYPES": "ALL",
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_AUTH_MODE": "disabled",
        "RAY_TMPDIR": temp_dir,
    })
    return env


def ray_cli(env, *args, capture=True):
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    result = subprocess.run([ray, *args], env=env, capture_output=capture, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"ray {' '.join(args)} failed: {result.stderr[-2000:]}")
    return result.stdout


def ray_answers(env, address):
    """Ray's own view, before the cluster stops."""
    tasks = json.loads(ray_cli(env, "list", "tasks", "--detail", "--format", "json",
                               "--limit", "10000", "--address", address))
    actors = json.loads(ray_cli(env, "list", "actors", "--format", "json", "--limit", "10000",
                                "--address", address))
    jobs = json.loads(ray_cli(env, "list", "jobs", "--format", "json", "--address", address))
    nodes = json.loads(ray_cli(env, "list", "nodes", "--format", "json", "--address", address))
    summary = json.loads(subprocess.run(
        [sys.executable, "-c",
         "import json, sys; from ray.util.state import summarize_tasks; "
         "print(json.dumps(summarize_tasks(address=sys.argv[1], raise_on_missing_output=False)))", address],
        env=env, capture_output=True, text=True, check=True, timeout=300).stdout)
    return {"tasks": tasks, "actors": actors, "jobs": jobs, "nodes": nodes, "summary": summary}


def timed(url, repeat, headers=None):
    """Median and p95 latency (ms) of `repeat` GETs of `url`, after one untimed warm-up."""
    http_json(url, timeout=120, headers=headers)
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        http_json(url, timeout=120, headers=headers)
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return {"p50_ms": samples[len(samples) // 2],
            "p95_ms": samples[min(len(samples) - 1, int(len(samples) * 0.95))]}


def versus_ray(dashboard, api, ray, repeat):
    """The same questions asked of Ray's dashboard API and of Afterglow, on the same tasks,
    while both hold them. Prints one JSON line; ratio > 1 means Afterglow is faster."""
    failed = next((t for t in ray["tasks"] if t["state"] == "FAILED"), ray["tasks"][0])
    task_id = failed["task_id"]
    scope, base = f"cluster={CLUSTER}", api.base
    pairs = {
        "table_page": (f"{dashboard}/api/v0/tasks?limit=100&detail=1",
                       f"{base}/api/tasks?{scope}&limit=100"),
        "failed_page": (f"{dashboard}/api/v0/tasks?limit=100&detail=1&filter_keys=state"
                        f"&filter_predicates=%3D&filter_values=FAILED",
                        f"{base}/api/tasks?{scope}&limit=100&state=FAILED"),
        "per_name_summary": (f"{dashboard}/api/v0/tasks/summarize",
                             f"{base}/api/aggregates?{scope}&by=name&limit=1000"),
        "point_lookup": (f"{dashboard}/api/v0/tasks?detail=1&filter_keys=task_id"
                         f"&filter_predicates=%3D&filter_values={task_id}",
                         f"{base}/api/tasks/{task_id}?{scope}"),
    }
    report = {"attempts": len(ray["tasks"]), "repeat": repeat, "routes": {}}
    for name, (theirs, ours) in pairs.items():
        ray_time, our_time = timed(theirs, repeat), timed(ours, repeat, api.headers)
        report["routes"][name] = {"ray": ray_time, "afterglow": our_time,
                                  "ratio_p50": ray_time["p50_ms"] / our_time["p50_ms"]}
    print("versus_ray " + json.dumps(report), flush=True)


def all_pages(api, path, query, field):
    rows, cursor = [], None
    while True:
        page = api.get(f"{path}?{query}" + (f"&cursor={cursor}" if cursor else ""))
        rows.extend(page[field])
        cursor = page.get("next")
        if not cursor:
            return rows


def wait_for_attempts(api, expected, timeout):
    """Waits until Afterglow shows `expected` attempts and the count has settled."""
    deadline, last, stable_since = time.time() + timeout, None, time.time()
    while time.time() < deadline:
        total = api.get(f"/api/summary?cluster={CLUSTER}")["total"]
        if total != last:
            last, stable_since = total, time.time()
        if total >= expected and time.time() - stable_since > 3:
            return total
        time.sleep(1)
    return last


def compare(ray, api):
    """One line per entity type; returns the number of problems."""
    problems = 0
    ours = {(row["task_id"], row["attempt_number"]): row
            for row in all_pages(api, "/api/tasks", f"cluster={CLUSTER}&limit=1000", "tasks")}
    matched, differ, missing, examples = 0, 0, 0, []
    for task in ray["tasks"]:
        key = (task["task_id"], task["attempt_number"])
        row = ours.get(key)
        if row is None:
            missing += 1
            examples.append(f"missing {key} {task['name']} {task['state']}")
            continue
        diffs = [f"{field}: ours {row.get(field)!r}, Ray's {task.get(field)!r}"
                 for field in TASK_FIELDS if row.get(field) != task.get(field)]
        if diffs:
            differ += 1
            examples.append(f"differs {key} {task['name']}: " + "; ".join(diffs))
        else:
            matched += 1
    extra = len(set(ours) - {(t["task_id"], t["attempt_number"]) for t in ray["tasks"]})
    print(f"tasks: {matched} matched, {differ} differ, {missing} missing, {extra} extra")
    problems += differ + missing + extra

    summary = api.get(f"/api/summary?cluster={CLUSTER}")
    ray_summary = ray["summary"]["cluster"]["summary"]
    groups = all_pages(api, "/api/aggregates", f"cluster={CLUSTER}&by=name&limit=1000", "groups")
    our_groups = {group["key"]: group["by_state"] for group in groups}
    same = sum(1 for name, group in ray_summary.items()
               if our_groups.get(name) == group["state_counts"])
    ray_total = sum(sum(group["state_counts"].values()) for group in ray_summary.values())
    print(f"summary: {same} of {len(ray_summary)} task names with equal state counts; "
          f"total {summary['total']} (Ray {ray_total})")
    problems += (len(ray_summary) - same) + (summary["total"] != ray_total)
    problems += len(our_groups) != len(ray_summary)

    for route, id_field, rows in [("actors", "actor_id", ray["actors"]),
                                  ("nodes", "node_id", ray["nodes"])]:
        theirs = {row[id_field]: row["state"] for row in rows}
        mine = {row[id_field]: row["state"]
                for row in all_pages(api, f"/api/{route}", f"cluster={CLUSTER}", route)}
        same = sum(1 for key, state in theirs.items() if mine.get(key) == state)
        lost = sum(1 for key in theirs if key not in mine)
        print(f"{route}: {same} matched, {len(theirs) - same - lost} differ, {lost} missing")
        problems += len(theirs) - same
    # `ray list jobs` shows submission jobs and drivers; the export carries drivers only.
    drivers = {job["job_id"] for job in ray["jobs"] if job.get("job_id")}
    mine = {row["job_id"] for row in all_pages(api, "/api/jobs", f"cluster={CLUSTER}", "jobs")}
    print(f"jobs: {len(drivers & mine)} matched, {len(drivers - mine)} missing")
    problems += len(drivers - mine)
    for line in examples[:20]:
        print("  " + line)
    return problems


def start_deployment(args, work):
    """`afterglow serve` (variants serve, faults) or the Lambda stack (variant lambda),
    started."""
    if args.variant == "lambda":
        from lambda_stack import LambdaStack  # needs boto3, which only this variant uses

        stack = LambdaStack(os.path.abspath(os.path.join(HERE, "..", "..")),
                            os.path.abspath(args.afterglow), work, CLUSTER, log)
        try:
            stack.start()
        except BaseException:
            stack.stop()
            raise
        return stack
    afterglow = Afterglow(os.path.abspath(args.afterglow), os.path.join(work, "data"),
                          free_port(), os.path.join(work, "afterglow.log"))
    afterglow.start()
    return afterglow


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--afterglow", required=True,
                        help="the afterglow binary (for lambda: the Lambda bootstrap)")
    parser.add_argument("--variant", choices=["serve", "faults", "lambda"], default="serve",
                        help="serve: `afterglow serve`; faults: the same with 503s and a "
                        "restart; lambda: the three functions as Lambda runtimes under "
                        "`cargo lambda watch --only-lambda-apis`, against SeaweedFS")
    parser.add_argument("--tasks", type=int, default=2000, help="short tasks in the workload")
    parser.add_argument("--keep", help="keep the work directory here")
    parser.add_argument("--versus-ray", type=int, default=0, metavar="R",
                        help="also time R requests of each route against Ray's dashboard API")
    args = parser.parse_args()

    work = args.keep or tempfile.mkdtemp(prefix="afterglow-e2e-")
    os.makedirs(work, exist_ok=True)
    deployment = start_deployment(args, work)
    api = Api(deployment.query_base, deployment.query_token)
    proxy = FaultyProxy(free_port(), deployment.ingest_base)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    # Ray cannot send headers: the ingest token travels in the export URL.
    token = f"?token={deployment.ingest_token}" if deployment.ingest_token else ""
    export_addr = f"http://127.0.0.1:{proxy.server_address[1]}/v1/events/{CLUSTER}{token}"
    env = ray_env(export_addr, os.path.join(work, "ray"))
    os.makedirs(env["RAY_TMPDIR"], exist_ok=True)
    gcs_port, dashboard_port = free_port(), free_port()
    address = f"127.0.0.1:{gcs_port}"
    log(f"variant {args.variant}: ingest at {deployment.ingest_base}, queries at {api.base}, "
        f"Ray exports through the proxy on port {proxy.server_address[1]}")

    status = 1
    ray_stopped = False
    try:
        ray_cli(env, "start", "--head", "--num-cpus=2", "--include-dashboard=true",
                "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
                "--node-ip-address=127.0.0.1", f"--port={gcs_port}", "--disable-usage-stats",
                f"--temp-dir={env['RAY_TMPDIR']}")
        log("Ray started")
        if args.variant == "faults":
            proxy.failing.set()
        driver_env = dict(env, RAY_ADDRESS=address, N_TASKS=str(args.tasks))
        workload = subprocess.Popen([sys.executable, os.path.join(HERE, "workload.py")],
                                    env=driver_env)
        if args.variant == "faults":
            time.sleep(15)
            proxy.failing.clear()
            log(f"503 window over ({proxy.counts['refused']} deliveries refused)")
            time.sleep(5)
            log("restarting afterglow mid-run")
            deployment.stop()
            time.sleep(3)
            deployment.start()
        if workload.wait(timeout=900) != 0:
            raise RuntimeError("the workload failed")
        log("workload finished; letting the agent flush")
        time.sleep(10)
        ray = ray_answers(env, address)
        log(f"Ray lists {len(ray['tasks'])} attempts")
        seen = wait_for_attempts(api, len(ray["tasks"]), timeout=180)
        log(f"Afterglow shows {seen} attempts")
        if args.versus_ray:
            versus_ray(f"http://127.0.0.1:{dashboard_port}", api, ray, args.versus_ray)
        ray_cli(env, "stop", "--force")
        ray_stopped = True
        log("Ray stopped; comparing")
        problems = compare(ray, api)
        after = api.get(f"/api/summary?cluster={CLUSTER}")
        print(f"after the cluster is gone: {after['total']} attempts still served "
              f"({after['by_state']})")
        print(f"deliveries: {proxy.counts['forwarded']} forwarded, "
              f"{proxy.counts['refused']} refused with 503")
        if args.variant == "lambda":
            counts = deployment.relay.counts
            print(f"notifications: {counts['objects']} raw objects, {counts['invocations']} "
                  f"compact invocations, {counts['redelivered']} redelivered, "
                  f"{counts['dead_lettered']} dead-lettered")
            problems += counts["dead_lettered"]
        status = 0 if problems == 0 and after["total"] > 0 else 1
    finally:
        if not ray_stopped:
            subprocess.run([os.path.join(os.path.dirname(sys.executable), "ray"), "stop",
                            "--force"], env=env, capture_output=True)
        deployment.stop()
        proxy.shutdown()
    if status == 0 and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    log("passed" if status == 0 else f"FAILED (work directory: {work})")
    return status


if __name__ == "__main__":
    sys.exit(main())
