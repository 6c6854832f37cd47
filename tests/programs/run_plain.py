"""A torch-free child for `ddpdoctor run` tests. MODE (argv[1]): exit CODE; sigterm (kill self);
lock (deadlock on a lock after some steps); lines N (print N lines fast); beat (heartbeats only).
"""

import os
import signal
import sys
import threading
import time

mode = sys.argv[1]
arg = sys.argv[2] if len(sys.argv) > 2 else "0"
print("hello stdout", flush=True)
print("hello stderr", file=sys.stderr, flush=True)
if mode == "exit":
    sys.exit(int(arg))
elif mode == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
elif mode == "lock":
    lock = threading.Lock()
    for step in range(3):
        print(f"step {step}", flush=True)
        time.sleep(0.2)
    print(f"HANG_START {time.time():.3f}", flush=True)
    lock.acquire()
    lock.acquire()
elif mode == "lines":
    for i in range(int(arg)):
        print(f"line {i} of the benchmark with some text in it")
elif mode == "beat":
    from ddpdoctor.probe.heartbeat import beat

    for step in range(int(arg)):
        beat(step)
        time.sleep(0.6)
