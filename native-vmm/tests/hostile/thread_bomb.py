# attack: threads started without end, each blocked forever, then one more round of them
# expect: ok
# limits: {"timeout_ms": 5000}
# must not: start more threads than the execution's limit (64 live), hang the VM, or leave a thread to the next execution
import sys
import threading

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
again = threading.Thread(target=lambda: None)
again.start()
again.join()
print("contained")
