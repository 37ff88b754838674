"""Lambda itself, on 127.0.0.1, for one function: the Runtime API its binary polls, the Invoke
API event sources call, and a function URL that turns HTTP requests into API Gateway v2 events
(payload format 2.0, what the template's HTTP API sends) and the function's answers back into
HTTP.

It follows the documented protocols and nothing more:

* Runtime API (`AWS_LAMBDA_RUNTIME_API`): `GET …/runtime/invocation/next` waits until an
  invocation is due and hands it over with Lambda's headers (request id, an absolute deadline in
  milliseconds since the epoch from the function's Timeout, the function ARN, a trace id);
  `POST …/invocation/{id}/response` and `…/error` are read to their last byte before they are
  acknowledged (202), so an answer is never handed on half-read; `POST …/runtime/init/error`
  is logged. One invocation at a time, as a Lambda sandbox runs them.
* Invoke API (`POST /2015-03-31/functions/{name}/invocations`): the event as sent, the
  function's answer as returned, and `X-Amz-Function-Error: Unhandled` with the runtime's error
  document when it failed.
* REST API (`/restapis/{name}/{stage}/{path}`): payload format 1.0, as a REST API's proxy
  integration sends it (the template's firewalled ingest API): the path without its stage,
  bodies of the binary media types base64-encoded; answers as below.
* Function URL (`/lambda-url/{name}/{path}`): headers lowercased and joined with commas,
  cookies apart, the query string raw and parsed, a body that is not UTF-8 text (or carries a
  Content-Encoding) base64-encoded; the answer's `statusCode`, `headers`, `multiValueHeaders`,
  `cookies` and (base64) `body` become the HTTP response, and an answer without `statusCode` is
  a 200 with the answer as its JSON body, as API Gateway treats it.

Every exchange is written to the function's log (method, route, request id, bytes), so a lost
answer shows which side lost it. An invocation the runtime has not answered within `patience`
seconds is answered 504 (function URL) or as a function error (Invoke API) and logged.
"""
import base64
import json
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RUNTIME_PREFIX = "/.rt/2018-06-01/runtime/"
ACCOUNT = "123456789012"
REGION = "us-east-1"


class Invocation:
    """One event on its way through the runtime, and the answer it gets."""

    def __init__(self, event, timeout_s):
        self.id = str(uuid.uuid4())
        self.event = event
        self.deadline_ms = int(time.time() * 1000) + timeout_s * 1000
        self.answered = threading.Event()
        self.body = None
        self.failed = False


class Emulator:
    """Lambda for the function `name`: its server on `port` (0: a free one, then `port`), the
    runtime's queue, and the log."""

    def __init__(self, name, port, timeout_s, log, patience=120, binary_types=()):
        self.name, self.port, self.timeout_s, self.patience = name, port, timeout_s, patience
        # The REST API's binary media types: bodies of these types arrive base64-encoded.
        self.binary_types = tuple(binary_types)
        self._log_file = log
        self._log_lock = threading.Lock()
        self._due = []
        self._running = {}
        self._lock = threading.Condition()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        # Port 0 asks the system for a free one.
        self.port = self.server.server_address[1]
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def runtime_api(self):
        """The value of `AWS_LAMBDA_RUNTIME_API` for the function's runtime."""
        return f"http://127.0.0.1:{self.port}/.rt"

    def start(self):
        self.thread.start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()

    def log(self, line):
        with self._log_lock:
            self._log_file.write(f"{time.strftime('%H:%M:%S')} emulator: {line}\n")
            self._log_file.flush()

    def invoke(self, event):
        """Runs one invocation through the runtime; (failed, answer bytes), or None when the
        runtime did not answer within `patience`."""
        invocation = Invocation(event, self.timeout_s)
        with self._lock:
            self._due.append(invocation)
            self._lock.notify_all()
        started = time.time()
        if not invocation.answered.wait(self.patience):
            with self._lock:
                if invocation in self._due:
                    self._due.remove(invocation)
                self._running.pop(invocation.id, None)
            self.log(f"invocation {invocation.id} unanswered after {self.patience} s")
            return None
        took = time.time() - started
        if took > self.timeout_s:
            self.log(f"invocation {invocation.id} took {took:.1f} s, past the function's "
                     f"Timeout of {self.timeout_s} s (Lambda would have stopped it)")
        return invocation.failed, invocation.body

    def next_invocation(self):
        """Blocks until an invocation is due, as Lambda's `next` does; marks it running."""
        with self._lock:
            while not self._due:
                self._lock.wait()
            invocation = self._due.pop(0)
            self._running[invocation.id] = invocation
            return invocation

    def answer(self, request_id, body, failed):
        with self._lock:
            invocation = self._running.pop(request_id, None)
        if invocation is None:
            return False
        invocation.body, invocation.failed = body, failed
        invocation.answered.set()
        return True


def http_event(method, path, query, headers, body, port):
    """The API Gateway v2 (payload format 2.0) event for one HTTP request."""
    joined = {}
    cookies = []
    for name, value in headers:
        name = name.lower()
        if name == "cookie":
            cookies.extend(part.strip() for part in value.split(";") if part.strip())
            continue
        joined[name] = f"{joined[name]},{value}" if name in joined else value
    parameters = {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        parameters[name] = f"{parameters[name]},{value}" if name in parameters else value
    now = time.time()
    event = {
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": path,
        "rawQueryString": query,
        "headers": joined,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": "afterglow-e2e",
            "domainName": f"127.0.0.1:{port}",
            "domainPrefix": "127",
            "http": {
                "method": method,
                "path": path,
                "protocol": "HTTP/1.1",
                "sourceIp": "127.0.0.1",
                "userAgent": joined.get("user-agent", ""),
            },
            "requestId": str(uuid.uuid4()),
            "routeKey": "$default",
            "stage": "$default",
            "time": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "timeEpoch": int(now * 1000),
        },
        "isBase64Encoded": False,
    }
    if cookies:
        event["cookies"] = cookies
    if parameters:
        event["queryStringParameters"] = parameters
    if body:
        text = None
        if "content-encoding" not in joined:
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                text = None
        if text is None:
            event["body"] = base64.b64encode(body).decode("ascii")
            event["isBase64Encoded"] = True
        else:
            event["body"] = text
    return event


def rest_event(method, path, stage, query, headers, body, port, binary_types=()):
    """The API Gateway REST API (payload format 1.0, proxy integration) event for one HTTP
    request to `path` on `stage`: the path without the stage, which only the request context's
    path carries; headers and query parameters both single- and multi-valued; a body of a
    binary media type base64-encoded, any other as text."""
    single, multi = {}, {}
    for name, value in headers:
        single[name] = value
        multi.setdefault(name, []).append(value)
    parameters, multi_parameters = {}, {}
    for name, value in urllib.parse.parse_qsl(query, keep_blank_values=True):
        parameters[name] = value
        multi_parameters.setdefault(name, []).append(value)
    content_type = next((value for name, value in headers if name.lower() == "content-type"), "")
    now = time.time()
    event = {
        "resource": "/{proxy+}",
        "path": path,
        "httpMethod": method,
        "headers": single,
        "multiValueHeaders": multi,
        "queryStringParameters": parameters or None,
        "multiValueQueryStringParameters": multi_parameters or None,
        "pathParameters": {"proxy": path.lstrip("/")},
        "stageVariables": None,
        "requestContext": {
            "accountId": ACCOUNT,
            "apiId": "afterglow-e2e",
            "domainName": f"127.0.0.1:{port}",
            "httpMethod": method,
            "identity": {"sourceIp": "127.0.0.1", "userAgent": single.get("User-Agent", "")},
            "path": f"/{stage}{path}",
            "protocol": "HTTP/1.1",
            "requestId": str(uuid.uuid4()),
            "requestTime": time.strftime("%d/%b/%Y:%H:%M:%S +0000", time.gmtime(now)),
            "requestTimeEpoch": int(now * 1000),
            "resourceId": "e2e",
            "resourcePath": "/{proxy+}",
            "stage": stage,
        },
        "body": None,
        "isBase64Encoded": False,
    }
    if body:
        if content_type.split(";")[0].strip().lower() in binary_types:
            event["body"] = base64.b64encode(body).decode("ascii")
            event["isBase64Encoded"] = True
        else:
            event["body"] = body.decode("utf-8", errors="replace")
    return event


def http_answer(answer):
    """(status, [(header, value)], body bytes) of a function's answer to a v2 event."""
    try:
        document = json.loads(answer)
    except ValueError:
        return 502, [("content-type", "application/json")], b'{"message":"Internal Server Error"}'
    if not isinstance(document, dict) or "statusCode" not in document:
        return 200, [("content-type", "application/json")], answer
    headers = [(name, str(value)) for name, value in (document.get("headers") or {}).items()]
    for name, values in (document.get("multiValueHeaders") or {}).items():
        if name.lower() not in {header.lower() for header, _ in headers}:
            headers.extend((name, str(value)) for value in values)
    headers.extend(("set-cookie", cookie) for cookie in document.get("cookies") or [])
    body = document.get("body") or ""
    body = base64.b64decode(body) if document.get("isBase64Encoded") else body.encode("utf-8")
    return int(document["statusCode"]), headers, body


def _handler(emulator):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format, *args):  # noqa: A002 (BaseHTTPRequestHandler's name)
            pass  # each exchange is logged once, by `emulator.log`

        def read_body(self):
            """The request's whole body: by Content-Length, or chunk by chunk."""
            if self.headers.get("transfer-encoding", "").lower() == "chunked":
                chunks = []
                while True:
                    size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return b"".join(chunks)
                    chunks.append(self.rfile.read(size))
                    self.rfile.readline()
            length = int(self.headers.get("content-length") or 0)
            return self.rfile.read(length) if length else b""

        def send(self, status, body=b"", headers=()):
            self.send_response(status)
            names = set()
            for name, value in headers:
                if name.lower() in ("content-length", "transfer-encoding", "connection"):
                    continue
                names.add(name.lower())
                self.send_header(name, value)
            if "content-type" not in names and body:
                self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            if body:
                self.wfile.write(body)
            self.wfile.flush()

        def route(self):
            parsed = urllib.parse.urlsplit(self.path)
            body = self.read_body()
            path = parsed.path
            if path.startswith(RUNTIME_PREFIX):
                return self.runtime(path[len(RUNTIME_PREFIX):], body)
            invoke = f"/2015-03-31/functions/{emulator.name}/invocations"
            if path == invoke and self.command == "POST":
                return self.invoke(body)
            url = f"/lambda-url/{emulator.name}"
            if path == url or path.startswith(url + "/"):
                return self.function_url(path[len(url):] or "/", parsed.query, body)
            rest = f"/restapis/{emulator.name}/"
            if path.startswith(rest) and "/" in path[len(rest):]:
                stage, rest_path = path[len(rest):].split("/", 1)
                return self.rest_api(stage, "/" + rest_path, parsed.query, body)
            emulator.log(f"{self.command} {self.path}: no such route")
            return self.send(404, b'{"message":"Not Found"}')

        def runtime(self, route, body):
            if self.command == "GET" and route == "invocation/next":
                invocation = emulator.next_invocation()
                payload = json.dumps(invocation.event).encode()
                emulator.log(f"next -> {invocation.id} ({len(payload)} bytes)")
                return self.send(200, payload, [
                    ("content-type", "application/json"),
                    ("lambda-runtime-aws-request-id", invocation.id),
                    ("lambda-runtime-deadline-ms", str(invocation.deadline_ms)),
                    ("lambda-runtime-invoked-function-arn",
                     f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{emulator.name}"),
                    ("lambda-runtime-trace-id",
                     f"Root=1-{int(time.time()):08x}-{uuid.uuid4().hex[:24]};Sampled=0"),
                ])
            parts = route.split("/")
            if self.command == "POST" and len(parts) == 3 and parts[0] == "invocation" \
                    and parts[2] in ("response", "error"):
                failed = parts[2] == "error"
                known = emulator.answer(parts[1], body, failed)
                emulator.log(f"{parts[2]} <- {parts[1]} ({len(body)} bytes read whole)"
                             + ("" if known else ": no such running invocation"))
                if not known:
                    return self.send(400, b'{"errorType":"InvalidRequestID"}')
                return self.send(202, b'{"status":"OK"}')
            if self.command == "POST" and route == "init/error":
                emulator.log(f"init error: {body[:2000]!r}")
                return self.send(202, b'{"status":"OK"}')
            emulator.log(f"{self.command} runtime/{route}: no such route")
            return self.send(404, b'{"errorType":"NotFound"}')

        def invoke(self, body):
            try:
                event = json.loads(body)
            except ValueError:
                return self.send(400, b'{"Type":"InvalidRequestContentException"}')
            answer = emulator.invoke(event)
            if answer is None:
                return self.send(200, b'{"errorType":"TimeoutError"}',
                                 [("x-amz-function-error", "Unhandled")])
            failed, payload = answer
            return self.send(200, payload,
                             [("x-amz-function-error", "Unhandled")] if failed else [])

        def function_url(self, path, query, body):
            event = http_event(self.command, path, query, self.headers.items(), body,
                               emulator.port)
            return self.relay(event, b'{"message":"Internal Server Error"}', 500)

        def relay(self, event, failure, failure_status):
            """Invokes the function with `event` and sends its answer as HTTP; a function that
            failed is `failure_status` with the body `failure`, as each front answers it."""
            answer = emulator.invoke(event)
            if answer is None:
                return self.send(504, b'{"message":"Endpoint request timed out"}')
            failed, payload = answer
            if failed:
                return self.send(failure_status, failure)
            status, headers, content = http_answer(payload)
            if self.command == "HEAD":
                content = b""
            return self.send(status, content, headers)

        def rest_api(self, stage, path, query, body):
            event = rest_event(self.command, path, stage, query, self.headers.items(), body,
                               emulator.port, emulator.binary_types)
            return self.relay(event, b'{"message":"Internal server error"}', 502)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = route

    return Handler
