"""``crossview serve RUN``: keep a run loaded and answer queries over a small local HTTP JSON endpoint.

::

    crossview serve runs/cca-flickr8k --port 8765
    curl -s localhost:8765/health
    curl -s -X POST localhost:8765/query -d '{"text": "a dog runs on the beach", "k": 5}'
    curl -s -X POST localhost:8765/query -d '{"image": "/photos/dog.jpg"}'

For scripts and annotation tools that ask many questions: the run is opened once (from the gallery cache when a
query filled it, :mod:`crossview.engine.gallery_cache`), then each request only encodes its query. The server is
the standard library's threaded ``http.server``, bound to this machine only (127.0.0.1, ``localhost``, which is
bound as 127.0.0.1, or ::1): it has no authentication, so it refuses any other address. Queries run one at a time
(the run's encoders are shared).

- ``GET /health``: ``{"status": "ok", "run", "method", "dataset", "gallery": {...}}``.
- ``POST /query`` with a JSON object: ``{"text": SENTENCE}`` ranks the gallery's images (t2i), ``{"image": PATH}``
  (an image file on this machine) ranks its captions (i2t; the corpus's lines with ``--corpus``); ``"k"``
  (default ``--k``) results. The answer is the object ``crossview query --json`` prints (``results`` with rank,
  score, item, text or file, gt; ``ground_truth``).
- A bad request gets ``400`` and ``{"error": "<one line>"}``; an unknown path ``404``; another method on a known
  path ``405`` (with ``Allow``); a body over 1 MiB ``413``; a body without ``Content-Length`` (none, or sent
  ``Transfer-Encoding: chunked``) ``411``; a body that stops arriving for :data:`READ_TIMEOUT` seconds ``408``, as is
  one whose whole body takes longer than :data:`BODY_DEADLINE` (a byte now and then); a connection whose request
  line or headers stop for :data:`READ_TIMEOUT` seconds is closed. Every error is that JSON shape, the standard
  library's own (bad request line, ...) included.
- A client that goes away before its answer is sent costs one log line, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from crossview.core.errors import CrossViewError

__all__ = ["register", "cmd_serve", "QueryService", "make_server", "LOCAL_HOSTS", "MAX_BODY", "MAX_K",
           "READ_TIMEOUT", "BODY_DEADLINE"]

#: The addresses ``crossview serve`` binds to: this machine only (``localhost`` is bound as 127.0.0.1, never looked
#: up, so a hosts file cannot point it elsewhere).
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1")
#: The largest request body read (bytes).
MAX_BODY = 1 << 20
#: The most results one query returns.
MAX_K = 1000
#: Seconds a connection may wait for the next bytes of its request before it is closed (answered 408 when its body
#: stopped): a client that connects and sends nothing, or sends less body than its Content-Length, never holds
#: a handler thread for ever.
READ_TIMEOUT = 5.0
#: Seconds a request's whole body may take to arrive (a megabyte from this machine takes milliseconds): a client
#: that trickles a byte every few seconds, each within READ_TIMEOUT, is answered 408 and closed at this deadline
#: instead of holding a handler thread for as long as it likes.
BODY_DEADLINE = 30.0
#: The paths the server answers, and the method each takes.
_PATHS = {"/health": "GET", "/health/": "GET", "/query": "POST", "/query/": "POST"}


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


class QueryService:
    """A run opened once, and the retrievers that answer :meth:`answer`: its split gallery (sentences; image files
    too unless a corpus is given) and, with ``corpus``, a caption corpus (image files)."""

    def __init__(self, run_dir: str | Path, *, split: str | None = None, corpus: str | None = None,
                 device: str = "cpu", k: int = 10) -> None:
        from crossview.commands.query import _check_run_dir, _load_corpus

        self.run_dir = _check_run_dir(str(run_dir))
        self.k = k
        self.corpus_path = corpus
        corpus_set = _load_corpus(corpus) if corpus is not None else None
        self.lock = threading.Lock()
        self.run, self.split_retriever = self._open(split, device)
        self.corpus_retriever = None
        if corpus_set is not None:
            self.corpus_retriever = self._open_corpus(corpus_set, device)

    def _open(self, split: str | None, device: str) -> tuple[Any, Any]:
        from crossview.engine.gallery_cache import open_cached_retriever

        from crossview.engine.scoring import use_run_scoring

        opened = open_cached_retriever(self.run_dir, split, device=device)
        if opened is not None:
            use_run_scoring(opened[1], self.run_dir)      # the run's own scoring, as crossview query ranks
            return opened
        from crossview.engine.session import open_run

        run = open_run(self.run_dir)
        if split is not None and split != "all" and split not in run.dataset.splits:
            raise CrossViewError(f"--split {split!r}: dataset {run.dataset.name!r} has splits "
                                 f"{', '.join(run.dataset.split_names) or 'none'}; use one of them or 'all'")
        r = run.retriever(gallery=split, device=device)
        use_run_scoring(r, self.run_dir)
        return run, r

    def _open_corpus(self, corpus: Any, device: str) -> Any:
        from crossview.engine.gallery_cache import open_cached_retriever

        from crossview.engine.scoring import use_run_scoring

        opened = open_cached_retriever(self.run_dir, corpus, device=device)
        if opened is not None:
            use_run_scoring(opened[1], self.run_dir)
            return opened[1]
        run = self.run
        if not hasattr(run, "features") or run.features is None or not hasattr(run, "retriever"):
            from crossview.engine.session import open_run
            run = open_run(self.run_dir)
        r = run.retriever(gallery=corpus, device=device)
        use_run_scoring(r, self.run_dir)
        return r

    def health(self) -> dict[str, Any]:
        r = self.split_retriever
        doc = {"status": "ok", "run": str(self.run_dir), "method": self.run.method.name,
               "dataset": self.run.dataset.name,
               "gallery": {"name": r.gallery_name, "images": r.n_gallery_images, "captions": r.n_gallery_captions},
               "scoring": r.scoring_record}
        if self.corpus_retriever is not None:
            doc["corpus"] = {"file": str(self.corpus_path), "captions": self.corpus_retriever.n_gallery_captions}
        return doc

    def answer(self, request: Any) -> dict[str, Any]:
        """The JSON answer to one request object; :class:`CrossViewError` (one line) for a bad one."""
        from crossview.commands.query import _check_image_file, _gallery_info, _results

        if not isinstance(request, dict):
            raise CrossViewError(f"the body must be a JSON object like {{\"text\": \"a dog\", \"k\": 5}}, "
                                 f"not {type(request).__name__}")
        unknown = sorted(set(request) - {"text", "image", "k"})
        if unknown:
            raise CrossViewError(f"unknown field(s) {', '.join(map(repr, unknown))}; give \"text\" or \"image\", "
                                 "and optionally \"k\"")
        given = [f for f in ("text", "image") if request.get(f) is not None]
        if len(given) != 1:
            raise CrossViewError("give exactly one of \"text\" (a sentence: ranks images) or \"image\" (an image "
                                 f"file path: ranks captions); got {' and '.join(given) or 'neither'}")
        k = request.get("k", self.k)
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise CrossViewError(f"\"k\" must be an integer from 1 to {MAX_K}, got {k!r}")
        value = request[given[0]]
        if not isinstance(value, str) or not value.strip():
            raise CrossViewError(f"\"{given[0]}\" must be a non-empty string")
        with self.lock:
            if given[0] == "text":
                retriever = self.split_retriever
                ranking = retriever.query_text(value.strip(), k)
                corpus_path = None
            else:
                path = Path(value).expanduser()
                if not path.is_file():
                    raise CrossViewError(f"image {value!r}: no such file on this machine; give an image file's path")
                _check_image_file(path, what=f"image {value!r}")
                retriever = self.corpus_retriever or self.split_retriever
                ranking = retriever.query_image(path, k)
                corpus_path = self.corpus_path if self.corpus_retriever is not None else None
            rows = _results(retriever, ranking)
        return {"run": str(self.run_dir), "method": self.run.method.name, "dataset": self.run.dataset.name,
                "gallery": _gallery_info(retriever, corpus_path),
                "query": {"direction": ranking.direction, **ranking.query}, "k": k, "exact": ranking.exact,
                "scoring": retriever.scoring_record,
                "results": rows,
                "ground_truth": [{"item": int(i), "rank": int(r)}
                                 for i, r in sorted(zip(ranking.gold.tolist(), ranking.gold_ranks.tolist()),
                                                    key=lambda ir: ir[1])]}


class _Handler(BaseHTTPRequestHandler):
    service: QueryService
    quiet = False
    server_version = "crossview-serve"
    timeout = READ_TIMEOUT        # StreamRequestHandler.setup() gives the socket this timeout
    body_deadline = BODY_DEADLINE

    def handle(self) -> None:
        # a client that hangs up before (or while) its answer is written: one log line, not a traceback on stderr
        try:
            super().handle()
        except (ConnectionError, TimeoutError) as e:
            self.close_connection = True
            self.log_message("client went away (%s); request %r dropped", type(e).__name__,
                             getattr(self, "requestline", ""))

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's errors (a bad request line, an unknown method, headers too long, a request that
        timed out) in this server's shape, ``{"error": ONE LINE}``, rather than its HTML page."""
        short = self.responses.get(code, ("error", ""))[0]
        self.log_error("code %d, message %s", code, message or short)
        line = _one_line(f"{message or short}" + (f" ({explain})" if explain else ""))
        body = (json.dumps({"error": line}, ensure_ascii=False) + "\n").encode("utf-8")
        self.send_response(code, short)
        self.send_header("Connection", "close")
        self.close_connection = True
        if code < 200 or code in (HTTPStatus.NO_CONTENT, HTTPStatus.NOT_MODIFIED):
            self.end_headers()
            return
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send(self, status: int, doc: dict[str, Any]) -> None:
        body = (json.dumps(doc, ensure_ascii=False) + "\n").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        """Answer ``{"error": message}`` and close the connection (a body left unread must not be taken for the
        next request)."""
        body = (json.dumps({"error": _one_line(message)}, ensure_ascii=False) + "\n").encode("utf-8")
        self.close_connection = True
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Connection", "close")
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if _PATHS.get(self.path.split("?", 1)[0]) == "GET":
            self._send(HTTPStatus.OK, self.service.health())
        elif self.path.split("?", 1)[0] in _PATHS:
            self._not_allowed()
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: GET /health or POST /query")

    def _not_allowed(self) -> None:
        """405 for a method the path does not take (PUT, DELETE, PATCH, GET /query, ...), 404 for an unknown path."""
        path = self.path.split("?", 1)[0]
        allow = _PATHS.get(path)
        if allow is None:
            self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: GET /health or POST /query")
            return
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, f"{self.command} {path}: not allowed; use {allow} "
                    f"{path.rstrip('/')} (GET /health, POST /query)", {"Allow": allow})

    do_PUT = do_DELETE = do_PATCH = _not_allowed  # noqa: N815 - http.server's names

    def _read_body(self) -> bytes | None:
        """The request's body by its Content-Length; None when an error has been answered (no or a bad
        Content-Length, a chunked body, one too large, one that stops arriving)."""
        if self.headers.get("Transfer-Encoding") is not None:
            self._error(HTTPStatus.LENGTH_REQUIRED, f"Transfer-Encoding {self.headers['Transfer-Encoding']!r} is "
                        "not read; send the JSON body whole, with a Content-Length header")
            return None
        given = self.headers.get("Content-Length")
        if given is None:
            self._error(HTTPStatus.LENGTH_REQUIRED, "no Content-Length; send the JSON body with a Content-Length "
                        "header, like {\"text\": \"a dog on a beach\", \"k\": 5}")
            return None
        try:
            length = int(given)
            if length < 0:
                raise ValueError
        except ValueError:
            self._error(HTTPStatus.BAD_REQUEST, f"Content-Length {_one_line(given, 40)!r} is not a number of bytes")
            return None
        if length > MAX_BODY:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the body has {length:,} bytes; at most {MAX_BODY:,}")
            return None
        chunks, got = [], 0
        deadline = time.monotonic() + self.body_deadline
        try:
            while got < length:
                if time.monotonic() > deadline:
                    self._error(HTTPStatus.REQUEST_TIMEOUT, f"the body took longer than {self.body_deadline:g} s "
                                f"({got:,} of the {length:,} bytes Content-Length gives had come); send it whole")
                    return None
                chunk = self.rfile.read1(length - got)
                if not chunk:
                    break
                chunks.append(chunk)
                got += len(chunk)
        except TimeoutError:
            self._error(HTTPStatus.REQUEST_TIMEOUT, f"the body stopped after {got:,} of the {length:,} bytes "
                        f"Content-Length gives (nothing came for {self.timeout:g} s); send the whole body")
            return None
        if got < length:
            self._error(HTTPStatus.BAD_REQUEST, f"the body ended after {got:,} of the {length:,} bytes "
                        "Content-Length gives; send the whole body")
            return None
        return b"".join(chunks)

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path in _PATHS and _PATHS[path] != "POST":
            self._not_allowed()
            return
        if path not in _PATHS:
            self._error(HTTPStatus.NOT_FOUND, f"no such path {self.path!r}: POST /query")
            return
        raw = self._read_body()
        if raw is None:
            return
        try:
            request = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            why = "nested too deeply to read" if isinstance(e, RecursionError) else f"{type(e).__name__}: {e}"
            self._error(HTTPStatus.BAD_REQUEST, f"the body is not JSON ({why}); send an object "
                        "like {\"text\": \"a dog on a beach\", \"k\": 5}")
            return
        try:
            doc = self.service.answer(request)
        except CrossViewError as e:
            self._error(HTTPStatus.BAD_REQUEST, str(e))
            return
        except Exception as e:  # noqa: BLE001 - a bug: the server stays up, the client gets one line
            self.log_message("internal error on %s: %s: %s", self.path, type(e).__name__, e)
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error ({type(e).__name__}: {e})")
            return
        self._send(HTTPStatus.OK, doc)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        if not self.quiet:
            sys.stderr.write(f"{self.address_string()} {format % args}\n")


def check_host(host: str) -> str:
    """``host`` if it is this machine's loopback address; a :class:`CrossViewError` otherwise."""
    if host not in LOCAL_HOSTS:
        raise CrossViewError(f"--host {host}: crossview serve answers this machine only (it has no "
                             "authentication); give 127.0.0.1, localhost or ::1, and reach it from elsewhere through "
                             "an SSH tunnel if you must")
    return host


def make_server(service: QueryService, host: str = "127.0.0.1", port: int = 0, quiet: bool = False,
                read_timeout: float = READ_TIMEOUT, body_deadline: float = BODY_DEADLINE) -> ThreadingHTTPServer:
    """A threaded HTTP server for ``service`` bound to ``host:port`` (``port`` 0: a free one; read it back from
    ``server.server_address``); call ``serve_forever()`` (in a thread) and ``shutdown()``. ``read_timeout``: seconds
    a connection may wait for the next bytes of its request (:data:`READ_TIMEOUT`); ``body_deadline``: seconds its
    whole body may take (:data:`BODY_DEADLINE`)."""
    import socket

    check_host(host)
    if not 0 <= port <= 65535:
        raise CrossViewError(f"--port {port}: give a port from 1 to 65535 (0: any free port)")
    handler = type("Handler", (_Handler,), {"service": service, "quiet": quiet, "timeout": read_timeout,
                                            "body_deadline": body_deadline})
    server_class = ThreadingHTTPServer
    if ":" in host:
        server_class = type("ServerV6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
    try:
        server = server_class(("127.0.0.1" if host == "localhost" else host, port), handler)
    except OSError as e:
        raise CrossViewError(f"cannot listen on {host}:{port} ({e.strerror or e}); give another --port "
                             "(0: any free port)") from None
    server.daemon_threads = True
    return server


def cmd_serve(args: argparse.Namespace) -> int:
    from crossview.core.devices import select_device

    check_host(args.host)
    if args.k < 1 or args.k > MAX_K:
        raise CrossViewError(f"--k {args.k}: give a number of results from 1 to {MAX_K}")
    service = QueryService(args.run, split=args.split, corpus=args.corpus, device=select_device(args.device),
                           k=args.k)
    server = make_server(service, args.host, args.port, quiet=args.quiet)
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host
    health = service.health()
    print(f"serving run {service.run_dir} ({health['method']} on {health['dataset']}, gallery "
          f"{health['gallery']['name']}) on http://{shown}:{port}  (POST /query, GET /health; Ctrl-C stops)",
          flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``serve`` command to the ``crossview`` parser."""
    p = sub.add_parser(
        "serve", help="keep a run loaded and answer queries over local HTTP (JSON)",
        description="Open a trained run once and answer queries over a small HTTP JSON endpoint on this machine "
                    "only (127.0.0.1, localhost or ::1; no authentication, so no other address is accepted). GET "
                    "/health says what is loaded; POST /query with {\"text\": SENTENCE} ranks the gallery's images, "
                    "with {\"image\": PATH} (an image file) its captions (or --corpus's lines); \"k\" results (default "
                    "--k). The answer is what 'crossview query --json' prints. A bad request gets status 400 and "
                    "{\"error\": ONE LINE}.",
        epilog="Example: crossview serve RUN --port 8765 & curl -s -X POST localhost:8765/query "
               "-d '{\"text\": \"a dog runs on grass\", \"k\": 5}'")
    p.add_argument("run", metavar="RUN", help="a run folder written by 'crossview train' (it needs its checkpoint)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (default 8765; 0: any free port, "
                   "printed on start)")
    p.add_argument("--host", default="127.0.0.1", help="address: 127.0.0.1 (default), localhost (bound as "
                   "127.0.0.1) or ::1; no other address (the server has no authentication)")
    p.add_argument("--split", default=None, metavar="S",
                   help="the gallery: a split of the run's dataset or 'all' (default: the split it was evaluated on)")
    p.add_argument("--corpus", metavar="FILE", help="a caption corpus (one caption a line) that image queries rank")
    p.add_argument("--k", type=int, default=10, help="results per query unless the request gives \"k\" (default 10)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda | cuda:N | mps, for encoding queries "
                   "(default: cpu)")
    p.add_argument("--quiet", action="store_true", help="do not log each request on stderr")
    p.set_defaults(func=cmd_serve)
