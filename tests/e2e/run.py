"""End to end with a real Ray cluster: Ray 2.60 exports to Afterglow, and Afterglow's answers
are compared with Ray's own state API.

One run of this script:
1. starts Afterglow behind a small proxy that can answer 503 for a while: `afterglow serve` on
   a fresh data directory (variants `serve` and `faults`; in `faults` the proxy refuses for
   15 s and Afterglow is restarted mid-run), or the three Lambda functions (the given
   binary, normally the built `bootstrap`, as a Lambda runtime under lambda_emulator.py)
   against SeaweedFS, with S3 notifications relayed to the compact function as SQS
   batches, and log requests through the log queue to the log store function (variant
   `lambda`; see lambda_stack.py);
2. starts a single-node Ray head on 127.0.0.1 exporting every event type to the proxy, and runs
   `workload.py` as a driver;
   `afterglow-ship-logs` (the shipper's own binary, without DuckDB, from the wheel tests/e2e/run
   built and installed into Ray's virtualenv) runs beside Ray and sends its session logs through the same proxy; in the `serve` variant, once the workload is done,
   a synthetic session of 60 000 attempts is posted beside it, `afterglow publish` publishes
   the tables as Iceberg and a second driver reads them with `ray.data.read_iceberg` on the
   same cluster (read_iceberg.py), once while the synthetic session holds deltas and once
   after `afterglow compact --fold`; in the `faults` variant, a captured run with a killed
   node is posted beside it, and Ray's own dashboard, started with `--proxy-server-url` at
   Afterglow, is driven over both histories in Chromium (ray_dashboard.mjs);
3. captures Ray's answers (`ray list tasks --detail`, `summarize_tasks`, `ray list actors/jobs
   --detail`, `ray list nodes`, each printing task's own output, the dashboard's cluster events
   and cluster metadata), masks their runtime envs'
   `env_vars` values with Ray's own redaction (as Ray's dashboard shows them, and as Afterglow
   answers them always), waits until Afterglow has as many attempts, stops Ray and the
   shipper, removes Ray's session directory, and compares;
4. shows that the history is still served after the cluster is gone.

It prints one line per entity type (`tasks: N matched, M differ, K missing`) and exits 1 when
anything differs or is missing. Usage (tests/e2e/run does the setup):

    python run.py --afterglow target/release/afterglow --shipper VENV/bin/afterglow-ship-logs \
        --variant serve|faults --tasks 2000
    python run.py --afterglow ~/.cache/afterglow/target/lambda/afterglow/bootstrap \
        --shipper VENV/bin/afterglow-ship-logs --variant lambda
"""
import argparse
import gzip
import http.server
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

from ports import free_port

# Ray's own masking of runtime-env secrets (this script runs in Ray's virtualenv).
from ray.dashboard.runtime_env_redaction import redact_runtime_env, redact_state_rows

HERE = os.path.dirname(os.path.abspath(__file__))
CLUSTER = "e2e"
# A synthetic session posted beside the run's (serve variant): more attempts than a session
# folded at every commit (FoldPolicy::small_session_rows) and more than Ray's lists cap.
SYNTHETIC = "synthetic"
SYNTHETIC_ATTEMPTS = 60_000
# A captured run of two nodes, one of them killed mid-run (tests/fixtures/ray-2.60/known-problems),
# posted beside the run's in the faults variant: the run's own cluster has no dead node, and
# Ray's dashboard must reach a dead node's shipped files too.
KILLED_NODE_RUN = os.path.join(HERE, "..", "fixtures", "ray-2.60", "known-problems")
KILLED_NODE_CLUSTER = "killed-node"
# The fields of a task attempt compared with Ray's list.
TASK_FIELDS = [
    "state", "error_type", "name", "func_or_class_name", "type", "job_id", "actor_id",
    "parent_task_id", "node_id", "worker_id", "worker_pid",
]


def log(message):
    print(f"[e2e {time.strftime('%H:%M:%S')}] {message}", flush=True)


# Answers that came gzipped (every client in the test asks for gzip, as browsers and Ray's
# dashboard and CLI do); the run fails if none did.
GZIPPED = {"answers": 0}


def http_json(url, timeout=30, headers=None):
    request = urllib.request.Request(url, headers={"Accept-Encoding": "gzip", **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            GZIPPED["answers"] += 1
            body = gzip.decompress(body)
        return json.loads(body)


class Api:
    """Afterglow's query API at `base`, with the bearer token when the deployment wants one.
    A GET gets one try: every variant's server answers whole or the run fails."""

    def __init__(self, base, token=None):
        self.base = base
        self.headers = {"authorization": f"Bearer {token}"} if token else {}

    def get(self, path, timeout=30):
        try:
            return http_json(self.base + path, timeout, self.headers)
        except urllib.error.HTTPError as err:
            print(f"GET {path[:120]} answered {err.code}: {err.read()[:500]!r}")
            raise

    def get_bytes(self, path, timeout=30):
        """(status, body) of a GET, errors included."""
        status, _, body = self.get_with_headers(path, timeout)
        return status, body

    def get_with_headers(self, path, timeout=30):
        """(status, headers, body) of a GET, errors included."""
        request = urllib.request.Request(self.base + path, headers=self.headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, response.headers, response.read()
        except urllib.error.HTTPError as err:
            return err.code, err.headers, err.read()


class LogShipper:
    """`afterglow-ship-logs` beside the Ray node, as a user starts it: before `ray start` (it
    waits for Ray's directory), with the export URL, token included, in the environment Ray
    reads it from rather than on its command line, where any process list would show it."""

    def __init__(self, shipper, export_addr, ray_dir, dashboard, log_path):
        env = dict(os.environ, RAY_DASHBOARD_AGGREGATOR_AGENT_EVENTS_EXPORT_ADDR=export_addr)
        env.pop("AWS_LAMBDA_RUNTIME_API", None)
        self.process = subprocess.Popen(
            [shipper, "--ray-dir", ray_dir, "--interval", "500ms", "--dashboard", dashboard],
            env=env, stdout=open(log_path, "a"), stderr=subprocess.STDOUT)

    def stop(self):
        """SIGTERM, as Kubernetes stops a pod: the shipper makes its last pass and exits."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def ray_task_logs(env, address, printed):
    """Ray's own answer (`ray.util.state.get_log`) for each printing task's streams, from the
    live cluster: {task_id: {stream: text or None when Ray could not tell}}."""
    script = (
        "import json, sys\n"
        "from ray.util.state import get_log\n"
        "printed = json.load(open(sys.argv[2]))\n"
        "out = {}\n"
        "for task_id, streams in printed.items():\n"
        "    out[task_id] = {}\n"
        "    for stream in streams:\n"
        "        try:\n"
        "            out[task_id][stream] = ''.join(get_log(address=sys.argv[1], task_id=task_id,\n"
        "                suffix='out' if stream == 'stdout' else 'err'))\n"
        "        except Exception as err:\n"
        "            out[task_id][stream] = None\n"
        "print(json.dumps(out))\n")
    result = subprocess.run([sys.executable, "-c", script, address, printed], env=env,
                            capture_output=True, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"reading Ray's task logs failed: {result.stderr[-2000:]}")
    return json.loads(result.stdout)


def rays_dashboard_records(dashboard):
    """What Ray's live dashboard answers of the cluster beyond the export: its cluster events
    (the overview's list) and its cluster metadata (the Cluster page's versions)."""
    return {"events": http_json(f"{dashboard}/events"),
            "cluster_metadata": http_json(f"{dashboard}/api/v0/cluster_metadata")}


def compare_dashboard_records(api, theirs):
    """Afterglow's answers, from what the shipper stored, against Ray's live ones: every event
    Ray listed, as Ray listed it (later ones may follow), and the cluster metadata. Returns
    the number of problems."""
    route = f"/ray/{CLUSTER}/latest"
    ours = api.get(f"{route}/events")["data"]["events"]
    shipped = {(job, event.get("eventId")): event
               for job, events in ours.items() for event in events}
    listed = [(job, event) for job, events in theirs["events"]["data"]["events"].items()
              for event in events]
    missing = [event for job, event in listed if (job, event.get("eventId")) not in shipped]
    differ = [(event, shipped[(job, event.get("eventId"))]) for job, event in listed
              if (job, event.get("eventId")) in shipped
              and shipped[(job, event.get("eventId"))] != event]
    sources = sorted({event.get("sourceType") for _, event in listed})
    print(f"cluster events: {len(listed) - len(missing) - len(differ)} of the {len(listed)} "
          f"Ray listed ({', '.join(sources)}) as Ray listed them, {len(missing)} missing, "
          f"{len(differ)} differ; {len(shipped) - len(listed) + len(missing)} more shipped")
    for event in missing[:3]:
        print(f"  missing: {json.dumps(event)[:300]}")
    for theirs_event, ours_event in differ[:3]:
        print(f"  differs: Ray's {json.dumps(theirs_event)[:300]}\n"
              f"           ours {json.dumps(ours_event)[:300]}")
    metadata = api.get(f"{route}/api/v0/cluster_metadata")
    same = metadata == theirs["cluster_metadata"]
    print(f"cluster metadata: {'as' if same else 'NOT as'} Ray answered it "
          f"({json.dumps(metadata['data'])})")
    return int(not listed) + len(missing) + len(differ) + (not same)


def compare_logs_through_rays_route(api, ray_logs):
    """Ray's own log route (`api/v0/logs/file?task_id=…`, as Ray's dashboard task page asks it;
    Ray's `get_log`/`ray logs` need a GCS address, so they cannot be pointed at a URL) over
    Afterglow after the cluster is gone: the text the live cluster gave. Returns the number of
    problems."""
    compared = [(task_id, stream, text) for task_id, streams in ray_logs.items()
                for stream, text in streams.items() if text is not None]
    differ = []
    for task_id, stream, text in compared:
        suffix = "out" if stream == "stdout" else "err"
        status, body = api.get_bytes(f"/ray/{CLUSTER}/latest/api/v0/logs/file?task_id={task_id}"
                                     f"&suffix={suffix}&lines=50000&filter_ansi_code=true")
        if status != 200 or body.decode("utf-8", "replace") != text:
            differ.append((task_id, stream, status, body[:200]))
    print(f"api/v0/logs/file?task_id=… (Ray's dashboard) over afterglow: "
          f"{len(compared) - len(differ)} of {len(compared)} streams as the live cluster gave them")
    for task_id, stream, status, body in differ[:3]:
        print(f"  {task_id[:12]}… {stream}: {status} {body!r} vs {ray_logs[task_id][stream]!r:.200}")
    return len(differ) + (not compared)


def compare_logs(api, printed_path, ray_logs):
    """Each printing task's output from Afterglow, after Ray and its session directory are
    gone: exactly what the task printed, and Ray's own answer where Ray could give one (not
    for the task whose worker died: Ray never reported its offsets, so Afterglow infers
    them). Returns the number of problems."""
    with open(printed_path) as f:
        printed = json.load(f)
    problems, checked, inferred = 0, 0, 0
    for task_id, streams in printed.items():
        for stream, line in streams.items():
            status, headers, body = api.get_with_headers(
                f"/api/tasks/{task_id}/logs?stream={stream}")
            text = body.decode("utf-8", "replace")
            theirs = ray_logs.get(task_id, {}).get(stream)
            ok = status == 200 and text == line and (theirs is None or theirs == text)
            checked += 1
            inferred += headers.get("x-afterglow-log-range") == "inferred"
            if not ok:
                problems += 1
                print(f"  logs of {task_id[:12]}… {stream}: {status} {text[:200]!r} "
                      f"(Ray: {theirs!r:.200}, printed {line!r})")
    print(f"task logs after the session directory is gone: {checked - problems} of {checked} "
          f"streams exactly as printed and as Ray served them ({inferred} where Ray reported "
          f"no offsets, cut at Ray's marker lines)")
    return problems


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
    query_token = None

    def ingest_token(self, cluster):
        return None

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


class AfterglowProxy:
    """`afterglow proxy --auth bearer` in front of `api`, as an `Api` without a token."""

    def __init__(self, binary, api, log_path):
        self.binary, self.api, self.log_path = binary, api, log_path
        self.process = None

    def __enter__(self):
        port = free_port()
        env = dict(os.environ)
        env.pop("AWS_LAMBDA_RUNTIME_API", None)
        env["AFTERGLOW_QUERY_TOKEN"] = self.api.headers["authorization"].split(" ", 1)[1]
        self.process = subprocess.Popen(
            [self.binary, "proxy", "--url", self.api.base, "--addr", f"127.0.0.1:{port}",
             "--auth", "bearer"],
            env=env, stdout=open(self.log_path, "a"), stderr=subprocess.STDOUT)
        proxied = Api(f"http://127.0.0.1:{port}")
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                proxied.get("/api/clusters", timeout=5)
                return proxied
            except (urllib.error.URLError, ConnectionError, OSError):
                time.sleep(0.2)
        raise RuntimeError(f"afterglow proxy did not start; see {self.log_path}")

    def __exit__(self, *exc):
        self.process.terminate()
        self.process.wait(timeout=30)


class SwitchProxy(http.server.ThreadingHTTPServer):
    """What Ray's dashboard is started with as `--proxy-server-url`: 404 for everything (so Ray
    answers from its live cluster, the ground truth) until `forwarding` is set, then every
    request goes to Afterglow, as a user's dashboard proxy would send it, headers included both
    ways (the timeline download rests on the answer's Content-Disposition). Ray's dashboard
    adds `prefix`, Afterglow's Ray route, to every path; a GET of `ROUTE_PATH?to=ROUTE` (from
    the browser check) sends what follows to Afterglow's route `ROUTE` instead, another cluster's
    history. `unanswered` counts Afterglow's error answers but those Ray's own dashboard gives
    too, by (method, path, status)."""

    ROUTE_PATH = "/afterglow-e2e/route"

    def __init__(self, port, upstream, prefix):
        self.upstream = upstream
        self.prefix = prefix
        self.route = prefix
        self.forwarding = threading.Event()
        self.forwarded = 0
        self.unanswered = {}
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", port), SwitchHandler)

    def record(self, method, path, status):
        with self.lock:
            self.forwarded += 1
            if status >= 400 and not as_ray_answers(path.removeprefix(self.prefix), status):
                key = (method, path[:200], status)
                self.unanswered[key] = self.unanswered.get(key, 0) + 1


# Error answers Ray's own dashboard gives too on a cluster without Prometheus and without
# platform (Kubernetes) events; that 404 tells the frontend to hide the events page.
RAYS_OWN_ERRORS = {("/api/prometheus_health", 500), ("/api/v0/platform_events", 404)}


def as_ray_answers(path, status):
    """Whether an error answer to a dashboard path is as Ray's own, or a 404 that leaves the
    UI's own files (the page, its scripts and images) to Ray's dashboard."""
    path = path.split("?")[0]
    return (path, status) in RAYS_OWN_ERRORS or status == 404 and (
        path == "/" or path.startswith("/static/") or "." in path.rsplit("/", 1)[-1])


# Hop-by-hop headers, and those the proxy sets itself.
UNFORWARDED = {"connection", "keep-alive", "transfer-encoding", "te", "trailers", "upgrade",
               "proxy-authenticate", "proxy-authorization", "host", "content-length", "date",
               "server"}


class SwitchHandler(http.server.BaseHTTPRequestHandler):
    def handle_any(self):
        body = self.rfile.read(int(self.headers.get("content-length", "0") or 0))
        path, _, query = self.path.partition("?")
        if path == SwitchProxy.ROUTE_PATH:
            self.server.route = urllib.parse.parse_qs(query)["to"][0]
            return self.answer(204, b"", [])
        if not self.server.forwarding.is_set():
            return self.answer(404, b"", [("content-type", "text/plain")])
        headers = {k: v for k, v in self.headers.items() if k.lower() not in UNFORWARDED}
        upstream_path = self.server.route + self.path.removeprefix(self.server.prefix)
        request = urllib.request.Request(self.server.upstream + upstream_path, data=body or None,
                                         method=self.command, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, headers, body = response.status, response.headers, response.read()
        except urllib.error.HTTPError as err:
            status, headers, body = err.code, err.headers, err.read()
        self.server.record(self.command, self.path, status)
        self.answer(status, body, [(k, v) for k, v in headers.items()
                                   if k.lower() not in UNFORWARDED])

    do_GET = do_POST = do_HEAD = do_PUT = do_DELETE = handle_any  # noqa: N815

    def answer(self, status, body, headers):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, *args):
        pass


def dashboard_facts(ray, printed):
    """What Ray's dashboard pages must show over Afterglow, from Ray's live answers and what
    the workload printed (see ray_dashboard.mjs)."""
    drivers = [job["job_id"] for job in ray["jobs"] if job.get("job_id")]
    job = max(drivers, key=lambda job_id: sum(t["job_id"] == job_id for t in ray["tasks"]))
    tasks = [t for t in ray["tasks"] if t["job_id"] == job]
    # A failed task that printed, so that its page has both an error and a log to show.
    task = next(t for t in tasks if t["state"] == "FAILED" and t["task_id"] in printed
                and (t.get("task_log_info") or {}).get("stdout_file"))
    stdout = printed[task["task_id"]]["stdout"].strip()
    # A task that printed to both streams, with the offsets Ray reported for them.
    printer = next(t for t in tasks if "stderr" in printed.get(t["task_id"], {})
                   and (t.get("task_log_info") or {}).get("stderr_file"))
    submitted = ray["submitted"]["e2e-submit-fail"]
    actor = next(a for a in ray["actors"] if a["job_id"] == job and a["class_name"] == "Counter")
    node = ray["nodes"][0]
    return {
        "job": job,
        "total": len(tasks),
        "failed": sum(t["state"] == "FAILED" for t in tasks),
        "actors": sum(a["job_id"] == job for a in ray["actors"]),
        "submission": {
            "id": submitted["submission_id"], "job_id": submitted["job_id"],
            "entrypoint": submitted["entrypoint"],
            "message": submitted["message"].splitlines()[0],
            # Ray quotes the driver's last output in the message; the driver log has it too.
            "driver_line": submitted["message"].strip().splitlines()[-1],
        },
        "task": {
            "id": task["task_id"], "job_id": job, "name": task["name"],
            "error_type": task["error_type"],
            "error": task["error_message"].strip().splitlines()[-1], "stdout": stdout,
        },
        "printer": {"id": printer["task_id"], "name": printer["name"],
                    "stdout": printed[printer["task_id"]]["stdout"].strip(),
                    "stderr": printed[printer["task_id"]]["stderr"].strip()},
        # Ray's worker writes this line to an actor's stdout log as the actor starts.
        "actor": {"id": actor["actor_id"], "class_name": actor["class_name"],
                  "stdout": f":actor_name:{actor['class_name']}"},
        "node": {"id": node["node_id"], "ip": node["node_ip"]},
        "versions": {"ray": ray["dashboard"]["cluster_metadata"]["data"]["rayVersion"],
                     "python": ray["dashboard"]["cluster_metadata"]["data"]["pythonVersion"]},
        # Ray's job manager writes this cluster event as a submission starts.
        "event": next(event["message"] for events in ray["dashboard"]["events"]["data"]["events"]
                      .values() for event in events
                      if event["message"] == f"Started a ray job {submitted['submission_id']}."),
        "log_file": {"name": os.path.basename(task["task_log_info"]["stdout_file"]),
                     "line": stdout},
    }


def post(url, body):
    """POSTs `body` as JSON; the answer's status."""
    request = urllib.request.Request(url, data=body, method="POST",
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status


def post_killed_node_run(deployment):
    """Posts the captured run whose second node was killed (KILLED_NODE_RUN) as cluster
    KILLED_NODE_CLUSTER, body by body as Ray sent it, and stores a file for the killed node as
    its shipper would have before the node died. Returns what Ray's dashboard must show of the
    killed node (see ray_dashboard.mjs), from Ray's own answer before that run stopped."""
    token = deployment.ingest_token(KILLED_NODE_CLUSTER)
    token = f"token={token}&" if token else ""
    base = f"{deployment.ingest_base}/v1/events/{KILLED_NODE_CLUSTER}?{token}"
    session = None
    with open(os.path.join(KILLED_NODE_RUN, "requests.jsonl")) as f:
        for request in map(json.loads, f):
            with open(os.path.join(KILLED_NODE_RUN, request["body_file"]), "rb") as body:
                body = body.read()
            session = session or json.loads(body)[0]["sessionName"]
            post(base, body)
    with open(os.path.join(KILLED_NODE_RUN, "ground-truth", "nodes.json")) as f:
        killed = next(node for node in json.load(f) if node["state"] == "DEAD")
    line = f"afterglow e2e: shipped from node {killed['node_id'][:8]} before it was killed"
    place = urllib.parse.urlencode({"session": session, "node_id": killed["node_id"],
                                    "file": "raylet.out", "offset": 0})
    post(f"{deployment.ingest_base}/v1/logs/{KILLED_NODE_CLUSTER}?{token}{place}",
         f"{line}\n".encode())
    with open(os.path.join(KILLED_NODE_RUN, "ground-truth", "tasks.json")) as f:
        attempts = len(json.load(f))
    return {"route": f"/ray/{KILLED_NODE_CLUSTER}/latest", "id": killed["node_id"],
            "attempts": attempts,
            "message": killed["state_message"], "log_file": {"name": "raylet.out", "line": line}}


def check_ray_dashboard(dashboard, ray, printed, switch, killed):
    """Ray's own dashboard, now reading Afterglow through `--proxy-server-url`, in headless
    Chromium: each of its pages shows what Ray's live answers had, and the killed node of
    `killed` (post_killed_node_run) what Ray answered of it. Returns problems."""
    switch.forwarding.set()
    shots = os.path.join(HERE, "..", "..", "target", "screenshots")
    facts = dashboard_facts(ray, printed)
    facts["route"] = switch.prefix
    facts["killed"] = dict(killed, switch=f"http://127.0.0.1:{switch.server_address[1]}"
                           f"{SwitchProxy.ROUTE_PATH}")
    result = subprocess.run(["node", os.path.join(HERE, "ray_dashboard.mjs"), dashboard, shots,
                             json.dumps(facts)], text=True, timeout=900)
    print(f"Ray's dashboard over Afterglow: {'passed' if result.returncode == 0 else 'FAILED'} "
          f"({switch.forwarded} requests forwarded to Afterglow; screenshots in {shots})")
    # Where Afterglow answers 404, Ray's dashboard answers from the live cluster instead: a
    # page can pass without the history, so each such route is a problem.
    fallbacks = 0
    for (method, path, status), count in sorted(switch.unanswered.items()):
        fallbacks += status == 404
        live = " (Ray answered from the live cluster)" if status == 404 else ""
        print(f"  Afterglow answered {status} to {method} {path}, {count}x{live}")
    return int(result.returncode != 0 or switch.forwarded == 0) + fallbacks


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
    """Runs Ray's CLI; its output."""
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    result = subprocess.run([ray, *args], env=env, capture_output=capture, text=True, timeout=300)
    if result.returncode != 0:
        raise RuntimeError(f"ray {' '.join(args)} failed: {result.stderr[-2000:]}")
    return result.stdout


def ray_answers(env, address, detail=True):
    """Ray's own view, before the cluster stops (and the same commands pointed at Afterglow)."""
    def cli(*args):
        return json.loads(ray_cli(env, *args, "--address", address))
    tasks = cli("list", "tasks", *(["--detail"] if detail else []), "--format", "json",
                "--limit", "10000")
    # With --detail for their runtime envs (`serialized_runtime_env`, `runtime_env`).
    actors = cli("list", "actors", "--detail", "--format", "json", "--limit", "10000")
    jobs = cli("list", "jobs", "--detail", "--format", "json")
    nodes = cli("list", "nodes", "--format", "json")
    summary = json.loads(subprocess.run(
        [sys.executable, "-c",
         "import json, sys; from ray.util.state import summarize_tasks; "
         "print(json.dumps(summarize_tasks(address=sys.argv[1], raise_on_missing_output=False)))", address],
        env=env, capture_output=True, text=True, check=True, timeout=300).stdout)
    return {"tasks": tasks, "actors": actors, "jobs": jobs, "nodes": nodes, "summary": summary}


def masked_as_rays_dashboard(answers):
    """Ray's live answers with runtime envs as Ray's dashboard shows them: Ray's CLI prints
    `env_vars` values as they are, its dashboard masks them, and Afterglow masks them in every
    answer. Ray's own redaction over the live side keeps every comparison exact: tasks'
    `runtime_env_info` and actors' `serialized_runtime_env` through `redact_state_rows`, as
    Ray's state API masks its lists, and jobs' `runtime_env` through `redact_runtime_env`, as
    Ray's job routes (and `redact_state_rows`, for job rows) mask it."""
    masked = dict(answers)
    masked["tasks"] = redact_state_rows(answers["tasks"])
    masked["actors"] = redact_state_rows(answers["actors"])
    masked["jobs"] = [dict(job, runtime_env=redact_runtime_env(job["runtime_env"]))
                      if "runtime_env" in job else job for job in answers["jobs"]]
    return masked


def runtime_env_of(row):
    """The runtime env a task, actor or job row carries: the serialized text, or the parsed
    dict."""
    if "runtime_env_info" in row:
        return (row["runtime_env_info"] or {}).get("serialized_runtime_env")
    if "serialized_runtime_env" in row:
        return row["serialized_runtime_env"]
    return row.get("runtime_env")


def env_vars_of(env):
    """The `env_vars` map of a runtime env (serialized or parsed), or {}."""
    if isinstance(env, str):
        try:
            env = json.loads(env) if env else {}
        except ValueError:
            return {}
    vars_ = env.get("env_vars") if isinstance(env, dict) else None
    return vars_ if isinstance(vars_, dict) else {}


def compare_runtime_envs(what, theirs, mine):
    """Runtime envs of the rows both sides have (`theirs` already masked by Ray's redaction,
    `mine` Afterglow's, each a dict by row key): equal byte for byte. Prints one line; returns
    the number of problems."""
    both = [key for key in theirs if key in mine]
    differ = [key for key in both if runtime_env_of(mine[key]) != runtime_env_of(theirs[key])]
    with_vars = sum(1 for key in both if env_vars_of(runtime_env_of(theirs[key])))
    print(f"{what} runtime envs: {len(both) - len(differ)} of {len(both)} as Ray's dashboard "
          f"masks them ({with_vars} with env_vars)")
    for key in differ[:5]:
        print(f"  differs {key}: ours {runtime_env_of(mine[key])!r}, "
              f"Ray's {runtime_env_of(theirs[key])!r}")
    return len(differ) + (not both)


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


def wait_for_attempts(api, expected, timeout, cluster=CLUSTER):
    """Waits until Afterglow shows `expected` attempts of `cluster` and the count has settled."""
    deadline, last, stable_since = time.time() + timeout, None, time.time()
    while time.time() < deadline:
        total = api.get(f"/api/summary?cluster={cluster}")["total"]
        if total != last:
            last, stable_since = total, time.time()
        if total >= expected and time.time() - stable_since > 3:
            return total
        time.sleep(1)
    return last


# Ray's GCS marks every unfinished attempt of a dead worker FAILED (WORKER_DIED) one second after
# it handles the death (gcs_mark_task_failed_on_worker_dead_delay_ms), while an attempt's owner
# sends the FINISHED it recorded on its next flush, up to a second later
# (task_events_report_interval_ms). A FINISHED that arrives after the mark is merged beside it,
# and the state API lists the later state in enum order, FAILED. The export carries when the
# owner recorded FINISHED (t_F) and when the GCS handled the worker's death (T_w), not when the
# FINISHED reached the GCS: for T_w - ε <= t_F < T_w + 1 s, Ray's answer depends on that
# unexported flush phase, and FINISHED (what the export says) and FAILED are both Ray's. Only
# there is Ray's FAILED compared as exported. `Doomed.die`, which calls exit_actor so that its
# worker exits as it finishes, lands in that window in every run.
DEATH_MARK_DELAY_MS = 1000
# How much earlier than the death the FINISHED may be recorded and still arrive late: the RPC
# to the GCS, and the GCS handling the death report after the worker exited.
FLUSH_LATENCY_MS = 100
EXIT_ACTOR_TASK = "Doomed.die"


def exported_death_race(api):
    """For each of our attempts (by task id and attempt number) that finished on a worker the
    export says died, t_F - T_w in milliseconds."""
    deaths = {row.get("worker_id"): row.get("end_time_ms")
              for row in all_pages(api, "/api/workers", f"cluster={CLUSTER}&limit=1000", "workers")
              if row.get("end_time_ms") is not None}
    gaps = {}
    for row in all_pages(api, "/api/tasks", f"cluster={CLUSTER}&limit=1000", "tasks"):
        death = deaths.get(row.get("worker_id"))
        if row.get("state") == "FINISHED" and death is not None and row.get("end_time_ms"):
            gaps[(row["task_id"], row["attempt_number"])] = row["end_time_ms"] - death
    return gaps


def record_exit_actor(ray, api, variant, gaps):
    """Appends what Ray answered for each `Doomed.die` attempt, and what its export carried (the
    attempt's state transitions, its worker's and its actor's ends, t_F - T_w), as one JSON line
    to the file E2E_RECORD names: the runs' records show where Ray's answer falls."""
    path = os.environ.get("E2E_RECORD")
    if not path:
        return
    workers = {row.get("worker_id"): row
               for row in all_pages(api, "/api/workers", f"cluster={CLUSTER}&limit=1000", "workers")}
    actors = {row.get("actor_id"): row
              for row in all_pages(api, "/api/actors", f"cluster={CLUSTER}&limit=1000", "actors")}
    for task in ray["tasks"]:
        if task["name"] != EXIT_ACTOR_TASK:
            continue
        detail = api.get(f"/api/tasks/{task['task_id']}?cluster={CLUSTER}")
        exported = [attempt for attempt in detail.get("attempts", [])
                    if attempt.get("attempt_number") == task["attempt_number"]]
        worker = workers.get(exported[0].get("worker_id")) if exported else None
        actor = actors.get(task.get("actor_id"))
        with open(path, "a") as out:
            out.write(json.dumps({
                "variant": variant, "task_id": task["task_id"],
                "ray": {key: task.get(key) for key in
                        ("state", "error_type", "start_time_ms", "end_time_ms", "events")},
                "finished_minus_death_ms": gaps.get((task["task_id"], task["attempt_number"])),
                "exported": exported, "worker": worker, "actor": actor,
            }) + "\n")


def excuse_worker_death_race(ray, api, gaps):
    """Where Ray says FAILED/WORKER_DIED and the export says FINISHED within the window above,
    compares Ray's answer as exported, saying so; any other disagreement stays one."""
    ours = {(row["task_id"], row["attempt_number"]): row
            for row in all_pages(api, "/api/tasks", f"cluster={CLUSTER}&limit=1000", "tasks")}
    for task in ray["tasks"]:
        key = (task["task_id"], task["attempt_number"])
        gap = gaps.get(key)
        if task["name"] == EXIT_ACTOR_TASK:
            log(f"{EXIT_ACTOR_TASK} {task['task_id'][:12]}…: Ray says {task['state']}, "
                f"t_F - T_w = {gap} ms")
        if (task["state"] != "FAILED" or task.get("error_type") != "WORKER_DIED"
                or gap is None or not -FLUSH_LATENCY_MS <= gap < DEATH_MARK_DELAY_MS):
            continue
        log(f"Ray's GCS marked {task['name']} {task['task_id'][:12]}… FAILED before its FINISHED "
            f"arrived (recorded {gap} ms after its worker's death): compared as exported")
        compare_as_exported(ray, task, ours[key])


# The GCS also marks every unfinished attempt of a job FAILED (WORKER_DIED) 15 s after the job's
# driver ends (gcs_mark_task_failed_on_job_done_delay_ms), those of the job's detached actors
# included, which go on running tasks. An attempt that such an actor finishes less than a flush
# interval before the mark may reach the GCS after it: the race above, timed from the job's end.
# Ray Data's detached coordinator actor, kept by the e2e's read of the published tables, lands
# there in some runs.
JOB_DONE_MARK_DELAY_MS = 15000
FLUSH_INTERVAL_MS = 1000


def excuse_job_end_race(ray, api):
    """Where Ray says FAILED/WORKER_DIED and the export says FINISHED less than a flush interval
    before the job-end mark, compares Ray's answer as exported, saying so."""
    ends = {row["job_id"]: row.get("end_time_ms")
            for row in all_pages(api, "/api/jobs", f"cluster={CLUSTER}", "jobs")}
    ours = {(row["task_id"], row["attempt_number"]): row
            for row in all_pages(api, "/api/tasks", f"cluster={CLUSTER}&limit=1000", "tasks")}
    for task in ray["tasks"]:
        row = ours.get((task["task_id"], task["attempt_number"]))
        if (task["state"] != "FAILED" or task.get("error_type") != "WORKER_DIED" or row is None
                or row.get("state") != "FINISHED" or not row.get("end_time_ms")):
            continue
        job_end = ends.get(row.get("job_id"))
        if job_end is None:
            continue
        gap = row["end_time_ms"] - (job_end + JOB_DONE_MARK_DELAY_MS)
        if not -FLUSH_INTERVAL_MS - FLUSH_LATENCY_MS <= gap < FLUSH_LATENCY_MS:
            continue
        log(f"Ray's GCS marked {task['name']} {task['task_id'][:12]}… FAILED at its job's end "
            f"before its FINISHED arrived (recorded {-gap} ms before the mark): compared as "
            f"exported")
        compare_as_exported(ray, task, row)


def compare_as_exported(ray, task, row):
    """Replaces Ray's FAILED answer for `task` with our FINISHED `row`, in its state counts too:
    the state and error type alone, so every other field is still compared."""
    name = task["func_or_class_name"]
    for field in ("state", "error_type"):
        task[field] = row.get(field)
    counts = ray["summary"]["cluster"]["summary"][name]["state_counts"]
    counts["FAILED"] -= 1
    if counts["FAILED"] == 0:
        del counts["FAILED"]
    counts["FINISHED"] = counts.get("FINISHED", 0) + 1


def excuse_lost_running_of_dead_workers(ray, api):
    """Where Ray has a RUNNING transition (and with it the worker's pid) that the export lacks,
    and the attempt's worker died (the workload `ray.kill`s an actor): compares Ray's pid as
    exported, saying so; any other disagreement stays one.

    A worker sends its task events to the GCS and to the export's aggregator on separate
    flushes, so a worker killed between the two leaves RUNNING in the GCS and not in the
    export (seen once in about 25 runs of the faults variant, whose 503 window was open). The
    export cannot tell that case from a RUNNING the GCS never got either, where Ray has no pid:
    filling the pid from the worker table would be wrong there."""
    deaths = {row.get("worker_id")
              for row in all_pages(api, "/api/workers", f"cluster={CLUSTER}&limit=1000", "workers")
              if row.get("end_time_ms") is not None}
    ours = {(row["task_id"], row["attempt_number"]): row
            for row in all_pages(api, "/api/tasks", f"cluster={CLUSTER}&limit=1000", "tasks")}
    for task in ray["tasks"]:
        row = ours.get((task["task_id"], task["attempt_number"]))
        if (row is None or row.get("worker_pid") is not None or not task.get("worker_pid")
                or row.get("worker_id") not in deaths
                or not any(event.get("state") == "RUNNING" for event in task.get("events") or [])):
            continue
        detail = api.get(f"/api/tasks/{task['task_id']}?cluster={CLUSTER}")
        exported = [event.get("state")
                    for attempt in detail.get("attempts", [])
                    if attempt.get("attempt_number") == task["attempt_number"]
                    for event in attempt.get("events") or []]
        if "RUNNING" in exported:
            continue
        log(f"the export lacks the RUNNING of {task['name']} {task['task_id'][:12]}… on a worker "
            f"that died (Ray's pid {task['worker_pid']}): compared as exported")
        task["worker_pid"] = row.get("worker_pid")


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

    # A task's detail (`/api/tasks/{id}`): runtime envs as Ray's dashboard masks them, for the
    # tasks that set env_vars and a few that do not.
    theirs = {(t["task_id"], t["attempt_number"]): t for t in ray["tasks"]}
    task_ids = sorted({key[0] for key, task in theirs.items()
                       if env_vars_of(runtime_env_of(task))})
    task_ids += sorted({key[0] for key in theirs} - set(task_ids))[:5]
    details = {}
    for task_id in task_ids:
        for attempt in api.get(f"/api/tasks/{task_id}?cluster={CLUSTER}")["attempts"]:
            details[(task_id, attempt["attempt_number"])] = attempt
    problems += compare_runtime_envs("/api/tasks/{id}", theirs, details)

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


def read_with_ray_data(binary, data_dir, api, env, address, work):
    """The published tables read by Ray Data on the live cluster, before and after a fold:
    `afterglow publish` over serve's store, then `ray.data.read_iceberg` in a driver of its own
    (read_iceberg.py) reads every attempt and job Afterglow shows, each once. The run's session
    is folded at every commit (it is small), so the synthetic session (`post_synthetic_session`)
    holds the deltas: their superseded rows are position deletes in the first read, and gone
    from the base `afterglow compact --fold` writes before the second. It runs before Ray's
    lists are taken, so its own tasks are among those compared later. Returns the number of
    problems."""
    listed = json.loads(ray_cli(env, "list", "tasks", "--format", "json", "--limit", "10000",
                                "--address", address))
    wait_for_attempts(api, len(listed), timeout=180)
    held = synthetic_deltas(data_dir)
    print(f"ray.data.read_iceberg: the synthetic session holds {held[0]} deltas, "
          f"{held[1]} with position deletes")
    problems = int(held[1] == 0)
    problems += read_published_with_ray_data(binary, data_dir, api, env, address, work, "deltas")
    folded = subprocess.run([binary, "compact", "--fold", "--data-dir", data_dir],
                            capture_output=True, text=True, timeout=300)
    held = synthetic_deltas(data_dir)
    print(f"afterglow compact --fold: exit {folded.returncode}, {folded.stdout.strip()}; "
          f"the synthetic session holds {held[0]} deltas")
    problems += int(folded.returncode != 0) + held[0]
    return problems + read_published_with_ray_data(binary, data_dir, api, env, address, work,
                                                   "folded")


def read_published_with_ray_data(binary, data_dir, api, env, address, work, label):
    """One `afterglow publish` and one read of its tables by `ray.data.read_iceberg`, compared
    with /api/tasks and /api/jobs of both clusters. What Afterglow shows is taken before and
    after the publish: a row shown before must be read, a row read must be shown after (events
    arriving meanwhile, such as an earlier reader's own, may land on either side). Returns the
    number of problems."""
    def shown():
        return {
            "task_attempts": {(cluster, row["task_id"], row["attempt_number"])
                              for cluster in (CLUSTER, SYNTHETIC)
                              for row in all_pages(api, "/api/tasks",
                                                   f"cluster={cluster}&limit=1000", "tasks")},
            "jobs": {(cluster, row["job_id"]) for cluster in (CLUSTER, SYNTHETIC)
                     for row in all_pages(api, "/api/jobs", f"cluster={cluster}", "jobs")},
        }

    before = shown()
    published = subprocess.run([binary, "publish", "--data-dir", data_dir],
                               capture_output=True, text=True, timeout=300)
    if published.returncode != 0:
        print(f"ray.data.read_iceberg ({label}): afterglow publish failed: "
              f"{published.stderr[-2000:]}")
        return 1
    after = shown()
    # "{table}: …: {metadata file}", one line per table.
    locations = [line.rsplit(": ", 1)[1] for line in published.stdout.splitlines()
                 if line.split(":", 1)[0] in ("task_attempts", "jobs")]
    read = subprocess.run([sys.executable, os.path.join(HERE, "read_iceberg.py"),
                           os.path.join(work, f"iceberg-catalog-{label}.db"), *locations],
                          env=dict(env, RAY_ADDRESS=address), capture_output=True, text=True,
                          timeout=600)
    if read.returncode != 0:
        print(f"ray.data.read_iceberg ({label}) failed: {read.stderr[-3000:]}")
        return 1
    theirs = json.loads(read.stdout.strip().splitlines()[-1])
    # The table keeps each driver's own attempt, which Ray's lists and /api/tasks leave out,
    # and attempts whose definition has not arrived yet (no type), which /api/tasks shows
    # only once it has.
    theirs["task_attempts"] = [row[:3] for row in theirs.get("task_attempts", [])
                               if row[3] not in ("DRIVER_TASK", None)]
    problems = 0
    for table in before:
        rows = [tuple(row) for row in theirs.get(table, [])]
        twice = len(rows) - len(set(rows))
        missing, extra = len(before[table] - set(rows)), len(set(rows) - after[table])
        clusters = {cluster: sum(row[0] == cluster for row in rows)
                    for cluster in (CLUSTER, SYNTHETIC)}
        print(f"ray.data.read_iceberg ({label}) {table}: {len(rows)} rows read {clusters}, "
              f"{twice} read twice, {missing} missing, {extra} extra")
        problems += twice + missing + extra + (not all(clusters.values()))
    return problems


def synthetic_deltas(data_dir):
    """(delta files, delta files with position deletes) of the synthetic session's attempts,
    from its manifest in serve's store."""
    folder = os.path.join(data_dir, "tables", "manifests", f"cluster={SYNTHETIC}")
    deltas = []
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as manifest:
            deltas += json.load(manifest)["task_attempts"]["deltas"]
    return len(deltas), sum(bool(delta.get("deletes")) for delta in deltas)


def compare_ray_tools(env, ray, api, detail=True):
    """Ray's own CLI and SDK pointed at Afterglow (`--address .../ray/{cluster}/{session}`)
    after the cluster is gone: the same commands as `ray_answers`, compared with what the live
    cluster answered. Returns the number of problems."""
    session = api.get(f"/api/clusters?cluster={CLUSTER}")["clusters"][0]["sessions"][0][
        "session_name"]
    address = f"{api.base}/ray/{CLUSTER}/{session}"
    ours = ray_answers(env, address, detail)
    problems = 0
    theirs_tasks = {(t["task_id"], t["attempt_number"]): t for t in ray["tasks"]}
    mine_tasks = {(t["task_id"], t["attempt_number"]): t for t in ours["tasks"]}
    differ = [key for key, task in theirs_tasks.items() if key in mine_tasks and any(
        mine_tasks[key].get(field) != task.get(field) for field in TASK_FIELDS)]
    missing = set(theirs_tasks) - set(mine_tasks)
    extra = set(mine_tasks) - set(theirs_tasks)
    print(f"ray list tasks --address afterglow: {len(theirs_tasks) - len(differ) - len(missing)}"
          f" matched, {len(differ)} differ, {len(missing)} missing, {len(extra)} extra")
    for key in differ[:5]:
        print("  differs", key, {field: (mine_tasks[key].get(field), theirs_tasks[key].get(field))
                                 for field in TASK_FIELDS
                                 if mine_tasks[key].get(field) != theirs_tasks[key].get(field)})
    problems += len(differ) + len(missing) + len(extra)
    if detail:
        problems += compare_runtime_envs("ray list tasks --address afterglow", theirs_tasks,
                                         mine_tasks)
    problems += compare_runtime_envs(
        "ray list actors --address afterglow",
        {row["actor_id"]: row for row in ray["actors"]},
        {row["actor_id"]: row for row in ours["actors"]})
    problems += compare_runtime_envs(
        "ray list jobs --address afterglow",
        {row["job_id"]: row for row in ray["jobs"] if row.get("job_id")},
        {row["job_id"]: row for row in ours["jobs"] if row.get("job_id")})

    theirs_summary = ray["summary"]["cluster"]
    mine_summary = ours["summary"]["cluster"]
    same = sum(1 for name, group in theirs_summary["summary"].items()
               if mine_summary["summary"].get(name, {}).get("state_counts") == group["state_counts"])
    totals = [key for key in ("total_tasks", "total_actor_tasks", "total_actor_scheduled")
              if mine_summary.get(key) != theirs_summary.get(key)]
    print(f"summarize_tasks(address=afterglow): {same} of {len(theirs_summary['summary'])} names "
          f"with equal state counts, {len(mine_summary['summary'])} names in all; totals differ: "
          f"{totals or 'none'}")
    problems += (len(theirs_summary["summary"]) - same) + len(totals)
    problems += len(mine_summary["summary"]) != len(theirs_summary["summary"])

    for resource, id_field, field in [("actors", "actor_id", "state"),
                                      ("nodes", "node_id", "state")]:
        theirs = {row[id_field]: row[field] for row in ray[resource]}
        mine = {row[id_field]: row[field] for row in ours[resource]}
        print(f"ray list {resource} --address afterglow: "
              f"{sum(1 for k, v in theirs.items() if mine.get(k) == v)} of {len(theirs)} matched, "
              f"{len(mine)} listed")
        problems += sum(1 for k, v in theirs.items() if mine.get(k) != v) + (len(mine) != len(theirs))
    drivers = {job["job_id"] for job in ray["jobs"] if job.get("job_id")}
    mine_jobs = {job["job_id"] for job in ours["jobs"]}
    print(f"ray list jobs --address afterglow: {len(drivers & mine_jobs)} of {len(drivers)} "
          f"drivers listed")
    problems += len(drivers - mine_jobs)

    # `ray get tasks ID` (YAML out) for a task that failed, at the `latest` alias.
    failed = next(t for t in ray["tasks"] if t["state"] == "FAILED")
    import yaml  # Ray depends on PyYAML
    got = yaml.safe_load(ray_cli(env, "get", "tasks", failed["task_id"], "--address",
                                 f"{api.base}/ray/{CLUSTER}/latest"))
    got = got if isinstance(got, list) else [got]
    attempts = sorted(row["attempt_number"] for row in got)
    expected = sorted(t["attempt_number"] for t in ray["tasks"]
                      if t["task_id"] == failed["task_id"])
    ok = attempts == expected and all(row["state"] == theirs_tasks[(row["task_id"],
                                      row["attempt_number"])]["state"] for row in got)
    print(f"ray get tasks {failed['task_id'][:12]}… --address afterglow: attempts {attempts} "
          f"({'as' if ok else 'NOT as'} Ray listed them)")
    problems += not ok
    # `ray job list` checks `api/version` and reads `api/jobs/` into its pydantic models.
    jobs_out = ray_cli(env, "job", "list", "--address", address)
    listed = sum(1 for job_id in drivers if job_id in jobs_out)
    print(f"ray job list --address afterglow: {listed} of {len(drivers)} drivers shown")
    problems += listed != len(drivers)
    return problems + compare_submitted(ray["submitted"], submitted_jobs(address))


# Three `ray job submit`s (`submit_jobs`), by submission id: the status each ends in.
SUBMITTED = {"e2e-submit-ok": "SUCCEEDED", "e2e-submit-fail": "FAILED",
             "e2e-submit-stop": "STOPPED"}


def submit_jobs(dashboard):
    """Submits three jobs through Ray's job API, as `ray job submit` does, each with a secret in
    its runtime env: one succeeds, one exits 3, one is stopped (`ray job stop`) while it runs.
    Returns once all three have ended."""
    from ray.job_submission import JobStatus, JobSubmissionClient

    client = JobSubmissionClient(dashboard)
    python = sys.executable
    entrypoints = {
        "e2e-submit-ok": f"{python} -c \"import ray; ray.init(); "
                         f"print('submitted', ray.get(ray.remote(lambda: 42).remote()))\"",
        "e2e-submit-fail": f"{python} -c \"import ray, sys; ray.init(); print('failing'); "
                           f"sys.exit(3)\"",
        "e2e-submit-stop": f"{python} -c \"import ray, time; ray.init(); "
                           f"print('waiting', flush=True); time.sleep(600)\"",
    }
    for submission_id, entrypoint in entrypoints.items():
        client.submit_job(entrypoint=entrypoint, submission_id=submission_id,
                          runtime_env={"env_vars": {"E2E_SUBMIT_SECRET": "hunter2"}},
                          metadata={"e2e": submission_id})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        info = client.get_job_info("e2e-submit-stop")
        if info.status == JobStatus.RUNNING and info.driver_info:
            break
        time.sleep(0.5)
    client.stop_job("e2e-submit-stop")
    while time.monotonic() < deadline:
        if all(client.get_job_status(id).is_terminal() for id in SUBMITTED):
            return
        time.sleep(0.5)
    raise RuntimeError("the submitted jobs did not end in 180 s")


def submitted_jobs(address):
    """What `ray job list` shows at `address` (Ray's dashboard, or Afterglow's Ray route) of
    the submissions, and what `ray job logs` prints of each: {submission_id: JobDetails as a
    dict, with `logs`}."""
    from ray.job_submission import JobSubmissionClient

    client = JobSubmissionClient(address)
    return {job.submission_id: dict(json.loads(job.model_dump_json()),
                                    logs=client.get_job_logs(job.submission_id))
            for job in client.list_jobs() if job.submission_id in SUBMITTED}


def compare_submitted(theirs, mine):
    """The submissions as `ray job list` and `ray job logs` showed them on the live cluster
    (`theirs`) and through Afterglow (`mine`): every field and the driver's log equal, the
    secrets in runtime envs masked as Ray's dashboard masks them, except the address of the
    live job agent that ran the driver. Returns the number of problems."""
    problems = 0
    for submission_id, status in SUBMITTED.items():
        live = dict(theirs.get(submission_id) or {})
        live["runtime_env"] = redact_runtime_env(live.get("runtime_env"))
        ours = dict(mine.get(submission_id) or {})
        differ = {field: (ours.get(field), value) for field, value in live.items()
                  if field != "driver_agent_http_address" and ours.get(field) != value}
        ok = live.get("status") == status and not differ and set(ours) == set(live)
        print(f"ray job list --address afterglow, {submission_id}: "
              f"{'as' if ok else 'NOT as'} the live cluster listed it ({live.get('status')})")
        for field, (mine_value, their_value) in list(differ.items())[:8]:
            print(f"  differs {field}: ours {mine_value!r}, Ray's {their_value!r}")
        problems += not ok
    return problems


def post_synthetic_session(binary, deployment, api):
    """Posts `SYNTHETIC_ATTEMPTS` synthetic attempts as one session of cluster `SYNTHETIC`, in
    Ray-sized bodies, and waits until Afterglow shows them all. More rows than a session
    folded at every commit, it keeps deltas whose rows supersede earlier ones until it is
    folded. Returns the number of problems."""
    generated = subprocess.run(
        [binary, "generate", "--tasks", str(SYNTHETIC_ATTEMPTS), "--jobs", "4", "--nodes", "4",
         "--post", f"{deployment.ingest_base}/v1/events/{SYNTHETIC}"],
        capture_output=True, text=True, timeout=600)
    if generated.returncode != 0:
        print(f"generate failed: {generated.stderr[-2000:]}")
        return 1
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if api.get(f"/api/summary?cluster={SYNTHETIC}")["total"] >= SYNTHETIC_ATTEMPTS:
                return 0
        except urllib.error.HTTPError:
            pass
        time.sleep(1)
    print(f"Afterglow did not show the {SYNTHETIC_ATTEMPTS} synthetic attempts in 300 s")
    return 1


def list_synthetic_session(api, env):
    """The synthetic session listed whole by Ray's own CLI through Afterglow (past Ray's
    10 000-row cap, which the client lifts with RAY_MAX_LIMIT_FROM_API_SERVER). Returns the
    number of problems."""
    attempts = SYNTHETIC_ATTEMPTS
    started = time.time()
    rows = json.loads(ray_cli(dict(env, RAY_MAX_LIMIT_FROM_API_SERVER=str(attempts * 2)),
                              "list", "tasks", "--limit", str(attempts), "--format", "json",
                              "--address", f"{api.base}/ray/{SYNTHETIC}/latest"))
    keys = {(row["task_id"], row["attempt_number"]) for row in rows}
    print(f"ray list tasks --limit {attempts} over a synthetic session: {len(rows)} rows, "
          f"{len(keys)} distinct attempts ({time.time() - started:.1f} s, the CLI's parsing "
          f"included)")
    return int(len(rows) != attempts or len(keys) != attempts)


def rebuild_over_the_bucket(stack, ray, api):
    """`afterglow rebuild` over the deployment's bucket, as an operator runs it with the stack's
    outputs, in runs small enough that they fold: the answers still equal Ray's, and the quiet
    checks of the sessions keeping files their folds replaced reach the compact function,
    which deletes those files once their grace period is over. A check counts only if it was
    sent while the command ran: the function's own checks of the manifests before the rebuild
    name the same sessions, and the rebuilt manifests count their sequence from 1 again.
    Returns the number of problems."""
    from lambda_stack import QUIET_SECONDS

    started_ms = int(time.time() * 1000)
    try:
        rebuilt = stack.run_cli("rebuild", "--objects-per-run", "5")
    except subprocess.TimeoutExpired:
        print("afterglow rebuild over the bucket did not finish in 10 minutes")
        return 1
    ended_ms = int(time.time() * 1000)
    print(f"afterglow rebuild over the bucket: exit {rebuilt.returncode}\n"
          f"{rebuilt.stdout.strip()}")
    if rebuilt.returncode != 0:
        print(rebuilt.stderr[-3000:])
        return 1
    problems = int("queued for the compact function" not in rebuilt.stdout)
    expected = stack.holding_retired(CLUSTER)
    if not expected:
        print("no rebuilt session keeps files a fold replaced: runs of 5 objects should fold")
        return problems + 1
    deadline = time.monotonic() + QUIET_SECONDS + 60
    while time.monotonic() < deadline:
        if expected <= stack.relay.delivered_checks(started_ms, ended_ms):
            break
        time.sleep(1)
    missing = expected - stack.relay.delivered_checks(started_ms, ended_ms)
    print(f"quiet checks of the rebuilt sessions keeping replaced files, sent by the command "
          f"and delivered to the compact function: {len(expected) - len(missing)} of "
          f"{len(expected)}")
    return problems + len(missing) + compare(ray, api)


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
    parser.add_argument("--shipper", required=True,
                        help="the afterglow-ship-logs binary (tests/e2e/run: the wheel's)")
    parser.add_argument("--variant", choices=["serve", "faults", "lambda"], default="serve",
                        help="serve: `afterglow serve`; faults: the same with 503s and a "
                        "restart; lambda: the three functions as Lambda runtimes under "
                        "tests/e2e/lambda_emulator.py, against SeaweedFS")
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
    token = deployment.ingest_token(CLUSTER)
    token = f"?token={token}" if token else ""
    export_addr = f"http://127.0.0.1:{proxy.server_address[1]}/v1/events/{CLUSTER}{token}"
    env = ray_env(export_addr, os.path.join(work, "ray"))
    gcs_port, dashboard_port = free_port(), free_port()
    address = f"127.0.0.1:{gcs_port}"
    dashboard = f"http://127.0.0.1:{dashboard_port}"
    log(f"variant {args.variant}: ingest at {deployment.ingest_base}, queries at {api.base}, "
        f"Ray exports through the proxy on port {proxy.server_address[1]}")

    # The faults variant also drives Ray's own dashboard over Afterglow (`--proxy-server-url`).
    switch, proxy_flag = None, []
    if args.variant == "faults":
        route = f"/ray/{CLUSTER}/latest"
        switch = SwitchProxy(free_port(), api.base, route)
        threading.Thread(target=switch.serve_forever, daemon=True).start()
        proxy_flag = [f"--proxy-server-url=http://127.0.0.1:{switch.server_address[1]}{route}"]
    status = 1
    ray_stopped = False
    dashboard_problems = 0
    shipper = None
    try:
        shipper = LogShipper(os.path.abspath(args.shipper), export_addr, env["RAY_TMPDIR"],
                             dashboard, os.path.join(work, "ship-logs.log"))
        time.sleep(1)  # its first pass finds no Ray directory yet
        os.makedirs(env["RAY_TMPDIR"], exist_ok=True)
        ray_cli(env, "start", "--head", "--num-cpus=2", "--include-dashboard=true",
                "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard_port}",
                "--node-ip-address=127.0.0.1", f"--port={gcs_port}", "--disable-usage-stats",
                f"--temp-dir={env['RAY_TMPDIR']}", *proxy_flag)
        log("Ray started")
        if args.variant == "faults":
            proxy.failing.set()
        printed_path = os.path.join(work, "printed.json")
        driver_env = dict(env, RAY_ADDRESS=address, N_TASKS=str(args.tasks),
                          AFTERGLOW_E2E_PRINTS=printed_path)
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
        submit_jobs(dashboard)
        log("three jobs submitted and ended")
        killed = None
        if switch:
            killed = post_killed_node_run(deployment)
            log(f"the captured run with a killed node posted as cluster {KILLED_NODE_CLUSTER}")
        log("workload finished; letting the agent flush")
        time.sleep(10)
        ray_data_problems = 0
        if args.variant == "serve":
            ray_data_problems = post_synthetic_session(args.afterglow, deployment, api)
            ray_data_problems += read_with_ray_data(args.afterglow, deployment.data_dir, api, env,
                                                   address, work)
        ray = masked_as_rays_dashboard(ray_answers(env, address))
        ray["submitted"] = submitted_jobs(dashboard)
        ray["dashboard"] = rays_dashboard_records(dashboard)
        log(f"Ray lists {len(ray['tasks'])} attempts")
        ray_logs = ray_task_logs(env, address, printed_path)
        seen = wait_for_attempts(api, len(ray["tasks"]), timeout=180)
        log(f"Afterglow shows {seen} attempts")
        gaps = exported_death_race(api)
        record_exit_actor(ray, api, args.variant, gaps)
        excuse_worker_death_race(ray, api, gaps)
        excuse_job_end_race(ray, api)
        excuse_lost_running_of_dead_workers(ray, api)
        if args.versus_ray:
            versus_ray(f"http://127.0.0.1:{dashboard_port}", api, ray, args.versus_ray)
        if switch:
            with open(printed_path) as f:
                printed = json.load(f)
            shown = wait_for_attempts(api, killed["attempts"], 60, cluster=KILLED_NODE_CLUSTER)
            log(f"Afterglow shows {shown} of {killed['attempts']} attempts of the killed-node run")
            dashboard_problems = check_ray_dashboard(f"http://127.0.0.1:{dashboard_port}", ray,
                                                     printed, switch, killed)
        ray_cli(env, "stop", "--force")
        ray_stopped = True
        shipped = shipper.stop()
        sessions = [name for name in os.listdir(env["RAY_TMPDIR"]) if name.startswith("session_")]
        for name in sessions:
            shutil.rmtree(os.path.join(env["RAY_TMPDIR"], name), ignore_errors=True)
        log(f"Ray and the log shipper (exit {shipped}) stopped, {len(sessions)} session "
            "directories removed; comparing")
        problems = ray_data_problems
        if args.variant == "lambda":
            # Nothing is sent any more: each session's last quiet check folds it, and the
            # comparisons below read the folded tables.
            unfolded = deployment.wait_folded(CLUSTER, timeout=120)
            print(f"quiet checks: {deployment.relay.counts['quiet_checks']} delivered; "
                  f"sessions still holding deltas: {unfolded or 'none'}")
            problems += len(unfolded)
            # The shipper's last requests are queued: the log store function stores them.
            stored = all([relay.wait_stored(timeout=60) for relay in deployment.log_relays])
            counts = {name: sum(relay.counts[name] for relay in deployment.log_relays)
                      for name in ("messages", "invocations", "redelivered", "dead_lettered")}
            shards = [relay.counts["messages"] for relay in deployment.log_relays]
            print(f"log queue: {counts['messages']} requests in {counts['invocations']} log "
                  f"store batches over {len(shards)} shards ({shards} each), "
                  f"{counts['redelivered']} redelivered, {counts['dead_lettered']} "
                  f"dead-lettered; all stored: {stored}")
            problems += (not stored) + counts["dead_lettered"] + (counts["messages"] == 0)
            # The run's one Ray node ships every request to one shard, never to two.
            if sum(1 for messages in shards if messages) != 1:
                print(f"log queue: the one node's requests reached the shards as {shards}")
                problems += 1
        problems += compare(ray, api) + dashboard_problems + (shipped != 0)
        problems += compare_logs(api, printed_path, ray_logs)
        problems += compare_dashboard_records(api, ray["dashboard"])
        if args.variant == "serve":
            problems += list_synthetic_session(api, env)
        if args.variant == "lambda":
            # Ray's tools cannot send the bearer token: `afterglow proxy` adds it, as users
            # put it in front of a deployment.
            with AfterglowProxy(args.afterglow, api, os.path.join(work, "proxy.log")) as proxied:
                # With --detail: the list of ~2 000 attempts is over the 4 MB a Lambda answer
                # carries as JSON, but `afterglow proxy` takes gzip, which carries it whole.
                problems += compare_ray_tools(env, ray, proxied)
                problems += compare_logs_through_rays_route(proxied, ray_logs)
            problems += rebuild_over_the_bucket(deployment, ray, api)
        else:
            problems += compare_ray_tools(env, ray, api)
            problems += compare_logs_through_rays_route(api, ray_logs)
        after = api.get(f"/api/summary?cluster={CLUSTER}")
        print(f"after the cluster is gone: {after['total']} attempts still served "
              f"({after['by_state']})")
        print(f"{GZIPPED['answers']} answers came gzipped")
        problems += GZIPPED["answers"] == 0
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
        if shipper:
            shipper.stop()
        deployment.stop()
        proxy.shutdown()
        if switch:
            switch.shutdown()
    if status == 0 and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    log("passed" if status == 0 else f"FAILED (work directory: {work})")
    return status


if __name__ == "__main__":
    sys.exit(main())
