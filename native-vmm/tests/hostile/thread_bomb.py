# attack: threads started without end, each blocked forever, then one more round of them
# expect: ok
# limits: {"timeout_ms": 5000}
# must not: start more threads than the execution's limit (64 live), hang the VM, or leave a thread to the next execution
import sys
import threading
import time

stop = threading.Event()
started = 0
refused = None
try:
    while True:
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError as error:
    refused = str(error)
if refused != "can't start new thread":
    sys.exit(f"no clean refusal after {started} threads: {refused!r}")
if started >= 64:
    sys.exit(f"{started} threads started beside the main thread: the limit is 64 live")
# The refused ones never ran; the ones that did can end and be replaced.
stop.set()
for thread in threading.enumerate():
    if thread is not threading.current_thread():
        thread.join()
# join returns once a thread's Python code is done, a moment before the thread itself exits (so
# on Linux too): the last ones may still count against the limit for a little while.
for _ in range(200):
    again = threading.Thread(target=lambda: None)
    try:
        again.start()
        break
    except RuntimeError:
        time.sleep(0.01)
else:
    sys.exit("no thread could start again after the others ended")
again.join()
print("contained")
