"""A hostile job: what a job written by an attacker would do to find herder's secrets.

Run as a job (`python3 hostile_scan.py PATH...`), it reads everything it can of

* every process's `/proc/PID/environ` and `/proc/PID/cmdline` (its own excepted),
* each PATH given (a file, or a folder walked: herder's database, its log folders, token
  files, secret files),

and looks in all of it for secrets: anything shaped like the values a test plants
(`hsec-KIND-HEX`) and like herder's own tokens (`hdr_...`). It prints one line,
`HOSTILE-SCAN {json}`, in its log: where it found something (each value as a SHA-256 prefix,
never the value, so the report itself leaks nothing into the logs it scans next), which
processes' environments it could read (pid and command line), and how much it read.

It imports nothing of herder and uses only the standard library: it runs under whatever
Python the job gets. Shared by tests/test_hostile_jobs.py and whoever tests `run_as`.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys

NEEDLE = re.compile(rb"hsec-[a-z]+-[0-9a-f]{16,}|hdr_[A-Za-z0-9_-]{20,}")
FILE_LIMIT = 64 * 1024 * 1024
MARKER = "HOSTILE-SCAN "


def digest(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()[:16]


def read(path: str, limit: int = FILE_LIMIT) -> bytes | None:
    try:
        with open(path, "rb") as handle:
            return handle.read(limit)
    except OSError:
        return None


def files_under(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    found: list[str] = []
    for folder, _, names in os.walk(path):
        found += [os.path.join(folder, name) for name in names]
    return found


def scan(paths: list[str]) -> dict[str, object]:
    own = os.getpid()
    found: list[dict[str, str]] = []
    readable_environ: list[dict[str, object]] = []
    counts = {"environ": 0, "cmdline": 0, "files": 0, "files_refused": 0}

    def look(where: str, data: bytes) -> None:
        for match in sorted(set(NEEDLE.findall(data))):
            found.append({"where": where, "sha": digest(match)})

    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        cmdline = read(f"/proc/{entry}/cmdline")
        if cmdline is not None:
            counts["cmdline"] += 1
            look(f"/proc/{entry}/cmdline", cmdline)
        environ = read(f"/proc/{entry}/environ")
        if environ is not None:
            counts["environ"] += 1
            look(f"/proc/{entry}/environ", environ)
            argv = (cmdline or b"").split(b"\0")
            readable_environ.append({"pid": int(entry), "environ_bytes": len(environ),
                                     "argv": [part.decode(errors="replace")
                                              for part in argv if part]})
    for path in paths:
        for name in files_under(path):
            data = read(name)
            if data is None:
                counts["files_refused"] += 1
                continue
            counts["files"] += 1
            look(name, data)
    own_environ = read(f"/proc/{own}/environ") or b""
    return {"found": found, "readable_environ": readable_environ, "counts": counts,
            "own_environ_read": b"HERDER_ATTEMPT_TOKEN=" in own_environ, "uid": os.getuid(),
            "parent": os.getppid()}


if __name__ == "__main__":
    sys.stdout.write(MARKER + json.dumps(scan(sys.argv[1:])) + "\n")
    sys.stdout.flush()
