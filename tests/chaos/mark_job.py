"""The chaos suite's job: appends marks to MARKS_DIR/<job id> while it runs.

    start <job> <attempt> <host> <monotonic> <wall> <pid>
    held  <job> <attempt> <host> <monotonic> <wall> <pid>   (another attempt holds the lock)
    tick  <job> <attempt> <host> <monotonic> <wall> <pid>   (every TICK seconds)
    end   <job> <attempt> <host> <monotonic> <wall> <pid>   (after DURATION seconds, exit 0)
    term  <job> <attempt> <host> <monotonic> <wall> <pid>   (SIGTERM: then it dies of it)

Every line is one O_APPEND write, so lines of attempts running at once never interleave.
CLOCK_MONOTONIC is one clock for the whole machine, so marks of attempts on different
"hosts" (agents on this machine) compare directly. The per-job flock is held for the whole
run: a second attempt that finds it held is proof of an overlap, whatever the tick timing.
SIGTERM is marked before the process dies of it (as it would unmarked), so an attempt
stopped with TERM has an exact last moment; SIGKILL leaves the last tick. It never exits
non-zero on its own.

Usage: mark_job.py MARKS_DIR DURATION_SECONDS
"""

import fcntl
import os
import signal
import sys
import time

TICK = 0.2


def main() -> None:
    marks_dir, duration = sys.argv[1], float(sys.argv[2])
    job = os.environ["HERDER_JOB_ID"]
    attempt = os.environ["HERDER_ATTEMPT"]
    host = os.environ.get("HERDER_HOST", "?")
    path = os.path.join(marks_dir, job)
    out = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def mark(kind: str) -> None:
        line = (f"{kind} {job} {attempt} {host} {time.monotonic():.6f} {time.time():.6f} "
                f"{os.getpid()}\n")
        os.write(out, line.encode())

    def terminated(signum: int, _frame: object) -> None:
        mark("term")
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    signal.signal(signal.SIGTERM, terminated)
    mark("start")
    lock = os.open(path + ".lock", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        mark("held")
    deadline = time.monotonic() + duration
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(TICK, left))
        mark("tick")
    mark("end")


if __name__ == "__main__":
    main()
