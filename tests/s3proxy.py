#!/usr/bin/env python3
"""s3proxy.py: a fault-injecting HTTP/1.1 reverse proxy for the S3 tests.

It sits between an S3 client (libcurl, the AWS CLI) and a local S3 server (moto)
and forwards every request byte for byte: the request line and headers go out
unchanged (Host included, since SigV4 signs it), bodies are streamed with their
own framing (Content-Length or chunked) and so are responses. The one header it
manages itself is the hop-by-hop Connection: the proxy keeps the client's
connection alive whatever the upstream does (werkzeug, under moto, closes after
every response), so that clients reuse connections as they would with S3, and
says "Connection: close" only when it is about to close. Interim 1xx responses
from the upstream are dropped; the proxy answers "Expect: 100-continue" itself.

Faults, drawn from one random.Random(--seed) in the order requests arrive (three
draws per request, so that the sequence does not depend on which requests are
eligible; with one connection at a time a run is exactly reproducible):
  --fail-first N   the first N eligible requests get 503 SlowDown
  --fail-rate F    answered by the proxy, not forwarded: 500 InternalError or
                   503 SlowDown (half each) with an S3 XML error body. A request
                   with a body is drained first and the connection stays up; one
                   that waits on "Expect: 100-continue" is answered at once, as
                   S3 does, with Connection: close and no 100 Continue.
  --reset-rate F   the client connection is reset (SO_LINGER 0, a TCP RST) at
                   one of four points, a quarter each: before forwarding, after
                   the upstream answered but before any byte of the answer, part
                   way through the response head, part way through the body
  --stall-rate F   held --stall-seconds before being forwarded (not forwarded
                   when the client has hung up meanwhile)
  --only-method M  faults only for these methods (comma-separated: PUT,POST)
  --only-path RE   faults only for request targets (path?query) matching RE
The rates are shares of the eligible requests and add up to at most 1.

--etag-header: no fault. An answer to CompleteMultipartUpload that has no ETag
header gets one, the ETag of its XML body. Ceph RGW 16 and moto give it in the
body only; the client of s3torchconnector (Mountpoint's) fails every upload
without the header, so the DCP comparison in make bench runs both clients through
this proxy.

One chosen fault, for the first --inject-count eligible requests (default 1;
0: every eligible request), before any of the above:
  --inject STATUS:CODE  answered by the proxy, not forwarded, with that HTTP
                   status and an S3 <Error> body of that code: 429:SlowDown,
                   403:AccessDenied, 400:InvalidRequest, and 200:InternalError
                   (a 200 answer that carries an error, as S3 may send for
                   CompleteMultipartUpload); a body is drained as for 500/503
  --inject flip-response  forwarded; one byte of the response body (the middle
                   one) is inverted on its way to the client
  --inject flip-request   one byte of the request body (the middle one) is
                   inverted on its way to the upstream
A flip needs a body with a Content-Length; a request without one is forwarded
unchanged and logged with the remark flip-skipped (it still uses up a count).

--log FILE gets one line per request, written when it is done (so slightly out
of order under concurrency): sequence number, method, target (path?query),
fault, status relayed to the client (- when none), in= the request body's size,
out= the bytes sent to the client, conn= the client connection's number (from
1, in the order accepted) and a remark if any. On SIGTERM or SIGINT a
"# summary requests=... forwarded=... fail500=... fail503=... reset=... stall=...
upstream_errors=... injected=..." line goes there and to stderr.

Python 3 standard library only. The proxy listens on 127.0.0.1 and forwards only
to a loopback upstream.
"""
import argparse
import html
import random
import re
import select
import signal
import socket
import socketserver
import struct
import sys
import threading
import time
from email.utils import formatdate
from urllib.parse import urlsplit

BLOCK = 256 * 1024          # streaming unit for bodies
MAX_HEAD = 64 * 1024        # longest request or response head accepted
RESET_POINTS = ("before", "no-response", "mid-head", "mid-body")


class ProtocolError(Exception):
    """The peer broke HTTP framing (or hung up inside a message)."""


class Cut(Exception):
    """A Sink's byte budget ran out: time to reset the client."""


class Sink:
    """Where a relayed message goes: a socket, or nowhere (sock None: drain).

    budget: send exactly this many more bytes, then raise Cut.
    tolerant: a send error (the upstream hung up) switches the sink to
    discarding instead of raising, and sets broken.

    flip_at: the byte at this index of everything written (heads included)
    is inverted on its way out; flipped tells whether that happened."""

    def __init__(self, sock, budget=None, tolerant=False, flip_at=None):
        self.sock, self.budget, self.tolerant = sock, budget, tolerant
        self.broken, self.sent = False, 0
        self.flip_at, self.seen, self.flipped = flip_at, 0, False

    def write(self, data):
        if self.flip_at is not None and self.seen <= self.flip_at < self.seen + len(data):
            b = bytearray(data)
            b[self.flip_at - self.seen] ^= 0xFF
            data, self.flipped = bytes(b), True
        self.seen += len(data)
        if self.sock is None or self.broken or not data:
            return
        if self.budget is not None and len(data) >= self.budget:
            self.sock.sendall(data[:self.budget])
            self.sent += self.budget
            self.budget = 0
            raise Cut()
        if self.budget is not None:
            self.budget -= len(data)
        try:
            self.sock.sendall(data)
            self.sent += len(data)
        except OSError:
            if not self.tolerant:
                raise
            self.broken = True


class Held:
    """A sink that keeps what is written."""

    def __init__(self):
        self.data = bytearray()

    def write(self, data):
        self.data.extend(data)


class Head:
    """An HTTP message head kept as raw lines, with the headers parsed."""

    def __init__(self, raw):
        self.raw = raw
        # each line with its line end; the split leaves the blank line's "\r", ""
        self.lines = [ln + b"\n" for ln in raw.split(b"\n")[:-2]]
        self.start = self.lines[0].decode("latin-1").strip()
        self.headers = []
        for line in self.lines[1:]:
            name, colon, value = line.decode("latin-1").partition(":")
            if not colon:
                raise ProtocolError("bad header line %r" % line[:80])
            self.headers.append((name.strip().lower(), value.strip()))

    def get(self, name):
        values = [v for n, v in self.headers if n == name]
        return ", ".join(values) if values else None

    def tokens(self, name):
        v = self.get(name)
        return {t.strip().lower() for t in v.split(",")} if v else set()

    def without(self, names):
        """The raw head without the header lines named in names."""
        keep = [self.lines[0]] + [ln for ln, (n, _) in zip(self.lines[1:], self.headers)
                                  if n not in names]
        return b"".join(keep)


def read_head(rfile):
    """Reads a message head up to its blank line; b"" on EOF before any byte."""
    lines, total = [], 0
    while True:
        line = rfile.readline(MAX_HEAD + 1)
        if not line:
            if lines:
                raise ProtocolError("EOF inside a message head")
            return b""
        if not lines and line in (b"\r\n", b"\n"):
            continue                                # stray CRLF between messages
        lines.append(line)
        total += len(line)
        if total > MAX_HEAD:
            raise ProtocolError("message head over %d bytes" % MAX_HEAD)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def framing(head, request_method=None, status=None):
    """How the body after head is delimited: ("none",), ("length", n),
    ("chunked",) or ("eof",). request_method and status are given for responses."""
    if status is not None and (request_method == "HEAD" or 100 <= status < 200
                               or status in (204, 304)):
        return ("none",)
    te = head.tokens("transfer-encoding")
    if te:
        if "chunked" in te:
            return ("chunked",)
        if status is None:
            raise ProtocolError("request with Transfer-Encoding but not chunked")
        return ("eof",)
    cl = head.get("content-length")
    if cl is not None:
        try:
            n = int(cl.split(",")[0])
        except ValueError:
            raise ProtocolError("bad Content-Length %r" % cl)
        return ("length", n) if n > 0 else ("none",)
    return ("none",) if status is None else ("eof",)


def copy_exact(rfile, n, sink):
    while n > 0:
        data = rfile.read(min(n, BLOCK))
        if not data:
            raise ProtocolError("EOF with %d body bytes to go" % n)
        n -= len(data)
        sink.write(data)


def copy_body(rfile, how, sink):
    """Relays one body, framing included, from rfile to sink; returns its size."""
    kind = how[0]
    if kind == "none":
        return 0
    if kind == "length":
        copy_exact(rfile, how[1], sink)
        return how[1]
    if kind == "eof":
        total = 0
        while True:
            data = rfile.read1(BLOCK)
            if not data:
                return total
            total += len(data)
            sink.write(data)
    total = 0                                       # chunked: relayed verbatim
    while True:
        line = rfile.readline(MAX_HEAD)
        if not line.endswith(b"\n"):
            raise ProtocolError("bad chunk size line")
        sink.write(line)
        try:
            size = int(line.split(b";")[0].strip(), 16)
        except ValueError:
            raise ProtocolError("bad chunk size %r" % line[:40])
        if size == 0:
            while True:                             # trailers, then the blank line
                line = rfile.readline(MAX_HEAD)
                if not line:
                    raise ProtocolError("EOF in chunked trailers")
                sink.write(line)
                if line in (b"\r\n", b"\n"):
                    return total
        copy_exact(rfile, size + 2, sink)           # the data and its CRLF
        total += size


def peer_gone(sock):
    """True when the peer has closed its side (or reset the connection)."""
    try:
        readable, _, _ = select.select([sock], [], [], 0)
        return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def error_response(status, code, message, seq, method, close):
    body = ("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>%s</Code>"
            "<Message>%s</Message><RequestId>s3proxy-%08d</RequestId>"
            "<HostId>s3proxy</HostId></Error>" % (code, message, seq)).encode()
    reason = {200: "OK", 400: "Bad Request", 403: "Forbidden", 404: "Not Found",
              429: "Too Many Requests", 500: "Internal Server Error", 502: "Bad Gateway",
              503: "Slow Down"}.get(status, "Error")
    head = ("HTTP/1.1 %d %s\r\nDate: %s\r\nServer: s3proxy\r\n"
            "x-amz-request-id: s3proxy-%08d\r\nx-s3proxy-fault: %s\r\n"
            "Content-Type: application/xml\r\nContent-Length: %d\r\n%s\r\n"
            % (status, reason, formatdate(usegmt=True), seq, code, len(body),
               "Connection: close\r\n" if close else "")).encode()
    return head if method == "HEAD" else head + body


INJECT_MESSAGES = {
    "SlowDown": "Please reduce your request rate.",
    "AccessDenied": "Access Denied",
    "InvalidRequest": "s3proxy: an injected invalid request",
    "InternalError": "We encountered an internal error. Please try again.",
}


def parse_inject(kind):
    """--inject's value: "flip-response", "flip-request" or (status, code)."""
    if kind in ("flip-response", "flip-request"):
        return kind
    status, colon, code = kind.partition(":")
    if not colon or not status.isdigit() or not 200 <= int(status) <= 599 or \
            not re.fullmatch(r"[A-Za-z0-9]+", code):
        raise ValueError(kind)
    return int(status), code


def injected_answer(fault):
    """(status, code, message) for an --inject STATUS:CODE fault, else None."""
    if not fault or not fault.startswith("inject:") or fault.startswith("inject:flip-"):
        return None
    status, code = parse_inject(fault[len("inject:"):])
    return status, code, INJECT_MESSAGES.get(code, "s3proxy: injected " + code)


class Faults:
    """The fault plan, the counters and the request log, shared by all threads."""

    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.lock = threading.Lock()
        self.methods = {m.strip().upper() for m in args.only_method.split(",")} \
            if args.only_method else None
        self.path_re = re.compile(args.only_path) if args.only_path else None
        self.seq = self.eligible = self.connections = 0
        self.counts = dict.fromkeys(("requests", "forwarded", "fail500", "fail503",
                                     "reset", "stall", "upstream_errors", "injected", "etag_added"), 0)
        self.injected = 0                           # eligible requests given --inject
        self.log = open(args.log, "a", buffering=1) if args.log else None

    def decide(self, method, target):
        """(sequence number, fault, fraction): fault is None, "fail500",
        "fail503", "stall", "reset:POINT" or "inject:KIND"; fraction in [0, 1)
        places a cut."""
        a = self.args
        with self.lock:
            self.seq += 1
            self.counts["requests"] += 1
            u, v, w = self.rng.random(), self.rng.random(), self.rng.random()
            if (self.methods and method not in self.methods) or \
               (self.path_re and not self.path_re.search(target)):
                return self.seq, None, w
            self.eligible += 1
            if a.inject and (a.inject_count == 0 or self.injected < a.inject_count):
                self.injected += 1
                return self.seq, "inject:" + a.inject, w
            if self.eligible <= a.fail_first:
                fault = "fail503"
            elif u < a.fail_rate:
                fault = "fail500" if v < 0.5 else "fail503"
            elif u < a.fail_rate + a.reset_rate:
                fault = "reset:" + RESET_POINTS[int(v * len(RESET_POINTS))]
            elif u < a.fail_rate + a.reset_rate + a.stall_rate:
                fault = "stall"
            else:
                fault = None
            if fault:
                self.counts[fault.split(":")[0]] += 1
            return self.seq, fault, w

    def new_connection(self):
        with self.lock:
            self.connections += 1
            return self.connections

    def count(self, name):
        with self.lock:
            self.counts[name] += 1

    def record(self, seq, method, target, fault, st):
        if self.log:
            with self.lock:
                self.log.write("%d %s %s fault=%s status=%s in=%d out=%d conn=%d%s\n" % (
                    seq, method, target, fault or "-", st["status"] or "-", st["in"],
                    st["out"], st["conn"], " " + st["note"] if st["note"] else ""))

    def summary(self):
        with self.lock:
            return " ".join("%s=%d" % kv for kv in self.counts.items())


class Handler(socketserver.BaseRequestHandler):
    """One client connection: requests one after another (keep-alive)."""

    def setup(self):
        self.client = self.request
        self.client.settimeout(self.server.args.timeout)
        self.client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.client.makefile("rb", buffering=BLOCK)
        self.upstream = None
        self.conn = self.server.faults.new_connection()

    def finish(self):
        self.drop_upstream()
        try:
            self.rfile.close()
        except OSError:
            pass

    def drop_upstream(self):
        if self.upstream:
            self.urfile.close()                     # the fd closes with its last user
            self.upstream.close()
            self.upstream = self.urfile = None

    def reset_client(self):
        """Closes the client connection with a TCP RST instead of a FIN."""
        try:
            self.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                   struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.rfile.close()
        self.client.close()

    def send_error(self, status, code, message, seq, method, close):
        """Sends an S3 error response of the proxy's own; returns its size."""
        data = error_response(status, code, message, seq, method, close)
        self.client.sendall(data)
        return len(data)

    def connect_upstream(self):
        """The upstream connection, reused if still open, else a new one."""
        if self.upstream and peer_gone(self.upstream):
            self.drop_upstream()
        if not self.upstream:
            s = socket.create_connection(self.server.upstream, self.server.args.timeout)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.upstream, self.urfile = s, s.makefile("rb", buffering=BLOCK)
        return self.upstream

    def handle(self):
        try:
            while self.one_request():
                pass
        except (OSError, ProtocolError, Cut):
            pass                                    # the connection is over

    def one_request(self):
        """Serves one request; True when the connection stays open."""
        raw = read_head(self.rfile)
        if not raw:
            return False
        req = Head(raw)
        parts = req.start.split(" ")
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self.client.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n"
                                b"Connection: close\r\n\r\n")
            return False
        method, target, version = parts
        conn = req.tokens("connection")
        keep = "keep-alive" in conn if version == "HTTP/1.0" else "close" not in conn
        expect = version != "HTTP/1.0" and "100-continue" in req.tokens("expect")
        body = framing(req)
        seq, fault, frac = self.server.faults.decide(method, target)
        # for the log: the status relayed (or made up), the request body's size,
        # the bytes sent to the client (head and body), a remark
        state = {"status": None, "in": 0, "out": 0, "conn": self.conn, "note": ""}
        try:
            return self.serve(req, method, target, keep, expect, body, seq, fault,
                              frac, state)
        finally:
            self.server.faults.record(seq, method, target, fault, state)

    def serve(self, req, method, target, keep, expect, body, seq, fault, frac, st):
        faults = self.server.faults
        if fault == "stall":
            time.sleep(self.server.args.stall_seconds)
            if peer_gone(self.client):
                st["note"] = "client-gone"
                return False
        answer = injected_answer(fault)
        if fault in ("fail500", "fail503") or answer:
            status, code, msg = (500, "InternalError", "We encountered an internal "
                                 "error. Please try again.") if fault == "fail500" else \
                (503, "SlowDown", "Please reduce your request rate.") if fault == "fail503" \
                else answer
            if answer:
                faults.count("injected")
            st["status"] = status
            if expect:
                # answer before the body, as S3 does, and close: the client
                # does not send the body (or we drain whatever it sends)
                st["out"] = self.send_error(status, code, msg, seq, method, True)
                self.client.shutdown(socket.SHUT_WR)
                self.client.settimeout(5)
                end = time.time() + 5
                while time.time() < end and self.client.recv(BLOCK):
                    pass
                return False
            st["in"] = copy_body(self.rfile, body, Sink(None))
            st["out"] = self.send_error(status, code, msg, seq, method, not keep)
            return keep
        if fault == "reset:before":
            self.reset_client()
            return False

        # forward the request
        try:
            up = self.connect_upstream()
        except OSError as e:
            faults.count("upstream_errors")
            st["status"], st["note"] = 502, "connect: %s" % e
            st["out"] = self.send_error(502, "BadGateway", "s3proxy: upstream unreachable",
                                        seq, method, True)
            return False
        faults.count("forwarded")
        to_up = Sink(up, tolerant=True)
        if fault == "inject:flip-request":
            if body[0] == "length":
                to_up.flip_at = len(req.raw) + body[1] // 2
            else:
                st["note"] = "flip-skipped"
        to_up.write(req.raw)
        if expect:
            self.client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        st["in"] = copy_body(self.rfile, body, to_up)
        if to_up.flipped:
            faults.count("injected")
            st["note"] = "flipped-request-byte-%d" % (body[1] // 2)
        if to_up.broken:
            st["note"] = "upstream-hung-up-during-the-body"

        # the response, after any interim 1xx (werkzeug sends two 100s)
        try:
            while True:
                rraw = read_head(self.urfile)
                if not rraw:
                    raise ProtocolError("upstream closed without a response")
                resp = Head(rraw)
                status = int(resp.start.split(" ")[1])
                if status >= 200:
                    break
        except (OSError, ProtocolError, ValueError, IndexError) as e:
            self.drop_upstream()
            faults.count("upstream_errors")
            st["status"], st["note"] = 502, "upstream: %s" % e
            st["out"] = self.send_error(502, "BadGateway", "s3proxy: no response from "
                                        "upstream", seq, method, True)
            return False
        rbody = framing(resp, method, status)
        held, extra = None, b""
        if self.server.args.etag_header and method == "POST" and "uploadId=" in target and status == 200 \
                and resp.get("etag") is None and rbody[0] in ("length", "chunked"):
            # a CompleteMultipartUpload's answer: its ETag, which the body has,
            # also as a header (held whole: a few hundred bytes)
            held = Held()
            copy_body(self.urfile, rbody, held)
            m = re.search(rb"<ETag>([^<]*)</ETag>", bytes(held.data))
            if m:
                extra = b"ETag: " + html.unescape(m.group(1).decode("latin-1")).encode("latin-1") + b"\r\n"
                faults.count("etag_added")
        up_keep = "close" not in resp.tokens("connection") and rbody[0] != "eof" and \
            not resp.start.startswith("HTTP/1.0") and not to_up.broken
        keep = keep and rbody[0] != "eof"
        head = resp.without(("connection", "keep-alive")) + extra + \
            (b"" if keep else b"Connection: close\r\n") + b"\r\n"
        st["status"] = status

        if fault == "reset:no-response":
            self.reset_client()
            return False
        sink = Sink(self.client)
        if fault == "inject:flip-response":
            if rbody[0] == "length":
                sink.flip_at = len(head) + rbody[1] // 2
            else:
                st["note"] = "flip-skipped"
        if fault in ("reset:mid-head", "reset:mid-body"):
            if fault == "reset:mid-body" and rbody[0] != "none":
                total = rbody[1] if rbody[0] == "length" else 4096
                sink.budget = len(head) + int(frac * total)
            else:
                if fault == "reset:mid-body":
                    st["note"] = "no-body:cut-in-the-head"
                sink.budget = 1 + int(frac * (len(head) - 2))
        try:
            sink.write(head)
            if held is None:
                copy_body(self.urfile, rbody, sink)
            else:
                sink.write(bytes(held.data))
        except Cut:
            self.drop_upstream()
            self.reset_client()
            return False
        finally:
            st["out"] = sink.sent
        if sink.flipped:
            faults.count("injected")
            st["note"] = "flipped-response-byte-%d" % (rbody[1] // 2)
        if fault and fault.startswith("reset:"):
            st["note"] = "body-too-short-to-cut"
            self.drop_upstream()
            self.reset_client()
            return False
        if not up_keep:
            self.drop_upstream()
        return keep


class Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any)")
    p.add_argument("--upstream", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--reset-rate", type=float, default=0.0)
    p.add_argument("--stall-rate", type=float, default=0.0)
    p.add_argument("--stall-seconds", type=float, default=5.0)
    p.add_argument("--fail-first", type=int, default=0)
    p.add_argument("--inject", default="",
                   help="STATUS:CODE (e.g. 429:SlowDown, 200:InternalError), flip-response "
                   "or flip-request")
    p.add_argument("--inject-count", type=int, default=1,
                   help="eligible requests given --inject (0: all)")
    p.add_argument("--only-method", default="", help="e.g. PUT or PUT,POST")
    p.add_argument("--only-path", default="", help="regular expression on path?query")
    p.add_argument("--etag-header", action="store_true",
                   help="a CompleteMultipartUpload answer without an ETag header gets one, from its body")
    p.add_argument("--log", default="", help="one line per request goes here")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="socket timeout, seconds (idle keep-alive included)")
    args = p.parse_args()
    rates = (args.fail_rate, args.reset_rate, args.stall_rate)
    if min(rates) < 0 or sum(rates) > 1:
        p.error("the rates must be >= 0 and add up to at most 1")
    if args.inject:
        try:
            parse_inject(args.inject)
        except ValueError:
            p.error("--inject %s: want STATUS:CODE, flip-response or flip-request" % args.inject)
    if args.inject_count < 0:
        p.error("--inject-count must be >= 0")
    up = urlsplit(args.upstream)
    if up.scheme != "http" or up.hostname not in ("127.0.0.1", "localhost", "::1") \
            or not up.port:
        p.error("--upstream must be http://127.0.0.1:PORT (loopback only)")

    server = Server(("127.0.0.1", args.port), Handler)
    server.args, server.upstream = args, (up.hostname, up.port)
    server.faults = Faults(args)
    print("PORT %d" % server.server_address[1], flush=True)

    def stop(signum, frame):
        raise SystemExit(0)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        line = server.faults.summary()
        print("s3proxy: " + line, file=sys.stderr, flush=True)
        if server.faults.log:
            server.faults.log.write("# summary " + line + "\n")
            server.faults.log.close()
        server.server_close()


if __name__ == "__main__":
    main()
