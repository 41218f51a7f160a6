"""``crossview serve RUN``: the local HTTP JSON endpoint, started on a free port in a thread and as a process."""

from __future__ import annotations

import http.client
import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest

from _engine_helpers import make_toy_dataset, write_toy_precomp
from crossview.cli import main
from crossview.core.errors import CrossViewError

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("serve")
    data = base / "toy_precomp"
    write_toy_precomp(data, make_toy_dataset(80), (("train", "train"), ("dev", "val"), ("test", "test")))
    out = base / "run_vsepp"
    assert main(["train", "vsepp", "--data", str(data), "--run-dir", str(out), "--text-encoder", "bow",
                 "--device", "cpu", "--set", "max_epochs=2", "--set", "embed_dim=16", "--set", "word_dim=8",
                 "--set", "text_model=gru", "--set", "batch_size=32"]) == 0
    return out


@pytest.fixture(scope="module")
def service(run_dir):
    from crossview.commands.serve import QueryService

    return QueryService(run_dir, k=5)


def _start(service, **kwargs):
    from crossview.commands.serve import make_server

    srv = make_server(service, "127.0.0.1", 0, **kwargs)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.fixture(scope="module")
def server(service):
    srv = _start(service, quiet=True)
    yield srv.server_address[1]
    srv.shutdown()
    srv.server_close()


def _ask(port: int, method: str, path: str, body: bytes | str | None = None) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body.encode() if isinstance(body, str) else body,
                 headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    conn.close()
    return resp.status, json.loads(raw), raw


def test_health_says_what_is_loaded(server, run_dir):
    status, doc, _ = _ask(server, "GET", "/health")
    assert status == 200 and doc["status"] == "ok" and doc["method"] == "vsepp"
    assert doc["run"] == str(run_dir) and doc["gallery"]["name"] == "test" and doc["gallery"]["images"] > 0


def test_text_query_answers_as_the_command_does(server, run_dir, capsys):
    from crossview.engine.session import open_run

    ds = open_run(run_dir).dataset
    image = int(ds.splits["test"][1])
    sentence = ds.captions[ds.captions_of(image)[0]]
    status, doc, _ = _ask(server, "POST", "/query", json.dumps({"text": sentence, "k": 4}))
    assert status == 200
    assert doc["query"]["direction"] == "t2i" and doc["k"] == 4 and len(doc["results"]) == 4
    assert [r["rank"] for r in doc["results"]] == [1, 2, 3, 4]
    assert doc["ground_truth"][0]["item"] == image
    capsys.readouterr()
    assert main(["query", str(run_dir), "--text", sentence, "--k", "4", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert doc["results"] == cli["results"] and doc["ground_truth"] == cli["ground_truth"]
    status, doc, _ = _ask(server, "POST", "/query", json.dumps({"text": "a red square"}))
    assert status == 200 and len(doc["results"]) == 5          # the server's default k


@pytest.mark.parametrize("body, says", [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON object"),
    ("{}", "exactly one of"),
    ('{"text": "a dog", "image": "x.jpg"}', "exactly one of"),
    ('{"text": "a dog", "k": 0}', "\"k\""),
    ('{"text": "a dog", "k": "5"}', "\"k\""),
    ('{"text": "   "}', "non-empty"),
    ('{"txt": "a dog"}', "unknown field"),
    ('{"image": "/no/such/photo.jpg"}', "no such file"),
    (b"\xff\xfe", "not JSON"),
    ("[" * 50_000 + "]" * 50_000, "nested too deeply"),            # within the size limit, past the recursion limit
])
def test_bad_requests_get_400_and_one_line(server, body, says):
    status, doc, raw = _ask(server, "POST", "/query", body)
    assert status == 400 and set(doc) == {"error"}
    assert says in doc["error"] and "\n" not in doc["error"] and "Traceback" not in doc["error"]
    assert raw.count(b"\n") == 1


def test_image_of_a_precomp_run_and_unknown_paths(server, tmp_path):
    from PIL import Image

    photo = tmp_path / "p.png"
    Image.new("RGB", (8, 8), "blue").save(photo)
    status, doc, _ = _ask(server, "POST", "/query", json.dumps({"image": str(photo)}))
    assert status == 400 and "precomputed image features" in doc["error"]
    bomb = tmp_path / "big.png"                 # a header declaring 60,000 x 60,000 pixels: Pillow's bomb limit
    with Image.open(photo) as im:
        im.save(bomb)
    data = bytearray(bomb.read_bytes())
    data[16:24] = (60_000).to_bytes(4, "big") * 2
    data[29:33] = zlib.crc32(bytes(data[12:29])).to_bytes(4, "big")
    bomb.write_bytes(bytes(data))
    status, doc, _ = _ask(server, "POST", "/query", json.dumps({"image": str(bomb)}))
    assert status == 400 and doc["error"].startswith(f"image {str(bomb)!r}: image too large to decode")
    assert doc["error"].endswith("; resize it")
    assert _ask(server, "GET", "/nope")[0] == 404
    status, doc, _ = _ask(server, "POST", "/health", "{}")
    assert status == 405 and doc == {"error": "POST /health: not allowed; use GET /health (GET /health, POST /query)"}
    assert _ask(server, "PUT", "/nope", "{}")[0] == 404


def _raw(port: int, data: bytes, timeout: float = 30) -> tuple[bytes, float]:
    """What the server answers ``data`` sent on one connection (until it closes it), and the seconds it took."""
    start = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as conn:
        conn.sendall(data)
        out = b""
        while chunk := conn.recv(65536):
            out += chunk
    return out, time.monotonic() - start


def _status_headers_doc(answer: bytes) -> tuple[int, dict[str, str], dict]:
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines[1:])
    return int(lines[0].split()[1]), headers, json.loads(body)


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH"])
def test_other_methods_get_405_in_the_json_shape(server, method):
    answer, _ = _raw(server, f"{method} /query HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{{}}".encode())
    status, headers, doc = _status_headers_doc(answer)
    assert status == 405 and headers["Allow"] == "POST" and headers["Content-Type"].startswith("application/json")
    assert doc == {"error": f"{method} /query: not allowed; use POST /query (GET /health, POST /query)"}
    status, headers, doc = _status_headers_doc(_raw(server, f"{method} /health HTTP/1.1\r\n\r\n".encode())[0])
    assert status == 405 and headers["Allow"] == "GET"
    status, _, doc = _status_headers_doc(_raw(server, b"BREW /query HTTP/1.1\r\n\r\n")[0])   # http.server's own
    assert status == 501 and doc == {"error": "Unsupported method ('BREW')"}


@pytest.mark.parametrize("head, code, says", [
    ("Transfer-Encoding: chunked\r\n\r\n11\r\n{\"text\": \"a dog\"}\r\n0\r\n\r\n", 411,
     "Transfer-Encoding 'chunked' is not read; send the JSON body whole, with a Content-Length header"),
    ("\r\n", 411, "no Content-Length; send the JSON body with a Content-Length header"),
    ("Content-Length: -3\r\n\r\n", 400, "Content-Length '-3' is not a number of bytes"),
    ("Content-Length: lots\r\n\r\n", 400, "Content-Length 'lots' is not a number of bytes"),
])
def test_a_body_without_a_usable_content_length_is_refused(server, head, code, says):
    answer, _ = _raw(server, f"POST /query HTTP/1.1\r\nHost: x\r\n{head}".encode())
    status, _, doc = _status_headers_doc(answer)
    assert status == code and set(doc) == {"error"} and doc["error"].startswith(says)


class _Stderr:
    """``sys.stderr`` for a server thread: the lines it writes, and an event set by each."""

    def __init__(self) -> None:
        self.text, self.line = "", threading.Event()

    def write(self, s: str) -> int:
        self.text += s
        if "\n" in s:
            self.line.set()
        return len(s)

    def flush(self) -> None:
        pass


def test_a_silent_or_short_client_is_timed_out(service, monkeypatch):
    err = _Stderr()
    monkeypatch.setattr(sys, "stderr", err)
    srv = _start(service, read_timeout=0.5)
    try:
        port = srv.server_address[1]
        answer, took = _raw(port, b"", timeout=20)                 # connects and sends nothing: closed, unanswered
        assert answer == b"" and took < 15
        answer, took = _raw(port, b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"text\": ",
                            timeout=20)                             # sends less body than its Content-Length
        status, _, doc = _status_headers_doc(answer)
        assert status == 408 and took < 15
        assert doc == {"error": "the body stopped after 9 of the 100 bytes Content-Length gives (nothing came for "
                                "0.5 s); send the whole body"}
        status, doc, _ = _ask(port, "POST", "/query", json.dumps({"text": "a red square", "k": 1}))
        assert status == 200 and len(doc["results"]) == 1          # and it still answers
    finally:
        srv.shutdown()
        srv.server_close()
    assert "Traceback" not in err.text


def test_a_trickling_body_is_cut_off_at_the_body_deadline(service, monkeypatch):
    """Each byte within the read timeout, the whole body not: 408 once the body deadline has passed, and the server
    answers the next client."""
    err = _Stderr()
    monkeypatch.setattr(sys, "stderr", err)
    srv = _start(service, read_timeout=5, body_deadline=0.5)
    try:
        port = srv.server_address[1]
        conn = socket.create_connection(("127.0.0.1", port), timeout=30)
        conn.sendall(b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
        answer = b""
        for _ in range(200):                          # one byte a tenth of a second: 20 s if never cut off
            try:
                conn.sendall(b" ")
            except OSError:                           # the server answered and closed
                break
            conn.settimeout(0.1)
            try:
                got = conn.recv(65536)
            except TimeoutError:
                continue
            answer += got
            if got:
                break
        conn.settimeout(30)
        while True:
            try:
                more = conn.recv(65536)
            except OSError:
                break
            if not more:
                break
            answer += more
        conn.close()
        status, _, doc = _status_headers_doc(answer)
        assert status == 408 and doc["error"].startswith("the body took longer than 0.5 s (")
        status, doc, _ = _ask(port, "POST", "/query", json.dumps({"text": "a red square", "k": 1}))
        assert status == 200
    finally:
        srv.shutdown()
        srv.server_close()
    assert "Traceback" not in err.text


def _reset(port: int, data: bytes) -> None:
    """Send ``data`` and hang up at once with a reset (SO_LINGER 0), as a client killed mid-request does."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=30)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.sendall(data)
    conn.close()


@pytest.mark.parametrize("data", [
    b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"te",                # mid-body
    b"POST /query HTTP/1.1\r\nHost: x\r\nContent-Length: 29\r\n\r\n{\"text\": \"a dog\", \"k\": 1000}",   # whole
])
def test_a_client_that_hangs_up_costs_one_line_not_a_traceback(service, monkeypatch, data):
    err = _Stderr()
    monkeypatch.setattr(sys, "stderr", err)
    srv = _start(service)
    try:
        _reset(srv.server_address[1], data)
        deadline = time.monotonic() + 30
        while "went away" not in err.text and "Traceback" not in err.text and time.monotonic() < deadline:
            err.line.wait(1)                                        # the handler's log line is the signal
            err.line.clear()
    finally:
        srv.shutdown()
        srv.server_close()
    assert "Traceback" not in err.text and "Error" not in err.text.replace("ConnectionResetError", "").replace(
        "BrokenPipeError", "")
    went = [line for line in err.text.splitlines() if "went away" in line]
    assert len(went) == 1 and "request 'POST /query HTTP/1.1' dropped" in went[0]


def test_refuses_any_address_but_this_machine(run_dir, capsys):
    from crossview.commands.serve import make_server

    with pytest.raises(CrossViewError, match="this machine only"):
        make_server(object(), "0.0.0.0", 0)          # type: ignore[arg-type]
    srv = make_server(object(), "localhost", 0)      # type: ignore[arg-type] - the help says localhost is 127.0.0.1
    assert srv.server_address[0] == "127.0.0.1"
    srv.server_close()
    assert main(["serve", str(run_dir), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "this machine only" in err[0]
    assert main(["serve", str(run_dir.parent / "missing")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_help_documents_the_endpoint():
    out = subprocess.run([sys.executable, "-m", "crossview", "serve", "--help"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert out.returncode == 0
    assert "POST /query" in out.stdout and "GET /health" in out.stdout and "127.0.0.1" in out.stdout
    help_host = " ".join(out.stdout.split("\n  --host HOST", 1)[1].split("--split", 1)[0].split())
    assert help_host == ("address: 127.0.0.1 (default), localhost (bound as 127.0.0.1) or ::1; no other address "
                         "(the server has no authentication)")


def test_the_command_serves_until_stopped(run_dir):
    """``crossview serve RUN --port 0`` as a process: it prints its address, answers, and stops on SIGINT."""
    import signal

    # Ctrl-C's disposition as a terminal gives it: a test run started in the background by a non-interactive shell
    # ignores SIGINT, and a child inherits that (Python then installs no KeyboardInterrupt handler)
    proc = subprocess.Popen([sys.executable, "-m", "crossview", "serve", str(run_dir), "--port", "0", "--quiet"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert "serving run" in line and "http://127.0.0.1:" in line, proc.stderr.read() if not line else line
        port = int(line.split("http://127.0.0.1:")[1].split()[0])
        status, doc, _ = _ask(port, "POST", "/query", json.dumps({"text": "a green circle", "k": 2}))
        assert status == 200 and len(doc["results"]) == 2
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stderr.read()[-2000:]
