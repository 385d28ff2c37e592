#!/usr/bin/env python3
"""redis-server instructions per check of sluice's GCRA script beside the reference's.

A count that, unlike time, does not move with the host's load. For each subject it starts a
private redis-server (unix socket, persistence off, hz 1) under `valgrind --tool=callgrind`,
loads the script, gives every key state, sends N identical-shaped EVALSHA calls one at a time,
shuts the server down and reads callgrind's total; a subject's count per call is
(total at 1,200 calls - total at 200) / 1,000, so that start-up cancels, and per check that
divided by the checks in a call.

Subjects:
  reference  the redis_rate-style script of bench/redis_bench.cpp (kFloatGcraScript), one check
             per call, with the arguments bench/redis_interleaved.hpp sends.
  lone       kGcraScript (include/sluice/redis/script.hpp), one key: a lone check.
  eachK      kGcraScript in the independent-items mode, K own keys per call (each8: eight
             concurrent checks coalesced into one call), tagged "each" (keys may repeat).
  distinctK  the same, tagged "distinct", as the coalescing client sends K keys no two of
             which are equal.
  freshX     X (eachK or distinctK) with keys that hold no state (each call's keys are new):
             what a check of a key not seen within its limit's period costs.
The sluice calls read the server's clock (time "" ""), as the client does. Their limit is 1,000
per 1,000 s with a burst of 10^6, cost 1: redis_bench's 1,000/s would leave a 1 ms debt that
expires between two visits of a key under callgrind; this one keeps every key's state, so that
every check takes the read-decide-write path, with arguments of the same shape (5 doubles).

Usage: bench/redis_script_instructions.py [--repo DIR] [SUBJECT...]
  (default subjects: reference lone each8). --repo reads the scripts from another checkout.
  Needs redis-server, valgrind and redis-cli on PATH.
"""
import argparse
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def script_body(path, name):
    text = open(path).read()
    m = re.search(name + r'\s*=\s*R"lua\((.*?)\)lua"', text, re.S)
    if not m:
        sys.exit("redis_script_instructions: %s not found in %s" % (name, path))
    return m.group(1)


class Connection:
    def __init__(self, path):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.buf = b""

    def _line(self):
        while b"\r\n" not in self.buf:
            self.buf += self.sock.recv(65536)
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def _bytes(self, n):
        while len(self.buf) < n:
            self.buf += self.sock.recv(65536)
        data, self.buf = self.buf[:n], self.buf[n:]
        return data

    def _reply(self):
        line = self._line()
        kind = line[:1]
        if kind == b"-":
            raise RuntimeError(line.decode())
        if kind in (b"+", b":"):
            return line[1:]
        if kind == b"$":
            n = int(line[1:])
            return None if n < 0 else self._bytes(n + 2)[:-2]
        return [self._reply() for _ in range(int(line[1:]))]

    def call(self, *args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            a = a.encode() if isinstance(a, str) else a
            out.append(b"$%d\r\n%s\r\n" % (len(a), a))
        self.sock.sendall(b"".join(out))
        return self._reply()


def double(x):
    return struct.pack("<d", x)


# cost·T = (10^9 ns, 0), burst·T = (10^15 ns, 0), requests 1,000: T = 10^9 ns.
PARAMS = double(1e9) + double(0) + double(1e15) + double(0) + double(1000)
ADMITTED = double(1)


def calls_of(subject, conn, repo):
    """The subject's calls (cycled over) and a check of each reply."""
    if subject == "reference":
        body = script_body(os.path.join(repo, "bench/redis_bench.cpp"), "kFloatGcraScript")
        sha = conn.call("SCRIPT", "LOAD", body).decode()
        calls = [["EVALSHA", sha, "1", "ref:%d" % i, "1000000000", "1000", "1", "1"]
                 for i in range(16)]
        return calls, lambda r: isinstance(r, list) and r[0] == b"1"
    body = script_body(os.path.join(repo, "include/sluice/redis/script.hpp"), "kGcraScript")
    sha = conn.call("SCRIPT", "LOAD", body).decode()
    if subject == "lone":
        calls = [["EVALSHA", sha, "1", "sluice:{%032x}" % i, "", "", PARAMS] for i in range(16)]
        return calls, lambda r: r[:8] == ADMITTED and r[24:25] == b"1"
    tag = re.sub(r"\d+$", "", subject)
    k = int(subject[len(tag):])
    fresh = tag.startswith("fresh")
    tag = tag[len("fresh"):] if fresh else tag
    calls = []
    # Two calls of k own keys each, alternating; fresh: a call per check count, no key repeated.
    for j in range(1300 if fresh else 2):
        keys = ["sluice:{%032x}" % (j * 1000 + i) for i in range(k)]
        calls.append(["EVALSHA", sha, str(k)] + keys + ["", ""] + [PARAMS] * k + [tag])
    had = b"0" if fresh else b"1"
    return calls, lambda r: (isinstance(r, list) and len(r) == k and
                             all(x[:8] == ADMITTED and x[24:25] == had for x in r))


def instructions(subject, n, repo):
    """callgrind's total for a redis-server that served n calls of `subject` (and set-up)."""
    with tempfile.TemporaryDirectory() as d:
        sock, out = os.path.join(d, "s"), os.path.join(d, "callgrind.out")
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out, "redis-server",
             "--port", "0", "--unixsocket", sock, "--save", "", "--appendonly", "no", "--dir", d,
             "--hz", "1", "--dynamic-hz", "no", "--logfile", os.path.join(d, "log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        for _ in range(600):
            if os.path.exists(sock):
                break
            time.sleep(0.05)
        for attempt in range(600):  # the socket file can appear before the server listens
            try:
                conn = Connection(sock)
                break
            except ConnectionRefusedError:
                if attempt == 599:
                    raise
                time.sleep(0.05)
        calls, admitted = calls_of(subject, conn, repo)
        if not subject.startswith("fresh"):
            for c in calls:  # every key holds state before the calls that count
                conn.call(*c)
        for i in range(n):
            reply = conn.call(*calls[i % len(calls)])
            if not admitted(reply):
                sys.exit("redis_script_instructions: %s: unexpected reply %r" % (subject, reply))
        subprocess.run(["redis-cli", "-s", sock, "shutdown", "nosave"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _, err = server.communicate()
        m = re.search(r"Collected : (\d+)", err)
        if not m:
            sys.exit("redis_script_instructions: no callgrind total:\n" + err)
        return int(m.group(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--repo", default=os.path.dirname(HERE))
    parser.add_argument("subjects", nargs="*", default=["reference", "lone", "each8"])
    args = parser.parse_args()
    for s in args.subjects:
        if s not in ("reference", "lone") and not re.fullmatch(r"(fresh)?(each|distinct)[1-9][0-9]*", s):
            sys.exit("redis_script_instructions: unknown subject '%s'" % s)
    print("| subject | instructions per call | checks per call | instructions per check |")
    print("| --- | ---: | ---: | ---: |")
    for s in args.subjects:
        per_call = (instructions(s, 1200, args.repo) - instructions(s, 200, args.repo)) / 1000
        k = int(re.sub(r"^\D+", "", s)) if s[-1].isdigit() else 1
        print("| %s | %.0f | %d | %.0f |" % (s, per_call, k, per_call / k), flush=True)


if __name__ == "__main__":
    main()
